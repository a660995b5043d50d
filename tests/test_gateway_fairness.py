"""MW-8-16 end to end: on one agent's stream, a Group with a deep backlog of big frames does not
hold back a quiet Group's new event (the outbox interleaves Groups; see tests/test_gateway_outbox.py)."""

from __future__ import annotations

import asyncio

import pytest

import missionweave_server.services.gateway.limits
from missionweave.kernel.transport import open_channel
from missionweave.v1 import gateway_service_pb2 as pb
from tests import builders
from tests.conftest import World
from tests.test_gateway import connected
from tests.test_missions import create

NOISY, QUIET = "grp_noisy", "grp_quiet"


@pytest.mark.req("MW-8-16", "MW-8-17")
async def test_a_noisy_group_does_not_starve_another_group_on_the_same_stream(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small batches of big events: many frames of ~64 KiB, so the backlog is in the gateway's
    # queues rather than in the transport's flow-control window (which holds about one frame).
    monkeypatch.setattr(missionweave_server.services.gateway.limits, "MAX_EVENTS_PER_FRAME", 4)
    w = world
    noisy_conv = (await create(w, NOISY)).mission.planning_conversation_id
    quiet_conv = (await create(w, QUIET)).mission.planning_conversation_id
    for i in range(120):
        await w.run(
            w.owner,
            NOISY,
            "message_post",
            builders.message(noisy_conv, f"{i}" + "n" * 15_000),
            membership_epoch=1,
        )
    quiet_head = (await w.client.group_state(QUIET)).head_sequence
    # Without BDP probing the client keeps HTTP/2's 64 KiB window, so the transport holds about
    # one frame and the rest waits in the gateway, where the interleaving happens.
    channel = open_channel(w.target, options=[("grpc.http2.bdp_probe", 0)])
    stream = await connected(w, w.owner, channel)
    await stream.send(
        subscribe=pb.SubscribeFrame(subscription_id="noisy", group_id=NOISY, initial_credits=60_000)
    )
    await stream.send(
        subscribe=pb.SubscribeFrame(
            subscription_id="quiet", group_id=QUIET, after_sequence=quiet_head, initial_credits=100
        )
    )
    await asyncio.sleep(0.5)  # not reading: the noisy Group's frames pile up on the gateway side
    await w.run(w.owner, QUIET, "message_post", builders.message(quiet_conv, "urgent"), membership_epoch=1)
    await asyncio.sleep(0.2)
    noisy_frames_first = 0
    while True:
        frame = await stream.recv()
        if frame.WhichOneof("frame") != "event":
            continue
        if frame.event.group_id == QUIET:
            break
        noisy_frames_first += 1
    # 30 noisy frames were waiting; a FIFO stream would send most of them first.
    assert noisy_frames_first <= 6, noisy_frames_first
    await stream.call.done_writing()
    await channel.close()
