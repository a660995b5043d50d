"""Parent Missions and subtasks end to end (spec 14), over the public gRPC API in both topologies: a
child Mission created from a parent WorkItem, the parent's half of the link appended by the
Authority's cross-Group relay, results flowing up, cancellation flowing down, the tree for the root
MissionOwner. The rules themselves are tested on the pure core (tests/test_core_children.py); the
crash between the two Groups' appends in tests/test_subtask_crash.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import grpc
import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.client import MeshClient, SessionSigner, decode_events
from missionweave.v1 import authority_service_pb2, common_pb2, mission_pb2, subtask_pb2
from missionweave.v1 import gateway_service_pb2 as gpb
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.conftest import World, polled, register
from tests.test_gateway import connected
from tests.test_missions import G, refused
from tests.test_work_items import Flow, setup

pytestmark = pytest.mark.both_topologies

R = common_pb2.RejectionReason
WS = wp.WorkItemState
MS = mission_pb2.MissionState
CHILD = "grp_child_ledger"


def child_body(w: World, **overrides: Any) -> subtask_pb2.MissionCreateChild:
    definition = builders.definition(
        "coord-bot",
        w.clock.now(),
        title="Reconcile the EU ledger",
        deadline=to_timestamp(w.clock.now() + timedelta(hours=12)),
        budget=common_pb2.ResourceVector(
            currency="EUR", financial_micros=400_000, tokens=4_000, tool_calls=10
        ),
        risk_policy=mission_pb2.RiskPolicy(
            risk_class=mission_pb2.RISK_CLASS_LOW, execution_approver_ids=["alice"]
        ),
    )
    body = subtask_pb2.MissionCreateChild(
        parent_group_id=G,
        parent_work_item_id="wi-1",
        definition=definition,
        coordinator_id="child-bot",
        parent_coordinator_epoch=1,
    )
    return builders.with_overrides(body, overrides)


async def parent_item(w: World, work_item_id: str = "wi-1") -> authority_service_pb2.WorkItemProgress:
    progress = await w.client.authority.GetMissionProgress(
        authority_service_pb2.GetMissionProgressRequest(group_id=G)
    )
    return next(i for i in progress.work_items if i.work_item_id == work_item_id)


async def until_item(
    w: World, state: int, work_item_id: str = "wi-1"
) -> authority_service_pb2.WorkItemProgress:
    """The relay delivers the parent's half asynchronously: wait for it (bounded)."""

    async def reached() -> bool:
        return (await parent_item(w, work_item_id)).state == state

    await polled(reached)
    return await parent_item(w, work_item_id)


async def child_ended(w: World) -> bool:
    return not (await parent_item(w)).child_running


async def with_child(w: World) -> tuple[Flow, SessionSigner]:
    flow = await setup(w)
    await flow.authorize("wi-1")
    await flow.authorize("wi-2")
    child_coord = await register(w.client, w.keys["admin"], "child-bot", common_pb2.IDENTITY_KIND_AGENT)
    created = await w.run(w.coordinator, CHILD, "mission_create_child", child_body(w))
    assert [e.type for e in decode_events(created.events)][:2] == ["mission.created", "conversation.opened"]
    return flow, child_coord


@pytest.mark.req("MW-7.1-T03", "MW-10.2-T15", "MW-14-01", "MW-14-02", "MW-14-09", "MW-10.4-05")
async def test_a_child_mission_blocks_its_parent_work_item_and_both_link_to_each_other(world: World) -> None:
    w = world
    await with_child(w)
    child = (await w.client.group_state(CHILD)).mission
    assert child.kind == mission_pb2.MISSION_KIND_CHILD and child.definition.owner_id == "coord-bot"
    assert (child.parent_group_id, child.parent_work_item_id, child.depth, child.root_owner_id) == (
        G,
        "wi-1",
        1,
        "alice",
    )
    item = await until_item(w, WS.WORK_ITEM_STATE_BLOCKED)  # appended to the parent's Group by the relay
    assert item.child_group_id == CHILD and item.child_running
    assert any("ends" in b for b in item.blockers)
    # The parent's half was appended once, by the Authority, citing the child's event.
    events = [e async for e in w.client.read_events(G)]
    linked = [e for e in events if e.type == "work.subtask.linked"]
    assert len(linked) == 1 and linked[0].actor_id == "authority"
    assert (
        linked[0].subtask_linked.child_group_id == CHILD and linked[0].subtask_linked.reserved.tokens == 4_000
    )


