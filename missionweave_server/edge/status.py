"""The gRPC edge of every service: a ``Rejected`` becomes a ``google.rpc.Status`` here, and only here.

The status's details hold a ``missionweave.v1.Rejection`` and a ``google.rpc.ErrorInfo`` (plus a
``google.rpc.RetryInfo`` when the rejection names a retry delay) so that generic gRPC tooling
understands it too. ``rejections_as_status`` wraps a servicer class so its methods simply raise
``Rejected``; clients read the Rejection back with ``rejection_from_rpc_error``.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from missionweave.kernel.errors import DOMAIN, R, Rejected
from missionweave.kernel.logs import RateLimitedLog
from missionweave_server.edge.handler_wrapping import WrappingInterceptor
from missionweave_server.observability import metrics

# Re-exported for the importers of its old place; clients import it from missionweave.kernel.rejections.

log = logging.getLogger("missionweave_server.edge")

CODES: dict[int, int] = {
    R.REJECTION_REASON_MALFORMED: code_pb2.INVALID_ARGUMENT,
    R.REJECTION_REASON_UNKNOWN_COMMAND_KIND: code_pb2.INVALID_ARGUMENT,
    R.REJECTION_REASON_COMMAND_NOT_IMPLEMENTED: code_pb2.UNIMPLEMENTED,
    R.REJECTION_REASON_SIGNATURE_MISSING: code_pb2.UNAUTHENTICATED,
    R.REJECTION_REASON_SIGNATURE_INVALID: code_pb2.UNAUTHENTICATED,
    R.REJECTION_REASON_UNKNOWN_IDENTITY: code_pb2.UNAUTHENTICATED,
    R.REJECTION_REASON_SESSION_NOT_OPEN: code_pb2.UNAUTHENTICATED,
    R.REJECTION_REASON_SESSION_EPOCH_STALE: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_NOT_A_MEMBER: code_pb2.PERMISSION_DENIED,
    R.REJECTION_REASON_PERMISSION_DENIED: code_pb2.PERMISSION_DENIED,
    R.REJECTION_REASON_REVISION_MISMATCH: code_pb2.ABORTED,
    R.REJECTION_REASON_TOO_LARGE: code_pb2.RESOURCE_EXHAUSTED,
    R.REJECTION_REASON_COMMAND_ID_REUSED: code_pb2.ALREADY_EXISTS,
    R.REJECTION_REASON_GROUP_NOT_FOUND: code_pb2.NOT_FOUND,
    R.REJECTION_REASON_GROUP_EXISTS: code_pb2.ALREADY_EXISTS,
    R.REJECTION_REASON_INVALID_ARGUMENT: code_pb2.INVALID_ARGUMENT,
    R.REJECTION_REASON_CHILD_BUDGET_EXCEEDS_PARENT: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_CHILD_DEADLINE_EXCEEDS_PARENT: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_CHILD_SCOPE_EXCEEDS_PARENT: code_pb2.PERMISSION_DENIED,
    R.REJECTION_REASON_CHILD_AUTHORITY_EXCEEDS_PARENT: code_pb2.PERMISSION_DENIED,
    R.REJECTION_REASON_DEPTH_APPROVAL_REQUIRED: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_MISSION_CYCLE: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_INVALID_TRANSITION: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_COORDINATOR_EPOCH_STALE: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_LEASE_STALE: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_LEASE_EXPIRED: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_OFFER_EXPIRED: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_BUDGET_EXCEEDED: code_pb2.RESOURCE_EXHAUSTED,
    R.REJECTION_REASON_DEPENDENCY_CYCLE: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_CLOCK_SKEW: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_NOT_OWNER: code_pb2.UNAVAILABLE,
    R.REJECTION_REASON_WRITER_FENCED: code_pb2.ABORTED,
    R.REJECTION_REASON_UNSUPPORTED_CRITICAL_EXTENSION: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_IDENTITY_EXISTS: code_pb2.ALREADY_EXISTS,
    R.REJECTION_REASON_OVERLOADED: code_pb2.RESOURCE_EXHAUSTED,
    R.REJECTION_REASON_NOT_FOUND: code_pb2.NOT_FOUND,
    R.REJECTION_REASON_DIGEST_MISMATCH: code_pb2.INVALID_ARGUMENT,
    R.REJECTION_REASON_DATA_CORRUPTED: code_pb2.DATA_LOSS,
    R.REJECTION_REASON_CURSOR_TOO_OLD: code_pb2.OUT_OF_RANGE,
    R.REJECTION_REASON_FRAME_OUT_OF_ORDER: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_TERMINAL_STATE: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_RECONCILIATION_REQUIRED: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_PRECONDITION_FAILED: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_PEER_UNAVAILABLE: code_pb2.UNAVAILABLE,
    R.REJECTION_REASON_UNAUTHENTICATED: code_pb2.UNAUTHENTICATED,
    R.REJECTION_REASON_QUOTA_EXCEEDED: code_pb2.RESOURCE_EXHAUSTED,
    R.REJECTION_REASON_GRANT_INVALID: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_OUTSIDE_GRANT: code_pb2.PERMISSION_DENIED,
    R.REJECTION_REASON_OFFLINE_KIND_NOT_BUFFERABLE: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_OFFLINE_BINDING_INVALID: code_pb2.INVALID_ARGUMENT,
    R.REJECTION_REASON_OFFLINE_LEASE_UNKNOWN: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_OFFLINE_OUTSIDE_WINDOW: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_OFFLINE_AFTER_LEASE_END: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_OFFLINE_AFTER_OWNERSHIP_CHANGE: code_pb2.FAILED_PRECONDITION,
    R.REJECTION_REASON_OFFLINE_OUTSIDE_CONVERSATION: code_pb2.PERMISSION_DENIED,
}

_GRPC_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


def status_code(rejected: Rejected) -> int:
    """The google.rpc code of a rejection: its reason's, except that an unregistered identity the
    request names (metadata ``field`` says where) is NOT_FOUND; UNAUTHENTICATED is for an unknown
    signer or actor, whose credentials are what failed (common.proto UNKNOWN_IDENTITY). Decided
    by reason and metadata, so a rejection passed on by another service keeps its code."""
    if rejected.reason == R.REJECTION_REASON_UNKNOWN_IDENTITY and "field" in rejected.metadata:
        return code_pb2.NOT_FOUND
    return CODES.get(rejected.reason, code_pb2.UNKNOWN)


def grpc_code(rejected: Rejected) -> grpc.StatusCode:
    return _GRPC_BY_VALUE[status_code(rejected)]


def to_status(rejected: Rejected) -> status_pb2.Status:
    rejection = any_pb2.Any()
    rejection.Pack(rejected.to_proto())
    info = any_pb2.Any()
    info.Pack(
        error_details_pb2.ErrorInfo(reason=rejected.reason_name, domain=DOMAIN, metadata=rejected.metadata)
    )
    details = [rejection, info]
    if "retry_after_ms" in rejected.metadata:  # the standard detail generic gRPC retry logic reads
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(rejected.metadata["retry_after_ms"]))
        retry = any_pb2.Any()
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(retry)
    return status_pb2.Status(code=status_code(rejected), message=rejected.message, details=details)


# How long a caller should wait before retrying a request whose peer did not answer.
PEER_RETRY_AFTER_MS = 1000


def peer_unavailable(peer: str, why: grpc.RpcError | str) -> Rejected:
    """A peer service's failure as the caller's own structured, retryable rejection (never a hang:
    every peer call has a deadline, and its DEADLINE_EXCEEDED or UNAVAILABLE ends up here). ``why``
    is the failed call, or the reason there was no call (no address configured, no answer)."""
    if isinstance(why, str):
        message = why
    else:
        code = why.code() if isinstance(why, grpc.aio.AioRpcError) else None
        message = f"the {peer} service did not answer ({code.name if code is not None else 'UNKNOWN'}); retry shortly"
    return Rejected(
        R.REJECTION_REASON_PEER_UNAVAILABLE, message, peer=peer, retry_after_ms=PEER_RETRY_AFTER_MS
    )


def owner_unreachable(group_id: str = "") -> Rejected:
    """What a caller is told while the shard that writes its Group cannot be reached (down, or the
    Group between owners): PEER_UNAVAILABLE with retry_after_ms. Which shard, and where, is the
    mesh's own business: an internal address helps no caller and names a pod or host to everyone."""
    group = f"Group {group_id}" if group_id else "the Group"
    return peer_unavailable(
        "authority", f"the Authority shard that writes {group} cannot be reached now; retry"
    )


