"""A hung Authority shard (SIGSTOP: alive to TCP, answering nothing) holds its Groups' commands no
longer than the router's answer deadline plus the ownership lease (D289): the router asks the next
shard, which takes the Groups over once the lease has lapsed, and the stopped shard is not handed
them back while it stays silent. Once it runs again it gets them back (D275); nothing acknowledged is
lost or doubled through either move."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from missionweave.kernel.clock import SystemClock
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient
from missionweave.v1 import common_pb2
from missionweave_server.edge.shards import ANSWER_S
from tests import builders
from tests.conftest import mesh_process_env, polled, register
from tests.shard_load import Load, assert_logs_match
from tests.split_mesh import launch_split, wait_serving
from tests.test_shards import owners

GROUPS = [f"grp_hung_{i}" for i in range(9)]
# The lease bounds the takeover, well inside the rounds' own window (3 rounds of 3 s): a stopped
# shard that still counted as alive for that window would be handed its Groups back at once.
LEASE_S = 2.0
ROUND_S = 3.0
PAUSE_S = 30.0


@pytest.mark.timeout(240)
async def test_a_stopped_shards_groups_move_on_while_it_is_stopped_and_come_back_after(
    db_url: str, tmp_path: Path
) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("shards share PostgreSQL (D60)")
    env = {
        **mesh_process_env(),
        "MWP_VERIFY_WORKERS": "0",
        "MWP_OWNERSHIP_LEASE_S": str(LEASE_S),
        "MWP_REBALANCE_INTERVAL_S": str(ROUND_S),
    }
    launcher, target = await launch_split(tmp_path / "data", db_url, 3, env)
    assert launcher.stderr is not None
    stopped_pid = 0
    try:
        shards = await wait_serving(launcher)
        drain = asyncio.create_task(launcher.stderr.read())  # keep the pipe from filling
        client = MeshClient(target)
        admin_key = read_key(tmp_path / "data" / "keys" / "admin.key")
        owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
        await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
        conversations = {}
        for group in GROUPS:
            body = builders.mission_create("alice", "coord-bot", SystemClock().now())
            await client.execute(owner.sign(owner.command(group, "mission_create", body)))
            conversations[group] = (await client.group_state(group)).mission.planning_conversation_id
        placed = await owners(db_url)
        victim = max(set(placed.values()), key=list(placed.values()).count)
        victims = [g for g in GROUPS if placed[g] == victim]

        load = Load(client, owner, conversations)
        await polled(lambda: load.reached(2 * len(GROUPS)), 60, 0.1)
        stopped_pid = shards[victim]
        os.kill(stopped_pid, signal.SIGSTOP)
        stopped = time.monotonic()
        before = {g: len(load.acknowledged[g]) for g in victims}

        async def all_moved_on() -> bool:
            return all(len(load.acknowledged[g]) > before[g] + 2 for g in victims)

        # Commands for its Groups are acknowledged again while it is still stopped.
        await polled(all_moved_on, PAUSE_S - 5, 0.1)
        moved_after = time.monotonic() - stopped
        # And while it stays silent, none of them is handed back to it (sampled to the pause's end).
        while time.monotonic() - stopped < PAUSE_S:
            now_placed = await owners(db_url)
            assert [g for g in victims if now_placed[g] == victim] == [], (now_placed, moved_after)
            await asyncio.sleep(0.3)
        os.kill(stopped_pid, signal.SIGCONT)
        stopped_pid = 0

        async def back_where_placed() -> bool:
            return await owners(db_url) == placed

        await polled(back_where_placed, 60, 0.2)
        count = load.count()
        await polled(lambda: load.reached(count + 2 * len(GROUPS)), 60, 0.1)
        await load.stop()
        await assert_logs_match(client, load)
        assert moved_after < PAUSE_S - 5, f"{moved_after:.1f} s (answer deadline {ANSWER_S} s)"
        await client.channel.close()
        drain.cancel()
    finally:
        if stopped_pid:
            os.kill(stopped_pid, signal.SIGCONT)
        if launcher.returncode is None:
            launcher.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(launcher.wait(), 60)
