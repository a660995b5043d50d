"""MW-10.2-T06, T07: the execution approval gate and the start under a new execution lease."""

from __future__ import annotations

from datetime import datetime

from missionweave.kernel import ids
from missionweave.kernel.clock import from_timestamp, to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import (
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    invalid,
    mission_of,
)
from missionweave_server.services.authority.rules.missions.common import require_live
from missionweave_server.services.authority.rules.work.common import (
    ACTIVE,
    DEFAULT_EXECUTION_LEASE,
    QUEUED,
    attempt_end,
    begin_lease,
    policy_duration,
    require_state,
    touch,
    work_item,
)
from missionweave_server.services.authority.rules.work.contract import require_dependencies
from missionweave_server.services.authority.rules.work.leases import (
    apply_lease_revoked,
    capability_token,
    narrow_scope,
    replaced_session_lease,
    revoke_lease,
)
from missionweave_server.services.authority.state import SIX, ExecutionLeaseState, GroupState, WorkItemState


def approval_required(state: GroupState, item: WorkItemState) -> bool:
    """MW-10.2-T06: the contract asks for execution approval, or its risk class is at or above the
    Mission's execution approval threshold (RiskPolicy, MW-7.1-01)."""
    threshold = mission_of(state).definition.risk_policy.execution_approval_threshold
    return item.contract.requires_execution_approval or (
        bool(threshold) and item.contract.risk_class >= threshold
    )


def execution_approvers(state: GroupState, item: WorkItemState) -> list[str]:
    """OP-14: the approvers the contract names, else those of the Mission's risk policy, else the MissionOwner."""
    mission = mission_of(state)
    return (
        list(item.contract.execution_approver_ids)
        or list(mission.definition.risk_policy.execution_approver_ids)
        or [mission.owner_id]
    )


def approval_in_force(item: WorkItemState, now: datetime) -> bool:
    """An execution approval of the current contract revision, for the current owner (or any owner:
    epoch 0), not expired."""
    if item.execution_approved is None or item.owner is None:
        return False
    revision, epoch, expires_at = item.execution_approved
    return (
        revision == item.contract_revision
        and epoch in (0, item.owner.ownership_epoch)
        and (expires_at is None or expires_at > now)
    )


