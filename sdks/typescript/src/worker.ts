/**
 * The Worker runtime (docs/sdk.md "A Worker runtime", missionweave/sdk/worker.py): follows its
 * Groups; answers each offer naming it through its scheduler (`Admit`, then `work.accept_offer` with
 * the disclosed schedule or `work.decline_offer` with the structured reason); one placement loop
 * (`NextSlot`) starts placed work (`work.start`), runs the handler with its {@link Slot}, renews the
 * lease at half its term, answers preemption requests with the handler's checkpoint, submits with
 * Artifacts and Evidence (`work.submit`), blocks on a question (`work.block`, worker-blocks.ts) or
 * fails (`work.fail`), and releases the slot. Each slot's inputs include its dependencies' Artifacts
 * (worker-inputs.ts); accepted, queued work has its schedule disclosed again when it moves
 * (worker-disclosures.ts). Not (yet) in this SDK: the offline buffer.
 * @module
 */
import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { Agent } from "./agent.js";
import { Backoff, sleep, within } from "./backoff.js";
import { lastSequence } from "./commands.js";
import { CommandRejected } from "./errors.js";
import { GetWorkItemRequestSchema } from "./gen/missionweave/v1/authority_service_pb.js";
import type { CommandResult } from "./gen/missionweave/v1/command_pb.js";
import type { Event } from "./gen/missionweave/v1/event_pb.js";
import {
  AdmissionDecision,
  AdmitRequestSchema,
  NextSlotRequestSchema,
  ReleaseSlotRequestSchema,
  SlotReleaseReason,
  type SlotAssignment,
} from "./gen/missionweave/v1/scheduling_service_pb.js";
import {
  PreemptionReason,
  WorkAcceptOfferSchema,
  WorkCheckpointSchema,
  WorkContractSchema,
  WorkDeclineOfferSchema,
  WorkFailSchema,
  WorkRenewLeaseSchema,
  WorkRequestPreemptionSchema,
  WorkStartSchema,
  WorkSubmitSchema,
  type ExecutionLease,
  type WorkContract,
  type WorkOffered,
} from "./gen/missionweave/v1/work_pb.js";
import { Slot, type Handler, type Outcome } from "./slot.js";
import { Blocks } from "./worker-blocks.js";
import { DISCLOSURE_PERIOD_MS, Disclosures } from "./worker-disclosures.js";
import { slotInputs } from "./worker-inputs.js";

const NEXT_SLOT_WAIT_S = 5n;
const CALL_TIMEOUT_MS = 10_000;

type Key = string;
const keyOf = (groupId: string, workItemId: string): Key => `${groupId}\u0000${workItemId}`;

/** Options of a {@link WorkerRuntime}. */
export interface WorkerOptions {
  /** Told after each placement ended: how it was recorded in the Group ("failed" also when a command was refused). */
  readonly onFinished?: (slot: Slot, outcome: Outcome["outcome"], error?: unknown) => void;
  /** How often the schedule of accepted, not started work is looked at again (default {@link DISCLOSURE_PERIOD_MS}). */
  readonly disclosurePeriodMs?: number;
}

/** Runs `handler` for every WorkItem this Worker is offered, admits and is placed, through its agent. */
export class WorkerRuntime {
  /** (Group, WorkItem) of every submission, in order. */
  readonly completed: Array<[groupId: string, workItemId: string]> = [];
  private readonly contracts = new Map<Key, WorkContract>();
  private readonly missions = new Map<string, string>();
  private readonly running = new Map<Key, Slot>();
  private readonly preemptions = new Map<Key, string>();
  private readonly early = new Map<Key, { leaseId: string; requestId: string }>();
  private readonly asked = new Set<Key>();
  private readonly tasks = new Set<Promise<unknown>>();
  private readonly abort = new AbortController();
  private starts = 0;
  private readonly blocks: Blocks;
  private readonly disclosures: Disclosures;

  constructor(
    /** The Worker's agent (a new session per runtime start: `newSession: true`, D213). */
    readonly agent: Agent,
    private readonly handler: Handler,
    private readonly options: WorkerOptions = {},
  ) {
    this.blocks = new Blocks(agent);
    this.disclosures = new Disclosures(agent, options.disclosurePeriodMs ?? DISCLOSURE_PERIOD_MS);
  }

  /**
   * Subscribes to `groupIds` and starts the placement and preemption loops. With `subscribe: false`
   * the caller follows the Groups itself and passes each event to {@link WorkerRuntime.handleEvent}.
   */
  serve(groupIds: readonly string[], options: { subscribe?: boolean } = {}): void {
    if (options.subscribe ?? true) {
      for (const groupId of groupIds) this.agent.subscribe(groupId, (event) => this.handleEvent(groupId, event));
    }
    this.spawn(this.place());
    this.spawn(this.watchPreemptions());
    this.spawn(this.disclosures.run(this.abort.signal));
  }

