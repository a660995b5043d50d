"""Checking a Group's stored log: signatures, positions and the event chain (docs/integrity.md).

Pure and synchronous, so that the Authority (which batches the signature checks off its event loop)
and ``mwp verify`` (offline) apply the same rules:

* every stored row holds a SignedEnvelope of an Event, signed by a key of the Authority's key
  history, and the Event names the row's Group, sequence, id and type;
* a Group's sequences are 1, 2, 3, ... with no gap;
* each event names its predecessor's *event digest* in ``previous_digest``: BLAKE3-256 of the
  predecessor's payload as first signed (an erased event keeps that value in its redaction marker,
  so erasure does not break the chain). Events appended before the chain existed carry no link:
  they are checked by signature and sequence only, and once one event is linked every later one
  must be (D64);
* an erasure tombstone's events are the erased copies, never the original content put back.

A failure is a ``Corruption``: the Group, the first sequence that failed and what was wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import blake3
from google.protobuf.message import DecodeError

from missionweave.kernel.signing import EVENT_TYPE, SNAPSHOT_TYPE, pae, verify_signature
from missionweave.v1 import authority_service_pb2, common_pb2, event_pb2

DIGEST_BYTES = 32
# A Group's chain head signed by the Authority: a later load trusts the hash chain up to it.
CHECKPOINT_TYPE = "application/vnd.missionweave.v1.chain-checkpoint"
_CHECKPOINT_MAGIC = b"mwp-chain-checkpoint/v1\x00"


class Corruption(Exception):
    """A stored log (or snapshot) failed verification."""

    def __init__(self, group_id: str, sequence: int, detail: str) -> None:
        super().__init__(f"group {group_id} failed verification at sequence {sequence}: {detail}")
        self.group_id = group_id
        self.sequence = sequence
        self.detail = detail


def event_digest(payload: bytes) -> bytes:
    """The chain value of an event that was never erased: BLAKE3-256 of its payload bytes."""
    return blake3.blake3(payload).digest()


def link_of(payload: bytes, event: event_pb2.Event, digest: bytes | None = None) -> bytes:
    """What the next event's ``previous_digest`` must name: the digest of the payload first signed
    (``digest``: ``event_digest(payload)`` when the caller has it already)."""
    if event.HasField("redaction") and event.redaction.original_event_digest:
        return bytes(event.redaction.original_event_digest)
    return event_digest(payload) if digest is None else digest


class Checked(NamedTuple):
    """What the chain rules need of one event whose envelope was parsed (and whose signature is
    still to be, or was, checked). Kept in the Authority's cache of verified envelopes. A tuple:
    one is made per event of every load, and a frozen dataclass costs several times more to build."""

    group_id: str
    sequence: int
    link: bytes
    previous: bytes
    # The tombstone sequence of an erased copy (0: not erased).
    erased_by: int = 0
    # For an erasure tombstone: the sequences it erased.
    erases: tuple[int, ...] = ()


class SignatureCheck(NamedTuple):
    """A signature still to check: over the DSSE PAE of the payload, with the key it names."""

    payload_type: str
    payload: bytes
    signature: bytes
    public_key: bytes

    @property
    def message(self) -> bytes:
        """The signed bytes (built only for the events whose signature is checked)."""
        return pae(self.payload_type, self.payload)


def inspect(
    group_id: str, sequence: int, event_id: str, type_: str, stored: bytes, keys: Mapping[str, bytes]
) -> tuple[Checked, SignatureCheck, event_pb2.Event]:
    """Parses one stored row and checks everything but its signature and its place in the chain."""

    def bad(detail: str) -> Corruption:
        return Corruption(group_id, sequence, detail)

    try:
        signed = common_pb2.SignedEnvelope.FromString(stored)
    except DecodeError:
        raise bad("the stored envelope does not parse") from None
    payload_type = signed.payload_type
    if payload_type != EVENT_TYPE:
        raise bad(f"payload type {payload_type!r} is not an event")
    if not signed.signatures:
        raise bad("the event carries no signature")
    signature = signed.signatures[0]
    key_id = signature.key_id
    public_key = keys.get(key_id)
    if public_key is None:
        raise bad(f"signed by {key_id!r}, which is not a key of this Authority's key history")
    payload = signed.payload  # each read of a bytes field is a copy: once
    try:
        event = event_pb2.Event.FromString(payload)
    except DecodeError:
        raise bad("the signed payload is not an event") from None
    if event.group_id != group_id or event.sequence != sequence:
        raise bad(f"the signed event is {event.group_id} #{event.sequence}, stored as {group_id} #{sequence}")
    if event.event_id != event_id or event.type != type_:
        raise bad(f"the row says {event_id} {type_}, the signed event {event.event_id} {event.type}")
    previous = event.previous_digest
    if previous and len(previous) != DIGEST_BYTES:
        raise bad("previous_digest is not 32 bytes")
    erases: tuple[int, ...] = ()
    if event.WhichOneof("payload") == "message_amended" and event.message_amended.erased_sequences:
        erases = tuple(event.message_amended.erased_sequences)
    erased_by = event.redaction.tombstone_sequence if event.HasField("redaction") else 0
    checked = Checked(group_id, sequence, link_of(payload, event), previous, erased_by, erases)
    return checked, SignatureCheck(payload_type, payload, signature.sig, public_key), event


@dataclass
class Chain:
    """One pass over a Group's log in sequence order, from the start (``after == 0``) or from
    ``after`` (a served batch: the link before it is checked when ``previous`` is known).

    ``advance`` applies the rules to each event in turn; the erasure rule covers the erased events
    this pass has seen (all of them from the start)."""

    group_id: str
    after: int = 0
    # The event digest at ``after`` when known (always, from the start: nothing before sequence 1).
    previous: bytes | None = None
    last: int = field(init=False)
    linked: bool = False
    # A signed chain checkpoint (sequence, event digest) this pass must meet: events up to it need
    # no signature check of their own when the chain commits to them (``trusts``).
    checkpoint: tuple[int, bytes] | None = None
    # Signature checks this pass made (the Authority writes a checkpoint after enough of them).
    signatures_checked: int = 0
    _erased: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.last = self.after
        if self.after == 0:
            self.previous = b""

    def advance(self, checked: Checked) -> None:
        seq = checked.sequence
        if checked.group_id != self.group_id:
            raise self._bad(seq, f"an event of group {checked.group_id} is stored in this log")
        if seq != self.last + 1:
            raise self._bad(
                seq, f"sequence {seq} follows {self.last}: events {self.last + 1}..{seq - 1} are missing"
            )
        if seq == 1:
            if checked.previous:
                raise self._bad(seq, "the first event names a predecessor")
        elif checked.previous:
            if self.previous is not None and checked.previous != self.previous:
                raise self._bad(
                    seq, f"the event chain is broken: it does not name the digest of event {seq - 1}"
                )
            self.linked = True
        elif self.linked:
            raise self._bad(seq, "an event without a chain link follows linked events")
        if checked.erased_by:
            if checked.erased_by <= seq:
                raise self._bad(seq, "an erased copy names a tombstone that is not after it")
            self._erased[seq] = checked.erased_by
        for target in checked.erases:
            if target > self.after and self._erased.get(target) != seq:
                raise Corruption(
                    self.group_id,
                    target,
                    f"event {target}, erased by tombstone {seq}, is not the erased copy",
                )
        self.last = seq
        self.previous = checked.link
        if self.checkpoint is not None and seq == self.checkpoint[0] and checked.link != self.checkpoint[1]:
            raise self._bad(
                seq, "the log does not match the Authority's signed chain checkpoint at this sequence"
            )

    def _bad(self, sequence: int, detail: str) -> Corruption:
        return Corruption(self.group_id, sequence, detail)

    def trusts(self, checked: Checked) -> bool:
        """Whether ``checked`` needs no signature check: it lies at or below the signed checkpoint and
        the hash chain up to the checkpoint commits to its payload (it is linked, and not an erased
        copy, whose content only its own signature covers)."""
        return (
            self.checkpoint is not None
            and checked.sequence <= self.checkpoint[0]
            and bool(checked.previous)
            and not checked.erased_by
        )


def checkpoint_payload(group_id: str, sequence: int, link: bytes) -> bytes:
    """The signed bytes of a chain checkpoint: "event ``sequence`` of ``group_id`` has digest ``link``"."""
    return _CHECKPOINT_MAGIC + group_id.encode() + b"\x00" + sequence.to_bytes(8, "big") + link


def verified_checkpoint(
    group_id: str, sequence: int, stored: bytes, keys: Mapping[str, bytes]
) -> tuple[int, bytes]:
    """A stored chain checkpoint checked (signature by a key of the history, Group and sequence)."""
    try:
        signed = common_pb2.SignedEnvelope.FromString(stored)
    except DecodeError:
        raise Corruption(group_id, sequence, "the chain checkpoint does not parse") from None
    public_key = keys.get(signed.signatures[0].key_id) if signed.signatures else None
    if (
        signed.payload_type != CHECKPOINT_TYPE
        or public_key is None
        or not verify_signature(signed, public_key)
    ):
        raise Corruption(group_id, sequence, "the chain checkpoint's signature does not verify")
    link = signed.payload[-DIGEST_BYTES:]
    if signed.payload != checkpoint_payload(group_id, sequence, link):
        raise Corruption(group_id, sequence, "the chain checkpoint names another Group or sequence")
    return sequence, link


def verified_snapshot(
    group_id: str, sequence: int | None, digest: str, stored: bytes, keys: Mapping[str, bytes]
) -> tuple[common_pb2.SignedEnvelope, authority_service_pb2.GroupSnapshot]:
    """A stored snapshot checked: a signature by a key of the history, its digest and its place
    (``sequence``: the one it is stored under, None when only its digest was looked up)."""

    def bad(detail: str) -> Corruption:
        return Corruption(group_id, sequence or 0, f"snapshot: {detail}")

    try:
        signed = common_pb2.SignedEnvelope.FromString(stored)
    except DecodeError:
        raise bad("the stored envelope does not parse") from None
    if signed.payload_type != SNAPSHOT_TYPE or not signed.signatures:
        raise bad("not a signed snapshot")
    public_key = keys.get(signed.signatures[0].key_id)
    if public_key is None or not verify_signature(signed, public_key):
        raise bad("the signature does not verify with a key of this Authority's key history")
    if blake3.blake3(signed.payload).hexdigest() != digest:
        raise bad("the payload does not hash to the digest it is stored under")
    try:
        snapshot = authority_service_pb2.GroupSnapshot.FromString(signed.payload)
    except DecodeError:
        raise bad("the signed payload is not a snapshot") from None
    if snapshot.group_id != group_id or (sequence is not None and snapshot.sequence != sequence):
        raise bad(f"the signed snapshot is of {snapshot.group_id} at {snapshot.sequence}")
    return signed, snapshot
