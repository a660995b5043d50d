"""``mwp mcp``: an MCP server through which an LLM host acts as a Worker or a Coordinator under its
own identity (docs/mcp.md). stdio by default; ``--http HOST:PORT`` serves streamable HTTP (bearer
token required, transport.py)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from missionweave.cli.common import UsageError, add_actor_flags, connect, load_signer
from missionweave.sdk.files import file_name, private_dir, user_state_dir
from missionweave_bridges.mcp_server.desk import Desk
from missionweave_bridges.mcp_server.refusals import Refused
from missionweave_bridges.mcp_server.server import Assembly
from missionweave_bridges.mcp_server.transport import MIN_TOKEN_CHARS, serve_http, serve_stdio

log = logging.getLogger(__name__)
DEFAULT_IDLE_RELEASE_S = 900.0


def http_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT or :PORT, e.g. 127.0.0.1:8765")
    return host.strip("[]") or "127.0.0.1", int(port)


def token_of(args: argparse.Namespace) -> str:
    if args.token_file:
        token = Path(args.token_file).read_text().strip()
    else:
        token = os.environ.get("MWP_MCP_TOKEN", "").strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise UsageError(
            f"--http needs a bearer token of at least {MIN_TOKEN_CHARS} characters: --token-file F or $MWP_MCP_TOKEN"
        )
    return token


def cmd_mcp(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    """Checks the flags and the token file before connecting, then returns the serving coroutine."""
    token = token_of(args) if args.http else ""
    files = [Path(f).expanduser().resolve() for f in args.files or []]
    return serve(args, token, files)


async def serve(args: argparse.Namespace, token: str, files: list[Path]) -> int:
    # Logs go to stderr: over stdio, stdout carries the protocol and nothing else.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr)
    async with connect(args) as mesh:
        signer = await load_signer(args, mesh)
        mesh.read_as(signer)
        state_dir = private_dir(
            Path(args.state_dir) if args.state_dir else user_state_dir() / "mcp" / file_name(args.actor)
        )
        desk = Desk(mesh, signer, state_dir, mesh.proofs.audience)
        assembly = Assembly(desk, files=files, idle_release_s=args.idle_release)
        try:
            await assembly.start()
        except Refused as refused:  # the mesh is down: serve anyway, tools report it per call
            log.warning("mwp mcp: leases not adopted at start: %s", refused)
        try:
            if args.http:
                host, port = args.http
                await serve_http(assembly.server, host, port, token)
            else:
                await serve_stdio(assembly.server)
        finally:
            await assembly.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "mcp",
        help="an MCP server: an LLM host acts as a Worker or Coordinator under this identity (docs/mcp.md)",
        description="Serve the Model Context Protocol (spec 2026-07-28) on stdio, or streamable HTTP with --http. "
        "Every tool is a signed command or an authorized read as --as.",
    )
    add_actor_flags(p)
    p.add_argument(
        "--http",
        type=http_address,
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (HOST default 127.0.0.1); "
        "needs a bearer token (--token-file or $MWP_MCP_TOKEN)",
    )
    p.add_argument("--token-file", help="the bearer token HTTP callers must present (default $MWP_MCP_TOKEN)")
    p.add_argument(
        "--state-dir",
        help="where tasks and stored outputs are kept (default <state dir>/mcp/<identity>, $MWP_STATE_DIR or XDG)",
    )
    p.add_argument(
        "--files",
        action="append",
        metavar="DIR",
        help="store_output may read files under DIR (repeatable; default: none, content comes inline)",
    )
    p.add_argument(
        "--idle-release",
        type=float,
        default=DEFAULT_IDLE_RELEASE_S,
        metavar="SECONDS",
        help="stop renewing leases when no request came from a host for this long: it is gone (default 900)",
    )
    p.add_argument("--verbose", action="store_true", help="log renewals and tasks on stderr")
    p.set_defaults(func=cmd_mcp, runs_until_stopped=True)
