/**
 * The handler's side of the Worker runtime (missionweave/sdk/slot.py): the {@link Slot} a handler gets
 * (its work and nothing of any other slot) and the outcomes it returns: {@link submitted} (a
 * WorkResult: Evidence, summary, extra Artifacts), {@link paused} (a checkpoint after a preemption
 * request), {@link blocked} (a question for the Coordinator and a checkpoint) or {@link failed}.
 * @module
 */
import { create } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { blake3 } from "@noble/hashes/blake3.js";
import { AgentError, InputNotVerified, NotVerified } from "./errors.js";
import type { ArtifactRef, ResourceVector } from "./gen/missionweave/v1/common_pb.js";
import {
  BlockerKind,
  CheckpointSchema,
  EvidenceMethod,
  EvidenceResult,
  EvidenceSchema,
  EvidenceSubjectSchema,
  WorkFailureKind,
  WorkReportProgressSchema,
  type AcceptanceCriterion,
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

/**
 * The handler cannot go on without an answer (MW-10.2-T09, MW-11.4-04): the runtime posts `question`
 * in the WorkItem's Conversation, records `work.block` with `checkpoint` and one blocker citing that
 * Message, and returns the slot. Once the Coordinator unblocks, the WorkItem is placed again and the
 * handler runs from the checkpoint with the resolution in `slot.unblockedWith`.
 */
export interface Blocked {
  readonly outcome: "blocked";
  /** The question, posted as a Message of the WorkItem's Conversation. */
  readonly question: string;
  /** Where to go on from once unblocked. */
  readonly checkpoint: Checkpoint;
  /** The blocker's kind (default INFORMATION). */
  readonly kind: BlockerKind;
  /** The resolution required to continue. */
  readonly requiredResolution: string;
}

/** What a handler returns. */
export type Outcome = WorkResult | Paused | Failed | Blocked;

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

/**
 * A block on `question` at checkpoint `checkpointId` (`completedOperationIds`: side effects done):
 * resumed from it, with the Coordinator's resolution in `slot.unblockedWith`, once unblocked.
 */
export function blocked(
  question: string,
  checkpointId: string,
  options: { kind?: BlockerKind; requiredResolution?: string; completedOperationIds?: readonly string[] } = {},
): Blocked {
  return {
    outcome: "blocked",
    question,
    checkpoint: create(CheckpointSchema, { checkpointId, completedOperationIds: [...(options.completedOperationIds ?? [])] }),
    kind: options.kind ?? BlockerKind.INFORMATION,
    requiredResolution: options.requiredResolution ?? "an answer to the question in the WorkItem's Conversation",
  };
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

/** One input of a WorkItem: a contract input, or an Artifact of a WorkItem it depends on. */
export interface SlotInput {
  /** The contract input's name, or the upstream WorkItem's id. */
  readonly name: string;
  /** The Artifact. */
  readonly ref: ArtifactRef;
  /** The upstream WorkItem that produced it ("" for a contract input given by content). */
  readonly fromWorkItemId: string;
}

/** What the runtime gives a {@link Slot}: the placement, and what it looked up for it. */
export interface SlotInit {
  /** The scheduler's slot. */
  readonly slotId: string;
  /** The Mission's Group. */
  readonly groupId: string;
  /** The WorkItem. */
  readonly workItemId: string;
  /** The ownership this work runs under. */
  readonly ownershipEpoch: bigint;
  /** This start's execution lease. */
  readonly leaseId: string;
  /** The WorkContract. */
  readonly contract: WorkContract;
  /** The checkpoint to resume from ("" for a first start). */
  readonly resumeFromCheckpointId: string;
  /** The manifest fields of what it stores. */
  readonly origin: Origin;
  /** Its inputs (worker-inputs.ts `slotInputs`). */
  readonly inputs?: readonly SlotInput[];
  /** The resolution of the latest unblock under this ownership, and that event's sequence. */
  readonly unblocked?: { readonly resolution: string; readonly sequence: bigint };
}

/** How {@link Slot.put} stores one output. */
export interface PutOptions {
  /** What it was derived from, its provenance edges (default: every input of the slot). */
  readonly sources?: readonly ArtifactRef[];
  /** Whether it goes into the submission (default true; false for Evidence such as a test log). */
  readonly deliverable?: boolean;
}

/** One slot's work: everything a handler may use. */
export class Slot {
  /** Resolves when the scheduler or the Coordinator asks this work to pause (stop at a safe point, return `paused`). */
  readonly preemptionRequested: Promise<void>;
  /** Whether a preemption was asked. */
  preemptionAsked = false;
  /** The scheduler's slot. */
  readonly slotId: string;
  /** The Mission's Group. */
  readonly groupId: string;
  /** The WorkItem. */
  readonly workItemId: string;
  /** The ownership this work runs under (commands under an older one are refused). */
  readonly ownershipEpoch: bigint;
  /** This start's execution lease. */
  readonly leaseId: string;
  /** The WorkContract (acceptance criteria, inputs, deliverables). */
  readonly contract: WorkContract;
  /** The checkpoint to resume from ("" for a first start). */
  readonly resumeFromCheckpointId: string;
  /**
   * The contract's input Artifacts and those of every WorkItem it depends on (`dependsOnWorkItemIds`
   * and inputs given `fromWorkItemId`), in that order; an upstream WorkItem this agent may not read
   * contributes nothing.
   */
  readonly inputs: readonly SlotInput[];
  /**
   * How the Coordinator resolved this work's latest block (`work.unblock`'s resolution) when this
   * start follows one under the same ownership; "" otherwise. A handler that returned `blocked`
   * goes on from its checkpoint with this answer.
   */
  readonly unblockedWith: string;
  /** The sequence of that `work.unblocked` event (0n: none): tells one unblock from another. */
  readonly unblockedAt: bigint;
  private askPreemption!: () => void;
  private readonly outputs = new Map<string, ArtifactRef>();
  private readonly origin: Origin;

  constructor(
    private readonly agent: Agent,
    init: SlotInit,
  ) {
    this.slotId = init.slotId;
    this.groupId = init.groupId;
    this.workItemId = init.workItemId;
    this.ownershipEpoch = init.ownershipEpoch;
    this.leaseId = init.leaseId;
    this.contract = init.contract;
    this.resumeFromCheckpointId = init.resumeFromCheckpointId;
    this.origin = init.origin;
    this.inputs = [...(init.inputs ?? [])];
    this.unblockedWith = init.unblocked?.resolution ?? "";
    this.unblockedAt = init.unblocked?.sequence ?? 0n;
    this.preemptionRequested = new Promise((resolve) => (this.askPreemption = resolve));
  }

  /** @internal The runtime tells the handler to pause. */
  requestPreemption(): void {
    this.preemptionAsked = true;
    this.askPreemption();
  }

  /**
   * The bytes of an input (or of any Artifact the agent may read), downloaded and hashed again:
   * bytes that do not hash to its BLAKE3 digest are refused ({@link InputNotVerified}, MW-13.1-05).
   */
  async read(input: SlotInput | ArtifactRef): Promise<Uint8Array> {
    const ref = "ref" in input ? input.ref : input;
    if (ref.digest === undefined) throw new AgentError("the reference names no digest");
    try {
      return await downloadArtifact(this.agent.mesh.artifacts, ref.digest);
    } catch (err) {
      if (err instanceof NotVerified) throw new InputNotVerified(err.message);
      throw err;
    }
  }

  /**
   * Stores `content` as an Artifact of this WorkItem with a manifest signed under this lease naming
   * every input as a source unless `options.sources` names others (so provenance walks back through
   * the DAG); a deliverable goes into the submission.
   */
  async put(content: Uint8Array | string, mediaType = "application/octet-stream", options: PutOptions = {}): Promise<ArtifactRef> {
    const bytes = typeof content === "string" ? new TextEncoder().encode(content) : content;
    const derived = options.sources ?? this.inputs.map((input) => input.ref);
    const sources = [...new Map(derived.flatMap((r) => (r.digest !== undefined ? [[r.digest.hex, r.digest] as const] : []))).values()];
    const ref = await putArtifact(this.agent.mesh.artifacts, this.agent.signer, bytes, mediaType, { ...this.origin, sources });
    if (options.deliverable ?? true) this.outputs.set(ref.digest?.hex ?? "", ref);
    return ref;
  }

  /** The deliverables stored so far, each once. */
  get artifacts(): ArtifactRef[] {
    return [...this.outputs.values()];
  }

  /**
   * The Evidence for one acceptance criterion of this slot's contract (MW-13.2-02), as the Python
   * SDK's `Slot.evidence`: id `ev-<work item>-<criterion id>` (a retried submission repeats it), about
   * this WorkItem and `artifact` when given, by the first method the criterion requires (TEST when it
   * names none), PASS or FAIL, produced now.
   */
  evidence(criterion: AcceptanceCriterion, result: { passed: boolean; summary: string; artifact?: ArtifactRef }): Evidence {
    return create(EvidenceSchema, {
      evidenceId: `ev-${this.workItemId}-${criterion.criterionId}`,
      subject: create(EvidenceSubjectSchema, { workItemId: this.workItemId, artifact: result.artifact }),
      criterionId: criterion.criterionId,
      criterion: criterion.description,
      method: criterion.requiredEvidenceMethods[0] ?? EvidenceMethod.TEST,
      result: result.passed ? EvidenceResult.PASS : EvidenceResult.FAIL,
      producedAt: timestampNow(),
      summary: result.summary,
    });
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
