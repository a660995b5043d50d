"""The hand-back round on its own (rebalance.py, D268): which Groups an instance hands over, to whom,
and when it holds back. Live hand-over under load is tests/test_shards.py."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from missionweave.kernel.clock import ManualClock, SystemClock
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient
from missionweave.v1 import common_pb2
from missionweave_server.config import Settings
from missionweave_server.edge.shards import rendezvous
from missionweave_server.mesh.server import start
from missionweave_server.services.authority import rebalance
from missionweave_server.services.authority.rebalance import Rebalancer, preferred
from tests import builders
from tests.conftest import register

R = common_pb2.RejectionReason

ADDRESSES = {"a": "10.0.0.1:50051", "b": "10.0.0.2:50051", "c": "10.0.0.3:50051"}
GROUPS = [f"grp_{i}" for i in range(200)]


class FakeStore:
    ownership_ttl = timedelta(seconds=30)
    owner_alive_us = 0
    retired = False

    def __init__(self, me: str, owned: list[str], live: dict[str, str]) -> None:
        self.instance_id, self.owned, self.live = me, owned, live
        self.announced: list[str] = []

    async def announce(self, address: str) -> None:
        self.announced.append(address)

    async def live_instances(self, since_us: int) -> dict[str, str]:
        return dict(self.live)

    async def owned_groups(self) -> list[str]:
        return list(self.owned)

    async def retire(self) -> None:
        self.live.pop(self.instance_id, None)
        self.retired = True


def rebalancer(store: FakeStore, handed: list[tuple[str, str]], accept: bool = True) -> Rebalancer:
    async def hand_over(group_id: str, to: str) -> bool:
        handed.append((group_id, to))
        return accept

    clock = ManualClock()
    return Rebalancer(store, hand_over, ADDRESSES[store.instance_id], clock, 1.0)  # type: ignore[arg-type]


def test_the_preferred_instance_is_the_first_of_the_routers_order_over_live_addresses() -> None:
    for group in GROUPS[:20]:
        first = rendezvous(group, list(ADDRESSES.values()))[0]
        assert ADDRESSES[preferred(group, ADDRESSES)] == first


async def test_an_instance_hands_back_only_the_groups_another_live_instance_is_preferred_for() -> None:
    mine = [g for g in GROUPS if preferred(g, {"a": ADDRESSES["a"], "b": ADDRESSES["b"]}) == "b"][:10]
    stays = [g for g in GROUPS if preferred(g, {"a": ADDRESSES["a"], "b": ADDRESSES["b"]}) == "a"][:5]
    store = FakeStore("a", mine + stays, {"a": ADDRESSES["a"], "b": ADDRESSES["b"]})
    handed: list[tuple[str, str]] = []
    balancer = rebalancer(store, handed)
    assert await balancer.round() == 0  # b is seen for the first time: not steady yet
    assert handed == [] and store.announced == [ADDRESSES["a"]]  # the heartbeat goes out every round
    assert await balancer.round() == len(mine)
    assert handed == [(g, "b") for g in mine]


async def test_an_instance_alone_or_not_seen_as_live_hands_nothing_over() -> None:
    handed: list[tuple[str, str]] = []
    alone = rebalancer(FakeStore("a", GROUPS, {"a": ADDRESSES["a"]}), handed)
    blind = rebalancer(FakeStore("a", GROUPS, {"b": ADDRESSES["b"], "c": ADDRESSES["c"]}), handed)
    for _ in range(3):
        assert await alone.round() == 0 and await blind.round() == 0
    assert handed == []


async def test_a_round_hands_over_at_most_a_batch(monkeypatch: Any) -> None:
    monkeypatch.setattr(rebalance, "BATCH", 4)
    store = FakeStore("a", GROUPS, dict(ADDRESSES))
    handed: list[tuple[str, str]] = []
    balancer = rebalancer(store, handed)
    await balancer.round()
    assert await balancer.round() == 4 and len(handed) == 4
    assert {to for _, to in handed} <= {"b", "c"}


async def test_a_group_no_longer_owned_is_not_counted() -> None:
    store = FakeStore("a", GROUPS, dict(ADDRESSES))
    handed: list[tuple[str, str]] = []
    balancer = rebalancer(store, handed, accept=False)
    await balancer.round()
    assert await balancer.round() == 0
    assert handed and all(preferred(g, ADDRESSES) == to != "a" for g, to in handed)


async def test_a_drain_hands_every_owned_group_to_its_preferred_other_instance() -> None:
    others = {"b": ADDRESSES["b"], "c": ADDRESSES["c"]}
    store = FakeStore("a", GROUPS[:30], dict(ADDRESSES))
    handed: list[tuple[str, str]] = []
    balancer = rebalancer(store, handed)
    balancer.interval_s = 0.01
    # No steadiness asked (it is leaving now); it stops counting as alive first; the second pass
    # (one round later) hands over again what is still recorded as its own here.
    assert await balancer.drain() == 60 and store.retired
    assert handed == 2 * [(g, preferred(g, others)) for g in GROUPS[:30]]


async def test_a_drain_looks_again_as_soon_as_every_other_instance_has_retired() -> None:
    """The whole mesh stopping at once: once the others have retired (their last rounds done), no
    Group can be handed here any more, so the drain need not wait out its round."""
    store = FakeStore("a", GROUPS[:30], dict(ADDRESSES))
    handed: list[tuple[str, str]] = []
    balancer = rebalancer(store, handed)
    balancer.interval_s = 30.0  # a look-again after min(the round, DRAIN_RECHECK_S = 5 s)

    async def others_retire() -> None:
        await asyncio.sleep(0.3)
        store.live = {}

    retiring = asyncio.create_task(others_retire())
    started = time.monotonic()
    await balancer.drain()
    await retiring
    assert time.monotonic() - started < rebalance.DRAIN_RECHECK_S / 2
    assert handed[:30] == [(g, preferred(g, {"b": ADDRESSES["b"], "c": ADDRESSES["c"]})) for g in GROUPS[:30]]


async def test_a_drain_with_no_other_instance_alive_keeps_the_groups() -> None:
    handed: list[tuple[str, str]] = []
    assert await rebalancer(FakeStore("a", GROUPS, {"a": ADDRESSES["a"]}), handed).drain() == 0
    assert handed == []


async def test_a_lapsed_lease_of_a_live_owner_is_not_taken_over_a_silent_owners_is(
    db_url: str, tmp_path: Path
) -> None:
    """With heartbeats, an idle Group (its lease lapsed) stays with its owner while that owner is
    alive, so a stale placement cannot take it back after a hand-over; once the owner falls silent,
    it is taken over as before."""
    if not db_url.startswith("postgresql"):
        pytest.skip("hand-back rounds run where shards do: PostgreSQL (D60)")
    clock = ManualClock(SystemClock().now())
    data = tmp_path / "data"

    def settings(instance: str) -> Settings:  # rounds never run by themselves: the test calls them
        return Settings(
            listen="127.0.0.1:0", data_dir=data, database_url=db_url, instance_id=instance,
            ownership_lease_s=2, rebalance_interval_s=1000,
        )  # fmt: skip

    a = await start(settings("auth-a"), clock)
    b = await start(settings("auth-b"), clock)
    ca, cb = MeshClient(f"127.0.0.1:{a.port}"), MeshClient(f"127.0.0.1:{b.port}")
    try:
        admin_key = read_key(data / "keys" / "admin.key")
        alice = await register(ca, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
        await register(ca, admin_key, "bot", common_pb2.IDENTITY_KIND_AGENT)
        cb.read_as(alice)
        await ca.execute(
            alice.sign(
                alice.command(
                    "grp_idle", "mission_create", builders.mission_create("alice", "bot", clock.now())
                )
            )
        )
        conv = (await ca.group_state("grp_idle")).mission.planning_conversation_id

        def post(text: str) -> common_pb2.SignedEnvelope:
            return alice.sign(
                alice.command("grp_idle", "message_post", builders.message(conv, text), membership_epoch=1)
            )

        clock.advance(seconds=3)  # a's lease lapsed; a says it is alive
        assert a.rebalancer is not None and await a.rebalancer.round() == 0
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await cb.execute(post("via b, a alive"))
        rejection = rejection_from_rpc_error(info.value)
        assert rejection is not None and rejection.reason == R.REJECTION_REASON_NOT_OWNER
        assert rejection.metadata["owner"] == "auth-a"
        clock.advance(seconds=3)  # a silent for longer than the lease: b takes the Group over
        await cb.execute(post("via b, a silent"))
    finally:
        await ca.channel.close()
        await cb.channel.close()
        await b.stop(grace=1)
        await a.stop(grace=1)
