"""What the WorkItem rules share: states, policy defaults, lookups, the Coordinator's authority and
the ownership grant, and the evolve helpers every WorkItem event uses."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from google.protobuf.duration_pb2 import Duration

from missionweave.kernel.clock import from_timestamp, to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import (
    DecisionContext,
    R,
    invalid,
    mission_of,
    require_reason,
)
from missionweave_server.services.authority.rules.delegation import usable_grant
from missionweave_server.services.authority.rules.missions.common import require_coordinator, require_live
from missionweave_server.services.authority.state import (
    MAX_LEASE_HISTORY,
    ExecutionLeaseState,
    GrantState,
    GroupState,
    LeaseRecord,
    OwnershipState,
    WorkItemState,
)

WS = wp.WorkItemState
OPEN, OFFERED, QUEUED, ACTIVE = (
    WS.WORK_ITEM_STATE_OPEN,
    WS.WORK_ITEM_STATE_OFFERED,
    WS.WORK_ITEM_STATE_QUEUED,
    WS.WORK_ITEM_STATE_ACTIVE,
)
BLOCKED, SUBMITTED, VERIFIED = (
    WS.WORK_ITEM_STATE_BLOCKED,
    WS.WORK_ITEM_STATE_SUBMITTED,
    WS.WORK_ITEM_STATE_VERIFIED,
)
FAILED, CANCELLED = WS.WORK_ITEM_STATE_FAILED, WS.WORK_ITEM_STATE_CANCELLED
TERMINAL = frozenset({VERIFIED, CANCELLED})  # MW-10.2-02
UNFINISHED = frozenset({OPEN, OFFERED, QUEUED, ACTIVE, BLOCKED, SUBMITTED})  # rows T13, T14, T18
OFFERABLE = frozenset({OPEN, OFFERED, QUEUED, ACTIVE, BLOCKED, FAILED})  # row T03

DEFAULT_START_DEADLINE = timedelta(minutes=10)
DEFAULT_EXECUTION_LEASE = timedelta(minutes=5)
DEFAULT_CHECKPOINT_OWNERSHIP = timedelta(minutes=30)
DEFAULT_BLOCKED_LEASE = timedelta(hours=1)
MAX_LEASE = timedelta(hours=24)


def state_name(value: int) -> str:
    return WS.Name(WS.ValueType(value)).removeprefix("WORK_ITEM_STATE_").lower()


def work_item(state: GroupState, work_item_id: str) -> WorkItemState:
    item = state.work_items.get(work_item_id)
    if item is None:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND, f"no WorkItem {work_item_id!r} in this Group", field="work_item_id"
        )
    return item


def require_state(item: WorkItemState, allowed: Iterable[int], name: str) -> None:
    """MW-10.2-05: only the table's transitions; terminal states are never left (MW-10.2-02)."""
    if item.state in TERMINAL:
        raise Rejected(
            R.REJECTION_REASON_TERMINAL_STATE,
            f"{name}: WorkItem {item.work_item_id} is {state_name(item.state)}, terminal for its revision",
        )
    if item.state not in allowed:
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION,
            f"{name} is not allowed from {state_name(item.state)} (MW-10.2-05)",
            state=state_name(item.state),
        )


def coordination(
    state: GroupState,
    command: command_pb2.Command,
    ctx: DecisionContext,
    epoch: int,
    name: str,
    *,
    emergency: bool = False,
    override_reason: str = "",
) -> int:
    """The current Coordinator epoch, or the MissionOwner's audited emergency override (MW-7.1-13)."""
    if emergency:
        if command.actor_id != mission_of(state).owner_id:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED, "only the MissionOwner uses the emergency override"
            )
        require_reason(override_reason, "body.override_reason")
        return wp.WORK_ACTOR_ROLE_MISSION_OWNER
    require_coordinator(state, command, ctx, epoch, name)
    return wp.WORK_ACTOR_ROLE_COORDINATOR


