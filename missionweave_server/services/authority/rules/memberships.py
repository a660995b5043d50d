"""Memberships (spec 8): who is in the Group, with which role, epoch and capabilities."""

from __future__ import annotations

from datetime import datetime

from missionweave.kernel.clock import from_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2, membership_pb2, work_pb2
from missionweave_server.services.authority.rules.common import (
    TERMINAL_MISSION_STATES,
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    Role,
    identity,
    invalid,
    mission_of,
)
from missionweave_server.services.authority.rules.missions.common import require_live, revoke_membership
from missionweave_server.services.authority.state import GroupState, MemberState

_SUBMITTED = work_pb2.WORK_ITEM_STATE_SUBMITTED


def require_steward(state: GroupState, command: command_pb2.Command, ctx: DecisionContext) -> None:
    """Membership changes: the MissionOwner, or the current Coordinator while its lease is live (the
    authorization table admits no other role; a replaced Coordinator keeps its role, not the lease)."""
    mission = mission_of(state)
    require_live(mission, "membership change")
    if command.actor_id == mission.owner_id:
        return
    lease = mission.coordinator
    if lease is None or lease.agent_id != command.actor_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "only the MissionOwner or the current Coordinator manage Memberships",
        )
    if lease.expires_at <= ctx.now:
        raise Rejected(R.REJECTION_REASON_LEASE_EXPIRED, "the Coordinator lease has expired; renew it first")


_GRANTABLE = frozenset(
    {
        Role.MEMBER_ROLE_WORKER,
        Role.MEMBER_ROLE_REVIEWER,
        Role.MEMBER_ROLE_WORK_DELEGATE,
        Role.MEMBER_ROLE_OBSERVER,
    }
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
        raise invalid(
            "body.membership_grant.role", "owner and Coordinator memberships come from the Mission itself"
        )
    existing = state.members.get(body.member_id)
    if (
        existing
        and existing.role in (Role.MEMBER_ROLE_MISSION_OWNER, Role.MEMBER_ROLE_COORDINATOR)
        and existing.active
    ):
        raise invalid(
            "body.membership_grant.member_id", "cannot change the owner's or Coordinator's Membership"
        )
    for i, cap in enumerate(body.capabilities):
        if not cap.capability_id or not cap.version:
            raise invalid(
                f"body.membership_grant.capabilities[{i}]", "capability id and version are required"
            )
    if body.provisional:
        if body.role != Role.MEMBER_ROLE_WORKER:
            raise invalid(
                "body.membership_grant.provisional", "just-in-time Memberships are for Workers (MW-8-06)"
            )
        if not body.HasField("expires_at") or from_timestamp(body.expires_at) <= ctx.now:
            raise invalid(
                "body.membership_grant.expires_at",
                "a provisional Membership must expire, in the future (MW-8-06)",
            )
        if from_timestamp(body.expires_at) > from_timestamp(mission_of(state).definition.deadline):
            raise invalid(
                "body.membership_grant.expires_at",
                "a provisional Membership lapses no later than the Mission's deadline",
            )
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
        raise invalid(
            "body.membership_revoke.member_id", "the owner's and Coordinator's Memberships cannot be revoked"
        )
    revoke_membership(out, body.member_id, member.membership_epoch, body.reason)


# ---------------------------------------------------------------- just-in-time Workers (MW-8-06)

# What a provisional member may do before it accepts an offer: answer the offers made to it.
PROVISIONAL_MAY = frozenset({"work_accept_offer", "work_decline_offer"})


def check_provisional(
    state: GroupState, command: command_pb2.Command, body: str, ctx: DecisionContext
) -> None:
    """MW-8-06 step 1: a provisional Membership carries no authority beyond its offer; one that
    lapsed is refused as an ended one."""
    member = state.members.get(command.actor_id)
    if member is None or not member.provisional:
        return
    if member.lapsed(ctx.now):
        assert member.expires_at is not None
        raise Rejected(
            R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE,
            f"the provisional Membership of {command.actor_id} lapsed at {member.expires_at.isoformat()} (MW-8-06)",
            current_epoch=0,
            check="lapsed",
        )
    if body not in PROVISIONAL_MAY:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"{command.actor_id}'s Membership is provisional: it may accept or decline its offer, nothing else (MW-8-06)",
            check="provisional",
        )


