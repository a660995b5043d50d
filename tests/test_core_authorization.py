"""Authorization as data (rules/authorization.py), on the pure core: every role, an Organization
administrator and a registered identity without a Membership, against every command kind.

Each kind has a scenario (SCENARIOS): a state and a body in which the command is valid for an
actor the table allows, under each condition the cell names. Every allowed cell is then accepted
(events produced); every other cell, sending that same command in that same state, is refused
PERMISSION_DENIED with check "role" (NOT_A_MEMBER for an identity without a Membership where
Organization policy does not apply); and each condition, broken once (BREAKS: a stale Coordinator
epoch, no current lease, a revoked grant, no emergency override...), gives its exact refusal.
docs/authorization.md is the table rendered."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from google.protobuf.message import Message

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2, conversation_pb2, membership_pb2, mission_pb2, subtask_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider, kinds
from missionweave_server.services.authority.rules import authorization as authz
from missionweave_server.services.authority.rules.common import StoredArtifact, spec_name
from missionweave_server.services.authority.state import GroupState, IdentityInfo
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
ADMIN, STRANGER, SUCCESSOR = "admin", "stranger", "coord2"
IDS = {
    SUCCESSOR: IdentityInfo(SUCCESSOR, AGENT, session_epoch=1),
    **{m: IdentityInfo(m, HUMAN if m == "alice" else AGENT, session_epoch=1) for m in MEMBERS},
    ADMIN: IdentityInfo(ADMIN, HUMAN, org_admin=True, session_epoch=1),
    STRANGER: IdentityInfo(STRANGER, AGENT, session_epoch=1),
}
CTX = decider.DecisionContext(NOW, IDS)
ACTORS = [*MEMBERS, ADMIN, STRANGER]
SOON = to_timestamp(NOW + timedelta(minutes=5))


GROUP = CoreGroup("grp_authz", CTX, NOW)
command, decide, run, refused = GROUP.command, GROUP.decide, GROUP.run, GROUP.refused
LATE = decider.DecisionContext(NOW + timedelta(hours=2), IDS)  # the Coordinator's 1 h lease has lapsed
C = authz.Condition


def offer(candidate: str, offer_id: str = "off-1", work_item_id: str = "wi") -> wp.WorkOffer:
    return wp.WorkOffer(
        work_item_id=work_item_id,
        offer_id=offer_id,
        candidate_ids=[candidate],
        expires_at=SOON,
        selection_criteria=[builders.selection(candidate)],
        coordinator_epoch=1,
    )


def bare() -> GroupState:
    """The Mission with one member per role, and no work yet."""
    create = builders.mission_create("alice", "coord", NOW)
    create.coordinator_renewal.lease_duration.FromSeconds(3_600)
    state = run(None, "mission_create", create, "alice")
    for member, role in MEMBERS.items():
        if member not in state.members:
            state = run(
                state,
                "membership_grant",
                membership_pb2.MembershipGrant(member_id=member, role=role),
                "alice",
            )
    return state


BARE = bare()
BASE = run(
    BARE,
    "work_authorize",
    wp.WorkAuthorize(work_item_id="wi", title="wi", contract=builders.contract(NOW), coordinator_epoch=1),
    "coord",
)
PLANNING = BASE.mission.planning_conversation_id  # type: ignore[union-attr]
LEASE = dict(work_item_id="wi", lease_id="lease-1", ownership_epoch=1)
CAPS = common_pb2.ResourceVector(currency="EUR", financial_micros=3_000_000, tokens=30_000, tool_calls=150)
SIX_CAPS = membership_pb2.MembershipGrantDelegation(
    grantee_id="lead",
    target_work_item_id="wi",
    caps=CAPS,
    max_descendant_depth=1,
    expires_at=SOON,
    coordinator_epoch=1,
    allowed_capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.11")],
)


# ---------------------------------------------------------------- the states a command is valid in


@dataclass(frozen=True)
class Case:
    """A state and a body in which one actor's command is valid (and the clock and linked Groups)."""

    state: GroupState
    body: Message
    ctx: decider.DecisionContext = CTX


def offered(to: str, state: GroupState = BASE) -> GroupState:
    return run(state, "work_offer", offer(to), "coord")


def owned(to: str) -> GroupState:
    accept = wp.WorkAcceptOffer(work_item_id="wi", offer_id="off-1", contract_revision=1)
    return run(offered(to), "work_accept_offer", accept, to)


def started(to: str) -> GroupState:
    return run(
        owned(to), "work_start", wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-1"), to
    )


