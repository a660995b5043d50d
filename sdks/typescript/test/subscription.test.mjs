// A subscription's delivery rules against a scripted gateway (no network): order, dedup, skipped
// ranges, gaps, verification before the handler, the chain, handler retries (docs/sdk.md "Subscribing").
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { blake3 } from "@noble/hashes/blake3.js";
import { AuthorityVerifier, CursorStore, SigningKey, Subscription, signEnvelope, verifiedSnapshot } from "../dist/index.js";
import { GroupSnapshotSchema } from "../dist/gen/missionweave/v1/authority_service_pb.js";
import { EventSchema } from "../dist/gen/missionweave/v1/event_pb.js";
import {
  CursorTooOldFrameSchema,
  EventFrameSchema,
  FlowFrameSchema,
  FlowReason,
  GetSnapshotResponseSchema,
  SnapshotReferenceSchema,
} from "../dist/gen/missionweave/v1/gateway_service_pb.js";

const EVENT_TYPE = "application/vnd.missionweave.v1.event+protobuf";
const G = "grp_test";
const authority = SigningKey.generate();
const verifier = new AuthorityVerifier("authority:test", authority.publicKey);

/** The signed log first..n of G, each event naming its predecessor's digest (the first: `previous`). */
function signedLog(n, first = 1, previous = new Uint8Array(0)) {
  const log = [];
  for (let sequence = BigInt(first); sequence <= BigInt(n); sequence++) {
    const payload = toBinary(EventSchema, create(EventSchema, { eventId: `evt_${sequence}`, groupId: G, sequence, type: "message.posted", previousDigest: previous }));
    log.push(signEnvelope(payload, EVENT_TYPE, authority, "authority:test"));
    previous = blake3(payload);
  }
  return log;
}

function frame(subscriptionId, envelopes, first, last, skipped = []) {
  return create(EventFrameSchema, { subscriptionId, groupId: G, events: envelopes, firstSequence: BigInt(first), lastSequence: BigInt(last), skipped });
}

function harness(options = {}) {
  const sent = [];
  let ids = 0;
  const host = {
    cursors: new CursorStore(mkdtempSync(join(tmpdir(), "mwp-sub-")), "agent", 0),
    send: (f) => (sent.push(f), true),
    connected: () => true,
    verifier: () => verifier,
    nextSubscriptionId: () => `s${++ids}`,
    snapshot: (reference) => verifiedSnapshot(verifier, reference, "agent", async () => options.snapshotAnswer),
    log: () => undefined,
  };
  const seen = [];
  const failures = [];
  const handler = options.handler ?? ((event) => void seen.push(Number(event.sequence)));
  const subscription = new Subscription(host, G, handler, { credits: 8, gapTimeoutMs: 50, onFailed: (f) => failures.push(f), ...options });
  subscription.open();
  return { subscription, sent, seen, failures, host };
}

const settle = (ms = 30) => new Promise((r) => setTimeout(r, ms));

test("events reach the handler once each, in order, however frames arrive; the cursor is written, then ACKed", async () => {
  const log = signedLog(4);
  const h = harness();
  const id = h.subscription.subscriptionId;
  h.subscription.onEvents(frame(id, log.slice(2, 4), 3, 4)); // early
  h.subscription.onEvents(frame(id, log.slice(0, 2), 1, 2));
  h.subscription.onEvents(frame(id, log.slice(1, 3), 2, 3)); // a replay
  await h.subscription.reached(4n);
  assert.deepEqual(h.seen, [1, 2, 3, 4]);
  assert.equal(h.host.cursors.load(G), 4n);
  await settle();
  const acks = h.sent.filter((f) => f.case === "ack").map((f) => f.value.cursors[0]);
  assert.equal(acks.at(-1).cursor, 4n);
  assert.equal(acks.reduce((sum, a) => sum + a.credits, 0), 6); // every frame's sequences granted back
});

test("skipped sequences move the cursor without reaching the handler", async () => {
  const log = signedLog(4);
  const h = harness();
  h.subscription.onEvents(frame(h.subscription.subscriptionId, [log[0], log[3]], 1, 4, [{ first: 2n, last: 3n }]));
  await h.subscription.reached(4n);
  assert.deepEqual(h.seen, [1, 4]);
});

