"""The artifact index in the shared database: stored blobs, signed manifests, provenance edges."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from artifactstore.schema import blobs, manifests, provenance


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


class ArtifactIndex:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def blob(self, digest: str) -> BlobRecord | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(blobs).where(blobs.c.digest == digest))).first()
        return None if row is None else BlobRecord(row[0], int(row[1]), int(row[2]), int(row[3]))

    async def present(self, digests: Iterable[str]) -> set[str]:
        wanted = list(set(digests))
        found: set[str] = set()
        async with self.engine.connect() as conn:
            for start in range(0, len(wanted), 500):
                rows = await conn.execute(
                    select(blobs.c.digest).where(blobs.c.digest.in_(wanted[start : start + 500]))
                )
                found.update(r[0] for r in rows)
        return found

    async def record_blob(self, digest: str, size: int, now_us: int) -> None:
        try:
            async with self.engine.begin() as conn:
                await conn.execute(
                    insert(blobs).values(digest=digest, size_bytes=size, stored_us=now_us, verified_us=now_us)
                )
        except IntegrityError:
            pass  # a concurrent upload of the same bytes won: same identity, nothing to do

    async def mark_verified(self, digest: str, now_us: int) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(update(blobs).where(blobs.c.digest == digest).values(verified_us=now_us))

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

    async def edges_touching(self, digests: set[str]) -> list[tuple[str, str, str]]:
        """(source, derived, manifest) edges with either end in ``digests``."""
        wanted = list(digests)
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(
                    provenance.c.source_digest, provenance.c.derived_digest, provenance.c.manifest_digest
                ).where(or_(provenance.c.source_digest.in_(wanted), provenance.c.derived_digest.in_(wanted)))
            )
            return [(r[0], r[1], r[2]) for r in rows]