async def abort_with(context: grpc.aio.ServicerContext, rejected: Rejected) -> NoReturn:  # type: ignore[type-arg]
    """Ends the RPC with the rejection as its google.rpc.Status (abort_with_status always raises)."""
    await context.abort_with_status(rpc_status.to_status(to_status(rejected)))
    raise AssertionError("abort_with_status returned")


def log_rejection(service: str, method: str, rejected: Rejected) -> None:
    """Counts and logs a rejection at a service's edge: one answered as a status (below), or one
    answered in band (a command of ExecuteCommandBatch or ExecuteCommandStream)."""
    metrics.REJECTIONS.labels(service, rejected.reason_name).inc()
    if isinstance(rejected, MalformedRequest):
        return  # logged once, rate limited, where it was found (``MalformedRequest.__init__``)
    rpc = f"{service}.{method}"
    fields = {
        "rpc": rpc,
        "reason": rejected.reason_name,
        "detail": rejected.message,
        **rejected.metadata,
        **rejected.log_context,
    }
    if rejected.reason == R.REJECTION_REASON_OVERLOADED:
        # A caller held to its rate (a Group's command rate, a stream's limits) may send hundreds a
        # second into the refusal: one line per RPC and Group per interval, carrying how many were
        # not logged (each is counted above).
        overload_log.log(
            logging.INFO, f"{rpc} {rejected.log_context.get('group_id', '')}", "request rejected", **fields
        )
        return
    log.info("request rejected", extra=fields)


