"""The SchedulingService over gRPC, in both topologies: each Worker's own scheduler, fed by the
Group events it may see (spec 10.3, 11.1, 11.2, 11.3-10)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import delete

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.client import MeshClient, decode_events
from missionweave.v1 import common_pb2, membership_pb2
from missionweave.v1 import scheduling_service_pb2 as pb
from missionweave.v1 import scheduling_service_pb2_grpc as pb_grpc
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.scheduling.store import projections
from tests import builders
from tests.conftest import World
from tests.test_agent_cards import card, request
from tests.test_missions import G
from tests.test_work_items import Flow, setup

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

R = common_pb2.RejectionReason
K = pb.AdmissionCheckKind


class Schedulers:
    def __init__(self, w: World) -> None:
        self.clients = {
            "worker": MeshClient(w.target, reader=w.worker),
            "coordinator": MeshClient(w.target, reader=w.coordinator),
            "owner": MeshClient(w.target, reader=w.owner),
        }

    def __getitem__(self, role: str) -> Any:
        return pb_grpc.SchedulingServiceStub(self.clients[role].channel)

    async def close(self) -> None:
        for client in self.clients.values():
            await client.channel.close()


@pytest.fixture
async def sched(world: World) -> AsyncIterator[Schedulers]:
    s = Schedulers(world)
    try:
        yield s
    finally:
        await s.close()


async def refusal(call: Any) -> common_pb2.Rejection:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None, info.value
    return rejection


def admit(flow: Flow, offer: wp.WorkOffer, contract: wp.WorkContract) -> pb.AdmitRequest:
    return pb.AdmitRequest(
        group_id=G,
        work_item_id=offer.work_item_id,
        offer_id=offer.offer_id,
        contract=contract,
        offer_expires_at=offer.expires_at,
    )


@pytest.mark.req("MW-10.3-07", "MW-10.3-08", "MW-10.3-09")
async def test_admission_checks_every_item_and_declines_with_the_first_failure(
    world: World, sched: Schedulers
) -> None:
    w = world
    flow: Flow = await setup(w)
    python = membership_pb2.Capability(capability_id="code.python", version="3.11")
    await flow.authorize("wi-1")
    await flow.authorize("wi-2", required_capabilities=[python])
    offer = flow.offer_body("wi-1", "worker-bot")
    await flow.coord("work_offer", offer)
    contract = builders.contract(w.clock.now())
    answer = await sched["worker"].Admit(admit(flow, offer, contract))
    assert answer.decision == pb.ADMISSION_DECISION_ACCEPT
    assert [c.kind for c in answer.checks] == [k for k in K.values() if k] and all(
        c.passed for c in answer.checks
    )
    assert answer.schedule.work_item_id == "wi-1" and answer.schedule.HasField("computed_at")
    # No open offer in the Group log: the Worker cannot commit.
    unknown = pb.AdmitRequest(group_id=G, work_item_id="wi-2", offer_id="off-nope", contract=contract)
    declined = await sched["worker"].Admit(unknown)
    assert (
        declined.decision == pb.ADMISSION_DECISION_DECLINE
        and declined.decline.reason == wp.DECLINE_REASON_AUTHORIZATION
    )
    # Offered, and then the Worker's card in force says its Python is too old: admission declines.
    needs = builders.contract(w.clock.now())
    needs.required_capabilities.append(python)
    offer_2 = flow.offer_body("wi-2", "worker-bot")
    await flow.coord("work_offer", offer_2)
    worker = MeshClient(w.target, reader=w.worker)
    try:
        old = membership_pb2.Capability(capability_id="code.python", version="3.10.0")
        await worker.membership.PublishAgentCard(
            request(w.worker, card("worker-bot", "1.0.0", capabilities=[old]))
        )
    finally:
        await worker.channel.close()
    lacking = await sched["worker"].Admit(admit(flow, offer_2, needs))
    assert lacking.decline.reason == wp.DECLINE_REASON_CAPABILITY
    failed = [c.kind for c in lacking.checks if not c.passed]
    assert failed == [K.ADMISSION_CHECK_KIND_CAPABILITY]
    # AdmitResponse.matched_capabilities: the held versions of the capabilities the contract names.
    assert list(lacking.matched_capabilities) == [old]


def _decisions() -> dict[str, float]:
    """mwp_scheduler_decisions_total by decision and the wait histogram's count, in this process."""
    from prometheus_client import REGISTRY

    out = {
        d: REGISTRY.get_sample_value("mwp_scheduler_decisions_total", {"decision": d}) or 0.0
        for d in ("placed", "idle")
    }
    out["wait_count"] = REGISTRY.get_sample_value("mwp_scheduler_wait_seconds_count") or 0.0
    return out


