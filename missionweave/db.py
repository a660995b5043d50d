"""Database engines: SQLite (embedded default, WAL) or PostgreSQL (asyncpg), chosen by URL.

Every service's tables hang off the one ``METADATA`` so a single ``create_all`` prepares a database,
and the same schema runs on both engines (ARCHITECTURE "Storage").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

METADATA = MetaData()


def sqlite_url(data_dir: Path) -> str:
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite+aiosqlite:///{(data_dir / 'missionweave.db').resolve()}"


def normalise_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and use the asyncpg driver for them."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+asyncpg://" + url[len(plain) :]
    return url


def is_sqlite(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str, *, sqlite_synchronous: str = "FULL", pool_size: int = 16) -> AsyncEngine:
    url = normalise_url(url)
    if url.startswith("sqlite"):
        # A fixed pool: overflow connections would be closed on return, and each reopen costs a new
        # aiosqlite thread plus the pragmas below.
        engine = create_async_engine(
            url, connect_args={"timeout": 30}, pool_size=pool_size, max_overflow=0, pool_timeout=60
        )

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            # FULL by default: a commit acknowledged to a client survives power loss. Group commit
            # amortises the fsync over every command in the batch.
            cur.execute(f"PRAGMA synchronous={sqlite_synchronous}")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


async def create_schema(engine: AsyncEngine) -> None:
    # Import for side effects: each module registers its tables on METADATA.
    import services.authority.schema
    import services.membership.schema  # noqa: F401

    async with engine.begin() as conn:
        await conn.run_sync(METADATA.create_all)
