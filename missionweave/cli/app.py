"""``mwp``: run the mesh and talk to it (docs/cli.md lists every command).

Exit codes: 0 success, 1 refused (by the server, reason printed; or by a client-side check such as
a signed summary that does not verify), 2 usage error, 3 the server could not be reached.

The Mission, Coordinator, Membership, delegation grant, Conversation and Message commands live in
``cli_mission``, ``cli_coordinator``, ``cli_member``, ``cli_delegation`` and ``cli_conversation``;
their shared plumbing in ``cli_common``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from missionweave.cli import agent as cli_agent
from missionweave.cli import artifact as cli_artifact
from missionweave.cli import context as cli_context
from missionweave.cli import conversation as cli_conversation
from missionweave.cli import coordinator as cli_coordinator
from missionweave.cli import delegation as cli_delegation
from missionweave.cli import demo, extensions
from missionweave.cli import group as cli_group
from missionweave.cli import member as cli_member
from missionweave.cli import mission as cli_mission
from missionweave.cli import plan as cli_plan
from missionweave.cli import readmodels as cli_readmodels
from missionweave.cli import work as cli_work
from missionweave.cli import worker as cli_worker
from missionweave.cli.common import (
    CliError,
    UsageError,
    add_actor_flags,
    add_client_tls_flags,
    add_reader_flags,
    client_tls,
    connect,
    environment,
    reading,
    save_session,
    target,
)
from missionweave.cli.context_store import DEFAULT_TIMEOUT_S, context_environment
from missionweave.kernel.env import admin_key_file, data_dir_of
from missionweave.kernel.health_names import INTEGRITY_HEALTH, SERVICE_NAMES
from missionweave.kernel.rejections import is_shutting_down, rejection_from_rpc_error
from missionweave.kernel.signing import generate_key, read_key, write_key
from missionweave.kernel.transport import open_channel
from missionweave.v1 import common_pb2, event_pb2

KINDS = {
    "human": common_pb2.IDENTITY_KIND_HUMAN,
    "agent": common_pb2.IDENTITY_KIND_AGENT,
    "control-plane": common_pb2.IDENTITY_KIND_CONTROL_PLANE,
}


def _print_message(message: object) -> None:
    print(json_format.MessageToJson(message, indent=2))  # type: ignore[arg-type]


# ------------------------------------------------------------------ commands


def cmd_keygen(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if path.exists():
        print(f"mwp: {path} already exists; refusing to overwrite a key", file=sys.stderr)
        return 1
    key = generate_key()
    write_key(path, key)
    print(f"wrote private key {path} (mode 0600)")
    print(f"public key: {bytes(key.verify_key).hex()}")
    return 0


async def cmd_identity_register(args: argparse.Namespace) -> int:
    if args.public_key:
        public = bytes.fromhex(args.public_key)
    else:
        public = bytes(read_key(Path(args.key_file)).verify_key)
    admin_key = read_key(Path(args.admin_key or admin_key_file(data_dir_of(environment(args)))))
    async with connect(args) as mesh:
        identity = await mesh.register_identity(
            args.admin_id, admin_key, args.identity_id, KINDS[args.kind], public, args.name or ""
        )
    print(f"registered {identity.identity_id} ({args.kind})")
    return 0


async def cmd_session_open(args: argparse.Namespace) -> int:
    async with connect(args) as mesh:
        signer = await mesh.open_session(args.actor, read_key(Path(args.key)))
    save_session(Path(args.key), signer)
    print(f"session epoch {signer.session_epoch} opened for {args.actor}; older sessions are fenced")
    return 0


# How long `events --follow` waits before reconnecting to a server that went away (doubling).
FOLLOW_RETRY_FIRST_S, FOLLOW_RETRY_MAX_S = 0.5, 5.0


def event_line(event: event_pb2.Event, payloads: bool) -> str:
    line: dict[str, Any] = {
        "seq": event.sequence,
        "type": event.type,
        "actor": event.actor_id,
        "at": event.recorded_at.ToJsonString(),
        "event_id": event.event_id,
    }
    if payloads:
        field = event.WhichOneof("payload")
        if field:
            line["payload"] = json_format.MessageToDict(
                getattr(event, field), preserving_proto_field_name=True
            )
    return json.dumps(line)


async def cmd_events(args: argparse.Namespace) -> int:
    """JSON lines; with --follow it reconnects when the server goes away and resumes after the last
    event it printed (nothing twice, nothing skipped), until Ctrl-C."""
    after, retry = args.after, FOLLOW_RETRY_FIRST_S
    while True:
        try:
            async with reading(args) as mesh:
                async for event in mesh.read_events(args.group, after, follow=args.follow):
                    print(event_line(event, args.payloads), flush=True)
                    after, retry = event.sequence, FOLLOW_RETRY_FIRST_S
            return 0
        except grpc.aio.AioRpcError as err:
            if not args.follow or err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise
            why = err.code().name + (": shutting down" if is_shutting_down(err) else "")
            print(
                f"mwp: lost {target(args)} ({why}); reconnecting in {retry:g} s",
                file=sys.stderr,
                flush=True,
            )
            await asyncio.sleep(retry)
            retry = min(FOLLOW_RETRY_MAX_S, retry * 2)


async def cmd_state(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        _print_message(await mesh.group_state(args.group))
    return 0


async def cmd_health(args: argparse.Namespace) -> int:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    worst, answered = 0, False
    async with open_channel(target(args), client_tls(args)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in [*SERVICE_NAMES.values(), INTEGRITY_HEALTH]:
            try:
                resp = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=3)
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.aio.AioRpcError as err:
                if (
                    err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                    and not answered
                ):
                    print(f"mwp: cannot reach {target(args)}: {err.details()}", file=sys.stderr)
                    return 3  # the README's "unreachable"
                if name == INTEGRITY_HEALTH and err.code() == grpc.StatusCode.NOT_FOUND:
                    continue  # no Authority behind this address
                status = err.code().name
            answered = True
            worst = worst or (0 if status == "SERVING" else 1)
            note = (
                "  (a Group failed verification: see DATA_CORRUPTED in the log, run mwp verify)"
                if (name == INTEGRITY_HEALTH and status != "SERVING")
                else ""
            )
            print(f"{name:40s} {status}{note}")
    return worst


# ------------------------------------------------------------------ parser


def build_parser(installed: list[extensions.Extension] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mwp", description="MissionWeave: run the mesh and talk to it.")
    p.add_argument("--target", help="server address (default $MWP_TARGET, the context's, or 127.0.0.1:50051)")
    p.add_argument(
        "--timeout",
        type=float,
        help="give up on a silent server after this many seconds, exit 3 (default $MWP_TIMEOUT, the context's, "
        f"or {DEFAULT_TIMEOUT_S:g}; not for serve, demo, worker run and events --follow, which run until stopped)",
    )
    p.add_argument(
        "--context",
        metavar="NAME",
        help="take the connection options no flag or MWP_* variable gives from this saved context "
        "(default $MWP_CONTEXT, else the selected one; see mwp context)",
    )
    add_client_tls_flags(p)
    sub = p.add_subparsers(dest="command", required=True)

    k = sub.add_parser("keygen", help="create an Ed25519 key file (mode 0600)")
    k.add_argument("path")
    k.set_defaults(func=cmd_keygen, ignores_contexts=True)

    ident = sub.add_parser("identity", help="Organization identities").add_subparsers(
        dest="sub", required=True
    )
    r = ident.add_parser("register", help="register an identity (signed by an Organization admin)")
    r.add_argument("identity_id")
    r.add_argument("--kind", choices=sorted(KINDS), required=True)
    g = r.add_mutually_exclusive_group(required=True)
    g.add_argument("--public-key", help="hex Ed25519 public key")
    g.add_argument("--key-file", help="read the public key from this private key file")
    r.add_argument("--name", help="display name")
    r.add_argument("--admin-id", default="admin")
    r.add_argument("--admin-key", help="admin key file (default <data dir>/keys/admin.key)")
    r.set_defaults(func=cmd_identity_register)
    cli_readmodels.add_identity_commands(ident)

    sess = sub.add_parser("session", help="sessions").add_subparsers(dest="sub", required=True)
    o = sess.add_parser("open", help="open a new session (fences older ones)")
    add_actor_flags(o)
    o.set_defaults(func=cmd_session_open)

    cli_mission.register(sub)
    cli_coordinator.register(sub)
    cli_member.register(sub)
    cli_work.register(cli_readmodels.register_work(sub))
    cli_plan.register(sub)
    cli_delegation.register(sub)
    cli_worker.register(sub)
    cli_conversation.register(sub)
    cli_artifact.register(sub)
    cli_agent.register(sub)
    cli_group.register(sub)
    cli_context.register(sub)
    demo.register(sub)
    extensions.register_all(sub, extensions.installed() if installed is None else installed)

    e = sub.add_parser("events", help="print a Group's events as JSON lines")
    e.add_argument("--group", required=True)
    e.add_argument("--after", type=int, default=0)
    e.add_argument(
        "--follow", action="store_true", help="keep printing new events; reconnects when the server restarts"
    )
    e.add_argument(
        "--payloads", action="store_true", help="each line also carries the event's payload as JSON"
    )
    add_reader_flags(e)
    e.set_defaults(func=cmd_events)

    st = sub.add_parser("state", help="print a Group's folded state")
    st.add_argument("--group", required=True)
    add_reader_flags(st)
    st.set_defaults(func=cmd_state)

    h = sub.add_parser("health", help="check every service's health")
    h.set_defaults(func=cmd_health)
    return p


def _refusal(err: grpc.aio.AioRpcError, rejection: common_pb2.Rejection | None) -> str:
    """``REASON: message (key=value, ...)`` from the structured rejection, else the gRPC status."""
    if rejection is None:
        return f"{err.code().name}: {err.details()}"
    reason = common_pb2.RejectionReason.Name(rejection.reason).removeprefix("REJECTION_REASON_")
    facts = ", ".join(f"{k}={v}" for k, v in sorted(rejection.metadata.items()))
    return f"{reason}: {rejection.message or err.details()}" + (f" ({facts})" if facts else "")


async def _within(work: Awaitable[int], seconds: float) -> int:
    async with asyncio.timeout(seconds):
        return await work


def _timeout(args: argparse.Namespace) -> float:
    if args.timeout is not None:
        return float(args.timeout)
    text = environment(args).get("MWP_TIMEOUT", "")
    try:
        return float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise UsageError(f"MWP_TIMEOUT must be a number of seconds, not {text!r}") from None


def _run(
    func: Callable[[argparse.Namespace], int | Awaitable[int]], args: argparse.Namespace, seconds: float
) -> int:
    result = func(args)
    if asyncio.iscoroutine(result):
        bounded = not (getattr(args, "runs_until_stopped", False) or getattr(args, "follow", False))
        result = asyncio.run(_within(result, seconds) if bounded and seconds > 0 else result)
    return int(result)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    installed = extensions.installed()
    args = build_parser(installed).parse_args(argv)
    func: Callable[[argparse.Namespace], int | Awaitable[int]] = args.func
    seconds = DEFAULT_TIMEOUT_S
    try:
        # Commands that reach no mesh, and those managing contexts, read none (D111).
        if not getattr(args, "ignores_contexts", False):
            args.context_env = context_environment(args)
        seconds = _timeout(args)
        command = func.__name__.removeprefix("cmd_").replace("_", " ")
        return extensions.around(installed, command, lambda: _run(func, args, seconds))
    except TimeoutError:
        print(f"mwp: no answer from {target(args)} within {seconds:g} s (--timeout)", file=sys.stderr)
        return 3
    except BrokenPipeError:  # the reader went away (`mwp ... | head`): nothing more to say
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except grpc.aio.AioRpcError as err:
        rejection = rejection_from_rpc_error(err)
        if err.code() == grpc.StatusCode.UNAVAILABLE and rejection is None:
            print(f"mwp: cannot reach {target(args)}: {err.details()}", file=sys.stderr)
            return 3
        print(f"mwp: refused: {_refusal(err, rejection)}", file=sys.stderr)
        return 1
    except CliError as err:
        print(f"mwp: {err}", file=sys.stderr)
        return err.exit_code
    except (OSError, ValueError) as err:
        print(f"mwp: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
