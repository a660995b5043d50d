"""HELLO: how a stream proves whose it is (spec 16, MW-8-11, D118).

``SessionProofs`` is the gateway's check of a HelloProof, shared by HELLO and GetSnapshot: signed by
the named session's key, about that session, for this gateway's audience, fresh and never seen
before (one nonce cache for both RPCs, and the other replicas' through ``SharedNonces``), from the
agent's current session. ``Hello`` is the stream's side: the first frame must be HELLO, its proof
must name the session the frame claims, the stream is then counted for its agent (a per-identity
limit) and registered so that a newer session ends it, and WELCOME states the protocol's bounds.
They sit together because they are one rule: what makes a caller that agent, in that session.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from google.protobuf.message import DecodeError

from missionweave.kernel.clock import from_timestamp, to_timestamp
from missionweave.kernel.signing import (
    HELLO_PROOF_TYPE,
    MAX_SIGNATURES,
    parse_session_key_id,
    session_key_id,
    verify_signature,
)
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.edge.callers import normalize_audience
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.services.gateway import limits
from missionweave_server.services.gateway.fatal import Fatal, over_limit
from missionweave_server.services.gateway.limits import GatewayLimits
from missionweave_server.services.gateway.stream import Stream
from missionweave_server.storage.replay import NONCE_MAX, NONCE_MIN, NonceCache

E = pb.GatewayErrorCode


class SessionProofs:
    """The gateway's part (a base of ``service.GatewayServicer``, which sets these attributes)."""

    registry: IdentityDirectoryClient
    limits: GatewayLimits
    audiences: Collection[str]
    nonces: NonceCache

    async def verify_session_proof(self, proof: common_pb2.SignedEnvelope) -> tuple[str, int]:
        """The (agent, session epoch) a HelloProof proves: signed by that session's key, about that
        session, for this gateway (its audience), fresh (30 s) and not seen before (its nonce, once
        per replay window), from the agent's current session. Raises Fatal otherwise, and the
        directory's Rejected (PEER_UNAVAILABLE, retry_after_ms) when Membership cannot confirm the
        session. HELLO and GetSnapshot share one nonce cache: a proof is used once, for either."""
        if not proof.signatures or len(proof.signatures) > MAX_SIGNATURES:
            raise Fatal(
                E.GATEWAY_ERROR_CODE_HELLO_INVALID, "a HelloProof signed by a session key is required"
            )
        key_id = parse_session_key_id(proof.signatures[0].key_id)
        if key_id is None or proof.payload_type != HELLO_PROOF_TYPE:
            raise Fatal(
                E.GATEWAY_ERROR_CODE_HELLO_INVALID, "a HelloProof signed by a session key is required"
            )
        agent_id, session_epoch = key_id
        key = await self.registry.session_key(agent_id, session_epoch)
        if key is None or not verify_signature(proof, key):
            raise Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "the proof does not verify with the session key")
        try:
            claim = pb.HelloProof.FromString(proof.payload)
        except DecodeError:
            raise Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "the proof is not a HelloProof") from None
        if (claim.agent_id, claim.session_epoch) != key_id or not NONCE_MIN <= len(claim.nonce) <= NONCE_MAX:
            raise Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "the proof names another session or has no nonce")
        if normalize_audience(claim.audience) not in self.audiences:
            raise Fatal(
                E.GATEWAY_ERROR_CODE_HELLO_INVALID,
                f"the proof is for audience {claim.audience!r}, not this gateway; "
                f"make it for one of {', '.join(sorted(self.audiences)) or '(none configured)'}",
                field="audience",
            )
        try:
            issued_at = from_timestamp(claim.issued_at)
        except (ValueError, OverflowError):
            raise Fatal(
                E.GATEWAY_ERROR_CODE_HELLO_INVALID,
                "the proof's issued_at is not a valid time",
                field="issued_at",
            ) from None
        if not self.nonces.fresh(issued_at):
            raise Fatal(
                E.GATEWAY_ERROR_CODE_HELLO_INVALID,
                "the proof is stale (clock skew over 30 s)",
                field="issued_at",
            )
        if not await self.nonces.use(session_key_id(agent_id, session_epoch), claim.nonce, issued_at):
            if self.nonces.full:
                raise over_limit(
                    "too many HELLO proofs in the replay window; retry later",
                    self.limits.max_hello_nonces,
                    "nonces",
                )
            raise Fatal(
                E.GATEWAY_ERROR_CODE_HELLO_INVALID,
                "the proof's nonce was already used: make a fresh proof",
                field="nonce",
            )
        identity = await self.registry.get(agent_id, at_least_epoch=session_epoch)
        if identity is None or identity.session_epoch != session_epoch:
            raise Fatal(E.GATEWAY_ERROR_CODE_SESSION_STALE, "a newer session of this agent exists")
        return key_id


class Hello(Stream):
    """The stream's part: its first frame."""

    async def hello(self, hello: pb.HelloFrame) -> None:
        claimed = (hello.agent_id, hello.session_epoch)
        proved = await self.gateway.verify_session_proof(hello.proof)
        if proved != claimed:
            raise Fatal(
                E.GATEWAY_ERROR_CODE_HELLO_INVALID, "the proof must be signed by the session named in HELLO"
            )
        self.gateway.admit_identity(self, hello.agent_id)
        now = self.gateway.clock.now()
        self.agent_id, self.session_epoch = claimed
        self.gateway.authenticated(self)
        # A session opened while the proof was being checked was announced before this stream was
        # registered: the directory's cache (updated before its announcement) says so now.
        identity = await self.gateway.registry.get(self.agent_id, at_least_epoch=self.session_epoch)
        if identity is not None and identity.session_epoch > self.session_epoch:
            raise Fatal(E.GATEWAY_ERROR_CODE_SESSION_STALE, "a newer session of this agent exists")
        self.batches = hello.accepts_frame_batches
        await self.send(
            welcome=pb.WelcomeFrame(
                connection_id=os.urandom(8).hex(),
                server_time=to_timestamp(now),
                max_frame_bytes=limits.MAX_FRAME_BYTES,
                max_credits=limits.MAX_CREDITS,
                max_subscriptions=limits.MAX_SUBSCRIPTIONS,
            )
        )
