"""The artifact index in the shared database: stored blobs, their holders, signed manifests,
provenance edges."""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Insert,
    String,
    Table,
    TextClause,
    and_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave_server.services.artifacts.holder_seal import HolderSeal
from missionweave_server.services.artifacts.schema import (
    blobs,
    holders,
    holdings,
    manifests,
    provenance,
    upload_reservations,
)
from missionweave_server.services.artifacts.verified_marks import VerifiedMarks
from missionweave_server.storage.aio import finish_on_cancel
from missionweave_server.storage.db import TransactionRunner, compiled_once, dialect_insert

log = logging.getLogger("missionweave.artifacts.index")


@dataclass(frozen=True)
class BlobRecord:
    digest: str
    size_bytes: int
    stored_us: int
    verified_us: int


@dataclass(frozen=True)
class ManifestRecord:
    manifest_digest: str
    content_digest: str
    producer_agent_id: str
    group_id: str
    work_item_id: str
    media_type: str
    envelope: bytes


@dataclass(frozen=True)
class Edge:
    """A provenance edge and the manifest that declares it (whose Group and producer decide who
    may follow it)."""

    source: str
    derived: str
    manifest_digest: str
    group_id: str
    producer_agent_id: str


_IN_BATCH = 500  # digests per IN (...) clause


def _lock_quota_of(conn: Connection, identity_id: str) -> None:
    """One identity's reservations one at a time across replicas (PostgreSQL; on SQLite the write
    lock taken at BEGIN IMMEDIATE serialises them)."""
    if conn.dialect.name == "postgresql":
        key = int.from_bytes(
            hashlib.blake2b(b"mwp-quota:" + identity_id.encode(), digest_size=8).digest(), "big", signed=True
        )
        conn.execute(_ADVISORY_LOCK, {"key": key})


# An upload's and a download's statements, built once with bound parameters (D153): SQLAlchemy
# computes a statement's cache key by walking its whole tree, once per statement object, so a
# statement built per call costs that walk (and its construction) on every upload.
def _id(name: str) -> Any:
    return bindparam(name, type_=String)


def _int(name: str) -> Any:
    return bindparam(name, type_=BigInteger)


_ADVISORY_LOCK = select(func.pg_advisory_xact_lock(_int("key")))
_OF_IDENTITY = upload_reservations.c.identity_id == _id("identity_id")
_HELD = select(
    func.coalesce(
        select(holdings.c.held_bytes).where(holdings.c.identity_id == _id("identity_id")).scalar_subquery(), 0
    )
)
_RECEIVING = select(func.coalesce(func.sum(upload_reservations.c.size_bytes), 0)).where(_OF_IDENTITY)
_STORED = select(blobs.c.digest).where(blobs.c.digest == _id("digest"), blobs.c.size_bytes == _int("size"))
_LAPSED = delete(upload_reservations).where(_OF_IDENTITY, upload_reservations.c.expires_us < _int("now_us"))
_ENDED = delete(upload_reservations).where(
    upload_reservations.c.reservation_id.in_(bindparam("ended", expanding=True))
)
_HAD = select(holders.c.digest).where(
    holders.c.identity_id == _id("identity_id"), holders.c.digest.in_(bindparam("digests", expanding=True))
)
_BLOB = select(blobs).where(blobs.c.digest == _id("digest"))
_BLOB_HELD = (
    select(blobs, holders.c.size_bytes.label("held_size"), holders.c.holder_seal)
    .select_from(
        blobs.outerjoin(
            holders, and_(holders.c.digest == blobs.c.digest, holders.c.identity_id == _id("identity_id"))
        )
    )
    .where(blobs.c.digest == _id("digest"))
)


