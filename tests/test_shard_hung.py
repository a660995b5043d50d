"""A hung Authority shard (SIGSTOP: alive to TCP, answering nothing) holds its Groups' commands no
longer than the router's answer deadline plus the ownership lease (D289): the router asks the next
shard, which takes the Groups over once the lease has lapsed, and the stopped shard is not handed
them back while it stays silent (D290). Once it runs again it gets them back (D275); nothing
acknowledged is lost or doubled through either move."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from missionweave_server.edge.shards import ANSWER_S
from tests.conftest import polled
from tests.shard_mesh import Load, assert_logs_match, owners, shard_mesh

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
    stopped_pid = 0
    async with shard_mesh(db_url, tmp_path / "data", 3, GROUPS, lease_s=LEASE_S, rounds_s=ROUND_S) as mesh:
        try:
            placed = await owners(db_url)
            victim = max(set(placed.values()), key=list(placed.values()).count)
            victims = [g for g in GROUPS if placed[g] == victim]

            load = Load(mesh)
            await polled(lambda: load.reached(2 * len(GROUPS)), 60, 0.1)
            stopped_pid = mesh.pids[victim]
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
            await assert_logs_match(load)
            assert moved_after < PAUSE_S - 5, f"{moved_after:.1f} s (answer deadline {ANSWER_S} s)"
        finally:
            if stopped_pid:
                os.kill(stopped_pid, signal.SIGCONT)
