"""Delivery under a faulty transport (spec 16): every subscriber ends with exactly the Group's log, and no
cursor (the SDK's cursor file, the ACK it sends, the cursor the gateway stores) ever crosses a gap.

``FaultyAgent`` is the SDK's :class:`~missionweave.sdk.agent.Agent` with a seeded fault injector at the seam
where server frames reach the SDK (``Agent._dispatch``, which routes each frame read from the stream to
its Subscription): it drops EVENT frames, duplicates them, holds one back until after the next frame
(reordering), and breaks the stream at random points, so the SDK has to reconnect, resubscribe from its
durable cursor and digest the replays (MW-16-10). Which fault hits which frame is drawn from
``random.Random(seed)``; the frames the draws apply to depend on timing, so a seed fixes the fault mix,
not the exact interleaving.

Faults stay on while events are appended live, until every agent has read its share of EVENT frames;
then they stop and one more event is appended. A frame lost last must still be noticed: by a frame after
it (a gap; hence the extra event), or by the FLOW frame that reports the window spent (its
``delivered_sequence`` beyond what arrived). Every check is made on what each subscriber saw and on every cursor recorded while
it ran: each cursor is compared with the highest contiguous sequence its handler had processed by then.

The last test is a client that never reads: the gateway must keep serving everybody else with bounded
memory for it, and hand it everything in order once it reads.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest

from missionweave.kernel.transport import open_channel
from missionweave.sdk.agent import Agent, Backoff, CursorStore, Subscription
from missionweave.v1 import common_pb2, event_pb2, membership_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc
from missionweave_server.services.gateway.outbox import FRAMES_PER_GROUP
from tests import builders
from tests.conftest import World, register
from tests.test_agent_sdk import connect, post_messages, reach, stored
from tests.test_gateway import Stream, hello
from tests.test_missions import G, create

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

SEEDS = [11, 23, 37, 41, 59]
HISTORY = 20  # events before the agents connect (they catch up under faults) ...
FAULTY_FRAMES = 30  # EVENT frames each agent reads under faults, while events are appended live
MAX_LIVE = 600  # (a bound: agents that stop reading frames fail the test instead of hanging it)


# ------------------------------------------------------------------ the fault injector


class Faults:
    """Seeded faults on the EVENT frames one agent reads: drop, duplicate, reorder, break the stream.

    Each kind is planned once among the first frames (so every run injects all four), the rest is drawn
    with the given odds.
    """

    KINDS = ("disconnect", "drop", "duplicate", "reorder")

    def __init__(
        self,
        seed: int,
        *,
        drop: float = 0.07,
        duplicate: float = 0.07,
        reorder: float = 0.1,
        disconnect: float = 0.03,
    ) -> None:
        self.rng = random.Random(seed)
        self.odds = dict(zip(self.KINDS, (disconnect, drop, duplicate, reorder), strict=True))
        self.plan = dict(zip(self.rng.sample(range(1, 12), len(self.KINDS)), self.KINDS, strict=True))
        self.frames = 0
        self.active = True
        self.injected: Counter[str] = Counter()

    def draw(self) -> str:
        """The fault for the next EVENT frame ("" for none)."""
        self.frames += 1
        fault = self.plan.get(self.frames, "")
        roll = self.rng.random()
        for kind, odds in self.odds.items():
            if fault:
                break
            if roll < odds:
                fault = kind
            roll -= odds
        self.injected[fault or "none"] += 1
        return fault


class Consumer:
    """One subscriber's handler and the checks on its cursors: what it processed, in which order, and
    every cursor written to its cursor file, sent in an ACK or stored by the gateway, each with the
    highest contiguous sequence processed at that moment."""

    def __init__(self, name: str, start: int) -> None:
        self.name = name
        self.start = start  # the sequence before the first one this member may see (MW-8-07)
        self.seen: list[tuple[int, str]] = []
        self.processed: set[int] = set()
        self.contiguous = start
        self.cursors: dict[str, list[tuple[int, int]]] = {"file": [], "ack": [], "gateway": []}

    async def handle(self, event: event_pb2.Event) -> None:
        await asyncio.sleep(0)  # let frames pile up behind the handler now and then
        self.seen.append((event.sequence, event.event_id))
        self.processed.add(event.sequence)
        while self.contiguous + 1 in self.processed:
            self.contiguous += 1

    def cursor(self, where: str, cursor: int) -> None:
        self.cursors[where].append((cursor, self.contiguous))

    def crossed(self) -> dict[str, list[tuple[int, int]]]:
        """Every recorded cursor beyond what had been processed contiguously when it was recorded."""
        return {where: [(c, p) for c, p in values if c > p] for where, values in self.cursors.items()}


class FaultyAgent(Agent):
    """An Agent whose incoming EVENT frames pass through :class:`Faults` (and whose ACKs are recorded)."""

    def __init__(self, *args: Any, faults: Faults, consumer: Consumer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults = faults
        self.consumer = consumer
        self._held: pb.ServerFrame | None = None
        self._release: asyncio.TimerHandle | None = None

    def _dispatch(self, frame: pb.ServerFrame) -> None:
        fault = self.faults.draw() if self.faults.active and frame.HasField("event") else ""
        if fault == "disconnect":  # the stream breaks before this frame (and any held one) arrives
            self._forget_held()
            self.reconnect()
            return
        if fault == "reorder" and self._held is None:
            self._held = frame  # arrives after the next frame (or a little later if none comes)
            self._release = asyncio.get_running_loop().call_later(0.02, self._pass_held)
            return
        if fault != "drop":
            super()._dispatch(frame)
        if fault == "duplicate":
            super()._dispatch(frame)
        self._pass_held()

    def _pass_held(self) -> None:
        held = self._held
        self._forget_held()
        if held is not None:
            super()._dispatch(held)

    def _forget_held(self) -> None:
        if self._release is not None:
            self._release.cancel()
        self._held, self._release = None, None

    async def _serve(self, link: Any) -> None:
        try:
            await super()._serve(link)
        finally:
            self._forget_held()  # a frame held back is lost with its stream

    def _queue_ack(self, ack: pb.CursorAck) -> None:
        self.consumer.cursor("ack", ack.cursor)
        super()._queue_ack(ack)


# ------------------------------------------------------------------ helpers


def mesh(w: World) -> Any:
    return w.mesh


async def grant(w: World, member_id: str, role: int, visibility_start: int = 0) -> None:
    body = membership_pb2.MembershipGrant(
        member_id=member_id,
        role=membership_pb2.MemberRole.ValueType(role),
        visibility_start_sequence=visibility_start,
    )
    await w.run(w.owner, G, "membership_grant", body, membership_epoch=1)


def watch_cursors(w: World, monkeypatch: pytest.MonkeyPatch, consumers: dict[str, Consumer]) -> None:
    """Records every cursor file write and every cursor the gateway stores, with the processed prefix."""
    ask = CursorStore.ask  # every cursor the SDK asks to write, saved behind or at once

    def recorded_ask(self: CursorStore, group_id: str, cursor: int) -> asyncio.Future[None] | None:
        consumers[self.agent_id].cursor("file", cursor)
        return ask(self, group_id, cursor)

    gateway = mesh(w).gateway
    store_cursors = gateway.store_cursors

    async def recorded_store(rows: dict[tuple[str, str], int]) -> None:
        for (agent_id, _group_id), cursor in rows.items():
            consumers[agent_id].cursor("gateway", cursor)
        await store_cursors(rows)

    monkeypatch.setattr(CursorStore, "ask", recorded_ask)
    monkeypatch.setattr(gateway, "store_cursors", recorded_store)


# ------------------------------------------------------------------ faults between the SDK and the gateway


@pytest.mark.req(
    "MW-16-01", "MW-16-02", "MW-16-03", "MW-16-04", "MW-16-05", "MW-16-06", "MW-16-07", "MW-16-10"
)
@pytest.mark.parametrize("seed", SEEDS)
async def test_every_subscriber_ends_with_exactly_the_log_and_no_cursor_crosses_a_gap(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    observer = await register(w.client, w.keys["admin"], "observer-bot", common_pb2.IDENTITY_KIND_AGENT)
    await grant(w, "worker-bot", membership_pb2.MEMBER_ROLE_WORKER, visibility_start=1)
    await post_messages(w, conv, range(HISTORY))
    await grant(w, "observer-bot", membership_pb2.MEMBER_ROLE_OBSERVER)  # a late joiner (MW-8-07)
    starts = {
        m.member_id: m.visibility_start_sequence - 1 for m in (await w.client.group_state(G)).memberships
    }
    keys = {"coord-bot": w.coordinator.key, "worker-bot": w.worker.key, "observer-bot": observer.key}
    consumers = {name: Consumer(name, starts[name]) for name in keys}
    assert consumers["observer-bot"].start > HISTORY
    watch_cursors(w, monkeypatch, consumers)

    faults: list[Faults] = []
    agents: list[FaultyAgent] = []
    subscriptions: list[Subscription] = []
    try:
        for number, (name, key) in enumerate(keys.items()):
            agent_seed = seed * 10 + number
            faults.append(Faults(agent_seed))
            agent = await FaultyAgent.connect(
                w.target,
                name,
                key,
                cursor_dir=tmp_path,
                backoff=Backoff(initial=0.02, cap=0.1, rng=random.Random(agent_seed)),
                grace=2.0,
                faults=faults[-1],
                consumer=consumers[name],
            )
            agents.append(agent)
            subscriptions.append(await agent.subscribe(G, consumers[name].handle, credits=2, gap_timeout=0.1))
        posted = HISTORY
        while min(f.frames for f in faults) < FAULTY_FRAMES:  # live appends until every agent had its share
            assert not [s.failure for s in subscriptions if s.failure], "a subscription stopped"
            assert posted < HISTORY + MAX_LIVE, (
                f"the agents stopped reading frames: {[f.frames for f in faults]}"
            )
            await post_messages(w, conv, range(posted, posted + 5))
            posted += 5
            await asyncio.sleep(0.01)
        for fault in faults:
            fault.active = False
        # The network heals and the log moves on: a frame lost last now has one after it (a gap).
        await post_messages(w, conv, range(posted, posted + 1))
        head = (await w.client.group_state(G)).head_sequence
        async with asyncio.timeout(30):  # (generous: a loaded CI machine)
            for subscription in subscriptions:
                await subscription.reached(head)
    finally:
        for agent in agents:
            await agent.close()

    log = [(e.sequence, e.event_id) for e in await mesh(w).store.read(G, 0, 10_000)]
    assert log[-1][0] == head
    for name, consumer in consumers.items():
        expected = [entry for entry in log if entry[0] > consumer.start]
        assert consumer.crossed() == {"file": [], "ack": [], "gateway": []}, f"{name}: a cursor crossed a gap"
        assert consumer.seen == expected, f"{name} did not see exactly the log"  # once each, in order
        assert stored(tmp_path / name / "cursors.json") == head
        assert consumer.cursors["file"] and consumer.cursors["ack"] and consumer.cursors["gateway"]
    for subscription in subscriptions:
        assert subscription.failure is None
    injected = sum((f.injected for f in faults), Counter())
    assert all(injected[kind] > 0 for kind in Faults.KINDS), injected


# ------------------------------------------------------------------ a client that never reads


class RawStream(Stream):
    """A Connect stream on its own channel, with HTTP/2 window growth (BDP probing) off: a client that does
    not read then stops accepting data after the initial 64 KiB window, as a stalled peer would."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = pb_grpc.GatewayServiceStub(channel).Connect()


