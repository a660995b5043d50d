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

from missionweave.errors import DOMAIN, R, Rejected
from missionweave.v1 import common_pb2

log = logging.getLogger("missionweave.rpc")

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
}

_GRPC_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


def grpc_code(rejected: Rejected) -> grpc.StatusCode:
    return _GRPC_BY_VALUE[CODES.get(rejected.reason, code_pb2.UNKNOWN)]


def to_status(rejected: Rejected) -> status_pb2.Status:
    rejection = any_pb2.Any()
    rejection.Pack(rejected.to_proto())
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=rejected.reason_name, domain=DOMAIN, metadata=rejected.metadata))
    details = [rejection, info]
    if "retry_after_ms" in rejected.metadata:  # the standard detail generic gRPC retry logic reads
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(rejected.metadata["retry_after_ms"]))
        retry = any_pb2.Any()
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(retry)
    return status_pb2.Status(code=CODES.get(rejected.reason, code_pb2.UNKNOWN), message=rejected.message, details=details)


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
    return Rejected(R.REJECTION_REASON_PEER_UNAVAILABLE, message, peer=peer, retry_after_ms=PEER_RETRY_AFTER_MS)


def rejection_from_rpc_error(err: grpc.RpcError) -> common_pb2.Rejection | None:
    """Client side: the Rejection inside a failed call's google.rpc.Status, if any."""
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(common_pb2.Rejection.DESCRIPTOR):
            out = common_pb2.Rejection()
            detail.Unpack(out)
            return out
    return None


async def abort_with(context: grpc.aio.ServicerContext, rejected: Rejected) -> NoReturn:  # type: ignore[type-arg]
    """Ends the RPC with the rejection as its google.rpc.Status (abort_with_status always raises)."""
    await context.abort_with_status(rpc_status.to_status(to_status(rejected)))
    raise AssertionError("abort_with_status returned")


def _log_rejection(service: str, method: str, rejected: Rejected) -> None:
    log.info(
        "request rejected",
        extra={"rpc": f"{service}.{method}", "reason": rejected.reason_name, "detail": rejected.message, **rejected.metadata},
    )


def unary_edge(service: str, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:  # type: ignore[type-arg]
        try:
            return await method(self, request, context)
        except Rejected as rejected:
            _log_rejection(service, name, rejected)
            await abort_with(context, rejected)

    return handler


def streaming_edge(service: str, name: str, method: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # type: ignore[type-arg]
        try:
            async for response in method(self, request, context):
                yield response
        except Rejected as rejected:
            _log_rejection(service, name, rejected)
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
