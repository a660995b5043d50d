"""In-process calls through the same generated stubs: a channel whose calls go straight to a servicer.

When services share a process (the embedded default), a service still reaches another only through
its contract: it builds the generated stub on a channel. ``LocalChannel`` is such a channel, with no
network hop and no serialisation: a call runs the servicer's method in the caller's task and the
caller gets the servicer's answer, or a ``grpc.aio.AioRpcError`` carrying exactly the status
(code, message, ``grpc-status-details-bin``) a remote call would have raised. Messages are handed
over, not copied: neither side changes a message after handing it over (the servicers and clients
here build fresh answers).

Unary-unary, unary-stream and stream-unary calls are supported: the shapes service-to-service calls
use. Bidirectional streams are for agents, which always come over the network.

The servicer runs in the caller's task, so it sees the caller's trace context; while tracing is on,
unary-response calls also get the client and server spans a network call would have
(``tracing.local_call``). In-process streams have none of their own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from missionweave_server.observability import tracing

log = logging.getLogger("missionweave_server.edge.local")

Metadata = Sequence[tuple[str, str | bytes]]


class _Aborted(grpc.aio.AbortError):
    """Raised inside the servicer by ``abort``: ends its method the way gRPC's own AbortError does."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Metadata) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailing = tuple(trailing)


class LocalContext:
    """The part of ``grpc.aio.ServicerContext`` the servicers use, for a call made in process."""

    def __init__(self, metadata: Metadata | None) -> None:
        self._metadata = tuple(metadata or ())
        self._trailing: tuple[tuple[str, str | bytes], ...] = ()
        self._code: grpc.StatusCode | None = None
        self._details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def peer(self) -> str:
        return "local"

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def set_trailing_metadata(self, metadata: Metadata) -> None:
        self._trailing = tuple(metadata)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Metadata = ()) -> None:
        raise _Aborted(code, details, tuple(trailing_metadata) or self._trailing)

    async def abort_with_status(self, status: grpc.Status) -> None:
        raise _Aborted(status.code, status.details, status.trailing_metadata)


def _rpc_error(code: grpc.StatusCode, details: str, trailing: Metadata = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details=details)


def _as_rpc_error(method: str, exc: BaseException) -> grpc.aio.AioRpcError:
    if isinstance(exc, _Aborted):
        return _rpc_error(exc.code, exc.details, exc.trailing)
    if isinstance(exc, NotImplementedError):  # the generated base servicer's answer for a missing method
        return _rpc_error(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
    if isinstance(exc, grpc.aio.AioRpcError):  # the servicer's own peer call failed: gRPC says UNKNOWN too
        return _rpc_error(grpc.StatusCode.UNKNOWN, f"{method}: {exc.details()}")
    log.error("in-process call failed", exc_info=exc, extra={"rpc": method})
    return _rpc_error(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")


def _deadline_error(method: str) -> grpc.aio.AioRpcError:
    return _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"{method}: deadline exceeded")


class _Method:
    def __init__(self, channel: LocalChannel, method: str) -> None:
        self.channel, self.method = channel, method

    def handler(self) -> Callable[..., Any]:
        """Looked up at each call, as gRPC routes each call: a stub may be built before its servicer
        is registered."""
        return self.channel.handler(self.method)


class _UnaryUnary(_Method):
    async def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the signature gRPC stubs call)
        metadata: Metadata | None = None,
        **_: Any,
    ) -> Any:
        try:
            async with asyncio.timeout(timeout):
                if tracing.active():
                    with tracing.local_call(self.method):
                        return await self.handler()(request, LocalContext(metadata))
                return await self.handler()(request, LocalContext(metadata))
        except TimeoutError:
            raise _deadline_error(self.method) from None
        except Exception as exc:
            raise _as_rpc_error(self.method, exc) from None


class _StreamUnary(_Method):
    async def __call__(
        self,
        request_iterator: AsyncIterator[Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the signature gRPC stubs call)
        metadata: Metadata | None = None,
        **_: Any,
    ) -> Any:
        try:
            async with asyncio.timeout(timeout):
                if tracing.active():
                    with tracing.local_call(self.method):
                        return await self.handler()(request_iterator, LocalContext(metadata))
                return await self.handler()(request_iterator, LocalContext(metadata))
        except TimeoutError:
            raise _deadline_error(self.method) from None
        except Exception as exc:
            raise _as_rpc_error(self.method, exc) from None


class LocalStreamCall:
    """A server-streaming call in process: iterate it (or ``read()``) and ``cancel()`` it like gRPC's."""

    def __init__(self, method: str, responses: AsyncIterator[Any]) -> None:
        self.method = method
        self._responses = responses
        self._done = False

    def __aiter__(self) -> LocalStreamCall:
        return self

    async def __anext__(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        try:
            return await self._responses.__anext__()
        except StopAsyncIteration:
            self._done = True
            raise
        except Exception as exc:
            self._done = True
            raise _as_rpc_error(self.method, exc) from None

    async def read(self) -> Any:
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            return grpc.aio.EOF

    def cancel(self) -> bool:
        if self._done:
            return False
        self._done = True
        closing = getattr(self._responses, "aclose", None)
        if closing is not None:
            task = asyncio.ensure_future(closing())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return True

    def done(self) -> bool:
        return self._done


async def _failing(exc: BaseException) -> AsyncIterator[Any]:
    raise exc
    yield  # an async generator that fails at its first step, as a refused stream does


class _UnaryStream(_Method):
    def __call__(self, request: Any, *, metadata: Metadata | None = None, **_: Any) -> LocalStreamCall:
        try:
            responses = self.handler()(request, LocalContext(metadata))
        except _Aborted as refused:
            responses = _failing(refused)
        return LocalStreamCall(self.method, responses)


class LocalChannel:
    """A channel to servicers registered in this process (see the module docstring)."""

    def __init__(self) -> None:
        self._servicers: dict[str, Any] = {}

    def register(self, service_full_name: str, servicer: Any) -> None:
        """Serve ``/<service_full_name>/<Method>`` calls with ``servicer.<Method>``."""
        self._servicers[service_full_name] = servicer

    def serves(self, service_full_name: str) -> bool:
        return service_full_name in self._servicers

    def handler(self, method: str) -> Callable[..., Any]:
        service, _, name = method.lstrip("/").partition("/")
        handler = getattr(self._servicers.get(service), name, None)
        if handler is None:
            raise _Aborted(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served in this process", ())
        return handler  # type: ignore[no-any-return]

    def unary_unary(self, method: str, *_: Any, **__: Any) -> _UnaryUnary:
        return _UnaryUnary(self, method)

    def unary_stream(self, method: str, *_: Any, **__: Any) -> _UnaryStream:
        return _UnaryStream(self, method)

    def stream_unary(self, method: str, *_: Any, **__: Any) -> _StreamUnary:
        return _StreamUnary(self, method)

    def stream_stream(self, method: str, *_: Any, **__: Any) -> Callable[..., Any]:
        def refuse(*_: Any, **__: Any) -> Any:
            raise _rpc_error(
                grpc.StatusCode.UNIMPLEMENTED, f"{method}: bidirectional streams are not called in process"
            )

        return refuse

    async def close(self, grace: float | None = None) -> None:
        """Nothing to release; present so callers close every channel alike."""

    async def __aenter__(self) -> LocalChannel:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
