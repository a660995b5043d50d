"""SchedulingService: each Worker's scheduler (spec 10.3, 11.1, 11.2, 11.3-10..12; docs/scheduling.md).

Every RPC is the calling Worker's own (its call proof names it): its queues, slots and decisions
are nobody else's (MW-11.1-03). Only SetPriority acts on another Worker's scheduler, for the
MissionOwner of the Group or Organization policy (MW-11.1-09), never for a Coordinator (MW-11.1-08).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from missionweave.kernel.capabilities import missing_capability
from missionweave.kernel.clock import Clock, to_timestamp
from missionweave.kernel.errors import R, Rejected
from missionweave.v1 import common_pb2, membership_pb2
from missionweave.v1 import scheduling_service_pb2 as pb
from missionweave.v1 import scheduling_service_pb2_grpc as pb_grpc
from missionweave.v1 import work_pb2 as wp
from missionweave_server.edge.callers import Access, CallAuthenticator, Caller, requires
from missionweave_server.edge.status import rejections_as_status
from missionweave_server.observability import metrics
from missionweave_server.services.scheduling.ordering import (
    AGED_RANK,
    Assignment,
    NotPermitted,
    PriorityClass,
    Source,
)
from missionweave_server.services.scheduling.projection import DIMENSIONS, WS, GroupProjection
from missionweave_server.services.scheduling.workers import Workers, WorkerScheduler

K = pb.AdmissionCheckKind
# Bounds of a Worker's commitments (MW-10.3-07): queued work per Group, and all of it per slot.
MAX_QUEUE_PER_GROUP = 64
COMMITMENTS_PER_SLOT = 4
MAX_WAIT = timedelta(seconds=30)
AGING_POLL_S = 1.0

_DECLINE = {
    K.ADMISSION_CHECK_KIND_QUEUE_CAPACITY: wp.DECLINE_REASON_CAPACITY,
    K.ADMISSION_CHECK_KIND_CONCURRENCY: wp.DECLINE_REASON_CAPACITY,
    K.ADMISSION_CHECK_KIND_CAPABILITY: wp.DECLINE_REASON_CAPABILITY,
    K.ADMISSION_CHECK_KIND_DEADLINE: wp.DECLINE_REASON_DEADLINE,
    K.ADMISSION_CHECK_KIND_AUTHORIZATION: wp.DECLINE_REASON_AUTHORIZATION,
    K.ADMISSION_CHECK_KIND_DEPENDENCIES: wp.DECLINE_REASON_DEPENDENCY,
    K.ADMISSION_CHECK_KIND_BUDGET: wp.DECLINE_REASON_BUDGET,
    K.ADMISSION_CHECK_KIND_AMBIGUITY: wp.DECLINE_REASON_OTHER,
}


def _required(value: str, field: str) -> str:
    if not value:
        raise Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, f"{field} is required", field=field)
    return value


def _when(ts: Timestamp, field: str) -> datetime:
    """A request's Timestamp as a time, or INVALID_ARGUMENT for one outside the range a Timestamp
    may hold (a client may send any seconds and nanos)."""
    try:
        return ts.ToDatetime(UTC)
    except (ValueError, OverflowError):
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT, f"{field} is not a valid Timestamp", field=field
        ) from None


def _wait_s(wait: Duration) -> float:
    """NextSlot's wait in seconds, cut to MAX_WAIT; a negative wait is no wait. INVALID_ARGUMENT for
    a Duration outside the range it may hold."""
    try:
        return max(0.0, min(wait.ToTimedelta(), MAX_WAIT).total_seconds())
    except (ValueError, OverflowError):
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT, "wait is not a valid Duration", field="wait"
        ) from None


@rejections_as_status
class SchedulingServicer(pb_grpc.SchedulingServiceServicer):
    SERVICE = "missionweave.v1.SchedulingService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave_server/mesh/server.py)

    def __init__(
        self,
        workers: Workers,
        clock: Clock,
        cards: Callable[[str], Awaitable[dict[str, str] | None]],
    ) -> None:
        self.workers = workers
        self.clock = clock
        self._cards = cards  # a Worker's capabilities in its Agent Card in force (None: no card)

    async def _worker(self, caller: Caller) -> WorkerScheduler:
        if not caller.identity_id:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED, "a scheduler belongs to a Worker: call as the Worker"
            )
        worker = await self.workers.of(caller.identity_id)
        worker.adopt_session(caller.session_epoch)
        return worker

    # ------------------------------------------------------------ admission control

    @requires(Access.IDENTITY)
    async def Admit(
        self, request: pb.AdmitRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.AdmitResponse:
        """MW-10.3-07..09: every check in order; the first failed one decides the decline."""
        group_id = _required(request.group_id, "group_id")
        work_item_id = _required(request.work_item_id, "work_item_id")
        worker = await self._worker(caller)
        capabilities = await self._cards(caller.identity_id)
        if request.offered_at_sequence:
            await worker.reach(group_id, request.offered_at_sequence)
        projection = await worker.group(group_id)
        now = self.clock.now()
        item = projection.items.get(work_item_id)
        contract = request.contract
        checks: list[pb.AdmissionCheck] = []

        def check(kind: int, passed: bool, detail: str) -> None:
            checks.append(pb.AdmissionCheck(kind=kind, passed=passed, detail=detail))  # type: ignore[arg-type]

        queued = len(projection.queue())
        check(
            K.ADMISSION_CHECK_KIND_QUEUE_CAPACITY,
            queued < MAX_QUEUE_PER_GROUP,
            f"{queued} of {MAX_QUEUE_PER_GROUP} queued in this Group",
        )
        slots = worker.policy.params.slots
        committed = worker.committed()
        check(
            K.ADMISSION_CHECK_KIND_CONCURRENCY,
            committed < slots * COMMITMENTS_PER_SLOT,
            f"{committed} commitments for {slots} slots (at most {COMMITMENTS_PER_SLOT} per slot)",
        )
        if capabilities is None:
            check(
                K.ADMISSION_CHECK_KIND_CAPABILITY,
                True,
                "no Agent Card in force: the Membership's capabilities are checked at acceptance",
            )
        else:
            lacking = missing_capability(capabilities, contract.required_capabilities)
            check(
                K.ADMISSION_CHECK_KIND_CAPABILITY,
                lacking is None,
                f"lacks {lacking.capability_id} >= {lacking.version}"
                if lacking
                else "every required capability at its version",
            )
        schedule = self._estimate(worker, group_id, work_item_id, now, extra=1)
        deadline = _when(contract.deadline, "contract.deadline") if contract.HasField("deadline") else None
        fits = deadline is None or schedule.estimated_completion.ToDatetime(UTC) <= deadline
        check(
            K.ADMISSION_CHECK_KIND_DEADLINE,
            fits,
            "the estimated completion is before the deadline"
            if fits
            else "the queue ahead ends after the deadline",
        )
        offered = (
            item is not None
            and request.offer_id in item.open_offers
            and item.open_offers[request.offer_id] > now
        )
        check(
            K.ADMISSION_CHECK_KIND_AUTHORIZATION,
            offered,
            "an open offer to this Worker" if offered else "no open offer to this Worker in the Group log",
        )
        deps = request.dependencies_satisfied or (item is not None and projection.dependencies_done(item))
        check(
            K.ADMISSION_CHECK_KIND_DEPENDENCIES,
            deps,
            "dependencies satisfied" if deps else "dependencies not satisfied yet",
        )
        budget = any(getattr(contract.budget, dim) for dim in DIMENSIONS)
        check(
            K.ADMISSION_CHECK_KIND_BUDGET,
            budget,
            "a budget to work with" if budget else "every budget dimension is zero",
        )
        clear = not request.unresolved_ambiguity_message_ids
        check(
            K.ADMISSION_CHECK_KIND_AMBIGUITY,
            clear,
            "no unresolved ambiguity"
            if clear
            else f"{len(request.unresolved_ambiguity_message_ids)} unresolved ambiguities",
        )
        failed = next((c for c in checks if not c.passed), None)
        matched = [
            membership_pb2.Capability(
                capability_id=c.capability_id, version=(capabilities or {}).get(c.capability_id, "")
            )
            for c in contract.required_capabilities
            if capabilities and c.capability_id in capabilities
        ]
        if failed is None:
            return pb.AdmitResponse(
                decision=pb.ADMISSION_DECISION_ACCEPT,
                checks=checks,
                schedule=schedule,
                matched_capabilities=matched,
            )
        decline = wp.StructuredDecline(reason=_DECLINE[failed.kind], detail=failed.detail)
        return pb.AdmitResponse(
            decision=pb.ADMISSION_DECISION_DECLINE,
            decline=decline,
            checks=checks,
            matched_capabilities=matched,
        )

    # ------------------------------------------------------------ queues and slots

    @requires(Access.IDENTITY)
    async def GetQueue(
        self, request: pb.GetQueueRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetQueueResponse:
        worker = await self._worker(caller)
        projection = await worker.group(_required(request.group_id, "group_id"))
        return pb.GetQueueResponse(queue=self._queue(worker, projection))

    def _queue(self, worker: WorkerScheduler, projection: GroupProjection) -> pb.GroupQueue:
        group_id = projection.group_id
        views = {v.work_item_id: v for v in worker.policy.queue(group_id)}
        running = {wid for wid in worker.policy.running().values() if worker.group_of(wid) == group_id}
        out = pb.GroupQueue(
            group_id=group_id,
            projected_sequence=projection.sequence,
            weight=worker.policy.group_weight(group_id),
            slots_in_use=len(running),
        )
        out.slot_quota = worker.policy.group_quota(group_id)
        for item in sorted(
            projection.queue(),
            key=lambda i: (
                views[i.work_item_id].group_position if i.work_item_id in views else 0,
                i.work_item_id,
            ),
        ):
            view = views.get(item.work_item_id)
            entry = pb.QueueEntry(
                work_item_id=item.work_item_id,
                state=item.state,  # type: ignore[arg-type]
                ownership_epoch=item.ownership_epoch,
                eligible=view.eligible if view else item.state == WS.WORK_ITEM_STATE_ACTIVE,
                ineligible_reason=view.ineligible_reason
                if view
                else ("blocked" if item.state == WS.WORK_ITEM_STATE_BLOCKED else ""),
                group_position=view.group_position if view else 0,
                latest_checkpoint_id=item.latest_checkpoint_id,
            )
            if item.start_deadline:
                entry.start_deadline.CopyFrom(to_timestamp(item.start_deadline))
            if item.enqueued_at:
                entry.enqueued_at.CopyFrom(to_timestamp(item.enqueued_at))
                entry.ordering.waiting_time.FromTimedelta(
                    max(self.clock.now() - item.enqueued_at, timedelta(0))
                )
            ordering = entry.ordering
            ordering.priority_class = int(view.priority_class if view else PriorityClass.STANDARD)  # type: ignore[assignment]
            ordering.urgency, ordering.business_impact = item.urgency, item.business_impact  # type: ignore[assignment]
            ordering.group_weight = out.weight
            ordering.risk_gate_open = not item.needs_approval or item.approved
            ordering.resources_available = True
            if item.deadline:
                ordering.deadline.CopyFrom(to_timestamp(item.deadline))
            out.entries.append(entry)
        return out

    @requires(Access.IDENTITY)
    async def NextSlot(
        self, request: pb.NextSlotRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.NextSlotResponse:
        """MW-11.1-05/10: the next eligible WorkItem across the Worker's Groups, into a free slot;
        when none can be placed for want of a slot, the running slots to ask to pause (MW-11.3-12)."""
        worker = await self._worker(caller)
        wait = _wait_s(request.wait) if request.HasField("wait") else 0.0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            worker.changed.clear()
            worker.sync_all()
            assignment = None
            if not request.preemptions_only:
                try:
                    assignment = worker.policy.pick(worker.now, request.slot_id or None)
                except ValueError as err:
                    raise Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, str(err), field="slot_id") from None
            if assignment is not None:
                metrics.SCHEDULER_DECISIONS.labels("aged" if assignment.aged else "placed").inc()
                metrics.SCHEDULER_WAIT.observe(assignment.waiting_time)
                return self._assigned(worker, assignment)
            preemptions = self._ask_preemptions(worker)
            free = sum(1 for w in worker.policy.slots.values() if w is None)
            remaining = deadline - loop.time()
            if preemptions or remaining <= 0:
                metrics.SCHEDULER_DECISIONS.labels("preemption" if preemptions else "idle").inc(
                    len(preemptions) or 1
                )
                return pb.NextSlotResponse(
                    free_slots=free, total_slots=worker.policy.params.slots, preemptions=preemptions
                )
            try:
                # Aging is a matter of time, not of events: look again at least every AGING_POLL_S.
                await asyncio.wait_for(worker.changed.wait(), min(remaining, AGING_POLL_S))
            except TimeoutError:
                pass

    @staticmethod
    def _ask_preemptions(worker: WorkerScheduler) -> list[pb.SlotPreemption]:
        """The policy's suggestions, each recorded as asked so that it is reported once."""
        asked = []
        for p in worker.policy.suggest_preemptions(worker.now):
            worker.policy.request_preemption(worker.now, p.slot_id)
            reason = (
                wp.PREEMPTION_REASON_FAIRNESS if p.for_rank == AGED_RANK else wp.PREEMPTION_REASON_PRIORITY
            )
            asked.append(
                pb.SlotPreemption(
                    slot_id=p.slot_id, group_id=p.group_id, work_item_id=p.work_item_id, reason=reason
                )
            )
        return asked

    def _assigned(self, worker: WorkerScheduler, a: Assignment) -> pb.NextSlotResponse:
        projection = worker.followers[a.group_id].projection
        item = projection.items[a.work_item_id]
        slot = pb.SlotAssignment(
            slot_id=a.slot_id,
            group_id=a.group_id,
            work_item_id=a.work_item_id,
            ownership_epoch=item.ownership_epoch,
            resume_from_checkpoint_id=item.latest_checkpoint_id,
        )
        o = slot.ordering
        o.priority_class, o.urgency, o.business_impact = int(a.priority_class), a.urgency, a.business_impact  # type: ignore[assignment]
        o.group_weight, o.group_quota_remaining, o.risk_gate_open, o.resources_available = (
            a.group_weight,
            a.group_quota_remaining,
            True,
            True,
        )
        o.waiting_time.FromTimedelta(timedelta(seconds=a.waiting_time))
        if item.deadline:
            o.deadline.CopyFrom(to_timestamp(item.deadline))
        slot.slot_budget.CopyFrom(common_pb2.ResourceVector(**dict(item.budget)))  # type: ignore[arg-type]
        free = sum(1 for w in worker.policy.slots.values() if w is None)
        return pb.NextSlotResponse(assignment=slot, free_slots=free, total_slots=worker.policy.params.slots)

    @requires(Access.IDENTITY)
    async def ReleaseSlot(
        self, request: pb.ReleaseSlotRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.ReleaseSlotResponse:
        worker = await self._worker(caller)
        holder = worker.policy.slots.get(_required(request.slot_id, "slot_id"))
        if holder is None or (request.work_item_id and holder != request.work_item_id):
            raise Rejected(
                R.REJECTION_REASON_NOT_FOUND,
                f"slot {request.slot_id} does not hold {request.work_item_id or 'anything'}",
                field="slot_id",
            )
        worker.policy.release(worker.now, request.slot_id, requeue=request.requeue)
        worker.ended(holder, request.ended_at_sequence)
        return pb.ReleaseSlotResponse(free_slots=sum(1 for w in worker.policy.slots.values() if w is None))

    # ------------------------------------------------------------ disclosure

    @requires(Access.IDENTITY)
    async def DiscloseSchedule(
        self, request: pb.DiscloseScheduleRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.DiscloseScheduleResponse:
        """MW-11.2-01/02: when the Worker expects to start and finish one of its WorkItems of this
        Group; counts and times only, nothing of its other Groups."""
        worker = await self._worker(caller)
        group_id = _required(request.group_id, "group_id")
        work_item_id = _required(request.work_item_id, "work_item_id")
        projection = await worker.group(group_id)
        item = projection.items.get(work_item_id)
        if item is None or item.owner_id != worker.worker_id:
            raise Rejected(
                R.REJECTION_REASON_NOT_FOUND,
                f"{work_item_id} is not in this Worker's queue for {group_id}",
                field="work_item_id",
            )
        return pb.DiscloseScheduleResponse(
            schedule=self._estimate(worker, group_id, work_item_id, self.clock.now())
        )

    def _estimate(
        self, worker: WorkerScheduler, group_id: str, work_item_id: str, now: datetime, extra: int = 0
    ) -> wp.ScheduleDisclosure:
        """Start window from how much of the Worker's work runs before this item, per slot, at the
        policy's service estimate; rounded to whole minutes so nothing finer than a count leaks."""
        params = worker.policy.params
        running = worker.policy.running()
        if work_item_id in running.values():
            begin = now
        else:
            ahead = worker.ahead_of(group_id, work_item_id) + len(running) + extra - 1
            begin = now + timedelta(seconds=max(ahead, 0) // params.slots * params.service_estimate)
        begin = begin.replace(second=0, microsecond=0)
        end = begin + timedelta(seconds=params.service_estimate)
        free = sum(1 for w in worker.policy.slots.values() if w is None)
        status = (
            wp.CAPACITY_STATUS_AVAILABLE
            if free
            else (
                wp.CAPACITY_STATUS_SATURATED
                if worker.committed() >= params.slots * COMMITMENTS_PER_SLOT
                else wp.CAPACITY_STATUS_CONSTRAINED
            )
        )
        return wp.ScheduleDisclosure(
            work_item_id=work_item_id,
            start_window_begin=to_timestamp(begin),
            start_window_end=to_timestamp(end),
            estimated_completion=to_timestamp(end + timedelta(seconds=params.service_estimate)),
            confidence=wp.ESTIMATE_CONFIDENCE_LOW,
            capacity_status=status,
            computed_at=to_timestamp(now),
        )

    # ------------------------------------------------------------ priority

    @requires(Access.IDENTITY)
    async def SetPriority(
        self, request: pb.SetPriorityRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.SetPriorityResponse:
        """MW-11.1-08/09, MW-11.3-10: who may change what, then the queue reordered at once."""
        group_id = _required(request.group_id, "group_id")
        if request.priority_class not in pb.PriorityClass.values():
            raise Rejected(
                R.REJECTION_REASON_INVALID_ARGUMENT,
                f"no priority class {request.priority_class}",
                field="priority_class",
            )
        source = await self._source(request, caller, group_id)
        worker = await self.workers.of(request.worker_id or caller.identity_id)
        projection = await worker.group(group_id)
        now = worker.now
        try:
            if request.group_weight:
                worker.policy.set_group(now, group_id, source, weight=request.group_weight)
            if request.work_item_id:
                if worker.group_of(request.work_item_id) != group_id:
                    raise Rejected(
                        R.REJECTION_REASON_NOT_FOUND,
                        f"{request.work_item_id} is not queued for {group_id}",
                        field="work_item_id",
                    )
                cls = PriorityClass(request.priority_class) if request.priority_class else None
                worker.policy.set_priority(now, request.work_item_id, source, priority_class=cls)
        except NotPermitted as refused:
            raise Rejected(R.REJECTION_REASON_PERMISSION_DENIED, str(refused), field="source") from None
        worker.changed.set()  # a runtime's watcher looks for the preemptions this causes at once
        preempt = [p.work_item_id for p in worker.policy.suggest_preemptions(now) if p.group_id == group_id]
        return pb.SetPriorityResponse(
            queue=self._queue(worker, projection), preemption_requested_work_item_ids=preempt
        )

    async def _source(self, request: pb.SetPriorityRequest, caller: Caller, group_id: str) -> Source:
        """The caller is the source it claims: the Worker itself (its own weights), the Group's
        MissionOwner, or Organization policy. A Coordinator is none of these (MW-11.1-08)."""
        if request.requested_by and request.requested_by != caller.identity_id:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED, "requested_by must be the caller", field="requested_by"
            )
        if request.source == pb.PRIORITY_SOURCE_ORGANIZATION_POLICY and caller.operator:
            return Source.ORGANIZATION_POLICY
        if request.source == pb.PRIORITY_SOURCE_WORKER_OPERATOR and request.worker_id in (
            "",
            caller.identity_id,
        ):
            return Source.WORKER_OPERATOR
        if request.source == pb.PRIORITY_SOURCE_MISSION_OWNER and caller.identity_id:
            # The MissionOwner as the Worker's scheduling view names it, never from the Group state:
            # that would hand the scheduler the Mission's content (MW-13.3-09).
            worker = await self.workers.of(request.worker_id or caller.identity_id)
            if (await worker.group(group_id)).mission_owner_id == caller.identity_id:
                return Source.MISSION_OWNER
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "priority and weights change only for the Group's MissionOwner, Organization policy or the Worker itself (MW-11.1-09)",
            field="source",
        )
