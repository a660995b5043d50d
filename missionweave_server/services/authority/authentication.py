"""Who may issue a command: the checks every signed command passes before anything in it is trusted.

The envelope's signature is verified with the session key its ``key_id`` names (the identity must be
registered, the session open and not fenced by a newer one), then the payload must name that same
session, carry well-formed ids, an issue time within the replay window and no critical extension the
rules do not implement. The Authority's command path (authority.py) calls ``authenticate`` first.
"""

from __future__ import annotations

from datetime import timedelta

from google.protobuf.message import DecodeError

from missionweave.kernel import ids
from missionweave.kernel.clock import Clock, timestamp_micros, to_micros
from missionweave.kernel.errors import Rejected
from missionweave.kernel.extensions import BOUNDED_OFFLINE_EXECUTION
from missionweave.kernel.signing import COMMAND_TYPE, parse_session_key_id
from missionweave.v1 import command_pb2, common_pb2
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.observability import metrics
from missionweave_server.services.authority.ingress import check_envelope
from missionweave_server.verification.verifier import SignatureVerifier

R = common_pb2.RejectionReason

REPLAY_WINDOW = timedelta(minutes=5)
_REPLAY_WINDOW_US = int(REPLAY_WINDOW.total_seconds() * 1_000_000)
# Critical extensions the rules implement (OP-22): any other critical binding is refused.
SUPPORTED_EXTENSIONS: frozenset[str] = frozenset({BOUNDED_OFFLINE_EXECUTION})


async def authenticate(
    envelope: common_pb2.SignedEnvelope,
    identities: IdentityDirectoryClient,
    verifier: SignatureVerifier,
    clock: Clock,
) -> command_pb2.Command:
    """Signature first: nothing in the payload is trusted before it verifies (principle 5)."""
    check_envelope(envelope)  # size (the whole envelope) and the number of signatures
    if envelope.payload_type != COMMAND_TYPE:
        raise Rejected(R.REJECTION_REASON_MALFORMED, f"payload_type must be {COMMAND_TYPE}")
    if not envelope.signatures:
        raise Rejected(R.REJECTION_REASON_SIGNATURE_MISSING, "the command envelope carries no signature")
    parsed_key = parse_session_key_id(envelope.signatures[0].key_id)
    if parsed_key is None:
        raise Rejected(
            R.REJECTION_REASON_SIGNATURE_INVALID,
            "key_id must name a session key: '<identity>#session-<epoch>'",
        )
    identity_id, epoch = parsed_key
    identity = await identities.get(identity_id)
    if identity is None:
        raise Rejected(R.REJECTION_REASON_UNKNOWN_IDENTITY, f"{identity_id!r} is not a registered identity")
    session_key = await identities.session_key(identity_id, epoch)
    if session_key is None:
        raise Rejected(
            R.REJECTION_REASON_SESSION_NOT_OPEN, f"{identity_id} has no session with epoch {epoch}; open one"
        )
    if not await verifier.verify_envelope(envelope, session_key):
        metrics.SIGNATURE_FAILURES.inc()
        raise Rejected(
            R.REJECTION_REASON_SIGNATURE_INVALID, "the signature does not verify with the session key"
        )
    if epoch > identity.session_epoch:  # a verified session newer than the cached directory names
        identity = await identities.get(identity_id, at_least_epoch=epoch) or identity
    if epoch != identity.session_epoch:
        raise Rejected(
            R.REJECTION_REASON_SESSION_EPOCH_STALE,
            f"session epoch {epoch} was fenced by session {identity.session_epoch}",
            current_epoch=identity.session_epoch,
        )
    command = command_pb2.Command()
    try:
        command.ParseFromString(envelope.payload)
    except DecodeError:
        raise Rejected(
            R.REJECTION_REASON_MALFORMED, "payload is not a valid missionweave.v1.Command"
        ) from None
    if command.actor_id != identity_id or command.session_epoch != epoch:
        raise Rejected(
            R.REJECTION_REASON_SIGNATURE_INVALID,
            "actor_id and session_epoch must match the signing session key",
            field="actor_id",
        )
    for name in ("command_id", "group_id"):
        if not ids.is_valid(getattr(command, name)):
            raise Rejected(
                R.REJECTION_REASON_MALFORMED, f"{name} must be 1..128 of [A-Za-z0-9._:-]", field=name
            )
    if command.correlation_id and not ids.is_valid(command.correlation_id):
        raise Rejected(
            R.REJECTION_REASON_MALFORMED, "correlation_id is not a valid id", field="correlation_id"
        )
    if not command.HasField("issued_at"):
        raise Rejected(R.REJECTION_REASON_MALFORMED, "issued_at is required", field="issued_at")
    skew_us = abs(timestamp_micros(command.issued_at) - to_micros(clock.now()))
    if skew_us > _REPLAY_WINDOW_US:
        raise Rejected(
            R.REJECTION_REASON_CLOCK_SKEW,
            f"issued_at is {skew_us / 1e6:.0f}s from the Authority clock (window {REPLAY_WINDOW})",
        )
    for binding in command.extensions:
        if binding.critical and binding.urn not in SUPPORTED_EXTENSIONS:
            raise Rejected(
                R.REJECTION_REASON_UNSUPPORTED_CRITICAL_EXTENSION,
                f"critical extension {binding.urn} is not supported",
                urn=binding.urn,
            )
    return command