def require_steering(
    state: GroupState,
    command: command_pb2.Command,
    ctx: DecisionContext,
    body: wp.WorkAuthorize | wp.WorkOffer,
    name: str,
) -> GrantState | None:
    """What the commands that shape the work share (authorize, offer): a live Mission, and the
    current Coordinator, the owner's emergency override or a usable delegation grant (MW-9.1-01),
    which is returned for the caller's scope checks. Anyone else creates no obligations for
    another Worker (MW-9.1-18)."""
    require_live(mission_of(state), name)
    if body.grant_id:
        if body.emergency_override:
            raise invalid("body.grant_id", "a grant and the emergency override do not combine")
        if body.coordinator_epoch:
            raise invalid("body.coordinator_epoch", "is 0 when a grant is used")
        return usable_grant(state, command, ctx, body.grant_id)
    coordination(
        state,
        command,
        ctx,
        body.coordinator_epoch,
        name,
        emergency=body.emergency_override,
        override_reason=body.override_reason,
    )
    return None


def live_owner(item: WorkItemState, now: datetime) -> bool:
    return item.owner is not None and item.owner.expires_at > now


def policy_duration(value: Duration, default: timedelta, field: str) -> timedelta:
    if not value.seconds and not value.nanos:
        return default
    d = value.ToTimedelta()
    if not timedelta(seconds=1) <= d <= MAX_LEASE:
        raise invalid(field, "must lie within 1 s .. 24 h")
    return d


def attempt_end(item: WorkItemState, started_at: datetime) -> datetime | None:
    """When an attempt started at ``started_at`` must end (TimePolicy.attempt_time_limit), or None."""
    limit = item.contract.time_policy.attempt_time_limit
    if not limit.seconds and not limit.nanos:
        return None
    return started_at + limit.ToTimedelta()


def ownership_grant(
    item: WorkItemState,
    agent_id: str,
    epoch: int,
    now: datetime,
    lease: timedelta,
    kind: int,
    offer_id: str = "",
) -> wp.OwnershipGrant:
    start_deadline = now + policy_duration(
        item.contract.time_policy.start_deadline, DEFAULT_START_DEADLINE, "time_policy.start_deadline"
    )
    return wp.OwnershipGrant(
        work_item_id=item.work_item_id,
        agent_id=agent_id,
        ownership_epoch=epoch,
        granted_at=to_timestamp(now),
        start_deadline=to_timestamp(start_deadline),
        lease_kind=kind,  # type: ignore[arg-type]
        expires_at=to_timestamp(now + lease),
        offer_id=offer_id,
        contract_revision=item.contract_revision,
    )


def touch(state: GroupState, event: event_pb2.Event, work_item_id: str) -> WorkItemState:
    item = state.work_items[work_item_id]
    item.revision += 1
    state.last_work_change_sequence = event.sequence
    return item


def own(item: WorkItemState, grant: wp.OwnershipGrant) -> None:
    item.owner = OwnershipState(
        agent_id=grant.agent_id,
        ownership_epoch=grant.ownership_epoch,
        start_deadline=from_timestamp(grant.start_deadline),
        expires_at=from_timestamp(grant.expires_at),
        offer_id=grant.offer_id,
    )
    item.last_ownership_epoch = max(item.last_ownership_epoch, grant.ownership_epoch)


def begin_lease(item: WorkItemState, lease: ExecutionLeaseState) -> None:
    """Evolve: ``lease`` is the current execution lease, and the newest of its lease history."""
    item.lease = lease
    item.lease_history[lease.lease_id] = LeaseRecord(
        lease.lease_id,
        lease.agent_id,
        lease.session_epoch,
        lease.ownership_epoch,
        lease.started_at,
        lease.expires_at,
    )
    while len(item.lease_history) > MAX_LEASE_HISTORY:  # dicts keep insertion (start) order
        del item.lease_history[next(iter(item.lease_history))]


def end_lease(item: WorkItemState, event: event_pb2.Event, end_kind: int) -> None:
    """Evolve: the current execution lease (if any) ends now, as recorded in its lease history."""
    lease = item.lease
    item.lease = None
    record = item.lease_history.get(lease.lease_id) if lease else None
    if record is not None and record.ended_at is None:
        record.ended_at = from_timestamp(event.recorded_at)
        record.end_kind = end_kind
