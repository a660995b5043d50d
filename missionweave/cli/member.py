"""``mwp member grant|revoke|list``: a Group's Memberships (spec 8, MW-8-01/03/06)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from missionweave.cli.common import (
    UsageError,
    acting,
    acting_command,
    add_expiry_flags,
    capability,
    columns,
    emit,
    enum_label,
    expiry,
    first_event,
    natural,
    reading,
    reading_command,
    relative,
    report,
    to_dict,
    when,
)
from missionweave.v1 import membership_pb2

Role = membership_pb2.MemberRole

# The roles a grant may give: the owner's and the Coordinator's come from the Mission itself.
ROLES = {
    "worker": Role.MEMBER_ROLE_WORKER,
    "reviewer": Role.MEMBER_ROLE_REVIEWER,
    "work-delegate": Role.MEMBER_ROLE_WORK_DELEGATE,
    "observer": Role.MEMBER_ROLE_OBSERVER,
}


def role_label(role: int) -> str:
    """``MEMBER_ROLE_WORK_DELEGATE`` -> ``work-delegate`` (the spelling --role takes)."""
    return enum_label(Role, role, "MEMBER_ROLE_").lower().replace("_", "-")


def capabilities_text(capabilities: Any) -> str:
    return ", ".join(f"{c.capability_id}={c.version}" for c in capabilities) or "-"


def provisional_text(ms: membership_pb2.Membership, now: datetime) -> str:
    """``no``, or ``until <time> (in 29m 59s)``; ``lapsed`` once past it by the local clock: a
    provisional Membership that never accepted an offer lapses with no event (MW-8-06)."""
    if not ms.provisional:
        return "no"
    lapsed = ms.expires_at.ToDatetime(tzinfo=UTC) <= now
    return f"until {when(ms.expires_at)} ({'lapsed ' if lapsed else ''}{relative(ms.expires_at, now)})"


def membership_row(ms: membership_pb2.Membership, now: datetime) -> dict[str, Any]:
    lapsed = ms.provisional and ms.expires_at.ToDatetime(tzinfo=UTC) <= now
    return {
        "member_id": ms.member_id,
        "role": role_label(ms.role),
        "membership_epoch": ms.membership_epoch,
        "visibility_start_sequence": ms.visibility_start_sequence,
        "provisional": ms.provisional,
        "expires_at": when(ms.expires_at) if ms.provisional else None,
        "lapsed": lapsed,
        "active": ms.active,  # as recorded; a lapsed provisional one is refused all the same
        "capabilities": [to_dict(c) for c in ms.capabilities],
    }


def membership_table(memberships: Any, now: datetime) -> list[str]:
    rows = [["MEMBER", "ROLE", "EPOCH", "VISIBLE FROM", "ACTIVE", "PROVISIONAL", "CAPABILITIES"]]
    for ms in memberships:
        row = membership_row(ms, now)
        rows.append(
            [
                ms.member_id,
                row["role"],
                str(ms.membership_epoch),
                str(ms.visibility_start_sequence),
                "lapsed" if row["lapsed"] else "yes" if ms.active else "no",
                provisional_text(ms, now),
                capabilities_text(ms.capabilities),
            ]
        )
    return columns(rows, "  ")


# ------------------------------------------------------------------ commands


async def cmd_grant(args: argparse.Namespace) -> int:
    expires_at = expiry(args)
    if args.provisional and expires_at is None:
        raise UsageError(
            "a provisional Membership lapses unless it accepts an offer: give --expires-in or --expires-at"
        )
    if expires_at is not None and not args.provisional:
        raise UsageError("--expires-in / --expires-at are for a --provisional Membership only")
    body = membership_pb2.MembershipGrant(
        member_id=args.member,
        role=ROLES[args.role],
        capabilities=args.capability or [],
        visibility_start_sequence=args.visibility_start,
        provisional=args.provisional,
        expires_at=expires_at,
    )
    async with acting(args) as actor:
        result = await actor.execute(args.group, "membership_grant", body)
    granted = first_event(result, "membership_granted")
    ms = (
        granted.membership_granted.membership if granted else membership_pb2.Membership(member_id=args.member)
    )
    now = datetime.now(UTC)
    headline = f"granted {ms.member_id} a {role_label(body.role)} Membership, epoch {ms.membership_epoch}"
    details = [
        f"  visible from sequence {ms.visibility_start_sequence}",
        f"  capabilities: {capabilities_text(ms.capabilities)}",
    ]
    if ms.provisional:
        details.append(
            f"  provisional {provisional_text(ms, now)}: it may only answer offers until it accepts one"
        )
    return report(args, result, headline, details=details, extra={"membership": membership_row(ms, now)})


async def cmd_revoke(args: argparse.Namespace) -> int:
    body = membership_pb2.MembershipRevoke(member_id=args.member, reason=args.reason)
    async with acting(args) as actor:
        result = await actor.execute(args.group, "membership_revoke", body)
    revoked = first_event(result, "membership_revoked")
    epoch = revoked.membership_revoked.membership_epoch if revoked else "?"
    headline = (
        f"revoked {args.member}'s Membership (epoch {epoch}): later commands from that epoch are refused"
    )
    return report(args, result, headline)


async def cmd_list(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        state = await mesh.group_state(args.group)
    now = datetime.now(UTC)
    lines = [
        f"Memberships of {state.group_id} (head sequence {state.head_sequence})",
        *membership_table(state.memberships, now),
    ]
    document = {
        "group_id": state.group_id,
        "head_sequence": state.head_sequence,
        "memberships": [membership_row(ms, now) for ms in state.memberships],
    }
    emit(args, lines, document)
    return 0


# ------------------------------------------------------------------ parser


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    mem = sub.add_parser("member", help="Memberships: grant, revoke, list").add_subparsers(
        dest="sub", required=True
    )

    g = acting_command(
        mem.add_parser("grant", help="grant a Membership (MissionOwner or current Coordinator)")
    )
    g.add_argument("member", metavar="MEMBER", help="the identity joining")
    g.add_argument("--role", choices=list(ROLES), required=True)
    g.add_argument(
        "--capability",
        action="append",
        type=capability,
        metavar="ID=VERSION",
        help="an explicit capability (repeatable)",
    )
    g.add_argument(
        "--visibility-start",
        type=natural,
        default=0,
        metavar="N",
        help="first Group sequence the member may see; 1 = full history (default: its grant's own sequence)",
    )
    g.add_argument(
        "--provisional",
        action="store_true",
        help="a just-in-time Worker Membership (MW-8-06): it may only answer offers until it accepts one, "
        "and lapses at its expiry (needs --expires-in or --expires-at)",
    )
    add_expiry_flags(g, "the provisional Membership", required=False)
    g.set_defaults(func=cmd_grant)

    r = acting_command(
        mem.add_parser("revoke", help="end a Membership (MissionOwner or current Coordinator)")
    )
    r.add_argument("member", metavar="MEMBER")
    r.add_argument("--reason", required=True)
    r.set_defaults(func=cmd_revoke)

    ls = reading_command(mem.add_parser("list", help="every Membership of a Group, active and ended"))
    ls.set_defaults(func=cmd_list)
