/**
 * The handler's side of the Worker runtime (missionweave/sdk/slot.py): the {@link Slot} a handler gets
 * (its work and nothing of any other slot) and the outcomes it returns: {@link submitted} (a
 * WorkResult: Evidence, summary, extra Artifacts), {@link paused} (a checkpoint after a preemption
 * request) or {@link failed}.
 * @module
 */
import { create } from "@bufbuild/protobuf";
import { blake3 } from "@noble/hashes/blake3.js";
import { AgentError } from "./errors.js";
import type { ArtifactRef, ResourceVector } from "./gen/missionweave/v1/common_pb.js";
import {
  CheckpointSchema,
  WorkFailureKind,
  WorkReportProgressSchema,
  type Checkpoint,
  type ProgressReport,
  type Evidence,
  type WorkContract,
} from "./gen/missionweave/v1/work_pb.js";
import type { Agent } from "./agent.js";
import { downloadArtifact, putArtifact, type Origin } from "./artifacts.js";

/** The handler's result when the work is done: submitted with its Artifacts and Evidence. */
export interface WorkResult {
  readonly outcome: "submitted";
  /** One Evidence per acceptance criterion (MW-13.2-02). */
  readonly evidence: readonly Evidence[];
  /** A summary for the reviewers. */
  readonly summary: string;
  /** Artifacts besides the ones stored with `slot.put` (which are handed in anyway). */
  readonly artifacts: readonly ArtifactRef[];
}

/** The handler stopped at a safe point after `slot.preemptionRequested`: resume later from `checkpoint`. */
export interface Paused {
  readonly outcome: "paused";
  readonly checkpoint: Checkpoint;
}

/** The work failed: recorded with `work.fail`. */
export interface Failed {
  readonly outcome: "failed";
  /** Permanent, retries exhausted, budget exhausted. */
  readonly kind: WorkFailureKind;
  /** Why, for the Coordinator. */
  readonly reason: string;
}

/** What a handler returns. */
export type Outcome = WorkResult | Paused | Failed;

/** What an agent author writes: `async (slot) => submitted(...)`. */
export type Handler = (slot: Slot) => Promise<Outcome>;

/** A submission: `evidence` per acceptance criterion, `summary`, extra `artifacts`. */
export function submitted(evidence: readonly Evidence[], summary = "", artifacts: readonly ArtifactRef[] = []): WorkResult {
  return { outcome: "submitted", evidence, summary, artifacts };
}

/** A pause at a safe point, resumed later from checkpoint `checkpointId` (`completedOperationIds`: side effects done, MW-16-13). */
export function paused(checkpointId: string, completedOperationIds: readonly string[] = []): Paused {
  return { outcome: "paused", checkpoint: create(CheckpointSchema, { checkpointId, completedOperationIds: [...completedOperationIds] }) };
}

/** A failure of `kind` with a reason. */
export function failed(reason: string, kind: WorkFailureKind = WorkFailureKind.PERMANENT): Failed {
  return { outcome: "failed", kind, reason };
}

/**
 * The stable key of one external side effect (MW-16-13), as idempotency.py `attempt_key`: `mwk1_` and
 * the first 16 bytes of BLAKE3 over the length-prefixed (4-byte big-endian) UTF-8 of the four parts.
 */
export function attemptKey(missionId: string, workItemId: string, ownershipEpoch: bigint, operationId: string): string {
  if (ownershipEpoch < 1n) throw new AgentError("ownership epoch starts at 1");
  const hash = blake3.create();
  for (const part of [missionId, workItemId, ownershipEpoch.toString(), operationId]) {
    const encoded = new TextEncoder().encode(part);
    const length = new Uint8Array(4);
    new DataView(length.buffer).setUint32(0, encoded.length);
    hash.update(length);
    hash.update(encoded);
  }
  return `mwk1_${Buffer.from(hash.digest().subarray(0, 16)).toString("hex")}`;
}

/** One slot's work: everything a handler may use. */
export class Slot {
  /** Resolves when the scheduler or the Coordinator asks this work to pause (stop at a safe point, return `paused`). */
  readonly preemptionRequested: Promise<void>;
  /** Whether a preemption was asked. */
  preemptionAsked = false;
  private askPreemption!: () => void;
  private readonly outputs = new Map<string, ArtifactRef>();

  constructor(
    private readonly agent: Agent,
    /** The scheduler's slot. */
    readonly slotId: string,
    /** The Mission's Group. */
    readonly groupId: string,
    /** The WorkItem. */
    readonly workItemId: string,
    /** The ownership this work runs under (commands under an older one are refused). */
    readonly ownershipEpoch: bigint,
    /** This start's execution lease. */
    readonly leaseId: string,
    /** The WorkContract (acceptance criteria, inputs, deliverables). */
    readonly contract: WorkContract,
    /** The checkpoint to resume from ("" for a first start). */
    readonly resumeFromCheckpointId: string,
    private readonly origin: Origin,
  ) {
    this.preemptionRequested = new Promise((resolve) => (this.askPreemption = resolve));
  }

  /** @internal The runtime tells the handler to pause. */
  requestPreemption(): void {
    this.preemptionAsked = true;
    this.askPreemption();
  }

  /** The contract's input Artifacts. */
  get inputs(): ArtifactRef[] {
    return this.contract.inputs.flatMap((input) => (input.artifact !== undefined ? [input.artifact] : []));
  }

  /** The bytes of an input (or any Artifact the agent may read), verified against its BLAKE3 digest. */
  async read(ref: ArtifactRef): Promise<Uint8Array> {
    if (ref.digest === undefined) throw new AgentError("the reference names no digest");
    return downloadArtifact(this.agent.mesh.artifacts, ref.digest);
  }

  /** Stores `content` as a deliverable of this WorkItem, with a manifest signed under this lease; it goes into the submission. */
  async put(content: Uint8Array | string, mediaType = "application/octet-stream"): Promise<ArtifactRef> {
    const bytes = typeof content === "string" ? new TextEncoder().encode(content) : content;
    const sources = this.inputs.flatMap((r) => (r.digest !== undefined ? [r.digest] : []));
    const ref = await putArtifact(this.agent.mesh.artifacts, this.agent.signer, bytes, mediaType, { ...this.origin, sources });
    this.outputs.set(ref.digest?.hex ?? "", ref);
    return ref;
  }

  /** The deliverables stored so far, each once. */
  get artifacts(): ArtifactRef[] {
    return [...this.outputs.values()];
  }

  /** Structured progress under this slot's lease (MW-11.4-01). */
  async reportProgress(report: ProgressReport, usageDelta?: ResourceVector): Promise<void> {
    const body = create(WorkReportProgressSchema, {
      workItemId: this.workItemId,
      leaseId: this.leaseId,
      ownershipEpoch: this.ownershipEpoch,
      report,
      usageDelta,
    });
    await this.agent.execute(this.groupId, { case: "workReportProgress", value: body });
  }

  /** The stable key of an external side effect of this work under this ownership (MW-16-13). */
  idempotencyKey(operationId: string): string {
    return attemptKey(this.groupId, this.workItemId, this.ownershipEpoch, operationId);
  }
}