test("an event whose signature fails stops the subscription before any event of its batch is handled", async () => {
  const log = signedLog(3);
  const forged = create(EventSchema, { eventId: "evt_3", groupId: G, sequence: 3n, type: "message.posted" });
  const tampered = { ...log[2], payload: toBinary(EventSchema, forged) };
  const h = harness();
  h.subscription.onEvents(frame(h.subscription.subscriptionId, [log[0], log[1], tampered], 1, 3));
  await settle();
  assert.deepEqual(h.seen, []);
  assert.equal(h.failures[0]?.reason, "NOT_VERIFIED");
  await assert.rejects(h.subscription.reached(1n), /NOT_VERIFIED/);
});

test("a validly signed event of another history (a broken chain) is refused before the handler sees its batch", async () => {
  const log = signedLog(2);
  const other = toBinary(EventSchema, create(EventSchema, { eventId: "evt_x", groupId: G, sequence: 3n, type: "message.posted", previousDigest: new Uint8Array(32) }));
  const h = harness();
  h.subscription.onEvents(frame(h.subscription.subscriptionId, [...log, signEnvelope(other, EVENT_TYPE, authority, "authority:test")], 1, 3));
  await settle();
  assert.deepEqual(h.seen, []);
  assert.equal(h.failures[0]?.reason, "NOT_VERIFIED");
});

test("a gap that does not fill makes it UNSUBSCRIBE and SUBSCRIBE again from the cursor; the cursor never passes it", async () => {
  const log = signedLog(3);
  const h = harness();
  const first = h.subscription.subscriptionId;
  h.subscription.onEvents(frame(first, [log[0]], 1, 1));
  h.subscription.onEvents(frame(first, [log[2]], 3, 3)); // 2 is missing
  await settle(120);
  assert.deepEqual(h.seen, [1]);
  assert.equal(h.host.cursors.load(G), 1n);
  const frames = h.sent.map((f) => f.case);
  assert.ok(frames.includes("unsubscribe"));
  const again = h.sent.filter((f) => f.case === "subscribe").at(-1).value;
  assert.notEqual(again.subscriptionId, first);
  assert.equal(again.afterSequence, 1n);
});

test("FLOW reporting a delivered sequence beyond what arrived counts as a gap", async () => {
  const log = signedLog(1);
  const h = harness();
  const first = h.subscription.subscriptionId;
  h.subscription.onEvents(frame(first, [log[0]], 1, 1));
  h.subscription.onFlow(create(FlowFrameSchema, { subscriptionId: first, groupId: G, reason: FlowReason.CREDIT_EXHAUSTED, deliveredSequence: 2n }));
  await settle(120);
  assert.equal(h.sent.filter((f) => f.case === "subscribe").length, 2);
});

test("a handler that throws is called again for the same event; the cursor waits for it", async () => {
  const log = signedLog(2);
  const calls = [];
  const h = harness({
    handler: (event) => {
      calls.push(Number(event.sequence));
      if (calls.length === 1) throw new Error("not yet");
    },
  });
  h.subscription.onEvents(frame(h.subscription.subscriptionId, log, 1, 2));
  await settle();
  assert.equal(h.host.cursors.load(G), 0n);
  await h.subscription.reached(2n);
  assert.deepEqual(calls, [1, 1, 2]);
});

/** A snapshot of G at `sequence` whose last event has digest `anchor`, its signed reference, and the answer. */
function snapshotAt(sequence, anchor, { corrupt = false } = {}) {
  const payload = toBinary(GroupSnapshotSchema, create(GroupSnapshotSchema, { groupId: G, sequence: BigInt(sequence), lastEventDigest: anchor }));
  const digest = { $typeName: "missionweave.v1.Digest", algorithm: "blake3", hex: Buffer.from(blake3(payload)).toString("hex"), sizeBytes: BigInt(payload.length) };
  const reference = signEnvelope(
    toBinary(SnapshotReferenceSchema, create(SnapshotReferenceSchema, { groupId: G, sequence: BigInt(sequence), digest })),
    "application/vnd.missionweave.v1.snapshot-reference+protobuf",
    authority,
    "authority:test",
  );
  const served = corrupt ? Buffer.concat([payload, Buffer.from([0])]) : payload;
  const snapshot = signEnvelope(served, "application/vnd.missionweave.v1.group-snapshot+protobuf", authority, "authority:test");
  return { reference, answer: create(GetSnapshotResponseSchema, { snapshot, signedReference: reference }) };
}

