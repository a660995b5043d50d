"""Database engines: SQLite (embedded default, WAL) or PostgreSQL (asyncpg), chosen by URL.

Each service owns its tables (``<service>/schema.py``), made and changed only by its migrations
(``missionweave_server/storage/schema_versions.py``); the same schema runs on both engines (ARCHITECTURE "Storage").
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

from sqlalchemy import (
    Connection,
    Engine,
    Insert,
    Table,
    TextClause,
    bindparam,
    create_engine,
    event,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

# The synchronous level each SQLite engine was made with, for the writer engine beside it.
_SQLITE_SYNCHRONOUS: WeakKeyDictionary[Engine, str] = WeakKeyDictionary()


def private_dir(path: Path) -> Path:
    """``path``, created 0700 (whatever the umask) if it does not exist yet: a data dir holds keys,
    the event store and blobs, none of them for other local users."""
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)
        path.chmod(0o700)
    return path


def sqlite_url(data_dir: Path) -> str:
    """The embedded store in ``data_dir``: the directory 0700 and the database file 0600 when this
    creates them (SQLite gives its journal files the database file's mode)."""
    private_dir(data_dir)
    database = data_dir / "missionweave.db"
    if not database.exists():
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT, 0o600))
    return f"sqlite+aiosqlite:///{database.resolve()}"


def normalise_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and use the asyncpg driver for them."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+asyncpg://" + url[len(plain) :]
    return url


