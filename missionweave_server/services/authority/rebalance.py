"""Rebalance: each Group goes back to the shard its placement prefers once that shard is up.

Groups move when a shard fails (its leases lapse and the next shard in each Group's rendezvous order
takes them over), and nothing moved them back: after a restart or a pause a shard owned none, and
after two takeovers every Group sat on one shard. Every ``interval`` seconds each Authority instance
announces itself (its row in ``authority_instances``: the heartbeat), reads which instances
announced within ``LIVE_ROUNDS`` rounds (a round is at most a third of the lease), and hands each
Group it owns whose rendezvous order over the live instances' addresses (the order the shard router
tries, edge/shards.py) starts elsewhere to that instance: at most ``BATCH`` per round, and only to an
instance seen live in the round before too, so a shard that flaps does not pull Groups back and forth.

With heartbeats, a Group whose lease lapsed while its owner is alive (idle) is not taken over
(store.py ``acquire``): a caller's stale placement would otherwise take it back from the shard it
was handed to. A takeover needs the lease lapsed and the owner silent for ``LIVE_ROUNDS`` rounds.

The hand-over itself (authority.py, store.py) is made by the owner: under the Group's lock, after
its decided appends are durable, raising the writer epoch and naming the new owner with a full
lease, so at no moment can two instances append to one Group. Callers in the meantime get
``NOT_OWNER`` inside the mesh (the router follows it) and never an outage longer than one retry.

A graceful stop (SIGTERM: a rolling upgrade, a pod moved, a shard removed) drains: once the server
serves no more calls, the instance hands every Group it owns to the instance the Group's order
prefers among the others (``drain``), so they need not wait out the ownership lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from missionweave.kernel.clock import Clock, to_micros
from missionweave_server.edge.shards import rendezvous
from missionweave_server.services.authority.store import EventStore

log = logging.getLogger("missionweave.rebalance")

LIVE_ROUNDS = 3  # an instance is up while it announced within this many rounds
BATCH = 64  # Groups one instance hands over per round: a restarted shard fills up over a few rounds
DRAIN_RECHECK_S = 5.0  # a draining instance looks again for Groups handed to it meanwhile, after a round
DRAIN_POLL_S = 0.2  # ... or sooner: how often it checks whether any other instance is still alive


def preferred(group_id: str, live: dict[str, str]) -> str:
    """The live instance a Group belongs on: the first of its rendezvous order over their addresses."""
    by_address = {address: instance for instance, address in live.items()}
    return by_address[rendezvous(group_id, list(by_address))[0]]


class Rebalancer:
    def __init__(
        self,
        store: EventStore,
        hand_over: Callable[[str, str], Awaitable[bool]],
        address: str,
        clock: Clock,
        interval_s: float,
    ) -> None:
        self.store, self.hand_over, self.address, self.clock = store, hand_over, address, clock
        # One window for both sides, never longer than the lease: an owner silent that long has its
        # Groups taken over, and is not handed any (a stopped shard would be given back what was just
        # taken). So the rounds run at least LIVE_ROUNDS times per lease.
        self.interval_s = min(interval_s, store.ownership_ttl.total_seconds() / LIVE_ROUNDS)
        self.alive_us = store.owner_alive_us = int(LIVE_ROUNDS * self.interval_s * 1_000_000)
        self._seen: set[str] = set()  # instances live in the previous round
        self.task: asyncio.Task[None] | None = None  # the rounds, once started

    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.run())
        return self.task

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.round()
            except Exception:  # a store that does not answer now: the next round tries again
                log.warning("rebalance round failed", exc_info=True)

    async def round(self) -> int:
        """One heartbeat and hand-back round: the number of Groups handed over."""
        await self.store.announce(self.address)
        live = await self._live()
        steady = {i: a for i, a in live.items() if i in self._seen or i == self.store.instance_id}
        self._seen = set(live)
        if len(steady) < 2 or self.store.instance_id not in steady:
            return 0
        moved = 0
        for group_id in await self.store.owned_groups():
            target = preferred(group_id, steady)
            if target == self.store.instance_id:
                continue
            if await self.hand_over(group_id, target):
                moved += 1
                log.info(
                    "handed a Group to the shard it belongs on", extra={"group_id": group_id, "to": target}
                )
            if moved >= BATCH:
                break
        return moved

    async def drain(self) -> int:
        """At a graceful stop, once no call is served any more: stop counting as alive, then hand
        every Group this instance owns to the instance its placement prefers among the others alive,
        so its Groups are written again at once rather than after their leases lapse. A second pass
        one round later takes back what a round that had not yet seen the retirement handed here.
        The number handed over (0 when no other instance is alive: the Groups wait for this one, or
        for their leases)."""
        if self.task is not None:  # its own rounds would announce it alive again
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.store.retire()
        moved = await self._hand_all_over()
        if moved:
            await self._others_settle(min(self.interval_s, DRAIN_RECHECK_S))
            moved += await self._hand_all_over()
        log.info("handed this shard's Groups to the others before stopping", extra={"groups": moved})
        return moved

    async def _others_settle(self, limit_s: float) -> None:
        """Waits a round (``limit_s``) for another instance's round that had not yet seen the
        retirement, or less once no other instance is alive: a retired one ran its last round before
        it retired, so nobody can hand this one a Group any more (the whole mesh stopping at once)."""
        until = time.monotonic() + limit_s
        while time.monotonic() < until:
            await asyncio.sleep(min(DRAIN_POLL_S, max(0.0, until - time.monotonic())))
            if not await self._others():
                return

    async def _live(self) -> dict[str, str]:
        """The instances that announced themselves within the alive window: id -> address."""
        return await self.store.live_instances(to_micros(self.clock.now()) - self.alive_us)

    async def _others(self) -> dict[str, str]:
        return {i: a for i, a in (await self._live()).items() if i != self.store.instance_id}

    async def _hand_all_over(self) -> int:
        others = await self._others()
        moved = 0
        if others:
            for group_id in await self.store.owned_groups():
                moved += await self.hand_over(group_id, preferred(group_id, others))
        return moved
