"""The demo's steps: ``MissionRun`` drives one Group with the owner's and the Coordinator's commands
(create the Mission and admit the Workers, plan, offer until accepted, preempt, verify, retry,
submit and approve the Mission), ``play`` tells the story in that order (see the package
docstring), and ``run_demo`` runs it all against a mesh and returns the ``DemoResult``.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
from collections import Counter
from datetime import timedelta
from pathlib import Path

from google.protobuf.message import Message
from nacl.signing import SigningKey

from missionweave.cli.common import CliError, enum_label
from missionweave.cli.demo.cast import WORKER_ROLES, Cast, register_cast
from missionweave.cli.demo.plan import PLAN, TASKS, Task, contract, definition, selection
from missionweave.cli.demo.result import DemoResult
from missionweave.cli.demo.timeline import Timeline
from missionweave.cli.demo.watch import GroupWatch
from missionweave.cli.demo.workers import DemoWorker
from missionweave.kernel import ids
from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.transport import ClientTLS
from missionweave.sdk.client import MeshClient, SessionSigner, decode_events
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import event_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp

OFFER_ROUNDS = 5  # offers of one WorkItem to a Worker that keeps declining
REOFFER_DELAY_S = 0.2
_clock = SystemClock()


class MissionRun:
    """Drives one Group: the owner's and the Coordinator's commands signed by their own sessions;
    the Workers are Worker runtimes reacting to what the Coordinator does."""

    def __init__(self, mesh: MeshClient, cast: Cast, timeline: Timeline) -> None:
        self.mesh, self.cast, self.timeline = mesh, cast, timeline
        self.group_id = ids.new_id("grp")
        self.mission_id = ""
        self.coordinator_epoch = 0
        self.epochs: dict[str, int] = {}  # Membership epochs, learnt from membership.granted
        self._ids: Counter[str] = Counter()
        self.watch = GroupWatch(mesh, self.group_id, timeline)
        self.workers = {role: DemoWorker(self, getattr(cast, role)) for role in WORKER_ROLES}
        self._verified: Counter[str] = Counter()

    def next_id(self, prefix: str) -> str:
        self._ids[prefix] += 1
        return f"{prefix}-{self._ids[prefix]}"

    async def execute(self, signer: SessionSigner, kind: str, body: Message) -> list[event_pb2.Event]:
        self.timeline.step = f"{kind} by {signer.identity_id}"
        command = signer.command(
            self.group_id, kind, body, membership_epoch=self.epochs.get(signer.identity_id, 0)
        )
        events = decode_events((await self.mesh.execute(signer.sign(command))).events)
        for event in events:
            self._learn(event)
        return events

    def _learn(self, event: event_pb2.Event) -> None:
        kind = event.WhichOneof("payload")
        if kind == "membership_granted":
            self.epochs[event.membership_granted.membership.member_id] = (
                event.membership_granted.membership.membership_epoch
            )
        elif kind == "coordinator_lease_granted":
            self.coordinator_epoch = event.coordinator_lease_granted.lease.coordinator_epoch
        elif kind == "mission_created":
            self.mission_id = event.mission_created.mission_id

    async def coordinate(self, kind: str, body: Message) -> list[event_pb2.Event]:
        return await self.execute(self.cast.coordinator, kind, body)

    # -------------------------------------------------------------- the Mission

    async def create_mission(self) -> None:
        owner = self.cast.owner
        body = mission_pb2.MissionCreate(
            definition=definition(owner.identity_id), coordinator_id=self.cast.coordinator.identity_id
        )
        await self.execute(owner, "mission_create", body)
        self.watch.start()
        for role in WORKER_ROLES:
            grant = membership_pb2.MembershipGrant(
                member_id=self.workers[role].identity_id, role=membership_pb2.MEMBER_ROLE_WORKER
            )
            await self.execute(owner, "membership_grant", grant)

    async def start_workers(self, target: str, tls: ClientTLS | None, state_dir: Path) -> None:
        for worker in self.workers.values():
            await worker.start(target, tls, state_dir)

    async def close(self) -> None:
        for worker in self.workers.values():
            await worker.close()
        await self.watch.stop()

    async def plan(self) -> None:
        for task in PLAN:
            body = wp.WorkAuthorize(
                work_item_id=task.work_item_id,
                title=task.title,
                contract=contract(task),
                coordinator_epoch=self.coordinator_epoch,
            )
            await self.coordinate("work_authorize", body)

    async def complete(self, deliverable: Task) -> None:
        """The Coordinator submits the Mission revision with its deliverable; the owner approves it."""
        revision = (await self.mesh.group_state(self.group_id)).mission.revision
        # What the verified WorkItem handed in, exactly as the store holds it (D161).
        delivered = (await self.mesh.work_item(self.group_id, deliverable.work_item_id)).artifacts
        body = mission_pb2.MissionSubmitForApproval(
            coordinator_epoch=self.coordinator_epoch,
            mission_revision=revision,
            artifacts=list(delivered),
            summary="Q3 ledgers reconciled; the report cites every figure",
        )
        submitted = await self.coordinate("mission_submit_for_approval", body)
        approve = mission_pb2.MissionApprove(
            submission_event_id=_event(submitted, "mission_submitted").event_id,
            comment="Figures check out. Ship it.",
        )
        await self.execute(self.cast.owner, "mission_approve", approve)
        await self.watch.wait_for("mission_approved")  # the timeline ends with it

    async def progress(self) -> apb.GetMissionProgressResponse:
        return await self.mesh.authority.GetMissionProgress(
            apb.GetMissionProgressRequest(group_id=self.group_id)
        )

    async def item_state(self, work_item_id: str) -> int:
        progress = await self.progress()
        return next(item.state for item in progress.work_items if item.work_item_id == work_item_id)

    # -------------------------------------------------------------- the Coordinator's part

    async def offer(self, task: Task, role: str) -> str:
        worker = self.workers[role].identity_id
        offer_id = self.next_id(f"offer-{task.work_item_id}")
        body = wp.WorkOffer(
            work_item_id=task.work_item_id,
            offer_id=offer_id,
            candidate_ids=[worker],
            expires_at=to_timestamp(_clock.now() + timedelta(minutes=5)),
            selection_criteria=[selection(worker, self.epochs[worker])],
            coordinator_epoch=self.coordinator_epoch,
        )
        await self.coordinate("work_offer", body)
        return offer_id

    async def assign(self, task: Task, role: str) -> None:
        """Offers ``task`` to the Worker until its runtime accepts: a Worker's admission control may
        decline (its scheduler had not yet read the offer, its queue was full, ...), and a
        Coordinator answers a decline with another offer (MW-10.3-03)."""
        for _ in range(OFFER_ROUNDS):
            offer_id = await self.offer(task, role)
            answer = await self.watch.first_of(
                ("work_offer_accepted", "work_offer_declined"), task.work_item_id, offer_id
            )
            if answer.WhichOneof("payload") == "work_offer_accepted":
                return
            await asyncio.sleep(REOFFER_DELAY_S)
        raise CliError(f"{self.workers[role].identity_id} declined {task.work_item_id} {OFFER_ROUNDS} times")

    async def preempt(self, started: wp.WorkStarted) -> None:
        """Cooperative preemption (MW-11.3-10..12): the request interrupts nothing; the Worker's
        handler stops at its next safe point and its runtime checkpoints citing the request, which
        re-queues the WorkItem."""
        body = wp.WorkRequestPreemption(
            work_item_id=started.work_item_id,
            preemption_request_id=f"pre-{started.work_item_id}",
            lease_id=started.lease.lease_id,
            reason=wp.PREEMPTION_REASON_PRIORITY,
            checkpoint_by=to_timestamp(_clock.now() + timedelta(seconds=30)),
            coordinator_epoch=self.coordinator_epoch,
            ownership_epoch=started.lease.ownership_epoch,
        )
        await self.coordinate("work_request_preemption", body)

    async def verify(self, task: Task) -> None:
        """Waits for the Worker's next submission of ``task`` and accepts the result."""
        wid = task.work_item_id
        submitted = await self.watch.wait_for("work_submitted", wid, skip=self._verified[wid])
        self._verified[wid] += 1
        review = wp.WorkAcceptResult(
            work_item_id=wid, coordinator_epoch=self.coordinator_epoch, submission_event_id=submitted.event_id
        )
        await self.coordinate("work_accept_result", review)

    async def retry(self, task: Task, role: str) -> None:
        """Follows the server after the Worker's failure: a `failed` WorkItem is offered again (a new
        ownership epoch); one the Authority re-queued itself (automatic retry) its Worker's runtime
        starts again once the backoff is over, with nothing for the Coordinator to do."""
        wid = task.work_item_id
        failure = await self.first_failure(wid)
        if failure.WhichOneof("payload") == "lease_revoked":
            return
        state = await self.item_state(wid)
        if state != wp.WORK_ITEM_STATE_FAILED:
            label = enum_label(wp.WorkItemState, state, "WORK_ITEM_STATE_")
            raise CliError(f"after the failure {wid} is {label}; the demo does not know how to retry it")
        await self.assign(task, role)

    async def first_failure(self, work_item_id: str) -> event_pb2.Event:
        """The failure's event: work.failed, or the revocation that queued an automatic retry."""
        self.timeline.step = f"waiting for the failure of {work_item_id}"
        failed = asyncio.ensure_future(self.watch.wait_for("work_failed", work_item_id))
        revoked = asyncio.ensure_future(self.watch.wait_for("lease_revoked", work_item_id))
        done, pending = await asyncio.wait({failed, revoked}, return_when=asyncio.FIRST_COMPLETED)
        for waiting in pending:
            waiting.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return done.pop().result()


