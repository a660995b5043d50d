"""The identity registry: Organization identities, their keys and session epochs.

Identity registration is an Organization command, authorized by Organization policy (an admin's
signature), never by a Group Membership (MW-8-04). Opening a session raises the identity's session
epoch and fences every older session (MW-11.3-09).

Every change (a registration, a session opened) is also recorded in the directory's change log
under the next directory revision, in the change's own transaction: the other services follow it
through the IdentityDirectoryService contract (``missionweave_server/services/membership/directory.py``).

Every identity and session row read from the database is checked against the signed request that
granted it (``missionweave_server/services/membership/grants.py``, D170): a row edited outside this service is refused
as corrupted, and left out of the directory's lists.

The registry's own cache serves this service's checks (who signed an Organization request, the
epoch a new session raises) and the public GetIdentity. It is authoritative while this registry is
the only writer (``authoritative_cache=True``); opened with ``authoritative_cache=False`` it reads
the current session epoch from the database on every lookup. The directory's reads
(``read_identities``, ``changes_after``, ``head``) always go to the database.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import blake3
from nacl.signing import SigningKey
from sqlalchemy import Row, and_, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from missionweave.internal.v1 import identities_pb2 as directory_pb2
from missionweave.kernel import ids
from missionweave.kernel.clock import Clock, from_timestamp, to_micros
from missionweave.kernel.errors import Rejected
from missionweave.kernel.signing import (
    OPEN_SESSION_TYPE,
    REGISTER_IDENTITY_TYPE,
    check_signature_count,
    verify_signature,
)
from missionweave.v1 import common_pb2, membership_pb2, membership_service_pb2
from missionweave_server.services.membership.grants import (
    GrantChecker,
    GrantedIdentity,
    GrantInvalid,
    attest_identity,
)
from missionweave_server.services.membership.schema import (
    directory_streams,
    identities,
    identity_changes,
    identity_revision,
    org_requests,
    sessions,
)
from missionweave_server.storage.aio import finish_on_cancel

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.membership.registry")
REPLAY_WINDOW = timedelta(minutes=5)
MAX_DISPLAY_NAME_CHARS = 256


@dataclass(frozen=True)
class IdentityRecord:
    identity_id: str
    kind: int
    display_name: str
    public_key: bytes
    org_admin: bool
    registered_us: int
    session_epoch: int

    def to_directory(self, session_epoch: int | None = None) -> directory_pb2.DirectoryIdentity:
        return directory_pb2.DirectoryIdentity(
            identity_id=self.identity_id,
            public_key=self.public_key,
            kind=self.kind,  # type: ignore[arg-type]
            org_admin=self.org_admin,
            session_epoch=self.session_epoch if session_epoch is None else session_epoch,
        )

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
    def __init__(
        self, engine: AsyncEngine, clock: Clock, *, admin_public_key: bytes, authoritative_cache: bool = True
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.grants = GrantChecker(admin_public_key)
        self.authoritative_cache = authoritative_cache
        self._identities: dict[str, IdentityRecord] = {}
        self._session_keys: dict[tuple[str, int], bytes] = {}
        self._lock = asyncio.Lock()
        # The highest directory revision this process knows committed, when the database was last
        # asked (monotonic seconds), and who to tell when it rises (the directory's streams).
        self.head_seen = 0
        self._head_read_at = float("-inf")
        self._head_lock = asyncio.Lock()
        self.listeners: list[Callable[[int], None]] = []

    # ------------------------------------------------------------ lookups

    async def get(self, identity_id: str) -> IdentityRecord | None:
        cached = self._identities.get(identity_id)
        if cached is not None and self.authoritative_cache:
            return cached  # the hot path: no task, no database
        row = await self._identity_row(identity_id)
        if row is None:
            return None
        record = await self._checked(row)
        if record is None:
            raise Rejected(
                R.REJECTION_REASON_DATA_CORRUPTED,
                f"the stored identity {identity_id!r} does not match the request that registered it",
            )
        self._identities[identity_id] = record
        return record

    async def session_key(self, identity_id: str, session_epoch: int) -> bytes | None:
        key = self._session_keys.get((identity_id, session_epoch))
        if key is not None:
            return key  # a session's key never changes
        found = await self._session_key_row(identity_id, session_epoch)
        if found is None:
            return None
        value, grant = found
        try:
            identity = await self.get(identity_id)
        except Rejected:  # its identity fails its grant check (logged)
            return None
        if identity is None or not self._session_granted(identity, session_epoch, value, grant):
            return None  # an edited session is no session: its proofs are refused as unknown (logged)
        self._session_keys[(identity_id, session_epoch)] = value
        return value

    @finish_on_cancel
    async def _identity_row(self, identity_id: str) -> Row[Any] | None:
        async with self.engine.connect() as conn:
            return (
                await conn.execute(select(identities).where(identities.c.identity_id == identity_id))
            ).first()

    @staticmethod
    def _record(row: Row[Any]) -> IdentityRecord:
        return IdentityRecord(
            row.identity_id,
            int(row.kind),
            row.display_name,
            bytes(row.public_key),
            bool(row.org_admin),
            int(row.registered_us),
            int(row.session_epoch),
        )

    async def _checked(self, row: Row[Any]) -> IdentityRecord | None:
        """The row's record if its grant holds; None (logged) if the row was edited outside the service."""
        record = self._record(row)
        try:
            await self.grants.identity(_granted(record), row.grant_envelope, self._signer)
        except GrantInvalid as refused:
            log.error(
                "an identity row fails its grant check: it was written outside the membership service",
                extra={"identity": record.identity_id, "detail": str(refused)},
            )
            return None
        return record

    async def _signer(self, identity_id: str) -> tuple[GrantedIdentity, bytes | None] | None:
        row = await self._identity_row(identity_id)
        return None if row is None else (_granted(self._record(row)), row.grant_envelope)

    def _session_granted(
        self, identity: IdentityRecord, session_epoch: int, key: bytes, grant: bytes | None
    ) -> bool:
        try:
            self.grants.session(_granted(identity), session_epoch, key, grant)
        except GrantInvalid as refused:
            log.error(
                "a session row fails its grant check: it was written outside the membership service",
                extra={
                    "identity": identity.identity_id,
                    "session_epoch": session_epoch,
                    "detail": str(refused),
                },
            )
            return False
        return True

    @finish_on_cancel
    async def _session_key_row(
        self, identity_id: str, session_epoch: int
    ) -> tuple[bytes, bytes | None] | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(sessions.c.public_key, sessions.c.grant_envelope).where(
                        and_(sessions.c.identity_id == identity_id, sessions.c.session_epoch == session_epoch)
                    )
                )
            ).first()
        return None if row is None else (bytes(row.public_key), row.grant_envelope)

    async def _all_checked(self, rows: list[Row[Any]]) -> list[IdentityRecord]:
        return [record for row in rows if (record := await self._checked(row)) is not None]

    @finish_on_cancel
    async def identities_after(self, after: str, limit: int) -> list[IdentityRecord]:
        """At most ``limit`` identities whose id is greater than ``after``, by id, from the database."""
        query = (
            select(identities)
            .where(identities.c.identity_id > after)
            .order_by(identities.c.identity_id)
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return await self._all_checked(list(rows))

    # ------------------------------------------------------------ the directory's reads

    @finish_on_cancel
    async def read_identities(self, identity_ids: list[str]) -> tuple[int, list[IdentityRecord]]:
        """The identities from the database, and the revision they reflect at least (read first: every
        change up to it committed before the identities are read)."""
        async with self.engine.connect() as conn:
            revision = await read_revision(conn)
            rows = (
                await conn.execute(select(identities).where(identities.c.identity_id.in_(identity_ids)))
            ).all()
        self.note_head(revision)
        return revision, await self._all_checked(list(rows))

    async def head(self, max_age: float) -> int:
        """The directory's revision, read from the database unless it was read less than ``max_age``
        seconds ago (many streams share one read)."""
        if time.monotonic() - self._head_read_at <= max_age:
            return self.head_seen
        async with self._head_lock:
            if time.monotonic() - self._head_read_at <= max_age:
                return self.head_seen
            asked = time.monotonic()
            revision = await self._read_head()
            self._head_read_at = asked
        self.note_head(revision)
        return self.head_seen

    @finish_on_cancel
    async def _read_head(self) -> int:
        async with self.engine.connect() as conn:
            return await read_revision(conn)

    @finish_on_cancel
    async def changes_after(self, revision: int, limit: int) -> list[directory_pb2.IdentityChange]:
        """The directory's changes after ``revision``, in order (revisions have no gaps)."""
        query = (
            select(
                identity_changes.c.revision,
                identity_changes.c.kind.label("change_kind"),
                identity_changes.c.session_epoch.label("change_epoch"),
                identities,
                sessions.c.public_key.label("session_public_key"),
                sessions.c.grant_envelope.label("session_grant"),
            )
            .join(identities, identities.c.identity_id == identity_changes.c.identity_id)
            .outerjoin(
                sessions,
                and_(
                    sessions.c.identity_id == identity_changes.c.identity_id,
                    sessions.c.session_epoch == identity_changes.c.session_epoch,
                ),
            )
            .where(identity_changes.c.revision > revision)
            .order_by(identity_changes.c.revision)
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        changes = []
        for row in rows:
            # A row that fails its grant check still takes its revision (streams have no gaps), but
            # grants nothing: no key verifies against an empty one.
            checked = await self._checked(row)
            record = checked or dataclasses.replace(self._record(row), public_key=b"", org_admin=False)
            change = directory_pb2.IdentityChange(
                revision=int(row.revision),
                kind=int(row.change_kind),  # type: ignore[arg-type]
                identity=record.to_directory(int(row.change_epoch)),
            )
            if (
                change.kind == directory_pb2.IDENTITY_CHANGE_KIND_SESSION_OPENED
                and row.session_public_key is not None
                and checked is not None
                and self._session_granted(
                    checked, int(row.change_epoch), bytes(row.session_public_key), row.session_grant
                )
            ):
                change.session_public_key = bytes(row.session_public_key)
            changes.append(change)
            cached = self._identities.get(row.identity_id)
            if cached is not None and cached.session_epoch < int(row.change_epoch):
                # Another instance opened it: this instance's own cache learns it from the log too.
                self._identities[row.identity_id] = dataclasses.replace(
                    cached, session_epoch=int(row.change_epoch)
                )
        if changes:
            self.note_head(changes[-1].revision)
        return changes

    # ------------------------------------------------------------ the directory's streams

    @finish_on_cancel
    async def stream_opened(self, stream_id: str, instance_id: str, alive_for_s: float) -> None:
        """Record a new stream (nothing written to it yet); forget streams long gone."""
        now_us = _wall_us()
        async with self.engine.begin() as conn:
            await conn.execute(
                delete(directory_streams).where(directory_streams.c.alive_until_us < now_us - 60_000_000)
            )
            await conn.execute(
                insert(directory_streams).values(
                    stream_id=stream_id,
                    instance_id=instance_id,
                    delivered_revision=0,
                    alive_until_us=now_us + int(alive_for_s * 1_000_000),
                )
            )

    @finish_on_cancel
    async def stream_progress(self, stream_id: str, delivered: int, alive_for_s: float) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(directory_streams)
                .where(directory_streams.c.stream_id == stream_id)
                .values(
                    delivered_revision=delivered, alive_until_us=_wall_us() + int(alive_for_s * 1_000_000)
                )
            )

    @finish_on_cancel
    async def stream_closed(self, stream_id: str) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(delete(directory_streams).where(directory_streams.c.stream_id == stream_id))

    @finish_on_cancel
    async def streams_behind(self, revision: int, other_than_instance: str) -> int:
        """Live streams of other instances not yet written ``revision``."""
        async with self.engine.connect() as conn:
            count = (
                await conn.execute(
                    select(func.count())
                    .select_from(directory_streams)
                    .where(
                        directory_streams.c.delivered_revision < revision,
                        directory_streams.c.alive_until_us > _wall_us(),
                        directory_streams.c.instance_id != other_than_instance,
                    )
                )
            ).scalar_one()
        return int(count)

    def note_head(self, revision: int) -> None:
        """The directory's revision is known to have reached ``revision`` (a change committed here,
        or a read): wake the streams at once."""
        if revision > self.head_seen:
            self.head_seen = revision
            for listener in self.listeners:
                listener(revision)

    # ------------------------------------------------------------ Organization commands

    async def bootstrap_admin(
        self, identity_id: str, admin_key: SigningKey, display_name: str
    ) -> IdentityRecord:
        """First start only: the Organization's administrator (a human with org_admin), granted by
        its own key: the root of every grant (D170)."""
        record = IdentityRecord(
            identity_id,
            common_pb2.IDENTITY_KIND_HUMAN,
            display_name,
            bytes(admin_key.verify_key),
            True,
            to_micros(self.clock.now()),
            0,
        )
        await self._insert_identity(
            record, grant=attest_identity(admin_key, _granted(record), record.registered_us)
        )
        return record

    async def register(self, envelope: common_pb2.SignedEnvelope) -> IdentityRecord:
        """RegisterIdentity: verified against an Organization administrator's identity key."""
        command = membership_service_pb2.RegisterIdentityCommand()
        admin = await self._verify_org_envelope(envelope, REGISTER_IDENTITY_TYPE, command, "admin_id")
        if not admin.org_admin:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED, f"{admin.identity_id} is not an Organization admin"
            )
        ident = command.identity
        if not ids.is_valid(ident.identity_id) or "#" in ident.identity_id:
            raise Rejected(
                R.REJECTION_REASON_MALFORMED, "identity.identity_id is not a valid id", field="identity_id"
            )
        if (
            ident.kind == common_pb2.IDENTITY_KIND_UNSPECIFIED
            or ident.kind not in common_pb2.IdentityKind.values()
        ):
            raise Rejected(R.REJECTION_REASON_MALFORMED, "identity.kind is required", field="kind")
        if len(ident.public_key) != 32:
            raise Rejected(
                R.REJECTION_REASON_MALFORMED, "identity.public_key must be 32 bytes", field="public_key"
            )
        if len(ident.display_name) > MAX_DISPLAY_NAME_CHARS:
            raise Rejected(
                R.REJECTION_REASON_TOO_LARGE,
                f"identity.display_name is at most {MAX_DISPLAY_NAME_CHARS} characters",
                field="display_name",
                limit=MAX_DISPLAY_NAME_CHARS,
            )
        if not ids.is_valid(command.request_id):
            raise Rejected(R.REJECTION_REASON_MALFORMED, "request_id is required", field="request_id")
        fingerprint = blake3.blake3(envelope.payload).digest()
        async with self._lock:
            async with self.engine.connect() as conn:
                prior = (
                    await conn.execute(
                        select(org_requests).where(org_requests.c.request_id == command.request_id)
                    )
                ).first()
            if prior is not None:
                if bytes(prior.fingerprint) != fingerprint:
                    raise Rejected(
                        R.REJECTION_REASON_COMMAND_ID_REUSED, "request_id was used for another request"
                    )
                existing = await self.get(prior.identity_id)
                assert existing is not None
                return existing
            record = IdentityRecord(
                ident.identity_id,
                ident.kind,
                ident.display_name,
                bytes(ident.public_key),
                ident.org_admin,
                to_micros(self.clock.now()),
                0,
            )
            await self._insert_identity(
                record, grant=envelope.SerializeToString(), request=(command.request_id, fingerprint)
            )
            return record

    async def open_session(self, envelope: common_pb2.SignedEnvelope) -> tuple[membership_pb2.Session, int]:
        """OpenSession: raises the session epoch, fencing the older session (MW-11.3-09). Returns the
        session and the directory revision that records it."""
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
                revision = await self._store_session(
                    record.identity_id, current.session_epoch, command, fingerprint, envelope, now
                )
            except IntegrityError:
                raise Rejected(
                    R.REJECTION_REASON_COMMAND_ID_REUSED, "this OpenSession request was already used (replay)"
                ) from None
            self._identities[record.identity_id] = IdentityRecord(
                current.identity_id,
                current.kind,
                current.display_name,
                current.public_key,
                current.org_admin,
                current.registered_us,
                epoch,
            )
            self._session_keys[(record.identity_id, epoch)] = bytes(command.session_public_key)
        self.note_head(revision)
        session = membership_pb2.Session(
            identity_id=record.identity_id, session_epoch=epoch, session_public_key=command.session_public_key
        )
        session.opened_at.FromMicroseconds(now)
        return session, revision

    # ------------------------------------------------------------ internals

    async def _verify_org_envelope(
        self, envelope: common_pb2.SignedEnvelope, payload_type: str, command: object, signer_field: str
    ) -> IdentityRecord:
        if envelope.payload_type != payload_type:
            raise Rejected(R.REJECTION_REASON_MALFORMED, f"payload_type must be {payload_type}")
        if not envelope.signatures:
            raise Rejected(R.REJECTION_REASON_SIGNATURE_MISSING, "the request is not signed")
        check_signature_count(envelope, "request")
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
        try:
            issued_at = from_timestamp(issued)
        except (ValueError, OverflowError):  # not a Timestamp at all (seconds or nanos out of range)
            raise Rejected(
                R.REJECTION_REASON_MALFORMED, "issued_at is not a valid Timestamp", field="issued_at"
            ) from None
        if abs(issued_at - self.clock.now()) > REPLAY_WINDOW:
            raise Rejected(
                R.REJECTION_REASON_CLOCK_SKEW, "issued_at is outside the replay window (5 minutes)"
            )
        return signer

    @finish_on_cancel
    async def _store_session(
        self,
        identity_id: str,
        current_epoch: int,
        command: membership_service_pb2.OpenSessionCommand,
        fingerprint: bytes,
        envelope: common_pb2.SignedEnvelope,
        now: int,
    ) -> int:
        """The raised epoch, the session and its directory change in one transaction, run to its commit
        even when the caller is cancelled: interrupted mid-statement on SQLite, the closed connection
        would keep the write lock until the garbage collector frees it (storage/aio.py)."""
        epoch = current_epoch + 1
        async with self.engine.begin() as conn:
            result = await conn.execute(
                update(identities)
                .where(
                    and_(identities.c.identity_id == identity_id, identities.c.session_epoch == current_epoch)
                )
                .values(session_epoch=epoch)
            )
            if result.rowcount != 1:
                # Another process opened one: the next attempt reads the epoch afresh.
                self._identities.pop(identity_id, None)
                raise Rejected(R.REJECTION_REASON_REVISION_MISMATCH, "a concurrent session opened; retry")
            await conn.execute(
                insert(sessions).values(
                    identity_id=identity_id,
                    session_epoch=epoch,
                    public_key=bytes(command.session_public_key),
                    opened_us=now,
                    request_fingerprint=fingerprint,
                    grant_envelope=envelope.SerializeToString(),
                )
            )
            return await record_change(
                conn, identity_id, directory_pb2.IDENTITY_CHANGE_KIND_SESSION_OPENED, epoch, now
            )

    @finish_on_cancel
    async def _insert_identity(
        self, record: IdentityRecord, *, grant: bytes, request: tuple[str, bytes] | None = None
    ) -> None:
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
                        grant_envelope=grant,
                    )
                )
                if request is not None:
                    await conn.execute(
                        insert(org_requests).values(
                            request_id=request[0], fingerprint=request[1], identity_id=record.identity_id
                        )
                    )
                # Last: the counter's row lock is held from here to the commit.
                revision = await record_change(
                    conn,
                    record.identity_id,
                    directory_pb2.IDENTITY_CHANGE_KIND_REGISTERED,
                    0,
                    record.registered_us,
                )
        except IntegrityError:
            raise Rejected(
                R.REJECTION_REASON_IDENTITY_EXISTS, f"identity {record.identity_id} already exists"
            ) from None
        self._identities[record.identity_id] = record
        self.note_head(revision)


