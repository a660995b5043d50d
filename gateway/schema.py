"""Gateway tables: the acknowledged cursor per (agent, Group), durable across reconnects (MW-16-06)."""

from functools import cache

from sqlalchemy import BigInteger, Column, MetaData, String, Table, TextClause
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.db import compiled_once, create_tables

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


@cache
def cursor_upsert(dialect: str) -> TextClause:
    """Store acknowledged cursors, only ever forward (MW-16-06/07): insert, or raise a lower one.
    Rows: agent_id, group_id, cursor, updated_us. SQLite (3.24+) and PostgreSQL share the syntax."""
    ins = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(cursors)
    return compiled_once(
        ins.on_conflict_do_update(
            index_elements=[cursors.c.agent_id, cursors.c.group_id],
            set_={"cursor": ins.excluded.cursor, "updated_us": ins.excluded.updated_us},
            where=cursors.c.cursor < ins.excluded.cursor,
        ),
        dialect,
    )


async def create_schema(engine: AsyncEngine) -> None:
    await create_tables(engine, METADATA)
