"""Parent Missions and subtasks (spec 14, MW-7.1-T03, MW-10.2-T15..T17) on the pure core: the child's
creation in its own Group, each half of the link decided in its own Group, carving of budgets and
scope, depth approvals, results and failures flowing up, cancellation flowing down."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2, membership_pb2, mission_pb2, subtask_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules import children
from missionweave_server.services.authority.rules.common import OrganizationPolicy
from missionweave_server.services.authority.state import ExecutionLeaseState, GroupState, OwnershipState
from tests import builders
from tests.children_fixtures import (  # the setup shared with tests/test_core_subtask_rules.py
    CHILD,
    CTX,
    LATER,
    MS,
    NOW,
    PARENT,
    WS,
    R,
    Role,
    apply_linked,
    child_definition,
    create,
    create_body,
    created,
    ctx_with,
    ended,
    event_of,
    linked,
    parent_state,
    refusal,
)
from tests.core_group import CoreGroup

# ---------------------------------------------------------------- creation (T03, 14-01/02/09)


@pytest.mark.req("MW-7.1-T03", "MW-14-01", "MW-14-02", "MW-14-09")
def test_the_parent_coordinator_creates_a_child_mission_in_its_own_group_as_its_mission_owner() -> None:
    parent = parent_state()
    child, events = created(parent)
    mission = child.mission
    assert (
        mission is not None
        and mission.kind == mission_pb2.MISSION_KIND_CHILD
        and mission.state == MS.MISSION_STATE_ACTIVE
    )
    # MW-14-01: its own Group, Coordinator, Membership, budget, deadline and approval policy.
    assert (
        child.group_id == "grp_child"
        and mission.coordinator is not None
        and mission.coordinator.agent_id == "ccoord"
    )
    assert (
        mission.definition.budget.tokens == 5_000
        and mission.definition.risk_policy.execution_approver_ids == ["alice"]
    )
    # MW-14-09: the parent Coordinator is the child's MissionOwner.
    assert mission.owner_id == "coord" and child.members["coord"].role == Role.MEMBER_ROLE_MISSION_OWNER
    # MW-14-19/MW-14-10: the root owner sees the child and may review it.
    assert child.members["alice"].role == Role.MEMBER_ROLE_REVIEWER
    # MW-14-02: the child names its parent...
    assert (mission.parent_group_id, mission.parent_mission_id, mission.parent_work_item_id) == (
        "grp_parent",
        parent.mission.mission_id,
        "wi",
    )  # type: ignore[union-attr]
    assert (
        mission.depth == 1
        and mission.ancestor_group_ids == ("grp_parent",)
        and mission.root_owner_id == "alice"
    )
    # ...and the parent's Group is told (the outbox row the shell writes beside the append).
    assert children.cross_group_effects(GroupState("grp_child"), events) == [
        (event_of(events, "parent_linked").sequence, "grp_parent")
    ]
    # MW-14-02 and T15, the parent's half: the WorkItem names the child and blocks on it.
    after = apply_linked(parent, event_of(events, "parent_linked"), child)
    item = after.work_items["wi"]
    assert item.state == WS.WORK_ITEM_STATE_BLOCKED and item.running_child is not None
    assert (item.running_child.child_group_id, item.running_child.child_mission_id) == (
        "grp_child",
        mission.mission_id,
    )


@pytest.mark.req("MW-10.2-T15")
@pytest.mark.parametrize(
    "state_value",
    [
        WS.WORK_ITEM_STATE_OPEN,
        WS.WORK_ITEM_STATE_OFFERED,
        WS.WORK_ITEM_STATE_QUEUED,
        WS.WORK_ITEM_STATE_ACTIVE,
        WS.WORK_ITEM_STATE_BLOCKED,
    ],
)
def test_t15_the_parent_work_item_blocks_with_its_ownership_protected(state_value: int) -> None:
    after, _, _ = linked(parent_state(state_value))
    item = after.work_items["wi"]
    assert item.state == WS.WORK_ITEM_STATE_BLOCKED
    assert item.lease is None  # a running attempt ends
    assert not any(o.open for o in item.offers.values())  # open offers are withdrawn
    if item.owner is not None:  # OP-33: protected until the child's deadline
        assert item.owner.agent_id == "worker" and item.owner.expires_at == NOW + timedelta(hours=12)
        assert item.owner.expires_at > LATER
    # The child's budget is reserved from the WorkItem and the Mission.
    assert (
        after.reserved["tokens"] == 5_000
        and item.running_child is not None
        and item.running_child.reserved["tokens"] == 5_000
    )


@pytest.mark.req("MW-10.2-T15")
@pytest.mark.parametrize(
    ("state_value", "reason"),
    [
        (WS.WORK_ITEM_STATE_SUBMITTED, R.REJECTION_REASON_INVALID_TRANSITION),
        (WS.WORK_ITEM_STATE_FAILED, R.REJECTION_REASON_INVALID_TRANSITION),
        (WS.WORK_ITEM_STATE_VERIFIED, R.REJECTION_REASON_TERMINAL_STATE),
        (WS.WORK_ITEM_STATE_CANCELLED, R.REJECTION_REASON_TERMINAL_STATE),
    ],
)
def test_t15_a_work_item_in_any_other_state_is_not_promoted(state_value: int, reason: int) -> None:
    assert refusal(parent_state(state_value)).reason == reason


@pytest.mark.req("MW-7.1-T03")
def test_only_the_parent_coordinator_at_its_current_epoch_creates_a_child() -> None:
    parent = parent_state()
    for actor in ("alice", "worker", "ccoord"):
        decision = create(
            parent, actor=actor, definition=builders.with_overrides(child_definition(), {"owner_id": actor})
        )
        assert isinstance(decision, Rejected) and decision.reason == R.REJECTION_REASON_PERMISSION_DENIED, (
            actor
        )
    assert refusal(parent, parent_coordinator_epoch=2).reason == R.REJECTION_REASON_COORDINATOR_EPOCH_STALE
    # MW-14-09: the issuing parent Coordinator names itself the child's owner.
    assert (
        refusal(parent, definition=child_definition(owner_id="alice")).reason
        == R.REJECTION_REASON_INVALID_ARGUMENT
    )
    wrong = refusal(parent, parent_mission_id="mis_other")
    assert (
        wrong.reason == R.REJECTION_REASON_NOT_FOUND and wrong.metadata["field"] == "body.parent_mission_id"
    )
    assert refusal(parent, parent_work_item_id="wi_missing").reason == R.REJECTION_REASON_NOT_FOUND


# ---------------------------------------------------------------- carving (14-04)


@pytest.mark.req("MW-14-04")
@pytest.mark.parametrize(
    "dim", ["financial_micros", "tokens", "tool_calls", "compute_ms", "wall_clock_ms", "side_effects"]
)
def test_each_of_the_six_budget_dimensions_is_carved_from_the_parent_work_item(dim: str) -> None:
    parent = parent_state()
    item_cap = getattr(parent.work_items["wi"].contract.budget, dim)
    budget = child_definition().budget
    setattr(budget, dim, item_cap + 1)
    r = refusal(parent, definition=child_definition(budget=budget))
    assert r.reason == R.REJECTION_REASON_CHILD_BUDGET_EXCEEDS_PARENT and r.metadata["dimension"] == dim
    assert r.metadata["budget"] == "work_item"
    if item_cap:  # exactly what is left is allowed
        setattr(budget, dim, item_cap)
        assert not isinstance(create(parent, definition=child_definition(budget=budget)), Rejected)


@pytest.mark.req("MW-14-04")
def test_what_the_parent_work_item_and_mission_already_used_or_reserved_is_not_carved_again() -> None:
    parent = parent_state()
    parent.work_items["wi"].used["tokens"] = 6_000  # of 10,000
    r = refusal(parent)  # asks for 5,000
    assert r.reason == R.REJECTION_REASON_CHILD_BUDGET_EXCEEDS_PARENT and r.metadata["limit"] == "4000"
    parent = parent_state()
    parent.mission_used["tool_calls"] = 490  # of the Mission's 500
    r = refusal(parent)  # asks for 20
    assert r.metadata["budget"] == "mission" and r.metadata["dimension"] == "tool_calls"
    parent = parent_state()
    parent.reserved["tool_calls"] = 481  # held for another running child
    assert refusal(parent).metadata["budget"] == "mission"
    budget = child_definition().budget
    budget.currency = "USD"
    assert (
        refusal(parent_state(), definition=child_definition(budget=budget)).reason
        == R.REJECTION_REASON_INVALID_ARGUMENT
    )


@pytest.mark.req("MW-14-04")
def test_no_charge_in_the_parent_eats_into_a_running_childs_reservation() -> None:
    after, _, _ = linked(parent_state())
    other = after.work_items["other"]
    other.lease = ExecutionLeaseState("lease-o", "worker", 1, 1, NOW, LATER)
    other.owner = OwnershipState("worker", 1, LATER, LATER)
    other.state = WS.WORK_ITEM_STATE_ACTIVE
    after.mission_used["tokens"] = 994_000  # the Mission has 1,000,000; 5,000 are reserved
    usage = common_pb2.ResourceVector(tokens=1_001)
    body = wp.WorkRenewLease(work_item_id="other", lease_id="lease-o", ownership_epoch=1, usage_delta=usage)
    r = PARENT.refused(after, "work_renew_lease", body, "worker")
    assert r.reason == R.REJECTION_REASON_BUDGET_EXCEEDED and r.metadata["dimension"] == "tokens"
    body.usage_delta.tokens = 1_000
    assert not isinstance(PARENT.decide(after, "work_renew_lease", body, "worker"), Rejected)


@pytest.mark.req("MW-14-04")
def test_the_childs_deadline_is_within_the_parents() -> None:
    parent = parent_state()
    late = to_timestamp(NOW + timedelta(days=1, minutes=1))  # the WorkItem's deadline is NOW + 1 day
    r = refusal(parent, definition=child_definition(deadline=late))
    assert r.reason == R.REJECTION_REASON_CHILD_DEADLINE_EXCEEDS_PARENT


@pytest.mark.req("MW-14-04")
def test_the_childs_capabilities_and_data_access_are_within_the_parent_work_items() -> None:
    parent = parent_state()
    child, _ = created(parent)  # unset scope: exactly the parent contract's
    assert child.mission is not None and list(child.mission.scope.permissions.allowed_tools) == [
        "web.search",
        "python.exec",
    ]
    narrower = subtask_pb2.MissionScope(
        permissions=wp.ExecutionPermissions(allowed_tools=["web.search"]),
        capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.11")],
    )
    assert not isinstance(create(parent, scope=narrower), Rejected)
    for scope, check in (
        (
            subtask_pb2.MissionScope(permissions=wp.ExecutionPermissions(allowed_tools=["shell.exec"])),
            "allowed_tools",
        ),
        (
            subtask_pb2.MissionScope(permissions=wp.ExecutionPermissions(allowed_data=["s3://payroll"])),
            "allowed_data",
        ),
        (
            subtask_pb2.MissionScope(permissions=wp.ExecutionPermissions(allowed_operations=["email.send"])),
            "allowed_operations",
        ),
        (
            subtask_pb2.MissionScope(
                capabilities=[membership_pb2.Capability(capability_id="gpu.cuda", version="12")]
            ),
            "capability",
        ),
        (
            subtask_pb2.MissionScope(
                capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.13")]
            ),
            "capability",
        ),
    ):
        r = refusal(parent, scope=scope)
        assert r.reason == R.REJECTION_REASON_CHILD_SCOPE_EXCEEDS_PARENT and r.metadata["check"] == check, (
            scope
        )


@pytest.mark.req("MW-14-04")
def test_work_in_the_child_mission_stays_within_its_scope() -> None:
    _, child, _ = linked(parent_state())
    group = CoreGroup("grp_child", CTX, NOW)
    child = group.run(
        child,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        "ccoord",
    )
    inside = builders.contract(NOW)
    inside.permissions.allowed_tools.append("web.search")
    inside.budget.financial_micros = 0
    inside.budget.tokens, inside.budget.tool_calls = 4_000, 20  # within the child Mission's budget (D162)
    accepted = group.decide(
        child,
        "work_authorize",
        wp.WorkAuthorize(work_item_id="w1", title="w", contract=inside, coordinator_epoch=1),
        "ccoord",
    )
    assert not isinstance(accepted, Rejected), accepted
    outside = copy.deepcopy(inside)
    outside.permissions.allowed_data.append("s3://payroll")
    r = group.refused(
        child,
        "work_authorize",
        wp.WorkAuthorize(work_item_id="w2", title="w", contract=outside, coordinator_epoch=1),
        "ccoord",
    )
    assert r.reason == R.REJECTION_REASON_CHILD_SCOPE_EXCEEDS_PARENT and r.metadata["check"] == "allowed_data"


@pytest.mark.req("MW-14-04")
def test_the_childs_authority_is_within_the_parents() -> None:
    parent = parent_state()
    high = mission_pb2.RiskPolicy(risk_class=mission_pb2.RISK_CLASS_HIGH, execution_approver_ids=["alice"])
    assert refusal(parent, definition=child_definition(risk_policy=high)).metadata["check"] == "risk_class"
    # An empty approver list means "the child's owner" (an agent), wider than the parent's owner.
    mine = mission_pb2.RiskPolicy(risk_class=mission_pb2.RISK_CLASS_LOW)
    r = refusal(parent, definition=child_definition(risk_policy=mine))
    assert (
        r.reason == R.REJECTION_REASON_CHILD_AUTHORITY_EXCEEDS_PARENT
        and r.metadata["check"] == "execution_approver_ids"
    )
    strict = parent_state()
    assert strict.mission is not None
    strict.mission.definition.risk_policy.execution_approval_threshold = mission_pb2.RISK_CLASS_MEDIUM
    lax = mission_pb2.RiskPolicy(
        risk_class=mission_pb2.RISK_CLASS_LOW,
        execution_approval_threshold=mission_pb2.RISK_CLASS_HIGH,
        execution_approver_ids=["alice"],
    )
    assert (
        refusal(strict, definition=child_definition(risk_policy=lax)).metadata["check"]
        == "execution_approval_threshold"
    )


# ---------------------------------------------------------------- the tree's shape (14-03, 14-05..08)


@pytest.mark.req("MW-14-03")
def test_the_parent_child_graph_stays_acyclic() -> None:
    parent = parent_state()
    r = create(parent, group_id="grp_parent")  # the child's Group would be its own parent
    assert isinstance(r, Rejected) and r.reason == R.REJECTION_REASON_MISSION_CYCLE
    after, child, _ = linked(parent)
    grandchild_parent = copy.deepcopy(child)
    assert grandchild_parent.mission is not None
    # A grandchild in the root's Group: the root is an ancestor.
    group = CoreGroup("grp_parent", ctx_with(grandchild_parent), NOW)
    body = create_body(grandchild_parent, parent_coordinator_epoch=1)
    r2 = group.decide(after, "mission_create_child", body, "ccoord")
    assert isinstance(r2, Rejected) and r2.reason == R.REJECTION_REASON_MISSION_CYCLE


def _deep_parent(depth: int) -> GroupState:
    parent = parent_state()
    assert parent.mission is not None
    parent.mission.depth = depth
    parent.mission.ancestor_group_ids = tuple(f"grp_a{i}" for i in range(depth))
    return parent


@pytest.mark.req("MW-14-05", "MW-14-06", "MW-14-08")
def test_beyond_the_organizations_default_depth_a_child_needs_a_recorded_approval() -> None:
    parent = _deep_parent(2)  # the child would sit at 3; the default maximum is 2
    r = refusal(parent)
    assert r.reason == R.REJECTION_REASON_DEPTH_APPROVAL_REQUIRED and (
        r.metadata["depth"],
        r.metadata["max_depth"],
    ) == ("3", "2")
    # The default is Organization configuration (MW-14-05): a deeper default allows it.
    allowed = CoreGroup("grp_child", ctx_with(parent, policy=OrganizationPolicy(max_mission_depth=3)), NOW)
    assert not isinstance(
        allowed.decide(None, "mission_create_child", create_body(parent), "coord"), Rejected
    )


@pytest.mark.req("MW-14-06", "MW-14-07")
def test_properly_approved_depth_is_allowed() -> None:
    parent = _deep_parent(2)
    approve = subtask_pb2.MissionApproveChildDepth(
        parent_work_item_id="wi", max_depth=3, reason="the audit needs one more level"
    )
    for actor in ("coord", "worker"):  # the MissionOwner or policy, nobody else
        assert (
            PARENT.refused(parent, "mission_approve_child_depth", approve, actor).reason
            == R.REJECTION_REASON_PERMISSION_DENIED
        )
    shallow = builders.with_overrides(copy.deepcopy(approve), {"max_depth": 2})
    assert (
        PARENT.refused(parent, "mission_approve_child_depth", shallow, "alice").reason
        == R.REJECTION_REASON_INVALID_ARGUMENT
    )
    events = PARENT.decide(parent, "mission_approve_child_depth", approve, "alice")
    assert (
        not isinstance(events, Rejected) and events[0].type == "mission.child_depth.approved"
    )  # recorded as an event
    approved = decider.evolve(copy.deepcopy(parent), events[0])
    child, _ = created(approved, depth_approval_event_id=events[0].event_id)
    assert child.mission is not None and child.mission.depth == 3
    # An approval for another WorkItem, or a shallower one, does not count.
    other = PARENT.decide(
        parent,
        "mission_approve_child_depth",
        builders.with_overrides(copy.deepcopy(approve), {"parent_work_item_id": "other"}),
        "alice",
    )
    assert not isinstance(other, Rejected)
    elsewhere = decider.evolve(copy.deepcopy(parent), other[0])
    assert (
        refusal(elsewhere, depth_approval_event_id=other[0].event_id).reason
        == R.REJECTION_REASON_DEPTH_APPROVAL_REQUIRED
    )


@pytest.mark.req("MW-14-14")
def test_one_running_child_per_work_item_and_a_replacement_after_it_ends() -> None:
    after, child, _ = linked(parent_state())
    assert refusal(after).reason == R.REJECTION_REASON_PRECONDITION_FAILED
    # unblocking while the child runs would orphan it
    unblock = wp.WorkUnblock(work_item_id="wi", coordinator_epoch=1, resolution="replanned")
    assert (
        PARENT.refused(after, "work_unblock", unblock, "coord").reason
        == R.REJECTION_REASON_PRECONDITION_FAILED
    )
    failed_child, end = ended(child, "failed")
    after = apply_linked(after, end, failed_child)
    assert after.work_items["wi"].state == WS.WORK_ITEM_STATE_BLOCKED
    replacement, _ = created(after, group_id="grp_child2")  # MW-14-14: a replacement child
    assert replacement.mission is not None and replacement.mission.parent_work_item_id == "wi"
    assert not isinstance(PARENT.decide(after, "work_unblock", unblock, "coord"), Rejected)  # or replan


# ---------------------------------------------------------------- results (T16, T17, 14-10..15)


@pytest.mark.req("MW-10.2-T16", "MW-14-11")
def test_t16_an_approved_child_verifies_its_parent_work_item_with_the_approval_as_evidence() -> None:
    after, child, _ = linked(parent_state(WS.WORK_ITEM_STATE_ACTIVE))
    child.mission_used["tokens"] = 1_234  # what the child's WorkItems used
    approved, end = ended(child, "approved")
    assert children.cross_group_effects(child, [end]) == [(end.sequence, "grp_parent")]
    final = apply_linked(after, end, approved)
    item = final.work_items["wi"]
    assert item.state == WS.WORK_ITEM_STATE_VERIFIED and item.running_child is None
    (evidence_id,) = item.accepted_evidence_ids
    assert item.evidence[evidence_id][1] == wp.EVIDENCE_RESULT_PASS
    recorded = decider.decide_linked(after, end, approved, NOW)
    assert not isinstance(recorded, Rejected)
    ended_event = recorded[0].subtask_ended
    assert (
        ended_event.evidence.method == wp.EVIDENCE_METHOD_APPROVAL
        and ended_event.outcome == MS.MISSION_STATE_APPROVED
    )
    assert [a.digest.hex for a in ended_event.artifacts] == [
        "c" * 64
    ]  # the child's artifacts are the parent's
    assert ("c" * 64, builders.artifact("c").digest.size_bytes) in item.published_artifacts
    # The reservation is released and what the child used is charged.
    assert (
        final.reserved["tokens"] == 0
        and item.used["tokens"] == 1_234
        and final.mission_used["tokens"] == 1_234
    )
    # A redelivery of the same end appends nothing.
    assert decider.decide_linked(final, end, approved, NOW) == []


@pytest.mark.req("MW-10.2-T17", "MW-14-12", "MW-14-13", "MW-14-15")
@pytest.mark.parametrize(
    ("mandatory", "policy", "expected"),
    [
        (False, wp.SUBTASK_FAILURE_POLICY_UNSPECIFIED, WS.WORK_ITEM_STATE_BLOCKED),
        (True, wp.SUBTASK_FAILURE_POLICY_UNSPECIFIED, WS.WORK_ITEM_STATE_BLOCKED),
        (True, wp.SUBTASK_FAILURE_POLICY_KEEP_BLOCKED, WS.WORK_ITEM_STATE_BLOCKED),
        (False, wp.SUBTASK_FAILURE_POLICY_FAIL_PARENT, WS.WORK_ITEM_STATE_BLOCKED),
        (True, wp.SUBTASK_FAILURE_POLICY_FAIL_PARENT, WS.WORK_ITEM_STATE_FAILED),
    ],
)
def test_t17_a_failed_child_blocks_or_fails_its_parent_by_the_declared_policy(
    mandatory: bool, policy: int, expected: int
) -> None:
    after, child, _ = linked(parent_state(subtask_failure_policy=policy), mandatory=mandatory)
    failed, end = ended(child, "failed")
    decision = decider.decide_linked(after, end, failed, NOW)
    assert not isinstance(decision, Rejected)
    recorded = decision[0].subtask_ended
    # MW-14-13: structured failure Evidence, with the child's reason.
    assert (
        recorded.evidence.method == wp.EVIDENCE_METHOD_FAILURE_OBSERVATION
        and recorded.evidence.result == wp.EVIDENCE_RESULT_FAIL
    )
    assert recorded.reason == "the ledger is missing" and recorded.outcome == MS.MISSION_STATE_FAILED
    final = apply_linked(after, end, failed)
    assert final.work_items["wi"].state == expected
    assert (
        final.mission is not None and final.mission.state == MS.MISSION_STATE_ACTIVE
    )  # MW-14-12: the parent Mission goes on


@pytest.mark.req("MW-10.2-T17")
def test_a_cancelled_child_ends_like_a_failed_one() -> None:
    after, child, _ = linked(parent_state())
    cancelled, end = ended(child, "cancelled")
    final = apply_linked(after, end, cancelled)
    assert final.work_items["wi"].state == WS.WORK_ITEM_STATE_BLOCKED and final.reserved["tokens"] == 0


@pytest.mark.req("MW-14-10")
def test_where_the_risk_policy_says_so_the_root_owner_approves_too() -> None:
    policy = mission_pb2.RiskPolicy(
        risk_class=mission_pb2.RISK_CLASS_LOW,
        execution_approver_ids=["alice"],
        require_root_owner_approval=True,
    )
    _, child, _ = linked(parent_state(), definition=child_definition(risk_policy=policy))
    child = CHILD.run(
        child,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        "ccoord",
    )
    child = CHILD.run(
        child,
        "mission_submit_for_approval",
        mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=1),
        "ccoord",
    )
    assert child.mission is not None
    approve = mission_pb2.MissionApprove(submission_event_id=child.mission.latest_submission_event_id)
    r = CHILD.refused(child, "mission_approve", approve, "coord")
    assert r.reason == R.REJECTION_REASON_PRECONDITION_FAILED and r.metadata["root_owner_id"] == "alice"
    child = CHILD.run(child, "mission_approve", approve, "alice")  # the root owner first
    assert (
        child.mission.state == MS.MISSION_STATE_AWAITING_APPROVAL
        and child.mission.root_owner_approval_event_id
    )
    assert (
        CHILD.refused(child, "mission_approve", approve, "alice").reason
        == R.REJECTION_REASON_INVALID_TRANSITION
    )
    child = CHILD.run(child, "mission_approve", approve, "coord")
    assert child.mission.state == MS.MISSION_STATE_APPROVED
    # Without the policy, the root owner's reviewer Membership approves nothing.
    _, plain, _ = linked(parent_state())
    plain = CHILD.run(
        plain,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        "ccoord",
    )
    plain = CHILD.run(
        plain,
        "mission_submit_for_approval",
        mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=1),
        "ccoord",
    )
    assert plain.mission is not None
    own = mission_pb2.MissionApprove(submission_event_id=plain.mission.latest_submission_event_id)
    assert (
        CHILD.refused(plain, "mission_approve", own, "alice").reason == R.REJECTION_REASON_PERMISSION_DENIED
    )


# ---------------------------------------------------------------- down the tree (T07, T08) and compensation


@pytest.mark.req("MW-7.1-T07", "MW-10.2-T18")
def test_a_cancelled_parent_mission_cancels_its_running_children_and_their_work() -> None:
    after, child, _ = linked(parent_state())
    cancel = PARENT.decide(after, "mission_cancel", mission_pb2.MissionCancel(reason="budget cut"), "alice")
    assert not isinstance(cancel, Rejected)
    assert "grp_child" in [target for _, target in children.cross_group_effects(after, cancel)]
    source = event_of(cancel, "mission_cancelled")
    cancelled_parent = copy.deepcopy(after)
    for event in cancel:
        cancelled_parent = decider.evolve(cancelled_parent, event)
    child = CHILD.run(
        child,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        "ccoord",
    )
    inside = builders.contract(NOW, budget=common_pb2.ResourceVector(tokens=10))
    child = CHILD.run(
        child,
        "work_authorize",
        wp.WorkAuthorize(work_item_id="w1", title="w", contract=inside, coordinator_epoch=1),
        "ccoord",
    )
    down = decider.decide_linked(child, source, cancelled_parent, NOW)
    assert not isinstance(down, Rejected)
    assert [e.type for e in down] == ["mission.cancelled", "work.cancelled"]
    assert down[0].mission_cancelled.reason == "parent Mission cancelled: budget cut"
    done = copy.deepcopy(child)
    for event in down:
        done = decider.evolve(done, event)
    # ...and the child's end flows back up to release the reservation.
    assert children.cross_group_effects(child, down) == [(down[0].sequence, "grp_parent")]
    assert decider.decide_linked(done, source, cancelled_parent, NOW) == []  # already ended


@pytest.mark.req("MW-7.1-T08")
def test_a_failed_parent_mission_fails_its_children() -> None:
    after, child, _ = linked(parent_state())
    fail = PARENT.decide(
        after,
        "mission_terminate",
        mission_pb2.MissionTerminate(coordinator_epoch=1, reason="abandoned"),
        "coord",
    )
    assert not isinstance(fail, Rejected)
    down = decider.decide_linked(child, event_of(fail, "mission_failed"), after, NOW)
    assert not isinstance(down, Rejected) and down[0].type == "mission.failed"


@pytest.mark.req("MW-10.2-T14")
def test_a_cancelled_parent_work_item_cancels_its_child() -> None:
    after, child, _ = linked(parent_state())
    cancel = PARENT.decide(
        after,
        "work_cancel",
        wp.WorkCancel(work_item_id="wi", coordinator_epoch=1, reason="scope cut"),
        "coord",
    )
    assert not isinstance(cancel, Rejected)
    assert children.cross_group_effects(after, cancel) == [(cancel[-1].sequence, "grp_child")]
    down = decider.decide_linked(child, cancel[-1], after, NOW)
    assert not isinstance(down, Rejected) and down[0].mission_cancelled.reason.startswith(
        "parent WorkItem wi cancelled"
    )


@pytest.mark.req("MW-10.4-05")
def test_a_link_the_parent_refuses_is_compensated_by_cancelling_the_child() -> None:
    parent = parent_state()
    child, events = created(parent)
    source = event_of(events, "parent_linked")
    meanwhile = copy.deepcopy(parent)
    meanwhile.work_items[
        "wi"
    ].state = WS.WORK_ITEM_STATE_CANCELLED  # the parent moved on before the link landed
    refused = decider.decide_linked(meanwhile, source, child, NOW)
    assert isinstance(refused, Rejected) and refused.reason == R.REJECTION_REASON_TERMINAL_STATE
    compensation = decider.decide_compensation(child, source, refused, NOW)
    assert compensation[0].type == "mission.cancelled" and compensation[
        0
    ].mission_cancelled.reason.startswith("compensation:")
    assert compensation[0].causing_command_id != children.linked_command("grp_child", source).command_id
    # Linking twice appends once: the command id derives from the source event.
    once = apply_linked(parent, source, child)
    assert decider.decide_linked(once, source, child, NOW) == []
    assert (
        children.linked_command("grp_parent", source).command_id
        == children.linked_command("grp_parent", source).command_id
    )


@pytest.mark.req("MW-14-09", "MW-14-18", "MW-7.2-04")
def test_the_parents_replacement_coordinator_becomes_the_childs_mission_owner() -> None:
    after, child, _ = linked(parent_state())
    assert after.mission is not None and after.mission.coordinator is not None
    after.mission.coordinator.expires_at = NOW - timedelta(seconds=1)  # the parent's Coordinator lapsed
    replace = mission_pb2.MissionReplaceCoordinator(replaced_coordinator_epoch=1, coordinator_id="gcoord")
    events = PARENT.decide(after, "mission_replace_coordinator", replace, "alice")
    assert not isinstance(events, Rejected)
    source = event_of(events, "coordinator_lease_granted")
    assert "grp_child" in [target for _, target in children.cross_group_effects(after, events)]
    succeeded = apply_linked(child, source, after)
    assert succeeded.mission is not None and succeeded.mission.owner_id == "gcoord"
    assert (
        succeeded.members["gcoord"].role == Role.MEMBER_ROLE_MISSION_OWNER
        and not succeeded.members["coord"].active
    )
    # The successor approves the child's result; the replaced Coordinator no longer can.
    succeeded = CHILD.run(
        succeeded,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        "ccoord",
    )
    succeeded = CHILD.run(
        succeeded,
        "mission_submit_for_approval",
        mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=1),
        "ccoord",
    )
    assert succeeded.mission is not None
    approve = mission_pb2.MissionApprove(submission_event_id=succeeded.mission.latest_submission_event_id)
    assert (
        CHILD.refused(succeeded, "mission_approve", approve, "coord").reason
        == R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE
    )
    assert not isinstance(CHILD.decide(succeeded, "mission_approve", approve, "gcoord"), Rejected)
    # A replacement that is the child's own Coordinator leaves the owner as it was (MW-7.2-11).
    replace_by_child = mission_pb2.MissionReplaceCoordinator(
        replaced_coordinator_epoch=1, coordinator_id="ccoord"
    )
    by_child = PARENT.decide(after, "mission_replace_coordinator", replace_by_child, "alice")
    assert not isinstance(by_child, Rejected)
    assert decider.decide_linked(child, event_of(by_child, "coordinator_lease_granted"), after, NOW) == []
