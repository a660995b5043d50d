"""Mission lifecycle (spec 7.1, table MW-7.1-T01..T08), Coordinator lease (7.2), completion (7.3)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from missionweave.kernel import codec, ids
from missionweave.kernel.clock import from_timestamp, to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, conversation_pb2, event_pb2, membership_pb2, mission_pb2, work_pb2
from missionweave_server.services.authority.rules.common import (
    MAX_REFS,
    MS,
    TERMINAL_MISSION_STATES,
    Applier,
    CommandKind,
    DecisionContext,
    Emitter,
    Kind,
    R,
    Role,
    check_artifact_refs,
    identity,
    invalid,
    is_org_policy,
    mission_of,
    named_digests,
    renewal,
    require_reason,
    state_name,
    validate_definition,
)
from missionweave_server.services.authority.rules.deliverables import require_held
from missionweave_server.services.authority.state import (
    CoordinatorLeaseState,
    GroupState,
    IdentityInfo,
    MissionRecord,
    TransferGrant,
)

# A directive's parameters: one JSON object of at most this many bytes (UTF-8).
MAX_PARAMETERS_JSON_BYTES = 16 * 1024

# ---------------------------------------------------------------- authority checks


def require_live(mission: MissionRecord, command_name: str) -> None:
    """MW-7.1-06/07: terminal Missions are never reopened or rewritten."""
    if mission.state in TERMINAL_MISSION_STATES:
        raise Rejected(
            R.REJECTION_REASON_TERMINAL_STATE,
            f"{command_name}: the Mission is {state_name(mission.state)}, a terminal state; "
            "corrections go through a linked follow-up Mission (MW-7.1-08)",
            state=state_name(mission.state),
        )


def _require_state(mission: MissionRecord, wanted: int, command_name: str) -> None:
    require_live(mission, command_name)
    if mission.state != wanted:
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION,
            f"{command_name} needs a Mission in {state_name(wanted)}, it is {state_name(mission.state)}",
            state=state_name(mission.state),
        )


def require_coordinator(
    state: GroupState,
    command: command_pb2.Command,
    ctx: DecisionContext,
    coordinator_epoch: int,
    command_name: str,
    *,
    needs_reconciliation: bool = True,
) -> None:
    """MW-7.2-03/06/08: the current Coordinator epoch, its live lease and session, reconciled."""
    mission = mission_of(state)
    lease = mission.coordinator
    if lease is None:
        raise Rejected(R.REJECTION_REASON_PERMISSION_DENIED, "the Mission has no Coordinator")
    if command.actor_id != lease.agent_id:
        if command.actor_id in mission.coordinator_agents.values():
            raise Rejected(
                R.REJECTION_REASON_COORDINATOR_EPOCH_STALE,
                f"{command.actor_id} was replaced as Coordinator; epoch {lease.coordinator_epoch} is current (MW-7.2-06)",
                current_epoch=lease.coordinator_epoch,
            )
        raise Rejected(R.REJECTION_REASON_PERMISSION_DENIED, f"{command_name} is issued by the current Coordinator")
    if coordinator_epoch != lease.coordinator_epoch:
        raise Rejected(
            R.REJECTION_REASON_COORDINATOR_EPOCH_STALE,
            f"coordinator epoch {coordinator_epoch} is not the current {lease.coordinator_epoch} (MW-7.2-06)",
            current_epoch=lease.coordinator_epoch,
        )
    if lease.expires_at <= ctx.now:
        raise Rejected(
            R.REJECTION_REASON_LEASE_EXPIRED,
            f"the Coordinator lease expired at {lease.expires_at.isoformat()}: the MissionOwner appoints a Coordinator "
            "(`mwp coordinator replace`), which then reconciles (`mwp coordinator reconcile`) (MW-7.2-04/08)",
        )
    if command.session_epoch != lease.session_epoch:
        raise Rejected(
            R.REJECTION_REASON_LEASE_STALE,
            f"the lease is bound to session {lease.session_epoch}; renew it from session {command.session_epoch} "
            "(`mwp coordinator renew`)",
            lease_session_epoch=lease.session_epoch,
        )
    if needs_reconciliation and not lease.reconciled:
        raise Rejected(
            R.REJECTION_REASON_RECONCILIATION_REQUIRED,
            "a replacement Coordinator acknowledges reconciliation of the current state first (MW-7.2-08)",
        )


def _unverified_required_work(state: GroupState) -> list[str]:
    """MW-7.3-04: required WorkItems whose results and acceptance Evidence are not verified.

    Until the WorkItem rules land no command creates WorkItems, so a Group's graph is empty and this
    finds none; the check itself runs on every submission.
    """
    return [
        wid
        for wid, item in state.work_items.items()
        if item.required and item.state not in (work_pb2.WORK_ITEM_STATE_VERIFIED, work_pb2.WORK_ITEM_STATE_CANCELLED)
    ]


def _linked_mission(ctx: DecisionContext, group_id: str, mission_id: str, field: str) -> MissionRecord:
    linked = ctx.linked.get(group_id)
    if not group_id or linked is None or linked.mission is None:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"{field}: no Group {group_id!r} with a Mission", field=field)
    if mission_id and linked.mission.mission_id != mission_id:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND, f"{field}: Group {group_id} holds {linked.mission.mission_id}, not {mission_id}"
        )
    return linked.mission


# ---------------------------------------------------------------- creation (T01, T02)


def open_mission(
    command: command_pb2.Command,
    ctx: DecisionContext,
    out: Emitter,
    definition: mission_pb2.MissionDefinition,
    coordinator_id: str,
    renewal_policy: mission_pb2.RenewalPolicy,
    kind: mission_pb2.MissionKind.ValueType,
    follows_up_mission_id: str = "",
    parent_mission_id: str = "",
    parent_work_item_id: str = "",
) -> None:
    """MW-7.1-03: one Group, one planning Conversation, owner and Coordinator Memberships, lease."""
    coordinator = identity(ctx, coordinator_id, "body.coordinator_id")
    if coordinator.kind not in (Kind.IDENTITY_KIND_AGENT, Kind.IDENTITY_KIND_HUMAN):
        raise invalid("body.coordinator_id", "the Coordinator must be an agent or a human")
    if coordinator_id == definition.owner_id:
        # MW-7.2-11: the owner reviews the Coordinator's submission; one identity cannot be both.
        raise invalid("body.coordinator_id", "the MissionOwner cannot also be the Coordinator (separation of review)")
    duration, renew_before = renewal(renewal_policy)
    mission_id = f"mis_{ids.suffix(command.group_id)}"
    planning_id = ids.derived_id("conv", command.group_id, "planning")
    out.emit(
        "mission.created",
        "mission_created",
        mission_pb2.MissionCreated(
            mission_id=mission_id,
            kind=kind,
            definition=definition,
            planning_conversation_id=planning_id,
            follows_up_mission_id=follows_up_mission_id,
            parent_mission_id=parent_mission_id,
            parent_work_item_id=parent_work_item_id,
        ),
    )
    out.emit(
        "conversation.opened",
        "conversation_opened",
        conversation_pb2.ConversationOpened(
            conversation_id=planning_id, kind=conversation_pb2.CONVERSATION_KIND_PLANNING, title=definition.title
        ),
    )
    # MW-8-05: owner and Coordinator see the whole Group (visibility from sequence 1).
    for epoch, (member_id, role) in enumerate(
        ((definition.owner_id, Role.MEMBER_ROLE_MISSION_OWNER), (coordinator_id, Role.MEMBER_ROLE_COORDINATOR)), start=1
    ):
        grant_full_membership(out, command.group_id, member_id, role, epoch)
    _grant_lease(out, command, ctx, coordinator_id, coordinator, 1, duration, renew_before, reconciled=True)


def grant_full_membership(out: Emitter, group_id: str, member_id: str, role: int, epoch: int) -> None:
    out.emit(
        "membership.granted",
        "membership_granted",
        membership_pb2.MembershipGranted(
            membership=membership_pb2.Membership(
                member_id=member_id,
                group_id=group_id,
                membership_epoch=epoch,
                role=role,  # type: ignore[arg-type]
                visibility_start_sequence=1,
                active=True,
            )
        ),
    )


def revoke_membership(out: Emitter, member_id: str, membership_epoch: int, reason: str) -> None:
    """MW-8-03: the Membership ends; every later command from its epoch is stale."""
    out.emit(
        "membership.revoked",
        "membership_revoked",
        membership_pb2.MembershipRevoked(member_id=member_id, membership_epoch=membership_epoch, reason=reason),
    )


def _grant_lease(
    out: Emitter,
    command: command_pb2.Command,
    ctx: DecisionContext,
    agent_id: str,
    agent: IdentityInfo,
    epoch: int,
    duration: timedelta,
    renew_before: timedelta,
    *,
    reconciled: bool,
    replaced_epoch: int = 0,
) -> None:
    """MW-7.2-02: agent, Coordinator epoch, session epoch, expiry and renewal policy."""
    lease = mission_pb2.CoordinatorLease(
        agent_id=agent_id,
        coordinator_epoch=epoch,
        session_epoch=agent.session_epoch,
        expires_at=to_timestamp(ctx.now + duration),
        renewal_policy=mission_pb2.RenewalPolicy(),
        reconciled=reconciled,
    )
    lease.renewal_policy.lease_duration.FromTimedelta(duration)
    lease.renewal_policy.renew_before.FromTimedelta(renew_before)
    out.emit(
        "mission.coordinator_lease.granted",
        "coordinator_lease_granted",
        mission_pb2.CoordinatorLeaseGranted(
            lease=lease, appointed_by=command.actor_id, replaced_coordinator_epoch=replaced_epoch
        ),
    )


def _require_human_owner(ctx: DecisionContext, owner_id: str) -> IdentityInfo:
    owner = identity(ctx, owner_id, "body.definition.owner_id")
    if owner.kind != Kind.IDENTITY_KIND_HUMAN:
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT,
            "the MissionOwner of a root Mission must be a human identity (MW-7.1-02)",
            field="body.definition.owner_id",
        )
    return owner


def mission_create(state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter) -> None:
    """MW-7.1-T01: a root Mission with one Group, one planning Conversation and a Coordinator lease."""
    body = command.mission_create
    definition = body.definition
    validate_definition(definition, ctx)
    _require_human_owner(ctx, definition.owner_id)
    identity(ctx, command.actor_id, "actor_id")
    if command.actor_id != definition.owner_id and not is_org_policy(ctx, command.actor_id):
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "mission.create is issued by the human MissionOwner or the Organization control plane (MW-7.1-T01)",
        )
    open_mission(command, ctx, out, definition, body.coordinator_id, body.coordinator_renewal, mission_pb2.MISSION_KIND_ROOT)


def mission_create_follow_up(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-T02 / MW-7.1-08: a new Group linked to an approved Mission, by the same human owner."""
    body = command.mission_create_follow_up
    approved = _linked_mission(ctx, body.approved_group_id, body.approved_mission_id, "body.approved_group_id")
    if approved.state != MS.MISSION_STATE_APPROVED:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"a follow-up links to an approved Mission; {approved.mission_id} is {state_name(approved.state)}",
        )
    definition = body.definition
    validate_definition(definition, ctx)
    _require_human_owner(ctx, definition.owner_id)
    if definition.owner_id != approved.owner_id:
        raise invalid("body.definition.owner_id", f"a follow-up keeps the MissionOwner {approved.owner_id} (MW-7.1-T02)")
    if command.actor_id != approved.owner_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"mission.create_follow_up is issued by the same human MissionOwner {approved.owner_id} (MW-7.1-T02)",
        )
    open_mission(
        command,
        ctx,
        out,
        definition,
        body.coordinator_id,
        body.coordinator_renewal,
        mission_pb2.MISSION_KIND_FOLLOW_UP,
        follows_up_mission_id=approved.mission_id,
    )


