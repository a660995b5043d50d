"""The SQLite group-commit writer, in a process of its own (docs/decisions.md D53).

The Authority's event loop hands each batch to this process over a pipe and awaits one answer per
batch. A writer thread in the server's own process had to win the GIL back from the busy event
loop around every ``sqlite3`` call: a batch that commits in 0.9 ms alone took 3.3 ms under load,
and that commit is on every command's critical path. Here it runs on the other core.

It also signs the events (D56): an append may carry its events' payloads instead of their
envelopes, and the process signs each with the Authority's key (handed over in the first frame)
before it stores it, answering the signatures so that the Authority rebuilds the very envelopes
stored. An Ed25519 signature is ~20 µs of the event loop's time saved per event.

Frames on both pipes (``missionweave_server/verification/pipe_frames.py``) hold a pickle: the process is our own child, spawned by the
server with the server's interpreter, and the pipes are private to the two of them.

    first   = (authority key seed or None, key id)
    request = (now_us, [(group_id, writer_epoch, expected_head, command_id, fingerprint,
               creates_group, [(sequence, event_id, type, recorded_us, envelope), ...],
               [(sequence, envelope), ...], [payload to sign, ...], [(sequence, target), ...],
               leases, traceparent, owner_seal), ...], batch traceparent)
    answer  = ([None | (reason, message, metadata), ...],   one per append, None = appended
               [[signature, ...], ...])                     one list per append (empty: none signed)

Tracing (docs/operations.md "Tracing"): the process sets up its own exporter from the same
``OTEL_*`` environment, under its parent's service name; its commit span is a child of the parent's
group-commit span (the batch traceparent) and links to the decision of every append (each record's).

When the process dies the batch's outcome is unknown; the parent kills it for certain, reports
every append of the batch as ``OVERLOADED`` (retry: the Authority re-reads the log and replays a
command that did land), and spawns a new one for the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import sqlite3
import sys
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, BinaryIO

from nacl.signing import SigningKey

from missionweave.kernel.errors import Rejected
from missionweave.kernel.signing import EVENT_TYPE, pae, signed_envelope
from missionweave.v1 import common_pb2
from missionweave_server.observability import tracing
from missionweave_server.services.authority.batch_sql import SqliteOps
from missionweave_server.services.authority.group_commit import AppendRecord, BatchWriter, StoredEvent
from missionweave_server.verification.pipe_frames import (
    child_command,
    end_with_the_pipe,
    frame,
    read_frame,
    read_frame_async,
)

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.authority.writer")

CLOSE_TIMEOUT_S = 10.0


def open_writer_connection(path: str, synchronous: str) -> sqlite3.Connection:
    from missionweave_server.storage.db import sqlite_connect

    conn = sqlite_connect(path, synchronous)
    # The writer touches index pages all over the events and commands tables (random ids); a
    # 64 MiB page cache (default 2 MiB) keeps them in memory as the log grows.
    conn.execute("PRAGMA cache_size=-65536")
    return conn


def encode_batch(batch: Sequence[AppendRecord], now_us: int, traceparent: str = "") -> bytes:
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
            r.payloads,
            r.links,
            r.leases,
            r.traceparent,
            r.owner_seal,
        )
        for r in batch
    ]
    return pickle.dumps((now_us, rows, traceparent), protocol=pickle.HIGHEST_PROTOCOL)


def decode_batch(body: bytes) -> tuple[list[AppendRecord], int, str]:
    """The records, the batch's time and its traceparent (the parent's group-commit span)."""
    now_us, rows, traceparent = pickle.loads(body)
    records = [
        AppendRecord(
            g,
            epoch,
            head,
            cmd,
            fp,
            [StoredEvent(*e) for e in evs],
            creates,
            list(rewrites),
            list(payloads),
            list(links),
            list(leases),
            tp,
            seal,
        )
        for g, epoch, head, cmd, fp, creates, evs, rewrites, payloads, links, leases, tp, seal in rows
    ]
    return records, now_us, traceparent


Outcomes = tuple[list[Rejected | None], list[list[bytes]]]


def encode_outcomes(outcomes: Sequence[Rejected | None], signatures: Sequence[list[bytes]] = ()) -> bytes:
    plain = [None if o is None else (o.reason, o.message, o.metadata) for o in outcomes]
    return pickle.dumps((plain, list(signatures) or [[] for _ in plain]), protocol=pickle.HIGHEST_PROTOCOL)


def decode_outcomes(frame: bytes) -> Outcomes:
    plain, signatures = pickle.loads(frame)
    return [None if o is None else Rejected(o[0], o[1], **o[2]) for o in plain], signatures


class EventSigner:
    """The Authority's key in the writer process: signs event payloads into stored envelopes."""

    def __init__(self, seed: bytes, key_id: str) -> None:
        self.key = SigningKey(seed)
        self.key_id = key_id

    def seal(self, records: list[AppendRecord]) -> list[list[bytes]]:
        """Fill the envelopes of every append that came with payloads; its signatures, per append."""
        signatures: list[list[bytes]] = []
        for record in records:
            sigs = [self.key.sign(pae(EVENT_TYPE, p)).signature for p in record.payloads]
            if sigs:
                record.events = [
                    replace(e, envelope=signed_envelope(p, EVENT_TYPE, self.key_id, sig).SerializeToString())
                    for e, p, sig in zip(record.events, record.payloads, sigs, strict=True)
                ]
            signatures.append(sigs)
        return signatures


