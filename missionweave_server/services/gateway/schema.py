"""Gateway tables: the acknowledged cursor per (agent, Group), durable across reconnects (MW-16-06)."""

from functools import cache, lru_cache
from pathlib import Path

from sqlalchemy import BigInteger, Column, MetaData, String, Table, TextClause
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.dml import Insert

from missionweave_server.storage import schema_versions
from missionweave_server.storage.db import compiled_once, dialect_insert

# This service's tables only: no other service reads or writes them.
METADATA = MetaData()


cursors = Table(
    "gateway_cursors",
    METADATA,
    Column("agent_id", String(128), primary_key=True),
    Column("group_id", String(128), primary_key=True),
    Column("cursor", BigInteger, nullable=False),
    Column("updated_us", BigInteger, nullable=False),
)


def _raise_cursors(dialect: str, rows: int = 0) -> Insert:
    """Store acknowledged cursors, only ever forward (MW-16-06/07): insert, or raise a lower one.
    ``rows`` > 0: that many rows of VALUES in the statement; 0: one row, parameters by column."""
    ins = dialect_insert(dialect, cursors)
    if rows:
        ins = ins.values([{c.name: None for c in cursors.c}] * rows)
    return ins.on_conflict_do_update(
        index_elements=[cursors.c.agent_id, cursors.c.group_id],
        set_={"cursor": ins.excluded.cursor, "updated_us": ins.excluded.updated_us},
        where=cursors.c.cursor < ins.excluded.cursor,
    )


@cache
def cursor_upsert(dialect: str) -> TextClause:
    """The cursor rule for an executemany of rows agent_id, group_id, cursor, updated_us."""
    return compiled_once(_raise_cursors(dialect), dialect)


_SQLITE_ROW = "(?, ?, ?, ?)"


@cache
def _sqlite_cursor_rule() -> tuple[str, str]:
    """The one-row SQLite form of the cursor rule, split around its VALUES row."""
    sql = str(_raise_cursors("sqlite", 1).compile(dialect=sqlite.dialect()))
    head, found, tail = sql.partition(f"VALUES {_SQLITE_ROW}")
    if not found or _SQLITE_ROW in tail:
        raise RuntimeError(f"unexpected compiled cursor rule: {sql}")
    return head + "VALUES ", tail


@lru_cache(maxsize=256)  # one per row count: the cursor store writes at most 240 a statement
def sqlite_cursor_upsert(rows: int) -> str:
    """The cursor rule for ``rows`` rows in one SQLite statement (``sqlite3``, qmark parameters:
    agent_id, group_id, cursor, updated_us per row, flattened). The rule is compiled once and its
    VALUES row repeated: compiling each row count (up to 13 ms for 240 rows, in the cursor thread,
    holding the GIL the event loop needs) put a stall into the first flushes of each new size."""
    head, tail = _sqlite_cursor_rule()
    return head + ", ".join([_SQLITE_ROW] * rows) + tail


# Every change to these tables ships with its migration in missionweave_server/services/gateway/migrations/ (docs/upgrades.md).
LINE = schema_versions.SchemaLine("gateway", METADATA, Path(__file__).resolve().parent / "migrations")


async def create_schema(engine: AsyncEngine) -> None:
    """Install this schema into an empty store, or check the store is at it (``SchemaMismatch``)."""
    await schema_versions.prepare(engine, [LINE])
