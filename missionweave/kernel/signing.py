"""Ed25519 keys and DSSE envelopes (protos common.proto SignedEnvelope; ARCHITECTURE principle 5).

The signature covers the DSSE pre-authentication encoding of the *exact* payload bytes, so any
language verifies without canonicalising anything.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import blake3
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from missionweave.kernel.errors import R, Rejected
from missionweave.v1 import common_pb2

COMMAND_TYPE = "application/vnd.missionweave.v1.command+protobuf"
EVENT_TYPE = "application/vnd.missionweave.v1.event+protobuf"
REGISTER_IDENTITY_TYPE = "application/vnd.missionweave.v1.register-identity+protobuf"
OPEN_SESSION_TYPE = "application/vnd.missionweave.v1.open-session+protobuf"
GROUP_SUMMARY_TYPE = "application/vnd.missionweave.v1.group-summary+protobuf"
SNAPSHOT_TYPE = "application/vnd.missionweave.v1.group-snapshot+protobuf"
HELLO_PROOF_TYPE = "application/vnd.missionweave.v1.hello-proof+protobuf"
SNAPSHOT_REFERENCE_TYPE = "application/vnd.missionweave.v1.snapshot-reference+protobuf"
KEY_ROTATION_TYPE = "application/vnd.missionweave.v1.authority-key-rotation+protobuf"
AGENT_CARD_TYPE = "application/vnd.missionweave.v1.agent-card+protobuf"

# The most signatures a signed request (a command, an Organization request, a HelloProof) may carry:
# servers check the signer's (the first); more than a few is refused, never carried along.
MAX_SIGNATURES = 4


# A call proof (missionweave/v1/auth.proto): the metadata key it travels in, and its payload type.
CALL_PROOF_METADATA = "mwp-call-proof-bin"
CALL_PROOF_TYPE = "application/vnd.missionweave.v1.call-proof+protobuf"


def check_signature_count(envelope: common_pb2.SignedEnvelope, what: str = "envelope") -> None:
    """At most MAX_SIGNATURES signatures on a signed request: more is MALFORMED (``field=signatures``,
    ``limit``), before any of them is checked."""
    if len(envelope.signatures) > MAX_SIGNATURES:
        raise Rejected(
            R.REJECTION_REASON_MALFORMED,
            f"the {what} carries {len(envelope.signatures)} signatures; at most {MAX_SIGNATURES}",
            field="signatures",
            limit=MAX_SIGNATURES,
        )


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def fingerprint(public_key: bytes) -> str:
    return blake3.blake3(public_key).hexdigest()[:16]


def authority_key_id(public_key: bytes) -> str:
    """The key id the Authority's signatures carry: ``authority:<fingerprint>``."""
    return f"authority:{fingerprint(public_key)}"


def session_key_id(identity_id: str, session_epoch: int) -> str:
    return f"{identity_id}#session-{session_epoch}"


def parse_session_key_id(key_id: str) -> tuple[str, int] | None:
    identity, sep, epoch = key_id.rpartition("#session-")
    if not sep or not identity or not epoch.isdigit():
        return None
    return identity, int(epoch)


def sign_envelope(
    payload: bytes, payload_type: str, key: SigningKey, key_id: str
) -> common_pb2.SignedEnvelope:
    return signed_envelope(payload, payload_type, key_id, key.sign(pae(payload_type, payload)).signature)


def signed_envelope(payload: bytes, payload_type: str, key_id: str, sig: bytes) -> common_pb2.SignedEnvelope:
    """The envelope of ``payload`` with one signature made elsewhere (the store's writer process
    signs events; the Authority rebuilds the same envelope from the signature it returns)."""
    return common_pb2.SignedEnvelope(
        payload=payload,
        payload_type=payload_type,
        signatures=[common_pb2.Signature(key_id=key_id, sig=sig)],
    )


def verify_signature(envelope: common_pb2.SignedEnvelope, public_key: bytes, index: int = 0) -> bool:
    try:
        VerifyKey(public_key).verify(
            pae(envelope.payload_type, envelope.payload), envelope.signatures[index].sig
        )
        return True
    except (BadSignatureError, ValueError, IndexError):
        return False


def generate_key() -> SigningKey:
    return SigningKey.generate()


def write_key(path: Path, key: SigningKey) -> None:
    """Writes the 32-byte seed as hex, created with mode 0600 (never readable by others), in a
    directory created 0700 if it is missing."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
        path.parent.chmod(0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key.encode().hex() + "\n")


class KeyFileError(ValueError):
    """A key file that is not an Ed25519 seed; the message says which file and why."""


def read_key(path: str | os.PathLike[str]) -> SigningKey:
    """The Ed25519 key in ``path`` (its 32-byte seed as 64 hex characters, mode 0600); a str or a Path."""
    path = Path(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:  # still a FileNotFoundError (callers tell it apart), with a message that helps
        raise FileNotFoundError(
            f"key file {path} does not exist (make one with `mwp keygen {path}`)"
        ) from None
    if mode & 0o077:
        raise PermissionError(f"key file {path} has mode {mode:o}; it must not be readable by others (0600)")
    try:
        seed = bytes.fromhex(path.read_text().strip())
    except (ValueError, UnicodeDecodeError):
        raise KeyFileError(
            f"key file {path} is not an Ed25519 key (64 hex characters, as `mwp keygen` writes)"
        ) from None
    if len(seed) != 32:
        raise KeyFileError(
            f"key file {path} holds {len(seed)} bytes; an Ed25519 seed is 32 (64 hex characters)"
        )
    return SigningKey(seed)


def load_or_create_key(path: Path) -> SigningKey:
    if path.exists():
        return read_key(path)
    key = generate_key()
    write_key(path, key)
    return key
