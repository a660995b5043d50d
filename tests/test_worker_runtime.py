"""The SDK's Worker runtime end to end through the gateway, in both topologies: one Worker serving
two Missions at once, admitting offers through its scheduler, running them in its slots and
submitting; each handler sees only its own slot (MW-11.1-05, MW-11.1-15, MW-10.3-07)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from missionweave.sdk.client import MeshClient
from missionweave.sdk.worker import Failed, Handler, Paused, Slot, WorkerRuntime, WorkResult
from missionweave.v1 import membership_pb2
from missionweave.v1 import scheduling_service_pb2 as spb
from missionweave.v1 import scheduling_service_pb2_grpc as spb_grpc
from missionweave.v1 import work_pb2 as wp
from missionweave.v1.authority_service_pb2 import GetMissionProgressRequest
from tests import builders
from tests.conftest import World, polled
from tests.test_agent_sdk import connect
from tests.test_missions import G
from tests.test_work_items import Flow, setup

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

G2 = "grp_second"


@asynccontextmanager
async def serving(
    w: World, handler: Handler, state: Path, groups: Sequence[str] = (G,), **options: Any
) -> AsyncIterator[WorkerRuntime]:
    """The Worker's runtime serving ``groups`` through an agent of its own, closed on the way out."""
    async with connect(w, "worker-bot", w.worker.key, state) as agent:
        runtime = WorkerRuntime(agent, handler, **options)
        await runtime.serve(list(groups))
        try:
            yield runtime
        finally:
            await runtime.close()


async def second_mission(w: World) -> None:
    """G2: a second Mission of the same owner and Coordinator, with the Worker as a member."""
    await w.run(w.owner, G2, "mission_create", builders.mission_create("alice", "coord-bot", w.clock.now()))
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G2, "membership_grant", grant, membership_epoch=1)


async def offer_in_second(w: World, flow: Flow, work_item_id: str) -> None:
    body = wp.WorkAuthorize(
        work_item_id=work_item_id, title="t", contract=builders.contract(w.clock.now()), coordinator_epoch=1
    )
    await w.run(w.coordinator, G2, "work_authorize", body, membership_epoch=2)
    await w.run(
        w.coordinator, G2, "work_offer", flow.offer_body(work_item_id, "worker-bot"), membership_epoch=2
    )


@pytest.mark.req("MW-11.1-05", "MW-11.1-15", "MW-10.3-07")
async def test_a_worker_serves_two_missions_through_its_scheduler(world: World, tmp_path: Path) -> None:
    w = world
    flow: Flow = await setup(w)
    await second_mission(w)
    seen: list[Slot] = []

    async def handle(slot: Slot) -> WorkResult:
        seen.append(slot)
        assert not hasattr(slot, "runtime") and not hasattr(slot, "agent")  # nothing beyond its own work
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary=f"did {slot.work_item_id}")

    async with serving(w, handle, tmp_path, [G, G2]) as runtime:
        await flow.authorize("wi-1")
        await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))
        await offer_in_second(w, flow, "wi-9")
        async with asyncio.timeout(30):
            done = await runtime.submitted(2)
    assert sorted(done) == sorted([(G, "wi-1"), (G2, "wi-9")])
    for group, wid in done:
        progress = await w.client.authority.GetMissionProgress(GetMissionProgressRequest(group_id=group))
        assert {p.work_item_id: p.state for p in progress.work_items}[wid] == wp.WORK_ITEM_STATE_SUBMITTED
    tokens = {s.token.token_id for s in seen if s.token is not None}
    assert len(tokens) == len(seen) == 2  # each slot its own capability token
    keys = {s.idempotency_key("send") for s in seen}
    assert len(keys) == 2  # and its own side-effect keys


