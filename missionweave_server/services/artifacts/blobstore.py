"""The one small interface every blob backend implements (local filesystem, S3-compatible).

Identity is the BLAKE3 digest *and* the size (``blake3:<64 hex>`` plus ``size_bytes``). Backends
store and return raw bytes only; verification (hashing while streaming, holding back the last chunk)
lives in ``missionweave_server/services/artifacts/verify.py`` so it is written once for every backend.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from missionweave.kernel.digests import CHUNK_BYTES, EMPTY_BLAKE3, HEX64

__all__ = [
    "CHUNK_BYTES",
    "EMPTY_BLAKE3",
    "HEX64",
    "MAX_BLOB_BYTES",
    "BlobStore",
    "BlobWriter",
    "put_each",
    "storage_full",
]

MAX_BLOB_BYTES = 4 * 1024**3  # 4 GiB per blob


def check_digest(digest_hex: object) -> str:
    """The digest if it is exactly 64 lowercase hex characters; ValueError for anything else.

    This is the only gate between client input and a filesystem path or object key, so it uses
    ``fullmatch``: ``HEX64.match`` would accept a trailing newline (``$`` matches before it).
    """
    if not isinstance(digest_hex, str) or HEX64.fullmatch(digest_hex) is None:
        raise ValueError(f"not a 64-hex BLAKE3 digest: {str(digest_hex)[:80]!r}")
    return digest_hex


def check_size(size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_BLOB_BYTES:
        raise ValueError(f"blob size must be an integer in [0, {MAX_BLOB_BYTES}], got {size!r}")
    return size


class BlobWriter(Protocol):
    """An upload in progress: bytes go to a temporary object that nobody can read yet."""

    async def write(self, data: bytes) -> None: ...

    async def commit(self) -> None:
        """Publish atomically under the digest (temp file rename / S3 multipart completion)."""

    async def abort(self) -> None:
        """Discard everything written; nothing stays visible."""


class CountingWriter:
    """A writer for bytes that are stored already: counts them against the declared size and keeps
    nothing (the caller hashes them). Used for a blob the store has (S3 dedup) and for a caller
    proving it holds an existing blob's bytes."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._written = 0

    async def write(self, data: bytes) -> None:
        if self._written + len(data) > self._size:
            raise ValueError(f"more bytes than the declared size {self._size}")
        self._written += len(data)

    async def commit(self) -> None:
        if self._written != self._size:
            raise ValueError(f"wrote {self._written} bytes, declared {self._size}")

    async def abort(self) -> None:
        return None


class BlobStore(Protocol):
    name: str  # "local" or "s3", for logs and metrics

    async def exists(self, digest_hex: str, size: int) -> bool: ...

    async def open_writer(self, digest_hex: str, size: int) -> BlobWriter: ...

    def read(self, digest_hex: str, size: int, chunk_bytes: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
        """The stored bytes from the start, in chunks (raises KeyError when absent)."""
        ...

    async def stored_size(self, digest_hex: str) -> int | None:
        """The size of the stored object, or None when absent."""
        ...

    async def put_many(self, blobs: Sequence[tuple[str, bytes]]) -> list[BaseException | None]:
        """Stores small blobs whose bytes were already verified against their digests (BatchUpload):
        per blob, None once it is durable and visible, else its failure (nothing of it kept)."""
        ...

    async def close(self) -> None: ...


async def put_each(store: BlobStore, blobs: Sequence[tuple[str, bytes]]) -> list[BaseException | None]:
    """``put_many`` through the store's writers, all blobs at once (the store bounds its own
    concurrency): for a backend whose writes gain nothing from being grouped (S3's PutObject)."""

    async def put(digest_hex: str, data: bytes) -> None:
        writer = await store.open_writer(digest_hex, len(data))
        try:
            await writer.write(data)
            await writer.commit()
        except BaseException:
            await writer.abort()
            raise

    outcomes = await asyncio.gather(*(put(d, data) for d, data in blobs), return_exceptions=True)
    return [o if isinstance(o, BaseException) else None for o in outcomes]


# How a backend says it has no room: the local disk's errno, or an S3-compatible server's error code
# (MinIO's full disks and bucket quotas, Ceph RGW's quotas, the generic 507).
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_FULL_S3_CODES = frozenset(
    {
        "XMinioStorageFull",
        "XMinioAdminBucketQuotaExceeded",
        "InsufficientStorage",
        "QuotaExceeded",
    }
)


def storage_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says the backend is out of space.

    Backends raise what their storage raised; the service maps these to QUOTA_EXCEEDED with the
    artifact error STORAGE_FULL (after aborting the writer, so nothing partial remains)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        response: Any = getattr(current, "response", None)  # botocore.exceptions.ClientError
        if isinstance(response, dict):
            code = str((response.get("Error") or {}).get("Code", ""))
            status = str((response.get("ResponseMetadata") or {}).get("HTTPStatusCode", ""))
            if code in _FULL_S3_CODES or status == "507":
                return True
        current = current.__cause__ or current.__context__
    return False
