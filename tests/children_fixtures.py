"""Setup of the parent/child Mission tests (tests/test_core_subtask_rules.py): a parent Group with
WorkItems, a child created from one of them, each half of the link applied through the decider."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2, event_pb2, membership_pb2, mission_pb2, subtask_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.common import OrganizationPolicy
from missionweave_server.services.authority.state import (
    ExecutionLeaseState,
    GroupState,
    IdentityInfo,
    OfferState,
    OwnershipState,
)
from tests import builders
from tests.core_group import CoreGroup

TERMINAL_MISSION_STATES = frozenset(
    {
        mission_pb2.MISSION_STATE_APPROVED,
        mission_pb2.MISSION_STATE_CANCELLED,
        mission_pb2.MISSION_STATE_FAILED,
    }
)

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
AGENT, HUMAN = common_pb2.IDENTITY_KIND_AGENT, common_pb2.IDENTITY_KIND_HUMAN
IDS = {
    n: IdentityInfo(n, HUMAN if n in ("alice", "bob") else AGENT, session_epoch=1)
    for n in ("alice", "bob", "coord", "worker", "ccoord", "gcoord")
} | {"ops": IdentityInfo("ops", common_pb2.IDENTITY_KIND_CONTROL_PLANE, session_epoch=1)}
CTX = decider.DecisionContext(NOW, IDS)
R = common_pb2.RejectionReason
WS = wp.WorkItemState
MS = mission_pb2.MissionState
Role = membership_pb2.MemberRole
PARENT = CoreGroup("grp_parent", CTX, NOW)
LATER = NOW + timedelta(minutes=5)


def parent_state(item_state: int = WS.WORK_ITEM_STATE_OPEN, **contract_overrides: object) -> GroupState:
    state = PARENT.run(None, "mission_create", builders.mission_create("alice", "coord", NOW), "alice")
    state = PARENT.run(
        state,
        "membership_grant",
        membership_pb2.MembershipGrant(member_id="worker", role=Role.MEMBER_ROLE_WORKER),
        "alice",
    )
    c = builders.contract(NOW, **contract_overrides)
    c.permissions.allowed_tools.extend(["web.search", "python.exec"])
    c.permissions.allowed_data.append("s3://reports/q3")
    c.required_capabilities.append(membership_pb2.Capability(capability_id="code.python", version="3.12"))
    for name in ("wi", "other"):
        state = PARENT.run(
            state,
            "work_authorize",
            wp.WorkAuthorize(work_item_id=name, title=name, contract=c, coordinator_epoch=1),
            "coord",
        )
    item = state.work_items["wi"]
    item.state = item_state
    if item_state in (WS.WORK_ITEM_STATE_OFFERED,):
        item.offers["offer-1"] = OfferState("offer-1", ("worker",), LATER, item.contract_revision)
    if item_state in (WS.WORK_ITEM_STATE_QUEUED, WS.WORK_ITEM_STATE_ACTIVE, WS.WORK_ITEM_STATE_BLOCKED):
        item.owner = OwnershipState("worker", 1, LATER, LATER, "offer-1")
        item.last_ownership_epoch = 1
    if item_state == WS.WORK_ITEM_STATE_ACTIVE:
        item.lease = ExecutionLeaseState("lease-1", "worker", 1, 1, NOW, LATER)
    return state


def child_definition(**overrides: object) -> mission_pb2.MissionDefinition:
    base: dict[str, object] = {
        "title": "Reconcile one ledger",
        "deadline": to_timestamp(NOW + timedelta(hours=12)),
        "budget": common_pb2.ResourceVector(
            currency="EUR", financial_micros=500_000, tokens=5_000, tool_calls=20
        ),
        "risk_policy": mission_pb2.RiskPolicy(
            risk_class=mission_pb2.RISK_CLASS_LOW, execution_approver_ids=["alice"]
        ),
    }
    return builders.definition("coord", NOW, **{**base, **overrides})


def create_body(parent: GroupState, **overrides: object) -> subtask_pb2.MissionCreateChild:
    body = subtask_pb2.MissionCreateChild(
        parent_mission_id=parent.mission.mission_id if parent.mission else "",
        parent_group_id=parent.group_id,
        parent_work_item_id="wi",
        definition=child_definition(),
        coordinator_id="ccoord",
        parent_coordinator_epoch=1,
    )
    return builders.with_overrides(body, overrides)


def ctx_with(*linked: GroupState, policy: OrganizationPolicy | None = None) -> decider.DecisionContext:
    return decider.DecisionContext(
        NOW, IDS, {s.group_id: s for s in linked}, policy=policy or OrganizationPolicy()
    )


def create(
    parent: GroupState, group_id: str = "grp_child", actor: str = "coord", **overrides: object
) -> decider.Decision:
    group = CoreGroup(group_id, ctx_with(parent), NOW)
    return group.decide(None, "mission_create_child", create_body(parent, **overrides), actor)


def created(
    parent: GroupState, group_id: str = "grp_child", **overrides: object
) -> tuple[GroupState, list[event_pb2.Event]]:
    events = create(parent, group_id, **overrides)
    assert not isinstance(events, Rejected), events
    child = decider.fold(events)
    assert child is not None
    return child, events


def refusal(parent: GroupState, **overrides: object) -> Rejected:
    decision = create(parent, **overrides)
    assert isinstance(decision, Rejected), "mission.create_child was accepted"
    return decision


def apply_linked(target: GroupState, source: event_pb2.Event, source_state: GroupState) -> GroupState:
    decision = decider.decide_linked(target, source, source_state, NOW)
    assert not isinstance(decision, Rejected), decision
    after = copy.deepcopy(target)
    for event in decision:
        after = decider.evolve(after, event)
    return after


def event_of(events: list[event_pb2.Event], payload: str) -> event_pb2.Event:
    return next(e for e in events if e.WhichOneof("payload") == payload)


def linked(parent: GroupState, **overrides: object) -> tuple[GroupState, GroupState, list[event_pb2.Event]]:
    """The child created and the parent's half of the link applied."""
    child, events = created(parent, **overrides)
    return apply_linked(parent, event_of(events, "parent_linked"), child), child, events


CHILD = CoreGroup("grp_child", CTX, NOW)


def ended(child: GroupState, how: str, group: CoreGroup = CHILD) -> tuple[GroupState, event_pb2.Event]:
    """The child Mission approved (submitted by its Coordinator, approved by its owner), failed or cancelled."""
    child = group.run(
        child,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        "ccoord",
    )
    if how == "approved":
        child = group.run(
            child,
            "mission_submit_for_approval",
            mission_pb2.MissionSubmitForApproval(
                coordinator_epoch=1, mission_revision=1, artifacts=[builders.artifact("c")]
            ),
            "ccoord",
        )
        assert child.mission is not None
        events = group.decide(
            child,
            "mission_approve",
            mission_pb2.MissionApprove(submission_event_id=child.mission.latest_submission_event_id),
            "coord",
        )
    elif how == "failed":
        events = group.decide(
            child,
            "mission_terminate",
            mission_pb2.MissionTerminate(coordinator_epoch=1, reason="the ledger is missing"),
            "ccoord",
        )
    else:
        events = group.decide(
            child, "mission_cancel", mission_pb2.MissionCancel(reason="not needed"), "coord"
        )
    assert not isinstance(events, Rejected), events
    for event in events:
        child = decider.evolve(child, event)
    assert child.mission is not None and child.mission.state in TERMINAL_MISSION_STATES
    return child, events[0]