@pytest.mark.req("MW-16-01")
async def test_a_client_that_never_reads_costs_bounded_memory_and_stalls_nobody(
    world: World, tmp_path: Path
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    channel = open_channel(w.target, options=[("grpc.http2.bdp_probe", 0)])
    slow = RawStream(channel)
    seen: list[int] = []

    async def record(event: event_pb2.Event) -> None:
        seen.append(event.sequence)

    text = "x" * 4_000  # 100 of these are far more than the transport and the gateway's outbox hold
    try:
        await slow.send(hello=hello(w, w.owner))
        assert (await slow.recv()).HasField("welcome")
        subscribe = pb.SubscribeFrame(subscription_id="slow", group_id=G, initial_credits=65_536)
        await slow.send(subscribe=subscribe)  # ... and from now on it reads nothing
        (connection,) = [c for c in mesh(w).gateway.connections if c.agent_id == "alice"]
        queued, delivered = [], []
        async with connect(w, "coord-bot", w.coordinator.key, tmp_path) as agent:
            sub = await agent.subscribe(G, record)
            for batch in range(4):
                for i in range(25):
                    body = builders.message(conv, f"{batch}.{i} {text}")
                    await w.run(w.owner, G, "message_post", body, membership_epoch=1)
                head = (await w.client.group_state(G)).head_sequence
                async with asyncio.timeout(2):  # the other subscriber keeps up
                    await sub.reached(head)
                queued.append(connection.outbox.queued_frames)
                delivered.append(connection.subscriptions["slow"].delivered)
            reply = await agent.execute(G, "message_post", builders.message(conv, "commands still work"))
            assert reply.group_revision == head + 1
            head = reply.group_revision
            await reach(sub, head)
        assert seen == list(range(1, head + 1))
        # Bounded: the gateway holds a few frames for the stalled client (never the log) and stops reading
        # the log for it: its subscription stays where the transport and the queue filled up, while 75
        # more events are appended.
        assert max(queued) <= FRAMES_PER_GROUP, queued
        assert delivered[1] == delivered[-1] < head, (delivered, head)

        log = [(e.sequence, e.event_id) for e in await mesh(w).store.read(G, 0, 10_000)]
        received: list[tuple[int, str]] = []
        while len(received) < len(log):  # it reads at last: everything, in order, once, no gap
            frame = await slow.recv()
            if frame.HasField("event"):
                assert not frame.event.skipped
                events = [event_pb2.Event.FromString(e.payload) for e in frame.event.events]
                received += [(e.sequence, e.event_id) for e in events]
        assert received == log
    finally:
        slow.call.cancel()
        await channel.close()
