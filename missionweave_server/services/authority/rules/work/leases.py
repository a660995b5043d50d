"""Execution leases (MW-11.3-03..08) and the capability tokens bound to them (MW-11.3-06/07, OP-18)."""

from __future__ import annotations

from datetime import datetime

from missionweave.kernel import ids
from missionweave.kernel.clock import from_timestamp, to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import DecisionContext, Emitter, R, invalid
from missionweave_server.services.authority.rules.work.common import (
    ACTIVE,
    BLOCKED,
    DEFAULT_START_DEADLINE,
    QUEUED,
    end_lease,
    policy_duration,
    touch,
)
from missionweave_server.services.authority.state import SIX, GroupState, WorkItemState


def require_owner(item: WorkItemState, command: command_pb2.Command, epoch: int) -> None:
    """The actor owns the WorkItem at its current ownership epoch."""
    owner = item.owner
    if owner is None or command.actor_id != owner.agent_id:
        raise Rejected(
            R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE if epoch else R.REJECTION_REASON_PERMISSION_DENIED,
            f"{command.actor_id} does not own WorkItem {item.work_item_id}",
        )
    if epoch != owner.ownership_epoch:
        raise Rejected(
            R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE,
            f"ownership epoch {epoch} is not the current {owner.ownership_epoch}",
            current_epoch=owner.ownership_epoch,
        )


def require_lease(
    item: WorkItemState, command: command_pb2.Command, ctx: DecisionContext, lease_id: str, epoch: int
) -> None:
    """MW-11.3-04/05: the owner, its ownership epoch and the *current* execution lease id."""
    require_owner(item, command, epoch)
    lease = item.lease
    if lease is None or lease_id != lease.lease_id:
        raise Rejected(
            R.REJECTION_REASON_LEASE_STALE,
            f"lease {lease_id!r} is not the current execution lease of {item.work_item_id} (MW-11.3-05)",
        )
    if lease.expires_at <= ctx.now:
        raise Rejected(
            R.REJECTION_REASON_LEASE_EXPIRED, f"lease {lease_id} expired at {lease.expires_at.isoformat()}"
        )
    if command.session_epoch != lease.session_epoch:
        raise Rejected(
            R.REJECTION_REASON_LEASE_STALE, f"lease {lease_id} belongs to session {lease.session_epoch}"
        )


_SCOPE_FIELDS = ("allowed_tools", "allowed_data", "allowed_operations", "allowed_egress_hosts")


def narrow_scope(
    requested: wp.ExecutionPermissions, allowed: wp.ExecutionPermissions, field: str
) -> wp.ExecutionPermissions:
    """MW-11.3-06: a token's scope is the allowed one, or a subset of it; never wider."""
    if not any(getattr(requested, f) for f in _SCOPE_FIELDS):
        scope = wp.ExecutionPermissions()
        scope.CopyFrom(allowed)
        return scope
    for f in _SCOPE_FIELDS:
        extra = set(getattr(requested, f)) - set(getattr(allowed, f))
        if extra:
            raise invalid(
                f"{field}.{f}", f"{', '.join(sorted(extra))} exceed the permitted scope; a token only narrows"
            )
    return requested


def capability_token(
    command: command_pb2.Command,
    item: WorkItemState,
    lease_id: str,
    epoch: int,
    scope: wp.ExecutionPermissions,
    now: datetime,
    expires: datetime,
    replaces: str = "",
    spending: dict[str, int] | None = None,
) -> wp.CapabilityToken:
    """A capability token bound to the execution lease, expiring with it (MW-11.3-06/07, OP-18)."""
    remaining = common_pb2.ResourceVector(currency=item.contract.budget.currency)
    for dim in SIX:
        spent = item.used[dim] + (spending or {}).get(dim, 0)  # including this command's own usage
        setattr(remaining, dim, max(0, int(getattr(item.contract.budget, dim)) - spent))
    return wp.CapabilityToken(
        token_id=ids.derived_id("tok", command.group_id, command.command_id),
        lease_id=lease_id,
        agent_id=command.actor_id,
        work_item_id=item.work_item_id,
        ownership_epoch=epoch,
        scope=scope,
        limit=remaining,
        issued_at=to_timestamp(now),
        expires_at=to_timestamp(expires),
        replaces_token_id=replaces,
        issuer_id="group-authority",
    )


