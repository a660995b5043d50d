/**
 * One Group's subscription on the agent's gateway stream (missionweave/sdk/subscription.py): events
 * verified before anything parses them, deduplicated by id and by sequence, buffered out of order,
 * handed to `await handler(event)` one at a time in sequence order, the cursor moved only over
 * contiguous processed (or skipped) sequences, written durably, then ACKed with credits.
 * @module
 */
import { create } from "@bufbuild/protobuf";
import { Backoff, sleep, within } from "./backoff.js";
import { CreditWindow } from "./credit-window.js";
import type { CursorStore } from "./cursors.js";
import { AgentError, GatewayError, NotVerified, SubscriptionFailed, gatewayCodeName } from "./errors.js";
import type { AuthorityVerifier, Linked } from "./event-verification.js";
import type { GroupSnapshot } from "./gen/missionweave/v1/authority_service_pb.js";
import type { SignedEnvelope } from "./gen/missionweave/v1/common_pb.js";
import type { Event } from "./gen/missionweave/v1/event_pb.js";
import {
  AckFrameSchema,
  AttentionFilterSchema,
  CursorAckSchema,
  FlowReason,
  GatewayErrorCode,
  SubscribeFrameSchema,
  UnsubscribeFrameSchema,
  type AttentionFilter,
  type ClientFrame,
  type CursorAck,
  type CursorTooOldFrame,
  type ErrorFrame,
  type EventFrame,
  type FlowFrame,
} from "./gen/missionweave/v1/gateway_service_pb.js";
import { sameBytes } from "./signing.js";

/** What handles a Group's events, one at a time, in sequence order. */
export type EventHandler = (event: Event) => Promise<void> | void;

/** Options of {@link Agent.subscribe}. */
export interface SubscribeOptions {
  /** Events in flight, 1..65,536 (default 256). */
  readonly credits?: number;
  /** How long a gap may stay open before UNSUBSCRIBE/SUBSCRIBE from the cursor, in ms (default 10,000). */
  readonly gapTimeoutMs?: number;
  /** An attention filter (default: every event the Membership permits). */
  readonly attention?: AttentionFilter;
  /** Restores a verified snapshot after CURSOR_TOO_OLD; without it such a subscription fails. */
  readonly onSnapshot?: (snapshot: GroupSnapshot) => Promise<void> | void;
  /** Start after this sequence when the cursor file holds an earlier one (or none). */
  readonly afterSequence?: bigint;
  /** Told once when the subscription stops for good. */
  readonly onFailed?: (failure: SubscriptionFailed) => void;
}

/** What a subscription needs of its agent. */
export interface SubscriptionHost {
  /** Sends a frame on the current stream; false while disconnected (nothing is sent). */
  send(frame: ClientFrame["frame"]): boolean;
  /** Whether a stream is up (WELCOME received). */
  connected(): boolean;
  /** The Authority's verifier. */
  verifier(): AuthorityVerifier;
  /** The agent's cursor file. */
  readonly cursors: CursorStore;
  /** A fresh subscription id for this stream. */
  nextSubscriptionId(): string;
  /** The snapshot a verified reference names (GetSnapshot with a session proof), verified. */
  snapshot(reference: SignedEnvelope): Promise<GroupSnapshot>;
  /** Logs a line (stderr by default). */
  log(message: string): void;
}

interface Pending {
  readonly last: bigint;
  readonly linked?: Linked;
}

const RETRIED = new Set([GatewayErrorCode.HISTORY_UNAVAILABLE, GatewayErrorCode.AUTHORITY_UNAVAILABLE]);
const SEEN_IDS = 65_536;

/** A Group's subscription: `.cursor` (durable), `.failure`, `reached(sequence)`. */
export class Subscription {
  /** The id of the current SUBSCRIBE (a new one on every (re)subscription). */
  subscriptionId = "";
  /** The durable cursor: the highest contiguous sequence processed and written to the cursor file. */
  cursor: bigint;
  /** Why it stopped, once it has. */
  failure: SubscriptionFailed | undefined;
  private processed: bigint;
  private lastLink: Uint8Array | undefined;
  private pending = new Map<bigint, Pending>();
  private seen = new Set<string>();
  private window: CreditWindow;
  private receivedThrough = 0n;
  private flowDelivered = 0n;
  private gapTimer: NodeJS.Timeout | undefined;
  private pumping: Promise<void> | undefined;
  private wake = false;
  private draining = false;
  private idleAck: NodeJS.Immediate | undefined;
  private waiters: Array<{ sequence: bigint; resolve: () => void; reject: (err: unknown) => void }> = [];
  private readonly retry = new Backoff(250, 30_000);
  private readonly credits: number;

