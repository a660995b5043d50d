"""The gateway follows each Group once and fans it out to its subscriptions (D132): each still gets
exactly its member view (MW-9-05, MW-8-07), and a late or slow one catches up from history and then
joins the shared follow without a gap or a duplicate (MW-16-01..05)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import timedelta
from typing import Any

import grpc
import pytest

from missionweave.internal.v1 import group_log_pb2 as glpb
from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import conversation_pb2, membership_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.services.gateway import fanout
from missionweave_server.services.gateway.service import GatewayServicer
from tests import builders
from tests.conftest import World
from tests.test_gateway import Stream, connected
from tests.test_missions import G, create

pytestmark = pytest.mark.both_topologies


def gateway_of(w: World) -> GatewayServicer:
    return w.mesh.gateway  # type: ignore[attr-defined,no-any-return]


def count_follows(gateway: GatewayServicer, monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """FollowGroup calls the gateway opens, by view."""
    calls: Counter[int] = Counter()
    real = gateway.group_log.FollowGroup

    def spy(request: glpb.FollowGroupRequest, **kw: Any) -> Any:
        calls[request.view or glpb.FOLLOW_VIEW_MEMBER] += 1
        return real(request, **kw)

    monkeypatch.setattr(gateway.group_log, "FollowGroup", spy)
    return calls


async def head(w: World) -> int:
    return (await w.client.group_state(G)).head_sequence


async def view_until(stream: Stream, last: int, seen: dict[int, bytes | None]) -> None:
    """Read EVENT frames until ``last`` is covered: each sequence's payload (None: skipped), checking
    that every sequence comes once, in order."""
    while not seen or max(seen) < last:
        frame = (await stream.until("event")).event
        assert frame.first_sequence == (max(seen) + 1 if seen else frame.first_sequence)
        skipped = {seq for r in frame.skipped for seq in range(r.first, r.last + 1)}
        payloads = iter(frame.events)
        for seq in range(frame.first_sequence, frame.last_sequence + 1):
            assert seq not in seen, f"sequence {seq} came twice"
            seen[seq] = None if seq in skipped else next(payloads).payload
        assert next(payloads, None) is None


async def subscribe(
    stream: Stream, subscription_id: str, after: int = 0, credits: int = 1000
) -> pb.FlowFrame:
    await stream.send(
        subscribe=pb.SubscribeFrame(
            subscription_id=subscription_id, group_id=G, after_sequence=after, initial_credits=credits
        )
    )
    return (await stream.until("flow")).flow


@pytest.mark.req("MW-9-05", "MW-8-07", "MW-16-01")
async def test_two_views_of_one_group_come_from_one_shared_follow(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world
    calls = count_follows(gateway_of(w), monkeypatch)
    await create(w)
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    granted = await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    for conversation_id, parties in (("conv_with_worker", ["worker-bot"]), ("conv_without", [])):
        opened = conversation_pb2.ConversationOpen(
            conversation_id=conversation_id,
            kind=conversation_pb2.CONVERSATION_KIND_RESTRICTED,
            title="r",
            participant_ids=parties,
        )
        await w.run(w.coordinator, G, "conversation_open", opened, membership_epoch=2)
    owner, worker = await connected(w, w.owner), await connected(w, w.worker)
    await subscribe(owner, "o")
    late = await subscribe(worker, "w")
    assert late.effective_after_sequence == granted.group_revision - 1  # the late joiner's start
    before = await head(w)
    owned: dict[int, bytes | None] = {}
    worked: dict[int, bytes | None] = {}
    await view_until(owner, before, owned)
    await view_until(worker, before, worked)
    feed = gateway_of(w).feeds[G]
    assert feed.subscribers == 2  # both caught up and share the Group's one follow
    for conversation_id, text in (
        ("conv_with_worker", "for-the-worker"),
        ("conv_without", "not-for-the-worker"),
    ):
        await w.run(w.owner, G, "message_post", builders.message(conversation_id, text), membership_epoch=1)
    last = await head(w)
    await view_until(owner, last, owned)
    await view_until(worker, last, worked)
    assert set(owned) == set(range(1, last + 1)) and None not in owned.values()  # the MissionOwner sees all
    assert set(worked) == set(range(granted.group_revision, last + 1))  # nothing before its start
    assert b"for-the-worker" in worked[last - 1]  # type: ignore[operator]
    assert worked[last] is None  # a restricted Conversation it is not party to: skipped
    assert calls[glpb.FOLLOW_VIEW_SHARED] == 1
    # Each subscription's own stream served its start (the Authority decides it) and was then closed.
    assert calls[glpb.FOLLOW_VIEW_MEMBER] == 2
    assert all(
        s.follow is None and s.feed is feed
        for c in gateway_of(w).connections
        for s in c.subscriptions.values()
    )


@pytest.mark.req("MW-16-01", "MW-16-05", "MW-8-17")
async def test_a_late_and_a_slow_subscriber_catch_up_then_follow_live_without_gap_or_duplicate(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world
    monkeypatch.setattr(fanout, "FEED_ENTRIES", 4)  # a small window: falling behind it is easy
    calls = count_follows(gateway_of(w), monkeypatch)
    conv = (await create(w)).mission.planning_conversation_id
    owner = await connected(w, w.owner)
    await subscribe(owner, "o")
    owned: dict[int, bytes | None] = {}
    await view_until(owner, await head(w), owned)
    for i in range(12):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"early-{i}"), membership_epoch=1)
    await view_until(owner, await head(w), owned)
    # Subscribes behind the window: history first, from its own stream, then the shared follow,
    # with credits for two live events only.
    late = await connected(w, w.coordinator)
    caught_up = await head(w)
    await subscribe(late, "late", credits=caught_up + 2)
    seen: dict[int, bytes | None] = {}
    await view_until(late, caught_up, seen)
    for i in range(10):  # it runs out of credits: the feed goes on without it, past its window
        await w.run(w.owner, G, "message_post", builders.message(conv, f"live-{i}"), membership_epoch=1)
    await view_until(late, caught_up + 2, seen)
    last = await head(w)
    await view_until(owner, last, owned)
    assert gateway_of(w).feeds[G].oldest_after() > caught_up + 2  # it fell out of the window
    await late.send(
        ack=pb.AckFrame(cursors=[pb.CursorAck(subscription_id="late", cursor=caught_up + 2, credits=1000)])
    )
    await view_until(late, last, seen)
    assert gateway_of(w).feeds[G].subscribers == 2  # caught up again: back on the shared follow
    await w.run(w.owner, G, "message_post", builders.message(conv, "after"), membership_epoch=1)
    last = await head(w)
    await view_until(late, last, seen)
    await view_until(owner, last, owned)
    assert set(seen) == set(owned) == set(range(1, last + 1))
    assert seen == owned  # the same events: the coordinator and the MissionOwner see the whole Group
    assert calls[glpb.FOLLOW_VIEW_SHARED] == 1
    # Its own stream: once to start and catch up, once more from where it fell out of the window.
    assert calls[glpb.FOLLOW_VIEW_MEMBER] == 3


@pytest.mark.req("MW-8-03", "MW-16-01")
async def test_a_member_revoked_while_on_the_shared_follow_stops_before_anything_after(world: World) -> None:
    """The shared stream's MemberSet ends a subscription as its own stream's membership_ended did:
    NOT_A_MEMBER, before any event of the batch that no longer counts it; the others go on."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    owner, worker = await connected(w, w.owner), await connected(w, w.worker)
    await subscribe(owner, "o")
    await subscribe(worker, "w")
    owned: dict[int, bytes | None] = {}
    worked: dict[int, bytes | None] = {}
    await view_until(owner, await head(w), owned)
    await view_until(worker, await head(w), worked)
    assert gateway_of(w).feeds[G].subscribers == 2
    revoke = membership_pb2.MembershipRevoke(member_id="worker-bot", reason="done")
    revoked = (await w.run(w.owner, G, "membership_revoke", revoke, membership_epoch=1)).group_revision
    await w.run(
        w.owner, G, "message_post", builders.message(conv, "after the revocation"), membership_epoch=1
    )
    ended = await worker.until_any("error", "event")
    assert ended.WhichOneof("frame") == "error" and ended.error.code == pb.GATEWAY_ERROR_CODE_NOT_A_MEMBER
    assert max(worked) < revoked
    await view_until(owner, await head(w), owned)
    assert b"after the revocation" in owned[max(owned)]  # type: ignore[operator]


