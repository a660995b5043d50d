"""Key continuity: the store records which key the Authority signs with (docs/integrity.md).

The ``authority_keys`` table lists every key the Authority has signed with, in order. The first is
recorded when the store is first used (trust on first use; a database whose events are signed by
another key is refused then already). A later key is only ever added by a rotation record signed by
the key before it and by itself (``mwp authority rotate-key``). At start, a key that is not the last
recorded one is refused with a message saying how to record a rotation: a replaced key file would
otherwise sign new history that the advertised key history cannot vouch for, and old events would
stop verifying.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp
from nacl.signing import SigningKey
from sqlalchemy import insert, select, union_all
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.kernel.clock import Clock, to_micros, to_timestamp
from missionweave.kernel.signing import KEY_ROTATION_TYPE, authority_key_id, sign_envelope, verify_signature
from missionweave.v1 import authority_service_pb2, common_pb2, event_pb2
from missionweave_server.services.authority.schema import authority_keys, events, events_archive

log = logging.getLogger("missionweave.authority.keys")

MAX_REASON = 512


class KeyContinuityError(ValueError):
    """The configured key may not sign for this store (or the store's key history is broken)."""


@dataclass(frozen=True)
class KeyRecord:
    position: int
    key_id: str
    public_key: bytes
    recorded_us: int
    rotation: bytes  # serialised SignedEnvelope of an AuthorityKeyRotation; b"" for the first key


@dataclass(frozen=True)
class KeyHistory:
    records: tuple[KeyRecord, ...]

    @property
    def keys(self) -> dict[str, bytes]:
        """Every recorded key by id: old events verify with the key they name."""
        return {r.key_id: r.public_key for r in self.records}

    @property
    def current(self) -> KeyRecord:
        return self.records[-1]

    def as_proto(self) -> list[authority_service_pb2.AuthorityKey]:
        out = []
        for r in self.records:
            seconds, micros = divmod(r.recorded_us, 1_000_000)
            key = authority_service_pb2.AuthorityKey(
                key_id=r.key_id,
                public_key=r.public_key,
                recorded_at=Timestamp(seconds=seconds, nanos=micros * 1000),
            )
            if r.rotation:
                key.rotation.ParseFromString(r.rotation)
            out.append(key)
        return out


def rotation_record(
    old: SigningKey, new: SigningKey, clock: Clock, reason: str = ""
) -> common_pb2.SignedEnvelope:
    """An AuthorityKeyRotation from ``old`` to ``new``, signed by the old key, then by the new one."""
    if len(reason) > MAX_REASON:
        raise ValueError(f"the reason is at most {MAX_REASON} characters")
    old_public, new_public = bytes(old.verify_key), bytes(new.verify_key)
    rotation = authority_service_pb2.AuthorityKeyRotation(
        previous_key_id=authority_key_id(old_public),
        previous_public_key=old_public,
        key_id=authority_key_id(new_public),
        public_key=new_public,
        rotated_at=to_timestamp(clock.now()),
        reason=reason,
    )
    payload = rotation.SerializeToString(deterministic=True)
    envelope = sign_envelope(payload, KEY_ROTATION_TYPE, old, rotation.previous_key_id)
    envelope.signatures.extend(sign_envelope(payload, KEY_ROTATION_TYPE, new, rotation.key_id).signatures)
    return envelope


def check_history(records: list[KeyRecord]) -> KeyHistory:
    """The recorded history, each key after the first vouched for by a rotation the key before it
    signed. Raises KeyContinuityError otherwise (an edited table)."""
    for i, record in enumerate(records):
        if record.position != i:
            raise KeyContinuityError(f"the store's key history has a gap at position {i}")
        if record.key_id != authority_key_id(record.public_key):
            raise KeyContinuityError(
                f"key {record.key_id} in the store's key history does not match its public key"
            )
        if i == 0:
            continue
        previous = records[i - 1]
        try:
            envelope = common_pb2.SignedEnvelope.FromString(record.rotation)
            rotation = authority_service_pb2.AuthorityKeyRotation.FromString(envelope.payload)
        except DecodeError:
            raise KeyContinuityError(f"the rotation to key {record.key_id} does not parse") from None
        by_old = next((j for j, s in enumerate(envelope.signatures) if s.key_id == previous.key_id), None)
        by_new = next((j for j, s in enumerate(envelope.signatures) if s.key_id == record.key_id), None)
        if (
            envelope.payload_type != KEY_ROTATION_TYPE
            or by_old is None
            or by_new is None
            or not verify_signature(envelope, previous.public_key, by_old)
            or not verify_signature(envelope, record.public_key, by_new)
            or rotation.previous_key_id != previous.key_id
            or rotation.previous_public_key != previous.public_key
            or rotation.key_id != record.key_id
            or rotation.public_key != record.public_key
        ):
            raise KeyContinuityError(
                f"the rotation from {previous.key_id} to {record.key_id} is not signed by both keys; "
                "the store's key history was altered"
            )
    return KeyHistory(tuple(records))


async def load_history(engine: AsyncEngine) -> KeyHistory:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(
                authority_keys.c.position,
                authority_keys.c.key_id,
                authority_keys.c.public_key,
                authority_keys.c.recorded_us,
                authority_keys.c.rotation,
            ).order_by(authority_keys.c.position)
        )
        records = [KeyRecord(int(r[0]), r[1], bytes(r[2]), int(r[3]), bytes(r[4])) for r in rows]
    return check_history(records)


