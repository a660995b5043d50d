"""``mwp``: run the mesh and talk to it.

Exit codes: 0 success, 1 the server refused the request (reason printed), 2 usage error,
3 the server could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import grpc
from google.protobuf import json_format

from missionweave import ids
from missionweave.clock import SystemClock, to_timestamp
from missionweave.config import SERVICES, Settings
from missionweave.errors import rejection_from_rpc_error
from missionweave.signing import generate_key, read_key, write_key
from missionweave.v1 import common_pb2, conversation_pb2, mission_pb2

KINDS = {
    "human": common_pb2.IDENTITY_KIND_HUMAN,
    "agent": common_pb2.IDENTITY_KIND_AGENT,
    "control-plane": common_pb2.IDENTITY_KIND_CONTROL_PLANE,
}


def _target(args: argparse.Namespace) -> str:
    return str(args.target or os.environ.get("MWP_TARGET", "127.0.0.1:50051"))


def _session_file(key_path: Path) -> Path:
    return key_path.with_name(key_path.name + ".session.json")


async def _signer(args: argparse.Namespace, mesh: object) -> object:
    """The saved session for --as/--key, opening a new one if none was saved."""
    from missionweave.client import MeshClient, SessionSigner

    assert isinstance(mesh, MeshClient)
    key_path = Path(args.key)
    key = read_key(key_path)
    saved = _session_file(key_path)
    if saved.exists():
        data = json.loads(saved.read_text())
        if data.get("identity") == args.actor:
            return SessionSigner(args.actor, int(data["session_epoch"]), key)
    signer = await mesh.open_session(args.actor, key)
    saved.write_text(json.dumps({"identity": args.actor, "session_epoch": signer.session_epoch}))
    return signer


def _print_message(message: object) -> None:
    print(json_format.MessageToJson(message, indent=2))  # type: ignore[arg-type]


# ------------------------------------------------------------------ commands


def cmd_serve(args: argparse.Namespace) -> int:
    from missionweave import logs
    from missionweave.server import serve_forever

    settings = Settings.from_env()
    if args.listen:
        settings.listen = args.listen
    if args.data_dir:
        settings.data_dir = Path(args.data_dir)
    if args.database_url:
        settings.database_url = args.database_url
    if args.service:
        settings.services = tuple(args.service)
    logs.configure(settings.log_level, settings.log_format)
    asyncio.run(serve_forever(settings))
    return 0


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
    from missionweave.client import MeshClient

    if args.public_key:
        public = bytes.fromhex(args.public_key)
    else:
        public = bytes(read_key(Path(args.key_file)).verify_key)
    admin_key = read_key(Path(args.admin_key or Settings.from_env().admin_key_path))
    async with MeshClient(_target(args)) as mesh:
        identity = await mesh.register_identity(args.admin_id, admin_key, args.identity_id, KINDS[args.kind], public, args.name or "")
    print(f"registered {identity.identity_id} ({args.kind})")
    return 0


async def cmd_session_open(args: argparse.Namespace) -> int:
    from missionweave.client import MeshClient

    async with MeshClient(_target(args)) as mesh:
        signer = await mesh.open_session(args.actor, read_key(Path(args.key)))
    _session_file(Path(args.key)).write_text(json.dumps({"identity": args.actor, "session_epoch": signer.session_epoch}))
    print(f"session epoch {signer.session_epoch} opened for {args.actor}; older sessions are fenced")
    return 0


async def cmd_mission_create(args: argparse.Namespace) -> int:
    from missionweave.client import MeshClient, SessionSigner

    now = SystemClock().now()
    definition = mission_pb2.MissionDefinition(
        title=args.title,
        objective=args.objective,
        definition_of_done=[
            mission_pb2.CompletionCriterion(criterion_id=f"dod-{i + 1}", description=d, evidence_method="review", required=True)
            for i, d in enumerate(args.done)
        ],
        deadline=to_timestamp(now + timedelta(hours=args.deadline_hours)),
        budget=common_pb2.ResourceVector(
            currency=args.currency, financial_micros=int(args.budget * 1_000_000), tokens=args.tokens,
            tool_calls=args.tool_calls, wall_clock_ms=int(args.deadline_hours * 3_600_000),
        ),
        risk_policy=mission_pb2.RiskPolicy(risk_class=mission_pb2.RISK_CLASS_LOW),
        owner_id=args.owner or args.actor,
    )
    group_id = args.group or ids.new_id("grp")
    async with MeshClient(_target(args)) as mesh:
        signer = await _signer(args, mesh)
        assert isinstance(signer, SessionSigner)
        body = mission_pb2.MissionCreate(definition=definition, coordinator_id=args.coordinator)
        result = await mesh.execute(signer.sign(signer.command(group_id, "mission_create", body)))
    print(f"mission created in group {group_id} (revision {result.group_revision}, {len(result.events)} events)")
    print(group_id)
    return 0


async def cmd_message_post(args: argparse.Namespace) -> int:
    from missionweave.client import MeshClient, SessionSigner

    async with MeshClient(_target(args)) as mesh:
        signer = await _signer(args, mesh)
        assert isinstance(signer, SessionSigner)
        state = await mesh.group_state(args.group)
        epoch = next((m.membership_epoch for m in state.memberships if m.member_id == args.actor and m.active), 0)
        body = conversation_pb2.MessagePost(
            conversation_id=args.conversation or state.mission.planning_conversation_id,
            content=conversation_pb2.MessageContent(text=args.text),
        )
        result = await mesh.execute(signer.sign(signer.command(args.group, "message_post", body, membership_epoch=epoch)))
    print(f"posted at sequence {result.group_revision}")
    return 0


async def cmd_events(args: argparse.Namespace) -> int:
    from missionweave.client import MeshClient

    async with MeshClient(_target(args)) as mesh:
        async for event in mesh.read_events(args.group, args.after, follow=args.follow):
            print(json.dumps({
                "seq": event.sequence, "type": event.type, "actor": event.actor_id,
                "at": event.recorded_at.ToJsonString(), "event_id": event.event_id,
            }), flush=True)
    return 0


async def cmd_state(args: argparse.Namespace) -> int:
    from missionweave.client import MeshClient

    async with MeshClient(_target(args)) as mesh:
        _print_message(await mesh.group_state(args.group))
    return 0


async def cmd_health(args: argparse.Namespace) -> int:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from missionweave.server import SERVICE_NAMES

    worst = 0
    async with grpc.aio.insecure_channel(_target(args)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in SERVICE_NAMES.values():
            try:
                resp = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=3)
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.aio.AioRpcError as err:
                status = err.code().name
            worst = worst or (0 if status == "SERVING" else 1)
            print(f"{name:40s} {status}")
    return worst


# ------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mwp", description="MissionWeave: run the mesh and talk to it.")
    p.add_argument("--target", help="server address (default $MWP_TARGET or 127.0.0.1:50051)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="start the mesh (all services, or --service NAME ...)")
    s.add_argument("--service", action="append", choices=SERVICES, help="run only this service (repeatable)")
    s.add_argument("--listen", help="listen address (default $MWP_LISTEN or 127.0.0.1:50051)")
    s.add_argument("--data-dir", help="data directory (default $MWP_DATA_DIR or ./.missionweave)")
    s.add_argument("--database-url", help="database URL (default SQLite in the data directory)")
    s.set_defaults(func=cmd_serve)

    k = sub.add_parser("keygen", help="create an Ed25519 key file (mode 0600)")
    k.add_argument("path")
    k.set_defaults(func=cmd_keygen)

    ident = sub.add_parser("identity", help="Organization identities").add_subparsers(dest="sub", required=True)
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

    def actor(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--as", dest="actor", required=True, help="your identity id")
        sp.add_argument("--key", required=True, help="your key file")

    sess = sub.add_parser("session", help="sessions").add_subparsers(dest="sub", required=True)
    o = sess.add_parser("open", help="open a new session (fences older ones)")
    actor(o)
    o.set_defaults(func=cmd_session_open)

    mis = sub.add_parser("mission", help="missions").add_subparsers(dest="sub", required=True)
    c = mis.add_parser("create", help="create a root Mission (you are the human owner)")
    actor(c)
    c.add_argument("--title", required=True)
    c.add_argument("--objective", required=True)
    c.add_argument("--done", action="append", required=True, help="a completion criterion (repeatable)")
    c.add_argument("--coordinator", required=True, help="the Coordinator agent's identity id")
    c.add_argument("--deadline-hours", type=float, default=72.0)
    c.add_argument("--budget", type=float, default=0.0, help="financial budget in --currency units")
    c.add_argument("--currency", default="EUR")
    c.add_argument("--tokens", type=int, default=0)
    c.add_argument("--tool-calls", type=int, default=0)
    c.add_argument("--owner", help="owner id when acting via the control plane")
    c.add_argument("--group", help="group id to use (default: a new one)")
    c.set_defaults(func=cmd_mission_create)

    msg = sub.add_parser("message", help="messages").add_subparsers(dest="sub", required=True)
    m = msg.add_parser("post", help="post a Message (never an assignment)")
    actor(m)
    m.add_argument("--group", required=True)
    m.add_argument("--conversation", help="default: the planning Conversation")
    m.add_argument("--text", required=True)
    m.set_defaults(func=cmd_message_post)

    e = sub.add_parser("events", help="print a Group's events as JSON lines")
    e.add_argument("--group", required=True)
    e.add_argument("--after", type=int, default=0)
    e.add_argument("--follow", action="store_true")
    e.set_defaults(func=cmd_events)

    st = sub.add_parser("state", help="print a Group's folded state")
    st.add_argument("--group", required=True)
    st.set_defaults(func=cmd_state)

    h = sub.add_parser("health", help="check every service's health")
    h.set_defaults(func=cmd_health)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int | Awaitable[int]] = args.func
    try:
        result = func(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result)  # type: ignore[arg-type]
    except grpc.aio.AioRpcError as err:
        rejection = rejection_from_rpc_error(err)
        if err.code() == grpc.StatusCode.UNAVAILABLE and rejection is None:
            print(f"mwp: cannot reach {_target(args)}: {err.details()}", file=sys.stderr)
            return 3
        reason = common_pb2.RejectionReason.Name(rejection.reason).removeprefix("REJECTION_REASON_") if rejection else err.code().name
        print(f"mwp: refused: {reason}: {err.details()}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as err:
        print(f"mwp: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
