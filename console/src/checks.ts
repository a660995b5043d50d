// The check of each event envelope, the same in the verification worker (verify-worker.ts) and,
// where no worker can be started, in the page (verify.ts): the Authority's Ed25519 signature
// (WebCrypto, each key imported once) over DSSE's encoding of the payload, and the link to the
// event before it (each event names its predecessor's BLAKE3-256). Envelopes are checked a window
// at a time, in order, with a new task between windows: Chromium answers crypto.subtle.verify on
// the calling thread (~60-140 us a check on a 2-core machine) and resolves it as a microtask, so a
// log's checks chained by promises alone would be one task of seconds.
import { blake3 } from "@noble/hashes/blake3.js";

// As mesh.ts has it (this file is bundled into the worker too, which needs none of mesh.ts).
export const EVENT_TYPE = "application/vnd.missionweave.v1.event+protobuf";

export type Mark = "verified" | "failed" | "pending";

/** What the check of one envelope needs; `payload` is an ArrayBuffer-backed copy. */
export interface Envelope {
  sequence: bigint;
  payload: Uint8Array<ArrayBuffer>;
  payloadType: string;
  keyId: string; // the first signature's, "" when unsigned
  signature: Uint8Array<ArrayBuffer>;
  previousDigest: Uint8Array; // the event's own previous_digest
  originalDigest: Uint8Array; // a redacted event's original_event_digest, else empty
}

export interface Outcome {
  mark: Mark;
  why: string;
}

// Checks made in one task before the next window is let in.
const WINDOW = 64;

/** A new task (a MessageChannel message: unlike setTimeout, never clamped to 4 ms). */
function yieldTask(): Promise<void> {
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = () => {
      channel.port1.close();
      resolve();
    };
    channel.port2.postMessage(null);
  });
}

// DSSE's pre-authentication encoding of an event payload ("DSSEv1 <len> <type> <len> <payload>"),
// its constant head encoded once.
const encoder = new TextEncoder();
const HEAD = encoder.encode(`DSSEv1 ${encoder.encode(EVENT_TYPE).length} ${EVENT_TYPE} `);

function eventPae(payload: Uint8Array): Uint8Array<ArrayBuffer> {
  const length = encoder.encode(`${payload.length} `);
  const out = new Uint8Array(HEAD.length + length.length + payload.length);
  out.set(HEAD);
  out.set(length, HEAD.length);
  out.set(payload, HEAD.length + length.length);
  return out;
}

function equal(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

export class EnvelopeChecker {
  private imported = new Map<string, Promise<CryptoKey>>();
  // The digest of each event checked whose successor is not checked yet, by sequence.
  private digests = new Map<bigint, Uint8Array>();
  // Batches are checked one after the other: an event's link needs its predecessor's digest.
  private queue: Promise<void> = Promise.resolve();
  /** Time spent in the windows of checks so far (ms, each window from its start to its last answer). */
  busyMs = 0;

  constructor(private readonly keys: Map<string, Uint8Array>) {}

  private key(keyId: string): Promise<CryptoKey> | undefined {
    let key = this.imported.get(keyId);
    if (!key) {
      const raw = this.keys.get(keyId);
      if (!raw) return undefined;
      key = crypto.subtle.importKey("raw", Uint8Array.from(raw), { name: "Ed25519" }, false, ["verify"]);
      this.imported.set(keyId, key);
    }
    return key;
  }

  /** One envelope: its signature, then its link to the event before it, when that one was checked. */
  async check(e: Envelope): Promise<Outcome> {
    const key = e.keyId ? this.key(e.keyId) : undefined;
    this.digests.set(e.sequence, e.originalDigest.length ? e.originalDigest : blake3(e.payload));
    if (e.payloadType !== EVENT_TYPE || !e.keyId || !key) {
      return { mark: "failed", why: key ? "not an event envelope" : `signed by an unknown key ${e.keyId}` };
    }
    const signed = eventPae(e.payload);
    const good = await key.then((k) => crypto.subtle.verify({ name: "Ed25519" }, k, e.signature, signed)).catch(() => false);
    if (!good) return { mark: "failed", why: "the Authority's signature does not verify" };
    const previous = this.digests.get(e.sequence - 1n);
    this.digests.delete(e.sequence - 1n); // its only reader is this event
    if (previous && e.previousDigest.length && !equal(previous, e.previousDigest)) {
      return { mark: "failed", why: `does not link to event #${e.sequence - 1n}` };
    }
    return { mark: "verified", why: previous ? "signature and chain link verified" : "signature verified" };
  }

  /** Checks `batch` after every batch given before it, WINDOW envelopes a task; `done` is told of each window. */
  checkAll(batch: Envelope[], done: (first: number, outcomes: Outcome[]) => void): Promise<void> {
    const run = this.queue.then(async () => {
      for (let i = 0; i < batch.length; i += WINDOW) {
        await yieldTask();
        const start = performance.now();
        const outcomes = await Promise.all(batch.slice(i, i + WINDOW).map((e) => this.check(e)));
        this.busyMs += performance.now() - start;
        done(i, outcomes);
      }
    });
    this.queue = run.catch(() => undefined); // a failure here must not stop the batches after it
    return run;
  }
}