@pytest.mark.req("MW-11.3-11", "MW-11.3-12")
async def test_a_preempted_handler_pauses_at_a_safe_point_and_resumes_from_its_checkpoint(
    world: World, tmp_path: Path
) -> None:
    """The Coordinator asks for preemption; the running handler sees it, stops at a safe point and
    hands back a checkpoint; the runtime records it, the WorkItem re-enters the queue and is placed
    again, resuming from that checkpoint, until it is submitted."""
    w = world
    flow: Flow = await setup(w)
    running = asyncio.Event()
    calls: list[Slot] = []

    async def handle(slot: Slot) -> WorkResult | Paused:
        calls.append(slot)
        if not slot.resume_from_checkpoint_id:
            running.set()
            await asyncio.wait_for(slot.preemption_requested.wait(), 20)  # works until asked to pause
            return Paused(wp.Checkpoint(checkpoint_id="ck-1", completed_operation_ids=["op-1"]))
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="resumed")

    async with serving(w, handle, tmp_path) as runtime:
        await flow.authorize("wi-1")
        await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))
        async with asyncio.timeout(30):
            await running.wait()
            first = calls[0]
            ask = wp.WorkRequestPreemption(
                work_item_id="wi-1",
                preemption_request_id="pre-1",
                lease_id=first.lease_id,
                reason=wp.PREEMPTION_REASON_PRIORITY,
                coordinator_epoch=1,
                ownership_epoch=first.ownership_epoch,
            )
            await flow.coord("work_request_preemption", ask)
            done = await runtime.submitted(1)
    assert done == [(G, "wi-1")]
    assert [c.resume_from_checkpoint_id for c in calls] == ["", "ck-1"]
    assert calls[0].lease_id != calls[1].lease_id  # a new lease for the resumed start
    log = [e async for e in w.client.read_events(G)]
    [paused] = [e.work_checkpointed for e in log if e.WhichOneof("payload") == "work_checkpointed"]
    # The checkpoint answered the request and released the slot (MW-11.3-12 steps 3-4).
    assert paused.preemption_request_id == "pre-1" and paused.HasField("ownership")
    assert not [
        e for e in log if e.WhichOneof("payload") == "lease_revoked"
    ]  # never interrupted (MW-11.3-11)


@pytest.mark.req("MW-11.3-12")
async def test_a_preemption_asked_while_the_work_is_starting_still_reaches_the_handler(
    world: World, tmp_path: Path
) -> None:
    """The request lands between work.start's answer and the slot's registration (a loaded machine:
    the demo's Coordinator preempted in that window and the handler waited its whole minute): it
    is kept for that lease and the handler is asked as soon as it runs."""
    w = world
    flow: Flow = await setup(w)
    calls: list[Slot] = []
    asked = asyncio.Event()

    async def handle(slot: Slot) -> WorkResult | Paused:
        calls.append(slot)
        if not slot.resume_from_checkpoint_id:
            await asyncio.wait_for(slot.preemption_requested.wait(), 10)
            return Paused(wp.Checkpoint(checkpoint_id="ck-1", completed_operation_ids=["op-1"]))
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="resumed")

    async with serving(w, handle, tmp_path) as runtime:
        opened = runtime.desk.open

        async def slow_open(*args: Any, **kwargs: Any) -> Any:  # the window, held open until asked
            if not asked.is_set():
                await asked.wait()
                await asyncio.sleep(0.5)  # the request's event reaches the runtime meanwhile
            return await opened(*args, **kwargs)

        runtime.desk.open = slow_open  # type: ignore[method-assign]
        await flow.authorize("wi-1")
        await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))
        async with asyncio.timeout(40):

            async def started() -> bool:
                return any([e.WhichOneof("payload") == "work_started" async for e in w.client.read_events(G)])

            await polled(started)
            (began,) = [
                e.work_started
                async for e in w.client.read_events(G)
                if e.WhichOneof("payload") == "work_started"
            ]
            ask = wp.WorkRequestPreemption(
                work_item_id="wi-1",
                preemption_request_id="pre-early",
                lease_id=began.lease.lease_id,
                reason=wp.PREEMPTION_REASON_PRIORITY,
                coordinator_epoch=1,
                ownership_epoch=began.lease.ownership_epoch,
            )
            await flow.coord("work_request_preemption", ask)
            asked.set()
            assert await runtime.submitted(1) == [(G, "wi-1")]
    assert [c.resume_from_checkpoint_id for c in calls] == ["", "ck-1"]
    log = [e async for e in w.client.read_events(G)]
    [paused] = [e.work_checkpointed for e in log if e.WhichOneof("payload") == "work_checkpointed"]
    assert paused.preemption_request_id == "pre-early"


