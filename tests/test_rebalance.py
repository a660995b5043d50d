"""The hand-back round on its own (rebalance.py, D268): which Groups an instance hands over, to whom,
and when it holds back. Live hand-over under load is tests/test_shards.py."""

from __future__ import annotations

from typing import Any

from missionweave.kernel.clock import ManualClock
from missionweave_server.edge.shards import rendezvous
from missionweave_server.services.authority import rebalance
from missionweave_server.services.authority.rebalance import Rebalancer, preferred

ADDRESSES = {"a": "10.0.0.1:50051", "b": "10.0.0.2:50051", "c": "10.0.0.3:50051"}
GROUPS = [f"grp_{i}" for i in range(200)]


class FakeStore:
    def __init__(self, me: str, owned: list[str], live: dict[str, str]) -> None:
        self.instance_id, self.owned, self.live = me, owned, live
        self.announced: list[str] = []

    async def announce(self, address: str) -> None:
        self.announced.append(address)

    async def live_instances(self, since_us: int) -> dict[str, str]:
        return dict(self.live)

    async def owned_groups(self) -> list[str]:
        return list(self.owned)


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
    assert await rebalancer(store, handed).drain() == 30  # no steadiness asked: it is leaving now
    assert handed == [(g, preferred(g, others)) for g in GROUPS[:30]]


async def test_a_drain_with_no_other_instance_alive_keeps_the_groups() -> None:
    handed: list[tuple[str, str]] = []
    assert await rebalancer(FakeStore("a", GROUPS, {"a": ADDRESSES["a"]}), handed).drain() == 0
    assert handed == []
