"""``mwp delegation grant|revoke|list|show``: delegation grants (spec 9.1, MW-9.1-04..16).

A grant hands a work_delegate a bounded slice of the Coordinator's authority over one subtree of
the work. Its caps name all six budget dimensions explicitly: one left out is 0, which allows
nothing in that dimension (OP-02), never "unlimited".
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from missionweave.cli.common import (
    CliError,
    UsageError,
    acting,
    acting_command,
    add_coordinator_epoch_flag,
    add_expiry_flags,
    capability,
    columns,
    coordinator_epoch,
    emit,
    expiry,
    first_event,
    mission_of,
    natural,
    reading,
    reading_command,
    relative,
    report,
    to_dict,
    when,
)
from missionweave.v1 import authority_service_pb2, common_pb2, membership_pb2

GrantStatus = authority_service_pb2.DelegationGrantStatus

# The six budget dimensions, in the proto's order (every field of ResourceVector but its currency).
DIMENSIONS = tuple(f.name for f in common_pb2.ResourceVector.DESCRIPTOR.fields if f.name != "currency")
_MICROS = 1_000_000
_MONEY = re.compile(r"^(\d+(?:\.\d{1,6})?)\s*([A-Za-z]{3})?$")


def label(dimension: str) -> str:
    """``financial_micros`` -> ``financial``, ``tool_calls`` -> ``tool calls``."""
    return "financial" if dimension == "financial_micros" else dimension.replace("_", " ")


def money(micros: int, currency: str) -> str:
    """12_500_000 EUR -> ``12.50 EUR`` (exact: at least two decimals, up to six)."""
    units, fraction = divmod(abs(micros), _MICROS)
    decimals = f"{fraction:06d}".rstrip("0").ljust(2, "0")
    return f"{'-' if micros < 0 else ''}{units}.{decimals} {currency}".rstrip()


def amount(v: common_pb2.ResourceVector, dimension: str, currency: str) -> str:
    value = int(getattr(v, dimension))
    return money(value, currency) if dimension == "financial_micros" else str(value)


# ------------------------------------------------------------------ --cap


@dataclass(frozen=True)
class Cap:
    dimension: str
    value: int
    currency: str = ""


def cap(text: str) -> Cap:
    """``tokens=25000``, ``financial=12.50``, ``financial=12.50EUR``, ``"financial=12.50 EUR"``,
    ``financial_micros=12500000`` (an argparse type: bad input exits 2)."""
    name, sep, value = text.partition("=")
    key = name.strip().lower().replace("-", "_")
    value = value.strip()
    if not sep or not value:
        raise argparse.ArgumentTypeError(f"{text!r}: expected DIMENSION=VALUE, e.g. tokens=25000")
    if key == "financial":
        match = _MONEY.match(value)
        if match is None:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected financial=AMOUNT[CURRENCY], e.g. financial=12.50EUR"
            )
        return Cap("financial_micros", int(Decimal(match[1]) * _MICROS), (match[2] or "").upper())
    if key not in DIMENSIONS:
        names = ", ".join(["financial", *DIMENSIONS])
        raise argparse.ArgumentTypeError(f"{text!r}: unknown dimension {name!r}; one of {names}")
    try:
        return Cap(key, natural(value))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r}: {key} takes a whole number >= 0") from None


def caps_from_args(args: argparse.Namespace, mission_currency: str) -> common_pb2.ResourceVector:
    """The six caps: those given, every other one 0. The currency: --currency or the one a
    financial cap names, else the Mission budget's (the server requires one and the same)."""
    caps: list[Cap] = args.cap or []
    values: dict[str, int] = {}
    for c in caps:
        if c.dimension in values:
            raise UsageError(f"--cap {label(c.dimension)} is given twice")
        values[c.dimension] = c.value
    named = {c.currency for c in caps if c.currency} | ({args.currency.upper()} if args.currency else set())
    if len(named) > 1:
        raise UsageError(f"the caps name more than one currency: {', '.join(sorted(named))}")
    currency = next(iter(named), mission_currency)
    if not currency:
        raise UsageError("the Mission budget names no currency: pass --currency CODE")
    return common_pb2.ResourceVector(currency=currency, **values)


# ------------------------------------------------------------------ views


