"""``mwp verify``'s blob pass: every blob the artifact index names, checked in the blob store offline.

For each row of ``blobs`` (the index of stored blobs: BLAKE3 hex and size), the blob store (local
disk or S3, configured as ``mwp serve`` configures it) must hold an object of that name, of that
size, whose bytes hash to that name. Findings: ``missing`` (no object), ``size`` (an object of
another size), ``corrupted`` (the bytes hash to something else), ``unreadable`` (the store failed to
answer for it: permissions, I/O, the network). It never stops at the first finding and writes
nothing: neither to the index (no verification marks, D142) nor to the store (the local backend is
read through a reader of its own that creates no directory and sweeps no temporary file).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import blake3
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave_server.services.artifacts.backends import BlobStoreConfig, blobstore_from_config
from missionweave_server.services.artifacts.blobstore import CHUNK_BYTES, check_digest
from missionweave_server.services.artifacts.holder_seal import HolderSeal
from missionweave_server.services.artifacts.schema import LINE, blobs, holders
from missionweave_server.storage import schema_versions

# Index rows read at once (keyset pages, in digest order), and blobs checked side by side (S3's
# round trips overlap; local reads keep the disk busy while a chunk is hashed).
READ_BATCH = 1024
CONCURRENCY = 4


class BlobSource(Protocol):
    """What the check needs of a blob store (``missionweave_server.services.artifacts.blobstore.BlobStore`` has it)."""

    name: str

    async def stored_size(self, digest_hex: str) -> int | None: ...

    def read(self, digest_hex: str, size: int, chunk_bytes: int = CHUNK_BYTES) -> AsyncIterator[bytes]: ...

    async def close(self) -> None: ...


@dataclass
class BlobFinding:
    digest: str  # BLAKE3 hex
    size_bytes: int  # as the index records it
    problem: str  # missing | size | corrupted | unreadable
    detail: str

    def as_dict(self) -> dict[str, object]:
        return {
            "digest": f"blake3:{self.digest}",
            "size_bytes": self.size_bytes,
            "problem": self.problem,
            "detail": self.detail,
        }


@dataclass
class BlobReport:
    backend: str = ""  # local | s3
    location: str = ""  # the directory or the bucket
    indexed: bool = True  # False: the store has no artifact index (nothing to check)
    blobs: int = 0  # checked
    bytes: int = 0  # their sizes, as the index records them
    findings: list[BlobFinding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, object]:
        return {
            "clean": self.clean,
            "backend": self.backend,
            "location": self.location,
            "indexed": self.indexed,
            "blobs": self.blobs,
            "bytes": self.bytes,
            "findings": [f.as_dict() for f in self.findings],
            "seconds": round(self.seconds, 3),
        }


BlobProgress = Callable[[int, int, int, int], None]  # (blobs done, blobs in all, bytes done, bytes in all)


class LocalReader:
    """The local backend's layout (``<data dir>/blobs/ab/cd/<hex>``), read only: unlike
    ``LocalBlobStore`` it creates no directory and touches no temporary file."""

    name = "local"

    def __init__(self, data_dir: Path | str, threads: int = CONCURRENCY) -> None:
        self.root = Path(data_dir) / "blobs"
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="verify-blobs"
        )

    def path_for(self, digest_hex: str) -> Path:
        check_digest(digest_hex)
        return self.root / digest_hex[0:2] / digest_hex[2:4] / digest_hex

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def stored_size(self, digest_hex: str) -> int | None:
        path = self.path_for(digest_hex)

        def size() -> int | None:
            try:
                return path.stat().st_size
            except FileNotFoundError:
                return None

        result: int | None = await self._run(size)
        return result

    def read(self, digest_hex: str, size: int, chunk_bytes: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
        return self._chunks(self.path_for(digest_hex), chunk_bytes)

    async def _chunks(self, path: Path, chunk_bytes: int) -> AsyncIterator[bytes]:
        try:
            handle = await self._run(open, path, "rb")
        except FileNotFoundError:
            raise KeyError(path.name) from None
        try:
            while chunk := await self._run(handle.read, chunk_bytes):
                yield chunk
        finally:
            handle.close()

    async def close(self) -> None:
        self._pool.shutdown(wait=False)


def source_for(config: BlobStoreConfig) -> tuple[BlobSource, str]:
    """The blob store ``config`` names (what ``blobstore_from_env`` would serve), for reading, and
    where it is. S3 is never asked to create its bucket here."""
    if config.backend == "s3":
        from dataclasses import replace

        store: Any = blobstore_from_config(replace(config, s3_create_bucket=False))
        return store, f"s3://{config.s3_bucket}" + (f" at {config.s3_endpoint}" if config.s3_endpoint else "")
    reader = LocalReader(config.data_dir)
    return reader, str(reader.root)


async def check_blob(source: BlobSource, digest_hex: str, size: int) -> BlobFinding | None:
    """None when the store holds ``digest_hex`` at ``size`` bytes hashing to it; the finding otherwise."""
    try:
        stored = await source.stored_size(digest_hex)
        if stored is None:
            return BlobFinding(
                digest_hex, size, "missing", "the index names it, the blob store has no such blob"
            )
        if stored != size:
            return BlobFinding(
                digest_hex, size, "size", f"stored with {stored:,} bytes; the index records {size:,}"
            )
        hasher = blake3.blake3()
        read = 0
        async for chunk in source.read(digest_hex, size, CHUNK_BYTES):
            hasher.update(chunk)
            read += len(chunk)
    except KeyError:  # gone between the size and the read
        return BlobFinding(digest_hex, size, "missing", "the index names it, the blob store has no such blob")
    except Exception as err:  # any failure of the store to answer is a finding about this blob
        return BlobFinding(digest_hex, size, "unreadable", f"the blob store failed to read it: {err!r}")
    if read != size:
        return BlobFinding(digest_hex, size, "size", f"{read:,} bytes read; the index records {size:,}")
    computed = hasher.hexdigest()
    if computed != digest_hex:
        return BlobFinding(digest_hex, size, "corrupted", f"its bytes hash to blake3:{computed}")
    return None


async def verify_blobs(
    engine: AsyncEngine,
    source: BlobSource,
    progress: BlobProgress | None = None,
    concurrency: int = CONCURRENCY,
) -> BlobReport:
    """Check every blob the index at ``engine`` names in ``source``. A store without the artifact
    index (another service's database) is reported ``indexed=False``; one whose index is at another
    schema revision is refused (``schema_versions.SchemaMismatch``), as a service start would be."""
    started = time.monotonic()
    report = BlobReport(backend=source.name)
    status = (await schema_versions.statuses(engine, [LINE]))[0]
    if status.state is schema_versions.State.EMPTY:
        report.indexed = False
        return report
    refusal = status.refusal()
    if refusal is not None:
        raise schema_versions.SchemaMismatch(refusal)
    async with engine.connect() as conn:
        total, total_bytes = (
            await conn.execute(select(func.count(), func.coalesce(func.sum(blobs.c.size_bytes), 0)))
        ).one()
    total, total_bytes = int(total), int(total_bytes)
    after = ""
    while True:
        async with engine.connect() as conn:
            page = [
                (str(r[0]), int(r[1]))
                for r in await conn.execute(
                    select(blobs.c.digest, blobs.c.size_bytes)
                    .where(blobs.c.digest > after)
                    .order_by(blobs.c.digest)
                    .limit(READ_BATCH)
                )
            ]
        if not page:
            break
        after = page[-1][0]
        for start in range(0, len(page), concurrency):
            group = page[start : start + concurrency]
            found = await asyncio.gather(*(check_blob(source, digest, size) for digest, size in group))
            report.findings.extend(f for f in found if f is not None)
            report.blobs += len(group)
            report.bytes += sum(size for _, size in group)
            if progress is not None:
                progress(report.blobs, max(total, report.blobs), report.bytes, max(total_bytes, report.bytes))
    report.seconds = time.monotonic() - started
    return report


async def unsealed_holders(engine: AsyncEngine, seal: HolderSeal) -> tuple[int, list[tuple[str, str]]]:
    """``mwp verify``'s check of the holder rows (D172): how many there are, and the (digest,
    identity) of each whose seal does not hold (written outside the artifact service)."""
    query = select(holders.c.digest, holders.c.identity_id, holders.c.size_bytes, holders.c.holder_seal)
    async with engine.connect() as conn:
        rows = (await conn.execute(query.order_by(holders.c.digest, holders.c.identity_id))).all()
    bad = [
        (r.digest, r.identity_id)
        for r in rows
        if not seal.holds(r.digest, r.identity_id, int(r.size_bytes), r.holder_seal)
    ]
    return len(rows), bad
