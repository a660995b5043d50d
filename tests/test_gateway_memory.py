"""What an agent that does not read costs the gateway (issue 40): at most its byte window, whatever
the credits it granted, and a client that cancels its stream is a normal event (one info line).

The window (docs/gateway.md "What a slow agent costs"): the stream's outbox
(``MWP_GATEWAY_STREAM_BUFFER_BYTES``), one EVENT frame waiting for room in it
(``EVENT_FRAME_BYTES``), the subscription's pending FollowGroup batch (``MAX_BATCH_BYTES``) and the
one response gRPC is sending (``BATCH_BYTES``, held three times: the message, its serialized bytes and
the transport's copy). Measured as the process's resident memory, against an anchor measured in the
same test (as many streams that hold nothing: one credit each), with a margin of twice the window:
before issue 40 a stream held ~14 MB of a 16 MB Group.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import gc
import logging
from typing import Any

import grpc
import pytest

from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.services.authority import group_log
from missionweave_server.services.gateway import limits
from missionweave_server.services.gateway import service as gateway_service
from tests import builders
from tests.conftest import World
from tests.test_gateway import Stream, hello
from tests.test_missions import G, create

STREAMS = 12
EVENT_TEXT = 8_000
EVENTS = 700  # ~5.6 MB: more than everything a stream held before issue 40


def window(buffer_bytes: int) -> int:
    """What one non-reading stream may hold beyond an idle one (the module docstring)."""
    return buffer_bytes + limits.EVENT_FRAME_BYTES + group_log.MAX_BATCH_BYTES + 3 * limits.BATCH_BYTES


def rss() -> int:
    """Resident bytes of this process, after giving freed memory back (so growth is live memory)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: growth is then an over-estimate, which the margin absorbs or not
        pass
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def fill(w: World, events: int) -> None:
    """``events`` messages of ~8 KB, paced under the Group's command rate (200/s)."""
    conv = (await create(w)).mission.planning_conversation_id

    async def post(i: int) -> None:
        await w.run(
            w.owner, G, "message_post", builders.message(conv, f"{i} " + "x" * EVENT_TEXT), membership_epoch=1
        )

    for start in range(0, events, 20):
        await asyncio.gather(*(post(i) for i in range(start, min(start + 20, events))), asyncio.sleep(0.1))


async def subscribed(w: World, channels: list[Any], credits: int) -> list[Stream]:
    """STREAMS streams of alice's, each subscribed to the whole Group with ``credits``, never read."""
    streams = []
    for i in range(STREAMS):
        stream = Stream(w, channels[i % len(channels)])
        await stream.send(hello=hello(w, w.owner))
        assert (await stream.recv()).HasField("welcome")
        await stream.send(
            subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G, initial_credits=credits)
        )
        streams.append(stream)
    return streams


async def settled(gw: gateway_service.GatewayServicer, count: int) -> None:
    """Until ``count`` streams are subscribed, and those with a frame to send are stuck sending it
    and hold still (what they hold no longer changes)."""
    async with asyncio.timeout(60):
        while len(gw.connections) < count or not all(c.subscriptions for c in gw.connections):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        last: list[Any] = []
        while True:
            await asyncio.sleep(0.5)
            now = sorted((c.outbox.queued_bytes, c.sending_since is not None) for c in gw.connections)
            if now == last:
                return
            last = now


@pytest.mark.req("MW-8-17")
async def test_a_stream_that_does_not_read_holds_at_most_its_byte_window_whatever_its_credits(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    w = world
    gw: gateway_service.GatewayServicer = w.mesh.gateway  # type: ignore[attr-defined]
    await fill(w, EVENTS)
    gw.limits = dataclasses.replace(gw.limits, max_streams_per_identity=1_000, stall_timeout_s=3_600)
    # No BDP probing: each client's receive window stays at 64 KiB (the clients are in this process).
    channels = [grpc.aio.insecure_channel(w.target, options=[("grpc.http2.bdp_probe", 0)]) for _ in range(4)]
    try:
        before = rss()
        idle = await subscribed(w, channels, credits=1)  # the anchor: the same streams, holding ~nothing
        await settled(gw, STREAMS)
        anchor = rss()
        stalled = await subscribed(w, channels, credits=65_536)
        await settled(gw, 2 * STREAMS)
        blocked = [c for c in gw.connections if c.sending_since is not None]
        assert len(blocked) >= STREAMS  # each greedy stream is stuck handing gRPC a frame
        held = (rss() - anchor) / STREAMS
        idle_cost = (anchor - before) / STREAMS
        allowed = 2 * window(gw.limits.stream_buffer_bytes)
        print(
            f"per stream: non-reading {held / 2**20:.2f} MiB, idle {idle_cost / 2**20:.2f} MiB, allowed {allowed / 2**20:.2f} MiB"
        )
        assert all(c.outbox.queued_bytes <= gw.limits.stream_buffer_bytes for c in gw.connections)
        assert held <= allowed, (
            f"a non-reading stream holds {held / 2**20:.1f} MiB (an idle one {idle_cost / 2**20:.1f}); at most {allowed / 2**20:.1f}"
        )
        # Each client cancels its stream, most of them while a frame is being sent: a normal event,
        # never an ERROR or a traceback in the server's log (at most one info line a stream).
        caplog.clear()
        caplog.set_level(logging.INFO)
        for stream in idle + stalled:
            stream.call.cancel()
        async with asyncio.timeout(30):
            while gw.connections:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
        assert not loud, [r.getMessage() for r in loud]
        ended = [r for r in caplog.records if "ended its stream" in r.getMessage()]
        assert len(ended) <= 2 * STREAMS
    finally:
        for channel in channels:
            await channel.close()
