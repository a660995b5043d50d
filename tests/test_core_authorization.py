"""Authorization as data (rules/authorization.py), on the pure core: every role, an Organization
administrator and a registered identity without a Membership, against every command kind. A pair
the table forbids is refused PERMISSION_DENIED with check "role" (NOT_A_MEMBER for an identity
without a Membership where Organization policy does not apply) and writes nothing; an allowed pair
is never the gate's refusal, the kind's handler decides. docs/authorization.md is the table rendered."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from missionweave.clock import to_timestamp
from missionweave.errors import Rejected
from missionweave.v1 import common_pb2, conversation_pb2, membership_pb2, mission_pb2, subtask_pb2
from missionweave.v1 import work_pb2 as wp
from services.authority import decider, kinds
from services.authority.rules import authorization as authz
from services.authority.rules.common import spec_name
from services.authority.state import GroupState, IdentityInfo
from tests import builders
from tests.core_group import CoreGroup

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
R = common_pb2.RejectionReason
Role = membership_pb2.MemberRole
AK = conversation_pb2.MessageAmendmentKind
AGENT, HUMAN = common_pb2.IDENTITY_KIND_AGENT, common_pb2.IDENTITY_KIND_HUMAN
# One member per role, then Organization policy and an identity, both without a Membership.
MEMBERS = {
    "alice": Role.MEMBER_ROLE_MISSION_OWNER,
    "coord": Role.MEMBER_ROLE_COORDINATOR,
    "worker": Role.MEMBER_ROLE_WORKER,
    "rev": Role.MEMBER_ROLE_REVIEWER,
    "lead": Role.MEMBER_ROLE_WORK_DELEGATE,
    "obs": Role.MEMBER_ROLE_OBSERVER,
}
ADMIN, STRANGER = "admin", "stranger"
IDS = {
    **{m: IdentityInfo(m, HUMAN if m == "alice" else AGENT, session_epoch=1) for m in MEMBERS},
    ADMIN: IdentityInfo(ADMIN, HUMAN, org_admin=True, session_epoch=1),
    STRANGER: IdentityInfo(STRANGER, AGENT, session_epoch=1),
}
CTX = decider.DecisionContext(NOW, IDS)
ACTORS = [*MEMBERS, ADMIN, STRANGER]
SOON = to_timestamp(NOW + timedelta(minutes=5))


GROUP = CoreGroup("grp_authz", CTX, NOW)
command, decide, run, refused = GROUP.command, GROUP.decide, GROUP.run, GROUP.refused


def offer(candidate: str, offer_id: str = "off-1") -> wp.WorkOffer:
    return wp.WorkOffer(
        work_item_id="wi", offer_id=offer_id, candidate_ids=[candidate], expires_at=SOON,
        selection_criteria=[builders.selection(candidate)], coordinator_epoch=1,
    )


def base() -> GroupState:
    create = builders.mission_create("alice", "coord", NOW)
    create.coordinator_renewal.lease_duration.FromSeconds(3_600)
    state = run(None, "mission_create", create, "alice")
    for member, role in MEMBERS.items():
        if member not in state.members:
            state = run(state, "membership_grant", membership_pb2.MembershipGrant(member_id=member, role=role), "alice")
    body = wp.WorkAuthorize(work_item_id="wi", title="wi", contract=builders.contract(NOW), coordinator_epoch=1)
    return run(state, "work_authorize", body, "coord")


BASE = base()
PLANNING = BASE.mission.planning_conversation_id  # type: ignore[union-attr]
LEASE = dict(work_item_id="wi", lease_id="lease-1", ownership_epoch=1)
# A body for each kind: what its main actor would send (the gate runs before any of it is read).
BODIES: dict[str, object] = {
    "mission_create": builders.mission_create("alice", "coord", NOW),
    "mission_create_follow_up": mission_pb2.MissionCreateFollowUp(),
    "mission_create_child": subtask_pb2.MissionCreateChild(),
    "mission_approve_child_depth": subtask_pb2.MissionApproveChildDepth(),
    "mission_submit_for_approval": mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=1),
    "mission_request_changes": mission_pb2.MissionRequestChanges(requested_changes="more"),
    "mission_approve": mission_pb2.MissionApprove(),
    "mission_revoke_approval": mission_pb2.MissionRevokeApproval(reason="wrong"),
    "mission_cancel": mission_pb2.MissionCancel(reason="stop"),
    "mission_terminate": mission_pb2.MissionTerminate(coordinator_epoch=1, reason="cannot finish"),
    "mission_renew_coordinator_lease": mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
    "mission_replace_coordinator": mission_pb2.MissionReplaceCoordinator(coordinator_id="worker", replaced_coordinator_epoch=1),
    "mission_acknowledge_reconciliation": mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=1),
    "mission_issue_directive": mission_pb2.MissionIssueDirective(directive="hurry"),
    "mission_authorize_context_transfer": mission_pb2.MissionAuthorizeContextTransfer(target_group_id="grp_other", reason="r"),
    "work_propose": wp.WorkPropose(title="more", contract=builders.contract(NOW), rationale="r"),
    "work_authorize": wp.WorkAuthorize(title="more", contract=builders.contract(NOW), coordinator_epoch=1),
    "work_offer": offer("worker"),
    "work_accept_offer": wp.WorkAcceptOffer(work_item_id="wi", offer_id="off-1", contract_revision=1),
    "work_decline_offer": wp.WorkDeclineOffer(work_item_id="wi", offer_id="off-1"),
    "work_start": wp.WorkStart(work_item_id="wi", ownership_epoch=1),
    "work_renew_lease": wp.WorkRenewLease(**LEASE),
    "work_checkpoint": wp.WorkCheckpoint(**LEASE, checkpoint=wp.Checkpoint(checkpoint_id="ck")),
    "work_block": wp.WorkBlock(**LEASE),
    "work_unblock": wp.WorkUnblock(work_item_id="wi", coordinator_epoch=1, resolution="done"),
    "work_submit": wp.WorkSubmit(**LEASE, contract_revision=1),
    "work_accept_result": wp.WorkAcceptResult(work_item_id="wi", coordinator_epoch=1),
    "work_fail": wp.WorkFail(work_item_id="wi", coordinator_epoch=1, reason="r", evidence=[builders.evidence()]),
    "work_cancel": wp.WorkCancel(work_item_id="wi", coordinator_epoch=1, reason="r"),
    "work_report_progress": wp.WorkReportProgress(**LEASE),
    "work_publish_artifact": wp.WorkPublishArtifact(**LEASE, artifact=builders.artifact()),
    "work_record_evidence": wp.WorkRecordEvidence(work_item_id="wi", coordinator_epoch=1, evidence=builders.evidence()),
    "work_request_preemption": wp.WorkRequestPreemption(**LEASE, coordinator_epoch=1, reason=wp.PREEMPTION_REASON_PRIORITY),
    "approval_grant_execution": wp.ApprovalGrantExecution(work_item_id="wi", contract_revision=1, ownership_epoch=1),
    "membership_grant": membership_pb2.MembershipGrant(member_id=STRANGER, role=Role.MEMBER_ROLE_WORKER),
    "membership_revoke": membership_pb2.MembershipRevoke(member_id="obs", reason="done"),
    "membership_grant_delegation": membership_pb2.MembershipGrantDelegation(grantee_id="lead", coordinator_epoch=1),
    "membership_revoke_delegation": membership_pb2.MembershipRevokeDelegation(grant_id="grant_x", reason="r"),
    "message_post": builders.message(PLANNING),
    "message_amend": conversation_pb2.MessageAmend(message_id="msg_x", kind=AK.MESSAGE_AMENDMENT_KIND_RETRACTION),
    "conversation_open": conversation_pb2.ConversationOpen(kind=conversation_pb2.CONVERSATION_KIND_REVIEW, title="review"),
}
GROUP_KINDS = sorted(b for b, k in kinds.KINDS.items() if not k.creates_group)
SPEC_IDS = sorted({i for rule in authz.TABLE.values() for i in rule.spec})


def check_of(decision: decider.Decision) -> tuple[str, str]:
    if not isinstance(decision, Rejected):
        return "ACCEPTED", ""
    return decision.reason_name, decision.metadata.get("check", "")


def forbidden(actor: str, body: str) -> bool:
    rule = authz.TABLE[body]
    organization = IDS[actor].org_admin and bool(rule.organization)
    return actor in MEMBERS and MEMBERS[actor] not in rule.roles and not organization


# ---------------------------------------------------------------- the table itself


def test_every_kind_has_exactly_one_row_and_every_row_names_a_kind() -> None:
    assert set(authz.TABLE) == set(kinds.KINDS)
    assert set(BODIES) == set(kinds.KINDS)


def test_the_rows_are_well_formed() -> None:
    assert len(authz.Condition) == len(authz.Condition.__members__)  # no two conditions alias each other
    for body, rule in authz.TABLE.items():
        assert set(rule.roles) <= set(authz.ROLES), body
        assert all(rule.roles.values()), f"{body}: a role admitted under no condition"
        assert authz.OBSERVER not in rule.roles, f"{body}: observers hold read access only"
        assert bool(rule.outsider) == kinds.KINDS[body].creates_group, body  # only creators need no Membership
        assert not (kinds.KINDS[body].creates_group and rule.roles), body
        assert all(i.startswith("MW-") for i in rule.spec), body


def test_the_docs_are_the_table_rendered() -> None:
    doc = Path(__file__).resolve().parents[1] / "docs" / "authorization.md"
    assert doc.read_text(encoding="utf-8") == authz.markdown(), (
        "regenerate: python -m services.authority.rules.authorization --markdown > docs/authorization.md"
    )


# ---------------------------------------------------------------- every actor x every kind


@pytest.mark.req(*SPEC_IDS, "MW-8-02", "MW-8-03")
@pytest.mark.parametrize("body", GROUP_KINDS)
@pytest.mark.parametrize("actor", ACTORS)
def test_actor_by_kind_matrix(actor: str, body: str) -> None:
    state = copy.deepcopy(BASE)
    before = copy.deepcopy(state)
    decision = decide(state, body, BODIES[body], actor)
    assert state == before  # decide never mutates the state
    got = check_of(decision)
    if actor == STRANGER or (actor == ADMIN and not authz.may_act_for_organization(body)):
        assert got == ("NOT_A_MEMBER", ""), decision
    elif forbidden(actor, body):
        assert isinstance(decision, Rejected) and got == ("PERMISSION_DENIED", "role"), decision
        assert decision.metadata["role"] == authz.role_label(MEMBERS[actor])
        assert decision.metadata["command"] == spec_name(body)
    else:  # the gate lets it through: the handler decides, on its own grounds
        assert got not in (("PERMISSION_DENIED", "role"), ("NOT_A_MEMBER", "")), decision


@pytest.mark.req("MW-7.1-T01", "MW-7.1-T02", "MW-7.1-T03", "MW-8-04")
@pytest.mark.parametrize("actor", ACTORS)
def test_kinds_that_create_their_group_name_no_role(actor: str) -> None:
    """Addressed to an existing Group they are refused for everyone; who creates one is the
    'no Membership' column, which the creating handlers check."""
    for body in (b for b, k in kinds.KINDS.items() if k.creates_group):
        assert check_of(decide(BASE, body, BODIES[body], actor)) == ("GROUP_EXISTS", "")
    create = builders.mission_create("alice", "coord", NOW)
    allowed = actor in ("alice", ADMIN)  # the named human owner, or Organization policy
    assert check_of(decide(None, "mission_create", create, actor)) == (("ACCEPTED", "") if allowed else ("PERMISSION_DENIED", ""))


# ---------------------------------------------------------------- acceptance the table allows


PARTICIPANTS = ["alice", "coord", "worker", "rev", "lead"]


@pytest.mark.req("MW-9-13", "MW-10.2-T01", "MW-9.1-17", "MW-9.1-20")
@pytest.mark.parametrize("actor", PARTICIPANTS)
def test_every_role_but_observer_posts_amends_its_own_and_proposes(actor: str) -> None:
    post = builders.message(PLANNING, f"from {actor}")
    post.message_id = f"msg_{actor}"
    state = run(BASE, "message_post", post, actor)
    retract = conversation_pb2.MessageAmend(message_id=post.message_id, kind=AK.MESSAGE_AMENDMENT_KIND_RETRACTION)
    state = run(state, "message_amend", retract, actor)
    propose = wp.WorkPropose(proposal_id=f"prop_{actor}", title="t", contract=builders.contract(NOW), rationale="r")
    state = run(state, "work_propose", propose, actor)
    assert state.proposals[f"prop_{actor}"].proposed_by == actor


@pytest.mark.req("MW-7.2-10", "MW-10.2-T04", "MW-10.2-T07")
def test_the_coordinator_may_take_work_itself() -> None:
    state = run(BASE, "work_offer", offer("coord"), "coord")
    state = run(state, "work_accept_offer", BODIES["work_accept_offer"], "coord")
    state = run(state, "work_start", wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-1"), "coord")
    assert state.work_items["wi"].lease is not None and state.work_items["wi"].lease.agent_id == "coord"
    again = run(BASE, "work_offer", offer("coord", "off-2"), "coord")
    decline = wp.WorkDeclineOffer(work_item_id="wi", offer_id="off-2", decline=wp.StructuredDecline(reason=wp.DECLINE_REASON_CAPACITY))
    run(again, "work_decline_offer", decline, "coord")


def test_a_work_delegate_may_also_do_work_itself() -> None:
    """A lead that plans a subtree under a grant holds one Membership in the Group: it may take part
    of the work as any Worker would."""
    state = run(BASE, "work_offer", offer("lead"), "coord")
    state = run(state, "work_accept_offer", BODIES["work_accept_offer"], "lead")
    assert state.work_items["wi"].owner is not None and state.work_items["wi"].owner.agent_id == "lead"


@pytest.mark.req("MW-9.1-18", "MW-10.3-04")
@pytest.mark.parametrize("candidate", ["alice", "rev", "obs"])
def test_work_is_offered_only_to_roles_that_may_accept_it(candidate: str) -> None:
    decision = decide(BASE, "work_offer", offer(candidate), "coord")
    assert isinstance(decision, Rejected) and decision.reason == R.REJECTION_REASON_INVALID_ARGUMENT, decision
    assert decision.metadata["field"] == "body.candidate_ids[0]"


@pytest.mark.req("MW-10.2-T06")
def test_a_reviewer_named_as_execution_approver_approves() -> None:
    body = wp.WorkAuthorize(work_item_id="gated", title="gated", contract=builders.contract(NOW), coordinator_epoch=1)
    body.contract.requires_execution_approval = True
    body.contract.execution_approver_ids.append("rev")
    state = run(BASE, "work_authorize", body, "coord")
    gated = offer("worker")
    gated.work_item_id = "gated"
    state = run(state, "work_offer", gated, "coord")
    state = run(state, "work_accept_offer", wp.WorkAcceptOffer(work_item_id="gated", offer_id="off-1", contract_revision=1), "worker")
    approve = wp.ApprovalGrantExecution(work_item_id="gated", contract_revision=1, ownership_epoch=1)
    assert check_of(decide(state, "approval_grant_execution", approve, "alice")) == ("PERMISSION_DENIED", "")  # not named
    state = run(state, "approval_grant_execution", approve, "rev")
    assert state.work_items["gated"].execution_approved == (1, 1, None)


@pytest.mark.req("MW-8-04", "MW-7.1-T07", "MW-7.1-T08")
def test_organization_policy_acts_without_a_membership_and_as_a_member() -> None:
    run(BASE, "mission_cancel", BODIES["mission_cancel"], ADMIN)
    run(BASE, "mission_terminate", mission_pb2.MissionTerminate(reason="policy"), ADMIN)
    # An administrator holding a Worker's Membership keeps Organization policy's authority...
    ctx = decider.DecisionContext(NOW, {**IDS, "worker": IdentityInfo("worker", AGENT, org_admin=True, session_epoch=1)})
    run(BASE, "mission_cancel", BODIES["mission_cancel"], "worker", ctx)
    # ...and is a Worker for everything else.
    assert check_of(decide(BASE, "work_cancel", BODIES["work_cancel"], "worker", ctx)) == ("PERMISSION_DENIED", "role")


@pytest.mark.req("MW-9.1-15")
def test_the_mission_owner_revokes_a_grant() -> None:
    grant = membership_pb2.MembershipGrantDelegation(
        grantee_id="lead", target_work_item_id="wi", caps=common_pb2.ResourceVector(currency="EUR"),
        allowed_capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.11")],
        max_descendant_depth=1, expires_at=SOON, coordinator_epoch=1,
    )
    state = run(BASE, "membership_grant_delegation", grant, "coord")
    [grant_id] = state.grants
    state = run(state, "membership_revoke_delegation", membership_pb2.MembershipRevokeDelegation(grant_id=grant_id, reason="r"), "alice")
    assert state.grants[grant_id].revoked


@pytest.mark.req("MW-9.1-02", "MW-9.1-18", "MW-9.1-01")
def test_a_worker_never_shapes_work_even_citing_a_grant() -> None:
    cite = wp.WorkAuthorize(title="t", contract=builders.contract(NOW), parent_work_item_id="wi", grant_id="grant_x")
    for kind, body in (("work_authorize", cite), ("work_offer", offer("worker"))):
        assert check_of(decide(BASE, kind, body, "worker")) == ("PERMISSION_DENIED", "role")