def _event(events: list[event_pb2.Event], payload: str) -> event_pb2.Event:
    """The first of ``events`` carrying ``payload`` (an Event oneof field name)."""
    return next(e for e in events if e.WhichOneof("payload") == payload)


async def play(run: MissionRun, target: str, tls: ClientTLS | None, state_dir: Path) -> None:
    """The story: see the package docstring (demo/__init__.py). The Coordinator acts; the Workers' runtimes react."""
    await run.create_mission()
    await run.start_workers(target, tls, state_dir)
    await run.plan()
    await run.assign(TASKS["extract-eu"], "worker_a")
    await run.assign(TASKS["extract-us"], "worker_b")
    started = await run.watch.wait_for("work_started", "extract-us")
    # The urgent review needs Worker B: the Coordinator has it accepted, then preempts B's extraction.
    await run.assign(TASKS["review-controls"], "worker_b")
    await run.preempt(started.work_started)
    for wid in ("review-controls", "extract-us", "extract-eu"):
        await run.verify(TASKS[wid])
    # Both extractions are verified, so the reconciliation may be offered; it fails once.
    await run.assign(TASKS["reconcile"], "worker_a")
    await run.retry(TASKS["reconcile"], "worker_a")
    await run.verify(TASKS["reconcile"])
    await run.assign(TASKS["report"], "worker_b")  # its Worker saves a draft checkpoint on the way
    await run.verify(TASKS["report"])
    await run.complete(TASKS["report"])


async def run_demo(
    mesh: MeshClient,
    admin_key: SigningKey,
    *,
    target: str,
    tls: ClientTLS | None = None,
    admin_id: str = "admin",
    timeline: Timeline | None = None,
) -> DemoResult:
    """Runs the whole scenario against ``mesh``, whose gateway is at ``target`` (where the Workers'
    agents connect); pass a ``timeline`` to keep what happened if a command is refused."""
    timeline = timeline if timeline is not None else Timeline()
    cast = await register_cast(mesh, admin_id, admin_key, timeline, secrets.token_hex(3))
    run = MissionRun(mesh, cast, timeline)
    with tempfile.TemporaryDirectory(prefix="mwp-demo-") as state_dir:  # the agents' sessions and cursors
        try:
            await play(run, target, tls, Path(state_dir))
        finally:
            await run.close()
    return DemoResult(run.group_id, run.mission_id, cast.identities(), timeline, await run.progress())
