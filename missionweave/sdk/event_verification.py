"""Verification of what the gateway relays from the Authority, before anything parses it: events
(one by one, or a frame's worth along the event chain with as few Ed25519 checks as the chain
allows, docs/integrity.md), signed snapshot references and snapshots (MW-16-12). ``AuthorityVerifier``
holds the Authority's keys; ``VERIFIED_EVENT_PAYLOADS`` is the process-wide memo of signatures
already checked, shared by every agent of the process; ``NotVerified`` is what a payload that does
not check out raises. Pure of the stream: the agent, its subscriptions and offering use it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import blake3
from google.protobuf.message import DecodeError, Message

from missionweave.kernel.eventlog import event_digest, link_of
from missionweave.kernel.signing import EVENT_TYPE, SNAPSHOT_REFERENCE_TYPE, SNAPSHOT_TYPE, verify_signature
from missionweave.sdk.errors import AgentError
from missionweave.v1 import authority_service_pb2, common_pb2, event_pb2
from missionweave.v1 import gateway_service_pb2 as pb

__all__ = ["VERIFIED_EVENT_PAYLOADS", "AuthorityVerifier", "Linked", "NotVerified", "VerifiedPayloads"]


class NotVerified(AgentError):
    """An event, snapshot reference or snapshot whose Authority signature or digest does not check out."""


@dataclass(frozen=True)
class Linked:
    """A verified event waiting for its turn, with its chain value (eventlog.link_of)."""

    event: event_pb2.Event
    link: bytes


class VerifiedPayloads:
    """Event envelopes whose Authority signature this process has checked, by (public key, BLAKE3 of
    the payload, signature): bounded, least recently used first out. Agents of one process that
    follow the same Group each receive every event; the first to check an event's signature spares
    the others theirs (a payload that hashes to a remembered digest, under the same signature, is
    the one that was checked; any other signature bytes are checked as usual)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._known: OrderedDict[tuple[bytes, bytes, bytes], None] = OrderedDict()

    def __contains__(self, key: tuple[bytes, bytes, bytes]) -> bool:
        if key in self._known:
            self._known.move_to_end(key)
            return True
        return False

    def add(self, key: tuple[bytes, bytes, bytes]) -> None:
        self._known[key] = None
        if len(self._known) > self.size:
            self._known.popitem(last=False)

    def clear(self) -> None:
        self._known.clear()


# Shared by every AuthorityVerifier of the process (keyed by the public key, so never across
# Authorities).
VERIFIED_EVENT_PAYLOADS = VerifiedPayloads()


