// Each event checked by the page: the Authority's signature (with the key it served, or one of its
// recorded earlier keys) and the hash chain (each event names its predecessor's BLAKE3-256); every
// signature is checked (checks.ts). The checks run in a worker of the page's own origin
// (verify-worker.ts): ~1-1.5 s of Ed25519 and BLAKE3 for 10,000 events on a 2-core machine,
// which on the page's thread would hold back its drawing (bench/console.py). Where no worker can
// be started, the same checks run in the page.
import { fromBinary } from "@bufbuild/protobuf";
import { AuthorityService } from "./gen/missionweave/v1/authority_service_pb";
import type { SignedEnvelope } from "./gen/missionweave/v1/common_pb";
import { EventSchema, type Event } from "./gen/missionweave/v1/event_pb";
import { EnvelopeChecker, type Envelope, type Mark, type Outcome } from "./checks";
import type { Mesh } from "./mesh";

export type { Mark } from "./checks";

export interface CheckedEvent {
  event: Event;
  envelope: SignedEnvelope;
  signedBy: string;
  mark: Mark;
  why: string;
}

const WORKER_URL = "/static/verify-worker.js";

interface Answer {
  id: number;
  first?: number;
  outcomes?: Outcome[];
  busyMs?: number;
  end?: boolean;
  error?: string;
}

interface Pending {
  batch: CheckedEvent[];
  done: (checked: CheckedEvent) => void;
  resolve: () => void;
}

/** What the check needs of an event, its bytes copied (a decoded payload is a view of a whole response). */
function envelopeOf(c: CheckedEvent): Envelope {
  const signature = c.envelope.signatures[0];
  return {
    sequence: c.event.sequence,
    payload: c.envelope.payload.slice(),
    payloadType: c.envelope.payloadType,
    keyId: signature?.keyId ?? "",
    signature: signature ? signature.sig.slice() : new Uint8Array(),
    previousDigest: c.event.previousDigest.slice(),
    originalDigest: c.event.redaction?.originalEventDigest.slice() ?? new Uint8Array(),
  };
}

export class EventVerifier {
  private worker: Worker | null = null;
  private local: EnvelopeChecker | null = null;
  private readonly pending = new Map<number, Pending>();
  private next = 1;
  /** Time spent checking so far (ms, the windows of checks from start to last answer). */
  busyMs = 0;

  private constructor(private readonly keys: Map<string, Uint8Array>) {
    try {
      this.worker = new Worker(WORKER_URL, { type: "module" });
      this.worker.onmessage = (message: MessageEvent<Answer>) => this.answered(message.data);
      this.worker.onerror = () => this.inPage();
      this.worker.postMessage({ keys: [...keys] });
    } catch {
      this.inPage();
    }
  }

  static async forMesh(mesh: Mesh): Promise<EventVerifier> {
    const answer = await mesh.unary(AuthorityService.method.getAuthorityKey, {});
    const keys = new Map<string, Uint8Array>();
    for (const k of answer.keys) keys.set(k.keyId, k.publicKey);
    keys.set(answer.keyId, answer.publicKey);
    return new EventVerifier(keys);
  }

  decode(envelope: SignedEnvelope): CheckedEvent {
    const event = fromBinary(EventSchema, envelope.payload);
    return { event, envelope, signedBy: envelope.signatures[0]?.keyId ?? "", mark: "pending", why: "" };
  }

  /** Checks `batch` after every batch given before it; `done` is told of each event as its check ends. */
  checkAll(batch: CheckedEvent[], done: (checked: CheckedEvent) => void): Promise<void> {
    return new Promise((resolve) => {
      const id = this.next++;
      this.pending.set(id, { batch, done, resolve });
      if (this.worker) {
        const envelopes = batch.map(envelopeOf);
        this.worker.postMessage({ id, envelopes }, envelopes.map((e) => e.payload.buffer));
      } else {
        this.checkHere(id);
      }
    });
  }

  /** The worker is not needed any more. */
  close(): void {
    this.worker?.terminate();
    this.worker = null;
  }

  private answered(answer: Answer): void {
    const pending = this.pending.get(answer.id);
    if (!pending) return;
    if (answer.error) {
      // The worker could not check this batch: the page does, as it would without a worker.
      this.inPage();
      return;
    }
    if (answer.outcomes) {
      if (answer.busyMs !== undefined) this.busyMs = answer.busyMs;
      this.apply(pending, answer.first ?? 0, answer.outcomes);
    }
    if (answer.end) {
      this.pending.delete(answer.id);
      pending.resolve();
    }
  }

  private apply(pending: Pending, first: number, outcomes: Outcome[]): void {
    outcomes.forEach((outcome, i) => {
      const checked = pending.batch[first + i];
      if (!checked) return;
      Object.assign(checked, outcome);
      pending.done(checked);
    });
  }

  /** From now on the checks run in the page: those of the batches still pending too, in order. */
  private inPage(): void {
    this.worker?.terminate();
    this.worker = null;
    if (this.local) return;
    this.local = new EnvelopeChecker(this.keys);
    for (const id of [...this.pending.keys()].sort((a, b) => a - b)) this.checkHere(id);
  }

  private checkHere(id: number): void {
    const pending = this.pending.get(id);
    const local = (this.local ??= new EnvelopeChecker(this.keys));
    if (!pending) return;
    const envelopes = pending.batch.map(envelopeOf);
    void local
      .checkAll(envelopes, (first, outcomes) => {
        this.busyMs = local.busyMs;
        this.apply(pending, first, outcomes);
      })
      .finally(() => {
        this.pending.delete(id);
        pending.resolve();
      });
  }
}