async def has_identities(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        return bool((await conn.execute(select(identities.c.identity_id).limit(1))).all())


def _wall_us() -> int:
    """Stream liveness is compared across instances: real wall-clock time, not the injected clock."""
    return int(time.time() * 1_000_000)


async def read_revision(conn: AsyncConnection) -> int:
    value = (await conn.execute(select(identity_revision.c.revision))).scalar_one_or_none()
    return int(value or 0)


async def record_change(
    conn: AsyncConnection, identity_id: str, kind: int, session_epoch: int, now_us: int
) -> int:
    """The change's directory revision, in the change's transaction: raising the counter row locks
    it until commit, so concurrent changes (from any process) commit in revision order."""
    await conn.execute(
        update(identity_revision)
        .where(identity_revision.c.singleton == 1)
        .values(revision=identity_revision.c.revision + 1)
    )
    revision = int((await conn.execute(select(identity_revision.c.revision))).scalar_one())
    await conn.execute(
        insert(identity_changes).values(
            revision=revision,
            identity_id=identity_id,
            kind=kind,
            session_epoch=session_epoch,
            recorded_us=now_us,
        )
    )
    return revision


def _granted(record: IdentityRecord) -> GrantedIdentity:
    return GrantedIdentity(
        record.identity_id, record.kind, record.display_name, record.public_key, record.org_admin
    )