SUBMIT = wp.WorkSubmit(
    **LEASE, contract_revision=1, artifacts=[builders.artifact()], evidence=[builders.evidence()]
)


def submitted(by: str) -> GroupState:
    return run(started(by), "work_submit", SUBMIT, by)


def blocked(by: str) -> GroupState:
    block = wp.WorkBlock(
        **LEASE,
        checkpoint=wp.Checkpoint(checkpoint_id="ck"),
        blockers=[
            wp.Blocker(blocker_id="b", kind=wp.BLOCKER_KIND_DEPENDENCY, required_resolution="input"),
        ],
    )
    return run(started(by), "work_block", block, by)


GRANTED = run(BASE, "membership_grant_delegation", SIX_CAPS, "coord")
[GRANT_ID] = GRANTED.grants
AWAITING = run(
    BARE,
    "mission_submit_for_approval",
    mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=BARE.mission.revision),
    "coord",
)  # type: ignore[union-attr]
SUBMISSION = AWAITING.mission.latest_submission_event_id  # type: ignore[union-attr]
APPROVED = run(
    AWAITING, "mission_approve", mission_pb2.MissionApprove(submission_event_id=SUBMISSION), "alice"
)


def replaced_by(successor: str) -> GroupState:
    """The lapsed Coordinator replaced (MW-7.2-04): the successor holds epoch 2, unreconciled."""
    body = mission_pb2.MissionReplaceCoordinator(coordinator_id=successor, replaced_coordinator_epoch=1)
    return run(BASE, "mission_replace_coordinator", body, "alice", LATE)


# Another agent succeeds (the lapsed one keeps its coordinator Membership), or the same one again.
SUCCEEDED, REPLACED = replaced_by(SUCCESSOR), replaced_by("coord")


def as_child_needing_root_approval(state: GroupState, root_owner: str) -> GroupState:
    """A child Mission whose risk policy wants the tree's root MissionOwner (here a reviewer member)
    to approve first (MW-14-10). Set directly: creating a child takes two Groups (test_core_children.py)."""
    state = copy.deepcopy(state)
    assert state.mission is not None
    state.mission.kind = mission_pb2.MISSION_KIND_CHILD
    state.mission.definition.risk_policy.require_root_owner_approval = True
    state.mission.root_owner_id = root_owner
    return state


def linked_group(group_id: str, owner: str = "alice", follows_up: str = "") -> decider.DecisionContext:
    """The context with another Group of a Mission owned by ``owner`` (optionally a follow-up)."""
    other = copy.deepcopy(BARE)
    other.group_id = group_id
    assert other.mission is not None
    other.mission.mission_id, other.mission.follows_up_mission_id = f"m_{group_id}", follows_up
    other.mission.definition.owner_id = owner
    return decider.DecisionContext(NOW, IDS, linked={group_id: other})


def posted(author: str) -> GroupState:
    return run(BASE, "message_post", builders.message(PLANNING, f"from {author}"), author)


def the_message(state: GroupState) -> str:
    [message_id] = state.messages
    return message_id


def gated(approver: str) -> GroupState:
    """A WorkItem whose contract names ``approver`` to approve its execution, owned by the Worker."""
    body = wp.WorkAuthorize(
        work_item_id="gated", title="gated", contract=builders.contract(NOW), coordinator_epoch=1
    )
    body.contract.requires_execution_approval = True
    body.contract.execution_approver_ids.append(approver)
    state = run(BASE, "work_authorize", body, "coord")
    state = run(state, "work_offer", offer("worker", work_item_id="gated"), "coord")
    return run(
        state,
        "work_accept_offer",
        wp.WorkAcceptOffer(work_item_id="gated", offer_id="off-1", contract_revision=1),
        "worker",
    )


def steering(kind: str, actor: str, condition: authz.Condition) -> Case:
    """work.authorize and work.offer by each source of the authority to shape work (MW-9.1-01)."""
    body: wp.WorkAuthorize | wp.WorkOffer
    if kind == "work_authorize":
        body = wp.WorkAuthorize(
            work_item_id="more", title="more", contract=builders.contract(NOW), coordinator_epoch=1
        )
    else:
        body = offer("worker")
    if condition is C.EMERGENCY_OVERRIDE:
        body.coordinator_epoch, body.emergency_override, body.override_reason = (
            0,
            True,
            "the Coordinator is unreachable",
        )
    if condition is C.DELEGATION_GRANT:
        body.coordinator_epoch, body.grant_id = 0, GRANT_ID
        if isinstance(body, wp.WorkAuthorize):
            body.parent_work_item_id = "wi"
        return Case(GRANTED, body)
    return Case(BASE, body)


