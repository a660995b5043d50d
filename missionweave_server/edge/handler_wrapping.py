"""The skeleton of a server interceptor that runs each call of the methods it picks inside a scope of
its own, whatever the method's shape (unary or streaming request, unary or streaming response).

``AccessLog`` (access_log.py) times, counts and logs every call in one; ``GoingAway`` (going_away.py)
tracks streams and long polls in one so that shutdown can end them. Each says which methods it wraps
(``wraps``) and what its scope does (``scope``: a ``CallScope``); this module holds what they share:
the wrapped handler, built once per method path, and the walk over a streaming handler's answers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc


class CallScope:
    """What an interceptor does around one call: ``started`` runs before the handler (and may abort
    the call), ``ended`` once the handler has ended, with the exception that ended it, if any
    (``BaseException``: a cancellation or a closed stream included); true swallows that exception.
    ``answer`` is a unary call's response, set before ``ended`` runs (None for a stream or a failure).
    """

    __slots__ = ("answer",)

    def __init__(self) -> None:
        self.answer: Any = None

    async def started(self) -> None:
        pass

    async def ended(self, failure: BaseException | None) -> bool:
        return False


class WrappingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Serves the handler of every method that ``wraps`` picks wrapped (``wrap``: by default, each call
    runs in the ``CallScope`` that ``scope`` returns for it); any other method's handler as it is."""

    def __init__(self) -> None:
        # By path: the handler last wrapped and its wrapper, rebuilt only when the handler changes.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wraps(self, path: str, handler: grpc.RpcMethodHandler) -> bool:
        return True

    def scope(self, path: str, context: Any) -> CallScope:
        raise NotImplementedError

    def wrap(self, path: str, handler: Any) -> grpc.RpcMethodHandler:
        """The handler served in ``handler``'s place: by default, one that runs each call in ``scope``."""
        return wrap_handler(path, handler, self.scope)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        path: str = handler_call_details.method  # type: ignore[attr-defined]
        if handler is None or not self.wraps(path, handler):
            return handler
        cached = self._wrapped.get(path)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self.wrap(path, handler)
        if len(self._wrapped) < 10_000:  # paths of served methods, a bounded set; this is only a guard
            self._wrapped[path] = (handler, wrapped)
        return wrapped


def wrap_handler(path: str, handler: Any, scope: Callable[[str, Any], CallScope]) -> grpc.RpcMethodHandler:
    """A handler of the same shape and (de)serializers as ``handler`` that runs each call in
    ``scope(path, context)``."""
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    inner: Any
    if handler.unary_unary is not None or handler.stream_unary is not None:
        streaming_request = handler.unary_unary is None
        inner = handler.stream_unary if streaming_request else handler.unary_unary

        async def unary_response(request: Any, context: Any) -> Any:
            call = scope(path, context)
            await call.started()
            try:
                call.answer = await inner(request, context)
            except BaseException as failure:
                if not await call.ended(failure):
                    raise
                return call.answer
            await call.ended(None)
            return call.answer

        if streaming_request:
            return grpc.stream_unary_rpc_method_handler(unary_response, **kwargs)
        return grpc.unary_unary_rpc_method_handler(unary_response, **kwargs)
    streaming_request = handler.unary_stream is None
    inner = handler.stream_stream if streaming_request else handler.unary_stream

    async def stream_response(request: Any, context: Any) -> AsyncIterator[Any]:
        call = scope(path, context)
        await call.started()
        try:
            async for answer in answers_of(inner(request, context)):
                yield answer
        except BaseException as failure:
            if not await call.ended(failure):
                raise
            return
        await call.ended(None)

    if streaming_request:
        return grpc.stream_stream_rpc_method_handler(stream_response, **kwargs)
    return grpc.unary_stream_rpc_method_handler(stream_response, **kwargs)


def answers_of(answers: Any) -> AsyncIterator[Any]:
    """What a streaming handler returned, as the answers to relay: its own async iterator as it is,
    or none for a handler that writes its answers itself (``context.write``) and returns, once it has."""
    if hasattr(answers, "__aiter__"):
        return answers
    return _no_answers(answers)


async def _no_answers(done: Awaitable[Any]) -> AsyncIterator[Any]:
    await done
    return
    yield  # an async generator, so that a writing handler is relayed like any other