def token_valid(state: GroupState, token_id: str, now: datetime) -> bool:
    """Whether a capability token is the current one of a live lease (released, expired, revoked or
    rotated tokens are not: OP-18)."""
    work_item_id = state.tokens.get(token_id)
    lease = state.work_items[work_item_id].lease if work_item_id is not None else None
    return lease is not None and lease.expires_at > now


def replaced_session_lease(item: WorkItemState, agent_id: str, session_epoch: int) -> bool:
    """The agent opened session ``session_epoch``: this WorkItem's running lease belongs to an older
    session of the same agent (MW-11.3-09)."""
    lease = item.lease
    return (
        item.state == ACTIVE
        and lease is not None
        and lease.agent_id == agent_id
        and lease.session_epoch < session_epoch
    )


def revoke_replaced_session(state: GroupState, agent_id: str, session_epoch: int, out: Emitter) -> None:
    """MW-11.3-09: the Authority's own revocation, when the agent opens a replacement session, of
    every lease its older sessions hold in this Group; each WorkItem returns to ``queued`` and its
    owner keeps the ownership, so the new runtime starts it again under a new lease."""
    for item in state.work_items.values():
        if replaced_session_lease(item, agent_id, session_epoch):
            revoke_lease(out, item, wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED, QUEUED)


def revoke_lease(
    out: Emitter,
    item: WorkItemState,
    cause: int,
    resulting_state: int,
    *,
    retry_not_before: datetime | None = None,
) -> None:
    """MW-11.3-08: revoke the owner's lease (ownership, and the execution lease if one is running)."""
    owner = item.owner
    assert owner is not None
    lease = item.lease
    if lease is not None:
        kind = wp.WORK_LEASE_KIND_EXECUTION
    else:
        kind = wp.WORK_LEASE_KIND_BLOCKED if item.state == BLOCKED else wp.WORK_LEASE_KIND_OWNERSHIP
    out.emit(
        "work.lease_revoked",
        "lease_revoked",
        wp.LeaseRevoked(
            work_item_id=item.work_item_id,
            lease_kind=kind,
            lease_id=lease.lease_id if lease else "",
            ownership_epoch=owner.ownership_epoch,
            agent_id=owner.agent_id,
            session_epoch=lease.session_epoch if lease else 0,
            # Fencing ends a lease that had already expired: its end is the expiry (OP-11).
            end_kind=wp.LEASE_END_KIND_EXPIRED
            if cause == wp.LEASE_REVOCATION_CAUSE_EXPIRY_FENCED
            else wp.LEASE_END_KIND_REVOKED,
            cause=cause,  # type: ignore[arg-type]
            resulting_state=resulting_state,  # type: ignore[arg-type]
            retry_not_before=to_timestamp(retry_not_before) if retry_not_before else None,
            revoked_token_ids=[lease.token_id] if lease and lease.token_id else [],
        ),
    )


def apply_lease_revoked(state: GroupState, event: event_pb2.Event) -> None:
    p = event.lease_revoked
    item = touch(state, event, p.work_item_id)
    end_lease(item, event, p.end_kind or wp.LEASE_END_KIND_REVOKED)
    keeps_ownership = p.cause in (
        wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED,
        wp.LEASE_REVOCATION_CAUSE_FAILED,
    )
    if not keeps_ownership or p.resulting_state != QUEUED:
        item.owner = None
        return
    # Session replaced, or a transient failure retried: the owner keeps its ownership, only the
    # execution lease ends; a retry waits out its backoff and then has a start window again.
    item.state = QUEUED
    if p.HasField("retry_not_before"):
        item.retry_not_before = from_timestamp(p.retry_not_before)
        window = policy_duration(
            item.contract.time_policy.start_deadline, DEFAULT_START_DEADLINE, "time_policy.start_deadline"
        )
        if item.owner is not None:
            item.owner.expires_at = max(item.owner.expires_at, item.retry_not_before + window)
