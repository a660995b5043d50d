"""``mwp agent card publish|show`` and ``mwp agent presence report|show`` (docs/agent-cards.md).

Publishing and reporting act as the agent named by ``--as/--key`` (or MWP_AS / MWP_KEY): the card is
signed by its saved session and the call proven as it. Showing a card verifies its signature with
the session key served with it before printing anything.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from missionweave.cli.common import (
    UsageError,
    add_json_flag,
    add_reader_flags,
    capability,
    emit,
    enum_label,
    reading,
    to_dict,
    when,
)
from missionweave.v1 import agent_card_pb2 as pb
from missionweave.v1 import membership_pb2

AVAILABILITY = {
    "available": pb.PRESENCE_AVAILABILITY_AVAILABLE,
    "busy": pb.PRESENCE_AVAILABILITY_BUSY,
    "draining": pb.PRESENCE_AVAILABILITY_DRAINING,
    "offline": pb.PRESENCE_AVAILABILITY_OFFLINE,
}
_PREFIX = "PRESENCE_AVAILABILITY_"


def parse_capability(text: str) -> membership_pb2.Capability:
    """``code.python@1.4.0`` (or ``code.python=1.4.0``) -> Capability."""
    try:
        return capability(text)
    except argparse.ArgumentTypeError as err:
        raise UsageError(f"--capability {err}") from None


def card_from_args(args: argparse.Namespace) -> pb.AgentCard:
    """The card of --file (proto3 JSON of AgentCard), with the flags given applied over it."""
    card = pb.AgentCard()
    if args.file:
        try:
            json_format.Parse(Path(args.file).read_text(), card)
        except json_format.ParseError as err:
            raise UsageError(f"{args.file}: not an AgentCard in the proto3 JSON mapping: {err}") from None
    if args.card_version:
        card.card_version = args.card_version
    if args.max_concurrency is not None:
        card.max_concurrency = args.max_concurrency
    if args.capability:
        del card.capabilities[:]
        card.capabilities.extend(parse_capability(c) for c in args.capability)
    for name in ("extension", "endpoint"):
        values = getattr(args, name)
        if values:
            field = getattr(card, f"{name}s")
            del field[:]
            field.extend(values)
    if args.name is not None:
        card.display_name = args.name
    if args.description is not None:
        card.description = args.description
    if not card.card_version:
        raise UsageError("a card needs a version: --card-version V (or card_version in --file)")
    return card


def card_lines(published: pb.PublishedAgentCard, latest: str) -> list[str]:
    card = published.card
    standing = "in force" if card.card_version == latest else f"superseded by {latest}"
    caps = ", ".join(f"{c.capability_id} {c.version}" for c in card.capabilities) or "-"
    lines = [
        f"agent card {card.agent_id} {card.card_version} ({standing}; signature verified)",
        f"  published {when(published.published_at)}, signed by session {published.session_epoch}",
        f"  max concurrency: {card.max_concurrency}",
        f"  capabilities: {caps}",
        f"  extensions: {', '.join(card.extensions) or '-'}",
        f"  endpoints: {', '.join(card.endpoints) or '-'}",
    ]
    if card.display_name:
        lines.append(f"  name: {card.display_name}")
    if card.description:
        lines.append(f"  description: {card.description}")
    return lines


def card_document(published: pb.PublishedAgentCard) -> dict[str, Any]:
    return {
        "card": to_dict(published.card),
        "published_at": when(published.published_at),
        "session_epoch": published.session_epoch,
        "verified": True,
    }


async def cmd_card_publish(args: argparse.Namespace) -> int:
    card = card_from_args(args)
    async with reading(args) as mesh:
        answer = await mesh.publish_agent_card(card)
    lines = card_lines(answer.published, answer.published.card.card_version)
    if answer.replayed:
        lines[0] += " (already published with this card: nothing new was written)"
    emit(args, lines, {**card_document(answer.published), "replayed": answer.replayed})
    return 0


async def cmd_card_show(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        published = await mesh.agent_card(args.agent, args.card_version or "")
        versions = await mesh.agent_card_versions(args.agent)
    latest = versions[0].card_version if versions else published.card.card_version
    lines = card_lines(published, latest)
    lines.append("versions (newest first):")
    lines += [f"  {v.card_version:<20} {when(v.published_at)}" for v in versions]
    document = {
        **card_document(published),
        "latest_version": latest,
        "versions": [
            {"card_version": v.card_version, "published_at": when(v.published_at)} for v in versions
        ],
    }
    emit(args, lines, document)
    return 0


def presence_line(p: pb.AgentPresence) -> str:
    shown = enum_label(pb.PresenceAvailability, p.availability, _PREFIX)
    if not p.fresh:
        reported = enum_label(pb.PresenceAvailability, p.reported_availability, _PREFIX)
        shown += f" (stale since {when(p.expires_at)}; last reported {reported})"
    line = (
        f"{p.agent_id}  {shown}  {p.free_slots} free, {p.in_use_slots} in use of {p.max_concurrency} "
        f"(card {p.card_version})  reported {when(p.reported_at)}"
    )
    if p.fresh:
        line += f", fresh until {when(p.expires_at)}"
    return line + (f"  note: {p.note}" if p.note else "")


def presence_document(p: pb.AgentPresence) -> dict[str, Any]:
    return to_dict(p) | {"fresh": p.fresh}  # MessageToDict leaves out a false bool


async def cmd_presence_report(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        presence = await mesh.report_presence(
            AVAILABILITY[args.availability],
            free_slots=args.free,
            in_use_slots=args.in_use,
            note=args.note or "",
            ttl_ms=int(args.ttl * 1000),
        )
    emit(args, [presence_line(presence)], presence_document(presence))
    return 0


async def cmd_presence_show(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        found = {p.agent_id: p for p in await mesh.presence(*args.agents)}
    lines = [presence_line(found[a]) if a in found else f"{a}  no Presence reported" for a in args.agents]
    document = {
        "presences": [presence_document(p) for p in found.values()],
        "missing": [a for a in args.agents if a not in found],
    }
    emit(args, lines, document)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    agent = sub.add_parser("agent", help="Agent Cards and Presence").add_subparsers(dest="sub", required=True)
    card = agent.add_parser("card", help="an agent's signed, versioned Agent Card").add_subparsers(
        dest="card_command", required=True
    )
    p = card.add_parser("publish", help="publish a new card version as --as (signed by its session)")
    p.add_argument(
        "--file", help="the card as proto3 JSON of missionweave.v1.AgentCard; flags override its fields"
    )
    p.add_argument("--card-version", help="the card's semantic version, greater than the latest (e.g. 1.2.0)")
    p.add_argument("--max-concurrency", type=int, help="the most WorkItems executed at once (>= 1)")
    p.add_argument("--capability", action="append", metavar="ID@VERSION", help="a capability (repeatable)")
    p.add_argument("--extension", action="append", metavar="URN", help="a supported extension (repeatable)")
    p.add_argument("--endpoint", action="append", help="where the agent is reached (repeatable)")
    p.add_argument("--name", help="display name")
    p.add_argument("--description", help="description")
    add_json_flag(p)
    add_reader_flags(p)
    p.set_defaults(func=cmd_card_publish)

    s = card.add_parser("show", help="an agent's card (verified) and its versions")
    s.add_argument("agent")
    s.add_argument("--card-version", help="that version (default: the card in force)")
    add_json_flag(s)
    add_reader_flags(s)
    s.set_defaults(func=cmd_card_show)

    presence = agent.add_parser("presence", help="an agent's current capacity").add_subparsers(
        dest="presence_command", required=True
    )
    r = presence.add_parser("report", help="report --as's Presence (bounded by its card's max concurrency)")
    r.add_argument("--availability", choices=sorted(AVAILABILITY), required=True)
    r.add_argument("--free", type=int, required=True, help="free slots")
    r.add_argument("--in-use", type=int, default=0, help="slots in use (default 0)")
    r.add_argument("--note", help="a note for people")
    r.add_argument("--ttl", type=float, default=60.0, help="seconds the report holds (1..600, default 60)")
    add_json_flag(r)
    add_reader_flags(r)
    r.set_defaults(func=cmd_presence_report)

    show = presence.add_parser("show", help="the last Presence of each agent, fresh or stale")
    show.add_argument("agents", nargs="+", metavar="AGENT")
    add_json_flag(show)
    add_reader_flags(show)
    show.set_defaults(func=cmd_presence_show)


__all__ = ["card_from_args", "parse_capability", "register"]
