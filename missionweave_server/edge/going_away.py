"""Shutdown ends every open stream and long poll at once, with a status that sends its client elsewhere.

A server stream (a follow, a gateway's Connect, a command stream, a relayed one) or a long poll
(NextSlot) never ends on its own: left to ``server.stop(grace)`` it would hold the whole grace period
and then be cancelled without a status a client can act on. ``GoingAway`` wraps those handlers;
``end_streams`` cancels the ones running and answers each ``UNAVAILABLE`` with a
``google.rpc.ErrorInfo`` of reason ``SHUTTING_DOWN``: UNAVAILABLE is the status clients retry on, so
they reconnect (to another replica, or to this one once restarted) and resume from their cursors.
Unary calls are not touched: commands in flight still complete within the grace period.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from missionweave.kernel.errors import DOMAIN
from missionweave.kernel.rejections import SHUTTING_DOWN
from missionweave_server.edge.handler_wrapping import CallScope, WrappingInterceptor

MESSAGE = "the server is shutting down: reconnect (to another replica, or here once restarted) and resume"
# Unary methods that wait for something to happen (long polls): ended like streams at shutdown.
LONG_POLLS = frozenset({"/missionweave.v1.SchedulingService/NextSlot"})


def shutting_down_status() -> grpc.Status:
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=SHUTTING_DOWN, domain=DOMAIN))
    return rpc_status.to_status(status_pb2.Status(code=code_pb2.UNAVAILABLE, message=MESSAGE, details=[info]))


class GoingAway(WrappingInterceptor):
    """Tracks the tasks of the server's streaming and long-poll calls so shutdown can end them."""

    def __init__(self) -> None:
        super().__init__()
        self.ending = False
        self._calls: set[asyncio.Task[Any]] = set()

    def wraps(self, path: str, handler: grpc.RpcMethodHandler) -> bool:
        return bool(handler.unary_stream or handler.stream_stream or path in LONG_POLLS)

    def scope(self, path: str, context: Any) -> CallScope:
        return _Tracked(self, context)

    async def end_streams(self, wait_s: float = 2.0) -> None:
        """Ends every tracked call now, and refuses the ones that start from now on. Waits (at most
        ``wait_s``) for their handlers' clean-up, while what it needs (the database) is still open."""
        self.ending = True
        calls = list(self._calls)
        for task in calls:
            task.cancel()
        if calls:
            await asyncio.wait(calls, timeout=wait_s)

    async def _refuse(self, context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
        await context.abort_with_status(shutting_down_status())

    def _ended_by_us(self, task: asyncio.Task[Any]) -> bool:
        """A cancellation from ``end_streams`` (not the client's): taken back, so the call can still
        send its status."""
        if not self.ending or task.cancelling() == 0:
            return False
        task.uncancel()
        return True


class _Tracked(CallScope):
    """One stream or long poll: refused once shutdown has begun, else tracked while it runs; ended by
    ``end_streams``, it answers SHUTTING_DOWN instead of the cancellation."""

    __slots__ = ("context", "going_away", "task")

    def __init__(self, going_away: GoingAway, context: Any) -> None:
        super().__init__()
        self.going_away = going_away
        self.context = context

    async def started(self) -> None:
        if self.going_away.ending:
            await self.going_away._refuse(self.context)
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.going_away._calls.add(task)

    async def ended(self, failure: BaseException | None) -> bool:
        ended_by_us = isinstance(failure, asyncio.CancelledError) and self.going_away._ended_by_us(self.task)
        self.going_away._calls.discard(self.task)
        if not ended_by_us:
            return False
        await self.going_away._refuse(self.context)  # raises: the call ends with that status
        return True
