"""Shared plumbing of the ``mwp`` commands: acting as an identity, Group look-ups, output.

Every Group-scoped command follows the same shape: open the actor's session (``acting``), read the
Group's state once (``Actor.state``, cached per invocation), derive whatever the user did not pass
(membership epoch, Coordinator epoch, ...) from it, execute one signed command and ``report`` the
result, human-readable by default or as one JSON document with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from missionweave.cli.context_store import DEFAULT_TARGET
from missionweave.cli.errors import CliError, UsageError
from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.signing import read_key
from missionweave.kernel.transport import ClientTLS, client_tls_config
from missionweave.sdk.client import MeshClient, SessionSigner, decode_events, membership_epoch
from missionweave.v1 import authority_service_pb2, command_pb2, event_pb2, membership_pb2, mission_pb2

GroupState = authority_service_pb2.GroupState
# Anything carrying the client TLS settings: the environment's (ClientTLSConfig), or a server's Settings.
S = TypeVar("S")


# ------------------------------------------------------------------ sessions


def environment(args: argparse.Namespace) -> dict[str, str]:
    """The ``MWP_*`` variables as this invocation sees them: the process environment plus what the
    context in use supplies (``main`` puts that in ``args.context_env``, only variables the
    environment leaves unset or empty; context_store.py)."""
    return {**os.environ, **getattr(args, "context_env", {})}


def target(args: argparse.Namespace) -> str:
    return str(getattr(args, "target", None) or environment(args).get("MWP_TARGET", DEFAULT_TARGET))


# The client TLS flags every command takes (before the command: `mwp --tls-ca ca.crt health`), each
# overriding its MWP_TLS_* variable (docs/tls.md).
CLIENT_TLS_FLAGS = {
    "tls_ca": "--tls-ca",
    "tls_client_cert": "--tls-client-cert",
    "tls_client_key": "--tls-client-key",
    "tls_server_name": "--tls-server-name",
}


def add_client_tls_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("TLS to the server (docs/tls.md)")
    g.add_argument(
        "--tls",
        action="store_true",
        default=None,
        help="use TLS, verifying the server with the system's roots unless --tls-ca (default $MWP_TLS; "
        "on whenever another --tls-* flag or MWP_TLS_* client variable is set)",
    )
    g.add_argument(
        "--tls-ca", type=Path, help="CA bundle (PEM) that verifies the server (default $MWP_TLS_CA)"
    )
    g.add_argument(
        "--tls-client-cert",
        type=Path,
        help="client certificate (PEM) for mTLS (default $MWP_TLS_CLIENT_CERT)",
    )
    g.add_argument("--tls-client-key", type=Path, help="its private key (PEM) (default $MWP_TLS_CLIENT_KEY)")
    g.add_argument(
        "--tls-server-name",
        help="the name to check in the server certificate instead of the target's host "
        "(default $MWP_TLS_SERVER_NAME)",
    )


def with_client_tls_flags(settings: S, args: argparse.Namespace) -> S:
    """``settings`` with the client TLS flags given on the command line applied over the environment."""
    if getattr(args, "tls", None):
        setattr(settings, "tls", True)  # noqa: B010 (S is any object with the ClientTLSSettings fields)
    for name in CLIENT_TLS_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            setattr(settings, name, value)
    return settings


def client_tls(args: argparse.Namespace) -> ClientTLS | None:
    return ClientTLS.from_settings(with_client_tls_flags(client_tls_config(environment(args)), args))


def connect(args: argparse.Namespace) -> MeshClient:
    """A client of the target, over TLS when the flags or MWP_TLS_* ask for it."""
    return MeshClient(target(args), client_tls(args))


def session_file(key_path: Path) -> Path:
    return key_path.with_name(key_path.name + ".session.json")


def save_session(key_path: Path, signer: SessionSigner) -> None:
    session_file(key_path).write_text(
        json.dumps({"identity": signer.identity_id, "session_epoch": signer.session_epoch})
    )


async def load_signer(args: argparse.Namespace, mesh: MeshClient) -> SessionSigner:
    """The saved session for --as/--key, opening (and saving) a new one if none was saved."""
    key_path = Path(args.key)
    key = read_key(key_path)
    saved = session_file(key_path)
    if saved.exists():
        data = json.loads(saved.read_text())
        if data.get("identity") == args.actor:
            return SessionSigner(args.actor, int(data["session_epoch"]), key)
    signer = await mesh.open_session(args.actor, key)
    save_session(key_path, signer)
    return signer


# ------------------------------------------------------------------ acting in a Group


@dataclass
class Actor:
    """One identity acting through one connection; Group states are read once per invocation."""

    args: argparse.Namespace
    mesh: MeshClient
    signer: SessionSigner
    states: dict[str, GroupState] = field(default_factory=dict)

    async def state(self, group_id: str) -> GroupState:
        if group_id not in self.states:
            self.states[group_id] = await self.mesh.group_state(group_id)
        return self.states[group_id]

    async def membership_epoch(self, group_id: str) -> int:
        """--membership-epoch if given, else the actor's active Membership epoch from the Group state."""
        override = getattr(self.args, "membership_epoch", None)
        if override is not None:
            return int(override)
        return membership_epoch(await self.state(group_id), self.signer.identity_id)

    async def execute(
        self,
        group_id: str,
        kind: str,
        body: Message,
        *,
        creating: bool = False,
        command_id: str | None = None,
    ) -> command_pb2.CommandResult:
        """Signs and executes one command; a Group-creating command carries membership epoch 0.
        ``command_id`` (default: a fresh one) lets a retry be answered by the Authority's idempotency."""
        epoch = 0 if creating else await self.membership_epoch(group_id)
        command = self.signer.command(group_id, kind, body, membership_epoch=epoch, command_id=command_id)
        return await self.mesh.execute(self.signer.sign(command))