def unary_edge(service: str, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:  # type: ignore[type-arg]
        try:
            return await method(self, request, context)
        except Rejected as rejected:
            log_rejection(service, name, rejected)
            await abort_with(context, rejected)

    return handler


def streaming_edge(service: str, name: str, method: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # type: ignore[type-arg]
        try:
            async for response in method(self, request, context):
                yield response
        except Rejected as rejected:
            log_rejection(service, name, rejected)
            await abort_with(context, rejected)

    return handler


S = TypeVar("S", bound=type)


def rejections_as_status(cls: S) -> S:
    """Class decorator for a servicer: each RPC method (CamelCase, as the generated base names them)
    answers a raised ``Rejected`` with its google.rpc.Status; any other exception is left to gRPC
    (UNKNOWN, logged by the server), never turned into a made-up reason."""
    service = cls.__name__.removesuffix("Servicer")
    for name, method in list(vars(cls).items()):
        if not name[:1].isupper() or not callable(method):
            continue
        if inspect.isasyncgenfunction(method):
            setattr(cls, name, streaming_edge(service, name, method))
        elif inspect.iscoroutinefunction(method):
            setattr(cls, name, unary_edge(service, name, method))
    return cls


# ------------------------------------------------------------ requests that do not parse

# A malformed request is logged at warning level at most once per this many seconds per RPC; the
# next record says how many were not logged in between.
MALFORMED_LOG_INTERVAL_S = 10.0
# The same for OVERLOADED refusals, per RPC and Group.
OVERLOAD_LOG_INTERVAL_S = 10.0


malformed_log = RateLimitedLog(MALFORMED_LOG_INTERVAL_S, log)
overload_log = RateLimitedLog(OVERLOAD_LOG_INTERVAL_S, log)


class MalformedRequest(Rejected):
    """A request (or one message of a stream) that is not the RPC's request message: answered
    INVALID_ARGUMENT with reason MALFORMED. Logged here, once, at warning level and rate limited;
    never with a traceback (garbage from a client is not a server error)."""

    def __init__(self, rpc: str, message: str) -> None:
        super().__init__(R.REJECTION_REASON_MALFORMED, message, rpc=rpc)
        malformed_log.warning(rpc, "malformed request refused", rpc=rpc, detail=message)


def parse_request(rpc: str, parse: Callable[[bytes], Any], raw: bytes) -> Any:
    """The request message of ``raw`` bytes, or MalformedRequest."""
    try:
        return parse(raw)
    except Exception as err:  # DecodeError, and whatever else a parser raises on garbage
        raise MalformedRequest(
            rpc, f"the request is not a valid message of this RPC ({type(err).__name__})"
        ) from None


async def _parsed(rpc: str, parse: Callable[[bytes], Any], raw: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    async for message in raw:
        yield parse_request(rpc, parse, message)


class RequestParsing(WrappingInterceptor):
    """Every request message is parsed here rather than by gRPC, for every RPC of the server.

    gRPC parses a request before the servicer runs; a request that does not parse never reaches it,
    and gRPC answers UNKNOWN and logs a traceback at error level. This interceptor hands each
    method's handler to gRPC with a bytes-in deserializer, and parses in the handler instead, with
    the method's own deserializer: a unary request that does not parse is answered INVALID_ARGUMENT
    (a MALFORMED Rejection in the google.rpc.Status) before the servicer runs; in a request stream,
    the message that does not parse raises ``MalformedRequest`` in the servicer's ``async for``, which
    its edge (``rejections_as_status``) answers the same way, ending the stream. A ``Rejected`` that a
    servicer without an edge lets through (health, reflection) is answered as its status too.

    Handlers that already take bytes (the front door's, which forwards them) are left as they are:
    the peer that serves the method parses them. In process (``LocalChannel``) messages are handed
    over as objects and never parsed at all.
    """

    def __init__(self) -> None:
        super().__init__()
        quiet_calls_ended_by_the_client()

    def wraps(self, path: str, handler: grpc.RpcMethodHandler) -> bool:
        return handler.request_deserializer is not None

    def wrap(self, path: str, handler: Any) -> grpc.RpcMethodHandler:
        return _parsing_handler(path, handler)


_GRPC_CORE_LOG = "grpc._cython.cygrpc"
_ENDED_UNDER_A_WRITE = "ExecuteBatchError raised in core by servicer method"


class _CallEndedByTheClient(logging.Filter):
    """gRPC's report of a send that failed because the call had ended (the client cancelled it or
    went away) while a streaming handler was answering: grpc.aio ignores that failure once it has
    seen the client close the call, but reports it at ERROR, with a traceback, when the failed send
    is seen first (a race: a stream paused on a client that does not read, then cancelled, hits it
    every time). A client going away is a normal event: the call's access-log line (CANCELLED) is
    its one line, and this report is kept at DEBUG, as gRPC logs a cancelled call itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.getMessage().startswith(_ENDED_UNDER_A_WRITE):
            method = record.getMessage().rpartition("[")[2].rstrip("]")
            record.msg, record.args = "call ended by the client while it was answered [%s]", (method,)
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            record.exc_info, record.exc_text = None, None
            return logging.getLogger(_GRPC_CORE_LOG).isEnabledFor(
                logging.DEBUG
            )  # a filter runs past the level check
        return True


def quiet_calls_ended_by_the_client() -> None:
    """Installs ``_CallEndedByTheClient`` on gRPC's core logger, once."""
    core = logging.getLogger(_GRPC_CORE_LOG)
    if not any(isinstance(f, _CallEndedByTheClient) for f in core.filters):
        core.addFilter(_CallEndedByTheClient())


def _parsing_handler(path: str, handler: Any) -> grpc.RpcMethodHandler:
    """``handler`` with a bytes-in deserializer, parsing in its behaviour (the stubs type handlers as
    sync gRPC's; these are grpc.aio's coroutines and async generators)."""
    parse: Callable[[bytes], Any] = handler.request_deserializer
    serialize = handler.response_serializer
    inner: Any
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:  # type: ignore[type-arg]
            try:
                request = parse_request(path, parse, raw)
            except MalformedRequest as malformed:  # the servicer's edge never saw it: counted here
                metrics.REJECTIONS.labels(_service_of(path), malformed.reason_name).inc()
                await abort_with(context, malformed)
            try:
                return await inner(request, context)
            except Rejected as rejected:
                await abort_with(context, rejected)
            except NotImplementedError:
                await _unimplemented(context, path)

        return grpc.unary_unary_rpc_method_handler(unary_unary, response_serializer=serialize)
    if handler.stream_unary is not None:
        inner = handler.stream_unary

        async def stream_unary(raw: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:  # type: ignore[type-arg]
            try:
                return await inner(_parsed(path, parse, raw), context)
            except Rejected as rejected:
                await abort_with(context, rejected)
            except NotImplementedError:
                await _unimplemented(context, path)

        return grpc.stream_unary_rpc_method_handler(stream_unary, response_serializer=serialize)
    if handler.unary_stream is not None:
        inner = handler.unary_stream

        async def unary_stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # type: ignore[type-arg]
            try:
                async for answer in _answers(inner(parse_request(path, parse, raw), context)):
                    yield answer
            except Rejected as rejected:
                await abort_with(context, rejected)
            except NotImplementedError:
                await _unimplemented(context, path)

        return grpc.unary_stream_rpc_method_handler(unary_stream, response_serializer=serialize)
    inner = handler.stream_stream

    async def stream_stream(
        raw: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:  # type: ignore[type-arg]
        try:
            async for answer in _answers(inner(_parsed(path, parse, raw), context)):
                yield answer
        except Rejected as rejected:
            await abort_with(context, rejected)
        except NotImplementedError:
            await _unimplemented(context, path)

    return grpc.stream_stream_rpc_method_handler(stream_stream, response_serializer=serialize)


def _service_of(path: str) -> str:
    """'/missionweave.v1.AuthorityService/Execute' -> 'Authority' (as ``rejections_as_status`` names it)."""
    return (
        path.split("/")[1].rsplit(".", 1)[-1].removesuffix("Service") if path.count("/") == 2 else "unknown"
    )


async def _unimplemented(context: grpc.aio.ServicerContext, path: str) -> None:  # type: ignore[type-arg]
    """The generated base servicer's answer for a method not implemented (it raises
    NotImplementedError, which gRPC would log as a servicer failure, with a traceback)."""
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{path} is not implemented")


async def _answers(answers: Any) -> AsyncIterator[Any]:
    """A streaming method's answers: an async generator's, or none from one that writes them itself
    (``context.write``) and returns."""
    if hasattr(answers, "__aiter__"):
        async for answer in answers:
            yield answer
    else:
        await answers