async def _signer_of_stored_events(engine: AsyncEngine) -> str | None:
    """The key id of one stored event (a store used before key continuity existed), or None."""
    query = union_all(
        select(events.c.envelope).limit(1).subquery().select(),
        select(events_archive.c.envelope).limit(1).subquery().select(),
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    if row is None:
        return None
    try:
        signed = common_pb2.SignedEnvelope.FromString(bytes(row[0]))
        event_pb2.Event.FromString(signed.payload)
    except DecodeError:
        return None  # corrupted: the log check reports it
    return signed.signatures[0].key_id if signed.signatures else None


async def _record_first(engine: AsyncEngine, key: SigningKey, clock: Clock) -> None:
    public = bytes(key.verify_key)
    key_id = authority_key_id(public)
    signer = await _signer_of_stored_events(engine)
    if signer is not None and signer != key_id:
        raise KeyContinuityError(
            f"this store's events are signed by {signer}, but the configured Authority key is {key_id}. "
            "Start with the key that signed them, or record a rotation to the new key with the old one: "
            "mwp authority rotate-key --old-key OLD --new-key NEW"
        )
    row = {
        "position": 0,
        "key_id": key_id,
        "public_key": public,
        "recorded_us": to_micros(clock.now()),
        "rotation": b"",
    }
    try:
        async with engine.begin() as conn:
            await conn.execute(insert(authority_keys).values(row))
    except IntegrityError:
        pass  # another instance recorded the first key at the same time: read what it recorded
    log.info("recorded the Authority key in the store", extra={"key_id": key_id})


async def ensure_key(engine: AsyncEngine, key: SigningKey, clock: Clock) -> KeyHistory:
    """The store's key history, once the configured key is known to be its current key: recorded on
    first use, else refused with KeyContinuityError unless it is the last recorded key."""
    history = await load_history(engine)
    if not history.records:
        await _record_first(engine, key, clock)
        history = await load_history(engine)
    key_id = authority_key_id(bytes(key.verify_key))
    current = history.current
    if current.key_id == key_id:
        return history
    if key_id in history.keys:
        raise KeyContinuityError(
            f"the configured Authority key {key_id} was retired by a rotation to {current.key_id}: "
            "a retired key never signs again. Configure the current key."
        )
    raise KeyContinuityError(
        f"the configured Authority key {key_id} is not this store's key {current.key_id}, and no rotation "
        f"to it is recorded. Restore the key file of {current.key_id}, or, if the key is being replaced on "
        "purpose, record the rotation signed by the old key first: "
        "mwp authority rotate-key --old-key OLD --new-key NEW (docs/integrity.md)"
    )


async def record_rotation(
    engine: AsyncEngine, old: SigningKey, new: SigningKey, clock: Clock, reason: str = ""
) -> KeyHistory:
    """Append a rotation from ``old`` (the store's current key) to ``new``."""
    history = await load_history(engine)
    if not history.records:
        await _record_first(engine, old, clock)
        history = await load_history(engine)
    old_id, new_id = authority_key_id(bytes(old.verify_key)), authority_key_id(bytes(new.verify_key))
    if history.current.key_id != old_id:
        raise KeyContinuityError(
            f"the old key {old_id} is not this store's current key {history.current.key_id}"
        )
    if new_id in history.keys:
        raise KeyContinuityError(f"the new key {new_id} is already in this store's key history")
    envelope = rotation_record(old, new, clock, reason)
    row = {
        "position": len(history.records),
        "key_id": new_id,
        "public_key": bytes(new.verify_key),
        "recorded_us": to_micros(clock.now()),
        "rotation": envelope.SerializeToString(),
    }
    try:
        async with engine.begin() as conn:
            await conn.execute(insert(authority_keys).values(row))
    except IntegrityError:
        raise KeyContinuityError(
            "another rotation was recorded at the same time; look at the key history"
        ) from None
    log.info("recorded an Authority key rotation", extra={"previous_key_id": old_id, "key_id": new_id})
    return await load_history(engine)
