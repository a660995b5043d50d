"""A shard stopped gracefully (SIGTERM: a rolling upgrade, a pod moved) hands its Groups to the other
shards before it exits (D288), so they take commands again within seconds rather than after the
ownership lease; once the launcher has started it again, they come back to it (D275)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import polled
from tests.shard_mesh import owners, post_until_acknowledged, shard_mesh

GROUPS = [f"grp_drain_{i}" for i in range(9)]
LEASE_S = 60  # far longer than a drain: a Group waiting for its lease would fail the bound below


@pytest.mark.timeout(170)
async def test_a_shard_stopped_with_sigterm_hands_its_groups_over_at_once_and_gets_them_back(
    db_url: str, tmp_path: Path
) -> None:
    async with shard_mesh(db_url, tmp_path / "data", 3, GROUPS, lease_s=LEASE_S, rounds_s=1) as mesh:
        placed = await owners(db_url)
        victim = max(set(placed.values()), key=list(placed.values()).count)
        victims = [g for g in GROUPS if placed[g] == victim]
        pid = mesh.pids[victim]
        stopped = time.monotonic()
        os.kill(pid, signal.SIGTERM)

        async def exited() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False

        # Handed over before it exited (the launcher then starts it again; a new process takes a
        # Group only when a command reaches it, and none is sent before this check).
        await polled(exited, 30, 0.02)
        after_stop = await owners(db_url)
        assert [g for g in victims if after_stop[g] == victim] == [], after_stop

        client, owner = mesh.client, mesh.owner
        landed = await asyncio.gather(
            *(post_until_acknowledged(client, owner, mesh.post(g, "after")) for g in victims)
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
            await post_until_acknowledged(client, owner, mesh.post(group, "back"))