def activate(out: Emitter, member: MemberState, work_item_id: str, offer_id: str) -> None:
    """MW-8-06 step 3: accepting the offer activates the Membership, in the same append."""
    out.emit(
        "membership.activated",
        "membership_activated",
        membership_pb2.MembershipActivated(
            member_id=member.member_id,
            membership_epoch=member.membership_epoch,
            work_item_id=work_item_id,
            offer_id=offer_id,
        ),
    )


def has_obligations(state: GroupState, member_id: str, now: datetime) -> bool:
    """A WorkItem it owns that is not finished, a submission of its awaiting review, or an open
    offer it may still accept (among the WorkItems the obligation index files under it, D134)."""
    for work_item_id in state.obligations.get(member_id, ()):
        item = state.work_items[work_item_id]
        if item.owner is not None and item.owner.agent_id == member_id:
            return True
        if item.state == _SUBMITTED and item.submitted_by == member_id:
            return True
        if any(o.open and o.expires_at > now and member_id in o.candidate_ids for o in item.offers.values()):
            return True
    return False


def end_just_in_time(before: GroupState, after: GroupState, out: Emitter, now: datetime) -> None:
    """MW-8-06 step 4: a just-in-time Membership ends by itself, in the append that ended its last
    obligation, or the Mission's (then provisional ones end too)."""
    mission_ended = after.mission is not None and after.mission.state in TERMINAL_MISSION_STATES
    # In Membership epoch order (D135): the set's own order is not the same in every process.
    for member in sorted((after.members[m] for m in after.jit_members), key=lambda m: m.membership_epoch):
        if mission_ended:
            reason = membership_pb2.MEMBERSHIP_END_REASON_MISSION_ENDED
        elif member.just_in_time and not has_obligations(after, member.member_id, now):
            reason = membership_pb2.MEMBERSHIP_END_REASON_OBLIGATIONS_COMPLETE
        else:
            continue
        out.emit(
            "membership.ended",
            "membership_ended",
            membership_pb2.MembershipEnded(
                member_id=member.member_id, membership_epoch=member.membership_epoch, reason=reason
            ),
        )


def may_end_just_in_time(state: GroupState) -> bool:
    """Whether any Membership could end by itself (the decider then previews the append)."""
    return bool(state.jit_members)


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
    if m.active and m.provisional:
        state.jit_members.add(m.member_id)
    else:  # a new grant replaces whatever Membership it held before
        state.jit_members.discard(m.member_id)


def _revoked(state: GroupState, event: event_pb2.Event) -> None:
    state.members[event.membership_revoked.member_id].active = False
    state.jit_members.discard(event.membership_revoked.member_id)


def _activated(state: GroupState, event: event_pb2.Event) -> None:
    member = state.members[event.membership_activated.member_id]
    member.provisional, member.expires_at, member.just_in_time = False, None, True
    if member.active:
        state.jit_members.add(member.member_id)


def _ended(state: GroupState, event: event_pb2.Event) -> None:
    state.members[event.membership_ended.member_id].active = False
    state.jit_members.discard(event.membership_ended.member_id)


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "membership_grant",
        membership_grant,
        {"membership_granted": _granted},
        references=lambda c: (c.membership_grant.member_id,),
    ),
    CommandKind(
        "membership_revoke",
        membership_revoke,
        # Appended by the offer and work rules (activation) and the decider (ending by itself).
        {"membership_revoked": _revoked, "membership_activated": _activated, "membership_ended": _ended},
    ),
)