  constructor(
    private readonly host: SubscriptionHost,
    /** The Group. */
    readonly groupId: string,
    private readonly handler: EventHandler,
    private readonly options: SubscribeOptions = {},
  ) {
    this.credits = options.credits ?? 256;
    if (!Number.isInteger(this.credits) || this.credits < 1 || this.credits > 65_536) throw new AgentError("credits must be 1..65536");
    const saved = host.cursors.load(groupId);
    this.cursor = this.processed = options.afterSequence !== undefined && options.afterSequence > saved ? options.afterSequence : saved;
    this.window = new CreditWindow(this.credits, this.processed);
  }

  /** Whether it stopped for good. */
  get stopped(): boolean {
    return this.failure !== undefined;
  }

  /** Resolves once the durable cursor is at or beyond `sequence`; rejects with the failure if it stops. */
  reached(sequence: bigint): Promise<void> {
    if (this.cursor >= sequence) return Promise.resolve();
    if (this.failure !== undefined) return Promise.reject(this.failure);
    return new Promise((resolve, reject) => this.waiters.push({ sequence, resolve, reject }));
  }

  /** SUBSCRIBE from the processed cursor with a fresh id and window (on every WELCOME, and after a gap). */
  open(): void {
    if (this.stopped) return;
    this.subscriptionId = this.host.nextSubscriptionId();
    this.pending.clear();
    this.clearGap();
    this.window = new CreditWindow(this.credits, this.processed);
    this.receivedThrough = this.flowDelivered = this.processed;
    const frame = create(SubscribeFrameSchema, {
      subscriptionId: this.subscriptionId,
      groupId: this.groupId,
      afterSequence: this.processed,
      initialCredits: this.credits,
      filter: this.options.attention ?? create(AttentionFilterSchema, {}),
    });
    this.host.send({ case: "subscribe", value: frame });
  }

  /** UNSUBSCRIBE the current id, then SUBSCRIBE again from the cursor. */
  private resubscribe(why: string): void {
    this.host.log(`${this.groupId}: ${why}; subscribing again after sequence ${this.processed}`);
    this.host.send({ case: "unsubscribe", value: create(UnsubscribeFrameSchema, { subscriptionId: this.subscriptionId }) });
    this.open();
  }

  /** An EVENT frame of this subscription: verified as a whole before anything is buffered. */
  onEvents(frame: EventFrame): void {
    if (this.stopped) return;
    let linked: Linked[];
    try {
      linked = this.host.verifier().events(frame.events);
      let previous: Linked | undefined;
      for (const item of linked) {
        if (item.event.groupId !== this.groupId) throw new NotVerified(`an event of ${item.event.groupId} arrived on ${this.groupId}`);
        // Within a frame, each event that directly follows another must name its digest (docs/integrity.md).
        if (previous !== undefined && item.event.sequence === previous.event.sequence + 1n && !sameBytes(item.event.previousDigest, previous.link)) {
          throw new NotVerified(`event ${item.event.sequence} of ${this.groupId} does not continue the chain`);
        }
        previous = item;
      }
    } catch (err) {
      this.fail("NOT_VERIFIED", err);
      return;
    }
    this.window.received(frame.firstSequence, frame.lastSequence);
    if (frame.lastSequence > this.receivedThrough) this.receivedThrough = frame.lastSequence;
    for (const item of linked) {
      const sequence = item.event.sequence;
      if (sequence <= this.processed || this.pending.has(sequence) || this.seen.has(item.event.eventId)) continue;
      this.pending.set(sequence, { last: sequence, linked: item });
    }
    // Skipped sequences never reach the handler but move the cursor.
    for (const range of frame.skipped) {
      if (range.last <= this.processed) continue;
      const first = range.first > this.processed ? range.first : this.processed + 1n;
      if (!this.pending.has(first)) this.pending.set(first, { last: range.last });
    }
    this.pump();
  }