class AuthorityVerifier:
    """Checks the Authority's signature (and payload type) before anything parses a payload."""

    def __init__(self, key_id: str, public_key: bytes, earlier: dict[str, bytes] | None = None) -> None:
        self.key_id = key_id
        self.public_key = public_key
        # Keys the Authority signed with before a rotation (GetAuthorityKey ``keys``): old history
        # verifies with the key it names.
        self.keys = {**(earlier or {}), key_id: public_key}

    def _payload(self, envelope: common_pb2.SignedEnvelope, payload_type: str) -> bytes:
        if envelope.payload_type != payload_type:
            raise NotVerified(f"payload type {envelope.payload_type!r} is not {payload_type!r}")
        index = next((i for i, s in enumerate(envelope.signatures) if s.key_id in self.keys), None)
        if index is None or not verify_signature(
            envelope, self.keys[envelope.signatures[index].key_id], index
        ):
            raise NotVerified(f"no valid signature by the Authority key {self.key_id}")
        return envelope.payload

    def event(self, envelope: common_pb2.SignedEnvelope) -> event_pb2.Event:
        return _parse(event_pb2.Event, self._payload(envelope, EVENT_TYPE))

    def events(self, envelopes: Sequence[common_pb2.SignedEnvelope]) -> list[Linked]:
        """A frame's events, each verified before it is parsed, with as few Ed25519 checks as the
        event chain allows (docs/integrity.md): newest first, an event whose payload hashes to the
        ``previous_digest`` of a verified event is the payload the Authority signed before it, so
        its own signature adds nothing. A frame of contiguous events costs one signature check; an
        event the chain does not vouch for (the newest, one after a skipped range, an erased copy,
        one of another history) has its own signature checked, unless this process checked that
        same signature over that same payload already (``VERIFIED_EVENT_PAYLOADS``). Returned in
        frame order."""
        linked: list[Linked] = []
        vouched = b""  # the previous_digest of the last event verified, walking backwards
        for envelope in reversed(envelopes):
            payload = envelope.payload
            digest = event_digest(payload)
            is_event = envelope.payload_type == EVENT_TYPE
            if not (is_event and vouched and digest == vouched):
                signed = self._signed_by_us(envelope, digest)
                if not is_event or signed is None or signed not in VERIFIED_EVENT_PAYLOADS:
                    payload = self._payload(envelope, EVENT_TYPE)
                    if signed is not None:
                        VERIFIED_EVENT_PAYLOADS.add(signed)
            event = _parse(event_pb2.Event, payload)
            linked.append(Linked(event, link_of(payload, event, digest)))
            vouched = event.previous_digest
        linked.reverse()
        return linked

    def _signed_by_us(
        self, envelope: common_pb2.SignedEnvelope, digest: bytes
    ) -> tuple[bytes, bytes, bytes] | None:
        """(public key, digest, signature) of the first signature by a key of this Authority, the
        one ``_payload`` checks (None: there is none)."""
        return next(
            ((self.keys[s.key_id], digest, s.sig) for s in envelope.signatures if s.key_id in self.keys), None
        )

    def snapshot_reference(self, envelope: common_pb2.SignedEnvelope) -> pb.SnapshotReference:
        return _parse(pb.SnapshotReference, self._payload(envelope, SNAPSHOT_REFERENCE_TYPE))

    def answering(
        self, envelope: common_pb2.SignedEnvelope, asked: pb.SnapshotReference, viewer_id: str
    ) -> pb.SnapshotReference:
        """The signed reference a GetSnapshot answer comes with: ``asked`` itself, or the Authority's
        reference to ``viewer_id``'s view of that same snapshot (restricted content left out)."""
        got = self.snapshot_reference(envelope)
        if (got.group_id, got.sequence) != (asked.group_id, asked.sequence):
            raise NotVerified("the snapshot answer names another Group or sequence than was asked")
        if got.digest.hex == asked.digest.hex and not got.HasField("view_of"):
            return got
        if got.view_of.hex != asked.digest.hex or got.viewer_id != viewer_id:
            raise NotVerified(f"the snapshot answer is not {viewer_id}'s view of {asked.digest.hex}")
        return got

    def snapshot(
        self, envelope: common_pb2.SignedEnvelope, reference: pb.SnapshotReference
    ) -> authority_service_pb2.GroupSnapshot:
        """MW-16-12: the snapshot's signature, its BLAKE3 digest and size against the signed reference."""
        payload = self._payload(envelope, SNAPSHOT_TYPE)
        digest = reference.digest
        if blake3.blake3(payload).hexdigest() != digest.hex or (
            digest.size_bytes and digest.size_bytes != len(payload)
        ):
            raise NotVerified(f"the snapshot does not match the digest {digest.hex} it is referenced by")
        snapshot = _parse(authority_service_pb2.GroupSnapshot, payload)
        if (snapshot.group_id, snapshot.sequence) != (reference.group_id, reference.sequence):
            raise NotVerified("the snapshot names another Group or sequence than its reference")
        return snapshot


M = TypeVar("M", bound=Message)


def _parse(cls: type[M], payload: bytes) -> M:
    try:
        return cls.FromString(payload)
    except DecodeError as err:
        raise NotVerified(f"the signed payload is not a {cls.__name__}") from err