# ---------------------------------------------------------------- completion (T04..T06, 7.3)


def mission_submit_for_approval(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-T04 / MW-7.3-04/05: the current Coordinator submits a specific revision and Artifact set."""
    assert state is not None
    body = command.mission_submit_for_approval
    mission = mission_of(state)
    require_coordinator(state, command, ctx, body.coordinator_epoch, "mission.submit_for_approval")
    _require_state(mission, MS.MISSION_STATE_ACTIVE, "mission.submit_for_approval")
    if body.mission_revision != mission.revision:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"submission names Mission revision {body.mission_revision}; the current one is {mission.revision}",
            current_revision=mission.revision,
        )
    check_artifact_refs(body.artifacts, "body.artifacts")
    unverified = _unverified_required_work(state)
    if unverified:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"required WorkItems are not verified: {', '.join(sorted(unverified)[:10])} (MW-7.3-04)",
        )
    require_held(state, command, ctx, body.artifacts, "body.artifacts")
    out.emit(
        "mission.submitted",
        "mission_submitted",
        mission_pb2.MissionSubmitted(
            mission_revision=body.mission_revision,
            artifacts=body.artifacts,
            summary=body.summary,
            coordinator_epoch=body.coordinator_epoch,
        ),
    )


def _answer_submission(state: GroupState, submission_event_id: str, name: str) -> None:
    """The owner's answer (only the MissionOwner's role may issue it: rules/authorization.py)."""
    mission = mission_of(state)
    _require_state(mission, MS.MISSION_STATE_AWAITING_APPROVAL, name)
    if submission_event_id != mission.latest_submission_event_id:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"{name} answers the latest submission {mission.latest_submission_event_id}, not {submission_event_id!r}",
            latest_submission_event_id=mission.latest_submission_event_id,
        )


def mission_request_changes(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-T05 / MW-7.3-06/07: the owner's signed change request reopens the same Mission."""
    assert state is not None
    body = command.mission_request_changes
    _answer_submission(state, body.submission_event_id, "mission.request_changes")
    require_reason(body.requested_changes, "body.requested_changes")
    out.emit(
        "mission.changes_requested",
        "mission_changes_requested",
        mission_pb2.MissionChangesRequested(
            submission_event_id=body.submission_event_id,
            requested_changes=body.requested_changes,
            owner_signed_command=ctx.envelope,
        ),
    )