@asynccontextmanager
async def acting(args: argparse.Namespace) -> AsyncIterator[Actor]:
    async with connect(args) as mesh:
        signer = await load_signer(args, mesh)
        mesh.read_as(signer)  # the Group reads an action needs are proven as its actor
        yield Actor(args, mesh, signer)


@asynccontextmanager
async def reading(args: argparse.Namespace) -> AsyncIterator[MeshClient]:
    """A connection for read-only commands: reads are proven as --as/--key (or MWP_AS / MWP_KEY),
    whose saved session signs a call proof for each call (docs/security.md)."""
    env = environment(args)
    args.actor = getattr(args, "actor", None) or env.get("MWP_AS")
    args.key = getattr(args, "key", None) or env.get("MWP_KEY")
    if not args.actor or not args.key:
        raise UsageError(
            "reading needs an identity: pass --as ID --key FILE (or set MWP_AS and MWP_KEY, or use a context with both)"
        )
    async with connect(args) as mesh:
        mesh.read_as(await load_signer(args, mesh))
        yield mesh


def mission_of(state: GroupState) -> mission_pb2.Mission:
    """The Group's Mission; a CliError when the Group has none."""
    if not state.HasField("mission"):
        raise CliError(f"group {state.group_id} holds no Mission")
    return state.mission


def coordinator_epoch(args: argparse.Namespace, state: GroupState) -> int:
    """--coordinator-epoch if given, else the current Coordinator lease's epoch."""
    if getattr(args, "coordinator_epoch", None) is not None:
        return int(args.coordinator_epoch)
    return int(mission_of(state).coordinator.coordinator_epoch)


def require(value: str, what: str, flag: str) -> str:
    """``value`` read from the Group state, or a CliError saying it is missing and which flag names it."""
    if not value:
        raise CliError(f"{what}; pass {flag} to name one explicitly")
    return value


# ------------------------------------------------------------------ output


def enum_label(enum: Any, value: int, prefix: str) -> str:
    """``MISSION_STATE_APPROVED`` -> ``APPROVED``; unknown numbers are shown as numbers."""
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def when(ts: Timestamp) -> str:
    """An RFC 3339 UTC time, or ``-`` for an unset timestamp."""
    if not ts.seconds and not ts.nanos:
        return "-"
    return ts.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def relative(ts: Timestamp, now: datetime | None = None) -> str:
    """``in 4m 05s`` or ``3s ago`` relative to the local clock (a hint; the Authority's clock rules)."""
    delta = int((ts.ToDatetime(tzinfo=UTC) - (now or datetime.now(UTC))).total_seconds())
    minutes, seconds = divmod(abs(delta), 60)
    span = f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"
    return f"in {span}" if delta >= 0 else f"{span} ago"


def columns(rows: list[list[str]], indent: str = "") -> list[str]:
    """``rows`` (the first one a header) as aligned text columns, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def emit(args: argparse.Namespace, lines: Iterable[str], document: dict[str, Any]) -> None:
    """Human ``lines`` by default, or ``document`` as one JSON document with --json."""
    if wants_json(args):
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        for line in lines:
            print(line)


def result_events(result: command_pb2.CommandResult) -> list[event_pb2.Event]:
    return decode_events(result.events)


def first_event(result: command_pb2.CommandResult, payload: str) -> event_pb2.Event | None:
    """The first event of the result carrying ``payload`` (an Event oneof field name)."""
    return next((e for e in result_events(result) if e.WhichOneof("payload") == payload), None)


def report(
    args: argparse.Namespace,
    result: command_pb2.CommandResult,
    headline: str,
    *,
    last_line: str = "",
    details: Iterable[str] = (),
    extra: dict[str, Any] | None = None,
) -> int:
    """Prints an accepted command's result: the headline, its ``details`` lines, one line per event,
    then ``last_line`` (an id scripts pick up with ``tail -1``). With --json: the result and its
    decoded events."""
    return report_all(args, [result], headline, last_line=last_line, details=details, extra=extra)


def report_all(
    args: argparse.Namespace,
    results: list[command_pb2.CommandResult],
    headline: str,
    *,
    last_line: str = "",
    details: Iterable[str] = (),
    extra: dict[str, Any] | None = None,
) -> int:
    """``report`` for one action made of several commands, in order: every event of them; the
    --json document names the last command (``command_id``) and, when more than one, all of them
    (``command_ids``); ``replayed`` only when every one was."""
    events = [e for result in results for e in result_events(result)]
    last = results[-1]
    replayed = all(r.replayed for r in results)
    lines = [f"{headline}{' (idempotent retry: nothing new was written)' if replayed else ''}", *details]
    lines += [f"  #{e.sequence} {e.type} {e.event_id}" for e in events]
    lines += [f"group {last.group_id} is at revision {last.group_revision}"]
    if last_line:
        lines.append(last_line)
    document = {
        "command_id": last.command_id,
        **({"command_ids": [r.command_id for r in results]} if len(results) > 1 else {}),
        "group_id": last.group_id,
        "group_revision": last.group_revision,
        "replayed": replayed,
        "events": [to_dict(e) for e in events],
        **(extra or {}),
    }
    emit(args, lines, document)
    return 0


# ------------------------------------------------------------------ argument types (bad input exits 2)

_CAPABILITY = re.compile(r"^([^\s=@]+)[=@](\S+)$")
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def capability(text: str) -> membership_pb2.Capability:
    """``code.python=1.4.0`` -> Capability. ``ID@VERSION`` (as Agent Cards are written) is read too."""
    match = _CAPABILITY.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ID=VERSION, e.g. code.python=1.4.0")
    return membership_pb2.Capability(capability_id=match[1], version=match[2])


def natural(text: str) -> int:
    """A whole number >= 0 (the proto field is unsigned)."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= 0")
    return int(text)


