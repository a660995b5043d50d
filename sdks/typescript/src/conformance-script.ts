/**
 * The conformance driver's scripted Worker handler: `submit` stores one text Artifact and submits
 * with one Evidence per acceptance criterion; `pause_on_preemption` waits for a preemption request,
 * pauses with a checkpoint and, resumed from it, submits as `submit` does; `derive` reads every input
 * (verified) and stores the content followed by their bytes (its manifest names them as sources);
 * `block_once` blocks on the content as its question and, unblocked, stores the resolution. Starts
 * (with the slot's inputs and unblock) and ends are reported as notification lines.
 * @module
 */
import { create } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { EvidenceMethod, EvidenceResult, EvidenceSchema, type Evidence, type WorkContract } from "./gen/missionweave/v1/work_pb.js";
import { blocked, paused, submitted, type Handler, type Outcome, type Slot } from "./slot.js";
import type { ArtifactRef } from "./gen/missionweave/v1/common_pb.js";

/** The scripted behaviours. */
export type ScriptMode = "submit" | "pause_on_preemption" | "derive" | "block_once";

/** One passing Evidence per acceptance criterion of `contract`, citing `artifacts`. */
export function evidenceFor(contract: WorkContract, producerId: string, artifacts: readonly ArtifactRef[]): Evidence[] {
  return contract.acceptanceCriteria.map((criterion, i) =>
    create(EvidenceSchema, {
      evidenceId: `ev-${i + 1}`,
      criterionId: criterion.criterionId,
      criterion: criterion.description,
      method: criterion.requiredEvidenceMethods[0] ?? EvidenceMethod.TEST,
      result: EvidenceResult.PASS,
      producerId,
      producedAt: timestampNow(),
      artifacts: [...artifacts],
      summary: `checked ${criterion.criterionId}`,
    }),
  );
}

/** The handler of `mode`, writing `work_started` / `work_finished` notifications through `notify`. */
export function scriptedHandler(mode: ScriptMode, content: string, notify: (line: Record<string, unknown>) => void): Handler {
  return async (slot) => {
    notify({
      type: "work_started",
      work_item_id: slot.workItemId,
      lease_id: slot.leaseId,
      ownership_epoch: Number(slot.ownershipEpoch),
      resume_from_checkpoint_id: slot.resumeFromCheckpointId,
      inputs: slot.inputs.map((i) => ({ name: i.name, digest: i.ref.digest?.hex ?? "", from_work_item_id: i.fromWorkItemId })),
      unblocked_with: slot.unblockedWith,
      unblocked_at: slot.unblockedAt,
    });
    if (mode === "pause_on_preemption" && !slot.resumeFromCheckpointId) {
      await slot.preemptionRequested;
      return paused(`ck-${slot.leaseId}`);
    }
    if (mode === "block_once" && !slot.unblockedWith) return blocked(content, `ck-${slot.leaseId}`);
    let output: string | Uint8Array = mode === "block_once" ? `answered: ${slot.unblockedWith}` : content;
    if (mode === "derive") {
      const read = await Promise.all(slot.inputs.map((input) => slot.read(input)));
      output = Buffer.concat([Buffer.from(content), ...read]);
    }
    const artifact = await slot.put(output, "text/plain");
    return submitted(evidenceFor(slot.contract, "", [artifact]), `did ${slot.workItemId}`);
  };
}

/** The `work_finished` notification of a placement that ended (WorkerOptions.onFinished). */
export function finishedLine(slot: Slot, outcome: Outcome["outcome"], error?: unknown): Record<string, unknown> {
  const line: Record<string, unknown> = {
    type: "work_finished",
    work_item_id: slot.workItemId,
    outcome,
    artifacts: slot.artifacts.map((r) => r.digest?.hex ?? ""),
  };
  if (error !== undefined) line["error"] = (error as Error).message;
  return line;
}