FAILURE = wp.WorkFail(kind=wp.WORK_FAILURE_KIND_PERMANENT, evidence=[builders.evidence()])


def under_lease(kind: str, actor: str, condition: authz.Condition) -> Case:
    """The owner's commands under its execution lease (the Coordinator's own ones where it may)."""
    if condition is C.COORDINATOR_EPOCH:  # the Coordinator acting on a Worker's WorkItem
        state = started("worker")
        if kind == "work_fail":
            return Case(
                state,
                wp.WorkFail(
                    work_item_id="wi",
                    coordinator_epoch=1,
                    kind=FAILURE.kind,
                    reason="r",
                    evidence=FAILURE.evidence,
                ),
            )
        return Case(
            state,
            wp.WorkRequestPreemption(**LEASE, coordinator_epoch=1, reason=wp.PREEMPTION_REASON_PRIORITY),
        )
    bodies: dict[str, Message] = {
        "work_renew_lease": wp.WorkRenewLease(**LEASE),
        "work_checkpoint": wp.WorkCheckpoint(**LEASE, checkpoint=wp.Checkpoint(checkpoint_id="ck")),
        "work_block": wp.WorkBlock(
            **LEASE,
            checkpoint=wp.Checkpoint(checkpoint_id="ck"),
            blockers=[
                wp.Blocker(blocker_id="b", kind=wp.BLOCKER_KIND_DEPENDENCY, required_resolution="input"),
            ],
        ),
        "work_submit": SUBMIT,
        "work_fail": wp.WorkFail(**LEASE, kind=FAILURE.kind, reason="r", evidence=FAILURE.evidence),
        "work_report_progress": wp.WorkReportProgress(
            **LEASE,
            report=wp.ProgressReport(
                phase="p",
                next_checkpoint=wp.PlannedCheckpoint(description="next"),
                revised_estimate=wp.RevisedEstimate(reason="same"),
            ),
        ),
        "work_publish_artifact": wp.WorkPublishArtifact(**LEASE, artifact=builders.artifact()),
        "work_request_preemption": wp.WorkRequestPreemption(**LEASE, reason=wp.PREEMPTION_REASON_PRIORITY),
    }
    if kind != "work_publish_artifact":
        return Case(started(actor), bodies[kind])
    # What the shell verified of the uploaded artifact (the core reads no blobs).
    hex_digest = builders.artifact().digest.hex
    stored = StoredArtifact(hex_digest, 0, "b" * 64, actor)
    return Case(
        started(actor), bodies[kind], decider.DecisionContext(NOW, IDS, artifacts={hex_digest: stored})
    )


def amend(kind: str, actor: str, condition: authz.Condition) -> Case:
    """A retraction of its own Message; a steward's redaction or the owner's erasure of another's."""
    if condition is C.MESSAGE_AUTHOR:
        state = posted(actor)
        return Case(
            state,
            conversation_pb2.MessageAmend(
                message_id=the_message(state), kind=AK.MESSAGE_AMENDMENT_KIND_RETRACTION
            ),
        )
    state = posted("worker")
    body = conversation_pb2.MessageAmend(
        message_id=the_message(state), kind=AK.MESSAGE_AMENDMENT_KIND_REDACTION, policy_reason="leaked a key"
    )
    if condition is C.OWNER_ERASURE:
        body.erasure = conversation_pb2.CONTENT_ERASURE_LEGAL_DELETION
    return Case(state, body)


def accept_result(kind: str, actor: str, condition: authz.Condition) -> Case:
    """The Coordinator reviews a Worker's result; the MissionOwner one the Coordinator did itself."""
    state = submitted("coord" if condition is C.OWNER_REVIEWS_COORDINATOR_OUTPUT else "worker")
    return Case(state, accepting(state, actor))


def accepting(state: GroupState, actor: str) -> wp.WorkAcceptResult:
    submission = state.work_items["wi"].latest_submission_event_id
    return wp.WorkAcceptResult(
        work_item_id="wi", coordinator_epoch=1 if actor == "coord" else 0, submission_event_id=submission
    )


def fixed(
    state: GroupState, body: Message, ctx: decider.DecisionContext = CTX
) -> Callable[[str, str, authz.Condition], Case]:
    return lambda kind, actor, condition: Case(state, body, ctx)