def duration(text: str) -> timedelta:
    """``30m``, ``1h``, ``1h30m``, ``2d``, ``45s`` -> timedelta (a unit is required: no bare numbers)."""
    match = _DURATION.match(text.strip().lower())
    if match is None or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 45s, 30m, 1h30m or 2d")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def instant(text: str) -> datetime:
    """An ISO 8601 time with its offset (``2026-12-01T18:00:00Z``): a time without one is refused
    rather than guessed, since the server compares it with its own UTC clock."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected an ISO 8601 time, e.g. 2026-12-01T18:00:00Z"
        ) from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give the time zone, e.g. 2026-12-01T18:00:00Z or ...+01:00"
        )
    return value.astimezone(UTC)


def add_expiry_flags(sp: argparse.ArgumentParser, what: str, *, required: bool) -> None:
    """--expires-in DURATION | --expires-at ISO (one of them; read back with ``expiry``)."""
    g = sp.add_mutually_exclusive_group(required=required)
    g.add_argument(
        "--expires-in",
        type=duration,
        metavar="DURATION",
        help=f"{what} expires this long from now by the local clock, e.g. 30m, 1h, 1h30m, 2d",
    )
    g.add_argument(
        "--expires-at", type=instant, metavar="ISO", help=f"{what} expires then, e.g. 2026-12-01T18:00:00Z"
    )


def expiry(args: argparse.Namespace) -> Timestamp | None:
    """The expiry --expires-in / --expires-at name, or None when neither was given."""
    if args.expires_at is not None:
        return to_timestamp(args.expires_at)
    if args.expires_in is not None:
        return to_timestamp(SystemClock().now() + args.expires_in)
    return None


# ------------------------------------------------------------------ shared flags


def add_actor_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--as", dest="actor", required=True, help="your identity id")
    sp.add_argument("--key", required=True, help="your key file (the session is saved next to it)")


def add_reader_flags(sp: argparse.ArgumentParser) -> None:
    """--as/--key for a read: optional on the command line, else MWP_AS / MWP_KEY."""
    if any(action.dest == "actor" for action in sp._actions):
        return
    sp.add_argument("--as", dest="actor", help="your identity id (default: $MWP_AS); reads are proven as it")
    sp.add_argument("--key", help="your key file (default: $MWP_KEY; the session is saved next to it)")


def add_json_flag(sp: argparse.ArgumentParser, text: str = "machine output: one JSON document") -> None:
    sp.add_argument("--json", action="store_true", help=text)


def add_group_flags(sp: argparse.ArgumentParser, text: str = "the Group") -> None:
    """--group plus the --membership-epoch override (default: looked up in the Group state)."""
    sp.add_argument("--group", required=True, help=text)
    sp.add_argument(
        "--membership-epoch", type=int, help="your Membership epoch (default: your active one in the Group)"
    )


def add_coordinator_epoch_flag(
    sp: argparse.ArgumentParser, text: str = "default: the current lease's epoch"
) -> None:
    sp.add_argument("--coordinator-epoch", type=int, help=f"Coordinator epoch ({text})")


def reading_command(sp: argparse.ArgumentParser, group_text: str = "the Group") -> argparse.ArgumentParser:
    """The flags a read of one Group shares: --group, --json, and who reads (--as/--key)."""
    sp.add_argument("--group", required=True, help=group_text)
    add_json_flag(sp)
    add_reader_flags(sp)
    return sp


def acting_command(sp: argparse.ArgumentParser, group_text: str = "the Group") -> argparse.ArgumentParser:
    """The flags every Group-scoped command shares: actor, Group, membership epoch, --json."""
    add_actor_flags(sp)
    add_group_flags(sp, group_text)
    add_json_flag(sp)
    return sp
