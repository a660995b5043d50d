"""Memberships (spec 8): who is in the Group, with which role, epoch and capabilities."""

from __future__ import annotations

from missionweave.clock import from_timestamp
from missionweave.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2, membership_pb2
from services.authority.rules.common import (
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    Role,
    identity,
    invalid,
    mission_of,
)
from services.authority.rules.missions import require_live
from services.authority.state import GroupState, MemberState


def require_steward(state: GroupState, command: command_pb2.Command, ctx: DecisionContext) -> None:
    """Membership changes: the MissionOwner, or the current Coordinator while its lease is live."""
    mission = mission_of(state)
    require_live(mission, "membership change")
    actor = state.members[command.actor_id]
    if actor.role == Role.MEMBER_ROLE_MISSION_OWNER:
        return
    lease = mission.coordinator
    if actor.role == Role.MEMBER_ROLE_COORDINATOR and lease and lease.agent_id == command.actor_id:
        if lease.expires_at <= ctx.now:
            raise Rejected(R.REJECTION_REASON_LEASE_EXPIRED, "the Coordinator lease has expired; renew it first")
        return
    raise Rejected(
        R.REJECTION_REASON_PERMISSION_DENIED, "only the MissionOwner or the current Coordinator manage Memberships"
    )


_GRANTABLE = frozenset(
    {Role.MEMBER_ROLE_WORKER, Role.MEMBER_ROLE_REVIEWER, Role.MEMBER_ROLE_WORK_DELEGATE, Role.MEMBER_ROLE_OBSERVER}
)


def membership_grant(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-8-01: a Membership with role, epoch, visibility start and explicit capabilities."""
    assert state is not None
    require_steward(state, command, ctx)
    body = command.membership_grant
    identity(ctx, body.member_id, "body.membership_grant.member_id")
    if body.role not in _GRANTABLE:
        raise invalid("body.membership_grant.role", "owner and Coordinator memberships come from the Mission itself")
    existing = state.members.get(body.member_id)
    if existing and existing.role in (Role.MEMBER_ROLE_MISSION_OWNER, Role.MEMBER_ROLE_COORDINATOR) and existing.active:
        raise invalid("body.membership_grant.member_id", "cannot change the owner's or Coordinator's Membership")
    for i, cap in enumerate(body.capabilities):
        if not cap.capability_id or not cap.version:
            raise invalid(f"body.membership_grant.capabilities[{i}]", "capability id and version are required")
    if body.provisional and not body.HasField("expires_at"):
        raise invalid("body.membership_grant.expires_at", "a provisional Membership must expire (MW-8-06)")
    # MW-8-07: a late joiner starts at the sequence of its own grant, never earlier by default.
    visibility = body.visibility_start_sequence or out.next_sequence
    out.emit(
        "membership.granted",
        "membership_granted",
        membership_pb2.MembershipGranted(
            membership=membership_pb2.Membership(
                member_id=body.member_id,
                group_id=command.group_id,
                membership_epoch=state.last_membership_epoch + 1,
                role=body.role,
                visibility_start_sequence=visibility,
                capabilities=body.capabilities,
                provisional=body.provisional,
                expires_at=body.expires_at if body.HasField("expires_at") else None,
                active=True,
            )
        ),
    )


def membership_revoke(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-8-03: ending a Membership makes every later command from its epoch stale."""
    assert state is not None
    require_steward(state, command, ctx)
    body = command.membership_revoke
    member = state.members.get(body.member_id)
    if member is None or not member.active:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"{body.member_id} holds no active Membership here")
    if member.role in (Role.MEMBER_ROLE_MISSION_OWNER, Role.MEMBER_ROLE_COORDINATOR):
        raise invalid("body.membership_revoke.member_id", "the owner's and Coordinator's Memberships cannot be revoked")
    out.emit(
        "membership.revoked",
        "membership_revoked",
        membership_pb2.MembershipRevoked(
            member_id=body.member_id, membership_epoch=member.membership_epoch, reason=body.reason
        ),
    )


# ---------------------------------------------------------------- evolve rules


def _granted(state: GroupState, event: event_pb2.Event) -> None:
    m = event.membership_granted.membership
    state.members[m.member_id] = MemberState(
        member_id=m.member_id,
        role=m.role,
        membership_epoch=m.membership_epoch,
        visibility_start_sequence=m.visibility_start_sequence,
        capabilities=tuple((c.capability_id, c.version) for c in m.capabilities),
        active=m.active,
        provisional=m.provisional,
        expires_at=from_timestamp(m.expires_at) if m.HasField("expires_at") else None,
    )
    state.last_membership_epoch = max(state.last_membership_epoch, m.membership_epoch)


def _revoked(state: GroupState, event: event_pb2.Event) -> None:
    state.members[event.membership_revoked.member_id].active = False


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "membership_grant",
        membership_grant,
        {"membership_granted": _granted},
        references=lambda c: (c.membership_grant.member_id,),
    ),
    CommandKind("membership_revoke", membership_revoke, {"membership_revoked": _revoked}),
)
