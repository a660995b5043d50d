"""A shard stopped gracefully (SIGTERM: a rolling upgrade, a pod moved) hands its Groups to the other
shards before it exits (D288), so they take commands again within seconds rather than after the
ownership lease; once the launcher has started it again, they come back to it (D275)."""

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
from tests import builders
from tests.conftest import mesh_process_env, polled, register
from tests.split_mesh import launch_split, wait_serving
from tests.test_shards import owners, post_until_acknowledged

GROUPS = [f"grp_drain_{i}" for i in range(9)]
LEASE_S = 60  # far longer than a drain: a Group waiting for its lease would fail the bound below


@pytest.mark.timeout(170)
async def test_a_shard_stopped_with_sigterm_hands_its_groups_over_at_once_and_gets_them_back(
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
    launcher, target = await launch_split(tmp_path / "data", db_url, 3, env)
    assert launcher.stderr is not None
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

        def post(group: str, text: str) -> common_pb2.SignedEnvelope:
            body = builders.message(conversations[group], text)
            return owner.sign(owner.command(group, "message_post", body, membership_epoch=1))

        stopped = time.monotonic()
        os.kill(shards[victim], signal.SIGTERM)

        async def exited() -> bool:
            try:
                os.kill(shards[victim], 0)
            except ProcessLookupError:
                return True
            return False

        # Handed over before it exited (the launcher then starts it again; a new process takes a
        # Group only when a command reaches it, and none is sent before this check).
        await polled(exited, 30, 0.02)
        after_stop = await owners(db_url)
        assert [g for g in victims if after_stop[g] == victim] == [], after_stop

        landed = await asyncio.gather(
            *(post_until_acknowledged(client, owner, post(g, "after")) for g in victims)
        )
        window = time.monotonic() - stopped
        assert window < LEASE_S / 3, (window, victims)  # handed over, not waited out
        for group, sequence in zip(victims, landed, strict=True):
            events = [e async for e in client.read_events(group)]
            assert [e.sequence for e in events] == list(range(1, len(events) + 1))
            assert events[-1].sequence == sequence and events[-1].type == "message.posted"

        async def back_where_placed() -> bool:
            return await owners(db_url) == placed

        await polled(back_where_placed, 60, 0.2)  # the launcher started it again; its Groups return
        for group in victims:
            await post_until_acknowledged(client, owner, post(group, "back"))
        await client.channel.close()
        drain.cancel()
    finally:
        if launcher.returncode is None:
            launcher.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(launcher.wait(), 60)