@pytest.mark.req("MW-14-04", "MW-14-03", "MW-7.1-T03")
async def test_a_child_that_exceeds_its_parent_or_comes_from_anyone_but_the_parent_coordinator_writes_nothing(
    world: World,
) -> None:
    w = world
    flow = await setup(w)
    await flow.authorize("wi-1")
    await register(w.client, w.keys["admin"], "child-bot", common_pb2.IDENTITY_KIND_AGENT)
    big = child_body(w)
    big.definition.budget.tokens = 10_001  # the WorkItem's budget is 10,000
    over = await refused(
        w, w.coordinator, CHILD, "mission_create_child", big, R.REJECTION_REASON_CHILD_BUDGET_EXCEEDS_PARENT
    )
    assert over.metadata["dimension"] == "tokens"
    late = child_body(w)
    late.definition.deadline.CopyFrom(to_timestamp(w.clock.now() + timedelta(days=2)))
    await refused(
        w,
        w.coordinator,
        CHILD,
        "mission_create_child",
        late,
        R.REJECTION_REASON_CHILD_DEADLINE_EXCEEDS_PARENT,
    )
    scope = child_body(
        w, scope=subtask_pb2.MissionScope(permissions=wp.ExecutionPermissions(allowed_tools=["shell.exec"]))
    )
    await refused(
        w, w.coordinator, CHILD, "mission_create_child", scope, R.REJECTION_REASON_CHILD_SCOPE_EXCEEDS_PARENT
    )
    owner_body = child_body(w)
    owner_body.definition.owner_id = "alice"
    await refused(w, w.owner, CHILD, "mission_create_child", owner_body, R.REJECTION_REASON_PERMISSION_DENIED)
    await refused(
        w, w.coordinator, G, "mission_create_child", child_body(w), R.REJECTION_REASON_MISSION_CYCLE
    )
    await refused(
        w,
        w.coordinator,
        CHILD,
        "mission_create_child",
        child_body(w, parent_coordinator_epoch=2),
        R.REJECTION_REASON_COORDINATOR_EPOCH_STALE,
    )


@pytest.mark.req("MW-10.2-T16", "MW-14-11", "MW-14-09", "MW-14-19", "MW-14-18")
async def test_an_approved_child_verifies_its_parent_work_item_and_the_root_owner_sees_the_tree(
    world: World,
) -> None:
    w = world
    _, child_coord = await with_child(w)
    await until_item(w, WS.WORK_ITEM_STATE_BLOCKED)
    # The root MissionOwner inspects the whole tree (MW-14-19), from either Group.
    owner = MeshClient(w.target, reader=w.owner)
    coordinator = MeshClient(w.target, reader=w.coordinator)
    worker = MeshClient(w.target, reader=w.worker)
    try:
        for group in (G, CHILD):
            nodes = await owner.mission_tree(group)
            assert [(n.group_id, n.depth) for n in nodes] == [(G, 0), (CHILD, 1)]
        root, leaf = await owner.mission_tree(G)
        assert (
            root.reserved.tokens == 4_000
            and leaf.budget.limit.tokens == 4_000
            and leaf.owner_id == "coord-bot"
        )
        assert any(b.kind == wp.BLOCKER_KIND_SUBTASK and b.work_item_id == "wi-1" for b in root.blockers)
        # The parent Coordinator inspects its child on demand (MW-14-18): the subtree from it.
        assert [n.group_id for n in await coordinator.mission_tree(CHILD)] == [CHILD]
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await worker.mission_tree(G)  # a Worker of the parent is not shown the tree
        rejection = rejection_from_rpc_error(denied.value)
        assert rejection is not None and rejection.reason == R.REJECTION_REASON_PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as outsider:
            await worker.mission_tree(CHILD)
        rejection = rejection_from_rpc_error(outsider.value)
        assert rejection is not None and rejection.reason == R.REJECTION_REASON_NOT_A_MEMBER
    finally:
        for client in (owner, coordinator, worker):
            await client.channel.close()
    # MW-14-09: the child's Coordinator submits, the parent Coordinator approves as its owner.
    child = (await w.client.group_state(CHILD)).mission
    # The child's result names the parent WorkItem it answers (a manifest always names a WorkItem).
    ledger = await w.deliverable(child_coord, CHILD, "wi-1", b"the reconciled EU ledger")
    submit = mission_pb2.MissionSubmitForApproval(
        coordinator_epoch=1, mission_revision=child.revision, summary="reconciled", artifacts=[ledger]
    )
    await w.run(child_coord, CHILD, "mission_submit_for_approval", submit, membership_epoch=2)
    submitted = (await w.client.group_state(CHILD)).mission.latest_submission_event_id
    await w.run(
        w.coordinator,
        CHILD,
        "mission_approve",
        mission_pb2.MissionApprove(submission_event_id=submitted),
        membership_epoch=1,
    )
    item = await until_item(w, WS.WORK_ITEM_STATE_VERIFIED)  # T16, appended by the relay
    assert not item.child_running and len(item.accepted_evidence_ids) == 1
    ended = [e async for e in w.client.read_events(G) if e.type == "work.subtask.ended"]
    assert len(ended) == 1 and ended[0].subtask_ended.evidence.method == wp.EVIDENCE_METHOD_APPROVAL
    assert list(ended[0].subtask_ended.artifacts) == [ledger]