  /** Stops taking work and waits (bounded) for running handlers to end. */
  async close(): Promise<void> {
    this.abort.abort();
    await within(Promise.allSettled([...this.tasks]), 15_000);
  }

  private spawn(work: Promise<unknown>): void {
    const task = work.catch((err: unknown) => this.agent.log(`worker: ${(err as Error).message}`)).finally(() => this.tasks.delete(task));
    this.tasks.add(task);
  }

  private get closing(): boolean {
    return this.abort.signal.aborted;
  }

  /** What the runtime learns from an event of a served Group: contracts, offers naming it, preemption requests, unblocks. */
  handleEvent(groupId: string, event: Event): void {
    this.blocks.observe(groupId, event);
    const payload = event.payload;
    switch (payload.case) {
      case "missionCreated":
        this.missions.set(groupId, payload.value.missionId);
        return;
      case "workAuthorized":
        if (payload.value.contract !== undefined) this.contracts.set(keyOf(groupId, payload.value.workItemId), payload.value.contract);
        return;
      case "workOffered": {
        const offered = payload.value;
        if (offered.amendedContract !== undefined) this.contracts.set(keyOf(groupId, offered.workItemId), offered.amendedContract);
        if (offered.candidateIds.includes(this.agent.identityId) && !this.closing) this.spawn(this.answer(groupId, offered, event.sequence));
        return;
      }
      case "workPreemptionRequested": {
        const request = payload.value;
        const key = keyOf(groupId, request.workItemId);
        const slot = this.running.get(key);
        if (slot !== undefined && slot.leaseId === request.leaseId) {
          this.preemptions.set(key, request.preemptionRequestId);
          slot.requestPreemption();
        } else if (slot === undefined) {
          this.early.set(key, { leaseId: request.leaseId, requestId: request.preemptionRequestId });
        }
        return;
      }
      default:
        return;
    }
  }

  /** Admission control first; then accept with the disclosed schedule, or decline with its reason. */
  private async answer(groupId: string, offered: WorkOffered, sequence: bigint): Promise<void> {
    const contract = this.contracts.get(keyOf(groupId, offered.workItemId)) ?? create(WorkContractSchema, {});
    const admit = await this.agent.mesh.scheduling.admit(
      create(AdmitRequestSchema, {
        groupId,
        workItemId: offered.workItemId,
        offerId: offered.offerId,
        contract,
        offerExpiresAt: offered.expiresAt,
        offeredAtSequence: sequence,
      }),
      { timeoutMs: CALL_TIMEOUT_MS },
    );
    try {
      if (admit.decision === AdmissionDecision.ACCEPT) {
        const body = create(WorkAcceptOfferSchema, {
          workItemId: offered.workItemId,
          offerId: offered.offerId,
          contractRevision: offered.contractRevision,
          schedule: admit.schedule,
        });
        const accepted = await this.agent.execute(groupId, { case: "workAcceptOffer", value: body });
        for (const e of this.events(accepted)) {
          if (e.payload.case === "workOfferAccepted" && e.payload.value.ownership !== undefined) {
            this.disclosures.waitingFor(groupId, offered.workItemId, e.payload.value.ownership.ownershipEpoch, admit.schedule);
          }
        }
      } else {
        const body = create(WorkDeclineOfferSchema, { workItemId: offered.workItemId, offerId: offered.offerId, decline: admit.decline });
        await this.agent.execute(groupId, { case: "workDeclineOffer", value: body });
      }
    } catch (err) {
      if (!(err instanceof CommandRejected)) throw err; // taken by another candidate, expired, withdrawn
      this.agent.log(`${groupId}: the offer ${offered.offerId} was not answered: ${err.message}`);
    }
  }

  private async place(): Promise<void> {
    const backoff = new Backoff(500, 10_000);
    while (!this.closing) {
      let answer;
      try {
        answer = await this.agent.mesh.scheduling.nextSlot(create(NextSlotRequestSchema, { wait: { seconds: NEXT_SLOT_WAIT_S } }), {
          timeoutMs: Number(NEXT_SLOT_WAIT_S) * 1000 + CALL_TIMEOUT_MS,
          signal: this.abort.signal,
        });
        backoff.reset();
      } catch (err) {
        if (this.closing) return;
        this.agent.log(`worker: no placement: ${(err as Error).message}`);
        await sleep(backoff.next(), this.abort.signal);
        continue;
      }
      if (answer.assignment !== undefined) await this.run(answer.assignment);
    }
  }