  /** A FLOW frame: the visibility start, or a delivered sequence beyond what arrived (a gap). */
  onFlow(flow: FlowFrame): void {
    if (this.stopped) return;
    if (flow.reason === FlowReason.SUBSCRIBED && flow.effectiveAfterSequence > this.processed) {
      this.host.log(`${this.groupId}: visibility starts after sequence ${flow.effectiveAfterSequence}`);
      this.window.startAt(flow.effectiveAfterSequence);
      this.advance(flow.effectiveAfterSequence, undefined);
    }
    if (flow.deliveredSequence > this.flowDelivered) this.flowDelivered = flow.deliveredSequence;
    this.checkGap();
  }

  /** An ERROR frame naming this subscription: retried from the cursor, or the end of it. */
  onError(frame: ErrorFrame): void {
    if (this.stopped) return;
    if (RETRIED.has(frame.code)) {
      const delay = this.retry.next();
      this.host.log(`${this.groupId}: ${gatewayCodeName(frame.code)}; retrying in ${Math.round(delay)} ms`);
      const id = this.subscriptionId;
      void sleep(delay).then(() => {
        if (id === this.subscriptionId) this.open();
      });
      return;
    }
    this.fail(gatewayCodeName(frame.code), new GatewayError(frame));
  }

  /** CURSOR_TOO_OLD: restore the verified snapshot through `onSnapshot`, continue from its sequence. */
  async onCursorTooOld(frame: CursorTooOldFrame): Promise<void> {
    if (this.stopped) return;
    if (this.options.onSnapshot === undefined || frame.signedReference === undefined) {
      this.fail("CURSOR_TOO_OLD", new AgentError(`sequence ${this.processed} is older than the online log and no onSnapshot restores a snapshot`));
      return;
    }
    // The gateway ended that subscription: nothing more is acknowledged under its id, and an error
    // naming it (an ACK that was in flight: UNKNOWN_SUBSCRIPTION) is no longer routed here.
    this.subscriptionId = "";
    this.clearGap();
    try {
      const snapshot = await this.host.snapshot(frame.signedReference);
      await this.options.onSnapshot(snapshot);
      await this.pumping;
      this.processed = snapshot.sequence;
      this.lastLink = snapshot.lastEventDigest.length > 0 ? snapshot.lastEventDigest : undefined;
      await this.host.cursors.save(this.groupId, this.processed);
      this.cursor = this.processed;
      this.open();
    } catch (err) {
      this.fail(err instanceof NotVerified ? "NOT_VERIFIED" : "CURSOR_TOO_OLD", err);
    }
  }

  /** Lets the running handler finish (at most `graceMs`), then ACKs what is durable. */
  async drain(graceMs: number): Promise<void> {
    this.draining = true; // what arrives now lies beyond the final ACK and comes again next time
    this.clearGap();
    await within(this.pumping, graceMs);
    await this.host.cursors.save(this.groupId, this.processed).catch(() => undefined);
    this.cursor = this.processed;
    this.window.processed(this.cursor);
    this.ack(true);
  }

  /** Stops for good with `reason` (e.g. `NOT_VERIFIED`, `NOT_A_MEMBER`). */
  fail(reason: string, cause: unknown): void {
    if (this.stopped) return;
    const message = cause instanceof Error ? cause.message : String(cause);
    this.failure = new SubscriptionFailed(this.groupId, reason, message, cause);
    this.host.log(`${this.groupId}: the subscription stopped: ${this.failure.message}`);
    this.clearGap();
    this.pending.clear();
    this.host.send({ case: "unsubscribe", value: create(UnsubscribeFrameSchema, { subscriptionId: this.subscriptionId }) });
    for (const waiter of this.waiters.splice(0)) waiter.reject(this.failure);
    this.options.onFailed?.(this.failure);
  }

