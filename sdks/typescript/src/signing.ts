/**
 * Ed25519 keys and DSSE envelopes, byte for byte as missionweave/kernel/signing.py makes them: the
 * signature covers the DSSE pre-authentication encoding (PAE) of the exact payload bytes, so no side
 * ever re-serialises a protobuf to check one.
 * @module
 */
import { createPrivateKey, createPublicKey, randomBytes, sign, verify, type KeyObject } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { create } from "@bufbuild/protobuf";
import { blake3 } from "@noble/hashes/blake3.js";
import { SignedEnvelopeSchema, SignatureSchema, type SignedEnvelope } from "./gen/missionweave/v1/common_pb.js";

/** Payload type of a signed `missionweave.v1.Command`. */
export const COMMAND_TYPE = "application/vnd.missionweave.v1.command+protobuf";
/** Payload type of an Authority-signed `missionweave.v1.Event`. */
export const EVENT_TYPE = "application/vnd.missionweave.v1.event+protobuf";
/** Payload type of `OpenSessionCommand` (signed by the identity key). */
export const OPEN_SESSION_TYPE = "application/vnd.missionweave.v1.open-session+protobuf";
/** Payload type of the `GroupSnapshot` a CURSOR_TOO_OLD points to. */
export const SNAPSHOT_TYPE = "application/vnd.missionweave.v1.group-snapshot+protobuf";
/** Payload type of the HELLO (and GetSnapshot) proof. */
export const HELLO_PROOF_TYPE = "application/vnd.missionweave.v1.hello-proof+protobuf";
/** Payload type of a signed `SnapshotReference`. */
export const SNAPSHOT_REFERENCE_TYPE = "application/vnd.missionweave.v1.snapshot-reference+protobuf";
/** Payload type of an Authority key rotation record. */
export const KEY_ROTATION_TYPE = "application/vnd.missionweave.v1.authority-key-rotation+protobuf";
/** Payload type of a call proof (auth.proto `CallProof`). */
export const CALL_PROOF_TYPE = "application/vnd.missionweave.v1.call-proof+protobuf";
/** The binary metadata entry a call proof travels in. */
export const CALL_PROOF_METADATA = "mwp-call-proof-bin";

// Node's crypto takes Ed25519 keys as DER: the fixed ASN.1 header of the algorithm (OID 1.3.101.112)
// in front of the raw 32-byte seed or public key.
const PKCS8_ED25519_PREFIX = Buffer.from("302e020100300506032b657004220420", "hex");
const SPKI_ED25519_PREFIX = Buffer.from("302a300506032b6570032100", "hex");

const encoder = new TextEncoder();

/** DSSE v1 pre-authentication encoding: `"DSSEv1" SP len(type) SP type SP len(payload) SP payload` (lengths in bytes). */
export function pae(payloadType: string, payload: Uint8Array): Uint8Array {
  const type = encoder.encode(payloadType);
  return Buffer.concat([
    encoder.encode(`DSSEv1 ${type.length} `),
    type,
    encoder.encode(` ${payload.length} `),
    payload,
  ]);
}

/** An Ed25519 signing key: its seed (to persist it) and Node's key objects (to use it). */
export class SigningKey {
  /** Node's private key object. */
  readonly privateKey: KeyObject;
  /** The raw 32-byte public key, as the mesh registers it. */
  readonly publicKey: Uint8Array;

  constructor(
    /** The 32-byte seed (what `mwp keygen` writes in hex). */
    readonly seed: Uint8Array,
  ) {
    if (seed.length !== 32) throw new Error(`an Ed25519 seed is 32 bytes, not ${seed.length}`);
    this.privateKey = createPrivateKey({ key: Buffer.concat([PKCS8_ED25519_PREFIX, seed]), format: "der", type: "pkcs8" });
    const spki = createPublicKey(this.privateKey).export({ format: "der", type: "spki" });
    this.publicKey = new Uint8Array(spki.subarray(spki.length - 32));
  }

  /** A fresh random key. */
  static generate(): SigningKey {
    return new SigningKey(randomBytes(32));
  }

  /** The Ed25519 signature of `message` (PureEdDSA, as PyNaCl's `SigningKey.sign`). */
  sign(message: Uint8Array): Uint8Array {
    return new Uint8Array(sign(null, message, this.privateKey));
  }
}

/** Whether `sig` is `publicKey`'s Ed25519 signature of `message` (false for malformed keys or signatures). */
export function verifyEd25519(publicKey: Uint8Array, message: Uint8Array, sig: Uint8Array): boolean {
  try {
    const key = createPublicKey({ key: Buffer.concat([SPKI_ED25519_PREFIX, publicKey]), format: "der", type: "spki" });
    return verify(null, message, key, sig);
  } catch {
    return false;
  }
}

/** A SignedEnvelope of `payload` with one signature by `key` under `keyId` (signing.py `sign_envelope`). */
export function signEnvelope(payload: Uint8Array, payloadType: string, key: SigningKey, keyId: string): SignedEnvelope {
  return create(SignedEnvelopeSchema, {
    payload,
    payloadType,
    signatures: [create(SignatureSchema, { keyId, sig: key.sign(pae(payloadType, payload)) })],
  });
}

/** Whether signature `index` of `envelope` verifies with `publicKey` over the PAE of its payload. */
export function verifyEnvelope(envelope: SignedEnvelope, publicKey: Uint8Array, index = 0): boolean {
  const signature = envelope.signatures[index];
  return signature !== undefined && verifyEd25519(publicKey, pae(envelope.payloadType, envelope.payload), signature.sig);
}

/** The key id of a session's signatures: `<identity>#session-<epoch>`. */
export function sessionKeyId(identityId: string, sessionEpoch: bigint): string {
  return `${identityId}#session-${sessionEpoch}`;
}

/** The key id of an identity key's signatures: `<identity>#identity`. */
export function identityKeyId(identityId: string): string {
  return `${identityId}#identity`;
}

/**
 * The Ed25519 key in a file written by `mwp keygen` (signing.py `write_key`): the 32-byte seed as 64
 * hex characters, mode 0600. A file readable by others is refused, as `read_key` refuses it.
 */
export function readKeyFile(path: string): SigningKey {
  const mode = statSync(path).mode & 0o777;
  if (process.platform !== "win32" && mode & 0o077) {
    throw new Error(`key file ${path} has mode ${mode.toString(8)}; it must not be readable by others (0600)`);
  }
  const hex = readFileSync(path, "utf8").trim();
  if (!/^[0-9a-fA-F]{64}$/.test(hex)) {
    throw new Error(`key file ${path} is not an Ed25519 key (64 hex characters, as \`mwp keygen\` writes)`);
  }
  return new SigningKey(Buffer.from(hex, "hex"));
}

/** BLAKE3-256 of `data`. */
export function blake3Digest(data: Uint8Array): Uint8Array {
  return blake3(data);
}

/** Lower-case hex of `data`. */
export function toHex(data: Uint8Array): string {
  return Buffer.from(data).toString("hex");
}

/** Whether two byte arrays are equal. */
export function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(b);
}

/** A fresh, time-ordered id such as `cmd_01...` (ids.py `new_id`). */
export function newId(prefix: string): string {
  const millis = Buffer.alloc(8);
  millis.writeBigUInt64BE(BigInt(Date.now()));
  return `${prefix}_${millis.subarray(2).toString("hex")}${randomBytes(7).toString("hex")}`;
}