@pytest.mark.req("MW-11.1-01", "MW-11.1-03", "MW-11.1-05", "MW-11.2-01", "MW-11.2-02")
async def test_the_worker_queues_places_and_discloses_its_own_work_only(
    world: World, sched: Schedulers
) -> None:
    w = world
    flow: Flow = await setup(w)
    await flow.authorize("wi-1")
    offer_id = await flow.offer("wi-1", "worker-bot")
    epoch = await flow.accept(w.worker, "wi-1", offer_id)
    queue = (await sched["worker"].GetQueue(pb.GetQueueRequest(group_id=G))).queue
    assert [(e.work_item_id, e.state, e.ownership_epoch, e.group_position) for e in queue.entries] == [
        ("wi-1", wp.WORK_ITEM_STATE_QUEUED, epoch, 1)
    ]
    assert queue.projected_sequence == (await w.client.group_state(G)).head_sequence
    # The Coordinator's scheduler is its own: it holds none of the Worker's work.
    assert not (await sched["coordinator"].GetQueue(pb.GetQueueRequest(group_id=G))).queue.entries
    decisions = _decisions()
    placed = await sched["worker"].NextSlot(pb.NextSlotRequest())
    a = placed.assignment
    assert (a.group_id, a.work_item_id, a.ownership_epoch) == (G, "wi-1", epoch) and placed.total_slots == 1
    assert not (await sched["worker"].NextSlot(pb.NextSlotRequest())).HasField(
        "assignment"
    )  # one slot, taken
    if getattr(w.mesh, "schedulers", None) is not None:  # the scheduler runs in this process: its metrics
        moved = {k: v - decisions[k] for k, v in _decisions().items()}
        assert (moved["placed"], moved["idle"], moved["wait_count"]) == (1, 1, 1)
    disclosed = (
        await sched["worker"].DiscloseSchedule(pb.DiscloseScheduleRequest(group_id=G, work_item_id="wi-1"))
    ).schedule
    assert (
        disclosed.HasField("start_window_begin")
        and disclosed.capacity_status == wp.CAPACITY_STATUS_CONSTRAINED
    )
    other = await refusal(
        sched["coordinator"].DiscloseSchedule(pb.DiscloseScheduleRequest(group_id=G, work_item_id="wi-1"))
    )
    assert other.reason == R.REJECTION_REASON_NOT_FOUND
    freed = await sched["worker"].ReleaseSlot(
        pb.ReleaseSlotRequest(
            slot_id=a.slot_id, work_item_id="wi-1", reason=pb.SLOT_RELEASE_REASON_CHECKPOINTED, requeue=True
        )
    )
    assert freed.free_slots == 1
    again = await sched["worker"].NextSlot(pb.NextSlotRequest())
    assert again.assignment.work_item_id == "wi-1"  # requeued, and placed again


@pytest.mark.req("MW-11.1-08", "MW-11.1-09", "MW-11.3-10")
async def test_only_the_mission_owner_or_policy_escalate_never_the_coordinator(
    world: World, sched: Schedulers
) -> None:
    w = world
    flow: Flow = await setup(w)
    await flow.authorize("wi-1")
    await flow.accept(w.worker, "wi-1", await flow.offer("wi-1", "worker-bot"))
    escalate = pb.SetPriorityRequest(
        group_id=G,
        work_item_id="wi-1",
        priority_class=pb.PRIORITY_CLASS_ELEVATED,
        source=pb.PRIORITY_SOURCE_MISSION_OWNER,
        worker_id="worker-bot",
        reason="the board meets at 3",
    )
    denied = await refusal(sched["coordinator"].SetPriority(escalate))
    assert denied.reason == R.REJECTION_REASON_PERMISSION_DENIED
    as_policy = pb.SetPriorityRequest()
    as_policy.CopyFrom(escalate)
    as_policy.source = pb.PRIORITY_SOURCE_ORGANIZATION_POLICY
    assert (
        await refusal(sched["coordinator"].SetPriority(as_policy))
    ).reason == R.REJECTION_REASON_PERMISSION_DENIED
    changed = await sched["owner"].SetPriority(escalate)
    [entry] = changed.queue.entries
    assert entry.ordering.priority_class == pb.PRIORITY_CLASS_ELEVATED  # reordered at once
    # The Worker sets its own Group weights; the MissionOwner may not.
    weight = pb.SetPriorityRequest(
        group_id=G, group_weight=3, source=pb.PRIORITY_SOURCE_MISSION_OWNER, worker_id="worker-bot"
    )
    assert (await refusal(sched["owner"].SetPriority(weight))).reason == R.REJECTION_REASON_PERMISSION_DENIED
    own = pb.SetPriorityRequest(group_id=G, group_weight=3, source=pb.PRIORITY_SOURCE_WORKER_OPERATOR)
    assert (await sched["worker"].SetPriority(own)).queue.weight == 3


