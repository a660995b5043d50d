"""The Coordinator lease (spec 7.2): its grant, its renewal, the appointment of a replacement once it
lapses, and the replacement's acknowledgement that it has reconciled the current state."""

from __future__ import annotations

from datetime import timedelta

from missionweave.kernel.clock import from_timestamp, to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2, mission_pb2
from missionweave_server.services.authority.rules.common import (
    CommandKind,
    DecisionContext,
    Emitter,
    Kind,
    R,
    Role,
    identity,
    invalid,
    mission_of,
    renewal,
)
from missionweave_server.services.authority.rules.missions.common import (
    grant_full_membership,
    require_coordinator,
    require_live,
)
from missionweave_server.services.authority.state import CoordinatorLeaseState, GroupState, IdentityInfo


def grant_lease(
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
            out,
            command.group_id,
            body.coordinator_id,
            Role.MEMBER_ROLE_COORDINATOR,
            state.last_membership_epoch + 1,
        )
    # MW-7.2-08: the replacement starts unreconciled; it reads the signed summary and acknowledges.
    grant_lease(
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
        state,
        command,
        ctx,
        body.coordinator_epoch,
        "mission.acknowledge_reconciliation",
        needs_reconciliation=False,
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
        mission_pb2.ReconciliationAcknowledged(
            coordinator_epoch=body.coordinator_epoch, group_revision=body.group_revision
        ),
    )


# ---------------------------------------------------------------- evolve rules


def lease_granted(state: GroupState, event: event_pb2.Event) -> None:
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


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "mission_renew_coordinator_lease",
        mission_renew_coordinator_lease,
        {"coordinator_lease_renewed": _lease_renewed},
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
)