  /** Runs `release` until nothing new arrived meanwhile (a frame arriving while it winds down wakes it again). */
  private pump(): void {
    this.wake = true;
    if (this.pumping !== undefined) return;
    this.pumping = (async () => {
      while (this.wake && !this.stopped) {
        this.wake = false;
        await this.release();
      }
    })().finally(() => {
      this.pumping = undefined;
      if (this.wake && !this.stopped) this.pump();
      else this.checkGap();
    });
  }

  /** Hands out every event that continues the cursor, in order, one at a time; stops at the first gap. */
  private async release(): Promise<void> {
    for (;;) {
      const next = this.pending.get(this.processed + 1n);
      if (next === undefined || this.stopped || this.draining) return;
      this.pending.delete(this.processed + 1n);
      if (next.linked !== undefined) {
        const { event, link } = next.linked;
        if (this.lastLink !== undefined && !sameBytes(event.previousDigest, this.lastLink)) {
          this.fail("NOT_VERIFIED", new NotVerified(`event ${event.sequence} of ${this.groupId} does not name the digest of the event before it`));
          return;
        }
        if (!(await this.handle(event))) return;
        this.seen.add(event.eventId);
        if (this.seen.size > SEEN_IDS) this.seen.delete(this.seen.values().next().value as string);
        this.advance(next.last, link);
      } else {
        this.advance(next.last, undefined); // the chain cannot be checked across skipped events
      }
    }
  }

  /** Runs the handler until it returns (a throwing handler is called again after a growing delay). */
  private async handle(event: Event): Promise<boolean> {
    const retry = new Backoff(500, 30_000);
    for (;;) {
      try {
        await this.handler(event);
        return true;
      } catch (err) {
        if (this.stopped) return false;
        const delay = retry.next();
        this.host.log(`${this.groupId}: the handler failed on sequence ${event.sequence} (${(err as Error).message}); again in ${Math.round(delay)} ms`);
        await sleep(delay);
        if (this.stopped) return false;
      }
    }
  }

  /** The processed cursor moves to `sequence`; the durable one follows once written, then the ACK. */
  private advance(sequence: bigint, link: Uint8Array | undefined): void {
    this.processed = sequence;
    this.lastLink = link;
    for (const key of this.pending.keys()) if (key <= sequence) this.pending.delete(key);
    this.host.cursors.save(this.groupId, sequence).then(
      () => {
        if (sequence > this.cursor) this.cursor = sequence;
        this.window.processed(this.cursor);
        this.retry.reset();
        for (const waiter of this.waiters.filter((w) => w.sequence <= this.cursor)) waiter.resolve();
        this.waiters = this.waiters.filter((w) => w.sequence > this.cursor);
        this.ack(false);
        this.idleAck ??= setImmediate(() => {
          this.idleAck = undefined;
          this.ack(true);
        });
      },
      (err: unknown) => this.fail("CURSOR_FILE", err),
    );
  }

  private ack(idle: boolean): void {
    // Disconnected: the next stream starts with a new window from the cursor, nothing to grant.
    if (this.stopped || !this.subscriptionId || !this.host.connected() || !this.window.due(this.cursor, idle)) return;
    const { cursor, credits } = this.window.take(this.cursor);
    const ack: CursorAck = create(CursorAckSchema, { subscriptionId: this.subscriptionId, groupId: this.groupId, cursor, credits });
    this.host.send({ case: "ack", value: create(AckFrameSchema, { cursors: [ack] }) });
  }

  /** A gap: early events wait for missing ones, or FLOW reported more than arrived. Timed, then resubscribed. */
  private checkGap(): void {
    const gap = (this.pending.size > 0 && !this.pending.has(this.processed + 1n)) || this.flowDelivered > this.receivedThrough;
    if (!gap || this.stopped) return this.clearGap();
    if (this.gapTimer !== undefined) return;
    const id = this.subscriptionId;
    this.gapTimer = setTimeout(() => {
      this.gapTimer = undefined;
      if (id === this.subscriptionId && !this.stopped) this.resubscribe(`a gap after sequence ${this.processed} did not fill`);
    }, this.options.gapTimeoutMs ?? 10_000);
  }

  private clearGap(): void {
    if (this.gapTimer !== undefined) clearTimeout(this.gapTimer);
    this.gapTimer = undefined;
  }
}