Scenario = Callable[[str, str, authz.Condition], Case]
# For each kind: (kind, actor, the condition it acts under) -> a Case in which the command is valid.
SCENARIOS: dict[str, Scenario] = {
    "mission_approve_child_depth": fixed(
        BASE,
        subtask_pb2.MissionApproveChildDepth(
            parent_work_item_id="wi", max_depth=CTX.policy.max_mission_depth + 1, reason="a deep plan"
        ),
    ),
    "mission_submit_for_approval": fixed(
        BARE,
        mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=BARE.mission.revision),
    ),  # type: ignore[union-attr]
    "mission_request_changes": fixed(
        AWAITING, mission_pb2.MissionRequestChanges(submission_event_id=SUBMISSION, requested_changes="more")
    ),
    "mission_approve": lambda kind, actor, condition: Case(
        as_child_needing_root_approval(AWAITING, "rev") if condition is C.ROOT_OWNER_APPROVAL else AWAITING,
        mission_pb2.MissionApprove(submission_event_id=SUBMISSION),
    ),
    "mission_revoke_approval": fixed(
        APPROVED,
        mission_pb2.MissionRevokeApproval(
            approval_event_id=APPROVED.mission.approval_event_id,
            reason="wrong figures",
            follow_up_group_id="grp_follow",  # type: ignore[union-attr]
        ),
        linked_group("grp_follow", follows_up=APPROVED.mission.mission_id),
    ),  # type: ignore[union-attr]
    "mission_cancel": fixed(BASE, mission_pb2.MissionCancel(reason="stop")),
    "mission_terminate": lambda kind, actor, condition: Case(
        BASE,
        mission_pb2.MissionTerminate(
            coordinator_epoch=0 if condition is C.ORGANIZATION else 1, reason="cannot finish"
        ),
    ),
    "mission_renew_coordinator_lease": fixed(
        BASE, mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1)
    ),
    "mission_replace_coordinator": fixed(
        BASE,
        mission_pb2.MissionReplaceCoordinator(coordinator_id="coord", replaced_coordinator_epoch=1),
        LATE,
    ),
    "mission_acknowledge_reconciliation": fixed(
        REPLACED,
        mission_pb2.MissionAcknowledgeReconciliation(
            coordinator_epoch=2, group_revision=REPLACED.head_sequence
        ),
        LATE,
    ),
    "mission_issue_directive": fixed(BASE, mission_pb2.MissionIssueDirective(directive="hurry")),
    "mission_authorize_context_transfer": fixed(
        BASE,
        mission_pb2.MissionAuthorizeContextTransfer(target_group_id="grp_other", reason="reuse the ledger"),
        linked_group("grp_other"),
    ),
    "work_propose": fixed(BASE, wp.WorkPropose(title="more", contract=builders.contract(NOW), rationale="r")),
    "work_authorize": steering,
    "work_offer": steering,
    "work_accept_offer": lambda kind, actor, condition: Case(
        offered(actor), wp.WorkAcceptOffer(work_item_id="wi", offer_id="off-1", contract_revision=1)
    ),
    "work_decline_offer": lambda kind, actor, condition: Case(
        offered(actor),
        wp.WorkDeclineOffer(
            work_item_id="wi",
            offer_id="off-1",
            decline=wp.StructuredDecline(reason=wp.DECLINE_REASON_CAPACITY),
        ),
    ),
    "approval_grant_execution": lambda kind, actor, condition: Case(
        gated(actor), wp.ApprovalGrantExecution(work_item_id="gated", contract_revision=1, ownership_epoch=1)
    ),
    "work_start": lambda kind, actor, condition: Case(
        owned(actor), wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-1")
    ),
    "work_renew_lease": under_lease,
    "work_checkpoint": under_lease,
    "work_block": under_lease,
    "work_unblock": fixed(
        blocked("worker"), wp.WorkUnblock(work_item_id="wi", coordinator_epoch=1, resolution="done")
    ),
    "work_submit": under_lease,
    "work_accept_result": accept_result,
    "work_fail": under_lease,
    "work_cancel": fixed(BASE, wp.WorkCancel(work_item_id="wi", coordinator_epoch=1, reason="r")),
    "work_report_progress": under_lease,
    "work_publish_artifact": under_lease,
    "work_record_evidence": lambda kind, actor, condition: Case(
        submitted("worker"),
        wp.WorkRecordEvidence(
            work_item_id="wi",
            coordinator_epoch=1 if actor == "coord" else 0,
            evidence=builders.evidence("ev-review"),
        ),
    ),
    "work_request_preemption": under_lease,
    "membership_grant": fixed(
        BASE, membership_pb2.MembershipGrant(member_id=STRANGER, role=Role.MEMBER_ROLE_WORKER)
    ),
    "membership_revoke": fixed(BASE, membership_pb2.MembershipRevoke(member_id="obs", reason="done")),
    "membership_grant_delegation": fixed(BASE, SIX_CAPS),
    "membership_revoke_delegation": fixed(
        GRANTED, membership_pb2.MembershipRevokeDelegation(grant_id=GRANT_ID, reason="r")
    ),
    "message_post": fixed(BASE, builders.message(PLANNING)),
    "message_amend": amend,
    "conversation_open": fixed(
        BASE,
        conversation_pb2.ConversationOpen(kind=conversation_pb2.CONVERSATION_KIND_REVIEW, title="review"),
    ),
}
# The kinds that create their Group, addressed to an existing one.
CREATORS: dict[str, Message] = {
    "mission_create": builders.mission_create("alice", "coord", NOW),
    "mission_create_follow_up": mission_pb2.MissionCreateFollowUp(),
    "mission_create_child": subtask_pb2.MissionCreateChild(),
}
GROUP_KINDS = sorted(b for b, k in kinds.KINDS.items() if not k.creates_group)
SPEC_IDS = sorted({i for rule in authz.TABLE.values() for i in rule.spec})