def status_of(s: GrantStatus, now: datetime) -> str:
    """``usable``, ``expired`` (by the local clock: the read model leaves expiry out, being a pure
    fold of the log) or why the state makes it unusable (``revoked``, ``membership_changed``, ...)."""
    if s.invalid_because:
        return s.invalid_because
    if s.grant.expires_at.ToDatetime(tzinfo=UTC) <= now:
        return "expired"
    return "usable"


def capabilities_text(grant: membership_pb2.DelegationGrant) -> str:
    return ", ".join(f"{c.capability_id}>={c.version}" for c in grant.allowed_capabilities) or "-"


def cap_lines(caps: common_pb2.ResourceVector) -> list[str]:
    rows = [[label(d), amount(caps, d, caps.currency)] for d in DIMENSIONS]
    return ["  caps (a dimension at 0 allows nothing):", *columns(rows, "    ")]


def dimensions(s: GrantStatus) -> dict[str, dict[str, int]]:
    """Cap, charged and remaining per dimension, zeros included (MessageToDict leaves them out)."""
    return {
        d: {
            "cap": int(getattr(s.grant.caps, d)),
            "charged": int(getattr(s.charged, d)),
            "remaining": int(getattr(s.remaining, d)),
        }
        for d in DIMENSIONS
    }


def grant_document(s: GrantStatus, now: datetime) -> dict[str, Any]:
    return {
        **to_dict(s),
        "status": status_of(s, now),
        "currency": s.grant.caps.currency,
        "dimensions": dimensions(s),
    }


def find_grant(state: authority_service_pb2.GroupState, grant_id: str) -> GrantStatus:
    found = next((s for s in state.grants if s.grant.grant_id == grant_id), None)
    if found is None:
        raise CliError(
            f"group {state.group_id} has no delegation grant {grant_id!r} (mwp delegation list {state.group_id})"
        )
    return found


def grant_table(grants: Any, now: datetime) -> list[str]:
    rows = [
        [
            "GRANT",
            "GRANTEE",
            "TARGET",
            "STATUS",
            "TOKENS LEFT",
            "TOOL CALLS LEFT",
            "FINANCIAL LEFT",
            "EXPIRES",
        ]
    ]
    for s in grants:
        g, currency = s.grant, s.grant.caps.currency
        rows.append(
            [
                g.grant_id,
                g.grantee_id,
                g.target_work_item_id,
                status_of(s, now),
                str(s.remaining.tokens),
                str(s.remaining.tool_calls),
                money(s.remaining.financial_micros, currency),
                f"{when(g.expires_at)} ({relative(g.expires_at, now)})",
            ]
        )
    return columns(rows, "  ")


def render_grant(s: GrantStatus, now: datetime) -> list[str]:
    g, currency = s.grant, s.grant.caps.currency
    rows = [
        ["grantee", f"{g.grantee_id} (Membership epoch {g.grantee_membership_epoch})"],
        ["target", f"{g.target_work_item_id} (at most {g.max_descendant_depth} levels below it)"],
        ["capabilities", capabilities_text(g)],
        ["issuer", f"{g.issuer_id} at Coordinator epoch {g.coordinator_epoch}"],
        ["mission", f"{g.mission_id} in group {g.group_id}"],
        ["granted", when(g.granted_at)],
        ["expires", f"{when(g.expires_at)} ({relative(g.expires_at, now)})"],
    ]
    budget = [["dimension", "cap", "charged", "remaining"]]
    budget += [
        [
            label(d),
            amount(g.caps, d, currency),
            amount(s.charged, d, currency),
            amount(s.remaining, d, currency),
        ]
        for d in DIMENSIONS
    ]
    return [
        f"delegation grant {g.grant_id}: {status_of(s, now)}",
        *columns(rows, "  "),
        "budget (a cap of 0 allows nothing):",
        *columns(budget, "  "),
        f"charged WorkItems: {', '.join(s.work_item_ids) or 'none'}",
    ]


# ------------------------------------------------------------------ commands