def mission_approve(state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter) -> None:
    """MW-7.1-T06 / MW-7.3-06: the owner's signed Approval; `approved` is terminal. MW-14-10: a
    child whose risk policy requires it is approved by the root MissionOwner first."""
    assert state is not None
    body = command.mission_approve
    _answer_submission(state, body.submission_event_id, "mission.approve")
    mission = mission_of(state)
    needs_root = mission.kind == mission_pb2.MISSION_KIND_CHILD and mission.definition.risk_policy.require_root_owner_approval
    if command.actor_id != mission.owner_id:  # the table admits a reviewer for this one case
        if not needs_root or command.actor_id != mission.root_owner_id:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED,
                "mission.approve is the MissionOwner's; a reviewer approves only as the root MissionOwner of a "
                "child whose risk policy requires it (MW-14-10)",
            )
        if mission.root_owner_approval_event_id:
            raise Rejected(R.REJECTION_REASON_INVALID_TRANSITION, "the root MissionOwner already approved this submission")
        out.emit(
            "mission.root_owner_approved",
            "root_owner_approved",
            mission_pb2.MissionApproved(
                submission_event_id=body.submission_event_id, comment=body.comment, owner_signed_command=ctx.envelope
            ),
        )
        return
    if needs_root and not mission.root_owner_approval_event_id:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"the risk policy requires the root MissionOwner {mission.root_owner_id} to approve this submission first (MW-14-10)",
            root_owner_id=mission.root_owner_id,
        )
    out.emit(
        "mission.approved",
        "mission_approved",
        mission_pb2.MissionApproved(
            submission_event_id=body.submission_event_id, comment=body.comment, owner_signed_command=ctx.envelope
        ),
    )


