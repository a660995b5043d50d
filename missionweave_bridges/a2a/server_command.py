"""`mwp bridge a2a-server`: Missions as A2A tasks (docs/bridge-a2a-server.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path


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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(_serve(config))


async def _serve(config: object) -> int:
    from missionweave_bridges.a2a.server_app import start
    from missionweave_bridges.a2a.server_config import ServerConfig

    assert isinstance(config, ServerConfig)
    endpoint = await start(config)
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
