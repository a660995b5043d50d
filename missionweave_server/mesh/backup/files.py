"""Files on disk as a backup and a restore write them: directories created private (0700, whatever
the umask), new files (never overwriting one) hashed with BLAKE3 as they are written and synced
before they get their mode, files read back in chunks, and whole trees made durable or emptied
again. A backup writes its copies with these, a restore the target's files: both directions keep
one way of writing a file whose hash is known.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from types import TracebackType

import blake3

from missionweave.kernel.digests import CHUNK_BYTES


def file_chunks(path: Path) -> Iterator[bytes]:
    """The bytes of ``path``, a chunk at a time."""
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            yield chunk


def hash_file(path: Path) -> tuple[int, str]:
    """The size and BLAKE3 of ``path``."""
    hasher, size = blake3.blake3(), 0
    for chunk in file_chunks(path):
        hasher.update(chunk)
        size += len(chunk)
    return size, hasher.hexdigest()


class NewFile:
    """A file created for writing (never overwriting one; 0600 until ``finish`` gives it its mode),
    whose chunks are hashed as they are written. Closed on leaving its ``with`` block."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.hasher = blake3.blake3()
        self.size = 0

    def __enter__(self) -> NewFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        os.close(self.fd)

    def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.fd, view) :]
        self.hasher.update(chunk)
        self.size += len(chunk)

    def finish(self, mode: int) -> tuple[int, str]:
        """Synced, with ``mode``: the file's size and BLAKE3."""
        os.fsync(self.fd)
        os.fchmod(self.fd, mode)
        return self.size, self.hasher.hexdigest()


def write_file(path: Path, chunks: Iterable[bytes], mode: int) -> tuple[int, str]:
    """A new file (never overwriting) of ``chunks``, synced, with ``mode``; its size and BLAKE3."""
    with NewFile(path) as out:
        for chunk in chunks:
            out.write(chunk)
        return out.finish(mode)


async def write_stream(path: Path, chunks: AsyncIterable[bytes], mode: int) -> tuple[int, str]:
    """``write_file`` of chunks that arrive (a download): each written as it comes."""
    with NewFile(path) as out:
        async for chunk in chunks:
            out.write(chunk)
        return out.finish(mode)


def private_dirs(root: Path, relative: PurePosixPath) -> Path:
    """``root/relative``'s parent directories, each created 0700 (whatever the umask)."""
    here = root
    for part in relative.parent.parts:
        here = here / part
        if not here.exists():
            here.mkdir(mode=0o700)
            here.chmod(0o700)
    return root / relative


def copy_file(source: Path, root: Path, relative: PurePosixPath, mode: int) -> tuple[int, str]:
    """``source`` copied to a new file ``root/relative`` (in private directories) with ``mode``: the
    size and BLAKE3 of what was written."""
    return write_file(private_dirs(root, relative), file_chunks(source), mode)


def sync_tree(root: Path) -> None:
    """Every directory under ``root`` that holds a file, deepest first: the new entries are durable."""
    for directory in sorted({p.parent for p in root.rglob("*") if p.is_file()}, key=lambda p: -len(p.parts)):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def is_empty_dir(path: Path, *, ignore: tuple[str, ...] = ()) -> bool:
    """``path`` is a directory holding nothing but the entries named in ``ignore``."""
    return path.is_dir() and not [p for p in path.iterdir() if p.name not in ignore]


def empty_dir(path: Path, *, keep: tuple[str, ...] = ()) -> None:
    """Everything in the directory ``path`` goes, but the entries named in ``keep`` (a link goes
    itself, never what it names): what a failed run wrote into a directory that was empty before."""
    for entry in path.iterdir():
        if entry.name in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
