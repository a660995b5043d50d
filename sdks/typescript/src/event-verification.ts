/**
 * Verification of what the gateway relays from the Authority before anything parses it, as
 * missionweave/sdk/event_verification.py: events (a frame's worth along the event chain with as few
 * Ed25519 checks as it allows, docs/integrity.md), signed snapshot references and snapshots.
 * @module
 */
import { fromBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { NotVerified, AgentError } from "./errors.js";
import { AuthorityKeyRotationSchema, GroupSnapshotSchema, type GetAuthorityKeyResponse, type GroupSnapshot } from "./gen/missionweave/v1/authority_service_pb.js";
import type { SignedEnvelope } from "./gen/missionweave/v1/common_pb.js";
import { EventSchema, type Event } from "./gen/missionweave/v1/event_pb.js";
import { SnapshotReferenceSchema, type GetSnapshotResponse, type SnapshotReference } from "./gen/missionweave/v1/gateway_service_pb.js";
import {
  EVENT_TYPE,
  KEY_ROTATION_TYPE,
  SNAPSHOT_REFERENCE_TYPE,
  SNAPSHOT_TYPE,
  blake3Digest,
  pae,
  sameBytes,
  toHex,
  verifyEd25519,
  verifyEnvelope,
} from "./signing.js";

/** A verified event with its chain value: what the next event's `previous_digest` must name (eventlog.py `link_of`). */
export interface Linked {
  /** The parsed, verified event. */
  readonly event: Event;
  /** BLAKE3 of the payload first signed (an erased copy: its marker's original digest). */
  readonly link: Uint8Array;
}

function parse<D extends DescMessage>(schema: D, payload: Uint8Array): MessageShape<D> {
  try {
    return fromBinary(schema, payload);
  } catch {
    throw new NotVerified(`the signed payload is not a ${schema.typeName}`);
  }
}

/** Holds the Authority's keys (current and rotated away from) and checks its signatures before anything is parsed. */
export class AuthorityVerifier {
  /** Every key of the history by key id: old history verifies with the key it names. */
  readonly keys: ReadonlyMap<string, Uint8Array>;

  constructor(
    /** The current key's id, `authority:<fingerprint>`. */
    readonly keyId: string,
    /** The current public key. */
    readonly publicKey: Uint8Array,
    earlier: ReadonlyMap<string, Uint8Array> = new Map(),
  ) {
    this.keys = new Map([...earlier, [keyId, publicKey]]);
  }

  /**
   * The verifier of a `GetAuthorityKey` answer: each key after the first must come with its rotation,
   * signed by the key before it and by itself, and the history must end with the current key. With
   * `pinnedHex`, one key of that history must be it (a key obtained out of band).
   */
  static fromKeyResponse(response: GetAuthorityKeyResponse, pinnedHex?: string): AuthorityVerifier {
    const history = response.keys.length > 0 ? response.keys : [{ keyId: response.keyId, publicKey: response.publicKey, rotation: undefined }];
    const earlier = new Map<string, Uint8Array>();
    history.forEach((record, i) => {
      const previous = history[i - 1];
      if (previous !== undefined) {
        const envelope = record.rotation;
        const signedBy = (key: { keyId: string; publicKey: Uint8Array }): boolean =>
          envelope !== undefined &&
          envelope.signatures.some((s) => s.keyId === key.keyId && verifyEd25519(key.publicKey, pae(KEY_ROTATION_TYPE, envelope.payload), s.sig));
        if (envelope === undefined || envelope.payloadType !== KEY_ROTATION_TYPE || !signedBy(previous) || !signedBy(record)) {
          throw new AgentError(`the Authority's key history does not hold: no rotation signed by both keys introduces ${record.keyId}`);
        }
        const rotation = parse(AuthorityKeyRotationSchema, envelope.payload);
        const names =
          rotation.previousKeyId === previous.keyId &&
          sameBytes(rotation.previousPublicKey, previous.publicKey) &&
          rotation.keyId === record.keyId &&
          sameBytes(rotation.publicKey, record.publicKey);
        if (!names) throw new AgentError(`the rotation to ${record.keyId} does not name ${previous.keyId} and itself`);
      }
      earlier.set(record.keyId, record.publicKey);
    });
    const last = history[history.length - 1];
    if (last === undefined || last.keyId !== response.keyId || !sameBytes(last.publicKey, response.publicKey)) {
      throw new AgentError(`the Authority's key history does not end with its current key ${response.keyId}`);
    }
    if (pinnedHex !== undefined && !history.some((k) => toHex(k.publicKey) === pinnedHex.toLowerCase())) {
      throw new AgentError(`the Authority key ${toHex(response.publicKey)} is not the pinned key ${pinnedHex}, nor rotated from it`);
    }
    return new AuthorityVerifier(response.keyId, response.publicKey, earlier);
  }

  /** The payload of `envelope` once its payload type is `payloadType` and a signature by a key of the history verifies. */
  payload(envelope: SignedEnvelope, payloadType: string): Uint8Array {
    if (envelope.payloadType !== payloadType) throw new NotVerified(`payload type ${envelope.payloadType} is not ${payloadType}`);
    const index = envelope.signatures.findIndex((s) => this.keys.has(s.keyId));
    const signature = envelope.signatures[index];
    if (signature === undefined || !verifyEnvelope(envelope, this.keys.get(signature.keyId) as Uint8Array, index)) {
      throw new NotVerified(`no valid signature by the Authority key ${this.keyId}`);
    }
    return envelope.payload;
  }

  /** One event, verified then parsed. */
  event(envelope: SignedEnvelope): Event {
    return parse(EventSchema, this.payload(envelope, EVENT_TYPE));
  }

  /**
   * A frame's events, each verified before it is parsed, newest first along the chain: an event whose
   * payload hashes to the `previous_digest` of a verified successor is the payload the Authority signed
   * before it, so a contiguous frame costs one signature check. Returned in frame order.
   */
  events(envelopes: readonly SignedEnvelope[]): Linked[] {
    const linked: Linked[] = [];
    let vouched: Uint8Array = new Uint8Array(0);
    for (let i = envelopes.length - 1; i >= 0; i--) {
      const envelope = envelopes[i] as SignedEnvelope;
      const digest = blake3Digest(envelope.payload);
      const chained = envelope.payloadType === EVENT_TYPE && vouched.length > 0 && sameBytes(digest, vouched);
      const payload = chained ? envelope.payload : this.payload(envelope, EVENT_TYPE);
      const event = parse(EventSchema, payload);
      const original = event.redaction?.originalEventDigest;
      linked.push({ event, link: original !== undefined && original.length > 0 ? original : digest });
      vouched = event.previousDigest;
    }
    return linked.reverse();
  }

  /** A signed snapshot reference (CURSOR_TOO_OLD), verified then parsed. */
  snapshotReference(envelope: SignedEnvelope): SnapshotReference {
    return parse(SnapshotReferenceSchema, this.payload(envelope, SNAPSHOT_REFERENCE_TYPE));
  }

  /** The reference a GetSnapshot answer comes with: `asked` itself, or the Authority's reference to `viewerId`'s view of it. */
  answering(envelope: SignedEnvelope, asked: SnapshotReference, viewerId: string): SnapshotReference {
    const got = this.snapshotReference(envelope);
    if (got.groupId !== asked.groupId || got.sequence !== asked.sequence) {
      throw new NotVerified("the snapshot answer names another Group or sequence than was asked");
    }
    if (got.digest?.hex === asked.digest?.hex && got.viewOf === undefined) return got;
    if (got.viewOf?.hex !== asked.digest?.hex || got.viewerId !== viewerId) {
      throw new NotVerified(`the snapshot answer is not ${viewerId}'s view of ${asked.digest?.hex}`);
    }
    return got;
  }

  /** MW-16-12: the snapshot's signature, then its BLAKE3 digest and size against the signed reference. */
  snapshot(envelope: SignedEnvelope, reference: SnapshotReference): GroupSnapshot {
    const payload = this.payload(envelope, SNAPSHOT_TYPE);
    const digest = reference.digest;
    const size = digest?.sizeBytes ?? 0n;
    if (digest === undefined || toHex(blake3Digest(payload)) !== digest.hex || (size !== 0n && size !== BigInt(payload.length))) {
      throw new NotVerified(`the snapshot does not match the digest ${digest?.hex} it is referenced by`);
    }
    const snapshot = parse(GroupSnapshotSchema, payload);
    if (snapshot.groupId !== reference.groupId || snapshot.sequence !== reference.sequence) {
      throw new NotVerified("the snapshot names another Group or sequence than its reference");
    }
    return snapshot;
  }
}

/**
 * MW-16-12 from a CURSOR_TOO_OLD's signed reference to the snapshot: the reference verified, the
 * snapshot fetched (`fetch`: GatewayService.GetSnapshot with a session proof), the answer's reference
 * checked to be the one asked (or `viewerId`'s view of it), then the snapshot's signature, digest and size.
 */
export async function verifiedSnapshot(
  verifier: AuthorityVerifier,
  reference: SignedEnvelope,
  viewerId: string,
  fetch: (asked: SnapshotReference) => Promise<GetSnapshotResponse>,
): Promise<GroupSnapshot> {
  const asked = verifier.snapshotReference(reference);
  const answer = await fetch(asked);
  if (answer.snapshot === undefined || answer.signedReference === undefined) throw new NotVerified("GetSnapshot answered no snapshot");
  return verifier.snapshot(answer.snapshot, verifier.answering(answer.signedReference, asked, viewerId));
}