def conditions_of(actor: str, body: str) -> tuple[authz.Condition, ...]:
    """The conditions under which ``actor`` may issue the kind (empty: it may not)."""
    rule = authz.TABLE[body]
    if actor == ADMIN:
        return rule.organization
    return rule.roles.get(MEMBERS[actor], ()) if actor in MEMBERS else ()


# Every allowed cell, once per condition it may act under.
ALLOWED = [(body, actor, c) for body in GROUP_KINDS for actor in ACTORS for c in conditions_of(actor, body)]
REFUSED = [(body, actor) for body in GROUP_KINDS for actor in ACTORS if not conditions_of(actor, body)]


def case_of(body: str, actor: str, condition: authz.Condition) -> Case:
    return SCENARIOS[body](body, actor, condition)


def first_case(body: str) -> Case:
    """The kind's case for its first allowed actor: a refused actor sends the very same command."""
    _, actor, condition = next(cell for cell in ALLOWED if cell[0] == body)
    return case_of(body, actor, condition)


def with_body(case: Case, **fields: object) -> Case:
    body = copy.deepcopy(case.body)
    return Case(case.state, builders.with_overrides(body, fields), case.ctx)


def at(case: Case, ctx: decider.DecisionContext) -> Case:
    return Case(case.state, case.body, ctx)


def revoked_grant(case: Case) -> Case:
    state = copy.deepcopy(case.state)
    state.grants[GRANT_ID].revoked = True
    return Case(state, case.body, case.ctx)


def as_other(kind: str, actor: str, condition: authz.Condition) -> Case:
    """The case built for another actor of the same role column (another candidate, author, approver)."""
    other = {"worker": "lead", "lead": "worker", "coord": "worker", "alice": "rev", "rev": "alice"}[actor]
    if condition is C.MESSAGE_AUTHOR:
        other = "worker" if actor != "worker" else "rev"
    return case_of(kind, other, condition)


@dataclass(frozen=True)
class Break:
    """The condition broken once, and the exact refusal: (reason, metadata ``check``)."""

    how: str
    case: Callable[[str, str, authz.Condition], Case]
    refusal: tuple[str, str]
    # Kinds whose handler answers the same broken condition otherwise.
    except_for: Mapping[str, tuple[str, str]] = field(default_factory=dict)


