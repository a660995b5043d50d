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
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.schema import cursor_upsert, sqlite_cursor_upsert
from missionweave.db import sqlite_connect, sqlite_writer_target

# Rows per statement: 4 parameters each, under SQLite's 999-variable limit before 3.32.
SQLITE_ROWS_PER_STATEMENT = 240
_DURABLE_LEVELS = frozenset({"FULL", "EXTRA", "2", "3"})


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
            flat = [v for (agent_id, group_id), cursor in rows.items() for v in (agent_id, group_id, cursor, updated_us)]
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
