"""The gateway's per-stream outbox: stream frames first, each Group's frames in order, Groups
interleaved by deficit round robin over bytes, memory bounded per Group (MW-8-16, MW-8-17)."""

from __future__ import annotations

import asyncio

import pytest

from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.services.gateway.outbox import Outbox


def event(group: str, seq: int, size: int) -> pb.ServerFrame:
    frame = pb.ServerFrame(event=pb.EventFrame(group_id=group, first_sequence=seq, last_sequence=seq))
    frame.event.subscription_id = "x" * max(size - frame.ByteSize() - 3, 0)  # pad to about ``size`` bytes
    return frame


async def drain(box: Outbox, n: int) -> list[pb.ServerFrame]:
    return [f for f in [await box.get() for _ in range(n)] if f is not None]


@pytest.mark.req("MW-8-17")
async def test_stream_frames_go_first_and_each_group_keeps_its_order() -> None:
    box = Outbox(frames_per_group=8)
    for seq in (1, 2, 3):
        await box.put_group("g", event("g", seq, 100))
    await box.put_control(pb.ServerFrame(result=pb.ResultFrame(command_id="c")))
    got = await drain(box, 4)
    assert got[0].WhichOneof("frame") == "result"
    assert [f.event.first_sequence for f in got[1:]] == [1, 2, 3]


@pytest.mark.req("MW-8-16")
async def test_groups_share_the_stream_by_bytes_whatever_their_frame_sizes() -> None:
    """A Group sending 64 KiB batches and one sending 1 KiB frames, both backlogged, get the same
    bytes per round; in a plain FIFO the small Group would wait behind every big batch queued."""
    box = Outbox(quantum=16 * 1024, frames_per_group=5_000)
    for seq in range(40):
        await box.put_group("big", event("big", seq, 64 * 1024))
    for seq in range(2_000):
        await box.put_group("small", event("small", seq, 1024))
    sent = {"big": 0, "small": 0}
    for frame in await drain(box, 600):
        sent[frame.event.group_id] += frame.ByteSize()
    assert sent["small"] > 0 and sent["big"] > 0
    assert abs(sent["big"] - sent["small"]) <= 64 * 1024 + 16 * 1024  # within one big frame + a quantum


@pytest.mark.req("MW-8-16", "MW-8-17")
async def test_a_full_group_waits_alone_and_memory_stays_bounded() -> None:
    box = Outbox(frames_per_group=2)
    await box.put_group("noisy", event("noisy", 1, 100))
    await box.put_group("noisy", event("noisy", 2, 100))
    blocked = asyncio.ensure_future(box.put_group("noisy", event("noisy", 3, 100)))
    await asyncio.sleep(0.01)
    assert not blocked.done() and box.queued_frames == 2  # the reader is not keeping up: wait
    await box.put_group("quiet", event("quiet", 1, 100))  # another Group is not held up
    assert box.queued_frames == 3
    first = await box.get()
    assert first is not None and first.event.group_id == "noisy"
    await asyncio.wait_for(blocked, 1)  # room again
    assert [f.event.group_id for f in await drain(box, 3)].count("quiet") == 1


async def test_end_sends_what_is_queued_and_end_with_drop_stops_at_once() -> None:
    box = Outbox()
    await box.put_group("g", event("g", 1, 10))
    box.end()
    assert (await box.get()) is not None and (await box.get()) is None
    dropped = Outbox(frames_per_group=1)
    await dropped.put_group("g", event("g", 1, 10))
    waiting = asyncio.ensure_future(dropped.put_group("g", event("g", 2, 10)))
    await asyncio.sleep(0)
    dropped.end(drop=True)
    await asyncio.wait_for(waiting, 1)  # a waiting producer is released, its frame discarded
    assert (await dropped.get()) is None and dropped.queued_frames == 0


@pytest.mark.req("MW-8-17")
async def test_event_frames_an_agent_is_behind_on_go_out_merged_in_order_within_the_limits() -> None:
    """Behind a queued EVENT frame, the same subscription's next frame is merged into it when it
    continues it; another subscription's frame, a FLOW, a gap or the event limit start a new frame."""
    box = Outbox(frames_per_group=3, max_events_per_frame=3)

    def frame(sid: str, first: int, last: int) -> pb.ServerFrame:
        envelopes = [common_pb2.SignedEnvelope(payload=bytes([s])) for s in range(first, last + 1)]
        event = pb.EventFrame(
            subscription_id=sid, group_id="g", first_sequence=first, last_sequence=last, events=envelopes
        )
        event.credits_remaining, event.head_sequence = 100 - last, last
        return pb.ServerFrame(event=event)

    await box.put_group("g", frame("a", 1, 1))
    await box.put_group("g", frame("a", 2, 3))  # merged: 1..3
    await box.put_group("g", frame("a", 4, 4))  # 3 events already: a new frame
    await box.put_group("g", pb.ServerFrame(flow=pb.FlowFrame(subscription_id="a", group_id="g")))
    got = await drain(box, 2)
    assert [(f.event.first_sequence, f.event.last_sequence, len(f.event.events)) for f in got] == [
        (1, 3, 3),
        (4, 4, 1),
    ]
    assert got[0].event.credits_remaining == 97 and got[0].event.head_sequence == 3
    assert [e.payload for e in got[0].event.events] == [b"\x01", b"\x02", b"\x03"]
    assert box.queued_bytes == sum(f.ByteSize() for f in [await box.get()])  # the FLOW, kept in its place
    await box.put_group("g", frame("a", 5, 5))
    await box.put_group("g", frame("a", 7, 7))  # not a continuation: kept apart
    await box.put_group("g", frame("a", 8, 8))  # merged into 7..8
    await box.put_group("g", frame("b", 9, 9))  # another subscription: a frame of its own
    got = await drain(box, 3)
    assert [(f.event.subscription_id, f.event.first_sequence, f.event.last_sequence) for f in got] == [
        ("a", 5, 5),
        ("a", 7, 8),
        ("b", 9, 9),
    ]


async def test_a_batch_takes_what_get_would_give_next_within_its_size_and_never_waits() -> None:
    box, twin = Outbox(frames_per_group=8), Outbox(frames_per_group=8)
    for b in (box, twin):
        for seq in (1, 2, 3):
            await b.put_group("a", event("a", seq, 100))
            await b.put_group("b", event("b", seq, 3000))
        await b.put_control(pb.ServerFrame(result=pb.ResultFrame(command_id="c")))
    expected = await drain(twin, 7)
    taken = []
    while (got := box.take_ready(4096)) is not None:
        taken.append(got)
    assert [frame for frame, _ in taken] == expected  # the same frames, in the same order
    assert [size for _, size in taken] == [frame.ByteSize() for frame in expected]
    assert box.take_ready(4096) is None and box.queued_frames == 0  # empty: None at once
    await box.put_group("a", event("a", 4, 5000))
    assert box.take_ready(4096) is None and box.queued_frames == 1  # too big for what is left
    assert (await box.get()).event.first_sequence == 4  # still next, for the next response