async def cmd_grant(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state = await actor.state(args.group)
        body = membership_pb2.MembershipGrantDelegation(
            grantee_id=args.grantee,
            target_work_item_id=args.target_work_item,
            allowed_capabilities=args.capability,
            caps=caps_from_args(args, mission_of(state).definition.budget.currency),
            max_descendant_depth=args.max_depth,
            expires_at=expiry(args),
            coordinator_epoch=coordinator_epoch(args, state),
        )
        result = await actor.execute(args.group, "membership_grant_delegation", body)
    granted = first_event(result, "delegation_granted")
    grant = granted.delegation_granted.grant if granted else membership_pb2.DelegationGrant()
    headline = f"delegation grant {grant.grant_id}: {body.grantee_id} may plan and offer work below {body.target_work_item_id}"
    details = [
        f"  capabilities: {capabilities_text(grant)}",
        f"  max depth: {grant.max_descendant_depth} levels below {grant.target_work_item_id}",
        f"  expires: {when(grant.expires_at)} ({relative(grant.expires_at)})",
        *cap_lines(grant.caps),
    ]
    extra = {"grant_id": grant.grant_id, "grant": to_dict(grant)}
    return report(args, result, headline, details=details, last_line=grant.grant_id, extra=extra)


async def cmd_revoke(args: argparse.Namespace) -> int:
    body = membership_pb2.MembershipRevokeDelegation(grant_id=args.grant_id, reason=args.reason)
    async with acting(args) as actor:
        result = await actor.execute(args.group, "membership_revoke_delegation", body)
    return report(args, result, f"delegation grant {args.grant_id} revoked: its grantee can no longer use it")


async def cmd_list(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        state = await mesh.group_state(args.group)
    now = datetime.now(UTC)
    header = f"Delegation grants of {state.group_id} (head sequence {state.head_sequence})"
    lines = [header, *grant_table(state.grants, now)] if state.grants else [header, "  none"]
    document = {
        "group_id": state.group_id,
        "head_sequence": state.head_sequence,
        "grants": [grant_document(s, now) for s in state.grants],
    }
    emit(args, lines, document)
    return 0


async def cmd_show(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        state = await mesh.group_state(args.group)
    found, now = find_grant(state, args.grant_id), datetime.now(UTC)
    emit(args, render_grant(found, now), grant_document(found, now))
    return 0


# ------------------------------------------------------------------ parser


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    dele = sub.add_parser("delegation", help="delegation grants: grant, revoke, list, show").add_subparsers(
        dest="sub", required=True
    )

    g = acting_command(
        dele.add_parser(
            "grant",
            help="grant a work_delegate a bounded subtree of work (current Coordinator)",
            description="Every one of the six budget dimensions (financial, tokens, tool_calls, compute_ms, "
            "wall_clock_ms, side_effects) is capped explicitly: a dimension without --cap is 0, which allows "
            "NOTHING in it, not unlimited. Caps may not exceed the Mission's budget.",
        ),
    )
    g.add_argument(
        "grantee", metavar="GRANTEE", help="the grantee (holds an active work-delegate Membership)"
    )
    # dest differs from the global --target (the server address), which must keep its value.
    g.add_argument(
        "--target",
        "--work-item",
        dest="target_work_item",
        required=True,
        metavar="WORKITEM",
        help="the scope root WorkItem (the server address is the global --target, before the command)",
    )
    g.add_argument(
        "--capability",
        action="append",
        type=capability,
        required=True,
        metavar="ID=MINVERSION",
        help="an allowed capability with its minimum version (repeatable; at least one)",
    )
    g.add_argument(
        "--cap",
        action="append",
        type=cap,
        metavar="DIMENSION=VALUE",
        help="a cap (repeatable): financial=12.50[EUR] or financial_micros=N, tokens=N, tool_calls=N, compute_ms=N, "
        "wall_clock_ms=N, side_effects=N. A dimension not given is 0 = nothing allowed",
    )
    g.add_argument(
        "--currency", help="the caps' currency (default: the one financial= names, else the Mission budget's)"
    )
    g.add_argument(
        "--max-depth", type=natural, required=True, metavar="N", help="levels below the target it may create"
    )
    add_expiry_flags(g, "the grant", required=True)
    add_coordinator_epoch_flag(g)
    g.set_defaults(func=cmd_grant)

    r = acting_command(
        dele.add_parser("revoke", help="end a grant before its expiry (current Coordinator or MissionOwner)"),
    )
    r.add_argument("grant_id", metavar="GRANT_ID")
    r.add_argument("--reason", required=True)
    r.set_defaults(func=cmd_revoke)

    ls = reading_command(
        dele.add_parser("list", help="every grant of a Group: status, remaining budget, expiry")
    )
    ls.set_defaults(func=cmd_list)

    s = reading_command(
        dele.add_parser(
            "show", help="one grant: every field, caps vs charged vs remaining, charged WorkItems"
        )
    )
    s.add_argument("grant_id", metavar="GRANT_ID")
    s.set_defaults(func=cmd_show)