STALE_EPOCH = Break(
    "a stale Coordinator epoch",
    lambda k, a, c: with_body(case_of(k, a, c), coordinator_epoch=7),
    ("COORDINATOR_EPOCH_STALE", ""),
)
BREAKS: dict[authz.Condition, Break] = {
    C.COORDINATOR_EPOCH: STALE_EPOCH,
    C.COORDINATOR_EPOCH_UNRECONCILED: STALE_EPOCH,
    C.COORDINATOR_RENEWAL: STALE_EPOCH,
    C.COORDINATOR_REVIEW: STALE_EPOCH,
    C.WORK_OWNER_UNDER_LEASE: Break(
        "no current lease cited",
        lambda k, a, c: with_body(case_of(k, a, c), lease_id="lease-0"),
        ("LEASE_STALE", ""),
    ),
    C.WORK_OWNER_REPORTING: Break(
        "no current lease cited while active",
        lambda k, a, c: with_body(case_of(k, a, c), lease_id="lease-0"),
        ("LEASE_STALE", ""),
    ),
    C.WORK_OWNER: Break(
        "a stale ownership epoch",
        lambda k, a, c: with_body(case_of(k, a, c), ownership_epoch=2),
        ("OWNERSHIP_EPOCH_STALE", ""),
    ),
    C.DELEGATION_GRANT: Break(
        "the grant revoked", lambda k, a, c: revoked_grant(case_of(k, a, c)), ("GRANT_INVALID", "revoked")
    ),
    C.EMERGENCY_OVERRIDE: Break(
        "no emergency override",
        lambda k, a, c: with_body(case_of(k, a, c), emergency_override=False),
        ("PERMISSION_DENIED", ""),
    ),
    C.OFFER_CANDIDATE: Break("the offer made to another", as_other, ("PERMISSION_DENIED", "")),
    C.MESSAGE_AUTHOR: Break("another's Message", as_other, ("PERMISSION_DENIED", "")),
    C.EXECUTION_APPROVER: Break("another approver named", as_other, ("PERMISSION_DENIED", "")),
    C.OWNER_REVIEWS_COORDINATOR_OUTPUT: Break(
        "a Worker's result",
        lambda k, a, c: accept_result(k, a, C.COORDINATOR_REVIEW),
        ("PERMISSION_DENIED", ""),
    ),
    C.LIVE_COORDINATOR: Break(
        "the lease lapsed",
        lambda k, a, c: at(case_of(k, a, c), LATE),
        ("LEASE_EXPIRED", ""),
    ),
    C.CURRENT_COORDINATOR: Break(
        "the lease held by a successor",
        lambda k, a, c: Case(SUCCEEDED, case_of(k, a, c).body, LATE),
        ("PERMISSION_DENIED", ""),
    ),
    C.OWNER_OF_BOTH: Break(
        "the target Mission owned by another",
        lambda k, a, c: Case(
            case_of(k, a, c).state, case_of(k, a, c).body, linked_group("grp_other", owner="coord")
        ),
        ("PERMISSION_DENIED", ""),
    ),
    C.ROOT_OWNER_APPROVAL: Break(
        "a child whose policy does not ask the root owner",
        lambda k, a, c: Case(AWAITING, case_of(k, a, c).body),
        ("PERMISSION_DENIED", ""),
    ),
    C.REVIEWER: Break(
        "a WorkItem not submitted",
        lambda k, a, c: Case(started("worker"), case_of(k, a, c).body),
        ("INVALID_TRANSITION", ""),
    ),
    C.STEWARD_REDACTION: Break(
        "no policy reason",
        lambda k, a, c: with_body(case_of(k, a, c), policy_reason=""),
        ("INVALID_ARGUMENT", ""),
    ),
    C.OWNER_ERASURE: Break(
        "no reason", lambda k, a, c: with_body(case_of(k, a, c), policy_reason=""), ("INVALID_ARGUMENT", "")
    ),
}
# Conditions the role alone meets, with nothing in a command to break: the MissionOwner's role is
# held by the MissionOwner; membership is what the Membership checks (tests/test_core_decider.py) and
# Organization policy its identity (test_organization_policy_acts_... below) decide.
UNBREAKABLE = {C.OWNER, C.MEMBER, C.ORGANIZATION}
# Restricted Conversations (MW-9-05) are tested in tests/test_conversations.py; the planning
# Conversation here admits every participant.
UNBREAKABLE |= {C.PARTICIPANT}
BROKEN = [cell for cell in ALLOWED if cell[2] in BREAKS]


def check_of(decision: decider.Decision) -> tuple[str, str]:
    if not isinstance(decision, Rejected):
        return "ACCEPTED", ""
    return decision.reason_name, decision.metadata.get("check", "")


def decided(body: str, actor: str, case: Case) -> decider.Decision:
    before = copy.deepcopy(case.state)
    decision = decide(case.state, body, case.body, actor, case.ctx)
    assert case.state == before  # decide never mutates the state
    return decision


# ---------------------------------------------------------------- the table itself


def test_every_kind_has_exactly_one_row_and_every_row_names_a_kind() -> None:
    assert set(authz.TABLE) == set(kinds.KINDS)
    assert set(SCENARIOS) | set(CREATORS) == set(kinds.KINDS)


def test_the_rows_are_well_formed() -> None:
    assert len(authz.Condition) == len(authz.Condition.__members__)  # no two conditions alias each other
    for body, rule in authz.TABLE.items():
        assert set(rule.roles) <= set(authz.ROLES), body
        assert all(rule.roles.values()), f"{body}: a role admitted under no condition"
        assert authz.OBSERVER not in rule.roles, f"{body}: observers hold read access only"
        assert bool(rule.outsider) == kinds.KINDS[body].creates_group, (
            body
        )  # only creators need no Membership
        assert not (kinds.KINDS[body].creates_group and rule.roles), body
        assert all(i.startswith("MW-") for i in rule.spec), body


