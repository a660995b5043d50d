"""The console's gRPC relay: a request's serialised protobuf in, the response's out.

Only the public methods a person's console uses are relayed (``METHODS``); the relay neither parses
nor signs anything. A refused call comes back as JSON naming the gRPC code, the message and the
Rejection inside the google.rpc.Status (base64 of its protobuf), which the page decodes and shows in
words. A server-streaming call comes back as frames: one flag byte (0 a message, 1 the trailer),
a 4-byte big-endian length, then the bytes (the trailer is the same JSON as a unary refusal, or
``{"ok": true}``).
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass
from typing import Any

import grpc

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import CALL_PROOF_METADATA

# The unary methods the console may call, and the server-streaming ones (True).
METHODS: dict[str, bool] = {
    "/missionweave.v1.AuthorityService/ExecuteCommand": False,
    "/missionweave.v1.AuthorityService/ReadEvents": True,
    "/missionweave.v1.AuthorityService/GetGroupState": False,
    "/missionweave.v1.AuthorityService/GetAuthorityKey": False,
    "/missionweave.v1.AuthorityService/GetSignedGroupSummary": False,
    "/missionweave.v1.AuthorityService/GetMissionProgress": False,
    "/missionweave.v1.AuthorityService/GetMissionTree": False,
    "/missionweave.v1.AuthorityService/GetWorkItem": False,
    "/missionweave.v1.AuthorityService/ListWorkItems": False,
    "/missionweave.v1.AuthorityService/ListMissions": False,
    "/missionweave.v1.AuthorityService/GetMissionReview": False,
    "/missionweave.v1.MembershipService/OpenSession": False,
    "/missionweave.v1.MembershipService/GetIdentity": False,
    "/missionweave.v1.MembershipService/ListMemberships": False,
    "/missionweave.v1.ArtifactService/Download": True,
    "/missionweave.v1.ArtifactService/Stat": False,
    "/missionweave.v1.ArtifactService/GetManifest": False,
    "/missionweave.v1.ArtifactService/QueryProvenance": False,
}

MESSAGE_FRAME = 0
TRAILER_FRAME = 1


def _identity(data: bytes) -> bytes:
    return data


@dataclass(frozen=True)
class Refusal:
    """A failed call as the page reads it."""

    code: str
    message: str
    rejection: bytes | None = None

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.rejection is not None:
            out["rejection"] = base64.b64encode(self.rejection).decode("ascii")
        return out


def refusal_of(err: grpc.RpcError) -> Refusal:
    code = err.code() if isinstance(err, grpc.aio.AioRpcError) else grpc.StatusCode.UNKNOWN
    message = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err)
    rejection = rejection_from_rpc_error(err)
    return Refusal(
        code.name if code is not None else "UNKNOWN",
        message or "",
        rejection.SerializeToString() if rejection is not None else None,
    )


def frame(flag: int, payload: bytes) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def trailer(refusal: Refusal | None) -> bytes:
    document = {"ok": True} if refusal is None else refusal.document()
    return frame(TRAILER_FRAME, json.dumps(document).encode())


class Relay:
    """Calls ``channel`` (this mesh's own public listener) with the page's bytes."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    @staticmethod
    def metadata(call_proof: bytes | None) -> tuple[tuple[str, bytes], ...]:
        return ((CALL_PROOF_METADATA, call_proof),) if call_proof else ()

    async def unary(self, method: str, request: bytes, call_proof: bytes | None, deadline_s: float) -> bytes:
        call = self.channel.unary_unary(method, request_serializer=_identity, response_deserializer=_identity)
        response: bytes = await call(request, metadata=self.metadata(call_proof), timeout=deadline_s)
        return response

    def stream(self, method: str, request: bytes, call_proof: bytes | None) -> Any:
        call = self.channel.unary_stream(
            method, request_serializer=_identity, response_deserializer=_identity
        )
        return call(request, metadata=self.metadata(call_proof))