@pytest.mark.req("MW-11.3-04")
async def test_the_runtime_renews_the_execution_lease_while_the_handler_works(
    world: World, tmp_path: Path
) -> None:
    """A 2 s execution lease and a handler that works for 3 s: the submission is accepted only
    because the runtime renewed the lease meanwhile."""
    w = world
    flow: Flow = await setup(w)
    policy = wp.TimePolicy()
    policy.execution_lease_duration.FromSeconds(2)
    policy.start_deadline.FromSeconds(120)

    async def handle(slot: Slot) -> WorkResult:
        await asyncio.sleep(3)
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="slow")

    async with serving(w, handle, tmp_path) as runtime:
        await flow.authorize("wi-1", time_policy=policy)
        await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))
        async with asyncio.timeout(30):
            assert await runtime.submitted(1) == [(G, "wi-1")]
    log = [e async for e in w.client.read_events(G)]
    assert [e for e in log if e.WhichOneof("payload") == "work_lease_renewed"]


@pytest.mark.req("MW-11.3-10", "MW-11.3-11", "MW-11.3-12", "MW-11.1-09")
async def test_the_scheduler_preempts_running_work_for_escalated_work_and_both_finish(
    world: World, tmp_path: Path
) -> None:
    """One slot, busy with wi-1 of G. The MissionOwner of G2 escalates the Worker's queued wi-9 to
    URGENT: the scheduler asks wi-1's slot to pause; the runtime records the request in G as the
    owner, the handler checkpoints at its safe point, wi-9 takes the slot and is submitted, then
    wi-1 resumes from its checkpoint and is submitted too. Nothing is interrupted by force."""
    w = world
    flow: Flow = await setup(w)
    await second_mission(w)
    order: list[tuple[str, str]] = []
    running = asyncio.Event()

    async def handle(slot: Slot) -> WorkResult | Paused:
        order.append((slot.work_item_id, slot.resume_from_checkpoint_id))
        if slot.work_item_id == "wi-1" and not slot.resume_from_checkpoint_id:
            running.set()
            await asyncio.wait_for(slot.preemption_requested.wait(), 25)  # the safe point
            return Paused(wp.Checkpoint(checkpoint_id="ck-1", completed_operation_ids=["op-1"]))
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="done")

    owner = MeshClient(w.target, reader=w.owner)
    async with serving(w, handle, tmp_path, [G, G2]) as runtime:
        try:
            await flow.authorize("wi-1")
            await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))
            async with asyncio.timeout(40):
                await running.wait()
                await offer_in_second(w, flow, "wi-9")
                scheduler = spb_grpc.SchedulingServiceStub(owner.channel)
                escalate = spb.SetPriorityRequest(
                    group_id=G2,
                    work_item_id="wi-9",
                    priority_class=spb.PRIORITY_CLASS_URGENT,
                    source=spb.PRIORITY_SOURCE_MISSION_OWNER,
                    worker_id="worker-bot",
                )
                while True:  # once the Worker has accepted wi-9 and its scheduler holds it
                    try:
                        await scheduler.SetPriority(escalate)
                        break
                    except grpc.aio.AioRpcError as err:
                        assert err.code() == grpc.StatusCode.NOT_FOUND, err
                        await asyncio.sleep(0.1)
                done = await runtime.submitted(2)
        finally:
            await owner.channel.close()
    assert done == [(G2, "wi-9"), (G, "wi-1")]
    assert order == [("wi-1", ""), ("wi-9", ""), ("wi-1", "ck-1")]
    log = [e async for e in w.client.read_events(G)]
    [asked] = [
        e.work_preemption_requested for e in log if e.WhichOneof("payload") == "work_preemption_requested"
    ]
    assert (
        asked.requested_by == "worker-bot" and asked.reason == wp.PREEMPTION_REASON_PRIORITY
    )  # step 1, recorded
    [paused] = [e.work_checkpointed for e in log if e.WhichOneof("payload") == "work_checkpointed"]
    assert paused.preemption_request_id == asked.preemption_request_id  # steps 2-3 answer it
    assert not [e for e in log if e.WhichOneof("payload") == "lease_revoked"]  # never by force (MW-11.3-11)


