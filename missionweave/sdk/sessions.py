"""An agent's session with the mesh (MW-11.3-09): ``SessionFile`` keeps it on disk (epoch and session
key seed, mode 0600) so that a restarted agent reuses it instead of fencing itself; ``open_session``
opens a new one with the identity key when there is none or the gateway refused the saved one
(``renewable``); ``session_proof`` is the signed HelloProof that HELLO and GetSnapshot carry; and
``SessionReplaced`` is how an agent stops when another process of its identity took the session
over. When to open, reuse or give up is decided by the agent's connection loop.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
from nacl.signing import SigningKey

from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.signing import HELLO_PROOF_TYPE, session_key_id, sign_envelope
from missionweave.sdk.client import SessionSigner, open_session_envelope
from missionweave.sdk.errors import AgentError, GatewayError
from missionweave.sdk.files import read_json, write_json_atomic
from missionweave.v1 import common_pb2, membership_service_pb2, membership_service_pb2_grpc
from missionweave.v1 import gateway_service_pb2 as pb

__all__ = ["SessionFile", "SessionReplaced", "open_session", "renewable", "session_proof"]

E = pb.GatewayErrorCode
_clock = SystemClock()

# HELLO refusals after which a *saved* session is replaced by a new one.
RENEW_SESSION = frozenset({E.GATEWAY_ERROR_CODE_SESSION_STALE, E.GATEWAY_ERROR_CODE_HELLO_INVALID})


class SessionFile:
    """The agent's session (epoch and session key seed, mode 0600), reused until the gateway refuses it."""

    def __init__(self, path: Path, identity_id: str) -> None:
        self.path = path
        self.identity_id = identity_id

    def load(self) -> SessionSigner | None:
        data = read_json(self.path)
        if data is None or data.get("identity_id") != self.identity_id:
            return None
        try:
            return SessionSigner(
                self.identity_id, int(data["session_epoch"]), SigningKey(bytes.fromhex(data["key"]))
            )
        except (KeyError, ValueError, TypeError) as err:
            raise AgentError(f"{self.path} is not a saved session ({err})") from err

    def save(self, signer: SessionSigner) -> None:
        data = {
            "identity_id": signer.identity_id,
            "session_epoch": signer.session_epoch,
            "key": signer.key.encode().hex(),
        }
        write_json_atomic(self.path, data)


class SessionReplaced(AgentError):
    """This agent's session was replaced by a newer session of its identity (another process running
    as it): the agent stops instead of opening a session of its own, which would fence that one in
    turn (MW-11.3-09)."""


def renewable(err: GatewayError) -> bool:
    """Whether a new session may cure the gateway's refusal of a HELLO under a saved session: not
    when the proof named another gateway (a new session would be refused the same way)."""
    return err.code in RENEW_SESSION and err.frame.rejection.metadata.get("field") != "audience"


async def open_session(
    channel: grpc.aio.Channel, identity_id: str, identity_key: SigningKey, session_file: SessionFile
) -> SessionSigner:
    """Opens a new session of ``identity_id`` with a fresh session key (``OpenSession``, signed by the
    identity key; it fences the identity's older sessions) and saves it to ``session_file``."""
    session_key = SigningKey.generate()
    stub = membership_service_pb2_grpc.MembershipServiceStub(channel)
    envelope = open_session_envelope(identity_id, identity_key, bytes(session_key.verify_key))
    response = await stub.OpenSession(membership_service_pb2.OpenSessionRequest(command=envelope))
    signer = SessionSigner(identity_id, response.session.session_epoch, session_key)
    await asyncio.to_thread(session_file.save, signer)
    return signer


def session_proof(signer: SessionSigner, audience: str) -> common_pb2.SignedEnvelope:
    """A fresh HelloProof: what HELLO and GetSnapshot use to prove the session."""
    proof = pb.HelloProof(
        agent_id=signer.identity_id,
        session_epoch=signer.session_epoch,
        issued_at=to_timestamp(_clock.now()),
        nonce=os.urandom(16),
        audience=audience,
    )
    return sign_envelope(
        proof.SerializeToString(),
        HELLO_PROOF_TYPE,
        signer.key,
        session_key_id(signer.identity_id, signer.session_epoch),
    )
