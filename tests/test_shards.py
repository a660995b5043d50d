"""Three Authority shards on PostgreSQL, Groups spread over them, one shard killed with SIGKILL under
load (issue 12, item 6): its Groups move on, no acknowledged command is lost, no Group shows a gap
or a duplicate sequence."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import grpc
import pytest
from sqlalchemy import text

from missionweave.clock import SystemClock
from missionweave.db import make_engine
from missionweave.rpc.status import rejection_from_rpc_error
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.signing import read_key
from missionweave.v1 import common_pb2
from tests import builders
from tests.conftest import register
from tests.split_mesh import free_port, wait_serving

GROUPS = [f"grp_shard_{i}" for i in range(9)]
LEASE_S = 3


async def owners(db_url: str) -> dict[str, str]:
    engine = make_engine(db_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(text("SELECT group_id, owner_instance FROM groups"))
            return {r[0]: r[1] for r in rows}
    finally:
        await engine.dispose()


RETRIES: list[str] = []


async def post_until_acknowledged(client: MeshClient, signer: SessionSigner, envelope: common_pb2.SignedEnvelope) -> int:
    """Retries one command (same id) until the mesh acknowledges it; the sequence it landed at."""
    while True:
        try:
            result = await client.execute(envelope)
            return int(result.group_revision)
        except grpc.aio.AioRpcError as err:
            rejection = rejection_from_rpc_error(err)
            retryable = rejection is None or common_pb2.RejectionReason.Name(rejection.reason) in (
                "REJECTION_REASON_NOT_OWNER", "REJECTION_REASON_PEER_UNAVAILABLE", "REJECTION_REASON_OVERLOADED",
                "REJECTION_REASON_WRITER_FENCED",
            )
            assert retryable, rejection
            RETRIES.append(err.code().name)
            await asyncio.sleep(0.2)


@pytest.mark.timeout(170)
async def test_a_killed_shard_loses_no_acknowledged_command_and_leaves_no_gap(db_url: str, tmp_path: Path) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("shards share PostgreSQL (D60)")
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MWP_")},
           "MWP_VERIFY_WORKERS": "0", "MWP_OWNERSHIP_LEASE_S": str(LEASE_S)}
    launcher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "missionweave.cli", "serve", "--topology", "split", "--shards", "3",
        "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "data"), "--database-url", db_url,
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL, env=env,
    )
    assert launcher.stderr is not None
    try:
        shards = await wait_serving(launcher)
        drain = asyncio.create_task(launcher.stderr.read())  # keep the pipe from filling
        client = MeshClient(f"127.0.0.1:{port}")
        admin_key = read_key(tmp_path / "data" / "keys" / "admin.key")
        owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
        await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
        conversations = {}
        for group in GROUPS:
            body = builders.mission_create("alice", "coord-bot", SystemClock().now())
            await client.execute(owner.sign(owner.command(group, "mission_create", body)))
            conversations[group] = (await client.group_state(group)).mission.planning_conversation_id
        placed = await owners(db_url)
        assert len(set(placed.values())) >= 2, placed  # the Groups are spread over the shards
        victim = max(set(placed.values()), key=list(placed.values()).count)

        acknowledged: dict[str, list[tuple[str, int]]] = {g: [] for g in GROUPS}

        async def load(group: str) -> None:
            for i in range(30):
                text_ = f"{group} message {i}"
                envelope = owner.sign(owner.command(group, "message_post", builders.message(conversations[group], text_), membership_epoch=1))
                acknowledged[group].append((text_, await post_until_acknowledged(client, owner, envelope)))
                if sum(len(a) for a in acknowledged.values()) >= 60:
                    a_fifth_in.set()

        a_fifth_in = asyncio.Event()

        async def kill_soon() -> None:
            await a_fifth_in.wait()  # under load: a fifth of the commands acknowledged
            os.kill(shards[victim], signal.SIGKILL)

        await asyncio.gather(kill_soon(), *(load(g) for g in GROUPS))
        moved = await owners(db_url)  # the victim's Groups: taken over, or back with its restarted process
        for group in GROUPS:
            events = [e async for e in client.read_events(group)]
            sequences = [e.sequence for e in events]
            assert sequences == list(range(1, len(sequences) + 1)), (group, sequences)  # no gap, no duplicate
            texts = [e.message_posted.content.text for e in events if e.type == "message.posted"]
            assert texts == [t for t, _ in acknowledged[group]]  # every acknowledged command, once, in order
            landed = [e.sequence for e in events if e.type == "message.posted"]
            assert landed == [s for _, s in acknowledged[group]]  # each where its acknowledgement said
        assert RETRIES, "the shard died while nobody was writing: the test proved nothing"
        assert set(moved) == set(GROUPS)
        await client.channel.close()
        drain.cancel()
    finally:
        if launcher.returncode is None:
            launcher.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(launcher.wait(), 60)
