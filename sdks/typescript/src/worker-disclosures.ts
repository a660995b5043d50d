/**
 * Schedule disclosures of accepted, not yet started work (missionweave/sdk/worker.py `_disclose`,
 * MW-11.2-01): every period the scheduler is asked (`DiscloseSchedule`) for the current estimate of
 * each such WorkItem, and `work.report_progress` (no lease: the work is queued) publishes it when it
 * is {@link material}: none published yet, another capacity status, or a start window that moved by
 * a minute or more.
 * @module
 */
import { create } from "@bufbuild/protobuf";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Agent } from "./agent.js";
import { sleep } from "./backoff.js";
import { CommandRejected } from "./errors.js";
import { DiscloseScheduleRequestSchema } from "./gen/missionweave/v1/scheduling_service_pb.js";
import {
  PlannedCheckpointSchema,
  ProgressReportSchema,
  RevisedEstimateSchema,
  ScheduleDisclosureSchema,
  WorkReportProgressSchema,
  type ScheduleDisclosure,
} from "./gen/missionweave/v1/work_pb.js";

/** How often the estimates are looked at again, by default (the Python SDK's `DISCLOSURE_PERIOD_S`). */
export const DISCLOSURE_PERIOD_MS = 5_000;
/** A start window that moved by at least this much is published (`MATERIAL_SHIFT`). */
export const MATERIAL_SHIFT_MS = 60_000;
const CALL_TIMEOUT_MS = 10_000;

/**
 * Whether a new estimate is worth publishing: none published yet (no start window), another capacity
 * status, or a start window that moved by {@link MATERIAL_SHIFT_MS} or more, either way.
 */
export function material(before: ScheduleDisclosure, now: ScheduleDisclosure): boolean {
  if (before.startWindowBegin === undefined) return true;
  if (before.capacityStatus !== now.capacityStatus) return true;
  const moved = Math.abs((now.startWindowBegin ? timestampMs(now.startWindowBegin) : 0) - timestampMs(before.startWindowBegin));
  return moved >= MATERIAL_SHIFT_MS;
}

interface Waiting {
  readonly groupId: string;
  readonly workItemId: string;
  readonly ownershipEpoch: bigint;
  last: ScheduleDisclosure;
}

/** The accepted, not started work of one Worker runtime and the schedule last published for each. */
export class Disclosures {
  private readonly waiting = new Map<string, Waiting>();

  constructor(
    private readonly agent: Agent,
    private readonly periodMs: number = DISCLOSURE_PERIOD_MS,
  ) {}

  /** Accepted with `schedule` (what the acceptance disclosed; an empty one when paused: disclosed again once estimated). */
  waitingFor(groupId: string, workItemId: string, ownershipEpoch: bigint, schedule?: ScheduleDisclosure): void {
    this.waiting.set(`${groupId}\u0000${workItemId}`, { groupId, workItemId, ownershipEpoch, last: schedule ?? create(ScheduleDisclosureSchema, {}) });
  }

  /** Started (or ended): nothing more to disclose. */
  started(groupId: string, workItemId: string): void {
    this.waiting.delete(`${groupId}\u0000${workItemId}`);
  }

  /** Looks at every waiting WorkItem once a period until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      await sleep(this.periodMs, signal);
      for (const [key, waiting] of [...this.waiting]) {
        if (signal.aborted) return;
        try {
          await this.discloseOne(key, waiting);
        } catch (err) {
          const gone = err instanceof CommandRejected || (err instanceof ConnectError && err.code === Code.NotFound);
          if (gone && this.waiting.get(key) === waiting) this.waiting.delete(key); // started, ended, reassigned
          this.agent.log(`${waiting.groupId}/${waiting.workItemId}: no schedule disclosure: ${(err as Error).message}`);
        }
      }
    }
  }

  private async discloseOne(key: string, waiting: Waiting): Promise<void> {
    const { groupId, workItemId } = waiting;
    const answer = await this.agent.mesh.scheduling.discloseSchedule(create(DiscloseScheduleRequestSchema, { groupId, workItemId }), {
      timeoutMs: CALL_TIMEOUT_MS,
    });
    const schedule = answer.schedule;
    if (schedule === undefined || this.waiting.get(key) !== waiting || !material(waiting.last, schedule)) return;
    const report = create(ProgressReportSchema, {
      phase: "queued",
      nextCheckpoint: create(PlannedCheckpointSchema, { description: "start", expectedAt: schedule.startWindowBegin }),
      revisedEstimate: create(RevisedEstimateSchema, {
        estimatedCompletion: schedule.estimatedCompletion,
        confidence: schedule.confidence,
        reason: "the Worker's schedule changed",
      }),
    });
    const body = create(WorkReportProgressSchema, { workItemId, ownershipEpoch: waiting.ownershipEpoch, report, schedule });
    await this.agent.execute(groupId, { case: "workReportProgress", value: body });
    waiting.last = schedule;
  }
}
