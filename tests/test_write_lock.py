"""The database's one write lock: the group commit's polling BEGIN IMMEDIATE (missionweave_server/storage/db.py),
and the gateway's ACK cursors stored in one statement each, without waiting for the disk
(missionweave_server/services/gateway/cursor_store.py, D150)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.dialects import sqlite

from missionweave_server.services.gateway.cursor_store import SQLITE_ROWS_PER_STATEMENT, CursorStore
from missionweave_server.services.gateway.schema import (
    _raise_cursors,
    create_schema,
    cursors,
    sqlite_cursor_upsert,
)
from missionweave_server.storage.db import SQLITE_BUSY_TIMEOUT_MS, begin_immediate, make_engine


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    return conn


def test_begin_immediate_waits_for_the_lock_and_keeps_the_busy_timeout(tmp_path: Path) -> None:
    """Another connection's write lock is waited for (not "database is locked"), the write that
    follows commits, and the connection's busy_timeout is the same afterwards."""
    path = tmp_path / "lock.db"
    holder, writer = _connect(path), _connect(path)
    holder.execute("BEGIN IMMEDIATE")
    releasing = threading.Event()

    def release_later() -> None:
        time.sleep(0.05)
        holder.execute("INSERT INTO t VALUES (1)")
        # Set before COMMIT: the writer may take the lock the instant COMMIT lets it go, before
        # this thread runs again.
        releasing.set()
        holder.execute("COMMIT")

    releaser = threading.Thread(target=release_later)
    releaser.start()
    begin_immediate(writer)
    assert releasing.is_set()  # the lock was taken only once the holder let it go
    releaser.join()
    writer.execute("INSERT INTO t VALUES (2)")
    writer.execute("COMMIT")
    assert sorted(r[0] for r in writer.execute("SELECT x FROM t")) == [1, 2]
    assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == SQLITE_BUSY_TIMEOUT_MS
    begin_immediate(writer)  # uncontended: at once
    writer.execute("ROLLBACK")


def test_begin_immediate_gives_up_after_its_patience(tmp_path: Path) -> None:
    path = tmp_path / "lock.db"
    holder, writer = _connect(path), _connect(path)
    holder.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError) as refused:
        begin_immediate(writer, patience_ms=100)
    assert refused.value.sqlite_errorcode == sqlite3.SQLITE_BUSY
    assert time.monotonic() - started >= 0.1
    assert not writer.in_transaction
    assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == SQLITE_BUSY_TIMEOUT_MS
    holder.execute("ROLLBACK")


def test_begin_immediate_passes_other_errors_on(tmp_path: Path) -> None:
    writer = _connect(tmp_path / "lock.db")
    writer.execute("BEGIN")
    with pytest.raises(sqlite3.OperationalError) as nested:
        begin_immediate(writer)  # a transaction within a transaction: not a lock to wait for
    assert nested.value.sqlite_errorcode != sqlite3.SQLITE_BUSY
    assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == SQLITE_BUSY_TIMEOUT_MS


async def _stored(engine: Any) -> dict[tuple[str, str], int]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(cursors.c.agent_id, cursors.c.group_id, cursors.c.cursor))
        return {(a, g): c for a, g, c in rows}


async def test_cursor_store_only_raises_cursors_in_batches_of_any_size(db_url: str) -> None:
    """MW-16-06/07: stored cursors only ever move forward, across statements (more rows than one
    SQLite statement takes) and across flushes."""
    engine = make_engine(db_url)
    store = CursorStore(engine)
    try:
        await create_schema(engine)
        many = SQLITE_ROWS_PER_STATEMENT * 2 + 7
        await store.store({(f"agent-{i}", "grp_1"): i + 10 for i in range(many)}, 1)
        await store.store({("agent-0", "grp_1"): 5, ("agent-1", "grp_1"): 50, ("agent-x", "grp_2"): 3}, 2)
        stored = await _stored(engine)
        assert len(stored) == many + 1
        assert stored[("agent-0", "grp_1")] == 10  # not lowered
        assert stored[("agent-1", "grp_1")] == 50
        assert stored[("agent-x", "grp_2")] == 3
        assert stored[(f"agent-{many - 1}", "grp_1")] == many + 9
    finally:
        await store.close()
        await engine.dispose()


@pytest.mark.parametrize("rows", [1, 2, 7, SQLITE_ROWS_PER_STATEMENT])
def test_the_multi_row_cursor_statement_is_the_compiled_rule(rows: int) -> None:
    """The SQLite statement of ``rows`` cursors, made by repeating the compiled rule's VALUES row
    (compiling each row count stalled the flush thread), is what SQLAlchemy compiles for them."""
    assert sqlite_cursor_upsert(rows) == str(_raise_cursors("sqlite", rows).compile(dialect=sqlite.dialect()))


async def test_cursor_store_commits_without_waiting_for_the_disk(db_url: str) -> None:
    """D150: SQLite, a connection of the store's own at synchronous=NORMAL while the engine's stay
    FULL; PostgreSQL, synchronous_commit off for the flush's transaction only."""
    engine = make_engine(db_url, pool_size=1)
    store = CursorStore(engine)
    try:
        await create_schema(engine)
        await store.store({("agent-a", "grp_1"): 4}, 1)
        async with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                assert store._conn is not None
                assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
                assert (await conn.execute(text("PRAGMA synchronous"))).scalar() == 2  # FULL
            else:
                assert (await conn.execute(text("SHOW synchronous_commit"))).scalar() == "on"
        assert await _stored(engine) == {("agent-a", "grp_1"): 4}
    finally:
        await store.close()
        await engine.dispose()