async def test_a_group_the_worker_is_not_in_is_refused(world: World, sched: Schedulers) -> None:
    await setup(world)
    refused = await refusal(sched["worker"].GetQueue(pb.GetQueueRequest(group_id="grp_never")))
    assert refused.reason in (R.REJECTION_REASON_NOT_A_MEMBER, R.REJECTION_REASON_GROUP_NOT_FOUND)


MARK = "mark-other-7c1e"


@pytest.mark.req("MW-11.2-02", "MW-11.1-03")
async def test_no_scheduling_answer_about_one_group_names_another(world: World, sched: Schedulers) -> None:
    """The Worker serves two Groups; every answer about G is scanned for the other Group's id and
    WorkItem: none holds them (the other Group's own queue does, so the scan would find a leak)."""
    w = world
    flow: Flow = await setup(w)
    await flow.authorize("wi-1")
    offer = flow.offer_body("wi-1", "worker-bot")
    await flow.coord("work_offer", offer)
    await flow.accept(w.worker, "wi-1", offer.offer_id)
    other = f"grp_{MARK}"
    await w.run(
        w.owner, other, "mission_create", builders.mission_create("alice", "coord-bot", w.clock.now())
    )
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, other, "membership_grant", grant, membership_epoch=1)
    body = wp.WorkAuthorize(
        work_item_id=f"wi-{MARK}", title="x", contract=builders.contract(w.clock.now()), coordinator_epoch=1
    )
    await w.run(w.coordinator, other, "work_authorize", body, membership_epoch=2)
    offer_other = flow.offer_body(f"wi-{MARK}", "worker-bot")
    await w.run(w.coordinator, other, "work_offer", offer_other, membership_epoch=2)
    epoch = await w.epoch_of(other, "worker-bot")
    await w.run(
        w.worker,
        other,
        "work_accept_offer",
        wp.WorkAcceptOffer(work_item_id=f"wi-{MARK}", offer_id=offer_other.offer_id, contract_revision=1),
        membership_epoch=epoch,
    )
    s = sched["worker"]
    assert MARK.encode() in (await s.GetQueue(pb.GetQueueRequest(group_id=other))).SerializeToString()
    answers = [
        await s.GetQueue(pb.GetQueueRequest(group_id=G)),
        await s.DiscloseSchedule(pb.DiscloseScheduleRequest(group_id=G, work_item_id="wi-1")),
        await s.Admit(admit(flow, offer, builders.contract(w.clock.now()))),
        await s.SetPriority(
            pb.SetPriorityRequest(group_id=G, group_weight=2, source=pb.PRIORITY_SOURCE_WORKER_OPERATOR)
        ),
    ]
    for answer in answers:
        assert MARK.encode() not in answer.SerializeToString(), type(answer).__name__


@pytest.mark.req("MW-11.1-03")
async def test_a_deleted_projection_is_rebuilt_identically_from_the_group_log(
    world: World, sched: Schedulers
) -> None:
    w = world
    workers = getattr(w.mesh, "schedulers", None)
    if workers is None:
        pytest.skip("the scheduling service runs in another process in this topology")
    flow: Flow = await setup(w)
    for wid in ("wi-1", "wi-2"):
        await flow.authorize(wid)
        await flow.accept(w.worker, wid, await flow.offer(wid, "worker-bot"))
    before = (await sched["worker"].GetQueue(pb.GetQueueRequest(group_id=G))).queue
    stored = (await workers.of("worker-bot")).followers[G].projection
    async with w.mesh.engine.begin() as conn:  # type: ignore[attr-defined]
        await conn.execute(delete(projections))
    await workers.close()
    workers._workers.clear()  # the scheduler is gone with its projections: only the Group log is left
    after = (await sched["worker"].GetQueue(pb.GetQueueRequest(group_id=G))).queue
    rebuilt = (await workers.of("worker-bot")).followers[G].projection
    assert rebuilt == stored
    for queue in (before, after):
        for entry in queue.entries:
            entry.ordering.ClearField("waiting_time")  # time passes between the two reads
    assert after == before


