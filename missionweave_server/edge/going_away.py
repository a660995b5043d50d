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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from missionweave.kernel.errors import DOMAIN
from missionweave.kernel.rejections import SHUTTING_DOWN

MESSAGE = "the server is shutting down: reconnect (to another replica, or here once restarted) and resume"
# Unary methods that wait for something to happen (long polls): ended like streams at shutdown.
LONG_POLLS = frozenset({"/missionweave.v1.SchedulingService/NextSlot"})


def shutting_down_status() -> grpc.Status:
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=SHUTTING_DOWN, domain=DOMAIN))
    return rpc_status.to_status(status_pb2.Status(code=code_pb2.UNAVAILABLE, message=MESSAGE, details=[info]))


class GoingAway(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Tracks the tasks of the server's streaming and long-poll calls so shutdown can end them."""

    def __init__(self) -> None:
        self.ending = False
        self._calls: set[asyncio.Task[Any]] = set()
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        path: str = handler_call_details.method  # type: ignore[attr-defined]
        if handler is None or not (handler.unary_stream or handler.stream_stream or path in LONG_POLLS):
            return handler
        cached = self._wrapped.get(path)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler)
        if len(self._wrapped) < 10_000:  # served paths, a bounded set; this is only a guard
            self._wrapped[path] = (handler, wrapped)
        return wrapped

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

    def _wrap(self, handler: Any) -> grpc.RpcMethodHandler:
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        calls = self._calls

        if handler.unary_unary is not None:  # a long poll
            inner_unary = handler.unary_unary

            async def long_poll(request: Any, context: Any) -> Any:
                if self.ending:
                    await self._refuse(context)
                task = asyncio.current_task()
                assert task is not None
                calls.add(task)
                try:
                    return await inner_unary(request, context)
                except asyncio.CancelledError:
                    if not self._ended_by_us(task):
                        raise
                finally:
                    calls.discard(task)
                await self._refuse(context)

            return grpc.unary_unary_rpc_method_handler(long_poll, **kwargs)

        inner = handler.stream_stream or handler.unary_stream

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if self.ending:
                await self._refuse(context)
            task = asyncio.current_task()
            assert task is not None
            calls.add(task)
            try:
                answers = inner(request, context)
                if hasattr(answers, "__aiter__"):
                    async for answer in answers:
                        yield answer
                else:  # a handler that writes its answers itself (context.write) and returns
                    await answers
                return
            except asyncio.CancelledError:
                if not self._ended_by_us(task):
                    raise
            finally:
                calls.discard(task)
            await self._refuse(context)

        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(stream, **kwargs)
        return grpc.unary_stream_rpc_method_handler(stream, **kwargs)
