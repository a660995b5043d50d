"""Each Worker's scheduler in the mesh's SchedulingService: its Groups' projections, followed from
the Group logs as that Worker sees them, and the fair policy over its declared slots.

A Worker's scheduler is reached only with that Worker's own call proof (the servicer passes the
authenticated caller), so one Worker's queues, slots and decisions are invisible to every other
Worker and Coordinator (MW-11.1-03). It follows a Group from the first call that names it; its
projections are durable (store.py) and resumed after a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from missionweave.internal.v1 import group_log_pb2_grpc as glpb_grpc
from missionweave.kernel.clock import Clock
from missionweave_server.services.scheduling.follower import GroupFollower
from missionweave_server.services.scheduling.ordering import Params, PriorityClass
from missionweave_server.services.scheduling.policy import Scheduler
from missionweave_server.services.scheduling.projection import WS, GroupProjection, ItemView
from missionweave_server.services.scheduling.store import ProjectionStore

log = logging.getLogger("missionweave.scheduling")

# How long a call waits for a newly followed Group to catch up with its head.
CATCH_UP_S = 5.0


def seconds(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


class WorkerScheduler:
    """One Worker's Groups and its policy. Every change is synchronous code after the call's last
    await (``group``), so the event loop serialises calls without a lock (one held across a Group's
    catch-up wait made every call of the Worker wait for that Group)."""

    def __init__(
        self,
        worker_id: str,
        slots: int,
        clock: Clock,
        group_log: glpb_grpc.GroupLogServiceAsyncStub,
        store: ProjectionStore,
    ) -> None:
        self.worker_id = worker_id
        self.clock = clock
        self.policy = Scheduler(Params(slots=slots))
        self.followers: dict[str, GroupFollower] = {}
        self.changed = asyncio.Event()  # set whenever a projection moved (NextSlot waits on it)
        self._group_log = group_log
        self._store = store
        self._group_of: dict[str, str] = {}  # WorkItem -> Group, for the policy's items
        self.session_epoch = 0  # the Worker's newest session seen; placements of older ones are void
        # WorkItem -> the sequence of the event that ended its last placement: not placed again
        # before its Group's projection has read past it.
        self._ended: dict[str, int] = {}
        self._readers: set[asyncio.Future[None]] = set()  # calls waiting for a projection to move (reach)

    @property
    def now(self) -> float:
        return self.clock.now().timestamp()

    def restore(self, projections: dict[str, GroupProjection]) -> None:
        for projection in projections.values():
            self._follow(projection)

    async def group(self, group_id: str) -> GroupProjection:
        """The Worker's projection of ``group_id``, following it from now on if it was not yet."""
        follower = self.followers.get(group_id)
        if follower is None:
            follower = self._follow(GroupProjection(self.worker_id, group_id))
        try:
            await follower.ready(CATCH_UP_S)
        except Exception:
            if self.followers.get(group_id) is follower and follower.failure is not None:
                del self.followers[group_id]  # not a member (yet): ask again on the next call
            raise
        self.sync(follower.projection)
        return follower.projection

    def _follow(self, projection: GroupProjection) -> GroupFollower:
        follower = GroupFollower(self._group_log, projection, self._store.save, self._wake)
        self.followers[projection.group_id] = follower
        follower.start()
        return follower

    def _wake(self) -> None:
        self.changed.set()
        for reader in self._readers:
            if not reader.done():
                reader.set_result(None)

    def adopt_session(self, session_epoch: int) -> None:
        """A call from a newer session of the Worker: its previous runtime is gone (MW-11.3-09 revokes
        that runtime's leases), so every slot it held is returned and its work queued again."""
        if session_epoch <= self.session_epoch:
            return
        if self.session_epoch:
            for slot, held in self.policy.running().items():
                log.info(
                    "a new session of the Worker: its earlier placement is void",
                    extra={
                        "worker": self.worker_id,
                        "slot": slot,
                        "work_item": held,
                        "session_epoch": session_epoch,
                    },
                )
                self.policy.release(self.now, slot, requeue=True)
        self.session_epoch = session_epoch

    def sync_all(self) -> None:
        for follower in self.followers.values():
            self.sync(follower.projection)

    def sync(self, projection: GroupProjection) -> None:
        """Bring the policy in line with the projection: the Worker's QUEUED items are queued,
        with eligibility from the log (risk gate, dependencies); items that left are dropped, and
        a running item whose work ended in the log frees its slot."""
        now = self.now
        group_id = projection.group_id
        queued = {i.work_item_id: i for i in projection.queue() if self._waiting(i, projection.sequence)}
        known = {v.work_item_id for v in self.policy.queue(group_id)}
        running = {
            wid: slot for slot, wid in self.policy.running().items() if self._group_of.get(wid) == group_id
        }
        for wid, item in queued.items():
            if wid in running:
                continue  # placed; the runtime's work.start has not reached the projection yet
            gate, deps = self._eligibility(projection, item)
            if wid in known:
                self.policy.set_eligibility(now, wid, risk_gate_open=gate, dependencies_met=deps)
            else:
                self.policy.enqueue(
                    now,
                    group_id,
                    wid,
                    deadline=seconds(item.deadline),
                    urgency=item.urgency or 2,
                    business_impact=item.business_impact or 2,
                    risk_gate_open=gate,
                    dependencies_met=deps,
                )
                self._group_of[wid] = group_id
        for wid in known - set(queued):
            self.policy.dequeue(now, wid)
        for wid, slot in running.items():
            held = projection.items.get(wid)
            if (
                held is None
                or held.owner_id != self.worker_id
                or held.state not in (WS.WORK_ITEM_STATE_QUEUED, WS.WORK_ITEM_STATE_ACTIVE)
            ):
                self.policy.release(now, slot, requeue=False)

    async def reach(self, group_id: str, sequence: int, timeout: float = CATCH_UP_S) -> None:  # noqa: ASYNC109
        """Wait, bounded, until the Group's projection has read up to ``sequence``."""
        projection = await self.group(group_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while projection.sequence < sequence:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            moved: asyncio.Future[None] = loop.create_future()
            self._readers.add(moved)
            try:
                await asyncio.wait_for(moved, remaining)
            except TimeoutError:
                return
            finally:
                self._readers.discard(moved)

    def ended(self, work_item_id: str, sequence: int) -> None:
        """The placement of ``work_item_id`` ended with the event at ``sequence``."""
        if sequence:
            self._ended[work_item_id] = sequence

    def _waiting(self, item: ItemView, sequence: int = 0) -> bool:
        """Queued for this Worker: QUEUED, or ACTIVE under a lease of an earlier session, which the
        Authority revokes when this session starts work (MW-11.3-09). Work never started whose start
        deadline has passed is not: the Authority refuses its start and the Coordinator re-offers it
        (placing it would fail again at every turn)."""
        ended = self._ended.get(item.work_item_id)
        if ended is not None:
            if sequence < ended:
                return False  # this view still shows the work as it was before its placement ended
            del self._ended[item.work_item_id]
        if item.state == WS.WORK_ITEM_STATE_QUEUED:
            now = self.clock.now()
            lapsed = (
                item.start_deadline is not None
                and not item.latest_checkpoint_id
                and item.start_deadline <= now
            )
            backing_off = item.retry_not_before is not None and now < item.retry_not_before
            return not lapsed and not backing_off
        return item.state == WS.WORK_ITEM_STATE_ACTIVE and 0 < item.lease_session_epoch < self.session_epoch

    @staticmethod
    def _eligibility(projection: GroupProjection, item: ItemView) -> tuple[bool, bool]:
        """(risk gate open, dependencies met), from the Group log."""
        return not item.needs_approval or item.approved, projection.dependencies_done(item)

    def group_of(self, work_item_id: str) -> str:
        return self._group_of.get(work_item_id, "")

    def committed(self) -> int:
        """WorkItems the Worker has committed to, across its Groups (queued, running, blocked)."""
        return sum(len(f.projection.queue()) for f in self.followers.values())

    def ahead_of(self, group_id: str, work_item_id: str) -> int:
        """How many of the Worker's queued items would run before this one, as a count only."""
        views = self.policy.queue(group_id)
        position = next((v.group_position for v in views if v.work_item_id == work_item_id), len(views) + 1)
        other = sum(len(self.policy.queue(g)) for g in self.followers if g != group_id)
        return position - 1 + other

    async def close(self) -> None:
        for follower in self.followers.values():
            await follower.stop()


class Workers:
    """Every Worker's scheduler in this service instance, created on the Worker's first call."""

    def __init__(
        self,
        clock: Clock,
        group_log: glpb_grpc.GroupLogServiceAsyncStub,
        store: ProjectionStore,
        slots_of: Callable[[str], Awaitable[int]],
    ) -> None:
        self.clock = clock
        self._group_log = group_log
        self._store = store
        self._slots_of = slots_of  # async: a Worker's declared slots (its Agent Card's max concurrency)
        self._workers: dict[str, WorkerScheduler] = {}
        self._lock = asyncio.Lock()

    async def of(self, worker_id: str) -> WorkerScheduler:
        async with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                slots = await self._slots_of(worker_id)
                worker = WorkerScheduler(worker_id, slots, self.clock, self._group_log, self._store)
                worker.restore(await self._store.load(worker_id))
                self._workers[worker_id] = worker
            return worker

    async def close(self) -> None:
        for worker in self._workers.values():
            await worker.close()


__all__ = ["PriorityClass", "WorkerScheduler", "Workers"]
