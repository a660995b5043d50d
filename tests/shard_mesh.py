"""What the shard tests share: a split mesh of Authority shards on PostgreSQL with Missions in its
Groups (``shard_mesh``), a shard started beside it as an operator adds one (``start_shard``), load
that sends every Group one message after another until acknowledged (``Load``), and the check that
every Group's log holds exactly what was acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from nacl.signing import SigningKey
from sqlalchemy import text

from missionweave.kernel.clock import SystemClock
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.v1 import common_pb2
from missionweave_server.storage.db import make_engine
from tests import builders
from tests.conftest import mesh_process_env, register
from tests.split_mesh import launch_split, wait_serving


async def owners(db_url: str) -> dict[str, str]:
    """Each Group's owning instance, from the store."""
    engine = make_engine(db_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(text("SELECT group_id, owner_instance FROM groups"))
            return {r[0]: r[1] for r in rows}
    finally:
        await engine.dispose()


RETRIES: list[str] = []  # the retryable refusals post_until_acknowledged met, in every test


async def post_until_acknowledged(
    client: MeshClient, signer: SessionSigner, envelope: common_pb2.SignedEnvelope
) -> int:
    """Retries one command (same id) until the mesh acknowledges it; the sequence it landed at."""
    while True:
        try:
            result = await client.execute(envelope)
            return int(result.group_revision)
        except grpc.aio.AioRpcError as err:
            rejection = rejection_from_rpc_error(err)
            # Never NOT_OWNER: placement is the mesh's own, and a shard's address is not the caller's.
            retryable = rejection is None or common_pb2.RejectionReason.Name(rejection.reason) in (
                "REJECTION_REASON_PEER_UNAVAILABLE",
                "REJECTION_REASON_OVERLOADED",
                "REJECTION_REASON_WRITER_FENCED",
            )
            assert retryable, rejection
            RETRIES.append(err.code().name)
            await asyncio.sleep(0.2)


@dataclass
class ShardMesh:
    """A running ``mwp serve --topology split``: each process's pid and address, a client, the
    administrator's key, the Groups' owner (alice, with coord-bot as Coordinator) and each Group's
    planning Conversation."""

    target: str
    pids: dict[str, int]
    addresses: dict[str, str]
    client: MeshClient
    admin_key: SigningKey
    owner: SessionSigner
    conversations: dict[str, str]

    def post(self, group: str, text: str) -> common_pb2.SignedEnvelope:
        body = builders.message(self.conversations[group], text)
        return self.owner.sign(self.owner.command(group, "message_post", body, membership_epoch=1))


@asynccontextmanager
async def shard_mesh(
    db_url: str, data_dir: Path, shards: int, groups: list[str], *, lease_s: float, rounds_s: float
) -> AsyncIterator[ShardMesh]:
    """The split topology with ``shards`` Authority shards (ownership lease ``lease_s``, hand-back
    rounds every ``rounds_s``) and a Mission in each of ``groups``; stopped with SIGTERM at the end."""
    if not db_url.startswith("postgresql"):
        pytest.skip("shards share PostgreSQL (D60)")
    env = {
        **mesh_process_env(),
        "MWP_VERIFY_WORKERS": "0",
        "MWP_OWNERSHIP_LEASE_S": str(lease_s),
        "MWP_REBALANCE_INTERVAL_S": str(rounds_s),
    }
    launcher, target = await launch_split(data_dir, db_url, shards, env)
    assert launcher.stderr is not None
    try:
        addresses: dict[str, str] = {}
        pids = await wait_serving(launcher, addresses=addresses)
        drain = asyncio.create_task(launcher.stderr.read())  # keep the pipe from filling
        client = MeshClient(target)
        admin_key = read_key(data_dir / "keys" / "admin.key")
        owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
        await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
        conversations = {}
        for group in groups:
            body = builders.mission_create("alice", "coord-bot", SystemClock().now())
            await client.execute(owner.sign(owner.command(group, "mission_create", body)))
            conversations[group] = (await client.group_state(group)).mission.planning_conversation_id
        yield ShardMesh(target, pids, addresses, client, admin_key, owner, conversations)
        await client.channel.close()
        drain.cancel()
    finally:
        if launcher.returncode is None:
            launcher.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(launcher.wait(), 60)


def shard_environment(pid: int) -> dict[str, str]:
    """A running shard's environment, as an operator copies a shard's spec for the next ordinal."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


async def start_shard(like_pid: int, instance: str, address: str) -> asyncio.subprocess.Process:
    """Another shard beside a running one: its environment, with an instance id and address of its own."""
    env = {
        **shard_environment(like_pid),
        "MWP_INSTANCE_ID": instance,
        "MWP_ADVERTISE_ADDR": address,
        "MWP_LISTEN": address,
        "MWP_METRICS_LISTEN": "",
    }
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "missionweave.cli", "serve",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )  # fmt: skip


class Load:
    """Each Group gets one message after another, each sent until acknowledged (same command id)."""

    def __init__(self, mesh: ShardMesh) -> None:
        self.mesh = mesh
        self.acknowledged: dict[str, list[tuple[str, int]]] = {g: [] for g in mesh.conversations}
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._one(g)) for g in mesh.conversations]

    async def _one(self, group: str) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            text = f"{group} message {n}"
            sequence = await post_until_acknowledged(
                self.mesh.client, self.mesh.owner, self.mesh.post(group, text)
            )
            self.acknowledged[group].append((text, sequence))
            await asyncio.sleep(0.05)

    def count(self) -> int:
        return sum(len(v) for v in self.acknowledged.values())

    async def reached(self, n: int) -> bool:
        return self.count() >= n

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def assert_logs_match(load: Load) -> None:
    """No gap and no repeat in any Group's log (one writer at a time, whatever moved), and every
    acknowledged command in it once, at the sequence its acknowledgement gave."""
    for group, sent in load.acknowledged.items():
        events = [e async for e in load.mesh.client.read_events(group)]
        assert [e.sequence for e in events] == list(range(1, len(events) + 1)), group
        posted = [e.sequence for e in events if e.type == "message.posted"]
        assert posted == [sequence for _, sequence in sent], group
