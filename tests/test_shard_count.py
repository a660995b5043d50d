"""The number of Authority shards changes under load (issue 45): a shard added to a running split mesh
is handed the Groups its placement now puts on it, and a shard taken away hands them back, while
commands go on: none lost, none answered twice, no gap, and no window where two shards accept one
Group's commands (the writer epoch fences every move; the event log shows a fork as a gap or a
repeated sequence). Every move is an owner's hand-over: the lease is far longer than the test, so
no Group can be taken over by a lapse instead."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from missionweave.kernel.clock import SystemClock
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient
from missionweave.v1 import common_pb2
from missionweave_server.edge.shards import rendezvous
from tests import builders
from tests.conftest import mesh_process_env, polled, register
from tests.shard_load import Load, assert_logs_match
from tests.split_mesh import free_port, launch_split, wait_serving
from tests.test_shards import owners

GROUPS = [f"grp_count_{i}" for i in range(12)]
LEASE_S = 120


def shard_environment(pid: int) -> dict[str, str]:
    """A running shard's environment, as an operator copies a shard's spec for the next ordinal."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


async def start_shard(like_pid: int, instance: str, address: str) -> asyncio.subprocess.Process:
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
    if not db_url.startswith("postgresql"):
        pytest.skip("shards share PostgreSQL (D60)")
    env = {
        **mesh_process_env(),
        "MWP_VERIFY_WORKERS": "0",
        "MWP_OWNERSHIP_LEASE_S": str(LEASE_S),
        "MWP_REBALANCE_INTERVAL_S": "1",
    }
    launcher, target = await launch_split(tmp_path / "data", db_url, 2, env)
    assert launcher.stderr is not None
    added: asyncio.subprocess.Process | None = None
    try:
        addresses: dict[str, str] = {}
        shards = await wait_serving(launcher, addresses=addresses)
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
        two = {"authority-0": addresses["authority-0"], "authority-1": addresses["authority-1"]}
        by_address = {a: name for name, a in two.items()}
        placed_on_two = {g: by_address[rendezvous(g, list(two.values()))[0]] for g in GROUPS}

        async def placed(expected: dict[str, str]) -> bool:
            return await owners(db_url) == expected

        await polled(lambda: placed(placed_on_two), 60, 0.2)

        load = Load(client, owner, conversations)
        await polled(lambda: load.reached(2 * len(GROUPS)), 60, 0.1)

        # A third shard joins: the front door's shard list still names two (its Groups are reached
        # through the owners' NOT_OWNER until the list is updated), the shards' heartbeats name three.
        new_address = f"127.0.0.1:{free_port()}"
        added = await start_shard(shards["authority-0"], "authority-2", new_address)
        three = {**by_address, new_address: "authority-2"}
        placed_on_three = {g: three[rendezvous(g, list(three))[0]] for g in GROUPS}
        moving = [g for g in GROUPS if placed_on_three[g] == "authority-2"]
        assert moving, placed_on_three  # 12 Groups over 3 shards: some hash to the new one
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

        await assert_logs_match(client, load)
        await client.channel.close()
        drain.cancel()
    finally:
        if added is not None and added.returncode is None:
            added.kill()
            await added.wait()
        if launcher.returncode is None:
            launcher.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(launcher.wait(), 60)