def test_the_docs_are_the_table_rendered() -> None:
    doc = Path(__file__).resolve().parents[1] / "docs" / "authorization.md"
    assert doc.read_text(encoding="utf-8") == authz.markdown(), (
        "regenerate: python -m missionweave_server.services.authority.rules.authorization --markdown > docs/authorization.md"
    )


# ---------------------------------------------------------------- every actor x every kind


def test_every_cell_is_checked_and_every_condition_is_broken_or_says_why_not() -> None:
    assert {(b, a) for b, a, _ in ALLOWED} | set(REFUSED) == {(b, a) for b in GROUP_KINDS for a in ACTORS}
    assert set(SCENARIOS) == set(GROUP_KINDS)
    used = {
        c for rule in authz.TABLE.values() for cs in (*rule.roles.values(), rule.organization) for c in cs
    }
    assert used - set(authz.Condition.__members__.values()) == set()
    assert used <= set(BREAKS) | UNBREAKABLE, used - set(BREAKS) - UNBREAKABLE
    assert not set(BREAKS) & UNBREAKABLE


@pytest.mark.req(*SPEC_IDS)
@pytest.mark.parametrize(("body", "actor", "condition"), ALLOWED, ids=lambda v: getattr(v, "label", v))
def test_an_allowed_actor_meeting_the_condition_is_accepted(
    body: str, actor: str, condition: authz.Condition
) -> None:
    """Each allowed cell, in a state where the command is valid for that actor under that condition:
    accepted, with events (never the gate's refusal nor any other)."""
    decision = decided(body, actor, case_of(body, actor, condition))
    assert not isinstance(decision, Rejected), decision
    assert decision, "an accepted command appends events"


@pytest.mark.req(*SPEC_IDS, "MW-8-02", "MW-8-03")
@pytest.mark.parametrize(("body", "actor"), REFUSED)
def test_a_role_the_row_does_not_name_is_refused_by_the_gate(body: str, actor: str) -> None:
    """The very command its allowed actor would have issued, in a state where that one is accepted."""
    decision = decided(body, actor, first_case(body))
    assert isinstance(decision, Rejected), decision
    if actor in MEMBERS:
        assert check_of(decision) == ("PERMISSION_DENIED", "role"), decision
        assert decision.metadata["role"] == authz.role_label(MEMBERS[actor])
        assert decision.metadata["command"] == spec_name(body)
    else:  # no Membership, and Organization policy does not issue this kind
        assert check_of(decision) == ("NOT_A_MEMBER", ""), decision


@pytest.mark.parametrize(("body", "actor", "condition"), BROKEN, ids=lambda v: getattr(v, "label", v))
def test_the_condition_broken_once_gives_its_exact_refusal(
    body: str, actor: str, condition: authz.Condition
) -> None:
    broken = BREAKS[condition]
    decision = decided(body, actor, broken.case(body, actor, condition))
    assert check_of(decision) == broken.except_for.get(body, broken.refusal), f"{broken.how}: {decision!r}"


@pytest.mark.req("MW-7.1-T01", "MW-7.1-T02", "MW-7.1-T03", "MW-8-04")
@pytest.mark.parametrize("actor", ACTORS)
def test_kinds_that_create_their_group_name_no_role(actor: str) -> None:
    """Addressed to an existing Group they are refused for everyone; who creates one is the
    'no Membership' column, which the creating handlers check."""
    for body, message in CREATORS.items():
        assert check_of(decide(BASE, body, message, actor)) == ("GROUP_EXISTS", "")
    create = builders.mission_create("alice", "coord", NOW)
    allowed = actor in ("alice", ADMIN)  # the named human owner, or Organization policy
    assert check_of(decide(None, "mission_create", create, actor)) == (
        ("ACCEPTED", "") if allowed else ("PERMISSION_DENIED", "")
    )


# ---------------------------------------------------------------- acceptance the table allows


