// Each event checked in the page: the Authority's signature (with the key it served, or one of
// its recorded earlier keys) and the hash chain (each event names its predecessor's BLAKE3-256).
import { fromBinary } from "@bufbuild/protobuf";
import { blake3 } from "@noble/hashes/blake3.js";
import { AuthorityService } from "./gen/missionweave/v1/authority_service_pb";
import type { SignedEnvelope } from "./gen/missionweave/v1/common_pb";
import { EventSchema, type Event } from "./gen/missionweave/v1/event_pb";
import { verify } from "./keys";
import { EVENT_TYPE, type Mesh } from "./mesh";

export type Mark = "verified" | "failed" | "pending";

export interface CheckedEvent {
  event: Event;
  envelope: SignedEnvelope;
  signedBy: string;
  mark: Mark;
  why: string;
}

function equal(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

export class EventVerifier {
  private keys = new Map<string, Uint8Array>();
  // The digest of the last event checked, by sequence, to check the next one's link.
  private digests = new Map<bigint, Uint8Array>();

  static async forMesh(mesh: Mesh): Promise<EventVerifier> {
    const verifier = new EventVerifier();
    const answer = await mesh.unary(AuthorityService.method.getAuthorityKey, {});
    for (const k of answer.keys) verifier.keys.set(k.keyId, k.publicKey);
    verifier.keys.set(answer.keyId, answer.publicKey);
    return verifier;
  }

  decode(envelope: SignedEnvelope): CheckedEvent {
    const event = fromBinary(EventSchema, envelope.payload);
    return { event, envelope, signedBy: envelope.signatures[0]?.keyId ?? "", mark: "pending", why: "" };
  }

  /** Checks `checked` in place: its signature, then its link to the event before it, when that one was read. */
  async check(checked: CheckedEvent): Promise<CheckedEvent> {
    const { envelope, event } = checked;
    const signature = envelope.signatures[0];
    const key = signature ? this.keys.get(signature.keyId) : undefined;
    const digest = event.redaction?.originalEventDigest.length ? event.redaction.originalEventDigest : blake3(envelope.payload);
    this.digests.set(event.sequence, digest);
    if (envelope.payloadType !== EVENT_TYPE || !signature || !key) {
      return Object.assign(checked, { mark: "failed", why: key ? "not an event envelope" : `signed by an unknown key ${signature?.keyId ?? ""}` });
    }
    if (!(await verify(key, EVENT_TYPE, envelope.payload, signature.sig))) {
      return Object.assign(checked, { mark: "failed", why: "the Authority's signature does not verify" });
    }
    const previous = this.digests.get(event.sequence - 1n);
    if (previous && event.previousDigest.length && !equal(previous, event.previousDigest)) {
      return Object.assign(checked, { mark: "failed", why: `does not link to event #${event.sequence - 1n}` });
    }
    return Object.assign(checked, { mark: "verified", why: previous ? "signature and chain link verified" : "signature verified" });
  }
}