@pytest.mark.req("MW-11.3-09", "MW-11.1-02")
async def test_a_runtime_restarted_in_the_middle_of_work_takes_it_up_again_under_a_new_lease(
    world: World, tmp_path: Path
) -> None:
    """The first runtime dies while its handler works (no checkpoint, no submission). A new one,
    on a new session, is placed the same WorkItem by the scheduler (the old placement is void), the
    Authority revokes the old lease as the new one starts, and the work is submitted once."""
    w = world
    flow: Flow = await setup(w)
    started = asyncio.Event()

    async def stuck(slot: Slot) -> WorkResult:
        started.set()
        await asyncio.Event().wait()  # the process dies here
        raise AssertionError("unreachable")

    async def finish(slot: Slot) -> WorkResult:
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="after the restart")

    async with connect(w, "worker-bot", w.worker.key, tmp_path / "first") as agent:
        first = WorkerRuntime(agent, stuck)
        await first.serve([G])
        await flow.authorize("wi-1")
        await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))
        async with asyncio.timeout(30):
            await started.wait()
    await first.close()  # its connection is gone first: it can release nothing, as in a crash
    async with serving(w, finish, tmp_path / "second") as second:
        async with asyncio.timeout(30):
            assert await second.submitted(1) == [(G, "wi-1")]
    log = [e async for e in w.client.read_events(G)]
    starts = [e.work_started.lease for e in log if e.WhichOneof("payload") == "work_started"]
    assert len(starts) == 2 and starts[0].session_epoch < starts[1].session_epoch
    [revoked] = [e.lease_revoked for e in log if e.WhichOneof("payload") == "lease_revoked"]
    assert (
        revoked.lease_id == starts[0].lease_id and revoked.cause == wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED
    )
    assert len([e for e in log if e.WhichOneof("payload") == "work_submitted"]) == 1


@pytest.mark.req("MW-11.2-01", "MW-11.2-02")
async def test_the_runtime_republishes_a_materially_changed_schedule_and_no_disclosure_names_another_group(
    world: World, tmp_path: Path
) -> None:
    """One slot, busy with wi-1 of G; wi-2 of G waits behind it, and G2 (whose ids and text carry
    markers) holds the Worker's other work. Its acceptance discloses wi-2's start window; once time
    has moved it by minutes the runtime publishes the revised schedule into G. Neither disclosure in
    G holds anything of G2."""
    w = world
    flow: Flow = await setup(w)
    await second_mission(w)
    release = asyncio.Event()
    running = asyncio.Event()

    async def handle(slot: Slot) -> WorkResult:
        if slot.work_item_id == "wi-1":
            running.set()
            await asyncio.wait_for(release.wait(), 30)
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="done")

    def disclosures(log: list[Any], work_item_id: str) -> list[wp.ScheduleDisclosure]:
        out = []
        for e in log:
            kind = e.WhichOneof("payload")
            if kind == "work_offer_accepted" and e.work_offer_accepted.work_item_id == work_item_id:
                out.append(e.work_offer_accepted.schedule)
            elif kind == "work_progress_reported" and e.work_progress_reported.work_item_id == work_item_id:
                out.append(e.work_progress_reported.schedule)
        return out

    patient = wp.TimePolicy()
    patient.start_deadline.FromSeconds(3600)  # still startable after the clock moves

    async def published(at_least: int) -> list[wp.ScheduleDisclosure]:
        """wi-2's disclosures in G, once there are ``at_least``."""
        for _ in range(300):
            found = disclosures([e async for e in w.client.read_events(G)], "wi-2")
            if len(found) >= at_least:
                return found
            await asyncio.sleep(0.1)
        raise AssertionError(f"fewer than {at_least} disclosures of wi-2 in G")

    async with serving(w, handle, tmp_path, [G, G2], disclosure_period_s=0.2) as runtime:
        try:
            secret = wp.WorkAuthorize(
                work_item_id="wi-marker-g2",
                title="MARKER-G2-TITLE",
                coordinator_epoch=1,
                contract=builders.contract(w.clock.now(), goal="MARKER-G2-GOAL", time_policy=patient),
            )
            await w.run(w.coordinator, G2, "work_authorize", secret, membership_epoch=2)
            await flow.authorize("wi-1", time_policy=patient)
            await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))
            async with asyncio.timeout(40):
                await running.wait()
                await w.run(
                    w.coordinator,
                    G2,
                    "work_offer",
                    flow.offer_body("wi-marker-g2", "worker-bot"),
                    membership_epoch=2,
                )
                await flow.authorize("wi-2", time_policy=patient)
                await flow.coord("work_offer", flow.offer_body("wi-2", "worker-bot"))
                await published(1)
                await asyncio.sleep(0.5)  # any revision the queue's own changes cause is published by now
                before = await published(1)
                moved = w.clock.advance(minutes=2)  # wi-2 still waits: its start window slides by minutes
                after = await published(len(before) + 1)
                release.set()
                await runtime.submitted(3)
        finally:
            release.set()
    log = [e async for e in w.client.read_events(G)]
    last, revised = before[-1], after[len(before)]
    assert revised.start_window_begin.ToDatetime() - last.start_window_begin.ToDatetime() >= timedelta(
        minutes=1
    )
    assert revised.computed_at.ToDatetime() >= moved.replace(tzinfo=None) - timedelta(seconds=1)
    for d in disclosures(log, "wi-1") + disclosures(log, "wi-2"):
        blob = d.SerializeToString() + str(d).encode()
        assert d.work_item_id in ("wi-1", "wi-2")
        for marker in (b"grp_second", b"wi-marker-g2", b"MARKER-G2"):
            assert marker not in blob


