"""Commands over one open ``ExecuteCommandStream``: each sent under a tag of this stream's own and
answered by it, whatever order the answers come in (the Authority answers in completion order).

The front door uses one per Authority shard a routed stream reaches (``rpc/shards.py``, D160); the
benchmarks publish through it as a pipelining client would.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import grpc

from missionweave.v1 import authority_service_pb2, common_pb2

METHOD = "/missionweave.v1.AuthorityService/ExecuteCommandStream"
# Commands one stream has in flight at once, at an Authority and through the front door: a command
# holds its slot until its answer is written, so a client that stops reading answers pauses the
# stream (docs/errors.md "ExecuteCommandStream").
MAX_STREAM_IN_FLIGHT = 256
_Request = authority_service_pb2.ExecuteCommandStreamRequest
_Response = authority_service_pb2.ExecuteCommandStreamResponse


class StreamEnded(Exception):
    """The stream ended (or was closed or cancelled here) before this command was answered."""


class CommandStream:
    """One ``ExecuteCommandStream`` on ``channel`` (opened at once, with ``kw`` such as metadata): a
    writer task sends each command as it is handed over, a reader task answers each by its tag. A
    command whose stream breaks before its answer gets the stream's error (``grpc.aio.AioRpcError``,
    else ``StreamEnded``): it may or may not have been applied, as with any call whose answer was
    lost. An in-process channel, which has no bidirectional calls, refuses at construction."""

    def __init__(self, channel: Any, **kw: Any) -> None:
        self._call = channel.stream_stream(METHOD, _Request.SerializeToString, _Response.FromString)(**kw)
        self._waiting: dict[int, asyncio.Future[_Response]] = {}
        self._tags = itertools.count(1)
        self._outgoing: asyncio.Queue[_Request | None] = asyncio.Queue()
        self._ended: BaseException | None = None
        self._writer = asyncio.create_task(self._write())
        self._reader = asyncio.create_task(self._read())

    async def execute(self, envelope: common_pb2.SignedEnvelope) -> _Response:
        """The command's answer (its ``request_tag`` is this stream's, not any caller's)."""
        if self._ended is not None:
            raise self._ended
        tag = next(self._tags)
        answer = self._waiting[tag] = asyncio.get_running_loop().create_future()
        self._outgoing.put_nowait(_Request(command=envelope, request_tag=tag))
        return await answer

    def close(self) -> None:
        """No more commands: the server ends the stream once it has answered those sent."""
        self._outgoing.put_nowait(None)

    def cancel(self) -> None:
        self._call.cancel()
        self._writer.cancel()
        self._reader.cancel()

    async def _write(self) -> None:
        try:
            while (request := await self._outgoing.get()) is not None:
                await self._call.write(request)
            await self._call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the call ended: the reader answers every waiting command with how it ended

    async def _read(self) -> None:
        ended: BaseException = StreamEnded("the command stream ended")
        try:
            async for answer in self._call:
                waiting = self._waiting.pop(answer.request_tag, None)
                if waiting is not None and not waiting.done():
                    waiting.set_result(answer)
        except grpc.aio.AioRpcError as err:
            ended = err
        except asyncio.CancelledError:
            ended = StreamEnded("the command stream was cancelled")
            raise
        finally:
            self._ended = ended
            waiting_now, self._waiting = self._waiting, {}
            for waiting in waiting_now.values():
                if not waiting.done():
                    waiting.set_exception(ended)
