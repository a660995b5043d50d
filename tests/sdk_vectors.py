"""Byte vectors the Python side makes, which the TypeScript SDK must make identically
(sdks/typescript/test/vectors.json, read by its `node --test` unit tests): the DSSE PAE, a signed
envelope (Ed25519 is deterministic, so equal signatures prove equal signed bytes), a signed command,
a call proof, an HelloProof, an artifact manifest's in-toto Statement, an idempotency key and the
cursor and session files. Every input is fixed. ``python -m tests.sdk_vectors`` prints them;
tests/test_sdk_typescript.py checks the checked-in file is what this module makes now.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from nacl.signing import SigningKey

from missionweave.kernel.manifest import sign_manifest, statement_for
from missionweave.kernel.signing import (
    CALL_PROOF_TYPE,
    COMMAND_TYPE,
    HELLO_PROOF_TYPE,
    pae,
    session_key_id,
    sign_envelope,
)
from missionweave.sdk.artifacts import SDK_COMPONENT, Described, Hashes, Origin, build_manifest
from missionweave.sdk.client import SessionSigner
from missionweave.sdk.idempotency import attempt_key
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import auth_pb2, command_pb2, conversation_pb2
from missionweave.v1 import gateway_service_pb2 as gpb

SEED = bytes(range(32))
AT = Timestamp(seconds=1_780_000_000, nanos=123_456_000)
NONCE = bytes(range(100, 116))


def vectors() -> dict[str, Any]:
    key = SigningKey(SEED)
    signer = SessionSigner("ts-agent", 7, key)
    payload = "héllo, DSSE".encode()
    command = command_pb2.Command(
        command_id="cmd_0001",
        group_id="grp_vectors",
        actor_id="ts-agent",
        session_epoch=7,
        membership_epoch=2,
        issued_at=AT,
        message_post=conversation_pb2.MessagePost(
            conversation_id="conv_1", content=conversation_pb2.MessageContent(text="hi ✓", mentions=["coord"])
        ),
    )
    call = auth_pb2.CallProof(
        identity_id="ts-agent",
        session_epoch=7,
        method="/missionweave.v1.AuthorityService/GetGroupState",
        audience="127.0.0.1:50051",
        issued_at=AT,
        nonce=NONCE,
    )
    hello = gpb.HelloProof(
        agent_id="ts-agent", session_epoch=7, issued_at=AT, nonce=NONCE, audience="127.0.0.1:50051"
    )
    content = b"the report\n"
    hashes = _hashes(content)
    origin = Origin("grp_vectors", "msn_1", "wi-1", "lease-1", 3, "none", components=(_ts_component(),))
    manifest = build_manifest(Described(hashes, "text/plain", "ts-agent", origin))
    manifest.created_at.CopyFrom(AT)
    return {
        "seed": SEED.hex(),
        "public_key": bytes(key.verify_key).hex(),
        "issued_at": {"seconds": AT.seconds, "nanos": AT.nanos},
        "nonce": NONCE.hex(),
        "pae": {
            "type": "application/x-test",
            "payload": payload.hex(),
            "pae": pae("application/x-test", payload).hex(),
        },
        "envelope": sign_envelope(payload, "application/x-test", key, "ts-agent#session-7")
        .SerializeToString()
        .hex(),
        "command": {
            "bytes": command.SerializeToString().hex(),
            "envelope": sign_envelope(
                command.SerializeToString(), COMMAND_TYPE, key, session_key_id("ts-agent", 7)
            )
            .SerializeToString()
            .hex(),
        },
        "call_proof": sign_envelope(
            call.SerializeToString(), CALL_PROOF_TYPE, key, session_key_id("ts-agent", 7)
        )
        .SerializeToString()
        .hex(),
        "hello_proof": sign_envelope(
            hello.SerializeToString(), HELLO_PROOF_TYPE, key, session_key_id("ts-agent", 7)
        )
        .SerializeToString()
        .hex(),
        "manifest": {
            "content": content.hex(),
            "statement": statement_for(manifest, hashes.sha256_hex).decode(),
            "envelope": sign_manifest(manifest, hashes.sha256_hex, signer.key, session_key_id("ts-agent", 7))
            .SerializeToString()
            .hex(),
        },
        "attempt_key": {
            "parts": ["grp_vectors", "wi-1", 3, "send-mail"],
            "key": attempt_key("grp_vectors", "wi-1", 3, "send-mail"),
        },
        "cursors_file": json.dumps(
            {"agent_id": "ts-agent", "cursors": {"grp_b": 9, "grp_a": 42}}, sort_keys=True
        ),
        "session_file": json.dumps(
            {"identity_id": "ts-agent", "session_epoch": 7, "key": SEED.hex()}, sort_keys=True
        ),
    }


def _hashes(content: bytes) -> Hashes:
    from missionweave.sdk.artifacts import hash_chunks

    return hash_chunks([content])


def _ts_component() -> apb.ComponentVersion:
    """The component the TypeScript SDK names in its manifests (the Python SDK names itself)."""
    component = apb.ComponentVersion()
    component.CopyFrom(SDK_COMPONENT)
    component.name = "missionweave-sdk-typescript"
    return component


if __name__ == "__main__":
    print(json.dumps(vectors(), indent=1, sort_keys=True, ensure_ascii=False))