@pytest.mark.req("MW-11.3-02", "MW-10.3-08")
async def test_accepted_work_past_its_start_deadline_is_not_placed(world: World, sched: Schedulers) -> None:
    """The Authority refuses to start work whose start deadline passed (the Coordinator re-offers
    it): the scheduler does not place it, where placing it would fail at every turn."""
    w = world
    flow: Flow = await setup(w)
    await flow.authorize("wi-1")
    await flow.accept(w.worker, "wi-1", await flow.offer("wi-1", "worker-bot"))
    await flow.authorize("wi-2")
    await flow.accept(w.worker, "wi-2", await flow.offer("wi-2", "worker-bot"))
    await sched["worker"].GetQueue(pb.GetQueueRequest(group_id=G))  # the scheduler follows G from here
    placed = await sched["worker"].NextSlot(pb.NextSlotRequest())
    assert placed.assignment.work_item_id == "wi-1"
    await sched["worker"].ReleaseSlot(
        pb.ReleaseSlotRequest(slot_id=placed.assignment.slot_id, work_item_id="wi-1", requeue=True)
    )
    w.clock.advance(seconds=121)  # the contracts' start deadline is 120 s
    later = await sched["worker"].NextSlot(pb.NextSlotRequest())
    assert not later.HasField("assignment") and later.free_slots == later.total_slots


@pytest.mark.req("MW-10.3-07")
async def test_admission_reads_the_group_up_to_the_offer_before_judging_it(
    world: World, sched: Schedulers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime asks as soon as the offer is delivered; the scheduler's own view may not hold it
    yet (here its store is slowed down, as under load). With the offer's sequence, Admit reads that
    far first and accepts."""
    w = world
    schedulers = getattr(w.mesh, "schedulers", None)
    if schedulers is None:
        pytest.skip("slows the in-process scheduler's store down: the single topology only")
    store = schedulers._store
    save = store.save

    async def slow(projection: Any) -> None:
        await asyncio.sleep(0.3)
        await save(projection)

    monkeypatch.setattr(store, "save", slow)
    flow: Flow = await setup(w)
    await sched["worker"].GetQueue(pb.GetQueueRequest(group_id=G))  # followed and caught up
    contract = builders.contract(w.clock.now())
    for n in range(5):
        await flow.authorize(f"wi-{n}")
        offer = flow.offer_body(f"wi-{n}", "worker-bot")
        result = await w.run(w.coordinator, G, "work_offer", offer, membership_epoch=2)
        sequence = max(e.sequence for e in decode_events(result.events))
        request = admit(flow, offer, contract)
        request.offered_at_sequence = sequence
        answer = await sched["worker"].Admit(request)
        assert answer.decision == pb.ADMISSION_DECISION_ACCEPT, answer.decline


async def health_of(stub: Any, name: str, wanted: int, limit_s: float = 10.0) -> int:
    """The service's health once it is ``wanted`` (or the last answer after ``limit_s``)."""
    status = -1
    for _ in range(int(limit_s / 0.1)):
        status = (await stub.Check(health_pb2.HealthCheckRequest(service=name))).status
        if status == wanted:
            break
        await asyncio.sleep(0.1)
    return status


@pytest.mark.topologies("split")
async def test_the_scheduling_service_serves_only_while_the_authority_answers(world: World) -> None:
    """Each Worker's scheduler follows its Groups from the Authority: with the Authority gone the
    scheduling service says NOT_SERVING (at its own address and at the front door), and SERVING
    again once the Authority is back."""
    from missionweave_server.mesh.server import start

    w = world
    mesh: Any = w.mesh
    name = pb.DESCRIPTOR.services_by_name["SchedulingService"].full_name
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{mesh.parts['scheduling'].port}")
    try:
        own, front = health_pb2_grpc.HealthStub(channel), health_pb2_grpc.HealthStub(w.client.channel)
        assert await health_of(own, name, serving) == serving
        settings = mesh.parts["authority"].settings
        await mesh.parts["authority"].stop(grace=0)
        assert await health_of(own, name, not_serving) == not_serving
        assert await health_of(front, name, not_serving) == not_serving
        mesh.parts["authority"] = await start(settings, w.clock)
        assert await health_of(own, name, serving) == serving
        assert await health_of(front, name, serving) == serving
    finally:
        await channel.close()