  /** The scheduler asks a running slot to pause (only when nothing can be placed for want of a slot). */
  private async watchPreemptions(): Promise<void> {
    const backoff = new Backoff(500, 10_000);
    while (!this.closing) {
      let answer;
      try {
        answer = await this.agent.mesh.scheduling.nextSlot(
          create(NextSlotRequestSchema, { preemptionsOnly: true, wait: { seconds: NEXT_SLOT_WAIT_S } }),
          { timeoutMs: Number(NEXT_SLOT_WAIT_S) * 1000 + CALL_TIMEOUT_MS, signal: this.abort.signal },
        );
        backoff.reset();
      } catch {
        if (this.closing) return;
        await sleep(backoff.next(), this.abort.signal);
        continue;
      }
      for (const ask of answer.preemptions) {
        const key = keyOf(ask.groupId, ask.workItemId);
        const slot = this.running.get(key);
        if (slot === undefined) this.asked.add(key);
        else if (slot.slotId === ask.slotId) await this.preempt(slot, ask.reason);
      }
    }
  }

  /** Records the scheduler's request in the slot's Group (the audit trail), then tells the handler. */
  private async preempt(slot: Slot, reason: PreemptionReason): Promise<void> {
    const requestId = `pre-${slot.leaseId}`;
    const body = create(WorkRequestPreemptionSchema, {
      workItemId: slot.workItemId,
      preemptionRequestId: requestId,
      leaseId: slot.leaseId,
      reason,
      ownershipEpoch: slot.ownershipEpoch,
    });
    try {
      await this.agent.execute(slot.groupId, { case: "workRequestPreemption", value: body });
    } catch (err) {
      if (err instanceof CommandRejected) return; // the work ended meanwhile
      throw err;
    }
    this.preemptions.set(keyOf(slot.groupId, slot.workItemId), requestId);
    slot.requestPreemption();
  }

  private async run(a: SlotAssignment): Promise<void> {
    // New on every start, across processes too: the session epoch tells a restarted runtime's apart.
    const leaseId = `lease-${a.workItemId}-${a.ownershipEpoch}-s${this.agent.signer.sessionEpoch}-${++this.starts}`;
    const key = keyOf(a.groupId, a.workItemId);
    let reason = SlotReleaseReason.FAILED;
    let requeue = false;
    let endedAt = 0n;
    let renewing: AbortController | undefined;
    let slot: Slot | undefined;
    try {
      const start = create(WorkStartSchema, {
        workItemId: a.workItemId,
        ownershipEpoch: a.ownershipEpoch,
        leaseId,
        resumeFromCheckpointId: a.resumeFromCheckpointId,
      });
      const started = await this.agent.execute(a.groupId, { case: "workStart", value: start });
      const lease = this.events(started).flatMap((e) => (e.payload.case === "workStarted" ? [e.payload.value.lease] : []))[0];
      const contract = await this.contract(a.groupId, a.workItemId);
      const origin = {
        groupId: a.groupId,
        missionId: await this.missionOf(a.groupId),
        workItemId: a.workItemId,
        leaseId,
        ownershipEpoch: a.ownershipEpoch,
      };
      slot = new Slot(this.agent, {
        slotId: a.slotId,
        groupId: a.groupId,
        workItemId: a.workItemId,
        ownershipEpoch: a.ownershipEpoch,
        leaseId,
        contract,
        resumeFromCheckpointId: a.resumeFromCheckpointId,
        origin,
        inputs: await slotInputs(this.agent, a.groupId, contract),
        unblocked: this.blocks.unblocked(a.groupId, a.workItemId),
      });
      this.running.set(key, slot);
      this.disclosures.started(a.groupId, a.workItemId);
      this.preemptions.delete(key); // a request for an earlier lease is answered already
      const early = this.early.get(key);
      this.early.delete(key);
      if (early !== undefined && early.leaseId === leaseId) {
        this.preemptions.set(key, early.requestId);
        slot.requestPreemption();
      }
      if (this.asked.delete(key)) this.spawn(this.preempt(slot, PreemptionReason.PRIORITY));
      if (lease !== undefined) {
        renewing = new AbortController();
        this.spawn(this.renew(slot, lease, renewing.signal));
      }
      const outcome = await this.handler(slot);
      [reason, requeue, endedAt] = await this.finish(slot, outcome);
      this.options.onFinished?.(slot, outcome.outcome);
    } catch (err) {
      this.agent.log(`${a.groupId}/${a.workItemId}: ${(err as Error).message}`);
      if (slot !== undefined) this.options.onFinished?.(slot, "failed", err);
    } finally {
      renewing?.abort();
      this.running.delete(key);
      const release = create(ReleaseSlotRequestSchema, { slotId: a.slotId, workItemId: a.workItemId, reason, requeue, endedAtSequence: endedAt });
      try {
        await this.agent.mesh.scheduling.releaseSlot(release, { timeoutMs: CALL_TIMEOUT_MS });
      } catch (err) {
        // The scheduler freed it already (it saw the work end in the log).
        this.agent.log(`${a.groupId}/${a.workItemId}: slot ${a.slotId} was released already: ${(err as Error).message}`);
      }
    }
  }