@pytest.mark.req("MW-8-06", "MW-9-05")
async def test_a_provisional_member_gets_its_narrower_view_from_the_shared_follow(world: World) -> None:
    """D124 through the fan-out: a provisional member hears of no Group-wide Conversation, only of
    one it is named in, while the MissionOwner on the same shared follow gets everything."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    grant = membership_pb2.MembershipGrant(
        member_id="worker-bot",
        role=membership_pb2.MEMBER_ROLE_WORKER,
        provisional=True,
        expires_at=to_timestamp(w.clock.now() + timedelta(minutes=30)),
    )
    await w.run(w.coordinator, G, "membership_grant", grant, membership_epoch=2)
    owner, worker = await connected(w, w.owner), await connected(w, w.worker)
    await subscribe(owner, "o")
    await subscribe(worker, "w")
    owned: dict[int, bytes | None] = {}
    worked: dict[int, bytes | None] = {}
    await view_until(owner, await head(w), owned)
    await view_until(worker, await head(w), worked)
    assert gateway_of(w).feeds[G].subscribers == 2
    public = await w.run(
        w.owner, G, "message_post", builders.message(conv, "for full members"), membership_epoch=1
    )
    opened = conversation_pb2.ConversationOpen(
        conversation_id="conv_jit",
        kind=conversation_pb2.CONVERSATION_KIND_RESTRICTED,
        title="r",
        participant_ids=["worker-bot"],
    )
    await w.run(w.coordinator, G, "conversation_open", opened, membership_epoch=2)
    named = await w.run(
        w.owner,
        G,
        "message_post",
        builders.message("conv_jit", "for the provisional one"),
        membership_epoch=1,
    )
    last = await head(w)
    await view_until(owner, last, owned)
    await view_until(worker, last, worked)
    assert worked[public.group_revision] is None and owned[public.group_revision] is not None
    assert b"for the provisional one" in worked[named.group_revision]  # type: ignore[operator]
    assert all(owned[seq] is not None for seq in range(public.group_revision, last + 1))


class _Batches:
    """A FollowGroup call that answers the batches put in ``queue`` (None: the stream ends)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[glpb.FollowGroupResponse | None] = asyncio.Queue()

    async def read(self) -> Any:
        got = await self.queue.get()
        self.queue.task_done()  # the reader handles it before it reads again
        return grpc.aio.EOF if got is None else got

    def cancel(self) -> None:
        pass


