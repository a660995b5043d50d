"""A Worker's per-Group queue as a projection of the Group events it receives (MW-11.1-01..04):
the Group log stays the authority; the projection is rebuilt identically by replay."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import event_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState
from missionweave_server.services.scheduling.projection import GroupProjection
from tests import builders
from tests.test_core_delegation import IDS, NOW, Role, command

WS = wp.WorkItemState


class Log:
    """A Group decided by the pure core, keeping every event."""

    def __init__(self) -> None:
        self.state: GroupState | None = None
        self.events: list[event_pb2.Event] = []
        create = builders.mission_create("alice", "coord", NOW)
        create.coordinator_renewal.lease_duration.FromSeconds(3_600)
        self.run("mission_create", create, "alice")
        for worker in ("worker", "lead"):
            self.run(
                "membership_grant",
                membership_pb2.MembershipGrant(member_id=worker, role=Role.MEMBER_ROLE_WORKER),
                "alice",
            )

    def run(self, kind: str, body: object, actor: str) -> None:
        decision = decider.decide(
            self.state, command(kind, body, actor, self.state), decider.DecisionContext(NOW, IDS)
        )
        assert not isinstance(decision, Rejected), decision
        for event in decision:
            self.state = decider.evolve(self.state, event)
            self.events.append(event)

    def authorize(self, wid: str, **contract: object) -> None:
        body = wp.WorkAuthorize(
            work_item_id=wid, title=wid, contract=builders.contract(NOW, **contract), coordinator_epoch=1
        )
        self.run("work_authorize", body, "coord")

    def offer_and_accept(self, wid: str, worker: str = "worker") -> None:
        offer = wp.WorkOffer(
            work_item_id=wid,
            offer_id=f"off-{wid}-{len(self.events)}",
            candidate_ids=[worker],
            expires_at=to_timestamp(NOW + timedelta(minutes=5)),
            selection_criteria=[builders.selection(worker)],
            coordinator_epoch=1,
        )
        self.run("work_offer", offer, "coord")
        self.run(
            "work_accept_offer",
            wp.WorkAcceptOffer(work_item_id=wid, offer_id=offer.offer_id, contract_revision=1),
            worker,
        )

    def item(self, wid: str) -> object:
        assert self.state is not None
        return self.state.work_items[wid]


def projected(
    events: list[event_pb2.Event], worker: str = "worker", group_id: str = "grp_d"
) -> GroupProjection:
    p = GroupProjection(worker, group_id)
    for event in events:
        p.apply(event)
    return p


@pytest.mark.req("MW-11.1-01", "MW-11.1-02", "MW-11.1-04")
def test_the_queue_follows_the_workers_own_items_through_their_lifecycle() -> None:
    log = Log()
    log.authorize("a")
    log.authorize("b")
    log.authorize("elsewhere")
    log.offer_and_accept("a")
    log.offer_and_accept("b")
    log.offer_and_accept("elsewhere", worker="lead")
    p = projected(log.events)
    assert sorted(i.work_item_id for i in p.queue()) == ["a", "b"]  # not the other Worker's
    a = p.items["a"]
    assert a.state == WS.WORK_ITEM_STATE_QUEUED and a.ownership_epoch == log.item("a").owner.ownership_epoch  # type: ignore[attr-defined]
    waiting = copy.deepcopy(p.items["b"])
    waiting.depends_on = ("a",)
    assert not p.dependencies_done(waiting) and p.dependencies_done(a)  # a is not verified yet
    start = wp.WorkStart(work_item_id="a", ownership_epoch=a.ownership_epoch, lease_id="lease-a")
    log.run("work_start", start, "worker")
    p = projected(log.events)
    assert p.items["a"].state == WS.WORK_ITEM_STATE_ACTIVE and p.items["a"].lease_id == "lease-a"
    cancel = wp.WorkCancel(work_item_id="a", coordinator_epoch=1, reason="descoped")
    log.run("work_cancel", cancel, "coord")
    p = projected(log.events)
    assert [i.work_item_id for i in p.queue()] == ["b"]
    # The projection is never an authority: it agrees with the Group state it was folded from.
    for item in p.queue():
        assert log.item(item.work_item_id).state == item.state  # type: ignore[attr-defined]


@pytest.mark.req("MW-11.1-03")
def test_a_projection_rebuilt_by_replay_equals_the_live_one_and_tolerates_a_partial_view() -> None:
    log = Log()
    for wid in ("a", "b", "c"):
        log.authorize(wid)
        log.offer_and_accept(wid)
    live = GroupProjection("worker", "grp_d")
    for event in log.events:
        live.apply(event)
        live.apply(event)  # redelivered: ignored
    assert projected(copy.deepcopy(log.events)) == live
    assert GroupProjection.from_json(live.to_json()) == live  # the durable copy is the same projection
    # A late joiner's view starts mid-log and skips restricted sequences: still a consistent queue.
    tail = [e for e in log.events if e.sequence > 3 and e.sequence % 7]
    partial = projected(tail)
    assert partial.sequence == log.events[-1].sequence
    assert {i.work_item_id for i in partial.queue()} <= {"a", "b", "c"}


@pytest.mark.req("MW-10.2-T15", "MW-10.2-T16")
def test_a_work_item_promoted_to_a_child_mission_leaves_the_workers_slot_and_ends_with_it() -> None:
    from missionweave.v1 import common_pb2, mission_pb2, subtask_pb2
    from tests.core_group import CoreGroup

    log = Log()
    log.authorize("a")
    log.offer_and_accept("a")
    a = log.item("a")
    log.run(
        "work_start",
        wp.WorkStart(work_item_id="a", ownership_epoch=a.owner.ownership_epoch, lease_id="lease-a"),
        "worker",
    )  # type: ignore[attr-defined]
    assert log.state is not None
    definition = builders.definition(
        "coord",
        NOW,
        deadline=to_timestamp(NOW + timedelta(hours=2)),
        budget=common_pb2.ResourceVector(tokens=100),
        risk_policy=mission_pb2.RiskPolicy(
            risk_class=mission_pb2.RISK_CLASS_LOW, execution_approver_ids=["alice"]
        ),
    )
    body = subtask_pb2.MissionCreateChild(
        parent_group_id="grp_d",
        parent_work_item_id="a",
        definition=definition,
        coordinator_id="coord2",
        parent_coordinator_epoch=1,
    )
    child_group = CoreGroup("grp_child", decider.DecisionContext(NOW, IDS, {"grp_d": log.state}), NOW)
    created = child_group.decide(None, "mission_create_child", body, "coord")
    assert not isinstance(created, Rejected), created
    child = decider.fold(created)
    assert child is not None
    link = next(e for e in created if e.type == "mission.parent.linked")
    linked = decider.decide_linked(log.state, link, child, NOW)
    assert not isinstance(linked, Rejected)
    for event in linked:
        log.state = decider.evolve(log.state, event)
        log.events.append(event)
    view = projected(log.events).items["a"]
    assert view.state == WS.WORK_ITEM_STATE_BLOCKED and view.lease_id == ""  # the slot is free
    # The child's failure, with a FAIL_PARENT policy on a mandatory child, ends the WorkItem for the Worker.
    assert log.state.work_items["a"].running_child is not None
    log.state.work_items["a"].running_child.mandatory = True
    log.state.work_items["a"].contract.subtask_failure_policy = wp.SUBTASK_FAILURE_POLICY_FAIL_PARENT
    failed = CoreGroup("grp_child", decider.DecisionContext(NOW, IDS), NOW).decide(
        child, "mission_cancel", mission_pb2.MissionCancel(reason="not needed"), "coord"
    )
    assert not isinstance(failed, Rejected)
    ended = decider.decide_linked(log.state, failed[0], decider.fold([*created, *failed]) or child, NOW)
    assert (
        not isinstance(ended, Rejected)
        and ended[0].subtask_ended.resulting_state == WS.WORK_ITEM_STATE_FAILED
    )
    assert projected([*log.events, *ended]).items["a"].state == WS.WORK_ITEM_STATE_FAILED
