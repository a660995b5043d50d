"""What the Mission rules share, and lend to the other rule families: the live-Mission and
Coordinator guards, the linked-Mission lookup, full Memberships granted and revoked, the state transition."""

from __future__ import annotations

from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2, membership_pb2
from missionweave_server.services.authority.rules.common import (
    TERMINAL_MISSION_STATES,
    Applier,
    DecisionContext,
    Emitter,
    R,
    mission_of,
    state_name,
)
from missionweave_server.services.authority.state import GroupState, MissionRecord

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
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED, f"{command_name} is issued by the current Coordinator"
        )
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


def linked_mission(ctx: DecisionContext, group_id: str, mission_id: str, field: str) -> MissionRecord:
    linked = ctx.linked.get(group_id)
    if not group_id or linked is None or linked.mission is None:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND, f"{field}: no Group {group_id!r} with a Mission", field=field
        )
    if mission_id and linked.mission.mission_id != mission_id:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"{field}: Group {group_id} holds {linked.mission.mission_id}, not {mission_id}",
        )
    return linked.mission


# ---------------------------------------------------------------- Memberships (MW-8-03/05)


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
        membership_pb2.MembershipRevoked(
            member_id=member_id, membership_epoch=membership_epoch, reason=reason
        ),
    )


# ---------------------------------------------------------------- evolve rules


def transition(new_state: int) -> Applier:
    def apply(state: GroupState, event: event_pb2.Event) -> None:
        mission = mission_of(state)
        mission.state = new_state
        mission.revision += 1

    return apply
