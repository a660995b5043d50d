"""The store a process opens at start-up: the tables of the services it serves, installed or checked,
and the one error an unreachable database is reported as."""

from __future__ import annotations

from sqlalchemy import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave_server.config import Settings
from missionweave_server.mesh.schemas import LINES, lines_for
from missionweave_server.storage import schema_versions
from missionweave_server.storage.db import make_engine


class DatabaseUnavailable(OSError):
    """The store cannot be opened at start-up (unreachable server, bad credentials, unwritable file)."""


async def create_schemas(engine: AsyncEngine, served: tuple[str, ...]) -> None:
    """The tables of each service served here, and only those: installed into an empty store, or
    checked to be at this release's schema (``SchemaMismatch`` names the command to run)."""
    await schema_versions.prepare(engine, lines_for(name for name in served if name in LINES))


async def open_database(settings: Settings, shared_nonces: bool) -> AsyncEngine:
    """The engine of MWP_DB_URL with the tables of every service served here (and the shared proof
    nonces' with MWP_NONCE_STORE=database); DatabaseUnavailable when it cannot be opened."""
    engine = make_engine(settings.db_url, sqlite_synchronous=settings.sqlite_synchronous)
    try:
        await create_schemas(engine, (*settings.services, *(("nonces",) if shared_nonces else ())))
    except (OSError, SQLAlchemyError) as unreachable:
        await engine.dispose()
        shown = make_url(settings.db_url).render_as_string(hide_password=True)
        raise DatabaseUnavailable(f"cannot open the database {shown}: {unreachable}") from None
    except schema_versions.SchemaMismatch:
        await engine.dispose()
        raise
    return engine
