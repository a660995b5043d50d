"""The one small interface every blob backend implements (local filesystem, S3-compatible).

Identity is the BLAKE3 digest *and* the size (``blake3:<64 hex>`` plus ``size_bytes``). Backends
store and return raw bytes only; verification (hashing while streaming, holding back the last chunk)
lives in ``artifactstore/verify.py`` so it is written once for every backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from missionweave.digests import CHUNK_BYTES, EMPTY_BLAKE3, HEX64

__all__ = ["CHUNK_BYTES", "EMPTY_BLAKE3", "HEX64", "MAX_BLOB_BYTES", "BlobStore", "BlobWriter"]

MAX_BLOB_BYTES = 4 * 1024**3  # 4 GiB per blob


class BlobWriter(Protocol):
    """An upload in progress: bytes go to a temporary object that nobody can read yet."""

    async def write(self, data: bytes) -> None: ...

    async def commit(self) -> None:
        """Publish atomically under the digest (temp file rename / S3 multipart completion)."""

    async def abort(self) -> None:
        """Discard everything written; nothing stays visible."""


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

    async def close(self) -> None: ...