def mission_revoke_approval(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-08/09, OP-29: a new event beside the Approval, citing the linked follow-up Mission."""
    assert state is not None
    body = command.mission_revoke_approval
    mission = mission_of(state)
    if mission.state != MS.MISSION_STATE_APPROVED:
        raise Rejected(R.REJECTION_REASON_INVALID_TRANSITION, "only an approved Mission's approval can be revoked")
    if body.approval_event_id != mission.approval_event_id:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"{body.approval_event_id!r} is not this Mission's approval")
    if mission.approval_revoked_event_id:
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION, f"the approval was already revoked by {mission.approval_revoked_event_id}"
        )
    require_reason(body.reason, "body.reason")
    follow_up = _linked_mission(ctx, body.follow_up_group_id, body.follow_up_mission_id, "body.follow_up_group_id")
    if follow_up.follows_up_mission_id != mission.mission_id:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"{follow_up.mission_id} is not a follow-up of {mission.mission_id}; create it with "
            "mission.create_follow_up first (MW-7.1-08)",
        )
    out.emit(
        "mission.approval_revoked",
        "mission_approval_revoked",
        mission_pb2.MissionApprovalRevoked(
            approval_event_id=body.approval_event_id,
            reason=body.reason,
            follow_up_mission_id=follow_up.mission_id,
            follow_up_group_id=body.follow_up_group_id,
        ),
    )


# ---------------------------------------------------------------- ending (T07, T08)


def mission_cancel(state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter) -> None:
    """MW-7.1-T07 / MW-7.1-11: the MissionOwner or Organization policy (the authorization table
    admits no other role); a Coordinator may recommend cancellation or terminate the Mission as failed."""
    assert state is not None
    mission = mission_of(state)
    require_live(mission, "mission.cancel")
    if len(command.mission_cancel.reason) > 4096:
        raise invalid("body.reason", "at most 4096 characters")
    out.emit("mission.cancelled", "mission_cancelled", mission_pb2.MissionCancelled(reason=command.mission_cancel.reason))


def mission_terminate(state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter) -> None:
    """MW-7.1-T08: the current Coordinator or Organization policy ends the Mission as failed."""
    assert state is not None
    body = command.mission_terminate
    mission = mission_of(state)
    require_live(mission, "mission.terminate")
    if not is_org_policy(ctx, command.actor_id):
        require_coordinator(state, command, ctx, body.coordinator_epoch, "mission.terminate", needs_reconciliation=False)
    require_reason(body.reason, "body.reason")
    out.emit("mission.failed", "mission_failed", mission_pb2.MissionFailed(reason=body.reason))


# ---------------------------------------------------------------- Coordinator lease (7.2)


def mission_renew_coordinator_lease(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.2-02: the current Coordinator extends its live lease (and binds it to its current session)."""
    assert state is not None
    mission = mission_of(state)
    require_live(mission, "mission.renew_coordinator_lease")
    lease = mission.coordinator
    assert lease is not None
    epoch = command.mission_renew_coordinator_lease.coordinator_epoch
    if command.actor_id != lease.agent_id or epoch != lease.coordinator_epoch:
        raise Rejected(
            R.REJECTION_REASON_COORDINATOR_EPOCH_STALE,
            f"only the current Coordinator epoch {lease.coordinator_epoch} renews its lease (MW-7.2-06)",
            current_epoch=lease.coordinator_epoch,
        )
    if lease.expires_at <= ctx.now:
        raise Rejected(
            R.REJECTION_REASON_LEASE_EXPIRED,
            "the lease has lapsed; the MissionOwner or the control plane appoints a Coordinator "
            "(`mwp coordinator replace`) (MW-7.2-04)",
        )
    expires = ctx.now + timedelta(seconds=lease.lease_duration_s)
    out.emit(
        "mission.coordinator_lease.renewed",
        "coordinator_lease_renewed",
        mission_pb2.CoordinatorLeaseRenewed(
            coordinator_epoch=epoch, expires_at=to_timestamp(expires), session_epoch=command.session_epoch
        ),
    )


def mission_replace_coordinator(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.2-04/05/08: after the lease lapsed, the owner or control plane appoints a higher epoch."""
    assert state is not None
    body = command.mission_replace_coordinator
    mission = mission_of(state)
    require_live(mission, "mission.replace_coordinator")
    lease = mission.coordinator
    assert lease is not None
    if body.replaced_coordinator_epoch != lease.coordinator_epoch:
        raise Rejected(
            R.REJECTION_REASON_COORDINATOR_EPOCH_STALE,
            f"replaced_coordinator_epoch {body.replaced_coordinator_epoch} is not the current {lease.coordinator_epoch}",
            current_epoch=lease.coordinator_epoch,
        )
    if lease.expires_at > ctx.now:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"the Coordinator lease is live until {lease.expires_at.isoformat()}; it is replaced once it lapses",
            expires_at=lease.expires_at.isoformat(),
        )
    agent = identity(ctx, body.coordinator_id, "body.coordinator_id")
    if agent.kind not in (Kind.IDENTITY_KIND_AGENT, Kind.IDENTITY_KIND_HUMAN):
        raise invalid("body.coordinator_id", "the Coordinator must be an agent or a human")
    if body.coordinator_id == mission.owner_id:
        raise invalid("body.coordinator_id", "the MissionOwner cannot also be the Coordinator (MW-7.2-11)")
    duration, renew_before = renewal(body.coordinator_renewal)
    member = state.members.get(body.coordinator_id)
    if member is None or not member.active or member.role != Role.MEMBER_ROLE_COORDINATOR:
        grant_full_membership(
            out, command.group_id, body.coordinator_id, Role.MEMBER_ROLE_COORDINATOR, state.last_membership_epoch + 1
        )
    # MW-7.2-08: the replacement starts unreconciled; it reads the signed summary and acknowledges.
    _grant_lease(
        out,
        command,
        ctx,
        body.coordinator_id,
        agent,
        lease.coordinator_epoch + 1,
        duration,
        renew_before,
        reconciled=False,
        replaced_epoch=lease.coordinator_epoch,
    )


def mission_acknowledge_reconciliation(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.2-08: the replacement cites the Group revision of the state it has read."""
    assert state is not None
    body = command.mission_acknowledge_reconciliation
    mission = mission_of(state)
    require_live(mission, "mission.acknowledge_reconciliation")
    require_coordinator(
        state, command, ctx, body.coordinator_epoch, "mission.acknowledge_reconciliation", needs_reconciliation=False
    )
    lease = mission.coordinator
    assert lease is not None
    if lease.reconciled:
        raise Rejected(R.REJECTION_REASON_INVALID_TRANSITION, "this Coordinator epoch is already reconciled")
    floor = max(lease.granted_at_sequence, state.last_work_change_sequence)
    if not floor <= body.group_revision <= state.head_sequence:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"reconcile against a revision in {floor}..{state.head_sequence}: the state since the appointment and "
            "every WorkItem change must have been read",
            current_revision=state.head_sequence,
        )
    out.emit(
        "mission.reconciliation.acknowledged",
        "reconciliation_acknowledged",
        mission_pb2.ReconciliationAcknowledged(coordinator_epoch=body.coordinator_epoch, group_revision=body.group_revision),
    )


def mission_issue_directive(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-12: the MissionOwner directs the Coordinator (recorded; it assigns nothing by itself)."""
    assert state is not None
    body = command.mission_issue_directive
    mission = mission_of(state)
    require_live(mission, "mission.issue_directive")
    require_reason(body.directive, "body.directive")
    if body.parameters_json:  # an object of at most 16 KiB, nested at most codec.MAX_JSON_DEPTH deep
        codec.json_object(body.parameters_json, "body.parameters_json", max_bytes=MAX_PARAMETERS_JSON_BYTES)
    out.emit(
        "mission.directive.issued",
        "mission_directive_issued",
        mission_pb2.MissionDirectiveIssued(directive=body.directive, parameters_json=body.parameters_json),
    )


def mission_authorize_context_transfer(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-13.3-05/07: content enters another Mission's context only by the MissionOwner's recorded
    authorization, and only into a Mission the same owner is accountable for."""
    assert state is not None
    body = command.mission_authorize_context_transfer
    require_reason(body.reason, "body.reason")
    if body.target_group_id == command.group_id:
        raise invalid("body.target_group_id", "another Group (a Group's own context needs no transfer)")
    target = ctx.linked.get(body.target_group_id)
    if target is None or target.mission is None:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no Group {body.target_group_id}", field="body.target_group_id")
    if target.mission.owner_id != command.actor_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"the target Mission is owned by {target.mission.owner_id}; only a MissionOwner of both Missions "
            "authorizes a transfer between them",
        )
    if len(body.work_item_ids) > MAX_REFS:
        raise invalid("body.work_item_ids", f"at most {MAX_REFS}")
    for i, wid in enumerate(body.work_item_ids):
        if wid not in state.work_items:
            raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no WorkItem {wid} in this Group", field=f"body.work_item_ids[{i}]")
    out.emit(
        "mission.context_transfer.authorized",
        "mission_context_transfer_authorized",
        mission_pb2.MissionContextTransferAuthorized(
            target_group_id=body.target_group_id, work_item_ids=sorted(set(body.work_item_ids)), reason=body.reason
        ),
    )

def check_transfer(state: GroupState, target_group_id: str, authorization_id: str, work_item_ids: Sequence[str]) -> None:
    """MW-13.3-05/07: another Group receives this Group's context only under a recorded authorization
    for that Group that covers the requested scope."""
    if not target_group_id:
        raise Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, "an authorization is given with target_group_id", field="target_group_id")
    if not authorization_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "Group content does not enter another Mission's context by default: cite the "
            "mission.context_transfer.authorized event (transfer_authorization_event_id)",
        )
    grant = state.transfers.get(authorization_id)
    if grant is None or grant.target_group_id != target_group_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"{authorization_id} is not an authorization of this Group for {target_group_id}",
            field="transfer_authorization_event_id",
        )
    if grant.work_item_ids and not (work_item_ids and set(work_item_ids) <= set(grant.work_item_ids)):
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"the authorization covers WorkItems {', '.join(grant.work_item_ids)} only",
            field="work_item_ids",
        )


