"""The gateway's side of its calls to the Group Authority: how long it waits, and what the agent is
told when the Authority refuses or does not answer.

Every call the gateway makes for an agent (a FollowGroup stream per subscription or per Group,
FetchEvents, GetMemberSnapshot, ExecuteCommand) is bounded by ``PEER_TIMEOUT_S`` or
``COMMAND_TIMEOUT_S``, read from this module when the call is made (so a test may lower them), and a
failure becomes a ``PeerRefused``: the ERROR frame's code (the Authority's Rejection mapped to the
gateway's codes, or AUTHORITY_UNAVAILABLE with retry information when nobody answered). Kept apart
from the stream so subscriptions, the shared follows (``fanout.py``), FETCH and COMMAND share one
mapping.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from missionweave.internal.v1 import group_log_pb2 as glpb
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.edge.status import owner_unreachable, peer_unavailable

R = common_pb2.RejectionReason
E = pb.GatewayErrorCode

# Longest the gateway waits for the Authority: a unary answer (FETCH, GetSnapshot) or the first
# answer of a FollowGroup stream; a COMMAND (which waits for its commit) a little longer, still
# below the SDK's own 30 s. A peer that is down answers UNAVAILABLE at once; these bound a peer
# that does not answer at all. Past them the agent gets AUTHORITY_UNAVAILABLE, never a hang.
PEER_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 20.0


class PeerRefused(Exception):
    """The Authority refused a request, or could not be reached: the ERROR frame to answer with."""

    def __init__(self, code: int, rejection: common_pb2.Rejection) -> None:
        super().__init__(rejection.message)
        self.code = code
        self.rejection = rejection


async def open_follow(group_log: Any, request: glpb.FollowGroupRequest) -> tuple[Any, glpb.FollowStarted]:
    """Open a FollowGroup stream and read its first answer (bounded: PEER_TIMEOUT_S)."""
    call = group_log.FollowGroup(request)
    try:
        async with asyncio.timeout(PEER_TIMEOUT_S):
            first = await call.read()
    except TimeoutError:
        call.cancel()
        raise PeerRefused(
            E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
            unavailable_rejection(f"the Group Authority did not answer within {PEER_TIMEOUT_S:g} s"),
        ) from None
    except grpc.aio.AioRpcError as err:
        call.cancel()
        raise refusal(err) from None
    except BaseException:
        call.cancel()
        raise
    if first is grpc.aio.EOF or first.WhichOneof("response") != "started":
        call.cancel()
        raise PeerRefused(
            E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
            unavailable_rejection("the Group Authority ended the stream without starting it"),
        )
    return call, first.started


def refusal(err: grpc.aio.AioRpcError) -> PeerRefused:
    """The ERROR frame for a failed GroupLogService call: the Authority's Rejection mapped to the
    gateway's codes, or AUTHORITY_UNAVAILABLE when no Authority answered."""
    rejection = rejection_from_rpc_error(err)
    if rejection is None:
        return PeerRefused(
            E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
            unavailable_rejection(f"the Group Authority is unreachable ({err.code().name}: {err.details()})"),
        )
    if rejection.reason == R.REJECTION_REASON_NOT_OWNER:  # the owner's address is the mesh's own
        return PeerRefused(E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE, owner_unreachable().to_proto())
    if rejection.metadata.get("field") == "context_package":
        code = E.GATEWAY_ERROR_CODE_CONTEXT_PACKAGE_INVALID
    elif rejection.reason in (R.REJECTION_REASON_NOT_A_MEMBER, R.REJECTION_REASON_GROUP_NOT_FOUND):
        code = E.GATEWAY_ERROR_CODE_NOT_A_MEMBER
    elif rejection.reason == R.REJECTION_REASON_TOO_LARGE:
        code = E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED
    elif rejection.reason in (R.REJECTION_REASON_OVERLOADED, R.REJECTION_REASON_PEER_UNAVAILABLE):
        code = E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE
    else:
        code = E.GATEWAY_ERROR_CODE_MALFORMED_FRAME
    return PeerRefused(code, rejection)


def unavailable_only(refused: PeerRefused) -> common_pb2.Rejection | None:
    """ERROR frames keep their usual general reason, except AUTHORITY_UNAVAILABLE, which carries the
    retry information."""
    return refused.rejection if refused.code == E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE else None


def unavailable_rejection(message: str) -> common_pb2.Rejection:
    """AUTHORITY_UNAVAILABLE's general reason: PEER_UNAVAILABLE (retry with backoff), with retry_after_ms."""
    return peer_unavailable("authority", message).to_proto()