def _reservation(unless_stored: bool) -> Insert:
    """The reservation, made only when the identity's holdings, its uploads in progress and
    ``size`` fit ``quota`` (and, ``unless_stored``, no blob of that digest and size is stored)."""
    wanted = _HELD.scalar_subquery() + _RECEIVING.scalar_subquery() + _int("size") <= _int("quota")
    if unless_stored:
        wanted = and_(wanted, ~_STORED.exists())
    return insert(upload_reservations).from_select(
        ["reservation_id", "identity_id", "size_bytes", "expires_us"],
        select(_id("reservation_id"), _id("identity_id"), _int("size"), _int("expires_us")).where(wanted),
    )


_RESERVE = {False: _reservation(False), True: _reservation(True)}


def _batches(values: Iterable[str]) -> list[list[str]]:
    wanted = sorted(set(values))
    return [wanted[start : start + _IN_BATCH] for start in range(0, len(wanted), _IN_BATCH)]


def _insert_new(engine: AsyncEngine, table: Table, keys: tuple[str, ...]) -> TextClause:
    """INSERT that skips rows whose ``keys`` exist already (SQLite and PostgreSQL share the syntax)."""
    statement = dialect_insert(engine.dialect.name, table).on_conflict_do_nothing(
        index_elements=[table.c[k] for k in keys]
    )
    return compiled_once(statement, engine.dialect.name)