# ---------------------------------------------------------------- evolve rules


def _created(state: GroupState, event: event_pb2.Event) -> None:
    p = event.mission_created
    state.mission = MissionRecord(
        mission_id=p.mission_id,
        kind=p.kind,
        definition=p.definition,
        state=MS.MISSION_STATE_ACTIVE,
        revision=1,
        planning_conversation_id=p.planning_conversation_id,
        created_at=from_timestamp(event.recorded_at),
        follows_up_mission_id=p.follows_up_mission_id,
        parent_mission_id=p.parent_mission_id,
        parent_work_item_id=p.parent_work_item_id,
        root_owner_id=p.definition.owner_id,  # a child's is set by its mission.parent.linked
    )


def _lease_granted(state: GroupState, event: event_pb2.Event) -> None:
    mission = mission_of(state)
    lease = event.coordinator_lease_granted.lease
    mission.coordinator = CoordinatorLeaseState(
        agent_id=lease.agent_id,
        coordinator_epoch=lease.coordinator_epoch,
        session_epoch=lease.session_epoch,
        expires_at=from_timestamp(lease.expires_at),
        lease_duration_s=lease.renewal_policy.lease_duration.ToTimedelta().total_seconds(),
        renew_before_s=lease.renewal_policy.renew_before.ToTimedelta().total_seconds(),
        reconciled=lease.reconciled,
        granted_at_sequence=event.sequence,
    )
    mission.coordinator_agents[lease.coordinator_epoch] = lease.agent_id


