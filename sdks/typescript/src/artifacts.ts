/**
 * Artifacts up and down (spec 13.1, D161), byte-compatible with missionweave/sdk/artifacts.py and
 * missionweave/kernel/manifest.py: content hashed (BLAKE3 identity, SHA-256 in-toto alias), described
 * by an in-toto Statement v1 (canonical JSON: sorted keys, no whitespace) in a DSSE envelope signed by
 * the producer's session key, uploaded with the bytes only when the store asks for them
 * (`mwp-upload: send`); downloads verified against their BLAKE3 digest and size.
 * @module
 */
import { createHash } from "node:crypto";
import { create, toJson, type JsonValue } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import type { Client } from "@connectrpc/connect";
import { AgentError, NotVerified } from "./errors.js";
import {
  ArtifactManifestSchema,
  ArtifactSchemaSchema,
  ArtifactService,
  ComponentKind,
  ComponentVersionSchema,
  DataClassification,
  DownloadRequestSchema,
  UploadRequestSchema,
  type ArtifactManifest,
  type ComponentVersion,
  type UploadRequest,
} from "./gen/missionweave/v1/artifact_service_pb.js";
import { ArtifactRefSchema, DigestSchema, type ArtifactRef, type Digest, type SignedEnvelope } from "./gen/missionweave/v1/common_pb.js";
import { AsyncQueue } from "./async-queue.js";
import type { SessionSigner } from "./sessions.js";
import { blake3Digest, toHex } from "./signing.js";

/** in-toto Statement v1. */
export const STATEMENT_TYPE = "https://in-toto.io/Statement/v1";
/** The predicate type of a MissionWeave artifact manifest. */
export const PREDICATE_TYPE = "urn:missionweaveprotocol:predicate:artifact-manifest:v1";
/** The DSSE payload type of a manifest. */
export const MANIFEST_PAYLOAD_TYPE = "application/vnd.in-toto+json";
/** What a manifest names as the Agent Card version of a producer that has published none. */
export const NO_AGENT_CARD = "none";
/** Upload and download chunk size (the server's, kernel/digests.py CHUNK_BYTES). */
export const CHUNK_BYTES = 1024 * 1024;

/** The SDK as a component of every manifest it signs. */
export const SDK_COMPONENT: ComponentVersion = create(ComponentVersionSchema, { kind: ComponentKind.TOOL, name: "missionweave-sdk-typescript", version: "0.1.0" });

/** Content's identity (BLAKE3) and in-toto alias (SHA-256). */
export interface Hashes {
  /** BLAKE3 hex. */
  readonly blake3Hex: string;
  /** SHA-256 hex. */
  readonly sha256Hex: string;
  /** Bytes. */
  readonly size: number;
}

/** The hashes of `data`. */
export function hashContent(data: Uint8Array): Hashes {
  return { blake3Hex: toHex(blake3Digest(data)), sha256Hex: createHash("sha256").update(data).digest("hex"), size: data.length };
}

/** The BLAKE3 Digest message of `hashes`. */
export function digestOf(hashes: Hashes): Digest {
  return create(DigestSchema, { algorithm: "blake3", hex: hashes.blake3Hex, sizeBytes: BigInt(hashes.size) });
}

/** Where an Artifact comes from: the manifest's fields besides the content (MW-13.1-03). */
export interface Origin {
  /** The Mission's Group (whose members may then read the blob). */
  readonly groupId: string;
  /** The Mission. */
  readonly missionId: string;
  /** The WorkItem it is a deliverable or Evidence of. */
  readonly workItemId?: string;
  /** The execution lease it was made under. */
  readonly leaseId?: string;
  /** The ownership epoch it was made under. */
  readonly ownershipEpoch?: bigint;
  /** The producer's Agent Card version in force (default {@link NO_AGENT_CARD}). */
  readonly agentCardVersion?: string;
  /** The Artifacts it was derived from: its provenance edges (MW-13.1-04). */
  readonly sources?: readonly Digest[];
  /** Its data classification (default INTERNAL). */
  readonly classification?: DataClassification;
  /** Its schema id (default `none`). */
  readonly schemaId?: string;
}

