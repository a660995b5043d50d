"""A channel over several SchedulingService replicas: each call goes to the replica of its Worker.

A Worker's scheduler keeps its slots and placements in memory (D89), so every call about one Worker
must reach the same replica. The Worker is the caller its call proof names, or the ``worker_id`` a
MissionOwner or Organization policy names in SetPriority. The proof is read here without being
checked: routing only decides where the replica checks it, and a forged claim reaches a replica
that refuses it. Replicas are ranked per Worker by rendezvous hashing (losing one moves only its
Workers); a replica that does not answer is skipped for the next in the Worker's order, which
rebuilds the Worker's queues from the stored projections.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import auth_pb2, common_pb2
from missionweave.v1 import scheduling_service_pb2 as pb
from missionweave_server.edge.callers import CALL_PROOF_METADATA
from missionweave_server.edge.shards import FailoverStream, rendezvous

_SET_PRIORITY = "/missionweave.v1.SchedulingService/SetPriority"


def worker_of(method: str, request: bytes | Any, metadata: Sequence[tuple[str, Any]] | None) -> str:
    """The Worker a SchedulingService call is about ("" when the call names none: any replica)."""
    if method == _SET_PRIORITY:
        with contextlib.suppress(DecodeError):
            message = pb.SetPriorityRequest.FromString(request) if isinstance(request, bytes) else request
            if message.worker_id:
                return str(message.worker_id)
    proof = next((v for k, v in metadata or () if k == CALL_PROOF_METADATA), None)
    if proof is None:
        return ""
    with contextlib.suppress(DecodeError):
        envelope = common_pb2.SignedEnvelope.FromString(proof if isinstance(proof, bytes) else proof.encode())
        return str(auth_pb2.CallProof.FromString(envelope.payload).identity_id)
    return ""


class WorkerAffinityChannel:
    """Unary calls only (every SchedulingService RPC is unary), as messages or as raw bytes."""

    def __init__(self, addresses: Sequence[str], channel_for: Callable[[str], Any]) -> None:
        if not addresses:
            raise ValueError("at least one replica address")
        self.addresses = list(addresses)
        self._channel_for = channel_for

    def order(self, worker_id: str) -> list[str]:
        return rendezvous(worker_id, self.addresses) if worker_id else list(self.addresses)

    def unary_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **_: Any
    ) -> Callable[..., Any]:
        async def call(request: Any, *, metadata: Any = None, **kw: Any) -> Any:
            last: grpc.aio.AioRpcError | None = None
            for address in self.order(worker_of(method, request, metadata)):
                stub = self._channel_for(address).unary_unary(
                    method, request_serializer, response_deserializer
                )
                try:
                    return await stub(request, metadata=metadata, **kw)
                except grpc.aio.AioRpcError as err:
                    unanswered = err.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    )
                    if not unanswered or rejection_from_rpc_error(err) is not None:
                        raise
                    last = err  # that replica is down: the next in the Worker's order
            assert last is not None
            raise last

        return call

    def unary_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **_: Any
    ) -> Callable[..., Any]:
        """A health watch (SchedulingService has no streams): the first replica that answers."""

        def call(request: Any, **kw: Any) -> FailoverStream:
            def open_at(address: str) -> Any:
                return self._channel_for(address).unary_stream(
                    method, request_serializer, response_deserializer
                )(request, **kw)

            return FailoverStream(self.order(""), open_at, lambda _: None)

        return call

    def _unsupported(self, method: str, *_: Any, **__: Any) -> Callable[..., Any]:
        def refuse(*_: Any, **__: Any) -> Any:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNIMPLEMENTED, grpc.aio.Metadata(), grpc.aio.Metadata(), details=method
            )

        return refuse

    stream_unary = stream_stream = _unsupported
