"""The identity registry: Organization identities, their keys and session epochs.

Identity registration is an Organization command, authorized by Organization policy (an admin's
signature), never by a Group Membership (MW-8-04). Opening a session raises the identity's session
epoch and fences every older session (MW-11.3-09).

When the Authority runs in the same process as this registry, the registry is the only writer and
its cache is authoritative; a registry opened with ``authoritative_cache=False`` reads the current
session epoch from the database on every lookup (split deployments).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import blake3
from sqlalchemy import Row, and_, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave import ids
from missionweave.aio import finish_on_cancel
from missionweave.clock import Clock, from_timestamp, to_micros
from missionweave.errors import Rejected
from missionweave.signing import (
    OPEN_SESSION_TYPE,
    REGISTER_IDENTITY_TYPE,
    verify_signature,
)
from missionweave.v1 import common_pb2, membership_pb2, membership_service_pb2
from services.authority.state import IdentityInfo
from services.membership.schema import identities, org_requests, sessions

R = common_pb2.RejectionReason
REPLAY_WINDOW = timedelta(minutes=5)


@dataclass(frozen=True)
class IdentityRecord:
    identity_id: str
    kind: int
    display_name: str
    public_key: bytes
    org_admin: bool
    registered_us: int
    session_epoch: int

    def info(self) -> IdentityInfo:
        return IdentityInfo(self.identity_id, self.kind, self.org_admin, self.session_epoch)

    def to_proto(self) -> membership_pb2.Identity:
        ident = membership_pb2.Identity(
            identity_id=self.identity_id,
            kind=self.kind,  # type: ignore[arg-type]
            display_name=self.display_name,
            public_key=self.public_key,
            org_admin=self.org_admin,
            session_epoch=self.session_epoch,
        )
        ident.registered_at.FromMicroseconds(self.registered_us)
        return ident


class IdentityRegistry:
    def __init__(self, engine: AsyncEngine, clock: Clock, *, authoritative_cache: bool = True) -> None:
        self.engine = engine
        self.clock = clock
        self.authoritative_cache = authoritative_cache
        self._identities: dict[str, IdentityRecord] = {}
        self._session_keys: dict[tuple[str, int], bytes] = {}
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------ lookups

    async def get(self, identity_id: str) -> IdentityRecord | None:
        cached = self._identities.get(identity_id)
        if cached is not None and self.authoritative_cache:
            return cached  # the hot path: no task, no database
        row = await self._identity_row(identity_id)
        if row is None:
            return None
        record = IdentityRecord(
            row.identity_id, int(row.kind), row.display_name, bytes(row.public_key), bool(row.org_admin),
            int(row.registered_us), int(row.session_epoch),
        )
        self._identities[identity_id] = record
        return record

    async def session_key(self, identity_id: str, session_epoch: int) -> bytes | None:
        key = self._session_keys.get((identity_id, session_epoch))
        if key is not None:
            return key  # a session's key never changes
        value = await self._session_key_row(identity_id, session_epoch)
        if value is None:
            return None
        self._session_keys[(identity_id, session_epoch)] = bytes(value)
        return bytes(value)

    @finish_on_cancel
    async def _identity_row(self, identity_id: str) -> Row[Any] | None:
        async with self.engine.connect() as conn:
            return (await conn.execute(select(identities).where(identities.c.identity_id == identity_id))).first()

    @finish_on_cancel
    async def _session_key_row(self, identity_id: str, session_epoch: int) -> bytes | None:
        async with self.engine.connect() as conn:
            value = (
                await conn.execute(
                    select(sessions.c.public_key).where(
                        and_(sessions.c.identity_id == identity_id, sessions.c.session_epoch == session_epoch)
                    )
                )
            ).scalar_one_or_none()
        return None if value is None else bytes(value)

    async def infos(self, identity_ids: set[str]) -> dict[str, IdentityInfo]:
        out: dict[str, IdentityInfo] = {}
        for identity_id in identity_ids:
            if identity_id:
                record = await self.get(identity_id)
                if record is not None:
                    out[identity_id] = record.info()
        return out

    async def count(self) -> int:
        async with self.engine.connect() as conn:
            return len((await conn.execute(select(identities.c.identity_id).limit(1))).all())

    # ------------------------------------------------------------ Organization commands

    async def bootstrap_admin(self, identity_id: str, public_key: bytes, display_name: str) -> IdentityRecord:
        """First start only: the Organization's administrator (a human with org_admin)."""
        record = IdentityRecord(
            identity_id, common_pb2.IDENTITY_KIND_HUMAN, display_name, public_key, True,
            to_micros(self.clock.now()), 0,
        )
        await self._insert_identity(record)
        return record

    async def register(self, envelope: common_pb2.SignedEnvelope) -> IdentityRecord:
        """RegisterIdentity: verified against an Organization administrator's identity key."""
        command = membership_service_pb2.RegisterIdentityCommand()
        admin = await self._verify_org_envelope(envelope, REGISTER_IDENTITY_TYPE, command, "admin_id")
        if not admin.org_admin:
            raise Rejected(R.REJECTION_REASON_PERMISSION_DENIED, f"{admin.identity_id} is not an Organization admin")
        ident = command.identity
        if not ids.is_valid(ident.identity_id) or "#" in ident.identity_id:
            raise Rejected(R.REJECTION_REASON_MALFORMED, "identity.identity_id is not a valid id", field="identity_id")
        if ident.kind == common_pb2.IDENTITY_KIND_UNSPECIFIED or ident.kind not in common_pb2.IdentityKind.values():
            raise Rejected(R.REJECTION_REASON_MALFORMED, "identity.kind is required", field="kind")
        if len(ident.public_key) != 32:
            raise Rejected(R.REJECTION_REASON_MALFORMED, "identity.public_key must be 32 bytes", field="public_key")
        if not ids.is_valid(command.request_id):
            raise Rejected(R.REJECTION_REASON_MALFORMED, "request_id is required", field="request_id")
        fingerprint = blake3.blake3(envelope.payload).digest()
        async with self._lock:
            async with self.engine.connect() as conn:
                prior = (
                    await conn.execute(select(org_requests).where(org_requests.c.request_id == command.request_id))
                ).first()
            if prior is not None:
                if bytes(prior.fingerprint) != fingerprint:
                    raise Rejected(R.REJECTION_REASON_COMMAND_ID_REUSED, "request_id was used for another request")
                existing = await self.get(prior.identity_id)
                assert existing is not None
                return existing
            record = IdentityRecord(
                ident.identity_id, ident.kind, ident.display_name[:256], bytes(ident.public_key),
                ident.org_admin, to_micros(self.clock.now()), 0,
            )
            await self._insert_identity(record, request=(command.request_id, fingerprint))
            return record

    async def open_session(self, envelope: common_pb2.SignedEnvelope) -> membership_pb2.Session:
        """OpenSession: raises the session epoch, fencing the older session (MW-11.3-09)."""
        command = membership_service_pb2.OpenSessionCommand()
        record = await self._verify_org_envelope(envelope, OPEN_SESSION_TYPE, command, "identity_id")
        if len(command.session_public_key) != 32:
            raise Rejected(R.REJECTION_REASON_MALFORMED, "session_public_key must be 32 bytes")
        if not 16 <= len(command.nonce) <= 64:
            raise Rejected(R.REJECTION_REASON_MALFORMED, "nonce must be 16..64 bytes")
        fingerprint = blake3.blake3(envelope.payload).digest()
        now = to_micros(self.clock.now())
        async with self._lock:
            current = await self.get(record.identity_id) if not self.authoritative_cache else record
            assert current is not None
            epoch = current.session_epoch + 1
            try:
                async with self.engine.begin() as conn:
                    result = await conn.execute(
                        update(identities)
                        .where(
                            and_(
                                identities.c.identity_id == record.identity_id,
                                identities.c.session_epoch == current.session_epoch,
                            )
                        )
                        .values(session_epoch=epoch)
                    )
                    if result.rowcount != 1:
                        raise Rejected(R.REJECTION_REASON_REVISION_MISMATCH, "a concurrent session opened; retry")
                    await conn.execute(
                        insert(sessions).values(
                            identity_id=record.identity_id,
                            session_epoch=epoch,
                            public_key=bytes(command.session_public_key),
                            opened_us=now,
                            request_fingerprint=fingerprint,
                        )
                    )
            except IntegrityError:
                raise Rejected(
                    R.REJECTION_REASON_COMMAND_ID_REUSED, "this OpenSession request was already used (replay)"
                ) from None
            self._identities[record.identity_id] = IdentityRecord(
                current.identity_id, current.kind, current.display_name, current.public_key,
                current.org_admin, current.registered_us, epoch,
            )
            self._session_keys[(record.identity_id, epoch)] = bytes(command.session_public_key)
        session = membership_pb2.Session(
            identity_id=record.identity_id, session_epoch=epoch, session_public_key=command.session_public_key
        )
        session.opened_at.FromMicroseconds(now)
        return session

    # ------------------------------------------------------------ internals

    async def _verify_org_envelope(
        self, envelope: common_pb2.SignedEnvelope, payload_type: str, command: object, signer_field: str
    ) -> IdentityRecord:
        if envelope.payload_type != payload_type:
            raise Rejected(R.REJECTION_REASON_MALFORMED, f"payload_type must be {payload_type}")
        if not envelope.signatures:
            raise Rejected(R.REJECTION_REASON_SIGNATURE_MISSING, "the request is not signed")
        try:
            command.ParseFromString(envelope.payload)  # type: ignore[attr-defined]
        except Exception:
            raise Rejected(R.REJECTION_REASON_MALFORMED, "payload is not a valid message") from None
        signer_id = getattr(command, signer_field)
        signer = await self.get(signer_id)
        if signer is None:
            raise Rejected(R.REJECTION_REASON_UNKNOWN_IDENTITY, f"{signer_id!r} is not registered")
        if not verify_signature(envelope, signer.public_key):
            raise Rejected(R.REJECTION_REASON_SIGNATURE_INVALID, f"signature does not verify for {signer_id}")
        issued = command.issued_at  # type: ignore[attr-defined]
        if abs(from_timestamp(issued) - self.clock.now()) > REPLAY_WINDOW:
            raise Rejected(R.REJECTION_REASON_CLOCK_SKEW, "issued_at is outside the replay window (5 minutes)")
        return signer

    async def _insert_identity(self, record: IdentityRecord, request: tuple[str, bytes] | None = None) -> None:
        try:
            async with self.engine.begin() as conn:
                await conn.execute(
                    insert(identities).values(
                        identity_id=record.identity_id,
                        kind=record.kind,
                        display_name=record.display_name,
                        public_key=record.public_key,
                        org_admin=record.org_admin,
                        registered_us=record.registered_us,
                        session_epoch=record.session_epoch,
                    )
                )
                if request is not None:
                    await conn.execute(
                        insert(org_requests).values(
                            request_id=request[0], fingerprint=request[1], identity_id=record.identity_id
                        )
                    )
        except IntegrityError:
            raise Rejected(
                R.REJECTION_REASON_IDENTITY_EXISTS, f"identity {record.identity_id} already exists"
            ) from None
        self._identities[record.identity_id] = record



