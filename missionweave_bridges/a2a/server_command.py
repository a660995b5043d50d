"""`mwp bridge a2a-server`: Missions as A2A tasks (docs/bridge-a2a-server.md)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from missionweave.cli.common import client_tls, target
from missionweave_bridges import process_logs

if TYPE_CHECKING:
    from missionweave.kernel.transport import ClientTLS
    from missionweave_bridges.a2a.server_config import ServerConfig


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "a2a-server",
        help="serve Missions and WorkItems as A2A tasks (gRPC lf.a2a.v1 and JSON-RPC) for the identities of a config file",
        description=(
            "An A2A v1.0 endpoint beside the mesh: each bearer token in --config acts as one MissionWeave "
            "identity (its key file); messages propose work to a Group, tasks follow Missions and WorkItems "
            "with resumable, verified events. See docs/bridge-a2a-server.md."
        ),
    )
    p.add_argument(
        "--config", type=Path, help="the TOML configuration (mesh, listen addresses, [[identity]] entries)"
    )
    p.add_argument(
        "--new-token",
        action="store_true",
        help="print a fresh bearer token and the token_sha256 line to put in the config, then exit",
    )
    p.set_defaults(func=_run, runs_until_stopped=True)


def _run(args: argparse.Namespace) -> int:
    from missionweave_bridges.a2a.server_config import ConfigError, hash_token, load, new_token

    if args.new_token:
        token = new_token()
        print(f"token (give it to the A2A client; it is not stored): {token}")
        print(f'token_sha256 = "{hash_token(token)}"')
        return 0
    if args.config is None:
        print("mwp bridge a2a-server: --config FILE is required", file=sys.stderr)
        return 2
    try:
        config = load(args.config)
    except ConfigError as err:
        print(f"mwp bridge a2a-server: {err}", file=sys.stderr)
        return 2
    process_logs.configure(args)
    # The mesh and TLS towards it as every `mwp` command takes them, unless the config names them.
    config = dataclasses.replace(config, target=config.target or target(args))
    return asyncio.run(_serve(config, client_tls(args)))


async def _serve(config: ServerConfig, mesh_tls: ClientTLS | None) -> int:
    from missionweave_bridges.a2a.server_app import start

    try:
        endpoint = await start(config, mesh_tls)
    except grpc.aio.AioRpcError as err:
        if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise
        print(
            f"mwp bridge a2a-server: cannot reach the mesh at {config.target}: {err.details()}",
            file=sys.stderr,
        )
        return 3
    except OSError as err:  # a listen address in use or not ours to bind
        print(f"mwp bridge a2a-server: cannot listen: {err}", file=sys.stderr)
        return 1
    print(
        f"a2a-server: gRPC on port {endpoint.grpc_port}"
        + (f", JSON-RPC and the Agent Card on port {endpoint.http_port}" if endpoint.http_port else ""),
        flush=True,
    )
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    await endpoint.stop()
    return 0