@pytest.mark.req("MW-11.4-08", "MW-10.2-T13")
async def test_a_transient_failure_is_reported_and_retried_only_after_its_backoff(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler hands back Failed(TRANSIENT) on its first attempt: the runtime reports it under
    the lease, the Authority queues the retry behind a 1 s backoff, and the scheduler places the
    second attempt only once the backoff has passed: no start is refused on the way."""
    w = world
    flow: Flow = await setup(w)
    attempts: list[str] = []

    async def handle(slot: Slot) -> WorkResult | Failed:
        attempts.append(slot.lease_id)
        if len(attempts) == 1:
            return Failed(
                wp.WORK_FAILURE_KIND_TRANSIENT,
                "upstream timed out",
                evidence=[builders.evidence("ev-timeout")],
            )
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="second attempt")

    contract = builders.contract(w.clock.now(), retry_policy=wp.RetryPolicy(max_attempts=2))
    contract.retry_policy.initial_backoff.FromSeconds(1)
    async with serving(w, handle, tmp_path) as runtime:
        await flow.coord(
            "work_authorize",
            wp.WorkAuthorize(work_item_id="wi-r", title="flaky", contract=contract, coordinator_epoch=1),
        )
        await flow.coord("work_offer", flow.offer_body("wi-r", "worker-bot"))
        async with asyncio.timeout(30):
            assert await runtime.submitted(1) == [(G, "wi-r")]
    log = [e async for e in w.client.read_events(G)]
    [revoked] = [e.lease_revoked for e in log if e.WhichOneof("payload") == "lease_revoked"]
    assert revoked.cause == wp.LEASE_REVOCATION_CAUSE_FAILED and revoked.HasField("retry_not_before")
    starts = [e.work_started.lease for e in log if e.WhichOneof("payload") == "work_started"]
    assert len(starts) == 2 and starts[1].started_at.ToDatetime() >= revoked.retry_not_before.ToDatetime()
    refused = [
        r for r in caplog.records if r.name == "missionweave.sdk.worker" and r.levelno >= logging.WARNING
    ]
    assert not refused, [r.getMessage() for r in refused]  # e.g. a start refused while backing off


@pytest.mark.req("MW-10.3-01", "MW-10.3-02")
async def test_an_offer_made_while_the_worker_is_offline_is_answered_when_it_comes_back(
    world: World, tmp_path: Path
) -> None:
    """The offer is durable in the Group log with its expiry, and reserves nothing (the WorkItem
    stays unowned while the Worker is away); the runtime that starts later receives it, admits it
    and accepts it before it expires, and the work is done."""
    w = world
    flow: Flow = await setup(w)
    await flow.authorize("wi-1")
    await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot", seconds=120))
    progress = await w.client.authority.GetMissionProgress(GetMissionProgressRequest(group_id=G))
    [item] = [i for i in progress.work_items if i.work_item_id == "wi-1"]
    assert item.state == wp.WORK_ITEM_STATE_OFFERED and not item.owner_id  # offered, not owned (MW-10.3-02)

    async def handle(slot: Slot) -> WorkResult:
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="after coming online")

    async with serving(w, handle, tmp_path) as runtime:
        async with asyncio.timeout(30):
            assert await runtime.submitted(1) == [(G, "wi-1")]
