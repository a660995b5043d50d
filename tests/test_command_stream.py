"""The tag-multiplexed ExecuteCommandStream client (missionweave/rpc/command_stream.py): answers in
whatever order the server sends them reach the commands they answer; a stream that ends fails the
commands still waiting and refuses new ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from missionweave.rpc.channels import open_channel
from missionweave.rpc.command_stream import CommandStream, StreamEnded
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import authority_service_pb2_grpc as apb_grpc
from missionweave.v1 import command_pb2, common_pb2


def envelope(command_id: str) -> common_pb2.SignedEnvelope:
    return common_pb2.SignedEnvelope(payload=command_pb2.Command(group_id="grp_cs", command_id=command_id).SerializeToString())


class Reversing(apb_grpc.AuthorityServiceServicer):
    """Answers each batch of ``batch`` commands in reverse order; ``end_after`` ends the stream."""

    def __init__(self, batch: int, end_after: int = -1) -> None:
        self.batch, self.end_after = batch, end_after

    async def ExecuteCommandStream(
        self, requests: AsyncIterator[apb.ExecuteCommandStreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[apb.ExecuteCommandStreamResponse]:
        held: list[apb.ExecuteCommandStreamRequest] = []
        async for item in requests:
            if len(held) == self.end_after:
                return
            held.append(item)
            if len(held) % self.batch == 0:
                for answered in reversed(held[-self.batch :]):
                    cid = command_pb2.Command.FromString(answered.command.payload).command_id
                    yield apb.ExecuteCommandStreamResponse(
                        request_tag=answered.request_tag,
                        command_id=cid,
                        result=command_pb2.CommandResult(command_id=cid),
                    )


async def serve(servicer: apb_grpc.AuthorityServiceServicer) -> tuple[grpc.aio.Server, grpc.aio.Channel]:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    apb_grpc.add_AuthorityServiceServicer_to_server(servicer, server)
    await server.start()
    return server, open_channel(f"127.0.0.1:{port}")


async def test_answers_out_of_order_reach_the_commands_they_answer() -> None:
    server, channel = await serve(Reversing(batch=3))
    try:
        stream = CommandStream(channel)
        async with asyncio.timeout(20):
            answers = await asyncio.gather(*(stream.execute(envelope(f"c{i}")) for i in range(6)))
        assert [a.result.command_id for a in answers] == [f"c{i}" for i in range(6)]
        assert len({a.request_tag for a in answers}) == 6
        stream.close()
    finally:
        await channel.close()
        await server.stop(None)


async def test_a_stream_that_ends_fails_the_waiting_commands_and_refuses_new_ones() -> None:
    server, channel = await serve(Reversing(batch=2, end_after=3))
    try:
        stream = CommandStream(channel)
        async with asyncio.timeout(20):
            results = await asyncio.gather(*(stream.execute(envelope(f"e{i}")) for i in range(4)), return_exceptions=True)
        assert [r.result.command_id for r in results[:2]] == ["e0", "e1"]  # type: ignore[union-attr]
        assert all(isinstance(r, StreamEnded) for r in results[2:])
        with pytest.raises(StreamEnded):
            await stream.execute(envelope("late"))
    finally:
        await channel.close()
        await server.stop(None)
