"""Hash-while-streaming for both directions, written once for every backend (MW-13.1-05).

Reads hold back the last chunk of the requested range until the whole blob's hash is confirmed, so
a blob altered at rest never reaches a client whole: the stream fails with DATA_LOSS first.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import blake3

from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2
from missionweave_server.observability import metrics
from missionweave_server.services.artifacts.blobstore import (
    CHUNK_BYTES,
    EMPTY_BLAKE3,
    HEX64,
    MAX_BLOB_BYTES,
    BlobStore,
)

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.artifacts")


class Counters:
    """Process-wide integrity counters (exposed in logs; a metrics endpoint can read them)."""

    corrupted_reads = 0
    rejected_uploads = 0


def artifact_error(reason: int, code: str, message: str, **metadata: object) -> Rejected:
    return Rejected(reason, message, artifact_error=f"ARTIFACT_ERROR_CODE_{code}", **metadata)  # type: ignore[arg-type]


def check_digest(digest: common_pb2.Digest, field: str = "digest") -> tuple[str, int]:
    """A well-formed BLAKE3 identity: ``(hex, size)``; anything path-like or malformed is refused."""
    if digest.algorithm != "blake3" or not HEX64.fullmatch(digest.hex):
        raise artifact_error(
            R.REJECTION_REASON_MALFORMED,
            "MALFORMED_DIGEST",
            f"{field}: blake3 and 64 lowercase hex characters",
            field=field,
        )
    if digest.size_bytes > MAX_BLOB_BYTES:
        raise artifact_error(
            R.REJECTION_REASON_TOO_LARGE,
            "TOO_LARGE",
            f"{field}: blobs are at most {MAX_BLOB_BYTES} bytes",
            limit=MAX_BLOB_BYTES,
        )
    if digest.size_bytes == 0 and digest.hex != EMPTY_BLAKE3:
        raise artifact_error(
            R.REJECTION_REASON_DIGEST_MISMATCH, "DIGEST_MISMATCH", f"{field}: size 0 is the empty blob only"
        )
    return digest.hex, int(digest.size_bytes)


def check_piece(offset: int, length: int, received: int, size: int) -> None:
    """An upload's next piece starts where the last ended and stays within the declared size."""
    if offset != received or received + length > size:
        raise artifact_error(
            R.REJECTION_REASON_INVALID_ARGUMENT,
            "CHUNK_OUT_OF_RANGE",
            f"chunk at {offset}+{length}: expected offset {received} within size {size}",
        )


def check_received(hex_digest: str, size: int, received: int, computed_hex: str) -> None:
    """An upload's bytes are complete and hash to the declared digest (what commits a blob: the
    single Upload and each blob of a BatchUpload alike)."""
    if received != size:
        raise artifact_error(
            R.REJECTION_REASON_INVALID_ARGUMENT,
            "INCOMPLETE_UPLOAD",
            f"received {received} of {size} bytes",
        )
    if computed_hex != hex_digest:
        metrics.ARTIFACT_VERIFICATION_FAILURES.labels("upload").inc()
        raise artifact_error(
            R.REJECTION_REASON_DIGEST_MISMATCH,
            "DIGEST_MISMATCH",
            f"the bytes hash to blake3:{computed_hex}, not the declared blake3:{hex_digest}",
        )


def check_whole(hex_digest: str, size: int, data: bytes) -> None:
    """One piece holding the whole blob (a BatchUpload blob): the checks of a streamed upload."""
    check_piece(0, len(data), 0, size)
    check_received(hex_digest, size, len(data), blake3.blake3(data).hexdigest())


async def verified_range(
    store: BlobStore, hex_digest: str, size: int, offset: int = 0, length: int = 0
) -> AsyncIterator[tuple[int, bytes]]:
    """``(offset, bytes)`` pieces of ``[offset, offset+length)`` (length 0 = to the end), verified.

    The whole blob is hashed whatever the range (the hash covers all of it); the last piece is only
    yielded after the digest and size matched.
    """
    if offset > size or (length and offset + length > size):
        raise artifact_error(
            R.REJECTION_REASON_INVALID_ARGUMENT,
            "RANGE_NOT_SATISFIABLE",
            f"range {offset}+{length} exceeds size {size}",
        )
    end = offset + length if length else size
    if size == 0:
        return
    hasher = blake3.blake3()
    position = 0
    held: tuple[int, bytes] | None = None
    try:
        async for chunk in store.read(hex_digest, size, CHUNK_BYTES):
            hasher.update(chunk)
            start, stop = position, position + len(chunk)
            position = stop
            if stop <= offset or start >= end:
                continue
            piece = chunk[max(0, offset - start) : min(len(chunk), end - start)]
            if held is not None:
                yield held
            held = (max(start, offset), piece)
    except KeyError:
        raise artifact_error(
            R.REJECTION_REASON_NOT_FOUND, "NOT_FOUND", f"no blob blake3:{hex_digest}"
        ) from None
    if position != size or hasher.hexdigest() != hex_digest:
        Counters.corrupted_reads += 1
        metrics.ARTIFACT_VERIFICATION_FAILURES.labels("at_rest").inc()
        log.error(
            "stored blob failed verification", extra={"digest": f"blake3:{hex_digest}", "backend": store.name}
        )
        raise artifact_error(
            R.REJECTION_REASON_DATA_CORRUPTED,
            "CORRUPTED",
            f"blake3:{hex_digest} failed verification at rest; not served",
        )
    if held is not None:
        yield held