def approval_grant_execution(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T06: satisfies the start gate of a queued WorkItem without executing anything."""
    assert state is not None
    body = command.approval_grant_execution
    item = work_item(state, body.work_item_id)
    require_state(item, (QUEUED,), "approval.grant_execution")
    approvers = execution_approvers(state, item)
    if command.actor_id not in approvers:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED, f"execution approval is given by {', '.join(approvers)}"
        )
    if (
        body.contract_revision != item.contract_revision
        or item.owner is None
        or body.ownership_epoch not in (0, item.owner.ownership_epoch)
    ):
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            "approval names the current contract revision and the current ownership epoch (or 0 for any owner)",
        )
    if body.HasField("expires_at") and from_timestamp(body.expires_at) <= ctx.now:
        raise invalid("body.expires_at", "an approval expiry in the future, or none")
    out.emit(
        "approval.execution_granted",
        "execution_approval_granted",
        wp.ExecutionApprovalGranted(
            work_item_id=item.work_item_id,
            contract_revision=body.contract_revision,
            ownership_epoch=body.ownership_epoch,
            approver_id=command.actor_id,
            expires_at=body.expires_at if body.HasField("expires_at") else None,
            comment=body.comment,
        ),
    )


def work_start(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T07 / MW-11.3-02/03: the owner starts under a new execution lease with a stable id."""
    assert state is not None
    body = command.work_start
    require_live(mission_of(state), "work.start")
    item = work_item(state, body.work_item_id)
    replaced = replaced_session_lease(item, command.actor_id, command.session_epoch)
    if not replaced:
        require_state(item, (QUEUED,), "work.start")
    owner = item.owner
    if owner is None or owner.agent_id != command.actor_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED, f"{command.actor_id} does not own {item.work_item_id}"
        )
    if body.ownership_epoch != owner.ownership_epoch:
        raise Rejected(
            R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE,
            f"ownership epoch {owner.ownership_epoch} is current",
            current_epoch=owner.ownership_epoch,
        )
    if owner.expires_at <= ctx.now or (
        item.lease is None and item.last_checkpoint_id == "" and owner.start_deadline <= ctx.now
    ):
        raise Rejected(
            R.REJECTION_REASON_LEASE_EXPIRED,
            "the ownership lease (start deadline) has passed; the Coordinator re-offers",
        )
    if approval_required(state, item) and not approval_in_force(item, ctx.now):
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            "this WorkItem needs approval.grant_execution (in force, for this contract revision and owner) before it starts",
        )
    require_dependencies(state, item, "work.start")
    if item.retry_not_before is not None and ctx.now < item.retry_not_before:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"backing off after a transient failure until {item.retry_not_before.isoformat()} (MW-11.4-08)",
            retry_not_before=item.retry_not_before.isoformat(),
        )
    if item.attempts >= item.contract.retry_policy.max_attempts:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"{item.attempts} attempts used of {item.contract.retry_policy.max_attempts} (MW-11.4-08); fail the WorkItem",
        )
    if replaced:
        # MW-11.3-09: the old session's lease is revoked and the WorkItem is queued again, in the same
        # append and before the new runtime's lease begins.
        revoke_lease(out, item, wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED, QUEUED)
    lease_id = body.lease_id or ids.derived_id("lease", command.group_id, command.command_id)
    if not ids.is_valid(lease_id) or lease_id in item.lease_history:
        # A reused id would let a command of the earlier lease pass as one of this lease (MW-11.3-05).
        raise invalid("body.lease_id", "a valid lease id not used before for this WorkItem")
    policy = policy_duration(
        item.contract.time_policy.execution_lease_duration,
        DEFAULT_EXECUTION_LEASE,
        "time_policy.execution_lease_duration",
    )
    duration = min(policy, policy_duration(body.requested_duration, policy, "body.requested_duration"))
    end = attempt_end(item, ctx.now)
    if end is not None:  # the lease never outlives the attempt's time limit
        duration = min(duration, end - ctx.now)
    scope = narrow_scope(body.requested_scope, item.contract.permissions, "body.requested_scope")
    token = capability_token(
        command, item, lease_id, owner.ownership_epoch, scope, ctx.now, ctx.now + duration
    )
    out.emit(
        "work.started",
        "work_started",
        wp.WorkStarted(
            work_item_id=item.work_item_id,
            lease=wp.ExecutionLease(
                lease_id=lease_id,
                agent_id=command.actor_id,
                session_epoch=command.session_epoch,
                work_item_id=item.work_item_id,
                ownership_epoch=owner.ownership_epoch,
                started_at=to_timestamp(ctx.now),
                expires_at=to_timestamp(ctx.now + duration),
                attempt=item.attempts + 1,
            ),
            resume_from_checkpoint_id=body.resume_from_checkpoint_id or item.last_checkpoint_id,
            token=token,
        ),
    )


# ---------------------------------------------------------------- evolve rules


def _approved(state: GroupState, event: event_pb2.Event) -> None:
    p = event.execution_approval_granted
    item = touch(state, event, p.work_item_id)
    item.execution_approved = (
        p.contract_revision,
        p.ownership_epoch,
        from_timestamp(p.expires_at) if p.HasField("expires_at") else None,
    )


def _started(state: GroupState, event: event_pb2.Event) -> None:
    lease = event.work_started.lease
    item = touch(state, event, event.work_started.work_item_id)
    begin_lease(
        item,
        ExecutionLeaseState(
            lease_id=lease.lease_id,
            agent_id=lease.agent_id,
            session_epoch=lease.session_epoch,
            ownership_epoch=lease.ownership_epoch,
            started_at=from_timestamp(lease.started_at),
            expires_at=from_timestamp(lease.expires_at),
            token_id=event.work_started.token.token_id,
            token_scope=event.work_started.token.scope,
        ),
    )
    item.attempts = lease.attempt
    item.attempt_used = dict.fromkeys(SIX, 0)  # a new attempt (CostPolicy.per_attempt_limit)
    if item.owner is not None:  # while executing, ownership lives as long as the execution lease
        item.owner.expires_at = max(item.owner.expires_at, from_timestamp(lease.expires_at))
    item.state = ACTIVE


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "approval_grant_execution", approval_grant_execution, {"execution_approval_granted": _approved}
    ),
    # A revoked lease: also when an offer fences an expired owner and when a transient failure is retried.
    CommandKind("work_start", work_start, {"work_started": _started, "lease_revoked": apply_lease_revoked}),
)
