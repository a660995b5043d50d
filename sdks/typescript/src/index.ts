/**
 * The TypeScript SDK of the MissionWeaveProtocol, with the Python SDK's guarantees (docs/sdk.md):
 * sessions and call proofs, signed commands with idempotent retry, the verified gateway stream with
 * durable cursors, artifacts with signed provenance manifests, and a Worker runtime.
 * @packageDocumentation
 */
export { Agent, type AgentOptions } from "./agent.js";
export { Subscription, type EventHandler, type SubscribeOptions } from "./subscription.js";
export { MeshClient, membershipEpoch, type MeshOptions, type MeshTls } from "./mesh-client.js";
export { SessionSigner, SessionFile, openSession, sessionProof, type FixedProof } from "./sessions.js";
export { callProof, callProofInterceptor } from "./call-proofs.js";
export { buildCommand, bodyFromJson, lastSequence, type CommandBody, type CommandOptions } from "./commands.js";
export { AuthorityVerifier, verifiedSnapshot, type Linked } from "./event-verification.js";
export { CursorStore } from "./cursors.js";
export { pythonJson } from "./files.js";
export { putArtifact, downloadArtifact, buildManifest, statementFor, signedManifest, hashContent, type Origin } from "./artifacts.js";
export { WorkerRuntime, type WorkerOptions } from "./worker.js";
export {
  Slot,
  submitted,
  paused,
  blocked,
  failed,
  attemptKey,
  type Handler,
  type Outcome,
  type WorkResult,
  type Paused,
  type Blocked,
  type Failed,
  type SlotInput,
  type SlotInit,
  type PutOptions,
} from "./slot.js";
export { slotInputs } from "./worker-inputs.js";
export { Blocks, type Unblock } from "./worker-blocks.js";
export { Disclosures, material, DISCLOSURE_PERIOD_MS, MATERIAL_SHIFT_MS } from "./worker-disclosures.js";
export { evidenceFor } from "./conformance-script.js";
export { SigningKey, readKeyFile, pae, signEnvelope, verifyEnvelope, sessionKeyId, newId } from "./signing.js";
export {
  AgentError,
  AgentClosed,
  CommandRejected,
  GatewayError,
  NotVerified,
  InputNotVerified,
  SessionReplaced,
  SubscriptionFailed,
} from "./errors.js";
