"""Local filesystem blob backend (the embedded default).

Layout under the data directory::

    blobs/ab/cd/abcd…(64 hex)   committed blobs, fanned out by the first two bytes of the digest
    blobs/tmp/<hex16>-*.part    uploads in progress (same filesystem, so the commit is one rename)

A blob becomes visible only through ``os.replace`` of a fully written, fsynced temp file; readers
therefore see either nothing or the complete file. Every path is built from a digest that passed
``check_digest`` (64 lowercase hex), so no client string ever reaches the filesystem.

All file I/O runs on a small private thread pool: the event loop never blocks on the disk, and the
large chunks (``CHUNK_BYTES``) keep the cost of each thread hop negligible against the copy itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from missionweave_server.services.artifacts import direct_io
from missionweave_server.services.artifacts.blobstore import CHUNK_BYTES, check_digest, check_size
from missionweave_server.services.artifacts.direct_io import DirectStage

T = TypeVar("T")

# Small writes are gathered and written with one writev: one thread hop per ~CHUNK_BYTES, not per call.
_IOV_LIMIT = 512  # well under IOV_MAX (1024 on Linux)
# Smaller blobs stay buffered: for them the staging copy and the fcntl calls outweigh the gain.
DIRECT_MIN_BYTES = 4 * 1024 * 1024
# Temp files older than this are leftovers of a crashed process (a live upload touches its file often).
STALE_TEMP_SECONDS = 24 * 3600


class LocalBlobStore:
    name = "local"

    def __init__(self, data_dir: Path | str, *, io_threads: int = 4, direct_io: bool = True) -> None:
        self.root = Path(data_dir) / "blobs"
        # Temp files bypass the page cache where the filesystem allows it (missionweave_server/services/artifacts/direct_io.py).
        self.direct_io = direct_io
        self.tmp_dir = self.root / "tmp"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self._threads = io_threads
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=io_threads, thread_name_prefix="blobs-local"
        )
        _sweep_stale_temps(self.tmp_dir, STALE_TEMP_SECONDS)

    # ------------------------------------------------------------------ paths

    def path_for(self, digest_hex: str) -> Path:
        """The committed blob's path (``blobs/ab/cd/<hex>``); ValueError for anything but 64 hex."""
        check_digest(digest_hex)
        return self.root / digest_hex[0:2] / digest_hex[2:4] / digest_hex

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        # run_in_executor rather than asyncio.to_thread: no contextvars copy, and a pool of our own
        # so a burst of blob I/O cannot starve other users of the default executor.
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ------------------------------------------------------------------ BlobStore

    async def stored_size(self, digest_hex: str) -> int | None:
        return await self._run(_file_size, self.path_for(digest_hex))

    async def exists(self, digest_hex: str, size: int) -> bool:
        check_size(size)
        return await self.stored_size(digest_hex) == size

    async def open_writer(self, digest_hex: str, size: int) -> LocalBlobWriter:
        final = self.path_for(digest_hex)
        check_size(size)
        temp = await self._run(
            _make_temp, self.tmp_dir, digest_hex, self.direct_io and size >= DIRECT_MIN_BYTES
        )
        return LocalBlobWriter(self, final, temp, size)

    def read(self, digest_hex: str, size: int, chunk_bytes: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
        # Validate now (a plain method, not an async generator), so a bad digest fails at the call.
        path = self.path_for(digest_hex)
        if chunk_bytes <= 0:
            raise ValueError("chunk_bytes must be positive")
        return self._read_chunks(path, chunk_bytes)

    async def _read_chunks(self, path: Path, chunk_bytes: int) -> AsyncIterator[bytes]:
        # Open, size and first read in one hop: a blob of one chunk costs a single thread hop.
        reader, data, size = await self._run(_open_and_read, path, chunk_bytes, self.direct_io)
        position = len(data)
        # One read always in flight: the disk works on chunk n+1 while the caller hashes chunk n.
        # concurrent.futures (not asyncio) futures: their done() means the thread let go of the fd.
        pending: concurrent.futures.Future[bytes] | None = None
        try:
            while data:
                # Up to the size the file had when opened (blobs never change in place): no read
                # only to find the end.
                pending = self._pool.submit(reader.read) if position < size else None
                yield data
                if pending is None:
                    break
                data = await asyncio.wrap_future(pending)
                position += len(data)
        finally:
            # Close only after the thread has finished with the fd: closing under a running read
            # could hand the fd number to another open() and the read would return foreign bytes.
            if pending is None or pending.done():
                reader.close()
            else:
                pending.add_done_callback(lambda _f: reader.close())

    async def put_many(self, blobs: Sequence[tuple[str, bytes]]) -> list[BaseException | None]:
        """Small blobs (verified bytes, named by their digests), each durable on return unless its
        entry holds its failure (nothing of a failed blob stays). In passes over the pool's threads:
        write all and start their writeback, then sync and rename (the syncs side by side, sharing
        journal commits), then fsync each changed directory once."""
        finals = [(self.path_for(digest), data) for digest, data in blobs]
        errors: list[BaseException | None] = [None] * len(finals)
        # Executor jobs, not tasks: a cancelled call still runs each pass to its end (no temp is
        # left open), and a blob renamed but never indexed is simply stored.
        staged = [
            t
            for part in await self._in_groups(_stage_group, [(self.tmp_dir, g) for g in self._groups(finals)])
            for t in part
        ]
        ready: list[tuple[int, tuple[Path, int, _Temp]]] = []
        for i, ((final, data), temp) in enumerate(zip(finals, staged, strict=True)):
            if isinstance(temp, BaseException):
                errors[i] = temp
            else:
                ready.append((i, (final, len(data), temp)))
        changed: set[Path] = set()
        committed = await self._in_groups(_commit_group, [([r for _, r in g],) for g in self._groups(ready)])
        for group, (failures, dirs) in zip(self._groups(ready), committed, strict=True):
            changed |= dirs
            for (i, _), failure in zip(group, failures, strict=True):
                errors[i] = failure
        synced = await asyncio.gather(
            *(self._run(_fsync_dirs, g) for g in self._groups(sorted(changed))), return_exceptions=True
        )
        failed = next((e for e in synced if isinstance(e, BaseException)), None)
        if failed is not None:  # a directory entry may not be durable: no blob of the batch is
            return [e or failed for e in errors]
        return errors

    def _groups(self, items: list[T]) -> list[list[T]]:
        """``items`` in at most one contiguous group per pool thread."""
        step = -(-len(items) // self._threads) if items else 1
        return [items[at : at + step] for at in range(0, len(items), step)]

    async def _in_groups(self, fn: Callable[..., T], calls: list[tuple[Any, ...]]) -> list[T]:
        return list(await asyncio.gather(*(self._run(fn, *args) for args in calls)))

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown, True)


class LocalBlobWriter:
    """Writes go to ``blobs/tmp/``; ``commit`` fsyncs and renames, ``abort`` removes the temp.

    Write-behind: ``write`` hands a chunk to a pool thread and returns without waiting for it, so
    the kernel copies chunk n while the caller receives and hashes chunk n+1 (the two cores work at
    once). At most one write is in flight: memory stays bounded and the file is written in order.

    A writer dropped without commit or abort (an upload task killed mid-stream) is cleaned up by a
    weakref finalizer, so an interrupted upload never leaves a temp file behind, let alone a blob.
    """

    def __init__(self, store: LocalBlobStore, final: Path, temp: _Temp, size: int) -> None:
        self._store = store
        self._final = final
        self._temp = temp
        self._size = size
        self._written = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._finished = False
        self._failed: BaseException | None = None
        # The finalizer holds the temp, never the writer, or the writer could never be collected.
        self._discard = weakref.finalize(self, temp.discard)

    def _check_usable(self) -> None:
        if self._finished:
            raise RuntimeError("writer already committed or aborted")
        if self._failed is not None:
            raise RuntimeError("an earlier write failed; abort this upload") from self._failed

    async def write(self, data: bytes) -> None:
        self._check_usable()
        if self._written + len(data) > self._size:
            raise ValueError(f"more bytes than the declared size {self._size}")
        if not data:
            return
        if not isinstance(data, bytes):
            data = bytes(data)  # written later, from another thread: a mutable buffer could change
        self._written += len(data)
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= CHUNK_BYTES or len(self._pending) >= _IOV_LIMIT:
            await self._flush()

    async def _flush(self) -> None:
        await self._drain()
        if self._pending:
            bufs, self._pending, self._pending_bytes = self._pending, [], 0
            self._temp.inflight = self._store._pool.submit(self._temp.write, bufs)

    async def _drain(self) -> None:
        """Wait for the write in flight; its error (ENOSPC, EIO) breaks the writer for good."""
        inflight = self._temp.inflight
        if inflight is None:
            return
        try:
            await asyncio.wrap_future(inflight)
        except BaseException as exc:
            # Cancelled included: a write cancelled before it ran leaves a hole in the file.
            self._failed = exc
            raise
        finally:
            if inflight.done():
                self._temp.inflight = None

    async def commit(self) -> None:
        self._check_usable()
        if self._written != self._size:
            raise ValueError(f"wrote {self._written} bytes, declared {self._size}")
        await self._flush()
        await self._drain()
        self._finished = True
        loop = asyncio.get_running_loop()
        publish = loop.run_in_executor(self._store._pool, _publish, self._temp, self._final, self._size)
        try:
            await asyncio.shield(publish)
        except asyncio.CancelledError:
            # The thread cannot be stopped: clean up once it is done (a no-op if it published).
            publish.add_done_callback(lambda _f: self._discard())
            raise
        except BaseException:
            self._discard()  # never leave the temp behind, whatever failed
            raise
        self._discard.detach()

    async def abort(self) -> None:
        # Idempotent, and harmless after commit (the finalizer is then detached).
        self._finished = True
        self._pending, self._pending_bytes = [], 0
        inflight = self._temp.inflight
        if inflight is not None and not inflight.done():
            with contextlib.suppress(Exception):
                await self._drain()  # so the temp is gone when abort returns, not a moment later
        if self._discard.alive:
            await self._store._run(self._discard)


class _Temp:
    """An open temp file and the write in flight on it (if any).

    Closing sets fd to -1 and waits for the in-flight write: closing under a running write could let
    another open() reuse the fd number and receive our bytes.
    """

    __slots__ = ("fd", "inflight", "path", "stage")

    def __init__(self, fd: int, path: str, stage: DirectStage | None = None) -> None:
        self.fd = fd
        self.path: str | None = path
        self.inflight: concurrent.futures.Future[None] | None = None
        self.stage = stage  # set when the file is open for direct I/O

    def write(self, bufs: list[bytes]) -> None:
        if self.stage is not None:
            self.stage.write(self.fd, bufs)
        else:
            _write_all(self.fd, bufs)

    def sync(self) -> None:
        """Everything written is on disk (the direct-I/O tail first)."""
        if self.stage is not None:
            self.stage.finish(self.fd)
            self.stage = None
        os.fsync(self.fd)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if self.stage is not None:
            self.stage.close()
            self.stage = None
        if fd >= 0:
            os.close(fd)

    def discard(self) -> None:
        inflight, self.inflight = self.inflight, None
        if inflight is not None and not inflight.done():
            # Called from the garbage collector or abort: never block, finish when the write does.
            inflight.add_done_callback(lambda _f: self.discard())
            return
        try:
            self.close()
        except OSError:
            pass
        path, self.path = self.path, None
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


# ---------------------------------------------------------------------- blocking helpers (pool threads)


def _file_size(path: Path) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def _make_temp(tmp_dir: Path, digest_hex: str, direct: bool = False) -> _Temp:
    # The digest prefix only helps an operator recognise the upload; uniqueness comes from mkstemp.
    fd, path = tempfile.mkstemp(prefix=digest_hex[:16] + "-", suffix=".part", dir=tmp_dir)
    return _Temp(fd, path, DirectStage() if direct and direct_io.enable(fd) else None)


def _open_for_read(path: Path, chunk_bytes: int, direct: bool) -> direct_io.ChunkReader:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise KeyError(path.name) from None
    # Large blobs bypass the page cache both ways (the cache is better spent on the index database
    # and small blobs); the rest is read through it, with the kernel's larger sequential read-ahead.
    if direct and os.fstat(fd).st_size >= DIRECT_MIN_BYTES:
        reader = direct_io.DirectReader.open(fd, chunk_bytes)
        if reader is not None:
            return reader
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return direct_io.BufferedReader(fd, chunk_bytes)


def _open_and_read(path: Path, chunk_bytes: int, direct: bool) -> tuple[direct_io.ChunkReader, bytes, int]:
    """The open reader, its first chunk and the file's size."""
    reader = _open_for_read(path, chunk_bytes, direct)
    try:
        return reader, reader.read(), os.fstat(reader.fd).st_size
    except BaseException:
        reader.close()
        raise


def _write_all(fd: int, bufs: list[bytes]) -> None:
    views = [memoryview(b) for b in bufs]
    while views:
        n = os.writev(fd, views)
        # A regular file normally takes everything; handle a short write without copying.
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def _publish(temp: _Temp, final: Path, size: int) -> None:
    assert temp.path is not None and temp.inflight is None
    temp.sync()  # the bytes are on disk before any name points at them
    temp.close()
    for directory in _place(temp, final, size):
        _fsync_dir(directory)  # make the new directory entries themselves durable


def _place(temp: _Temp, final: Path, size: int) -> list[Path]:
    """Renames the synced, closed temp to ``final``; the directories whose entries changed (to be
    fsynced before the blob is acknowledged): the blob's own, and the parent of each fan-out
    directory this created."""
    assert temp.path is not None
    if _file_size(final) == size:
        # Idempotent: the same digest and size are already stored (the verification layer proved our
        # bytes hash to this digest), so the temp is simply dropped. A stored file of another size is
        # damaged and gets replaced below.
        temp.discard()
        return []
    changed = [final.parent]
    if not final.parent.is_dir():
        # Their parents too, even when a concurrent upload made them first: it may not have
        # fsynced them yet.
        final.parent.mkdir(parents=True, exist_ok=True)
        changed += [final.parent.parent, final.parent.parent.parent]
    os.chmod(temp.path, 0o644)  # mkstemp creates 0600; committed blobs are plain content
    os.replace(temp.path, final)
    temp.path = None  # consumed by the rename: nothing left to discard
    return changed


def _stage_group(tmp_dir: Path, items: list[tuple[Path, bytes]]) -> list[_Temp | BaseException]:
    """Pool thread, first pass over a batch: each small blob written to a temp and its writeback
    started, so that the syncs that follow find the bytes on their way and one journal commit
    covers the allocations of many files."""
    staged: list[_Temp | BaseException] = []
    for final, data in items:
        temp: _Temp | None = None
        try:
            temp = _make_temp(tmp_dir, final.name)
            _write_all(temp.fd, [data])
            direct_io.start_writeback(temp.fd)
            staged.append(temp)
        except Exception as exc:
            staged.append(exc)
            if temp is not None:
                temp.discard()
    return staged


def _commit_group(staged: list[tuple[Path, int, _Temp]]) -> tuple[list[BaseException | None], set[Path]]:
    """Pool thread, second pass: each staged blob synced and renamed into place (its failure
    instead, with nothing of it left); the directories to fsync once each, after every rename."""
    errors: list[BaseException | None] = []
    changed: set[Path] = set()
    for final, size, temp in staged:
        try:
            temp.sync()
            temp.close()
            changed.update(_place(temp, final, size))
            errors.append(None)
        except Exception as exc:
            errors.append(exc)
            temp.discard()
    return errors, changed


def _fsync_dir(path: Path) -> None:
    dfd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _fsync_dirs(paths: list[Path]) -> None:
    for path in paths:
        _fsync_dir(path)


def _sweep_stale_temps(tmp_dir: Path, older_than_seconds: float) -> None:
    """Remove temp files a crashed process left behind (never visible as blobs, but they take space)."""
    cutoff = time.time() - older_than_seconds
    for entry in os.scandir(tmp_dir):
        try:
            if entry.is_file() and entry.stat().st_mtime < cutoff:
                os.unlink(entry.path)
        except FileNotFoundError:
            pass
