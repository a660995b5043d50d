"""Structured rejections (ARCHITECTURE principle 3).

A ``Rejected`` exception carries a stable ``RejectionReason``; at the gRPC edge it becomes a
``google.rpc.Status`` whose details hold a ``missionweave.v1.Rejection`` and a
``google.rpc.ErrorInfo`` so that generic gRPC tooling understands it too.
"""

from __future__ import annotations

from typing import NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from missionweave.v1 import common_pb2

R = common_pb2.RejectionReason
DOMAIN = "missionweave.v1"
_PREFIX = "REJECTION_REASON_"

_CODES: dict[int, int] = {
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
}


class Rejected(Exception):
    """A command or request refused with a stable reason; nothing was written."""

    def __init__(self, reason: common_pb2.RejectionReason.ValueType, message: str, **metadata: object) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = {k: str(v) for k, v in metadata.items()}

    @property
    def reason_name(self) -> str:
        return R.Name(self.reason).removeprefix(_PREFIX)

    def to_proto(self) -> common_pb2.Rejection:
        return common_pb2.Rejection(reason=self.reason, message=self.message, metadata=self.metadata)

    def grpc_code(self) -> grpc.StatusCode:
        return _GRPC_BY_VALUE[_CODES.get(self.reason, code_pb2.UNKNOWN)]

    def to_status(self) -> status_pb2.Status:
        rejection = any_pb2.Any()
        rejection.Pack(self.to_proto())
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason=self.reason_name, domain=DOMAIN, metadata=self.metadata))
        details = [rejection, info]
        if "retry_after_ms" in self.metadata:  # the standard detail generic gRPC retry logic reads
            delay = duration_pb2.Duration()
            delay.FromMilliseconds(int(self.metadata["retry_after_ms"]))
            retry = any_pb2.Any()
            retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
            details.append(retry)
        return status_pb2.Status(code=_CODES.get(self.reason, code_pb2.UNKNOWN), message=self.message, details=details)

    def __repr__(self) -> str:
        return f"Rejected({self.reason_name}: {self.message})"


_GRPC_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}



def from_proto(rejection: common_pb2.Rejection) -> Rejected:
    return Rejected(rejection.reason, rejection.message, **dict(rejection.metadata))


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
    await context.abort_with_status(rpc_status.to_status(rejected.to_status()))
    raise AssertionError("abort_with_status returned")
