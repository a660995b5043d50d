"""Several server frames in one ConnectResponse, for clients that said they read them
(HelloFrame.accepts_frame_batches): the same frames in the same order, in fewer messages, within
the limits the proto states; never for a client that did not ask."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.services.gateway.connection import Connection
from missionweave_server.services.gateway.limits import BATCH_BYTES, BATCH_FRAMES
from missionweave_server.services.gateway.outbox import Outbox
from tests import builders
from tests.conftest import World
from tests.test_gateway import Stream, hello
from tests.test_missions import G, create

pytestmark = pytest.mark.both_topologies


def result(command_id: str, pad: int = 0) -> pb.ServerFrame:
    return pb.ServerFrame(result=pb.ResultFrame(command_id=command_id + "x" * pad))


async def test_a_response_carries_the_ready_frames_within_the_count_and_byte_limits() -> None:
    outbox = Outbox(control_frames=1_000)
    batched, plain = Connection(Any, outbox), Connection(Any, Outbox())  # type: ignore[arg-type]
    batched.batches = True
    for i in range(100):
        await outbox.put_control(result(f"c{i}"))
    first = await outbox.get_sized()
    assert first is not None
    response = batched.response(*first)
    assert len(response.more_frames) == BATCH_FRAMES - 1  # at most 64 frames a response
    assert [f.result.command_id for f in response.more_frames] == [f"c{i}" for i in range(1, BATCH_FRAMES)]
    for i in range(40):
        await outbox.put_control(result(f"big{i}", pad=100_000))
    while (taken := await outbox.get_sized()) is not None and not taken[0].result.command_id.startswith(
        "big"
    ):
        pass
    assert taken is not None
    big = batched.response(*taken)
    assert (
        big.ByteSize() <= BATCH_BYTES + 64 and len(big.more_frames) == BATCH_BYTES // (taken[1] + 8) - 1
    )  # as many as fit
    alone = result("alone")
    assert not plain.response(alone, alone.ByteSize()).more_frames  # a client that did not ask: one frame


@pytest.mark.req("MW-16-03", "MW-8-17")
async def test_a_batching_stream_sees_exactly_the_frames_of_a_plain_one(world: World) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    for i in range(30):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"m{i}"), membership_epoch=1)
    head = (await w.client.group_state(G)).head_sequence

    async def frames_of(accepts: bool) -> tuple[list[tuple[str, int, int]], int]:
        stream = Stream(w)
        greeting = hello(w, w.owner)
        greeting.accepts_frame_batches = accepts
        await stream.send(hello=greeting)
        seen: list[tuple[str, int, int]] = []
        batches = 0
        delivered = 0
        await stream.send(subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G, initial_credits=2))
        async with asyncio.timeout(20):
            while delivered < head:
                response = await stream.call.read()
                batches += bool(response.more_frames)
                for frame in (response.frame, *response.more_frames):
                    kind = frame.WhichOneof("frame")
                    if kind == "event":
                        seen.append((kind, frame.event.first_sequence, frame.event.last_sequence))
                        delivered = frame.event.last_sequence
                        ack = pb.CursorAck(subscription_id="s", cursor=delivered, credits=2)
                        await stream.send(ack=pb.AckFrame(cursors=[ack]))
                    elif kind == "flow":
                        seen.append((kind, frame.flow.reason, frame.flow.delivered_sequence))
                    else:
                        seen.append((kind, 0, 0))
        stream.call.cancel()
        return seen, batches

    plain, plain_batches = await frames_of(False)
    batched, _ = await frames_of(True)
    assert plain_batches == 0  # never more than one frame for a client that did not ask
    for seen in (plain, batched):  # every sequence once, in order (frame boundaries follow the credits)
        assert [s for kind, first, last in seen if kind == "event" for s in range(first, last + 1)] == list(
            range(1, head + 1)
        )
    assert batched[0][0] == "welcome" and plain[0][0] == "welcome"