# ------------------------------------------------------------------ the child


def serve(source: BinaryIO, sink: BinaryIO, conn: sqlite3.Connection, writer: BatchWriter) -> None:
    first = read_frame(source)
    if first is None:
        return
    seed, key_id = pickle.loads(first)
    signer = EventSigner(seed, key_id) if seed else None
    ops = SqliteOps(conn)
    while True:
        body = read_frame(source)
        if body is None:
            return  # the server closed the pipe: every batch it sent has been answered
        records, now_us, traceparent = decode_batch(body)
        with _commit_span(records, traceparent):
            answer = _commit(ops, writer, signer, records, now_us)
        sink.write(frame(answer))
        sink.flush()


def _commit_span(records: list[AppendRecord], traceparent: str) -> AbstractContextManager[object]:
    if not tracing.active():
        return contextlib.nullcontext()
    return tracing.tracer().start_as_current_span(
        "authority.writer.commit",
        context=tracing.context_of(traceparent),
        links=tracing.link_to([r.traceparent for r in records]),
        attributes={"mwp.batch_size": len(records), "mwp.events": sum(len(r.events) for r in records)},
    )


def _commit(
    ops: SqliteOps, writer: BatchWriter, signer: EventSigner | None, records: list[AppendRecord], now_us: int
) -> bytes:
    """Sign what is to be signed, write the batch in one transaction: the answer frame's body."""
    if signer is not None:
        signatures = signer.seal(records)
    elif any(r.payloads for r in records):
        raise RuntimeError("an append asks for signatures but this writer was given no key")
    else:
        signatures = [[] for _ in records]
    try:
        outcomes = writer.write(ops, records, now_us)
    except sqlite3.Error as exc:  # e.g. locked by another process past busy_timeout: rolled back
        log.error(
            "group commit failed; the batch is refused, the writer goes on",
            extra={"batch": len(records), "error": str(exc)},
        )
        failed = Rejected(
            R.REJECTION_REASON_OVERLOADED, f"the store could not commit ({exc}); retry", retry_after_ms=100
        )
        outcomes = [failed] * len(records)
    return encode_outcomes(outcomes, signatures)


def main(argv: list[str]) -> None:
    from missionweave.kernel import logs

    logs.configure(
        os.environ.get("MWP_LOG_LEVEL", "info"), os.environ.get("MWP_LOG_FORMAT", "json"), tracing.TraceIds()
    )
    tracing.setup("authority")  # OTEL_SERVICE_NAME, set by the parent, names its process's service
    end_with_the_pipe()
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
        self._signer: tuple[bytes | None, str] = (None, "")

    def set_signer(self, seed: bytes, key_id: str) -> None:
        """The Authority's key, for events handed over unsigned (sent to each process it spawns)."""
        self._signer = (seed, key_id)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        if self._process is None or self._process.returncode is not None:
            # Its spans carry this process's service name (the environment's exporter settings it inherits).
            env = (
                {**os.environ, "OTEL_SERVICE_NAME": tracing.service_name()}
                if tracing.service_name()
                else None
            )
            self._process = await asyncio.create_subprocess_exec(
                *child_command(__name__, *self.args),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
            # The key goes over the private pipe, never on the command line (visible to ps).
            first = pickle.dumps(self._signer, protocol=pickle.HIGHEST_PROTOCOL)
            assert self._process.stdin is not None
            self._process.stdin.write(frame(first))

    async def commit(self, batch: Sequence[AppendRecord], now_us: int) -> Outcomes:
        await self.start()
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        try:
            # The current span (the store's group commit) is the parent of the writer's own.
            process.stdin.write(frame(encode_batch(batch, now_us, tracing.current_traceparent())))
            answer = await read_frame_async(process.stdout)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await self._end(process, kill=True)  # gone for certain before anyone reads the log again
            log.error(
                "the store's writer process died; respawning it",
                extra={"pid": process.pid, "returncode": process.returncode},
            )
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
