// A subscription's delivery rules against a scripted gateway (no network): order, dedup, skipped
// ranges, gaps, verification before the handler, the chain, handler retries (docs/sdk.md "Subscribing").
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { blake3 } from "@noble/hashes/blake3.js";
import { AuthorityVerifier, CursorStore, SigningKey, Subscription, signEnvelope } from "../dist/index.js";
import { EventSchema } from "../dist/gen/missionweave/v1/event_pb.js";
import { EventFrameSchema, FlowFrameSchema, FlowReason } from "../dist/gen/missionweave/v1/gateway_service_pb.js";

const EVENT_TYPE = "application/vnd.missionweave.v1.event+protobuf";
const G = "grp_test";
const authority = SigningKey.generate();
const verifier = new AuthorityVerifier("authority:test", authority.publicKey);

/** The signed log 1..n of G, each event naming its predecessor's digest. */
function signedLog(n) {
  const log = [];
  let previous = new Uint8Array(0);
  for (let sequence = 1n; sequence <= BigInt(n); sequence++) {
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
    snapshot: () => Promise.reject(new Error("no snapshots here")),
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
