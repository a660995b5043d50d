"""A ``World`` (tests/conftest.py) on a mesh started in this process, for the benchmarks that drive
one outside pytest (bench/bridges.py, bench/sdks.py): SQLite, local blobs, no console, an owner, a
Coordinator and a Worker registered with sessions of their own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from missionweave.kernel.clock import OffsetClock
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient
from missionweave.v1 import common_pb2
from missionweave_server.config import Settings
from missionweave_server.mesh.server import start
from tests.conftest import World, register


async def world_at(data: Path, **settings: Any) -> World:
    """A mesh on ``data`` (its store and data directory), ``settings`` on top of the defaults."""
    mesh: Any = await start(
        Settings(
            listen="127.0.0.1:0",
            data_dir=data / "data",
            database_url=f"sqlite+aiosqlite:///{data / 'mw.db'}",
            grace_seconds=1,
            console_listen="",
            **settings,
        ),
        clock := OffsetClock(),
    )
    target = f"127.0.0.1:{mesh.port}"
    client = MeshClient(target)
    admin_key = read_key(mesh.settings.admin_key_path)
    admin = await client.open_session("admin", admin_key)
    owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
    coordinator = await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
    worker = await register(client, admin_key, "worker-bot", common_pb2.IDENTITY_KIND_AGENT)
    return World(
        mesh, client, target, admin, owner, coordinator, worker, {"admin": admin_key}, mesh.settings, clock
    )
