"""The SQLite group-commit writer, in a process of its own (docs/decisions.md D53).

The Authority's event loop hands each batch to this process over a pipe and awaits one answer per
batch. A writer thread in the server's own process had to win the GIL back from the busy event
loop around every ``sqlite3`` call: a batch that commits in 0.9 ms alone took 3.3 ms under load,
and that commit is on every command's critical path. Here it runs on the other core.

Frames on both pipes are ``u32 length`` + a pickle: the process is our own child, spawned by the
server with the server's interpreter, and the pipes are private to the two of them.

    request = (now_us, [(group_id, writer_epoch, expected_head, command_id, fingerprint,
               creates_group, [(sequence, event_id, type, recorded_us, envelope), ...],
               [(sequence, envelope), ...]), ...])
    answer  = [None | (reason, message, metadata), ...]   one per append, None = appended

When the process dies the batch's outcome is unknown; the parent kills it for certain, reports
every append of the batch as ``OVERLOADED`` (retry: the Authority re-reads the log and replays a
command that did land), and spawns a new one for the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import sqlite3
import struct
import sys
from collections.abc import Sequence
from typing import Any, BinaryIO

from missionweave.errors import Rejected
from missionweave.v1 import common_pb2
from services.authority.batch_sql import SqliteOps
from services.authority.group_commit import Append, AppendRecord, BatchWriter, StoredEvent

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.authority.writer")

U32 = struct.Struct("<I")
CLOSE_TIMEOUT_S = 10.0


def open_writer_connection(path: str, synchronous: str) -> sqlite3.Connection:
    from missionweave.db import sqlite_pragmas

    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    sqlite_pragmas(conn, synchronous)
    # The writer touches index pages all over the events and commands tables (random ids); a
    # 64 MiB page cache (default 2 MiB) keeps them in memory as the log grows.
    conn.execute("PRAGMA cache_size=-65536")
    return conn


def encode_batch(batch: Sequence[Append], now_us: int) -> bytes:
    rows = [
        (
            r.group_id,
            r.writer_epoch,
            r.expected_head,
            r.command_id,
            r.fingerprint,
            r.creates_group,
            [(e.sequence, e.event_id, e.type, e.recorded_us, e.envelope) for e in r.events],
            r.rewrites,
        )
        for r in batch
    ]
    return pickle.dumps((now_us, rows), protocol=pickle.HIGHEST_PROTOCOL)


def decode_batch(frame: bytes) -> tuple[list[AppendRecord], int]:
    now_us, rows = pickle.loads(frame)
    records = [
        AppendRecord(g, epoch, head, cmd, fp, [StoredEvent(*e) for e in evs], creates, list(rewrites))
        for g, epoch, head, cmd, fp, creates, evs, rewrites in rows
    ]
    return records, now_us


def encode_outcomes(outcomes: Sequence[Rejected | None]) -> bytes:
    plain = [None if o is None else (o.reason, o.message, o.metadata) for o in outcomes]
    return pickle.dumps(plain, protocol=pickle.HIGHEST_PROTOCOL)


def decode_outcomes(frame: bytes) -> list[Rejected | None]:
    return [None if o is None else Rejected(o[0], o[1], **o[2]) for o in pickle.loads(frame)]


# ------------------------------------------------------------------ the child


def serve(source: BinaryIO, sink: BinaryIO, conn: sqlite3.Connection, writer: BatchWriter) -> None:
    ops = SqliteOps(conn)
    while True:
        header = source.read(U32.size)
        if len(header) < U32.size:
            return  # the server closed the pipe: every batch it sent has been answered
        (length,) = U32.unpack(header)
        frame = source.read(length)
        if len(frame) < length:
            return
        records, now_us = decode_batch(frame)
        answer = encode_outcomes(writer.write(ops, records, now_us))
        sink.write(U32.pack(len(answer)) + answer)
        sink.flush()


def main(argv: list[str]) -> None:
    path, synchronous, instance_id, ttl_us = argv
    conn = open_writer_connection(path, synchronous)
    try:
        serve(sys.stdin.buffer, sys.stdout.buffer, conn, BatchWriter(instance_id, int(ttl_us)))
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        conn.close()


# ------------------------------------------------------------------ the parent


class WriterLost(Exception):
    """The writer process died while a batch was with it (the batch's outcome is unknown)."""


class WriterProcess:
    """The parent's end: one batch at a time (the store's writer loop is sequential)."""

    def __init__(self, path: str, synchronous: str, instance_id: str, ttl_us: int) -> None:
        if path in ("", ":memory:"):
            raise ValueError("the SQLite writer process needs a database file, not an in-memory database")
        self.args = [path, synchronous, instance_id, str(ttl_us)]
        self._process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        if self._process is None or self._process.returncode is not None:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", __name__, *self.args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
            )

    async def commit(self, batch: Sequence[Append], now_us: int) -> list[Rejected | None]:
        await self.start()
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        frame = encode_batch(batch, now_us)
        try:
            process.stdin.write(U32.pack(len(frame)) + frame)
            (length,) = U32.unpack(await process.stdout.readexactly(U32.size))
            answer = await process.stdout.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await self._end(process, kill=True)  # gone for certain before anyone reads the log again
            log.error("the store's writer process died; respawning it", extra={"pid": process.pid, "returncode": process.returncode})
            raise WriterLost(f"writer process {process.pid} exited with {process.returncode}") from exc
        return decode_outcomes(answer)

    async def close(self) -> None:
        if self._process is not None:
            await self._end(self._process, kill=False)
            self._process = None

    @staticmethod
    async def _end(process: asyncio.subprocess.Process, *, kill: bool) -> None:
        if process.returncode is None:
            if kill:
                process.kill()
            elif process.stdin is not None:
                process.stdin.close()  # the child finishes what it has and exits
        try:
            await asyncio.wait_for(process.wait(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
        if process.stdin is not None:
            with contextlib.suppress(Exception):
                process.stdin.close()


def unknown_outcome(batch: Sequence[Any], lost: WriterLost) -> list[Rejected]:
    return [
        Rejected(
            R.REJECTION_REASON_OVERLOADED,
            f"the store's writer stopped during this append ({lost}); its outcome is unknown: retry "
            "with the same command id (one that landed is answered from the log)",
            retry_after_ms=50,
        )
        for _ in batch
    ]


if __name__ == "__main__":
    main(sys.argv[1:])
