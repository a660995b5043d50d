"""Shared fixtures: database backends (SQLite always, PostgreSQL when MWP_TEST_POSTGRES_URL is set),
a live mesh on a free port, and registered identities with open sessions."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import Message
from nacl.signing import SigningKey

from missionweave.kernel.clock import OffsetClock, to_timestamp
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.v1 import command_pb2, common_pb2
from missionweave_server.config import Settings
from missionweave_server.storage.db import make_engine

POSTGRES_URL = os.environ.get("MWP_TEST_POSTGRES_URL", "")

# The meshes the tests start as processes (`mwp serve`) serve no web console and no metrics unless a
# test asks: their default addresses (127.0.0.1:50080, 127.0.0.1:9464) are one per machine, and a
# mesh that cannot bind one stops. Tests that start from an environment without MWP_* variables keep
# these (``mesh_process_env``).
PER_MACHINE = {"MWP_CONSOLE_LISTEN": "", "MWP_METRICS_LISTEN": ""}
for _name, _none in PER_MACHINE.items():
    os.environ.setdefault(_name, _none)


def mesh_process_env() -> dict[str, str]:
    """This process's environment without its MWP_* settings, but for the per-machine addresses."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MWP_") or k in PER_MACHINE}


# Under mutmut (tools/mutation.py) every property test draws the same examples, so a mutant is
# killed or not by the tests alone, and a run can be repeated (docs/mutation.md).
if os.environ.get("MUTANT_UNDER_TEST") is not None:
    from hypothesis import settings as hypothesis_settings

    hypothesis_settings.register_profile("mutation", derandomize=True, database=None, deadline=None)
    hypothesis_settings.load_profile("mutation")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "req(*ids): spec requirement IDs the test proves")
    config.addinivalue_line(
        "markers",
        "both_topologies: the `world` tests of this module also run on the split topology (PostgreSQL)",
    )
    config.addinivalue_line(
        "markers",
        "topologies(*names): the `world` topologies of this test (single, split, split-replicated, split-sharded:"
        " two Authority shards behind the front door)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`world` tests run in one process; those marked both_topologies also on the split topology,
    where every service is its own mesh reached over gRPC, on PostgreSQL (as CI runs it)."""
    if "topology" in metafunc.fixturenames:
        chosen = metafunc.definition.get_closest_marker("topologies")
        split = metafunc.definition.get_closest_marker("both_topologies") is not None
        names = list(chosen.args) if chosen is not None else ["single", "split"] if split else ["single"]
        metafunc.parametrize("topology", names, indirect=True)


@pytest.fixture(scope="session", autouse=True)
def no_saved_contexts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every `mwp` the tests run (in-process or as a subprocess) sees an empty context directory:
    a context the user selected on this machine must not redirect them (tests/test_cli_context.py
    points MWP_CONTEXT_DIR at a directory of its own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MWP_CONTEXT_DIR", str(tmp_path_factory.mktemp("mwp-contexts")))
        patch.delenv("MWP_CONTEXT", raising=False)
        yield


@pytest.fixture(autouse=True)
def private_agent_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each test's agents keep their state (sessions, cursors, unsent outputs) in a directory of
    that test's: the user's state location (missionweave/sdk/files.py, user_state_dir) would carry a
    cursor from one test's mesh into the next."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
        patch.delenv("MWP_STATE_DIR", raising=False)
        yield


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def pytest_report_header(config: pytest.Config) -> str:
    if POSTGRES_URL:
        return "PostgreSQL variant: ON (MWP_TEST_POSTGRES_URL is set)"
    return "PostgreSQL variant: SKIPPED (set MWP_TEST_POSTGRES_URL; .ci/run does)"


async def reset_database(url: str) -> None:
    """PostgreSQL tests share one database: start each from empty tables (every service's)."""
    from missionweave_server.mesh.schemas import LINES
    from missionweave_server.storage.schema_versions import drop_line

    engine = make_engine(url)
    async with engine.begin() as conn:
        for line in LINES.values():
            await conn.run_sync(drop_line, line)
    await engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "postgres":
        if not POSTGRES_URL:
            pytest.skip("PostgreSQL variant needs MWP_TEST_POSTGRES_URL (set by .ci/run)")
        await reset_database(POSTGRES_URL)
        yield POSTGRES_URL
    else:
        yield f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}"


@dataclass
class World:
    """A running mesh with an owner (human), a Coordinator and a Worker, each with a session."""

    mesh: object
    client: MeshClient
    target: str
    admin: SessionSigner
    owner: SessionSigner
    coordinator: SessionSigner
    worker: SessionSigner
    keys: dict[str, SigningKey]
    settings: Settings
    clock: OffsetClock

    def command(
        self, signer: SessionSigner, group_id: str, kind: str, body: Message, **kw: Any
    ) -> command_pb2.Command:
        """A command issued at the server's (possibly advanced) clock."""
        command = signer.command(group_id, kind, body, **kw)
        command.issued_at.CopyFrom(to_timestamp(self.clock.now()))
        return command

    def signed(
        self, signer: SessionSigner, group_id: str, kind: str, body: Message, **kw: Any
    ) -> common_pb2.SignedEnvelope:
        """A signed command issued at the server's (possibly advanced) clock."""
        return signer.sign(self.command(signer, group_id, kind, body, **kw))

    async def run(
        self, signer: SessionSigner, group_id: str, kind: str, body: Message, **kw: Any
    ) -> command_pb2.CommandResult:
        return await self.client.execute(self.signed(signer, group_id, kind, body, **kw))

    async def deliverable(
        self,
        signer: SessionSigner,
        group_id: str,
        work_item_id: str = "",
        data: bytes = b"the report\n",
        *,
        lease_id: str = "",
        ownership_epoch: int = 0,
        media_type: str = "text/plain",
        mission_id: str = "",
    ) -> common_pb2.ArtifactRef:
        """``data`` uploaded with a manifest ``signer`` signed for the Group's Mission and WorkItem:
        what a submission or Evidence may name (D161)."""
        from missionweave.sdk.artifacts import Origin, card_version, put_artifact

        mission_id = mission_id or (await self.client.group_state(group_id)).mission.mission_id
        card = await card_version(self.client, signer.identity_id)
        origin = Origin(group_id, mission_id, work_item_id, lease_id, ownership_epoch, card)
        return await put_artifact(self.client.artifacts, signer, data, media_type=media_type, origin=origin)

    async def epoch_of(self, group_id: str, member_id: str) -> int:
        """The member's current Membership epoch in the Group."""
        state = await self.client.group_state(group_id)
        return next(m.membership_epoch for m in state.memberships if m.member_id == member_id and m.active)


async def register(client: MeshClient, admin_key: SigningKey, identity_id: str, kind: int) -> SessionSigner:
    key = SigningKey.generate()
    await client.register_identity("admin", admin_key, identity_id, kind, bytes(key.verify_key))
    return await client.open_session(identity_id, key)


@pytest.fixture
def world_settings() -> dict[str, Any]:
    """More Settings fields for the `world` mesh: a module overrides this fixture to ask for, say,
    a web console (tests/test_console_relay.py)."""
    return {}


@pytest.fixture
async def world(
    db_url: str, tmp_path: Path, topology: str, world_settings: dict[str, Any]
) -> AsyncIterator[World]:
    from missionweave_server.mesh.server import start
    from tests.split_mesh import start_split

    if topology.startswith("split") and not db_url.startswith("postgresql"):
        pytest.skip("the split topology runs on PostgreSQL (MWP_TEST_POSTGRES_URL, set by .ci/run)")
    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=db_url,
        grace_seconds=1,
        **world_settings,
    )
    clock = OffsetClock()
    replicas = {"split-replicated": {"scheduling": 2}, "split-sharded": {"authority": 2}}.get(topology)
    mesh: Any = await (
        start_split(settings, clock, replicas) if topology.startswith("split") else start(settings, clock)
    )
    settings = mesh.settings
    target = f"127.0.0.1:{mesh.port}"
    client = MeshClient(target)
    admin_key = read_key(settings.admin_key_path)
    admin = await client.open_session("admin", admin_key)
    owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
    coordinator = await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
    worker = await register(client, admin_key, "worker-bot", common_pb2.IDENTITY_KIND_AGENT)
    try:
        yield World(
            mesh, client, target, admin, owner, coordinator, worker, {"admin": admin_key}, settings, clock
        )
    finally:
        await client.channel.close()
        await mesh.stop(grace=1)
        # A stopped mesh leaves nothing running: a task left behind would be cancelled after the
        # database is gone, which is how a shutdown hangs.
        leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        if leftover:  # cancelled RPC handlers may still be unwinding: give them a moment
            await asyncio.wait(leftover, timeout=5)
        stuck = [t for t in leftover if not t.done()]
        assert not stuck, f"tasks still running after Mesh.stop: {stuck}"


async def polled(holds: Callable[[], Awaitable[bool]], limit_s: float = 20.0, every_s: float = 0.05) -> None:
    """Poll a read (an RPC, a query) until ``holds`` says yes: for effects nobody signals, such as
    the cross-Group relay's appends."""
    async with asyncio.timeout(limit_s):
        while not await holds():  # noqa: ASYNC110 (nothing to wait on but the answer)
            await asyncio.sleep(every_s)