/** Every MW-13.1-03 field of a manifest, as artifacts.py `build_manifest`. */
export function buildManifest(hashes: Hashes, mediaType: string, producerId: string, origin: Origin): ArtifactManifest {
  return create(ArtifactManifestSchema, {
    contentDigest: digestOf(hashes),
    aliasDigests: [create(DigestSchema, { algorithm: "sha256", hex: hashes.sha256Hex, sizeBytes: BigInt(hashes.size) })],
    mediaType,
    schema: create(ArtifactSchemaSchema, { schemaId: origin.schemaId ?? "none" }),
    producerAgentId: producerId,
    agentCardVersion: origin.agentCardVersion ?? NO_AGENT_CARD,
    missionId: origin.missionId,
    groupId: origin.groupId,
    workItemId: origin.workItemId ?? "",
    sourceArtifacts: [...(origin.sources ?? [])],
    components: [SDK_COMPONENT],
    createdAt: timestampNow(),
    classification: origin.classification ?? DataClassification.INTERNAL,
    sizeBytes: BigInt(hashes.size),
    retrievalUri: `mwp-artifact://mesh/blake3/${hashes.blake3Hex}/${hashes.size}`,
    leaseId: origin.leaseId ?? "",
    ownershipEpoch: origin.ownershipEpoch ?? 0n,
  });
}

/** JSON with object keys sorted at every level and no whitespace (manifest.py `_canonical_json`). */
export function canonicalJson(value: JsonValue): string {
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  const keys = Object.keys(value).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k] as JsonValue)}`).join(",")}}`;
}

/** The canonical in-toto Statement of `manifest` (the DSSE payload; manifest.py `statement_for`). */
export function statementFor(manifest: ArtifactManifest, sha256Hex: string): Uint8Array {
  const blake3Hex = manifest.contentDigest?.hex ?? "";
  if (!/^[0-9a-f]{64}$/.test(blake3Hex) || !/^[0-9a-f]{64}$/.test(sha256Hex)) throw new AgentError("a manifest names malformed digests");
  const statement: JsonValue = {
    _type: STATEMENT_TYPE,
    subject: [{ name: `blake3:${blake3Hex}`, digest: { blake3: blake3Hex, sha256: sha256Hex } }],
    predicateType: PREDICATE_TYPE,
    // Every field with no presence printed even at its default, as Python's MessageToDict(always_print_fields_with_no_presence).
    predicate: toJson(ArtifactManifestSchema, manifest, { useProtoFieldName: true, alwaysEmitImplicit: true }),
  };
  return new TextEncoder().encode(canonicalJson(statement));
}

/** The manifest signed by `signer`'s session key. */
export function signedManifest(manifest: ArtifactManifest, sha256Hex: string, signer: SessionSigner): SignedEnvelope {
  return signer.sign(statementFor(manifest, sha256Hex), MANIFEST_PAYLOAD_TYPE);
}

function uploadRequest(payload: UploadRequest["payload"]): UploadRequest {
  return create(UploadRequestSchema, { payload });
}

/**
 * Hashes `content`, signs its manifest as `signer` and uploads both (idempotent: the same content
 * again is answered as stored). Returns the reference a submission or Evidence names.
 */
export async function putArtifact(
  artifacts: Client<typeof ArtifactService>,
  signer: SessionSigner,
  content: Uint8Array,
  mediaType: string,
  origin: Origin,
): Promise<ArtifactRef> {
  const hashes = hashContent(content);
  const manifest = signedManifest(buildManifest(hashes, mediaType, signer.identityId, origin), hashes.sha256Hex, signer);
  const requests = new AsyncQueue<UploadRequest>();
  requests.push(uploadRequest({ case: "header", value: { $typeName: "missionweave.v1.UploadHeader", digest: digestOf(hashes), manifest } }));
  // The bytes go only once the server's headers ask for them (kernel/uploads.py): a refusal on the
  // header never races bytes still being written.
  const call = artifacts.upload(requests, {
    timeoutMs: 300_000,
    onHeader: (headers) => {
      if (headers.get("mwp-upload") === "send") {
        for (let offset = 0; offset < content.length; offset += CHUNK_BYTES) {
          const data = content.subarray(offset, offset + CHUNK_BYTES);
          requests.push(uploadRequest({ case: "chunk", value: { $typeName: "missionweave.v1.UploadChunk", offset: BigInt(offset), data } }));
        }
      }
      requests.end();
    },
  });
  try {
    await call;
  } finally {
    requests.end();
  }
  return create(ArtifactRefSchema, { digest: digestOf(hashes), mediaType });
}

/** The bytes of an Artifact, verified against its BLAKE3 digest and size (MW-13.1-05). */
export async function downloadArtifact(artifacts: Client<typeof ArtifactService>, digest: Digest): Promise<Uint8Array> {
  const pieces: Uint8Array[] = [];
  for await (const piece of artifacts.download(create(DownloadRequestSchema, { digest }), { timeoutMs: 300_000 })) pieces.push(piece.data);
  const data = Buffer.concat(pieces);
  if (toHex(blake3Digest(data)) !== digest.hex || (digest.sizeBytes !== 0n && BigInt(data.length) !== digest.sizeBytes)) {
    throw new NotVerified(`the bytes received for blake3:${digest.hex} do not hash to it`);
  }
  return new Uint8Array(data);
}
