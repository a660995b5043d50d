"""A Worker runtime on the SDK: it serves WorkItems offered to its agent across Groups, asking the
mesh's SchedulingService (its own scheduler) what to admit and what to run next.

What an agent author writes is one handler: ``async def handle(slot: Slot) -> WorkResult``. The
runtime subscribes to the Groups, answers offers after admission control (accept with the
disclosed schedule, or a structured decline, MW-10.3-07..09), places admitted work into the
declared slots in the scheduler's order (MW-11.1-05), starts it under an execution lease, runs the
handler in its slot, submits the result and returns the slot.

Slot isolation (MW-11.1-15): a handler gets only its :class:`Slot`: its own WorkItem, lease,
capability token, checkpoints, budget and idempotency keys, and a channel bound to that WorkItem
and lease through which its reports go. A Slot holds no reference to the runtime or to another
slot, so crossing slots is not possible through it.

Offline (MW-11.5-04..09, ``missionweave/sdk/offline.py``): a handler declared :func:`reversible`
keeps working while the Group service is unreachable, until its lease's grace deadline; its
progress reports and a pause's checkpoint are buffered durably and reconciled on reconnection,
before anything else is submitted or started. :meth:`Slot.side_effect` refuses while offline.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, timedelta

import grpc
from google.protobuf.duration_pb2 import Duration

from missionweave.sdk.agent import Agent, AgentError, CommandRejected, Subscription
from missionweave.sdk.client import decode_events
from missionweave.sdk.offline import OfflineBuffer, SlotChannel, is_reversible, reconcile, window_of
from missionweave.sdk.slot import Blocked, Failed, Handler, Outcome, Paused, Slot, WorkResult
from missionweave.sdk.slot_artifacts import SlotArtifactDesk
from missionweave.v1 import (
    authority_service_pb2,
    authority_service_pb2_grpc,
    command_pb2,
    common_pb2,
    conversation_pb2,
    event_pb2,
)
from missionweave.v1 import scheduling_service_pb2 as spb
from missionweave.v1 import scheduling_service_pb2_grpc as spb_grpc
from missionweave.v1 import work_pb2 as wp

# The handler's side (missionweave/sdk/slot.py) is part of this module's public surface.
__all__ = ["Blocked", "Failed", "Handler", "Outcome", "Paused", "Slot", "WorkResult", "WorkerRuntime"]

log = logging.getLogger(__name__)

NEXT_SLOT_WAIT = Duration(seconds=5)
# Every call to the scheduler has a deadline (a long-poll NextSlot: its wait plus this), so a call
# whose cancellation the transport does not complete still ends, and close() is bounded.
CALL_TIMEOUT_S = 10.0
CLOSE_WAIT_S = 15.0
# How often the start estimates of accepted, not yet started work are looked at again; a start
# window that moved by at least MATERIAL_SHIFT, or a new capacity status, is published (MW-11.2-01).
DISCLOSURE_PERIOD_S = 5.0
MATERIAL_SHIFT = timedelta(minutes=1)


class WorkerRuntime:
    """Serves the WorkItems offered to ``agent`` in ``group_ids`` with ``handler``."""

    def __init__(
        self, agent: Agent, handler: Handler, *, disclosure_period_s: float = DISCLOSURE_PERIOD_S
    ) -> None:
        self.agent = agent
        self.handler = handler
        self.disclosure_period_s = disclosure_period_s
        self.slots = 0  # the declared slots (the Agent Card's maximum concurrency), known once serving
        self._closing = False
        self.scheduler = spb_grpc.SchedulingServiceStub(agent.channel)
        self._contracts: dict[tuple[str, str], wp.WorkContract] = {}
        self._running: dict[tuple[str, str], Slot] = {}
        self._preemptions: dict[tuple[str, str], str] = {}  # (Group, WorkItem) -> preemption request id
        # Requests that arrived before their lease's slot was running: (Group, WorkItem) -> (lease, id)
        self._early_preemptions: dict[tuple[str, str], tuple[str, str]] = {}
        self._starts = itertools.count(1)  # lease ids are new on every start, resumed ones too
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_loops: list[asyncio.Task[None]] = []
        self.completed: list[tuple[str, str]] = []  # (group, WorkItem) submitted, in order
        self._progress = asyncio.Condition()
        # Accepted and not running: ownership epoch and the schedule last published for it.
        self._waiting: dict[tuple[str, str], tuple[int, wp.ScheduleDisclosure]] = {}
        self._asked: set[tuple[str, str]] = set()  # preemptions the scheduler asked before the work started
        # Offline (MW-11.5-04..09): the durable buffer, the replayed ownership epochs it is confirmed
        # against, and whether it has been reconciled (nothing else is submitted or started until then).
        self.buffer = OfflineBuffer(agent.directory / "offline.log")
        self.desk = SlotArtifactDesk(
            agent.channel, lambda: agent.session, agent.directory / "outputs", agent.audience
        )
        self._owned: dict[tuple[str, str], int] = {}
        self._conversations: dict[tuple[str, str], str] = {}
        # The latest unblock's resolution per WorkItem, for the start that follows it.
        self._resolutions: dict[tuple[str, str], tuple[str, int]] = {}
        self._subscriptions: dict[str, Subscription] = {}
        self._reconciled = asyncio.Event()
        self._reconciling: asyncio.Task[None] | None = None
        self.refused_offline: list[tuple[command_pb2.Command, CommandRejected]] = []

    async def serve(self, group_ids: Sequence[str]) -> None:
        """Subscribe to the Groups and start one placement loop per declared slot."""
        for group_id in group_ids:
            await self.scheduler.GetQueue(
                spb.GetQueueRequest(group_id=group_id), timeout=CALL_TIMEOUT_S
            )  # it follows G
            self._subscriptions[group_id] = await self.agent.subscribe(group_id, self._handler_for(group_id))
        self._buffered()  # a restarted Worker reconciles what it buffered before it stopped
        first = await self.scheduler.NextSlot(
            spb.NextSlotRequest(preemptions_only=True), timeout=CALL_TIMEOUT_S
        )
        self.slots = first.total_slots or 1
        self._slot_loops = [
            asyncio.create_task(self._place(), name=f"worker-slot-{i}") for i in range(self.slots)
        ]
        self._slot_loops.append(asyncio.create_task(self._watch_preemptions(), name="worker-preemptions"))
        self._slot_loops.append(asyncio.create_task(self._disclose(), name="worker-disclosures"))

    async def submitted(self, count: int) -> list[tuple[str, str]]:
        """Wait until ``count`` WorkItems have been submitted; the (Group, WorkItem) pairs so far."""
        async with self._progress:
            await self._progress.wait_for(lambda: len(self.completed) >= count)
            return list(self.completed)

    async def close(self) -> None:
        """Stops every loop and answer in flight; bounded (CLOSE_WAIT_S), whatever the transport does."""
        # A loop also stops by this flag: Python 3.11's wait_for can swallow a cancellation that
        # arrives as the awaited call completes, which would let a loop place new work after close.
        self._closing = True
        tasks = [*self._slot_loops, *self._tasks]
        if self._reconciling is not None and not self._reconciling.done():
            tasks.append(self._reconciling)  # what is not reconciled stays in the buffer for the next start
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
        if pending:
            log.warning(
                "%s: %d runtime task(s) did not stop within %.0f s",
                self.agent.identity_id,
                len(pending),
                CLOSE_WAIT_S,
            )

    # ------------------------------------------------------------ offers

    def _handler_for(self, group_id: str) -> Callable[[event_pb2.Event], Awaitable[None]]:
        async def on_event(event: event_pb2.Event) -> None:
            kind = event.WhichOneof("payload")
            self._track_ownership(group_id, event)
            if kind == "work_authorized":
                self._contracts[(group_id, event.work_authorized.work_item_id)] = (
                    event.work_authorized.contract
                )
                self._conversations[(group_id, event.work_authorized.work_item_id)] = (
                    event.work_authorized.conversation_id
                )
            elif kind == "work_unblocked":
                unblocked = event.work_unblocked
                self._resolutions[(group_id, unblocked.work_item_id)] = (unblocked.resolution, event.sequence)
            elif kind == "work_offered":
                offered = event.work_offered
                if offered.HasField("amended_contract"):
                    self._contracts[(group_id, offered.work_item_id)] = offered.amended_contract
                if self.agent.identity_id in offered.candidate_ids:
                    self._spawn(self._answer(group_id, offered, event.sequence))
            elif kind == "work_preemption_requested":
                request = event.work_preemption_requested
                key = (group_id, request.work_item_id)
                slot = self._running.get(key)
                if slot is not None and slot.lease_id == request.lease_id:
                    self._preemptions[key] = request.preemption_request_id
                    slot.preemption_requested.set()
                elif slot is None:
                    # Its lease may be starting right now (work.start answered, the slot not yet
                    # registered): kept for that lease, or the handler would never be asked.
                    self._early_preemptions[key] = (request.lease_id, request.preemption_request_id)

        return on_event

    def _track_ownership(self, group_id: str, event: event_pb2.Event) -> None:
        """This agent's ownership epoch per WorkItem, as the replayed log says (0: none)."""
        kind = event.WhichOneof("payload")
        if kind == "work_offer_accepted":
            grant = event.work_offer_accepted.ownership
            self._resolutions.pop((group_id, grant.work_item_id), None)  # a new ownership starts afresh
            mine = grant.agent_id == self.agent.identity_id
            self._owned[(group_id, grant.work_item_id)] = grant.ownership_epoch if mine else 0
        elif kind in ("work_offered", "work_failed", "work_cancelled"):
            self._owned[(group_id, getattr(event, kind).work_item_id)] = 0
        elif kind == "lease_revoked" and event.lease_revoked.resulting_state != wp.WORK_ITEM_STATE_QUEUED:
            self._owned[(group_id, event.lease_revoked.work_item_id)] = 0

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, group_id: str, offered: wp.WorkOffered, sequence: int) -> None:
        """Admission control first; then accept with the disclosed schedule, or decline with its reason."""
        contract = self._contracts.get((group_id, offered.work_item_id), wp.WorkContract())
        admit = await self.scheduler.Admit(
            spb.AdmitRequest(
                group_id=group_id,
                work_item_id=offered.work_item_id,
                offer_id=offered.offer_id,
                contract=contract,
                offer_expires_at=offered.expires_at,
                offered_at_sequence=sequence,
            ),
            timeout=CALL_TIMEOUT_S,
        )
        try:
            if admit.decision == spb.ADMISSION_DECISION_ACCEPT:
                body = wp.WorkAcceptOffer(
                    work_item_id=offered.work_item_id,
                    offer_id=offered.offer_id,
                    contract_revision=offered.contract_revision,
                    schedule=admit.schedule,
                )
                accepted = await self.agent.execute(group_id, "work_accept_offer", body)
                grant = next(
                    (
                        e.work_offer_accepted.ownership
                        for e in decode_events(accepted.events)
                        if e.WhichOneof("payload") == "work_offer_accepted"
                    ),
                    None,
                )
                if grant is not None:
                    self._waiting[(group_id, offered.work_item_id)] = (grant.ownership_epoch, admit.schedule)
            else:
                body_ = wp.WorkDeclineOffer(
                    work_item_id=offered.work_item_id, offer_id=offered.offer_id, decline=admit.decline
                )
                await self.agent.execute(group_id, "work_decline_offer", body_)
        except CommandRejected as refused:  # taken by another candidate, expired, withdrawn
            log.info("%s: the offer %s was not answered: %s", group_id, offered.offer_id, refused)

    # ------------------------------------------------------------ offline (MW-11.5-04..09)

    def _buffered(self) -> None:
        """Something is (or may be) in the buffer: reconcile it once the Group service is back."""
        if not len(self.buffer):
            self._reconciled.set()
            return
        self._reconciled.clear()
        if self._reconciling is None or self._reconciling.done():
            self._reconciling = asyncio.create_task(self._reconcile(), name="worker-offline-reconcile")

    async def reconciled(self) -> None:
        """Waits until nothing buffered offline is left to reconcile (MW-11.5-06)."""
        await self._reconciled.wait()

    async def _ready(self) -> None:
        """MW-11.5-06: nothing is submitted, started or done before the buffer is reconciled."""
        await self._reconciled.wait()

    async def _reconcile(self) -> None:
        """OP-23: resubscribe and replay, confirm the ownership epochs, submit the buffer in order."""
        while len(self.buffer) and not self._closing:
            await self.agent.wait_connected()  # the agent resubscribed every Group from its cursor
            try:
                await self._replayed()
                for command, refused in await reconcile(self.agent, self.buffer, self._owned_epoch):
                    if refused is not None:
                        self.refused_offline.append((command, refused))
            except (AgentError, grpc.aio.AioRpcError) as err:  # lost again: the rest stays buffered
                log.info("%s: reconciliation interrupted: %s", self.agent.identity_id, err)
                await asyncio.sleep(1.0)
        self._reconciled.set()

    async def _replayed(self) -> None:
        """Waits until each Group's subscription has delivered the log up to its current head."""
        stub = authority_service_pb2_grpc.AuthorityServiceStub(self.agent.channel)
        for group_id, subscription in self._subscriptions.items():
            state = await stub.GetGroupState(
                authority_service_pb2.GetGroupStateRequest(group_id=group_id), timeout=CALL_TIMEOUT_S
            )
            async with asyncio.timeout(CALL_TIMEOUT_S):
                await subscription.reached(state.state.head_sequence)

    def _owned_epoch(self, group_id: str, work_item_id: str) -> int | None:
        """None after a restart whose replay (from the durable cursor) did not reach the ownership:
        the Authority then judges alone."""
        return self._owned.get((group_id, work_item_id))

    # ------------------------------------------------------------ slots

    async def _place(self) -> None:
        while not self._closing:
            await self._ready()  # MW-11.5-05/06: nothing new starts offline or before reconciling
            try:
                answer = await self.scheduler.NextSlot(
                    spb.NextSlotRequest(wait=NEXT_SLOT_WAIT), timeout=_poll_timeout()
                )
            except grpc.aio.AioRpcError as err:  # the mesh is unreachable: wait for the Group service
                log.info("%s: no placement: %s", self.agent.identity_id, err.details())
                await self._service_back()
                continue
            if answer.HasField("assignment"):
                await self._run(answer.assignment)

    async def _service_back(self) -> None:
        await asyncio.sleep(1.0)
        await self.agent.wait_connected()

    async def _run(self, a: spb.SlotAssignment) -> None:
        # New on every start, across processes too: a restarted runtime's counter starts again, and
        # a lease id used before for the WorkItem is refused; its new session tells them apart.
        session = self.agent.session.session_epoch
        lease_id = f"lease-{a.work_item_id}-{a.ownership_epoch}-s{session}-{next(self._starts)}"
        key = (a.group_id, a.work_item_id)
        reason: int = spb.SLOT_RELEASE_REASON_FAILED
        requeue = False
        ended_at = 0
        renewing: asyncio.Task[None] | None = None
        try:
            start = wp.WorkStart(
                work_item_id=a.work_item_id,
                ownership_epoch=a.ownership_epoch,
                lease_id=lease_id,
                resume_from_checkpoint_id=a.resume_from_checkpoint_id,
            )
            started = await self.agent.execute(a.group_id, "work_start", start)
            began = next(
                (
                    e.work_started
                    for e in decode_events(started.events)
                    if e.WhichOneof("payload") == "work_started"
                ),
                None,
            )
            token = began.token if began is not None else None
            if key not in self._contracts:
                await self._read_work_item(a.group_id, a.work_item_id)
            contract = self._contracts.get(key, wp.WorkContract())
            channel = None
            if began is not None:
                channel = SlotChannel(
                    self.agent,
                    self.buffer,
                    a.group_id,
                    a.work_item_id,
                    self._conversations.get(key, ""),
                    window_of(began.lease, contract),
                    reversible=is_reversible(self.handler),
                    reconciled=self._reconciled.is_set,
                    on_buffered=self._buffered,
                )
            artifacts = await self.desk.open(
                a.group_id, a.work_item_id, lease_id, a.ownership_epoch, contract
            )
            slot = Slot(
                slot_id=a.slot_id,
                group_id=a.group_id,
                work_item_id=a.work_item_id,
                ownership_epoch=a.ownership_epoch,
                lease_id=lease_id,
                contract=contract,
                token=token,
                budget=a.slot_budget,
                resume_from_checkpoint_id=a.resume_from_checkpoint_id,
                channel=channel,
                artifacts=artifacts,
                unblocked_with=self._resolutions.get(key, ("", 0))[0],
                unblocked_at=self._resolutions.get(key, ("", 0))[1],
            )
            self._running[key] = slot
            self._waiting.pop(key, None)
            self._preemptions.pop(key, None)  # a request for an earlier lease is answered already
            early = self._early_preemptions.pop(key, None)
            if early is not None and early[0] == lease_id:  # asked while this lease was starting
                log.info(
                    "%s/%s: preemption %s was asked while the work was starting",
                    a.group_id,
                    a.work_item_id,
                    early[1],
                )
                self._preemptions[key] = early[1]
                slot.preemption_requested.set()
            if key in self._asked:  # the scheduler asked while the work was starting
                self._asked.discard(key)
                self._spawn(self._preempt(slot, wp.PREEMPTION_REASON_PRIORITY))
            if began is not None and channel is not None:
                renewing = asyncio.create_task(self._renew(slot, began.lease, channel))
            result = await self.handler(slot)
            reason, requeue, ended_at = await self._finish(slot, result)
        except CommandRejected as refused:
            log.warning("%s/%s: %s", a.group_id, a.work_item_id, refused)
        except Exception:
            log.exception("%s/%s: the handler failed", a.group_id, a.work_item_id)
        finally:
            if renewing is not None:
                renewing.cancel()
            self._running.pop(key, None)
            release = spb.ReleaseSlotRequest(
                slot_id=a.slot_id,
                work_item_id=a.work_item_id,
                reason=reason,  # type: ignore[arg-type]
                requeue=requeue,
                ended_at_sequence=ended_at,
            )
            try:
                await self.scheduler.ReleaseSlot(release, timeout=CALL_TIMEOUT_S)
            except (
                grpc.aio.AioRpcError
            ) as err:  # the scheduler freed it already (it saw the work end in the log)
                log.info(
                    "%s/%s: slot %s was released already: %s",
                    a.group_id,
                    a.work_item_id,
                    a.slot_id,
                    err.details(),
                )
            except grpc.aio.UsageError:  # the agent's channel is closed: the process is going away, and
                # the scheduler voids this session's placements when the next session opens (docs/sdk.md)
                log.info(
                    "%s/%s: slot %s not released: the agent was closed", a.group_id, a.work_item_id, a.slot_id
                )

    async def _read_work_item(self, group_id: str, work_item_id: str) -> None:
        """The contract and Conversation of work the subscription did not replay: a restarted
        runtime resumes its Groups from its durable cursor, after the work was authorized."""
        stub = authority_service_pb2_grpc.AuthorityServiceStub(self.agent.channel)
        read = await stub.GetWorkItem(
            authority_service_pb2.GetWorkItemRequest(group_id=group_id, work_item_id=work_item_id),
            timeout=CALL_TIMEOUT_S,
        )
        self._contracts[(group_id, work_item_id)] = read.work_item.contract
        self._conversations[(group_id, work_item_id)] = read.work_item.conversation_id

    async def _block(self, slot: Slot, result: Blocked) -> int:
        """Posts the question in the WorkItem's Conversation, then blocks citing it (MW-11.4-04)."""
        key = (slot.group_id, slot.work_item_id)
        post = conversation_pb2.MessagePost(
            conversation_id=self._conversations.get(key, ""),
            content=conversation_pb2.MessageContent(text=result.question),
            topic="blocker",
        )
        posted = await self.agent.execute(slot.group_id, "message_post", post)
        message_id = next(
            (
                e.message_posted.message_id
                for e in decode_events(posted.events)
                if e.WhichOneof("payload") == "message_posted"
            ),
            "",
        )
        blocker = wp.Blocker(
            blocker_id=f"blk-{slot.lease_id}",
            kind=result.kind,  # type: ignore[arg-type]
            description=result.question[:4096],
            required_resolution=result.required_resolution,
            message_id=message_id,
        )
        block = wp.WorkBlock(
            work_item_id=slot.work_item_id,
            lease_id=slot.lease_id,
            ownership_epoch=slot.ownership_epoch,
            checkpoint=result.checkpoint,
            blockers=[blocker],
            usage_delta=result.usage or common_pb2.ResourceVector(),
        )
        self._resolutions.pop(key, None)  # the answer to this block is the next unblock's
        return _last_sequence(await self.agent.execute(slot.group_id, "work_block", block))

    async def _finish(self, slot: Slot, result: Outcome) -> tuple[int, bool, int]:
        """Records the handler's outcome in the Group: (slot release reason, requeue, the sequence of
        the event that ended the placement)."""
        key = (slot.group_id, slot.work_item_id)
        usage = result.usage or common_pb2.ResourceVector()
        if isinstance(result, Paused):
            checkpoint = wp.WorkCheckpoint(
                work_item_id=slot.work_item_id,
                lease_id=slot.lease_id,
                ownership_epoch=slot.ownership_epoch,
                checkpoint=result.checkpoint,
                preemption_request_id=self._preemptions.pop(key, ""),
                usage_delta=usage,
            )
            if slot.channel is None:
                done = await self.agent.execute(slot.group_id, "work_checkpoint", checkpoint)
            else:  # offline: buffered with its binding, reconciled on reconnection (MW-11.5-04)
                done = (
                    await slot.channel.send("work_checkpoint", checkpoint, usage)
                    or command_pb2.CommandResult()
                )
            self._waiting[key] = (
                slot.ownership_epoch,
                wp.ScheduleDisclosure(),
            )  # disclosed again once estimated
            return spb.SLOT_RELEASE_REASON_PREEMPTED, True, _last_sequence(done)
        await self._ready()  # MW-11.5-06: reconciled before any submission
        if isinstance(result, Blocked):
            return spb.SLOT_RELEASE_REASON_BLOCKED, False, await self._block(slot, result)
        if isinstance(result, Failed):
            fail = wp.WorkFail(
                work_item_id=slot.work_item_id,
                lease_id=slot.lease_id,
                ownership_epoch=slot.ownership_epoch,
                kind=result.kind,  # type: ignore[arg-type]
                reason=result.reason,
                evidence=result.evidence,
                usage_delta=usage,
            )
            done = await self.agent.execute(slot.group_id, "work_fail", fail)
            return spb.SLOT_RELEASE_REASON_FAILED, False, _last_sequence(done)
        outputs: list[common_pb2.ArtifactRef] = []
        if slot.artifacts is not None:
            await slot.artifacts.flush()  # outputs made while the store was unreachable go first
            outputs = slot.artifacts.outputs
        handed_in = {r.digest.hex: r for r in (*outputs, *result.artifacts)}
        submit = wp.WorkSubmit(
            work_item_id=slot.work_item_id,
            lease_id=slot.lease_id,
            ownership_epoch=slot.ownership_epoch,
            contract_revision=slot.contract.revision or 1,
            artifacts=list(handed_in.values()),
            evidence=result.evidence,
            summary=result.summary,
            usage_delta=usage,
        )
        done = await self.agent.execute(slot.group_id, "work_submit", submit)
        async with self._progress:
            self.completed.append(key)
            self._progress.notify_all()
        return spb.SLOT_RELEASE_REASON_SUBMITTED, False, _last_sequence(done)

    # ------------------------------------------------------------ preemption (MW-11.3-12)

    async def _watch_preemptions(self) -> None:
        """Step 1: the scheduler asks a running slot to pause (only when nothing can be placed for
        want of a slot). The handler is told through its slot and pauses at a safe point; nothing is
        interrupted (MW-11.3-11)."""
        while not self._closing:
            try:
                answer = await self.scheduler.NextSlot(
                    spb.NextSlotRequest(preemptions_only=True, wait=NEXT_SLOT_WAIT), timeout=_poll_timeout()
                )
            except grpc.aio.AioRpcError as err:  # the mesh is unreachable: nobody can ask for a pause
                log.info("%s: no preemption requests: %s", self.agent.identity_id, err.details())
                await self._service_back()
                continue
            for asked in answer.preemptions:
                key = (asked.group_id, asked.work_item_id)
                slot = self._running.get(key)
                if slot is None:
                    self._asked.add(key)  # placed, not started yet: asked once it runs
                elif slot.slot_id == asked.slot_id:
                    await self._preempt(slot, asked.reason)

    async def _preempt(self, slot: Slot, reason: int) -> None:
        """Records the scheduler's request in the slot's Group (the audit trail), then tells the handler."""
        key = (slot.group_id, slot.work_item_id)
        request_id = f"pre-{slot.lease_id}"
        body = wp.WorkRequestPreemption(
            work_item_id=slot.work_item_id,
            preemption_request_id=request_id,
            lease_id=slot.lease_id,
            reason=reason,  # type: ignore[arg-type]
            ownership_epoch=slot.ownership_epoch,
        )
        try:
            await self.agent.execute(slot.group_id, "work_request_preemption", body)
        except CommandRejected as refused:  # the work ended meanwhile
            log.info("%s/%s: no preemption: %s", slot.group_id, slot.work_item_id, refused)
            return
        self._preemptions[key] = request_id
        slot.preemption_requested.set()

    # ------------------------------------------------------------ schedule disclosure (MW-11.2-01)

    async def _disclose(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.disclosure_period_s)
            for key in list(self._waiting):
                try:
                    await self._disclose_one(key)
                except CommandRejected as refused:  # started, ended or reassigned meanwhile
                    log.info("%s/%s: no schedule disclosure: %s", key[0], key[1], refused)
                    self._waiting.pop(key, None)
                except grpc.aio.AioRpcError as err:
                    if err.code() == grpc.StatusCode.NOT_FOUND:  # no longer this Worker's queued work
                        self._waiting.pop(key, None)
                    else:  # the scheduler did not answer: try again next period
                        log.info("%s/%s: no schedule estimate: %s", key[0], key[1], err.details())

    async def _disclose_one(self, key: tuple[str, str]) -> None:
        """Publishes the start estimate of accepted, not yet started work when it changed materially."""
        group_id, work_item_id = key
        epoch, last = self._waiting[key]
        answer = await self.scheduler.DiscloseSchedule(
            spb.DiscloseScheduleRequest(group_id=group_id, work_item_id=work_item_id), timeout=CALL_TIMEOUT_S
        )
        schedule = answer.schedule
        if key not in self._waiting or not material(last, schedule):
            return
        report = wp.ProgressReport(
            phase="queued",
            next_checkpoint=wp.PlannedCheckpoint(
                description="start", expected_at=schedule.start_window_begin
            ),
            revised_estimate=wp.RevisedEstimate(
                estimated_completion=schedule.estimated_completion,
                confidence=schedule.confidence,
                reason="the Worker's schedule changed",
            ),
        )
        body = wp.WorkReportProgress(
            work_item_id=work_item_id, ownership_epoch=epoch, report=report, schedule=schedule
        )
        await self.agent.execute(group_id, "work_report_progress", body)
        if key in self._waiting:
            self._waiting[key] = (epoch, schedule)

    async def _renew(self, slot: Slot, lease: wp.ExecutionLease, channel: SlotChannel) -> None:
        """Keep the execution lease alive while the handler works: renew at half its remaining time.
        A renewal that cannot reach the Group service marks the slot offline (its disconnect time)."""
        expires, started = lease.expires_at.ToDatetime(), lease.started_at.ToDatetime()
        period = max((expires - started).total_seconds() / 2, 1.0)
        while True:
            await asyncio.sleep(period)
            if not channel.online():
                channel.lost()
                continue
            body = wp.WorkRenewLease(
                work_item_id=slot.work_item_id, lease_id=slot.lease_id, ownership_epoch=slot.ownership_epoch
            )
            try:
                renewed = await self.agent.execute(slot.group_id, "work_renew_lease", body)
            except (
                CommandRejected
            ) as refused:  # ended, fenced or expired: the handler's result will be refused too
                log.warning(
                    "%s/%s: the lease could not be renewed: %s", slot.group_id, slot.work_item_id, refused
                )
                return
            except AgentError:  # no RESULT: the service is unreachable
                channel.lost()
                continue
            for event in decode_events(renewed.events):
                if event.WhichOneof("payload") == "work_lease_renewed":
                    channel.window.expires_at = event.work_lease_renewed.renewal.expires_at.ToDatetime(
                        tzinfo=UTC
                    )


def material(before: wp.ScheduleDisclosure, now: wp.ScheduleDisclosure) -> bool:
    """Whether a new estimate is worth publishing: none published yet, another capacity status, or a
    start window that moved by MATERIAL_SHIFT or more."""
    if not before.HasField("start_window_begin"):
        return True
    if before.capacity_status != now.capacity_status:
        return True
    moved = abs(now.start_window_begin.ToDatetime() - before.start_window_begin.ToDatetime())
    return moved >= MATERIAL_SHIFT


def _last_sequence(result: command_pb2.CommandResult) -> int:
    """The sequence of the last event a command appended (0 if none)."""
    return max((e.sequence for e in decode_events(result.events)), default=0)


def _poll_timeout() -> float:
    return NEXT_SLOT_WAIT.ToTimedelta().total_seconds() + CALL_TIMEOUT_S
