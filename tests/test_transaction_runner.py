"""TransactionRunner (missionweave_server/storage/db.py, D147): a transaction's body run as one step, on SQLite in
a pool thread with its own connection, on PostgreSQL through the async engine."""

from __future__ import annotations

import asyncio
import threading

import pytest
from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, func, insert, select

from missionweave_server.storage.db import TransactionRunner, make_engine

METADATA = MetaData()
rows = Table("runner_rows", METADATA, Column("id", Integer, primary_key=True), Column("name", String(40)))


async def test_a_body_commits_as_a_whole_or_not_at_all(db_url: str) -> None:
    engine = make_engine(db_url)
    runner = TransactionRunner(engine)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(METADATA.create_all)
        threads: list[str] = []

        def two_rows(conn: Connection) -> int:
            threads.append(threading.current_thread().name)
            conn.execute(insert(rows), [{"name": "a"}, {"name": "b"}])
            return int(conn.scalar(select(func.count()).select_from(rows)) or 0)

        assert await runner.run(two_rows) == 2

        def half_then_fail(conn: Connection) -> None:
            conn.execute(insert(rows).values(name="c"))
            raise RuntimeError("the body fails after its first write")

        with pytest.raises(RuntimeError):
            await runner.run(half_then_fail)
        async with engine.connect() as conn:  # what the async engine sees: committed rows only
            assert sorted(await conn.scalars(select(rows.c.name))) == ["a", "b"]
        local = engine.dialect.name == "sqlite"
        assert (threads[0].startswith("db-transactions")) == local  # one hand-off to its own thread on SQLite
    finally:
        await runner.close()
        async with engine.begin() as conn:
            await conn.run_sync(METADATA.drop_all)
        await engine.dispose()


async def test_immediate_bodies_that_read_then_write_never_lose_an_update(db_url: str) -> None:
    """Read-then-write bodies run at once serialise (SQLite: BEGIN IMMEDIATE), so no increment is lost
    and none fails with "database is locked"."""
    engine = make_engine(db_url)
    runner = TransactionRunner(engine, threads=4)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(METADATA.create_all)
        await runner.run(lambda conn: conn.execute(insert(rows).values(id=1, name="0")))

        def increment(conn: Connection) -> None:
            if conn.dialect.name == "postgresql":
                conn.execute(select(rows.c.name).where(rows.c.id == 1).with_for_update())
            current = int(conn.scalar(select(rows.c.name).where(rows.c.id == 1)) or 0)
            conn.execute(rows.update().where(rows.c.id == 1).values(name=str(current + 1)))

        await asyncio.gather(*(runner.run(increment, immediate=True) for _ in range(40)))
        assert await runner.run(lambda conn: conn.scalar(select(rows.c.name).where(rows.c.id == 1))) == "40"
    finally:
        await runner.close()
        async with engine.begin() as conn:
            await conn.run_sync(METADATA.drop_all)
        await engine.dispose()
