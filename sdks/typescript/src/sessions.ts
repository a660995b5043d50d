/**
 * An agent's session (MW-11.3-09), as missionweave/sdk/sessions.py keeps it: {@link SessionSigner}
 * signs as `<identity>#session-<epoch>`; {@link SessionFile} persists it (`session.json`, mode 0600,
 * the Python SDK's format) so a restarted agent reuses it instead of fencing itself; {@link openSession}
 * opens a new one with the identity key; {@link sessionProof} is the HelloProof of HELLO and GetSnapshot.
 * @module
 */
import { randomBytes } from "node:crypto";
import { create, toBinary } from "@bufbuild/protobuf";
import { timestampNow, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { Client } from "@connectrpc/connect";
import { AgentError } from "./errors.js";
import { readJson, writeJsonAtomic } from "./files.js";
import type { SignedEnvelope } from "./gen/missionweave/v1/common_pb.js";
import { HelloProofSchema } from "./gen/missionweave/v1/gateway_service_pb.js";
import { GatewayErrorCode } from "./gen/missionweave/v1/gateway_service_pb.js";
import { MembershipService, OpenSessionCommandSchema, OpenSessionRequestSchema } from "./gen/missionweave/v1/membership_service_pb.js";
import type { GatewayError } from "./errors.js";
import { HELLO_PROOF_TYPE, OPEN_SESSION_TYPE, SigningKey, identityKeyId, sessionKeyId, signEnvelope } from "./signing.js";

/** Signs as one identity's session: key id `<identity>#session-<epoch>`. */
export class SessionSigner {
  constructor(
    /** The identity the session belongs to. */
    readonly identityId: string,
    /** The epoch `OpenSession` answered. */
    readonly sessionEpoch: bigint,
    /** The session's Ed25519 key (the SDK generated it). */
    readonly key: SigningKey,
  ) {}

  /** The key id its signatures carry. */
  get keyId(): string {
    return sessionKeyId(this.identityId, this.sessionEpoch);
  }

  /** `payload` signed as this session. */
  sign(payload: Uint8Array, payloadType: string): SignedEnvelope {
    return signEnvelope(payload, payloadType, this.key, this.keyId);
  }
}

/** The saved session (`{identity_id, session_epoch, key}` in JSON, mode 0600), reused until the gateway refuses it. */
export class SessionFile {
  constructor(
    /** The file, `<stateDir>/<identity>/session.json`. */
    readonly path: string,
    /** The identity whose session it holds. */
    readonly identityId: string,
  ) {}

  /** The saved session, undefined when there is none (or one of another identity). */
  load(): SessionSigner | undefined {
    const data = readJson(this.path);
    if (data === undefined || data["identity_id"] !== this.identityId) return undefined;
    const epoch = data["session_epoch"];
    const key = data["key"];
    if (typeof epoch !== "number" || !Number.isInteger(epoch) || typeof key !== "string" || !/^[0-9a-f]{64}$/i.test(key)) {
      throw new AgentError(`${this.path} is not a saved session`);
    }
    return new SessionSigner(this.identityId, BigInt(epoch), new SigningKey(Buffer.from(key, "hex")));
  }

  /** Saves `signer` atomically (mode 0600). */
  save(signer: SessionSigner): void {
    writeJsonAtomic(this.path, {
      identity_id: signer.identityId,
      session_epoch: Number(signer.sessionEpoch),
      key: Buffer.from(signer.key.seed).toString("hex"),
    });
  }
}

/**
 * Whether a new session may cure the gateway's refusal of a HELLO under a saved session
 * (SESSION_STALE, HELLO_INVALID), not when the proof named another gateway (a new one would fail alike).
 */
export function renewable(err: GatewayError): boolean {
  const renew = err.code === GatewayErrorCode.SESSION_STALE || err.code === GatewayErrorCode.HELLO_INVALID;
  return renew && err.frame.rejection?.metadata["field"] !== "audience";
}

/** The signed `OpenSessionCommand` of `identityId` for `sessionPublicKey`, signed by the identity key. */
export function openSessionEnvelope(identityId: string, identityKey: SigningKey, sessionPublicKey: Uint8Array): SignedEnvelope {
  const command = create(OpenSessionCommandSchema, {
    identityId,
    sessionPublicKey,
    issuedAt: timestampNow(),
    nonce: randomBytes(16),
  });
  return signEnvelope(toBinary(OpenSessionCommandSchema, command), OPEN_SESSION_TYPE, identityKey, identityKeyId(identityId));
}

/**
 * Opens a new session of `identityId` with a fresh session key (OpenSession, signed by the identity
 * key; it fences the identity's older sessions) and saves it to `file` when given.
 */
export async function openSession(
  membership: Client<typeof MembershipService>,
  identityId: string,
  identityKey: SigningKey,
  file?: SessionFile,
): Promise<SessionSigner> {
  const sessionKey = SigningKey.generate();
  const command = openSessionEnvelope(identityId, identityKey, sessionKey.publicKey);
  const response = await membership.openSession(create(OpenSessionRequestSchema, { command }));
  if (response.session === undefined) throw new AgentError(`OpenSession of ${identityId} answered no session`);
  const signer = new SessionSigner(identityId, response.session.sessionEpoch, sessionKey);
  file?.save(signer);
  return signer;
}

/** The time and nonce of a proof, pinned (tests only: the gateway accepts each nonce once). */
export interface FixedProof {
  readonly issuedAt: Timestamp;
  readonly nonce: Uint8Array;
}

/** A fresh HelloProof for `audience`: what HELLO and GetSnapshot carry to prove the session. */
export function sessionProof(signer: SessionSigner, audience: string, fixed?: FixedProof): SignedEnvelope {
  const proof = create(HelloProofSchema, {
    agentId: signer.identityId,
    sessionEpoch: signer.sessionEpoch,
    issuedAt: fixed?.issuedAt ?? timestampNow(),
    nonce: fixed?.nonce ?? randomBytes(16),
    audience,
  });
  return signer.sign(toBinary(HelloProofSchema, proof), HELLO_PROOF_TYPE);
}