@pytest.mark.req("MW-10.2-T17", "MW-14-12", "MW-14-13", "MW-14-14")
async def test_a_failed_child_leaves_its_parent_blocked_for_the_coordinator_to_replan(world: World) -> None:
    w = world
    flow, child_coord = await with_child(w)
    await until_item(w, WS.WORK_ITEM_STATE_BLOCKED)
    terminate = mission_pb2.MissionTerminate(coordinator_epoch=1, reason="the EU ledger is not available")
    await w.run(child_coord, CHILD, "mission_terminate", terminate, membership_epoch=2)
    await polled(lambda: child_ended(w))
    item = await parent_item(w)
    assert item.state == WS.WORK_ITEM_STATE_BLOCKED  # MW-14-12: no automatic failure
    ended = [e async for e in w.client.read_events(G) if e.type == "work.subtask.ended"]
    assert ended[0].subtask_ended.evidence.result == wp.EVIDENCE_RESULT_FAIL
    assert ended[0].subtask_ended.reason == "the EU ledger is not available"
    # MW-14-14: the parent Coordinator replans by unblocking it.
    await flow.coord(
        "work_unblock", wp.WorkUnblock(work_item_id="wi-1", coordinator_epoch=1, resolution="do it directly")
    )
    assert (await parent_item(w)).state == WS.WORK_ITEM_STATE_OPEN


@pytest.mark.req("MW-7.1-T07", "MW-10.2-T18")
async def test_cancelling_the_parent_mission_cancels_its_running_child(world: World) -> None:
    w = world
    await with_child(w)
    await until_item(w, WS.WORK_ITEM_STATE_BLOCKED)
    await w.run(
        w.owner, G, "mission_cancel", mission_pb2.MissionCancel(reason="budget cut"), membership_epoch=1
    )

    async def child_cancelled() -> bool:
        return (await w.client.group_state(CHILD)).mission.state == MS.MISSION_STATE_CANCELLED

    await polled(child_cancelled)
    events = [e async for e in w.client.read_events(CHILD)]
    cancelled = next(e for e in events if e.type == "mission.cancelled")
    assert (
        cancelled.actor_id == "authority"
        and cancelled.mission_cancelled.reason == "parent Mission cancelled: budget cut"
    )
    # ...and the child's end reaches the parent (the reservation is released).
    await polled(lambda: child_ended(w))


@pytest.mark.req("MW-14-16", "MW-14-17", "MW-14-18")
async def test_the_parent_coordinator_follows_a_child_as_a_digest_without_its_messages(world: World) -> None:
    w = world
    _, child_coord = await with_child(w)
    planning = (await w.client.group_state(CHILD)).mission.planning_conversation_id
    chatter = await w.run(
        child_coord,
        CHILD,
        "message_post",
        builders.message(planning, "thinking out loud"),
        membership_epoch=2,
    )
    escalation = builders.message(planning, "the tool-call budget will not last")
    escalation.topic = "escalation"
    escalated = await w.run(child_coord, CHILD, "message_post", escalation, membership_epoch=2)
    await w.run(
        child_coord,
        CHILD,
        "mission_terminate",
        mission_pb2.MissionTerminate(coordinator_epoch=1, reason="blocked upstream"),
        membership_epoch=2,
    )
    head = (await w.client.group_state(CHILD)).head_sequence
    stream = await connected(w, w.coordinator)  # the parent Coordinator, the child's MissionOwner
    await stream.send(
        subscribe=gpb.SubscribeFrame(
            subscription_id="digest",
            group_id=CHILD,
            initial_credits=100,
            filter=gpb.AttentionFilter(mode=gpb.ATTENTION_MODE_DIGEST),
        )
    )
    delivered: dict[int, str] = {}
    skipped: set[int] = set()
    while max([*delivered, *skipped], default=0) < head:
        frame = (await stream.until("event")).event
        delivered.update({e.sequence: e.type for e in decode_events(frame.events)})
        skipped.update(s for r in frame.skipped for s in range(r.first, r.last + 1))
    # MW-14-16: state changes and escalations reach it; MW-14-17: ordinary Messages need not.
    assert chatter.group_revision in skipped and escalated.group_revision in delivered
    assert "mission.failed" in delivered.values() and "mission.created" in delivered.values()
    # MW-14-18: what was skipped stays available on demand.
    on_demand = [e async for e in w.client.read_events(CHILD, after=chatter.group_revision - 1)]
    assert on_demand[0].message_posted.content.text == "thinking out loud"
    await stream.call.done_writing()