class ArtifactIndex:
    def __init__(self, engine: AsyncEngine, seal: HolderSeal | None = None) -> None:
        self.engine = engine
        # Seals the holder rows written and checks those read (D172); None: neither (tests, benches).
        self.seal = seal
        # The dialect's INSERTs, built and compiled once.
        self._new_blobs = _insert_new(engine, blobs, ("digest",))
        self._new_holders = _insert_new(engine, holders, ("digest", "identity_id"))
        grown = dialect_insert(engine.dialect.name, holdings).values(
            identity_id=_id("identity_id"), held_bytes=_int("grown")
        )
        self._grow_holdings = compiled_once(
            grown.on_conflict_do_update(
                index_elements=[holdings.c.identity_id],
                set_={"held_bytes": holdings.c.held_bytes + grown.excluded.held_bytes},
            ),
            engine.dialect.name,
        )
        self.marks = VerifiedMarks(self._write_marks)
        # An upload's and a download's own statements, each transaction in one step (D147).
        self.transactions = TransactionRunner(engine)

    async def close(self) -> None:
        """Writes the verification times still held (D142) and ends the transaction threads."""
        await self.marks.close()
        await self.transactions.close()

    async def blob(self, digest: str) -> BlobRecord | None:
        row = await self.transactions.run(lambda conn: conn.execute(_BLOB, {"digest": digest}).first())
        return None if row is None else self._record(row)

    async def blob_held(self, digest: str, identity_id: str) -> tuple[BlobRecord | None, bool]:
        """``blob`` and whether ``identity_id`` holds it, in one statement (a Download's lookup)."""
        values = {"digest": digest, "identity_id": identity_id}
        row = await self.transactions.run(lambda conn: conn.execute(_BLOB_HELD, values).first())
        if row is None:
            return None, False
        return self._record(row), self._holds(digest, identity_id, row.held_size, row.holder_seal)

    def _holds(self, digest: str, identity_id: str, size: int | None, seal: bytes | None) -> bool:
        """A holder row grants reading only with its seal (when this index seals, D172)."""
        if size is None:
            return False
        if self.seal is None or self.seal.holds(digest, identity_id, int(size), seal):
            return True
        log.error(
            "a holder row is not sealed by the artifact service: written outside it, it grants nothing",
            extra={"digest": digest, "identity": identity_id},
        )
        return False

    def _record(self, row: Any) -> BlobRecord:
        return BlobRecord(row[0], int(row[1]), int(row[2]), self.marks.overlay(row[0], int(row[3])))

    async def sizes(self, digests: Iterable[str]) -> dict[str, int]:
        """The stored size of each of ``digests`` that is stored (as ``blob``, for many at once)."""
        found: dict[str, int] = {}
        async with self.engine.connect() as conn:
            for batch in _batches(digests):
                rows = await conn.execute(
                    select(blobs.c.digest, blobs.c.size_bytes).where(blobs.c.digest.in_(batch))
                )
                found.update((r[0], int(r[1])) for r in rows)
        return found

    async def held(
        self, digests: Sequence[str], group_id: str, producer: str, most: int, work_item_id: str = ""
    ) -> dict[str, tuple[int, list[tuple[ManifestRecord, tuple[str, ...]]]]]:
        """For each of ``digests`` that is stored: its size and the manifests ``producer`` signed for
        ``group_id`` (naming ``work_item_id`` when given; at most ``most`` each, in manifest-digest
        order) with their sources. One transaction in one step: the Authority asks this for every
        submission (D161)."""

        def body(conn: Connection) -> dict[str, tuple[int, list[tuple[ManifestRecord, tuple[str, ...]]]]]:
            wanted = sorted(set(digests))
            sizes = {
                r[0]: int(r[1])
                for r in conn.execute(
                    select(blobs.c.digest, blobs.c.size_bytes).where(blobs.c.digest.in_(wanted))
                )
            }
            records = (
                [
                    ManifestRecord(r[0], r[1], r[2], r[3], r[4], r[5], bytes(r[6]))
                    for r in conn.execute(
                        select(manifests)
                        .where(manifests.c.content_digest.in_(list(sizes)))
                        .where(manifests.c.producer_agent_id == producer)
                        .where(manifests.c.group_id == group_id)
                        .where(manifests.c.work_item_id == work_item_id if work_item_id else true())
                        .order_by(manifests.c.manifest_digest)
                    )
                ]
                if sizes
                else []
            )
            sources: dict[str, list[str]] = {}
            if records:
                edges = conn.execute(
                    select(provenance.c.manifest_digest, provenance.c.source_digest)
                    .where(provenance.c.manifest_digest.in_([m.manifest_digest for m in records]))
                    .order_by(provenance.c.source_digest)
                )
                for manifest_digest, source in edges:
                    sources.setdefault(manifest_digest, []).append(source)
            out: dict[str, tuple[int, list[tuple[ManifestRecord, tuple[str, ...]]]]] = {
                d: (s, []) for d, s in sizes.items()
            }
            for record in records:
                listed = out[record.content_digest][1]
                if len(listed) < most:
                    listed.append((record, tuple(sources.get(record.manifest_digest, ()))))
            return out

        return await self.transactions.run(body)

    async def present(self, digests: Iterable[str]) -> set[str]:
        found: set[str] = set()
        async with self.engine.connect() as conn:
            for batch in _batches(digests):
                rows = await conn.execute(select(blobs.c.digest).where(blobs.c.digest.in_(batch)))
                found.update(r[0] for r in rows)
        return found

    # ------------------------------------------------------------ holders (issue 13 item 3)

    # ------------------------------------------------------------ quota reservations (D119)

    async def reserve(
        self,
        identity_id: str,
        size: int,
        quota: int,
        now_us: int,
        expires_us: int,
        *,
        unless_stored: str = "",
    ) -> tuple[str | None, int]:
        """Reserve ``size`` bytes of ``identity_id``'s quota for an upload about to be received, when
        what it holds plus its uploads in progress on any replica leave room. Returns the reservation
        id and 0, or "" and the bytes in use when refused. One identity's reservations are made one at
        a time across replicas (a PostgreSQL transaction lock on the identity; SQLite's one writer,
        taken at BEGIN), so two uploads can never both count the room that only one of them fits.

        With ``unless_stored`` (a digest): when a blob of that digest and ``size`` is stored already,
        nothing is reserved and (None, 0) is returned; the upload's lookup and its reservation are then
        one transaction, its reservation one statement."""
        reservation = secrets.token_hex(16)
        values = {
            "reservation_id": reservation,
            "identity_id": identity_id,
            "size": size,
            "quota": quota,
            "expires_us": expires_us,
            "now_us": now_us,
            "digest": unless_stored,
        }

        def reserve(conn: Connection) -> tuple[str | None, int]:
            _lock_quota_of(conn, identity_id)
            # Lapsed reservations (their replica died mid-upload) count no more: gone now.
            conn.execute(_LAPSED, values)
            if conn.execute(_RESERVE[bool(unless_stored)], values).rowcount == 1:
                return reservation, 0
            if unless_stored and conn.scalar(_STORED, values) is not None:
                return None, 0
            return "", int(conn.scalar(_HELD, values) or 0) + int(conn.scalar(_RECEIVING, values) or 0)

        return await self.transactions.run(reserve, immediate=True)

    @finish_on_cancel  # an upload's end cancels its renewals, maybe mid-statement
    async def renew(self, reservation: str, expires_us: int) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(upload_reservations)
                .where(upload_reservations.c.reservation_id == reservation)
                .values(expires_us=expires_us)
            )

    @finish_on_cancel  # runs in the clean-up of a cancelled upload
    async def release(self, reservation: str) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                delete(upload_reservations).where(upload_reservations.c.reservation_id == reservation)
            )

    async def held_by(self, identity_id: str, digests: Iterable[str]) -> set[str]:
        """Which of ``digests`` ``identity_id`` holds."""
        found: set[str] = set()
        async with self.engine.connect() as conn:
            for batch in _batches(digests):
                rows = await conn.execute(
                    select(holders.c.digest, holders.c.size_bytes, holders.c.holder_seal).where(
                        and_(holders.c.identity_id == identity_id, holders.c.digest.in_(batch))
                    )
                )
                found.update(
                    r.digest for r in rows if self._holds(r.digest, identity_id, r.size_bytes, r.holder_seal)
                )
        return found

    async def groups_referencing(self, digests: Iterable[str]) -> dict[str, set[str]]:
        """For each of ``digests``, the Groups a recorded manifest names for it (those without any
        are left out)."""
        found: dict[str, set[str]] = {}
        async with self.engine.connect() as conn:
            for batch in _batches(digests):
                rows = await conn.execute(
                    select(manifests.c.content_digest, manifests.c.group_id)
                    .where(manifests.c.content_digest.in_(batch))
                    .distinct()
                )
                for digest, group in rows:
                    found.setdefault(digest, set()).add(group)
        return found

    async def record_stored(
        self,
        stored: Iterable[tuple[str, int]],
        held: Iterable[tuple[str, int]],
        identity_id: str,
        now_us: int,
        reservations: Iterable[str] = (),
    ) -> None:
        """Each of ``stored`` recorded as stored and, when ``identity_id`` is set, the identity as a
        holder of each of ``held`` (it proved it has these bytes: they hashed to the digest), ending
        ``reservations`` (D119), in one transaction: one commit for an upload, or a whole
        BatchUpload. Rows already there are left as they are (a concurrent upload of the same
        bytes); the identity's ``holdings`` grow by the sizes of the holders it did not have."""
        ended = list(reservations)
        blob_rows = {
            d: {"digest": d, "size_bytes": n, "stored_us": now_us, "verified_us": now_us} for d, n in stored
        }
        held_sizes = dict(held) if identity_id else {}
        holder_rows = {
            d: {
                "digest": d,
                "identity_id": identity_id,
                "size_bytes": n,
                "stored_us": now_us,
                "holder_seal": None if self.seal is None else self.seal.seal(d, identity_id, n),
            }
            for d, n in held_sizes.items()
        }
        if not blob_rows and not holder_rows and not ended:
            return

        def record(conn: Connection) -> None:
            if holder_rows:
                # First, as ``reserve`` takes it: the holdings grow by the holders that are new, and
                # two replicas recording the same holder must not both count it (PostgreSQL; on
                # SQLite the write lock taken at BEGIN IMMEDIATE serialises them).
                _lock_quota_of(conn, identity_id)
            for batch in _batches(ended):
                conn.execute(_ENDED, {"ended": batch})
            if blob_rows:
                conn.execute(self._new_blobs, list(blob_rows.values()))
            if not holder_rows:
                return
            had: set[str] = set()
            for batch in _batches(holder_rows):
                had.update(conn.scalars(_HAD, {"identity_id": identity_id, "digests": batch}))
            fresh = [digest for digest in holder_rows if digest not in had]
            if not fresh:
                return
            conn.execute(self._new_holders, [holder_rows[d] for d in fresh])
            conn.execute(
                self._grow_holdings, {"identity_id": identity_id, "grown": sum(held_sizes[d] for d in fresh)}
            )

        await self.transactions.run(record, immediate=True)

    def note_verified(self, digests: Iterable[str], now_us: int) -> None:
        """Each of ``digests`` matched its hash at ``now_us``: written behind (``VerifiedMarks``)."""
        for digest in digests:
            self.marks.note(digest, now_us)

    @finish_on_cancel  # the service's stop cancels the timer that writes them
    async def _write_marks(self, marks: dict[str, int]) -> None:
        rows = [{"d": d, "v": v} for d, v in marks.items()]
        statement = (
            update(blobs)
            .where(blobs.c.digest == bindparam("d"), blobs.c.verified_us < bindparam("v"))
            .values(verified_us=bindparam("v"))
        )
        async with self.engine.begin() as conn:
            await conn.execute(statement, rows)

    async def record_manifest(self, record: ManifestRecord, sources: Iterable[str]) -> None:
        try:
            async with self.engine.begin() as conn:
                await conn.execute(insert(manifests).values(**record.__dict__))
                edges = [
                    {
                        "source_digest": s,
                        "derived_digest": record.content_digest,
                        "manifest_digest": record.manifest_digest,
                    }
                    for s in set(sources)
                ]
                if edges:
                    await conn.execute(insert(provenance), edges)
        except IntegrityError:
            pass  # the same signed manifest uploaded again

    async def manifests_of(
        self, digest: str, work_item_id: str = "", producer: str = ""
    ) -> list[ManifestRecord]:
        clauses = [manifests.c.content_digest == digest]
        if work_item_id:
            clauses.append(manifests.c.work_item_id == work_item_id)
        if producer:
            clauses.append(manifests.c.producer_agent_id == producer)
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(manifests).where(and_(*clauses)).order_by(manifests.c.manifest_digest)
            )
            return [ManifestRecord(r[0], r[1], r[2], r[3], r[4], r[5], bytes(r[6])) for r in rows]

    async def sources_of(self, manifest_digest: str) -> tuple[str, ...]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(provenance.c.source_digest)
                .where(provenance.c.manifest_digest == manifest_digest)
                .order_by(provenance.c.source_digest)
            )
            return tuple(r[0] for r in rows)

    async def manifest_count(self, digest: str) -> int:
        return len(await self.manifests_of(digest))

    async def edges_touching(self, digests: set[str]) -> list[Edge]:
        """The edges with either end in ``digests``, with their manifest's Group and producer."""
        found: list[Edge] = []
        async with self.engine.connect() as conn:
            for batch in _batches(digests):
                rows = await conn.execute(
                    select(
                        provenance.c.source_digest,
                        provenance.c.derived_digest,
                        provenance.c.manifest_digest,
                        manifests.c.group_id,
                        manifests.c.producer_agent_id,
                    )
                    .select_from(
                        provenance.join(
                            manifests, manifests.c.manifest_digest == provenance.c.manifest_digest
                        )
                    )
                    .where(or_(provenance.c.source_digest.in_(batch), provenance.c.derived_digest.in_(batch)))
                )
                found.extend(Edge(r[0], r[1], r[2], r[3], r[4]) for r in rows)
        return list(dict.fromkeys(found))  # an edge with both ends in different batches comes twice
