"""The SDK's exceptions that more than one of its modules raises or catches: the root ``AgentError``,
and the gateway's and the Authority's refusals as they come back over the stream (``GatewayError``,
``CommandRejected``). They live apart so that the file helpers, the subscription, the command path
and the connection loop can share them without importing the agent, which imports all of those
(``missionweave.sdk.agent`` re-exports them). Errors of one concern stay with it (``NotVerified``
in event_verification, ``SubscriptionFailed`` in subscription, ``SessionReplaced`` in sessions)."""

from __future__ import annotations

from typing import Any

import grpc

from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb

E = pb.GatewayErrorCode
R = common_pb2.RejectionReason


class AgentError(Exception):
    """Base class of every error the SDK raises."""


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:  # a value newer than this client's protos
        return str(value)


class CommandRejected(AgentError):
    """The Authority refused a command (RESULT with a Rejection); nothing was written.

    ``rejection`` is the ``missionweave.v1.Rejection``; ``reason_name`` its reason without the prefix,
    e.g. ``"MEMBERSHIP_EPOCH_STALE"``.
    """

    def __init__(self, command_id: str, rejection: common_pb2.Rejection) -> None:
        self.command_id = command_id
        self.rejection = rejection
        self.reason = rejection.reason
        self.reason_name = _enum_name(R, rejection.reason, "REJECTION_REASON_")
        super().__init__(f"{self.reason_name}: {rejection.message}")


class GatewayError(AgentError):
    """An ERROR frame from the gateway; ``code`` is its ``GatewayErrorCode``."""

    def __init__(self, frame: pb.ErrorFrame) -> None:
        self.frame = frame
        self.code = frame.code
        self.fatal = frame.fatal
        super().__init__(f"{_enum_name(E, frame.code, 'GATEWAY_ERROR_CODE_')}: {frame.rejection.message}")


def describe(err: BaseException) -> str:
    """An error in a log line: a gRPC status by its code and details, anything else by its message."""
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {err.details()}"
    return str(err) or type(err).__name__
