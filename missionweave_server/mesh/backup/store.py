"""What ``mwp backup`` and ``mwp restore`` work on, and what they raise: the Store (everything a mesh
stores, where ``mwp serve`` would find it), the errors the CLI turns into its exit codes, the
progress callback, and the one way this package opens a database.

Every other module of the package builds on this one, and it imports none of them: it is the
vocabulary they share.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from missionweave_server.config import Settings
from missionweave_server.services.artifacts.backends import BlobStoreConfig
from missionweave_server.storage.db import make_engine, normalise_url

STORE_FILE = (
    "missionweave.db"  # the embedded store in a data directory (missionweave_server.storage.db.sqlite_url)
)

# (stage, done, total, bytes): progress of a long run, for a line on stderr now and then.
Progress = Callable[[str, int, int, int], None]


def silent(stage: str, done: int, total: int, nbytes: int) -> None:
    """The progress of a caller that asked for none."""
    return None


class BackupRefused(Exception):
    """The backup (or restore) cannot be done as asked; ``problems`` says each reason. Nothing was
    written, unless the message says what was."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class BackupUsage(BackupRefused):
    """Asked for something that cannot be (a SQLite backup into PostgreSQL, references to blobs on
    local disk, no store where one was named): a usage error."""


class DatabaseUnreachable(Exception):
    """The database could not be opened or reached."""


@dataclass(frozen=True)
class Store:
    """Everything a mesh stores, where ``mwp serve`` would find it (Settings and MWP_S3_*)."""

    data_dir: Path
    database_url: str  # "": SQLite in the data directory
    authority_key: Path
    mesh_token: Path
    blobs: BlobStoreConfig

    @classmethod
    def from_settings(cls, settings: Settings, env: dict[str, str] | None = None) -> Store:
        if settings.database_url.startswith("sqlite"):
            raise BackupUsage(
                "the database URL names a SQLite file: the embedded store is taken from (and restored into) "
                "its data directory, --data-dir"
            )
        return cls(
            data_dir=settings.data_dir,
            database_url=normalise_url(settings.database_url) if settings.database_url else "",
            authority_key=settings.authority_key_path,
            mesh_token=settings.mesh_token_path,
            blobs=BlobStoreConfig.from_env(settings.data_dir, env),
        )

    @property
    def dialect(self) -> str:
        return "postgresql" if self.database_url else "sqlite"

    @property
    def sqlite_file(self) -> Path:
        return self.data_dir / STORE_FILE

    def describe_database(self) -> str:
        """Where the database is, never with a password."""
        if self.database_url:
            return shown_url(self.database_url)
        return str(self.sqlite_file.resolve())


def shown_url(url: str) -> str:
    """A database URL as it may be shown: never with its password."""
    return make_url(url).render_as_string(hide_password=True)


def first_line(err: BaseException) -> str:
    """An error's first line (a driver's message can run on for pages), or its repr when it says nothing."""
    text_ = str(err).strip()
    return text_.splitlines()[0] if text_ else repr(err)


@contextlib.asynccontextmanager
async def engine(url: str) -> AsyncIterator[AsyncEngine]:
    """An engine of one connection on ``url``, disposed of on leaving."""
    opened = make_engine(url, pool_size=1)
    try:
        yield opened
    finally:
        await opened.dispose()


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[AsyncConnection]:
    """A connection to ``url``, closed on leaving; DatabaseUnreachable when it cannot be opened."""
    async with engine(url) as opened:
        try:
            conn = await opened.connect()
        except Exception as err:  # refused, unknown host, a wrong password (asyncpg's own errors)
            shown = f"cannot open the database {shown_url(url)}: {first_line(err)}"
            raise DatabaseUnreachable(shown) from None
        try:
            yield conn
        finally:
            await conn.close()