const tooOld = (subscriptionId, reference) => create(CursorTooOldFrameSchema, { subscriptionId, groupId: G, signedReference: reference });

test("CURSOR_TOO_OLD: the verified snapshot is restored, the cursor moves to it, the next event must continue its chain", async () => {
  const anchor = blake3(new TextEncoder().encode("the event at 40"));
  const { reference, answer } = snapshotAt(40, anchor);
  const restored = [];
  const h = harness({ snapshotAnswer: answer, onSnapshot: (snapshot) => void restored.push(Number(snapshot.sequence)) });
  await h.subscription.onCursorTooOld(tooOld(h.subscription.subscriptionId, reference));
  assert.deepEqual(restored, [40]);
  assert.equal(h.host.cursors.load(G), 40n);
  const again = h.sent.filter((f) => f.case === "subscribe").at(-1).value;
  assert.equal(again.afterSequence, 40n);
  h.subscription.onEvents(frame(again.subscriptionId, signedLog(42, 41, anchor), 41, 42));
  await h.subscription.reached(42n);
  assert.deepEqual(h.seen, [41, 42]);
});

test("CURSOR_TOO_OLD ends the gateway's subscription: nothing more is acknowledged or routed under its id", async () => {
  const { reference, answer } = snapshotAt(40, blake3(new TextEncoder().encode("the event at 40")));
  const h = harness({ snapshotAnswer: answer, onSnapshot: () => undefined });
  const old = h.subscription.subscriptionId;
  // As a live gateway does for a member whose cursor precedes its visibility: FLOW, then CURSOR_TOO_OLD.
  h.subscription.onFlow(create(FlowFrameSchema, { subscriptionId: old, groupId: G, reason: FlowReason.SUBSCRIBED, effectiveAfterSequence: 5n }));
  const before = h.sent.length;
  const restoring = h.subscription.onCursorTooOld(tooOld(old, reference));
  assert.notEqual(h.subscription.subscriptionId, old); // an error naming it (UNKNOWN_SUBSCRIPTION) is not routed here
  await restoring;
  await settle();
  const named = (f) => (f.case === "ack" ? f.value.cursors[0].subscriptionId : f.value.subscriptionId);
  assert.deepEqual(h.sent.slice(before).filter((f) => named(f) === old).map((f) => f.case), []);
  assert.deepEqual(h.failures, []);
  assert.equal(h.sent.filter((f) => f.case === "subscribe").at(-1).value.afterSequence, 40n);
});

test("after a snapshot, an event that does not name its last event's digest stops the subscription unseen", async () => {
  const { reference, answer } = snapshotAt(40, blake3(new TextEncoder().encode("the event at 40")));
  const h = harness({ snapshotAnswer: answer, onSnapshot: () => undefined });
  await h.subscription.onCursorTooOld(tooOld(h.subscription.subscriptionId, reference));
  const other = blake3(new TextEncoder().encode("not the event at 40"));
  h.subscription.onEvents(frame(h.subscription.subscriptionId, signedLog(41, 41, other), 41, 41));
  await settle();
  assert.deepEqual(h.seen, []);
  assert.equal(h.failures[0]?.reason, "NOT_VERIFIED");
});

test("a snapshot that does not match its signed digest is refused; without onSnapshot nothing is skipped", async () => {
  const { reference, answer } = snapshotAt(40, new Uint8Array(32), { corrupt: true });
  const h = harness({ snapshotAnswer: answer, onSnapshot: () => assert.fail("a corrupt snapshot was restored") });
  await h.subscription.onCursorTooOld(tooOld(h.subscription.subscriptionId, reference));
  assert.equal(h.failures[0]?.reason, "NOT_VERIFIED");
  assert.equal(h.host.cursors.load(G), 0n);
  const bare = harness({});
  await bare.subscription.onCursorTooOld(tooOld(bare.subscription.subscriptionId, snapshotAt(40, new Uint8Array(32)).reference));
  assert.equal(bare.failures[0]?.reason, "CURSOR_TOO_OLD");
  assert.equal(bare.host.cursors.load(G), 0n);
});
