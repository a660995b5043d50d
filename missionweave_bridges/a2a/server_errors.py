"""MWP refusals as A2A errors (docs/bridge-a2a-server.md "Errors"). A2A v1.0 has no "forbidden" or
"unavailable" error, so the A2A class says what the client can do about it and the message keeps
the MWP reason and text (``MWP <REASON>: <message>``), on both transports; JSON-RPC also carries them
as ``data`` ({"mwp_reason", "mwp_metadata"})."""

from __future__ import annotations

import grpc
from a2a.utils.errors import (
    A2AError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
)

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import common_pb2

R = common_pb2.RejectionReason

# Reads the identity may not make look exactly like a task that does not exist: a non-member learns
# nothing about a Group (the mesh answers NOT_A_MEMBER whether or not it exists).
_UNSEEN = frozenset(
    {
        R.REJECTION_REASON_NOT_A_MEMBER,
        R.REJECTION_REASON_GROUP_NOT_FOUND,
        R.REJECTION_REASON_NOT_FOUND,
        R.REJECTION_REASON_PERMISSION_DENIED,
    }
)
# The request itself is wrong: sending it again unchanged cannot succeed.
_INVALID = frozenset(
    {
        R.REJECTION_REASON_MALFORMED,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        R.REJECTION_REASON_TOO_LARGE,
        R.REJECTION_REASON_COMMAND_ID_REUSED,
    }
)
# The mesh could not answer now: the same request may succeed later (same message id: idempotent).
_TRANSIENT = frozenset(
    {
        R.REJECTION_REASON_OVERLOADED,
        R.REJECTION_REASON_PEER_UNAVAILABLE,
        R.REJECTION_REASON_NOT_OWNER,
        R.REJECTION_REASON_WRITER_FENCED,
        R.REJECTION_REASON_SESSION_EPOCH_STALE,
    }
)


def _wrapped(cls: type[A2AError], rejection: common_pb2.Rejection) -> A2AError:
    name = R.Name(rejection.reason).removeprefix("REJECTION_REASON_")
    return cls(
        f"MWP {name}: {rejection.message}",
        data={"mwp_reason": name, "mwp_metadata": dict(rejection.metadata)},
    )


def _unexplained(err: grpc.RpcError) -> A2AError:
    code = err.code() if isinstance(err, grpc.aio.AioRpcError) else None
    return InternalError(f"the mesh did not answer: {code.name if code else ''} {err}")


def for_read(err: grpc.RpcError) -> A2AError:
    """A refused read (GetTask, SubscribeToTask, ListTasks)."""
    rejection = rejection_from_rpc_error(err)
    if rejection is None:
        return _unexplained(err)
    if rejection.reason in _UNSEEN:
        return _wrapped(TaskNotFoundError, rejection)
    if rejection.reason in _INVALID:
        return _wrapped(InvalidParamsError, rejection)
    return _wrapped(InternalError, rejection)


def for_command(err: grpc.RpcError, operation: str) -> A2AError:
    """A refused command: ``operation`` is the A2A method it serves (SendMessage or CancelTask)."""
    rejection = rejection_from_rpc_error(err)
    if rejection is None:
        return _unexplained(err)
    if rejection.reason in _TRANSIENT:
        return _wrapped(InternalError, rejection)
    if operation == "CancelTask":
        # Not the Coordinator / not the MissionOwner, a finished item: the task cannot be cancelled
        # by this identity, which is what TaskNotCancelable says (the reason says why).
        return _wrapped(TaskNotCancelableError, rejection)
    if rejection.reason in _INVALID:
        return _wrapped(InvalidParamsError, rejection)
    if rejection.reason in (R.REJECTION_REASON_NOT_A_MEMBER, R.REJECTION_REASON_GROUP_NOT_FOUND):
        return _wrapped(TaskNotFoundError, rejection)
    return _wrapped(InvalidRequestError, rejection)