def _lease_renewed(state: GroupState, event: event_pb2.Event) -> None:
    lease = mission_of(state).coordinator
    assert lease is not None
    lease.expires_at = from_timestamp(event.coordinator_lease_renewed.expires_at)
    lease.session_epoch = event.coordinator_lease_renewed.session_epoch


def _reconciled(state: GroupState, event: event_pb2.Event) -> None:
    lease = mission_of(state).coordinator
    assert lease is not None
    lease.reconciled = True


def _transition(new_state: int) -> Applier:
    def apply(state: GroupState, event: event_pb2.Event) -> None:
        mission = mission_of(state)
        mission.state = new_state
        mission.revision += 1

    return apply


def _submitted(state: GroupState, event: event_pb2.Event) -> None:
    _transition(MS.MISSION_STATE_AWAITING_APPROVAL)(state, event)
    mission = mission_of(state)
    mission.latest_submission_event_id = event.event_id
    mission.latest_submission_artifacts = tuple(event.mission_submitted.artifacts)
    mission.root_owner_approval_event_id = ""


def _root_owner_approved(state: GroupState, event: event_pb2.Event) -> None:
    mission_of(state).root_owner_approval_event_id = event.event_id


def _approved(state: GroupState, event: event_pb2.Event) -> None:
    _transition(MS.MISSION_STATE_APPROVED)(state, event)
    mission_of(state).approval_event_id = event.event_id


