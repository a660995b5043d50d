"""Statements built once (D153): ``compiled_once`` turns an INSERT ... ON CONFLICT, which SQLAlchemy
compiles anew on every execution, into a text statement whose compiled form is cached, and it must
do on both engines exactly what the statement it came from does."""

from __future__ import annotations

import pytest
from sqlalchemy import BigInteger, Column, MetaData, String, Table, bindparam, select
from sqlalchemy.dialects import sqlite

from missionweave_server.storage.db import compiled_once, dialect_insert, make_engine, upsert

METADATA = MetaData()
scores = Table(
    "stmt_scores",
    METADATA,
    Column("name", String(32), primary_key=True),
    Column("score", BigInteger, nullable=False),
    Column("note", String(32), nullable=False),
)


def test_a_dialect_insert_is_uncacheable_and_compiled_once_is_cacheable() -> None:
    """Why the helper exists: were SQLAlchemy to cache these, it would not be needed."""
    statement = sqlite.insert(scores).on_conflict_do_nothing(index_elements=[scores.c.name])
    assert statement._generate_cache_key() is None
    assert compiled_once(statement, "sqlite")._generate_cache_key() is not None


async def test_compiled_once_keeps_the_conflict_rule_and_the_parameters_types(db_url: str) -> None:
    """Only a higher score replaces a row (a WHERE on the conflict), the parameter named apart from
    its column binds by name, an executemany of several rows works, and a row the conflict skips
    is left untouched: on SQLite and on PostgreSQL (asyncpg needs each parameter's type)."""
    engine = make_engine(db_url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(METADATA.create_all)
        ins = dialect_insert(engine.dialect.name, scores).values(
            name=bindparam("who"), score=bindparam("points"), note=bindparam("note")
        )
        raise_only = compiled_once(
            ins.on_conflict_do_update(
                index_elements=[scores.c.name],
                set_={"score": ins.excluded.score, "note": ins.excluded.note},
                where=scores.c.score < ins.excluded.score,
            ),
            engine.dialect.name,
        )
        async with engine.begin() as conn:
            await conn.execute(
                raise_only,
                [{"who": "a", "points": 5, "note": "first"}, {"who": "b", "points": 1, "note": "first"}],
            )
            await conn.execute(
                raise_only,
                [{"who": "a", "points": 3, "note": "lower"}, {"who": "b", "points": 2, "note": "higher"}],
            )
            rows = dict((r[0], (r[1], r[2])) for r in await conn.execute(select(scores)))
        assert rows == {"a": (5, "first"), "b": (2, "higher")}

        overwrite = upsert(engine.dialect.name, scores, ("name",))
        async with engine.begin() as conn:
            await conn.execute(overwrite, {"name": "a", "score": 1, "note": "overwritten"})
            await conn.execute(overwrite, {"name": "c", "score": 9, "note": "new"})
            rows = dict((r[0], (r[1], r[2])) for r in await conn.execute(select(scores)))
        assert rows == {"a": (1, "overwritten"), "b": (2, "higher"), "c": (9, "new")}
    finally:
        async with engine.begin() as conn:
            await conn.run_sync(METADATA.drop_all)
        await engine.dispose()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_compiled_once_renders_named_parameters_for_each_dialect(dialect: str) -> None:
    statement = compiled_once(
        dialect_insert(dialect, scores).on_conflict_do_nothing(index_elements=[scores.c.name]), dialect
    )
    assert str(statement).startswith(
        "INSERT INTO stmt_scores (name, score, note) VALUES (:name, :score, :note)"
    )
    assert {name: type(bind.type) for name, bind in statement._bindparams.items()} == {
        "name": String,
        "score": BigInteger,
        "note": String,
    }
