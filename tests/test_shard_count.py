"""The number of Authority shards changes under load (issue 45): a shard added to a running split mesh
is handed the Groups its placement now puts on it, and a shard taken away hands them back, while
commands go on: none lost, none answered twice, no gap, and no window where two shards accept one
Group's commands (the writer epoch fences every move; the event log shows a fork as a gap or a
repeated sequence). Every move is an owner's hand-over: the lease is far longer than the test, so
no Group can be taken over by a lapse instead."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from missionweave_server.edge.shards import rendezvous
from tests.conftest import polled
from tests.shard_mesh import Load, assert_logs_match, owners, shard_mesh, start_shard
from tests.split_mesh import free_port

GROUPS = [f"grp_count_{i}" for i in range(12)]
LEASE_S = 120


async def shards_report(db_url: str) -> list[dict[str, Any]]:
    """``mwp db shards --json``: each instance's announcement and Groups."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "missionweave.cli", "db", "shards", "--database-url", db_url, "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return list(json.loads(done.stdout)["shards"])


@pytest.mark.timeout(240)
async def test_a_shard_added_and_then_removed_under_load_moves_groups_without_loss_or_duplicate(
    db_url: str, tmp_path: Path
) -> None:
    added: asyncio.subprocess.Process | None = None
    async with shard_mesh(db_url, tmp_path / "data", 2, GROUPS, lease_s=LEASE_S, rounds_s=1) as mesh:
        try:
            two = {mesh.addresses[name]: name for name in ("authority-0", "authority-1")}
            placed_on_two = {g: two[rendezvous(g, list(two))[0]] for g in GROUPS}

            async def placed(expected: dict[str, str]) -> bool:
                return await owners(db_url) == expected

            await polled(lambda: placed(placed_on_two), 60, 0.2)
            load = Load(mesh)
            await polled(lambda: load.reached(2 * len(GROUPS)), 60, 0.1)

            # A third shard joins: the front door's shard list still names two (its Groups are reached
            # through the owners' NOT_OWNER until the list is updated), the heartbeats name three.
            new_address = f"127.0.0.1:{free_port()}"
            added = await start_shard(mesh.pids["authority-0"], "authority-2", new_address)
            three = {**two, new_address: "authority-2"}
            placed_on_three = {g: three[rendezvous(g, list(three))[0]] for g in GROUPS}
            assert "authority-2" in placed_on_three.values()  # 12 Groups over 3 shards: some move
            await polled(lambda: placed(placed_on_three), 90, 0.2)
            report = await shards_report(db_url)  # what the operator's procedure reads
            assert {r["instance_id"]: r["groups"] for r in report} == dict(Counter(placed_on_three.values()))
            assert all(r["announced_s_ago"] is not None and r["announced_s_ago"] < 30 for r in report), report
            before = load.count()
            await polled(lambda: load.reached(before + 2 * len(GROUPS)), 60, 0.1)

            # And leaves again (SIGTERM: a scale-down): its Groups go back to the two that stay.
            added.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(added.wait(), 60) == 0
            assert [g for g, o in (await owners(db_url)).items() if o == "authority-2"] == []
            await polled(lambda: placed(placed_on_two), 60, 0.2)
            gone = next(r for r in await shards_report(db_url) if r["instance_id"] == "authority-2")
            assert gone["announced_s_ago"] is None and gone["groups"] == 0, gone  # retired, owning none
            before = load.count()
            await polled(lambda: load.reached(before + 2 * len(GROUPS)), 60, 0.1)
            await load.stop()
            await assert_logs_match(load)
        finally:
            if added is not None and added.returncode is None:
                added.kill()
                await added.wait()