def _approval_revoked(state: GroupState, event: event_pb2.Event) -> None:
    # OP-29: the Mission stays approved and its revision unchanged; the revocation sits beside it.
    mission = mission_of(state)
    mission.approval_revoked_event_id = event.event_id
    mission.follow_up_mission_ids.append(event.mission_approval_revoked.follow_up_mission_id)


def _nothing(state: GroupState, event: event_pb2.Event) -> None:
    """Recorded history that changes no decision state (directives)."""


def _transfer_authorized(state: GroupState, event: event_pb2.Event) -> None:
    grant = event.mission_context_transfer_authorized
    state.transfers[event.event_id] = TransferGrant(grant.target_group_id, tuple(grant.work_item_ids))


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "mission_create",
        mission_create,
        {"mission_created": _created, "coordinator_lease_granted": _lease_granted},
        creates_group=True,
        references=lambda c: (c.mission_create.definition.owner_id, c.mission_create.coordinator_id),
    ),
    CommandKind(
        "mission_create_follow_up",
        mission_create_follow_up,
        creates_group=True,
        references=lambda c: (c.mission_create_follow_up.definition.owner_id, c.mission_create_follow_up.coordinator_id),
        linked_groups=lambda c: (c.mission_create_follow_up.approved_group_id,),
    ),
    CommandKind(
        "mission_submit_for_approval",
        mission_submit_for_approval,
        {"mission_submitted": _submitted},
        named_artifacts=lambda c: named_digests(c.mission_submit_for_approval.artifacts),
    ),
    CommandKind(
        "mission_request_changes",
        mission_request_changes,
        {"mission_changes_requested": _transition(MS.MISSION_STATE_ACTIVE)},
    ),
    CommandKind(
        "mission_approve", mission_approve, {"mission_approved": _approved, "root_owner_approved": _root_owner_approved}
    ),
    CommandKind(
        "mission_revoke_approval",
        mission_revoke_approval,
        {"mission_approval_revoked": _approval_revoked},
        linked_groups=lambda c: (c.mission_revoke_approval.follow_up_group_id,),
    ),
    CommandKind(
        "mission_cancel",
        mission_cancel,
        {"mission_cancelled": _transition(MS.MISSION_STATE_CANCELLED)},
        ends_mission=MS.MISSION_STATE_CANCELLED,
    ),
    CommandKind(
        "mission_terminate",
        mission_terminate,
        {"mission_failed": _transition(MS.MISSION_STATE_FAILED)},
        ends_mission=MS.MISSION_STATE_FAILED,
    ),
    CommandKind(
        "mission_renew_coordinator_lease", mission_renew_coordinator_lease, {"coordinator_lease_renewed": _lease_renewed}
    ),
    CommandKind(
        "mission_replace_coordinator",
        mission_replace_coordinator,
        references=lambda c: (c.mission_replace_coordinator.coordinator_id,),
    ),
    CommandKind(
        "mission_acknowledge_reconciliation",
        mission_acknowledge_reconciliation,
        {"reconciliation_acknowledged": _reconciled},
    ),
    CommandKind("mission_issue_directive", mission_issue_directive, {"mission_directive_issued": _nothing}),
    CommandKind(
        "mission_authorize_context_transfer",
        mission_authorize_context_transfer,
        {"mission_context_transfer_authorized": _transfer_authorized},
        linked_groups=lambda c: (c.mission_authorize_context_transfer.target_group_id,),
    ),
)

__all__ = ["KINDS", "check_transfer", "grant_full_membership", "open_mission", "require_coordinator", "require_live"]
