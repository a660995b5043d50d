"""Where the gateway stores acknowledged cursors (MW-16-06/07), write-behind (D47), committed without
waiting for the disk and holding the database's write lock as briefly as it can (D150).

On SQLite the group commit of the Authority waits for the same file's one write lock. Through the
async engine, a flush held that lock from its upsert until its COMMIT came back around the busy event
loop (a hop to aiosqlite's thread and back, 0.5-20 ms at half load), and across the COMMIT's fsync.
Here a flush is one multi-row upsert in autocommit mode, on a connection of its own at
synchronous=NORMAL, run in one thread: its implicit transaction takes the lock, writes and commits
inside a single sqlite3 call, without the GIL or the loop. In WAL mode such a commit is durable at
the next fsync of the log, which any FULL commit makes (the group commit's, within milliseconds under
load); a process crash loses nothing, a power failure at most the cursors since then, which only
means events delivered again (delivery is at least once, MW-16-01). On PostgreSQL the flush is one
transaction with ``synchronous_commit`` off, the same promise.

``AckCursors`` is the gateway's write-behind in front of it: an ACK notes its cursor and goes on
(credits flow again without waiting for the disk); the cursors noted within ``CURSOR_FLUSH_DELAY_S``
are stored together, and a stream's end and shutdown store what is left. A subscription starts from
the cursor stored here (``stored_cursor``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.kernel.clock import Clock, to_micros
from missionweave_server.services.gateway.schema import cursor_upsert, cursors, sqlite_cursor_upsert
from missionweave_server.storage.aio import finish_on_cancel
from missionweave_server.storage.db import sqlite_connect, sqlite_writer_target

log = logging.getLogger("missionweave.gateway")

# Rows per statement: 4 parameters each, under SQLite's 999-variable limit before 3.32.
SQLITE_ROWS_PER_STATEMENT = 240
_DURABLE_LEVELS = frozenset({"FULL", "EXTRA", "2", "3"})
# ACKs arriving within this window share one transaction (SQLite FULL sync costs a disk flush each).
CURSOR_FLUSH_DELAY_S = 0.05
# Cursors whose store failed (a locked or unreachable database) are kept and stored again this long after.
CURSOR_RETRY_S = 1.0


class CursorStore:
    """Stores batches of acknowledged cursors, only ever forward."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._upsert = cursor_upsert(engine.dialect.name)
        target = sqlite_writer_target(engine)
        # The SQLite file and the level its own connection commits at; None: through the engine.
        self._sqlite: tuple[str, str] | None = None
        if target is not None and target[0] != ":memory:":
            file, level = target
            self._sqlite = (file, "NORMAL" if level.upper() in _DURABLE_LEVELS else level)
        self._conn: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None

    async def store(self, rows: dict[tuple[str, str], int], updated_us: int) -> None:
        if self._sqlite is not None:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="gateway-cursors")
            flat = [
                v
                for (agent_id, group_id), cursor in rows.items()
                for v in (agent_id, group_id, cursor, updated_us)
            ]
            await asyncio.get_running_loop().run_in_executor(self._thread, self._store_sqlite, flat)
            return
        params = [
            {"agent_id": agent_id, "group_id": group_id, "cursor": cursor, "updated_us": updated_us}
            for (agent_id, group_id), cursor in rows.items()
        ]
        async with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                await conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
            await conn.execute(self._upsert, params)

    def _store_sqlite(self, flat: list[str | int]) -> None:
        assert self._sqlite is not None
        if self._conn is None:
            self._conn = sqlite_connect(*self._sqlite)  # autocommit: each statement is its own transaction
        step = SQLITE_ROWS_PER_STATEMENT * 4
        for start in range(0, len(flat), step):
            part = flat[start : start + step]
            self._conn.execute(sqlite_cursor_upsert(len(part) // 4), part)

    async def close(self) -> None:
        if self._thread is None:
            return
        thread, self._thread = self._thread, None
        await asyncio.get_running_loop().run_in_executor(thread, self._close_connection)
        thread.shutdown(wait=True)

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class AckCursors:
    """The acknowledged cursors of a gateway's streams (a base of ``service.GatewayServicer``, which
    sets these attributes)."""

    engine: AsyncEngine
    clock: Clock
    cursor_store: CursorStore
    _cursor_writes: dict[tuple[str, str], int]
    _cursor_flusher: asyncio.Task[None] | None
    # One flush at a time: a stream's end must not return while an earlier flush still stores rows
    # it took, among them perhaps that stream's last ACK (its client may read the cursor next).
    _cursor_flush_lock: asyncio.Lock
    stopping: bool

    def note_cursor(self, agent_id: str, group_id: str, cursor: int) -> None:
        """Record an acknowledged cursor; it is stored shortly after, with every other ACK of that
        moment in one transaction (an ACK never waits for the disk before credits flow again)."""
        key = (agent_id, group_id)
        if cursor > self._cursor_writes.get(key, 0):
            self._cursor_writes[key] = cursor
        if self._cursor_flusher is None or self._cursor_flusher.done():
            self._cursor_flusher = asyncio.create_task(self._flush_soon(CURSOR_FLUSH_DELAY_S))

    async def _flush_soon(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self.flush_cursors()

    async def flush_cursors(self) -> None:
        """Store every noted cursor now (a stream's end and shutdown call this). Cursors that could
        not be stored stay noted and are stored again ``CURSOR_RETRY_S`` later (or by the next flush).
        Returns once every cursor noted before the call is stored, by this flush or one under way."""
        async with self._cursor_flush_lock:
            await self._flush_noted()

    async def _flush_noted(self) -> None:
        while self._cursor_writes:
            rows, self._cursor_writes = self._cursor_writes, {}
            try:
                await self.store_cursors(rows)
            except Exception as exc:
                self._keep(rows)
                log.error(
                    "storing ACK cursors failed; they are kept and stored again shortly",
                    extra={
                        "cursors": len(rows),
                        "retry_in_s": CURSOR_RETRY_S,
                        "error": f"{type(exc).__name__}: {exc}",
                    },
                )
                return
            except BaseException:
                # Cancelled: the store ran to its end (finish_on_cancel) but may have failed.
                self._keep(rows)
                raise

    def _keep(self, rows: dict[tuple[str, str], int]) -> None:
        """Note ``rows`` again and flush them later: storing a cursor twice is harmless (only ever forward)."""
        for key, cursor in rows.items():
            self._cursor_writes[key] = max(cursor, self._cursor_writes.get(key, 0))
        self._retry_cursors()

    def _retry_cursors(self) -> None:
        """A flush of what is still noted, ``CURSOR_RETRY_S`` from now (none while stopping: shutdown
        flushes last, after cancelling the flusher)."""
        if self.stopping:
            return
        flusher = self._cursor_flusher
        if flusher is None or flusher.done() or flusher is asyncio.current_task():
            self._cursor_flusher = asyncio.create_task(self._flush_soon(CURSOR_RETRY_S))

    @finish_on_cancel
    async def store_cursors(self, rows: dict[tuple[str, str], int]) -> None:
        """The acknowledged cursors per (agent, Group), durable (MW-16-06/07), only ever forward; ACK
        never deletes history (MW-16-09)."""
        await self.cursor_store.store(rows, to_micros(self.clock.now()))

    @finish_on_cancel
    async def stored_cursor(self, agent_id: str, group_id: str) -> int:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(cursors.c.cursor).where(
                        cursors.c.agent_id == agent_id, cursors.c.group_id == group_id
                    )
                )
            ).first()
        return int(row[0]) if row else 0
