"""The bridges' ``mwp`` commands, added to the client CLI through the ``missionweave.cli`` entry
point (missionweave/cli/extensions.py)."""

from __future__ import annotations

import argparse

from missionweave_bridges.a2a import server_command, worker_command
from missionweave_bridges.mcp_server import command as mcp_command


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    bridge = sub.add_parser("bridge", help="bridge agents that speak another protocol (A2A) into Missions")
    protocols = bridge.add_subparsers(dest="bridge_command", required=True, metavar="PROTOCOL")
    worker_command.register(protocols)
    server_command.register(protocols)
    mcp_command.register(sub)
