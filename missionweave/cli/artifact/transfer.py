"""How ``mwp artifact`` moves bytes: files read in CHUNK_BYTES pieces and hashed in one streaming
pass (``hash_file``), a download streamed into a sink with its pieces checked to be contiguous and
complete and, for a whole blob, re-hashed locally (``receive``), output written to a temporary file
renamed onto the target only when complete (``replacing``), and the one-line transfer meter on
stderr (``Progress``, shown by ``progress`` with --progress or on a terminal for large transfers).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Self

import blake3

from missionweave.cli.artifact.arguments import Digest, digest_text
from missionweave.cli.common import CliError
from missionweave.kernel.digests import CHUNK_BYTES
from missionweave.sdk.client import MeshClient
from missionweave.v1 import artifact_service_pb2 as apb

MiB = 1024 * 1024
PROGRESS_MIN_BYTES = 8 * MiB  # on a terminal, transfers at least this large show a progress bar


class TransferError(CliError):
    """Received bytes that do not match what was asked for (a client-side check: exit code 1)."""


class Progress:
    """A one-line transfer meter on stderr (percent, MiB done, MB/s); does nothing when disabled."""

    REDRAW_SECONDS = 0.1
    WIDTH = 24

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label = label
        self.total = total
        self.enabled = enabled
        self.done = 0
        self.started = time.monotonic()
        self.drawn = 0.0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            sys.stderr.write("\n")

    def advance(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if self.enabled and now - self.drawn >= self.REDRAW_SECONDS:
            self.drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        percent = 100 * self.done // self.total if self.total else 100
        filled = self.WIDTH * percent // 100
        rate = self.done / max(now - self.started, 1e-6) / 1e6
        sys.stderr.write(
            f"\r{self.label:<6} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {percent:3d}%"
            f" {self.done / MiB:8.1f}/{self.total / MiB:.1f} MiB {rate:8.1f} MB/s"
        )
        sys.stderr.flush()


def progress(args: argparse.Namespace, label: str, total: int) -> Progress:
    """Shown with --progress, or on a terminal for transfers of at least PROGRESS_MIN_BYTES."""
    shown = bool(args.progress) or (sys.stderr.isatty() and total >= PROGRESS_MIN_BYTES)
    return Progress(label, total, shown)


@dataclass(frozen=True)
class FileHashes:
    blake3_hex: str
    size: int
    sha256_hex: str = ""

    @property
    def digest(self) -> Digest:
        return Digest(algorithm="blake3", hex=self.blake3_hex, size_bytes=self.size)


def read_chunks(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` of the file in CHUNK_BYTES pieces."""
    with path.open("rb") as fh:
        offset = 0
        while data := fh.read(CHUNK_BYTES):
            yield offset, data
            offset += len(data)


def hash_file(path: Path, bar: Progress, *, sha256: bool) -> FileHashes:
    """BLAKE3 (and, for a manifest, SHA-256) of the file in one streaming pass."""
    b3 = blake3.blake3(max_threads=blake3.blake3.AUTO)
    sha = hashlib.sha256() if sha256 else None
    size = 0
    for _, data in read_chunks(path):
        b3.update(data)
        if sha is not None:
            sha.update(data)
        size += len(data)
        bar.advance(len(data))
    return FileHashes(b3.hexdigest(), size, sha.hexdigest() if sha else "")


@contextmanager
def replacing(output: Path) -> Iterator[BinaryIO]:
    """A file object on a temporary file next to ``output``, renamed onto it only when the block
    completes; on any error the temporary file is removed and ``output`` is left untouched."""
    temp = output.with_name(f".{output.name}.{secrets.token_hex(4)}.part")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, output)
    finally:
        temp.unlink(missing_ok=True)


async def receive(
    mesh: MeshClient, digest: Digest, offset: int, length: int, sink: Callable[[bytes], object], bar: Progress
) -> bool:
    """Streams ``[offset, offset+length)`` (length 0 = to the end) into ``sink``, checking that the
    pieces are contiguous and complete. A full download is also re-hashed locally; returns whether
    it was. The server verifies the whole blob either way (it holds back the last piece until then)."""
    full = offset == 0 and length in (0, digest.size_bytes)
    hasher = blake3.blake3() if full else None
    end = offset + length if length else digest.size_bytes
    position = offset
    call = mesh.artifacts.Download(apb.DownloadRequest(digest=digest, offset=offset, length=length))
    async for piece in call:
        if piece.offset != position:
            raise TransferError(f"the server sent bytes at offset {piece.offset}, expected {position}")
        if hasher is not None:
            hasher.update(piece.data)
        sink(piece.data)
        position += len(piece.data)
        bar.advance(len(piece.data))
    if position != end:
        raise TransferError(f"received {position - offset} of {end - offset} bytes of {digest_text(digest)}")
    if hasher is not None and hasher.hexdigest() != digest.hex:
        raise TransferError(
            f"the received bytes hash to blake3:{hasher.hexdigest()}, not blake3:{digest.hex}"
        )
    return full
