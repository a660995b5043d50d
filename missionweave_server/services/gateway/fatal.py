"""Fatal refusals of a stream: the ERROR frame after which the gateway ends it.

A ``Fatal`` is raised wherever a stream cannot go on (no HELLO, a proof that does not verify, a
replaced session, a limit reached) and carries everything its ending needs: the gateway's error
code, the general Rejection reason that code stands for, and whether the stream also ends with that
Rejection as its gRPC status (limits and replaced sessions) rather than OK. ``error_frame`` is the
frame that says so. It is its own module because HELLO, the stream's reader, the per-identity limits
and the servicer all raise or send it.
"""

from __future__ import annotations

from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.services.gateway import limits

R = common_pb2.RejectionReason
E = pb.GatewayErrorCode

# Each fatal code's general reason (the Rejection in its ERROR frame).
_FATAL_REASONS: dict[int, R.ValueType] = {
    E.GATEWAY_ERROR_CODE_HELLO_INVALID: R.REJECTION_REASON_SIGNATURE_INVALID,
    E.GATEWAY_ERROR_CODE_SESSION_STALE: R.REJECTION_REASON_SESSION_EPOCH_STALE,
    E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED: R.REJECTION_REASON_OVERLOADED,
}


class Fatal(Exception):
    """A fatal ERROR frame: the stream ends after it. ``status``: it also ends with the Rejection as
    its gRPC status (limits: RESOURCE_EXHAUSTED), not OK."""

    def __init__(self, code: int, message: str, *, status: bool = False, **metadata: object) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        reason = _FATAL_REASONS.get(code, R.REJECTION_REASON_FRAME_OUT_OF_ORDER)
        self.rejected = Rejected(reason, message, **metadata)


def over_limit(message: str, limit: int, scope: str) -> Fatal:
    return Fatal(
        E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED,
        message,
        status=True,
        limit=limit,
        scope=scope,
        retry_after_ms=limits.LIMIT_RETRY_AFTER_MS,
    )


def error_frame(fatal: Fatal) -> pb.ErrorFrame:
    return pb.ErrorFrame(rejection=fatal.rejected.to_proto(), code=E.ValueType(fatal.code), fatal=True)
