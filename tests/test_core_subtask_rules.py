"""Parent Missions and subtasks (spec 14, MW-7.1-T03, MW-10.2-T15..T17) through decide, decide_linked,
decide_compensation and evolve: the exact events each half of a link appends (types and payloads),
the exact refusals with their metadata, and the state later rules read."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2, membership_pb2, mission_pb2, subtask_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.common import OrganizationPolicy
from missionweave_server.services.authority.state import ChildLink, GroupState
from tests import builders
from tests.children_fixtures import (
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


def payloads(events: list) -> list[tuple[str, object]]:
    return [(e.type, getattr(e, e.WhichOneof("payload"))) for e in events]


def accepted(decision: decider.Decision) -> list:
    assert not isinstance(decision, Rejected), decision
    return decision


def parent_scope(parent: GroupState) -> subtask_pb2.MissionScope:
    contract = parent.work_items["wi"].contract
    return subtask_pb2.MissionScope(
        permissions=contract.permissions, capabilities=contract.required_capabilities
    )


# ---------------------------------------------------------------- the child's half (T03, 14-02/09/19)


@pytest.mark.req("MW-7.1-T03", "MW-14-02", "MW-14-09", "MW-14-19")
def test_the_child_records_its_parent_link_and_the_root_owner_reviews_it() -> None:
    parent = parent_state()
    events = accepted(create(parent, mandatory=True))
    assert [e.type for e in events] == [
        "mission.created",
        "conversation.opened",
        "membership.granted",
        "membership.granted",
        "mission.coordinator_lease.granted",
        "mission.parent.linked",
        "membership.granted",
    ]
    created_payload = events[0].mission_created
    assert (created_payload.kind, created_payload.parent_mission_id, created_payload.parent_work_item_id) == (
        mission_pb2.MISSION_KIND_CHILD,
        "mis_parent",
        "wi",
    )
    assert created_payload.follows_up_mission_id == ""
    assert payloads(events)[5:] == [
        (
            "mission.parent.linked",
            subtask_pb2.ParentLinked(
                parent_mission_id="mis_parent",
                parent_group_id="grp_parent",
                parent_work_item_id="wi",
                root_owner_id="alice",
                depth=1,
                ancestor_group_ids=["grp_parent"],
                scope=parent_scope(parent),
                mandatory=True,
            ),
        ),
        (
            "membership.granted",
            membership_pb2.MembershipGranted(
                membership=membership_pb2.Membership(
                    member_id="alice",
                    group_id="grp_child",
                    membership_epoch=3,
                    role=Role.MEMBER_ROLE_REVIEWER,
                    visibility_start_sequence=1,
                    active=True,
                )
            ),
        ),
    ]
    child = decider.fold(events)
    assert child is not None and child.mission is not None
    m = child.mission
    assert (m.parent_group_id, m.ancestor_group_ids, m.root_owner_id, m.depth, m.mandatory) == (
        "grp_parent",
        ("grp_parent",),
        "alice",
        1,
        True,
    )
    assert m.scope == parent_scope(parent)


@pytest.mark.req("MW-14-19", "MW-7.2-11")
def test_a_root_owner_who_is_the_childs_coordinator_gets_no_second_membership() -> None:
    parent = parent_state()
    events = accepted(create(parent, coordinator_id="alice"))
    assert [e.type for e in events][-1] == "mission.parent.linked"


@pytest.mark.req("MW-14-03", "MW-14-19")
def test_a_grandchild_names_every_ancestor_and_the_root_owner() -> None:
    _, child, _ = linked(parent_state())
    child = CHILD.run(
        child,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        "ccoord",
    )
    child = CHILD.run(
        child,
        "work_authorize",
        wp.WorkAuthorize(
            work_item_id="wi",
            title="wi",
            contract=builders.contract(NOW, budget=common_pb2.ResourceVector(tokens=10)),
            coordinator_epoch=1,
        ),
        "ccoord",
    )
    group = CoreGroup("grp_grand", ctx_with(child), NOW)
    body = create_body(
        child, definition=child_definition(owner_id="ccoord", budget=common_pb2.ResourceVector(tokens=5))
    )
    body.coordinator_id = "gcoord"
    events = accepted(group.decide(None, "mission_create_child", body, "ccoord"))
    link = event_of(events, "parent_linked").parent_linked
    assert (link.root_owner_id, link.depth, list(link.ancestor_group_ids)) == (
        "alice",
        2,
        ["grp_parent", "grp_child"],
    )
    r = CoreGroup("grp_parent", ctx_with(child), NOW).refused(None, "mission_create_child", body, "ccoord")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_MISSION_CYCLE, {})
    assert r.message.endswith("the parent-child graph stays acyclic (MW-14-03)")


@pytest.mark.req("MW-7.1-T03", "MW-14-02")
def test_create_child_refusals_name_the_field() -> None:
    parent = parent_state()

    def meta(**kw: object) -> tuple[int, dict[str, str]]:
        r = refusal(parent, **kw)
        return r.reason, r.metadata

    assert meta(parent_group_id="") == (R.REJECTION_REASON_NOT_FOUND, {"field": "body.parent_group_id"})
    assert meta(parent_group_id="grp_zzz") == (
        R.REJECTION_REASON_NOT_FOUND,
        {"field": "body.parent_group_id"},
    )
    assert meta(parent_mission_id="mis_other") == (
        R.REJECTION_REASON_NOT_FOUND,
        {"field": "body.parent_mission_id"},
    )
    accepted(create(parent, parent_mission_id=""))  # the Group alone names the parent
    assert meta(parent_work_item_id="nope") == (
        R.REJECTION_REASON_NOT_FOUND,
        {"field": "body.parent_work_item_id"},
    )
    assert meta(definition=child_definition(owner_id="worker")) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.definition.owner_id"},
    )
    assert meta(definition=child_definition(title="")) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.definition.title"},
    )
    no_mission = GroupState(group_id="grp_parent")
    r = CoreGroup("grp_child", ctx_with(no_mission), NOW).refused(
        None, "mission_create_child", create_body(parent), "coord"
    )
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_NOT_FOUND, {"field": "body.parent_group_id"})


@pytest.mark.req("MW-7.1-06", "MW-7.1-T03")
def test_an_ended_parent_mission_creates_no_child() -> None:
    parent = PARENT.run(parent_state(), "mission_cancel", mission_pb2.MissionCancel(reason="stop"), "alice")
    r = refusal(parent)
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_TERMINAL_STATE, {"state": "MISSION_STATE_CANCELLED"})


@pytest.mark.req("MW-10.2-T15")
@pytest.mark.parametrize(
    "state_value, reason, name",
    [
        (WS.WORK_ITEM_STATE_VERIFIED, R.REJECTION_REASON_TERMINAL_STATE, "verified"),
        (WS.WORK_ITEM_STATE_CANCELLED, R.REJECTION_REASON_TERMINAL_STATE, "cancelled"),
        (WS.WORK_ITEM_STATE_SUBMITTED, R.REJECTION_REASON_INVALID_TRANSITION, "submitted"),
        (WS.WORK_ITEM_STATE_FAILED, R.REJECTION_REASON_INVALID_TRANSITION, "failed"),
    ],
)
def test_t15_only_open_to_blocked_work_items_are_promoted(state_value: int, reason: int, name: str) -> None:
    r = refusal(parent_state(state_value))
    assert (r.reason, r.metadata) == (reason, {"state": name})


@pytest.mark.req("MW-14-14")
def test_a_work_item_with_a_running_child_gets_no_second_one() -> None:
    after, _child, _ = linked(parent_state())
    r = refusal(after)
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_PRECONDITION_FAILED,
        {"child_mission_id": "mis_child"},
    )
    assert (
        r.message
        == "wi already has a running child Mission mis_child; a replacement follows its end (MW-14-14)"
    )


# ---------------------------------------------------------------- carving (14-04)


@pytest.mark.req("MW-14-04")
def test_the_childs_budget_may_use_exactly_what_the_work_item_has_left() -> None:
    parent = parent_state()
    item = parent.work_items["wi"]
    item.used["tokens"] = 4_000
    whole = common_pb2.ResourceVector(currency="EUR", financial_micros=1_000_000, tokens=6_000, tool_calls=50)
    accepted(create(parent, definition=child_definition(budget=whole)))
    over = copy.deepcopy(whole)
    over.tokens += 1
    r = refusal(parent, definition=child_definition(budget=over))
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_CHILD_BUDGET_EXCEEDS_PARENT,
        {"dimension": "tokens", "limit": "6000", "budget": "work_item"},
    )
    assert r.message == "tokens: the child asks for 6001, the parent work item has 6000 left (MW-14-04)"
    item.used["tokens"] = 20_000  # overspent: nothing left, reported as 0
    r = refusal(parent, definition=child_definition(budget=common_pb2.ResourceVector(tokens=1)))
    assert r.metadata == {"dimension": "tokens", "limit": "0", "budget": "work_item"}
    assert r.message == "tokens: the child asks for 1, the parent work item has 0 left (MW-14-04)"


@pytest.mark.req("MW-14-04")
def test_the_childs_budget_is_within_what_the_mission_has_left_after_use_and_reservations() -> None:
    parent = parent_state()
    parent.mission_used["tool_calls"] = 300
    parent.reserved["tool_calls"] = 180  # the Mission's 500 tool calls: 20 left
    accepted(create(parent, definition=child_definition(budget=common_pb2.ResourceVector(tool_calls=20))))
    r = refusal(parent, definition=child_definition(budget=common_pb2.ResourceVector(tool_calls=21)))
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_CHILD_BUDGET_EXCEEDS_PARENT,
        {"dimension": "tool_calls", "limit": "20", "budget": "mission"},
    )
    assert r.message == "tool_calls: the child asks for 21, the parent mission has 20 left (MW-14-04)"


@pytest.mark.req("MW-14-04")
def test_money_is_carved_in_the_parents_currency() -> None:
    parent = parent_state()
    usd = common_pb2.ResourceVector(currency="USD", financial_micros=1)
    r = refusal(parent, definition=child_definition(budget=usd))
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.definition.budget.currency"},
    )
    assert r.message == "body.definition.budget.currency: must be the parent's EUR"
    accepted(
        create(
            parent, definition=child_definition(budget=common_pb2.ResourceVector(currency="USD", tokens=1))
        )
    )


@pytest.mark.req("MW-14-04")
def test_the_childs_deadline_is_at_most_the_earlier_of_the_work_items_and_the_missions() -> None:
    parent = parent_state()
    item_deadline = NOW + timedelta(days=1)
    accepted(create(parent, definition=child_definition(deadline=to_timestamp(item_deadline))))
    r = refusal(
        parent, definition=child_definition(deadline=to_timestamp(item_deadline + timedelta(seconds=1)))
    )
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_CHILD_DEADLINE_EXCEEDS_PARENT,
        {"limit": item_deadline.isoformat()},
    )
    assert r.message == f"the child's deadline is after its parent's {item_deadline.isoformat()} (MW-14-04)"
    # A WorkItem without a deadline: the Mission's (NOW + 3 days) bounds the child.
    parent.work_items["wi"].contract.ClearField("deadline")
    mission_deadline = NOW + timedelta(days=3)
    accepted(create(parent, definition=child_definition(deadline=to_timestamp(mission_deadline))))
    r = refusal(
        parent, definition=child_definition(deadline=to_timestamp(mission_deadline + timedelta(seconds=1)))
    )
    assert r.metadata == {"limit": mission_deadline.isoformat()}
    # A WorkItem deadline beyond the Mission's: the Mission's still bounds the child.
    parent.work_items["wi"].contract.deadline.CopyFrom(to_timestamp(NOW + timedelta(days=9)))
    assert refusal(
        parent, definition=child_definition(deadline=to_timestamp(mission_deadline + timedelta(seconds=1)))
    ).metadata == {
        "limit": mission_deadline.isoformat(),
    }


@pytest.mark.req("MW-14-04")
def test_a_given_scope_is_the_childs_and_each_exceeding_entry_is_named() -> None:
    parent = parent_state()
    narrower = subtask_pb2.MissionScope(
        permissions=wp.ExecutionPermissions(allowed_tools=["python.exec"], allowed_data=["s3://reports/q3"]),
        capabilities=[
            membership_pb2.Capability(capability_id="code.python", version="3.12")
        ],  # the same version is within
    )
    events = accepted(create(parent, scope=narrower))
    assert event_of(events, "parent_linked").parent_linked.scope == narrower
    assert decider.fold(events).mission.scope == narrower  # type: ignore[union-attr]
    for scope, check, value in (
        (
            subtask_pb2.MissionScope(
                permissions=wp.ExecutionPermissions(allowed_tools=["web.search", "shell.exec"])
            ),
            "allowed_tools",
            "shell.exec",
        ),
        (
            subtask_pb2.MissionScope(
                permissions=wp.ExecutionPermissions(allowed_egress_hosts=["evil.example"])
            ),
            "allowed_egress_hosts",
            "evil.example",
        ),
        (
            subtask_pb2.MissionScope(
                capabilities=[membership_pb2.Capability(capability_id="gpu.cuda", version="1")]
            ),
            "capability",
            "gpu.cuda",
        ),
        (
            subtask_pb2.MissionScope(
                capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.12.1")]
            ),
            "capability",
            "code.python",
        ),
    ):
        r = refusal(parent, scope=scope)
        assert (r.reason, r.metadata) == (
            R.REJECTION_REASON_CHILD_SCOPE_EXCEEDS_PARENT,
            {"check": check, "value": value},
        ), scope
    r = refusal(
        parent,
        scope=subtask_pb2.MissionScope(permissions=wp.ExecutionPermissions(allowed_tools=["shell.exec"])),
    )
    assert (
        r.message == "allowed_tools: 'shell.exec' is not allowed by the parent WorkItem's contract (MW-14-04)"
    )
    r = refusal(
        parent,
        scope=subtask_pb2.MissionScope(
            capabilities=[membership_pb2.Capability(capability_id="gpu.cuda", version="1")]
        ),
    )
    assert r.message == "capability gpu.cuda is not within the parent WorkItem's contract (MW-14-04)"
    r = refusal(
        parent,
        scope=subtask_pb2.MissionScope(
            capabilities=[membership_pb2.Capability(capability_id="code.python", version="4")]
        ),
    )
    assert r.message == "code.python 4 is above the parent WorkItem's contract's 3.12 (MW-14-04)"


@pytest.mark.req("MW-14-04")
def test_work_in_a_child_is_checked_against_the_childs_own_scope() -> None:
    parent = parent_state()
    narrower = subtask_pb2.MissionScope(
        permissions=wp.ExecutionPermissions(allowed_tools=["python.exec"]),
        capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.11")],
    )
    child = decider.fold(accepted(create(parent, scope=narrower)))
    assert child is not None
    child = CHILD.run(
        child,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        "ccoord",
    )

    def authorize(contract: wp.WorkContract) -> decider.Decision:
        body = wp.WorkAuthorize(work_item_id="w1", title="w", contract=contract, coordinator_epoch=1)
        return CHILD.decide(child, "work_authorize", body, "ccoord")

    ok = builders.contract(NOW, budget=common_pb2.ResourceVector(tokens=10))
    ok.permissions.allowed_tools.append("python.exec")
    ok.required_capabilities.append(membership_pb2.Capability(capability_id="code.python", version="3.10"))
    accepted(authorize(ok))
    wide = copy.deepcopy(ok)
    wide.permissions.allowed_tools.append(
        "web.search"
    )  # the parent's contract allows it, the child's scope does not
    r = authorize(wide)
    assert isinstance(r, Rejected)
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_CHILD_SCOPE_EXCEEDS_PARENT,
        {"check": "allowed_tools", "value": "web.search"},
    )
    assert r.message == "allowed_tools: 'web.search' is not allowed by the child Mission's scope (MW-14-04)"
    high = copy.deepcopy(ok)
    high.required_capabilities[0].version = "3.12"
    r = authorize(high)
    assert isinstance(r, Rejected) and r.metadata == {"check": "capability", "value": "code.python"}
    # A root Mission has no scope of its own: its work is not checked against one.
    root = PARENT.decide(
        parent,
        "work_authorize",
        wp.WorkAuthorize(work_item_id="w9", title="w", contract=wide, coordinator_epoch=1),
        "coord",
    )
    accepted(root)


@pytest.mark.req("MW-14-04")
def test_the_childs_risk_class_is_at_most_the_lower_of_the_missions_and_the_work_items() -> None:
    def policy(risk: int, **kw: object) -> mission_pb2.RiskPolicy:
        return mission_pb2.RiskPolicy(risk_class=risk, execution_approver_ids=["alice"], **kw)  # type: ignore[arg-type]

    parent = parent_state(risk_class=mission_pb2.RISK_CLASS_MEDIUM)
    parent.mission.definition.risk_policy.risk_class = mission_pb2.RISK_CLASS_HIGH  # type: ignore[union-attr]
    accepted(create(parent, definition=child_definition(risk_policy=policy(mission_pb2.RISK_CLASS_MEDIUM))))
    r = refusal(parent, definition=child_definition(risk_policy=policy(mission_pb2.RISK_CLASS_HIGH)))
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_CHILD_AUTHORITY_EXCEEDS_PARENT,
        {"check": "risk_class"},
    )
    assert r.message == "risk class RISK_CLASS_HIGH is above the parent's RISK_CLASS_MEDIUM (MW-14-04)"
    parent.mission.definition.risk_policy.risk_class = mission_pb2.RISK_CLASS_LOW  # type: ignore[union-attr]
    r = refusal(parent, definition=child_definition(risk_policy=policy(mission_pb2.RISK_CLASS_MEDIUM)))
    assert r.message == "risk class RISK_CLASS_MEDIUM is above the parent's RISK_CLASS_LOW (MW-14-04)"
    # Neither names a class: no ceiling.
    parent.mission.definition.risk_policy.risk_class = 0  # type: ignore[union-attr]
    parent.work_items["wi"].contract.risk_class = 0
    accepted(create(parent, definition=child_definition(risk_policy=policy(mission_pb2.RISK_CLASS_HIGH))))
    # Only the WorkItem names one: it bounds the child.
    parent.work_items["wi"].contract.risk_class = mission_pb2.RISK_CLASS_LOW
    assert refusal(
        parent, definition=child_definition(risk_policy=policy(mission_pb2.RISK_CLASS_MEDIUM))
    ).metadata == {"check": "risk_class"}


@pytest.mark.req("MW-14-04")
def test_the_childs_execution_approval_threshold_and_approvers_are_within_the_parents() -> None:
    parent = parent_state()
    parent.mission.definition.risk_policy.execution_approval_threshold = mission_pb2.RISK_CLASS_MEDIUM  # type: ignore[union-attr]

    def policy(threshold: int, approvers: list[str]) -> mission_pb2.MissionDefinition:
        return child_definition(
            risk_policy=mission_pb2.RiskPolicy(
                risk_class=mission_pb2.RISK_CLASS_LOW,
                execution_approval_threshold=threshold,
                execution_approver_ids=approvers,  # type: ignore[arg-type]
            )
        )

    accepted(create(parent, definition=policy(mission_pb2.RISK_CLASS_MEDIUM, ["alice"])))
    accepted(create(parent, definition=policy(mission_pb2.RISK_CLASS_LOW, ["alice"])))
    for threshold in (0, mission_pb2.RISK_CLASS_HIGH):  # none at all would be wider than the parent's
        r = refusal(parent, definition=policy(threshold, ["alice"]))
        assert (r.reason, r.metadata) == (
            R.REJECTION_REASON_CHILD_AUTHORITY_EXCEEDS_PARENT,
            {"check": "execution_approval_threshold"},
        )
        assert (
            r.message
            == "the execution approval threshold must be at most the parent's RISK_CLASS_MEDIUM (MW-14-04)"
        )
    r = refusal(parent, definition=policy(mission_pb2.RISK_CLASS_LOW, ["alice", "worker", "bob"]))
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_CHILD_AUTHORITY_EXCEEDS_PARENT,
        {"check": "execution_approver_ids"},
    )
    assert r.message == (
        "execution approvers bob, worker are not the parent's (alice); name the parent's approvers explicitly (MW-14-04)"
    )
    # The parent's named approvers bound the child's.
    parent.mission.definition.risk_policy.execution_approver_ids[:] = ["bob", "alice"]  # type: ignore[union-attr]
    accepted(create(parent, definition=policy(mission_pb2.RISK_CLASS_LOW, ["bob"])))
    r = refusal(parent, definition=policy(mission_pb2.RISK_CLASS_LOW, ["worker"]))
    assert r.message.startswith("execution approvers worker are not the parent's (alice, bob)")


# ---------------------------------------------------------------- depth (14-05..08)


def deep_parent(depth: int) -> GroupState:
    parent = parent_state()
    assert parent.mission is not None
    parent.mission.depth = depth
    parent.mission.ancestor_group_ids = tuple(f"grp_a{i}" for i in range(depth))
    return parent


def depth_approval(**kw: object) -> subtask_pb2.MissionApproveChildDepth:
    fields: dict[str, object] = {
        "parent_work_item_id": "wi",
        "max_depth": 3,
        "reason": "the audit needs one more level",
    }
    return subtask_pb2.MissionApproveChildDepth(**{**fields, **kw})  # type: ignore[arg-type]


@pytest.mark.req("MW-14-05", "MW-14-06", "MW-14-07", "MW-14-08")
@pytest.mark.parametrize("actor", ["alice", "ops"])
def test_a_deeper_child_is_approved_by_the_owner_or_policy_as_a_recorded_event(actor: str) -> None:
    parent = deep_parent(1)
    accepted(create(parent))  # depth 2: the default maximum itself needs no approval
    parent = deep_parent(2)
    r = refusal(parent)
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_DEPTH_APPROVAL_REQUIRED,
        {"depth": "3", "max_depth": "2"},
    )
    events = accepted(PARENT.decide(parent, "mission_approve_child_depth", depth_approval(), actor))
    assert payloads(events) == [
        (
            "mission.child_depth.approved",
            subtask_pb2.ChildDepthApproved(
                parent_work_item_id="wi",
                max_depth=3,
                reason="the audit needs one more level",
            ),
        )
    ]
    approved = decider.evolve(copy.deepcopy(parent), events[0])
    assert approved.depth_approvals == {events[0].event_id: ("wi", 3)}
    child_events = accepted(create(approved, depth_approval_event_id=events[0].event_id))
    assert event_of(child_events, "parent_linked").parent_linked.depth == 3
    # Deeper than approved, or without citing the approval, is refused.
    deeper = deep_parent(3)
    deeper.depth_approvals = dict(approved.depth_approvals)
    r = refusal(deeper, depth_approval_event_id=events[0].event_id)
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_DEPTH_APPROVAL_REQUIRED,
        {"depth": "4", "max_depth": "2"},
    )
    assert refusal(approved).reason == R.REJECTION_REASON_DEPTH_APPROVAL_REQUIRED


@pytest.mark.req("MW-14-06")
def test_depth_approval_refusals() -> None:
    parent = parent_state()

    def refused(
        body: subtask_pb2.MissionApproveChildDepth, state: GroupState = parent, actor: str = "alice"
    ) -> tuple[int, dict[str, str]]:
        r = PARENT.refused(state, "mission_approve_child_depth", body, actor)
        return r.reason, r.metadata

    assert refused(depth_approval(parent_work_item_id="nope")) == (
        R.REJECTION_REASON_NOT_FOUND,
        {"field": "body.parent_work_item_id"},
    )
    for depth in (2, 65):
        assert refused(depth_approval(max_depth=depth)) == (
            R.REJECTION_REASON_INVALID_ARGUMENT,
            {"field": "body.max_depth"},
        )
    accepted(PARENT.decide(parent, "mission_approve_child_depth", depth_approval(max_depth=64), "alice"))
    assert refused(depth_approval(reason="")) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.reason"},
    )
    ended_parent = PARENT.run(parent, "mission_cancel", mission_pb2.MissionCancel(reason="stop"), "alice")
    assert refused(depth_approval(), ended_parent) == (
        R.REJECTION_REASON_TERMINAL_STATE,
        {"state": "MISSION_STATE_CANCELLED"},
    )
    # A deeper default moves the lower bound of an approval with it.
    deeper = decider.DecisionContext(NOW, CTX.identities, policy=OrganizationPolicy(max_mission_depth=3))
    r = PARENT.refused(parent, "mission_approve_child_depth", depth_approval(max_depth=3), "alice", deeper)
    assert r.metadata == {"field": "body.max_depth"}


# ---------------------------------------------------------------- the parent's half (T15)


def subtask_linked(
    parent: GroupState, child: GroupState, source_event_id: str, **kw: object
) -> subtask_pb2.SubtaskLinked:
    m = child.mission
    assert m is not None
    fields: dict[str, object] = {
        "work_item_id": "wi",
        "child_mission_id": "mis_child",
        "child_group_id": "grp_child",
        "source_event_id": source_event_id,
        "reserved": m.definition.budget,
        "mandatory": False,
        "blocker": wp.Blocker(
            blocker_id="subtask:mis_child",
            kind=wp.BLOCKER_KIND_SUBTASK,
            description=f"child Mission mis_child ({m.definition.title}) is running",
            required_resolution="the child Mission mis_child ends",
            child_mission_id="mis_child",
        ),
        "previous_state": parent.work_items["wi"].state,
    }
    return builders.with_overrides(subtask_pb2.SubtaskLinked(), {**fields, **kw})


@pytest.mark.req("MW-10.2-T15", "MW-14-02")
def test_t15_an_open_work_item_blocks_on_its_child_with_the_budget_reserved() -> None:
    parent = parent_state()
    child, events = created(parent)
    source = event_of(events, "parent_linked")
    linked_events = accepted(decider.decide_linked(parent, source, child, NOW))
    assert payloads(linked_events) == [
        ("work.subtask.linked", subtask_linked(parent, child, source.event_id))
    ]
    assert linked_events[0].actor_id == "authority"
    after = apply_linked(parent, source, child)
    item = after.work_items["wi"]
    assert item.children == [
        ChildLink(
            "mis_child",
            "grp_child",
            {
                "financial_micros": 500_000,
                "tokens": 5_000,
                "wall_clock_ms": 0,
                "compute_ms": 0,
                "tool_calls": 20,
                "side_effects": 0,
            },
            False,
        )
    ]
    assert (item.state, item.blockers) == (WS.WORK_ITEM_STATE_BLOCKED, ("the child Mission mis_child ends",))
    assert after.reserved == {
        "financial_micros": 500_000,
        "tokens": 5_000,
        "wall_clock_ms": 0,
        "compute_ms": 0,
        "tool_calls": 20,
        "side_effects": 0,
    }


@pytest.mark.req("MW-10.2-T15")
def test_t15_an_offered_work_items_open_offers_are_withdrawn() -> None:
    parent = parent_state(WS.WORK_ITEM_STATE_OFFERED)
    child, events = created(parent)
    source = event_of(events, "parent_linked")
    linked_events = accepted(decider.decide_linked(parent, source, child, NOW))
    assert payloads(linked_events) == [
        (
            "work.offers.withdrawn",
            wp.WorkOffersWithdrawn(
                work_item_id="wi",
                offer_ids=["offer-1"],
                reason=wp.OFFER_WITHDRAWAL_REASON_WORK_ITEM_CLOSED,
            ),
        ),
        ("work.subtask.linked", subtask_linked(parent, child, source.event_id)),
    ]
    after = apply_linked(parent, source, child)
    assert after.work_items["wi"].offers["offer-1"].open is False
    # A closed offer is not withdrawn again.
    parent.work_items["wi"].offers["offer-1"].open = False
    assert [e.type for e in accepted(decider.decide_linked(parent, source, child, NOW))] == [
        "work.subtask.linked"
    ]


@pytest.mark.req("MW-10.2-T15", "MW-14-02")
def test_t15_an_active_work_items_lease_ends_and_its_ownership_is_protected_until_the_childs_deadline() -> (
    None
):
    parent = parent_state(WS.WORK_ITEM_STATE_ACTIVE)
    child, events = created(parent, mandatory=True)
    source = event_of(events, "parent_linked")
    linked_events = accepted(decider.decide_linked(parent, source, child, NOW))
    deadline = child.mission.definition.deadline  # type: ignore[union-attr]
    assert payloads(linked_events) == [
        (
            "work.subtask.linked",
            subtask_linked(
                parent,
                child,
                source.event_id,
                mandatory=True,
                ended_lease_id="lease-1",
                ownership_protected_until=deadline,
            ),
        )
    ]
    item = apply_linked(parent, source, child).work_items["wi"]
    assert item.lease is None and item.owner is not None and item.owner.agent_id == "worker"
    assert item.owner.expires_at == NOW + timedelta(
        hours=12
    )  # the child's deadline, later than the ownership's
    assert item.children[0].mandatory is True and item.state == WS.WORK_ITEM_STATE_BLOCKED


@pytest.mark.req("MW-10.2-T15", "MW-10.4-05")
def test_a_link_the_parent_refuses_is_compensated_with_the_refusal_as_the_reason() -> None:
    parent = parent_state()
    child, events = created(parent)
    source = event_of(events, "parent_linked")
    parent.work_items["wi"].state = WS.WORK_ITEM_STATE_VERIFIED  # the parent moved on meanwhile
    refused = decider.decide_linked(parent, source, child, NOW)
    assert isinstance(refused, Rejected)
    assert (refused.reason, refused.metadata) == (R.REJECTION_REASON_TERMINAL_STATE, {"state": "verified"})
    compensation = decider.decide_compensation(child, source, refused, NOW)
    assert payloads(compensation) == [
        (
            "mission.cancelled",
            mission_pb2.MissionCancelled(
                reason=f"compensation: the parent Group grp_parent refused the link: {refused.message}",
            ),
        )
    ]
    assert compensation[0].actor_id == "authority"
    done = copy.deepcopy(child)
    for event in compensation:
        done = decider.evolve(done, event)
    assert done.mission.state == MS.MISSION_STATE_CANCELLED  # type: ignore[union-attr]
    assert decider.decide_compensation(done, source, refused, NOW) == []  # already ended
    # Only a refused link is compensated: another effect has nothing to undo.
    other = event_of(events, "mission_created")
    assert decider.decide_compensation(child, other, refused, NOW) == []


# ---------------------------------------------------------------- the child's end (T16, T17)


def subtask_ended(child: GroupState, source, **kw: object) -> subtask_pb2.SubtaskEnded:
    fields: dict[str, object] = {
        "work_item_id": "wi",
        "child_mission_id": "mis_child",
        "child_group_id": "grp_child",
        "source_event_id": source.event_id,
    }
    return builders.with_overrides(subtask_pb2.SubtaskEnded(), {**fields, **kw})


def failure_evidence(source, criterion: str, summary: str) -> wp.Evidence:
    return wp.Evidence(
        evidence_id=ids.derived_id("evd", "grp_child", source.event_id),
        subject=wp.EvidenceSubject(work_item_id="wi"),
        producer_id=source.actor_id,
        produced_at=source.recorded_at,
        method=wp.EVIDENCE_METHOD_FAILURE_OBSERVATION,
        result=wp.EVIDENCE_RESULT_FAIL,
        criterion=criterion,
        summary=summary,
    )


@pytest.mark.req("MW-10.2-T16", "MW-14-11")
def test_t16_an_approved_childs_result_is_its_parent_work_items_evidence_and_artifacts() -> None:
    after, child, _ = linked(parent_state(WS.WORK_ITEM_STATE_ACTIVE))
    child.mission_used["tokens"] = 1_234
    approved, end = ended(child, "approved")
    events = accepted(decider.decide_linked(after, end, approved, NOW))
    evidence = wp.Evidence(
        evidence_id=ids.derived_id("evd", "grp_child", end.event_id),
        subject=wp.EvidenceSubject(work_item_id="wi"),
        producer_id="coord",
        produced_at=end.recorded_at,
        method=wp.EVIDENCE_METHOD_APPROVAL,
        result=wp.EVIDENCE_RESULT_PASS,
        criterion="child Mission mis_child approved by its MissionOwner",
        summary="",
    )
    assert payloads(events) == [
        (
            "work.subtask.ended",
            subtask_ended(
                approved,
                end,
                outcome=MS.MISSION_STATE_APPROVED,
                evidence=evidence,
                artifacts=[builders.artifact("c")],
                child_used=common_pb2.ResourceVector(currency="EUR", tokens=1_234),
                resulting_state=WS.WORK_ITEM_STATE_VERIFIED,
            ),
        )
    ]
    final = apply_linked(after, end, approved)
    item = final.work_items["wi"]
    assert item.evidence == {evidence.evidence_id: ("", wp.EVIDENCE_RESULT_PASS, "coord")}
    assert (item.accepted_evidence_ids, item.blockers, item.owner, item.state) == (
        (evidence.evidence_id,),
        (),
        None,
        WS.WORK_ITEM_STATE_VERIFIED,
    )
    assert item.children[0].running is False
    assert (
        item.used["tokens"],
        final.mission_used["tokens"],
        final.reserved["tokens"],
        final.reserved["tool_calls"],
    ) == (1_234, 1_234, 0, 0)


@pytest.mark.req("MW-10.2-T17", "MW-14-12", "MW-14-13")
@pytest.mark.parametrize("how", ["failed", "cancelled"])
def test_t17_a_failed_or_cancelled_child_blocks_its_parent_work_item_with_failure_evidence(how: str) -> None:
    after, child, _ = linked(parent_state())
    child.mission_used["tool_calls"] = 3
    done, end = ended(child, how)
    reason = "the ledger is missing" if how == "failed" else "not needed"
    outcome = MS.MISSION_STATE_FAILED if how == "failed" else MS.MISSION_STATE_CANCELLED
    events = accepted(decider.decide_linked(after, end, done, NOW))
    assert payloads(events) == [
        (
            "work.subtask.ended",
            subtask_ended(
                done,
                end,
                outcome=outcome,
                evidence=failure_evidence(end, f"child Mission mis_child ended {how}", reason),
                child_used=common_pb2.ResourceVector(currency="EUR", tool_calls=3),
                resulting_state=WS.WORK_ITEM_STATE_BLOCKED,
                reason=reason,
            ),
        )
    ]
    final = apply_linked(after, end, done)
    item = final.work_items["wi"]
    assert item.blockers == (
        "the child Mission mis_child ended; replan, correct the scope, create a replacement child or cancel (MW-14-14)",
    )
    assert item.state == WS.WORK_ITEM_STATE_BLOCKED and item.accepted_evidence_ids == ()
    assert (item.used["tool_calls"], final.reserved["tool_calls"]) == (3, 0)


@pytest.mark.req("MW-10.2-T17", "MW-14-15")
def test_t17_a_mandatory_child_whose_policy_fails_the_parent_fails_its_work_item() -> None:
    after, child, _ = linked(
        parent_state(WS.WORK_ITEM_STATE_ACTIVE, subtask_failure_policy=wp.SUBTASK_FAILURE_POLICY_FAIL_PARENT),
        mandatory=True,
    )
    done, end = ended(child, "cancelled")
    events = accepted(decider.decide_linked(after, end, done, NOW))
    assert events[0].subtask_ended.resulting_state == WS.WORK_ITEM_STATE_FAILED
    item = apply_linked(after, end, done).work_items["wi"]
    assert (item.state, item.owner) == (WS.WORK_ITEM_STATE_FAILED, None)


@pytest.mark.req("MW-10.2-T16", "MW-10.2-T17")
@pytest.mark.parametrize("how", ["approved", "failed"])
def test_a_parent_work_item_that_ended_first_keeps_its_state_and_takes_only_the_charge(how: str) -> None:
    after, child, _ = linked(parent_state())
    child.mission_used["tokens"] = 7
    for end_state in (WS.WORK_ITEM_STATE_CANCELLED, WS.WORK_ITEM_STATE_FAILED):
        item = after.work_items["wi"]
        item.state = end_state
        done, end = ended(child, how)
        events = accepted(decider.decide_linked(after, end, done, NOW))
        assert events[0].subtask_ended.resulting_state == end_state
        final = apply_linked(after, end, done)
        assert (final.work_items["wi"].state, final.reserved["tokens"], final.mission_used["tokens"]) == (
            end_state,
            0,
            7,
        )


@pytest.mark.req("MW-16-02", "MW-10.2-T16")
def test_an_end_for_another_or_no_running_child_appends_nothing() -> None:
    after, child, _ = linked(parent_state())
    done, end = ended(child, "failed")
    stranger = copy.deepcopy(done)
    stranger.group_id = "grp_other"  # not the child the WorkItem waits on
    assert decider.decide_linked(after, end, stranger, NOW) == []
    orphan = copy.deepcopy(done)
    orphan.mission.parent_work_item_id = "gone"  # type: ignore[union-attr]
    assert decider.decide_linked(after, end, orphan, NOW) == []
    assert decider.decide_linked(parent_state(), end, done, NOW) == []  # never linked


# ---------------------------------------------------------------- down the tree (T07, T08, 14-09/18)


@pytest.mark.req("MW-7.1-T07", "MW-7.1-T08", "MW-10.2-T14")
def test_a_parents_end_reaches_its_child_with_the_parents_reason() -> None:
    after, child, _ = linked(parent_state())
    cancel = accepted(
        PARENT.decide(after, "mission_cancel", mission_pb2.MissionCancel(reason="budget cut"), "alice")
    )
    down = accepted(decider.decide_linked(child, event_of(cancel, "mission_cancelled"), after, NOW))
    assert payloads(down) == [
        ("mission.cancelled", mission_pb2.MissionCancelled(reason="parent Mission cancelled: budget cut"))
    ]
    fail = accepted(
        PARENT.decide(
            after,
            "mission_terminate",
            mission_pb2.MissionTerminate(coordinator_epoch=1, reason="abandoned"),
            "coord",
        )
    )
    down = accepted(decider.decide_linked(child, event_of(fail, "mission_failed"), after, NOW))
    assert payloads(down) == [
        ("mission.failed", mission_pb2.MissionFailed(reason="parent Mission failed: abandoned"))
    ]
    failed_child = decider.evolve(copy.deepcopy(child), down[0])
    assert failed_child.mission.state == MS.MISSION_STATE_FAILED  # type: ignore[union-attr]
    assert decider.decide_linked(failed_child, event_of(fail, "mission_failed"), after, NOW) == []
    work = accepted(
        PARENT.decide(
            after,
            "work_cancel",
            wp.WorkCancel(work_item_id="wi", coordinator_epoch=1, reason="scope cut"),
            "coord",
        )
    )
    down = accepted(decider.decide_linked(child, event_of(work, "work_cancelled"), after, NOW))
    assert payloads(down) == [
        ("mission.cancelled", mission_pb2.MissionCancelled(reason="parent WorkItem wi cancelled: scope cut"))
    ]
    # A long reason is cut to the event's 4096 characters.
    long = accepted(
        PARENT.decide(after, "mission_cancel", mission_pb2.MissionCancel(reason="x" * 4096), "alice")
    )
    down = accepted(decider.decide_linked(child, event_of(long, "mission_cancelled"), after, NOW))
    assert down[0].mission_cancelled.reason == ("parent Mission cancelled: " + "x" * 4096)[:4096]
    # Any other event of the parent leaves the child as it is.
    directive = accepted(
        PARENT.decide(
            after, "mission_issue_directive", mission_pb2.MissionIssueDirective(directive="go"), "alice"
        )
    )
    assert decider.decide_linked(child, directive[0], after, NOW) == []


@pytest.mark.req("MW-14-09", "MW-14-18", "MW-7.2-04")
def test_the_parents_replacement_coordinator_succeeds_as_the_childs_owner() -> None:
    after, child, _ = linked(parent_state())
    after.mission.coordinator.expires_at = NOW - timedelta(seconds=1)  # type: ignore[union-attr]
    replace = mission_pb2.MissionReplaceCoordinator(replaced_coordinator_epoch=1, coordinator_id="gcoord")
    source = event_of(
        accepted(PARENT.decide(after, "mission_replace_coordinator", replace, "alice")),
        "coordinator_lease_granted",
    )
    down = accepted(decider.decide_linked(child, source, after, NOW))
    assert payloads(down) == [
        (
            "membership.granted",
            membership_pb2.MembershipGranted(
                membership=membership_pb2.Membership(
                    member_id="gcoord",
                    group_id="grp_child",
                    membership_epoch=child.last_membership_epoch + 1,
                    role=Role.MEMBER_ROLE_MISSION_OWNER,
                    visibility_start_sequence=1,
                    active=True,
                )
            ),
        ),
        (
            "membership.revoked",
            membership_pb2.MembershipRevoked(
                member_id="coord",
                membership_epoch=1,
                reason="replaced as the parent Mission's Coordinator",
            ),
        ),
        (
            "mission.owner.replaced",
            subtask_pb2.MissionOwnerReplaced(
                previous_owner_id="coord", owner_id="gcoord", parent_coordinator_epoch=2
            ),
        ),
    ]
    succeeded = copy.deepcopy(child)
    for event in down:
        succeeded = decider.evolve(succeeded, event)
    assert succeeded.mission.owner_id == "gcoord"  # type: ignore[union-attr]
    # The owner reappointed: nothing to do.
    again = mission_pb2.MissionReplaceCoordinator(replaced_coordinator_epoch=1, coordinator_id="coord")
    source = event_of(
        accepted(PARENT.decide(after, "mission_replace_coordinator", again, "alice")),
        "coordinator_lease_granted",
    )
    assert decider.decide_linked(child, source, after, NOW) == []
    # A previous owner whose Membership already ended is not revoked again.
    child.members["coord"].active = False
    source = event_of(
        accepted(PARENT.decide(after, "mission_replace_coordinator", replace, "alice")),
        "coordinator_lease_granted",
    )
    assert [e.type for e in accepted(decider.decide_linked(child, source, after, NOW))] == [
        "membership.granted",
        "mission.owner.replaced",
    ]


def test_later_is_after_now() -> None:
    assert LATER > NOW


# ---------------------------------------------------------------- what the refusals and linked appends say


@pytest.mark.req("MW-7.1-T03", "MW-14-09", "MW-7.2-03")
def test_create_child_refusals_say_why() -> None:
    parent = parent_state()
    r = refusal(parent, definition=child_definition(owner_id="worker"))
    assert (
        r.message
        == "body.definition.owner_id: the parent Coordinator issuing the command is the child's MissionOwner (MW-14-09)"
    )
    r = refusal(parent, actor="worker", definition=child_definition(owner_id="worker"))
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_PERMISSION_DENIED,
        "mission.create_child is issued by the current Coordinator",
    )
    ended_parent = PARENT.run(parent, "mission_cancel", mission_pb2.MissionCancel(reason="stop"), "alice")
    assert refusal(ended_parent).message.startswith(
        "mission.create_child: the Mission is MISSION_STATE_CANCELLED, a terminal state"
    )


@pytest.mark.req("MW-10.4-05", "MW-16-02")
def test_a_linked_append_is_the_authoritys_own_command_derived_from_the_source_event() -> None:
    parent = parent_state()
    child, events = created(parent)
    source = event_of(events, "parent_linked")
    (linked_event,) = accepted(decider.decide_linked(parent, source, child, NOW))
    command_id = ids.derived_id("xg", "grp_child", str(source.sequence))
    assert (linked_event.causing_command_id, linked_event.actor_id, linked_event.group_id) == (
        command_id,
        "authority",
        "grp_parent",
    )
    assert linked_event.event_id == ids.derived_id("evt", "grp_parent", command_id, "0")
    assert linked_event.correlation_id == source.event_id  # the source had no correlation id of its own
    correlated = copy.deepcopy(source)
    correlated.correlation_id = "corr-1"
    (again,) = accepted(decider.decide_linked(parent, correlated, child, NOW))
    assert again.correlation_id == "corr-1"
    assert decider.decide_linked(None, source, child, NOW).reason == R.REJECTION_REASON_GROUP_NOT_FOUND  # type: ignore[union-attr]


@pytest.mark.req("MW-14-04", "MW-10.2-T15")
def test_the_missions_reservations_add_up_over_its_running_children() -> None:
    parent = parent_state()
    after, child, _ = linked(parent)
    second = CoreGroup("grp_child2", ctx_with(after), NOW)
    events = accepted(
        second.decide(None, "mission_create_child", create_body(after, parent_work_item_id="other"), "coord")
    )
    child2 = decider.fold(events)
    assert child2 is not None
    both = apply_linked(after, event_of(events, "parent_linked"), child2)
    assert (both.reserved["tokens"], both.reserved["tool_calls"], both.reserved["financial_micros"]) == (
        10_000,
        40,
        1_000_000,
    )
    # Ending one child releases its reservation only.
    done, end = ended(child, "cancelled")
    released = apply_linked(both, end, done)
    assert (released.reserved["tokens"], released.reserved["tool_calls"]) == (5_000, 20)


@pytest.mark.req("MW-7.1-06", "MW-10.4-05")
def test_a_link_reaching_an_ended_parent_mission_is_refused_and_compensated() -> None:
    parent = parent_state()
    child, events = created(parent)
    source = event_of(events, "parent_linked")
    ended_parent = PARENT.run(parent, "mission_cancel", mission_pb2.MissionCancel(reason="stop"), "alice")
    refused = decider.decide_linked(ended_parent, source, child, NOW)
    assert isinstance(refused, Rejected)
    assert (refused.reason, refused.metadata) == (
        R.REJECTION_REASON_TERMINAL_STATE,
        {"state": "MISSION_STATE_CANCELLED"},
    )
    assert refused.message.startswith(
        "mission.create_child: the Mission is MISSION_STATE_CANCELLED, a terminal state"
    )


@pytest.mark.req("MW-7.1-T08", "MW-10.2-T18")
def test_a_child_failed_by_its_parent_ends_its_own_work_in_the_same_append() -> None:
    after, child, _ = linked(parent_state())
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
    fail = accepted(
        PARENT.decide(
            after,
            "mission_terminate",
            mission_pb2.MissionTerminate(coordinator_epoch=1, reason="abandoned"),
            "coord",
        )
    )
    down = accepted(decider.decide_linked(child, event_of(fail, "mission_failed"), after, NOW))
    assert down[0].type == "mission.failed" and len(down) > 1
    done = copy.deepcopy(child)
    for event in down:
        done = decider.evolve(done, event)
    assert done.work_items["w1"].state in (WS.WORK_ITEM_STATE_CANCELLED, WS.WORK_ITEM_STATE_FAILED)