def is_sqlite(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "sqlite"


# How long a connection waits for another's SQLite lock before "database is locked".
SQLITE_BUSY_TIMEOUT_MS = 30_000
# The polling of ``begin_immediate``: first retry after 0.1 ms, doubling to at most 1 ms.
_LOCK_POLL_FIRST_S = 0.0001
_LOCK_POLL_MAX_S = 0.001


def begin_immediate(conn: sqlite3.Connection, patience_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> None:
    """BEGIN IMMEDIATE on a ``sqlite3`` connection, polling for a write lock another connection holds.

    SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25, ... ms between tries, so a commit
    that met another connection's short write waited 3, 8, 18 and up to 80 ms (measured under
    bench/delivery.py's half load, D150). Polling waits for the lock's release instead, at most ~1 ms
    more. The connection's own busy_timeout is off for this statement only: every other statement
    keeps it."""
    conn.execute("PRAGMA busy_timeout=0")
    try:
        deadline: float | None = None
        pause = _LOCK_POLL_FIRST_S
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + patience_ms / 1000
                elif now >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, _LOCK_POLL_MAX_S)
    finally:
        conn.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")


def sqlite_connect(path: str, synchronous: str) -> sqlite3.Connection:
    """A plain ``sqlite3`` connection to ``path`` in autocommit mode, with the store's pragmas."""
    conn = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    sqlite_pragmas(conn, synchronous)
    return conn


def sqlite_pragmas(dbapi_conn: Any, synchronous: str) -> None:
    # Autocommit at the module level: transactions are begun explicitly (see _configure_sqlite).
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    # First: the processes of a split mesh open one file at once, and switching it to WAL must wait
    # for the others' locks instead of failing "database is locked".
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA journal_mode=WAL")
    # FULL by default: a commit acknowledged to a client survives power loss. Group commit
    # amortises the fsync over every command in the batch.
    cur.execute(f"PRAGMA synchronous={synchronous}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


SQLITE_IMMEDIATE = "missionweave_sqlite_immediate"  # execution option: BEGIN IMMEDIATE on SQLite


def _configure_sqlite(sync_engine: Engine, synchronous: str) -> None:
    """Pragmas, and SQLAlchemy's documented recipe for real transactions on the sqlite3 module.

    Left alone, sqlite3 issues its own implicit BEGIN only before DML, so a SAVEPOINT taken first
    becomes the outermost transaction and its RELEASE commits half a batch. Turning the module's
    transaction handling off and emitting BEGIN ourselves makes ``engine.begin()`` atomic.
    """

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        sqlite_pragmas(dbapi_conn, synchronous)

    @event.listens_for(sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Deferred: reads must not take the write lock (WAL lets them run beside the writer).
        # A transaction that reads and then writes (creating tables) asks for IMMEDIATE: upgrading a
        # deferred one fails at once with "database is locked" when another process wrote meanwhile.
        immediate = conn.get_execution_options().get(SQLITE_IMMEDIATE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_engine(url: str, *, sqlite_synchronous: str = "FULL", pool_size: int = 16) -> AsyncEngine:
    url = normalise_url(url)
    if url.startswith("sqlite"):
        # A fixed pool: overflow connections would be closed on return, and each reopen costs a new
        # aiosqlite thread plus the pragmas.
        engine = create_async_engine(
            url, connect_args={"timeout": 30}, pool_size=pool_size, max_overflow=0, pool_timeout=60
        )
        _configure_sqlite(engine.sync_engine, sqlite_synchronous)
        _SQLITE_SYNCHRONOUS[engine.sync_engine] = sqlite_synchronous
        return engine
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def sqlite_writer_target(engine: AsyncEngine) -> tuple[str, str] | None:
    """For SQLite, the database file and synchronous level of the store's writer process.

    The group commit does not go through aiosqlite (a thread hop per statement) but through a
    process of its own over plain ``sqlite3`` (docs/decisions.md D19, D53). None for other databases.
    """
    if not is_sqlite(engine):
        return None
    return engine.url.database or ":memory:", _SQLITE_SYNCHRONOUS.get(engine.sync_engine, "FULL")


T = TypeVar("T")


class TransactionRunner:
    """Runs a transaction's body, a function of a sync ``Connection``, as one step.

    On SQLite, aiosqlite hands every statement to its thread and back, several times each (cursor,
    execute, fetch, close, and the pool's rollback on return): a short transaction of four statements
    costs a dozen waits for the event loop, each longer the busier the loop is. Here the whole body
    runs in a pool thread of this process on its own ``sqlite3`` connection (same file, same pragmas
    and BEGIN handling): one hand-off. On PostgreSQL the same body runs through the async engine
    (``run_sync``), so each body is written once for both.
    """

    def __init__(self, engine: AsyncEngine, threads: int = 2) -> None:
        self.engine = engine
        self._threads = threads
        self._sync: Engine | None = None
        self._pool: ThreadPoolExecutor | None = None
        # The SQLite file and synchronous level the pool threads open it with; None runs on the engine.
        target = sqlite_writer_target(engine)
        self._file = target if target is not None and target[0] != ":memory:" else None

    async def run(self, body: Callable[[Connection], T], *, immediate: bool = False) -> T:
        """``body`` in one transaction (``immediate``: SQLite's write lock taken at BEGIN, for a
        body that reads before it writes); its result, or its exception after a rollback."""
        if self._file is None:
            async with self.engine.connect() as conn:
                async with conn.begin():
                    return await conn.run_sync(body)
        if self._pool is None:
            self._sync = create_engine(
                self.engine.url.set(drivername="sqlite"),
                connect_args={"timeout": 30},
                pool_size=self._threads,
                max_overflow=0,
            )
            _configure_sqlite(self._sync, self._file[1])
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="db-transactions")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._in_thread, body, immediate)

    def _in_thread(self, body: Callable[[Connection], T], immediate: bool) -> T:
        assert self._sync is not None
        with self._sync.connect() as conn:
            if immediate:
                conn = conn.execution_options(**{SQLITE_IMMEDIATE: True})
            with conn.begin():
                return body(conn)

    async def close(self) -> None:
        pool, sync, self._pool, self._sync = self._pool, self._sync, None, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, True)
        if sync is not None:
            sync.dispose()


def dialect_insert(dialect: str, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT of ``dialect`` (an engine's ``dialect.name``) with ON CONFLICT clauses: SQLite
    (3.24+) and PostgreSQL share the syntax."""
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def compiled_once(statement: Insert, dialect: str) -> TextClause:
    """``statement`` (an INSERT with an ON CONFLICT clause) compiled once for ``dialect``, as a text
    statement with the same named, typed parameters. SQLAlchemy caches no compiled form of its
    dialects' INSERTs (their ``inherit_cache`` is False), so executing one compiles it again every
    time, ~0.15 ms of Python each (D153); a text statement's compiled form is cached."""
    compiled = statement.compile(
        dialect=(postgresql if dialect == "postgresql" else sqlite).dialect(paramstyle="named")
    )
    return text(str(compiled)).bindparams(
        *(bindparam(name, type_=bind.type) for name, bind in compiled.binds.items())
    )


def upsert(dialect: str, table: Table, keys: tuple[str, ...]) -> TextClause:
    """Insert a row of all of ``table``'s columns (parameters named by column), or overwrite the
    other columns of the row with the same ``keys``. Build it once (``compiled_once``)."""
    ins = dialect_insert(dialect, table)
    statement = ins.on_conflict_do_update(
        index_elements=[table.c[k] for k in keys],
        set_={column.name: ins.excluded[column.name] for column in table.c if column.name not in keys},
    )
    return compiled_once(statement, dialect)