@pytest.mark.req("MW-7.2-10", "MW-10.2-T04", "MW-10.2-T07")
def test_the_coordinator_may_take_work_itself() -> None:
    """A Coordinator may execute coordination-native work: offered to itself, it accepts, starts
    under its own lease, and may decline a second offer."""
    state = run(BASE, "work_offer", offer("coord"), "coord")
    accept = wp.WorkAcceptOffer(work_item_id="wi", offer_id="off-1", contract_revision=1)
    state = run(state, "work_accept_offer", accept, "coord")
    state = run(
        state, "work_start", wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-1"), "coord"
    )
    lease = state.work_items["wi"].lease
    assert lease is not None and lease.agent_id == "coord"
    again = run(BASE, "work_offer", offer("coord", "off-2"), "coord")
    decline = wp.WorkDeclineOffer(
        work_item_id="wi", offer_id="off-2", decline=wp.StructuredDecline(reason=wp.DECLINE_REASON_CAPACITY)
    )
    run(again, "work_decline_offer", decline, "coord")


@pytest.mark.req("MW-9.1-18", "MW-10.3-04")
@pytest.mark.parametrize("candidate", ["alice", "rev", "obs"])
def test_work_is_offered_only_to_roles_that_may_accept_it(candidate: str) -> None:
    decision = decide(BASE, "work_offer", offer(candidate), "coord")
    assert isinstance(decision, Rejected) and decision.reason == R.REJECTION_REASON_INVALID_ARGUMENT, decision
    assert decision.metadata["field"] == "body.candidate_ids[0]"


@pytest.mark.req("MW-10.2-T06")
def test_a_reviewer_named_as_execution_approver_approves() -> None:
    body = wp.WorkAuthorize(
        work_item_id="gated", title="gated", contract=builders.contract(NOW), coordinator_epoch=1
    )
    body.contract.requires_execution_approval = True
    body.contract.execution_approver_ids.append("rev")
    state = run(BASE, "work_authorize", body, "coord")
    gated = offer("worker")
    gated.work_item_id = "gated"
    state = run(state, "work_offer", gated, "coord")
    state = run(
        state,
        "work_accept_offer",
        wp.WorkAcceptOffer(work_item_id="gated", offer_id="off-1", contract_revision=1),
        "worker",
    )
    approve = wp.ApprovalGrantExecution(work_item_id="gated", contract_revision=1, ownership_epoch=1)
    assert check_of(decide(state, "approval_grant_execution", approve, "alice")) == (
        "PERMISSION_DENIED",
        "",
    )  # not named
    state = run(state, "approval_grant_execution", approve, "rev")
    assert state.work_items["gated"].execution_approved == (1, 1, None)


@pytest.mark.req("MW-8-04", "MW-7.1-T07", "MW-7.1-T08")
def test_organization_policy_acts_without_a_membership_and_as_a_member() -> None:
    cancel = mission_pb2.MissionCancel(reason="stop")
    run(BASE, "mission_cancel", cancel, ADMIN)
    run(BASE, "mission_terminate", mission_pb2.MissionTerminate(reason="policy"), ADMIN)
    # An administrator holding a Worker's Membership keeps Organization policy's authority...
    ctx = decider.DecisionContext(
        NOW, {**IDS, "worker": IdentityInfo("worker", AGENT, org_admin=True, session_epoch=1)}
    )
    run(BASE, "mission_cancel", cancel, "worker", ctx)
    # ...and is a Worker for everything else.
    assert check_of(decide(BASE, "work_cancel", first_case("work_cancel").body, "worker", ctx)) == (
        "PERMISSION_DENIED",
        "role",
    )


@pytest.mark.req("MW-9.1-15")
def test_the_mission_owner_revokes_a_grant() -> None:
    grant = membership_pb2.MembershipGrantDelegation(
        grantee_id="lead",
        target_work_item_id="wi",
        caps=common_pb2.ResourceVector(currency="EUR"),
        allowed_capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.11")],
        max_descendant_depth=1,
        expires_at=SOON,
        coordinator_epoch=1,
    )
    state = run(BASE, "membership_grant_delegation", grant, "coord")
    [grant_id] = state.grants
    state = run(
        state,
        "membership_revoke_delegation",
        membership_pb2.MembershipRevokeDelegation(grant_id=grant_id, reason="r"),
        "alice",
    )
    assert state.grants[grant_id].revoked


@pytest.mark.req("MW-9.1-02", "MW-9.1-18", "MW-9.1-01")
def test_a_worker_never_shapes_work_even_citing_a_grant() -> None:
    cite = wp.WorkAuthorize(
        title="t", contract=builders.contract(NOW), parent_work_item_id="wi", grant_id="grant_x"
    )
    for kind, body in (("work_authorize", cite), ("work_offer", offer("worker"))):
        assert check_of(decide(BASE, kind, body, "worker")) == ("PERMISSION_DENIED", "role")
