/**
 * A slot's inputs (missionweave/sdk/slot_artifacts.py `SlotArtifactDesk._inputs`, docs/sdk.md
 * "Inputs and outputs"): the contract's input Artifacts, then the Artifacts of every WorkItem it
 * depends on, read through `AuthorityService.GetWorkItem` as the agent.
 * @module
 */
import { create } from "@bufbuild/protobuf";
import type { Agent } from "./agent.js";
import { GetWorkItemRequestSchema } from "./gen/missionweave/v1/authority_service_pb.js";
import type { WorkContract } from "./gen/missionweave/v1/work_pb.js";
import type { SlotInput } from "./slot.js";

const CALL_TIMEOUT_MS = 10_000;

/**
 * The inputs of `contract`'s work in `groupId`: each input given by content (named as in the
 * contract), then the Artifacts of each upstream WorkItem, once per WorkItem: those named by an
 * input's `fromWorkItemId` go by that input's name, the other dependencies by their WorkItem id.
 * An upstream WorkItem the agent may not read (it joined after that WorkItem was created, D124)
 * contributes nothing; the handler sees what it may read.
 */
export async function slotInputs(agent: Agent, groupId: string, contract: WorkContract): Promise<SlotInput[]> {
  const inputs: SlotInput[] = [];
  const upstream = new Map<string, string>(); // WorkItem id -> the name its Artifacts go by
  for (const given of contract.inputs) {
    if (given.artifact !== undefined) inputs.push({ name: given.name, ref: given.artifact, fromWorkItemId: "" });
    else if (given.fromWorkItemId && !upstream.has(given.fromWorkItemId)) upstream.set(given.fromWorkItemId, given.name);
  }
  for (const dependency of contract.dependsOnWorkItemIds) if (!upstream.has(dependency)) upstream.set(dependency, dependency);
  for (const [workItemId, name] of upstream) {
    let read;
    try {
      read = await agent.mesh.authority.getWorkItem(create(GetWorkItemRequestSchema, { groupId, workItemId }), { timeoutMs: CALL_TIMEOUT_MS });
    } catch (err) {
      agent.log(`${groupId}/${workItemId}: its Artifacts are not readable here: ${(err as Error).message}`);
      continue;
    }
    for (const ref of read.workItem?.artifacts ?? []) inputs.push({ name, ref, fromWorkItemId: workItemId });
  }
  return inputs;
}