async def test_the_feed_window_gives_each_take_exactly_the_entries_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A take answers the entries after ``delivered`` up to ``most``, [] at the head, and None once
    they left the window, however the window was trimmed (by count and by bytes) and compacted; the
    model is the list of every sequence received, of which the window is the last part."""
    monkeypatch.setattr(fanout, "FEED_ENTRIES", 16)
    monkeypatch.setattr(fanout, "FEED_BYTES", 4_000)
    call = _Batches()

    async def opener(after: int) -> _Batches:
        return call

    feed = fanout.GroupFeed("grp_window", 100, opener, lambda _: None)
    rng = random.Random(7)
    received: list[tuple[int, int]] = []  # (sequence, size) of every entry
    sequence = 100
    for _ in range(60):
        batch = glpb.LogBatch()
        for _ in range(rng.randint(1, 9)):
            sequence += 1
            envelope_bytes = rng.choice((10, 40, 900))  # large ones trim the window by bytes
            entry = batch.entries.add(sequence=sequence)
            entry.envelope.payload = b"x" * envelope_bytes
            entry.audience.full_members = True
            received.append((sequence, entry.envelope.ByteSize()))
        batch.head_sequence = sequence
        await call.queue.put(glpb.FollowGroupResponse(batch=batch))
        await asyncio.wait_for(call.queue.join(), 5)  # the feed took the batch
        assert feed.position == sequence
        # The model's window: the newest entries within both bounds (always at least one).
        window: list[int] = []
        size = 0
        for seq, n in reversed(received):
            if window and (len(window) >= fanout.FEED_ENTRIES or size + n > fanout.FEED_BYTES):
                break
            window.insert(0, seq)
            size += n
        assert feed.oldest_after() == window[0] - 1
        for delivered in range(100, sequence + 2):
            for most in (1, 3, 50):
                got = feed.take(delivered, most)
                if delivered < window[0] - 1:
                    assert got is None
                elif delivered >= sequence:
                    assert got == []
                else:
                    assert got is not None
                    assert [e.sequence for e in got] == [s for s in window if s > delivered][:most]
    await call.queue.put(None)
    await feed.task
    assert feed.take(sequence, 5) is None  # ended at the head: follow on your own