  /** Records the handler's outcome: (release reason, requeue, the sequence of the event that ended the placement). */
  private async finish(slot: Slot, result: Outcome): Promise<[SlotReleaseReason, boolean, bigint]> {
    const key = keyOf(slot.groupId, slot.workItemId);
    const common = { workItemId: slot.workItemId, leaseId: slot.leaseId, ownershipEpoch: slot.ownershipEpoch };
    if (result.outcome === "paused") {
      const body = create(WorkCheckpointSchema, { ...common, checkpoint: result.checkpoint, preemptionRequestId: this.preemptions.get(key) ?? "" });
      this.preemptions.delete(key);
      const done = await this.agent.execute(slot.groupId, { case: "workCheckpoint", value: body });
      this.disclosures.waitingFor(slot.groupId, slot.workItemId, slot.ownershipEpoch); // disclosed again once estimated
      return [SlotReleaseReason.PREEMPTED, true, this.lastSequence(done)];
    }
    if (result.outcome === "blocked") return [SlotReleaseReason.BLOCKED, false, await this.blocks.block(slot, result)];
    if (result.outcome === "failed") {
      const body = create(WorkFailSchema, { ...common, kind: result.kind, reason: result.reason });
      const done = await this.agent.execute(slot.groupId, { case: "workFail", value: body });
      return [SlotReleaseReason.FAILED, false, this.lastSequence(done)];
    }
    const handedIn = new Map([...slot.artifacts, ...result.artifacts].map((r) => [r.digest?.hex ?? "", r]));
    const body = create(WorkSubmitSchema, {
      ...common,
      contractRevision: slot.contract.revision || 1n,
      artifacts: [...handedIn.values()],
      evidence: [...result.evidence],
      summary: result.summary,
    });
    const done = await this.agent.execute(slot.groupId, { case: "workSubmit", value: body });
    this.completed.push([slot.groupId, slot.workItemId]);
    return [SlotReleaseReason.SUBMITTED, false, this.lastSequence(done)];
  }

  /** Keeps the execution lease alive while the handler works: a renewal at half its term. */
  private async renew(slot: Slot, lease: ExecutionLease, signal: AbortSignal): Promise<void> {
    const term = lease.expiresAt && lease.startedAt ? timestampDate(lease.expiresAt).getTime() - timestampDate(lease.startedAt).getTime() : 60_000;
    const period = Math.max(term / 2, 1_000);
    while (!signal.aborted) {
      await sleep(period, signal);
      if (signal.aborted) return;
      const body = create(WorkRenewLeaseSchema, { workItemId: slot.workItemId, leaseId: slot.leaseId, ownershipEpoch: slot.ownershipEpoch });
      try {
        await this.agent.execute(slot.groupId, { case: "workRenewLease", value: body });
      } catch (err) {
        this.agent.log(`${slot.groupId}/${slot.workItemId}: the lease could not be renewed: ${(err as Error).message}`);
        if (err instanceof CommandRejected) return; // ended, fenced or expired: the result will be refused too
      }
    }
  }

  /** The contract of work the subscription did not replay (a restarted runtime resumes from its cursor). */
  private async contract(groupId: string, workItemId: string): Promise<WorkContract> {
    const known = this.contracts.get(keyOf(groupId, workItemId));
    if (known !== undefined) return known;
    const read = await this.agent.mesh.authority.getWorkItem(create(GetWorkItemRequestSchema, { groupId, workItemId }), { timeoutMs: CALL_TIMEOUT_MS });
    const contract = read.workItem?.contract ?? create(WorkContractSchema, {});
    this.contracts.set(keyOf(groupId, workItemId), contract);
    return contract;
  }

  private async missionOf(groupId: string): Promise<string> {
    let mission = this.missions.get(groupId);
    if (mission === undefined) {
      mission = (await this.agent.mesh.groupState(groupId)).mission?.missionId ?? "";
      this.missions.set(groupId, mission);
    }
    return mission;
  }

  private events(result: CommandResult): Event[] {
    return result.events.map((e) => this.agent.verifier().event(e));
  }

  private lastSequence(result: CommandResult): bigint {
    return lastSequence(this.events(result));
  }
}

