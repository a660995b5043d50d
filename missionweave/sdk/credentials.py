"""Call proofs from the client side: every call that needs one gets a fresh ``CallProof`` signed by
the caller's current session key in its ``mwp-call-proof-bin`` metadata (missionweave/v1/auth.proto).

``CallProofs`` gives client interceptors for the unary and one-way streaming call shapes: put it on a channel, then set
``signer`` once a session is open (calls made before carry no proof, and the ones that need it are
refused UNAUTHENTICATED). Calls whose requests are signed themselves carry no proof.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

import grpc
from nacl.signing import SigningKey

from missionweave.kernel.clock import Clock, SystemClock, to_timestamp
from missionweave.kernel.signing import CALL_PROOF_METADATA, CALL_PROOF_TYPE, session_key_id, sign_envelope
from missionweave.v1 import auth_pb2

# Signed requests (or public calls): a proof would cost a signature and prove nothing more.
NO_PROOF = frozenset(
    {
        "/missionweave.v1.AuthorityService/ExecuteCommand",
        "/missionweave.v1.AuthorityService/ExecuteCommandStream",
        "/missionweave.v1.AuthorityService/ExecuteCommandBatch",
        "/missionweave.v1.AuthorityService/GetAuthorityKey",
        "/missionweave.v1.MembershipService/RegisterIdentity",
        "/missionweave.v1.MembershipService/OpenSession",
        "/missionweave.v1.GatewayService/Connect",
        "/missionweave.v1.GatewayService/GetSnapshot",
    }
)


class Session(Protocol):
    identity_id: str
    session_epoch: int
    key: SigningKey


def call_proof(session: Session, method: str, audience: str, clock: Clock | None = None) -> bytes:
    """A serialised SignedEnvelope over a fresh CallProof for one call of ``method``."""
    proof = auth_pb2.CallProof(
        identity_id=session.identity_id,
        session_epoch=session.session_epoch,
        method=method,
        audience=audience,
        issued_at=to_timestamp((clock or SystemClock()).now()),
        nonce=os.urandom(16),
    )
    envelope = sign_envelope(
        proof.SerializeToString(),
        CALL_PROOF_TYPE,
        session.key,
        session_key_id(session.identity_id, session.session_epoch),
    )
    return envelope.SerializeToString()


class CallProofs:
    """Adds a call proof by ``signer`` (when set) to every call that needs one. ``audience`` is the
    mesh addressed: by default the target the channel dials. Give a channel ``interceptors``
    (gRPC asyncio files each interceptor object under one call shape only, hence one per shape)."""

    def __init__(self, audience: str, signer: Session | None = None) -> None:
        self.audience = audience
        self.signer = signer
        # No bidirectional stream needs a proof (commands are signed, the gateway stream proves itself
        # in HELLO), and an intercepted one leaves gRPC's request-consuming task behind when it ends.
        self.interceptors: list[grpc.aio.ClientInterceptor] = [
            _UnaryUnary(self),
            _UnaryStream(self),
            _StreamUnary(self),
        ]

    @property
    def unary_request_interceptors(self) -> list[grpc.aio.ClientInterceptor]:
        """For channels whose streaming calls never need a proof (an agent's gateway stream proves
        itself in HELLO): interceptors cost something on every message of a stream."""
        return self.interceptors[:2]

    def details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if self.signer is None or method in NO_PROOF:
            return details
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(CALL_PROOF_METADATA, call_proof(self.signer, method, self.audience))
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _Shape:
    def __init__(self, proofs: CallProofs) -> None:
        self.proofs = proofs


class _UnaryUnary(_Shape, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return await continuation(self.proofs.details(details), request)


class _UnaryStream(_Shape, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return await continuation(self.proofs.details(details), request)


class _StreamUnary(_Shape, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ) -> Any:
        return await continuation(self.proofs.details(details), requests)
