"""Versioned schemas: each service's tables change only through its numbered migrations (Alembic).

Every service owns a *schema line*: its tables (``METADATA``), the directory of its migrations, and a
version table of its own (``schema_version_<line>``), so services that share one database (the
embedded default) and services that each have their own upgrade independently. A store is

* ``empty``: none of the line's tables exist; a service installs the newest schema itself on start;
* ``unversioned``: the tables were made before versioned schemas (release 0.1.0 and older);
* ``behind``: an older revision; ``current``; or ``ahead``: a revision this code does not know
  (a newer release wrote it).

A service starts only on ``empty`` or ``current`` (``prepare``); everything else is refused in one
line naming the command (``mwp db upgrade``, or the newer release). Each migration declares whether
it may run while the services serve (``online``) — see docs/upgrades.md.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext
from alembic.script import Script, ScriptDirectory
from sqlalchemy import Connection, MetaData, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave_server.storage.db import SQLITE_IMMEDIATE

__all__ = [
    "LineStatus",
    "SchemaLine",
    "SchemaMismatch",
    "State",
    "Step",
    "drop_line",
    "prepare",
    "read_status",
    "upgrade",
]

log = logging.getLogger(__name__)

# env.py (used by ``make migration``'s autogenerate only) and the template new migrations start from.
ENV_DIR = Path(__file__).resolve().parent / "schema_env"
VERSION_TABLE_PREFIX = "schema_version_"
UPGRADE_COMMAND = "mwp db upgrade"


@dataclass(frozen=True)
class SchemaLine:
    """One service's tables and the migrations that make them."""

    name: str
    metadata: MetaData
    migrations: Path

    @property
    def version_table(self) -> str:
        return VERSION_TABLE_PREFIX + self.name

    @property
    def tables(self) -> frozenset[str]:
        return frozenset(self.metadata.tables)


class State(enum.StrEnum):
    EMPTY = "empty"
    UNVERSIONED = "unversioned"
    BEHIND = "behind"
    CURRENT = "current"
    AHEAD = "ahead"


@dataclass(frozen=True)
class Step:
    """One migration: its revision, what it does (its docstring's first line), and whether the
    services may keep serving while it runs."""

    revision: str
    description: str
    online: bool


@dataclass(frozen=True)
class LineStatus:
    line: str
    state: State
    revision: str | None  # the store's (None: empty or unversioned)
    head: str  # the newest this code knows
    pending: tuple[Step, ...]  # what ``upgrade`` would run, oldest first

    def refusal(self) -> str | None:
        """Why a service may not start on this store, in one line; None when it may."""
        if self.state in (State.EMPTY, State.CURRENT):
            return None
        if self.state is State.AHEAD:
            return (
                f"the {self.line} tables are at schema revision {self.revision}, which this release does not "
                f"know (it knows up to {self.head}): a newer release wrote them; run that release"
            )
        held = (
            "were made before versioned schemas (release 0.1.0)"
            if self.state is State.UNVERSIONED
            else f"are at schema revision {self.revision}"
        )
        return (
            f"the {self.line} tables {held} and this release needs {self.head}: "
            f"run `{UPGRADE_COMMAND}` ({len(self.pending)} migration(s); docs/upgrades.md)"
        )

    def upgrade_refusal(self, offline_ok: bool) -> str | None:
        """Why ``mwp db upgrade`` may not run on this line now; None when it may."""
        if self.state is State.AHEAD:
            return self.refusal()
        blocked = [s.revision for s in self.pending if not s.online]
        if blocked and not offline_ok:
            return (
                f"the {self.line} migration(s) {', '.join(blocked)} cannot run while the services serve: stop "
                f"every process serving {self.line}, then run `{UPGRADE_COMMAND} --offline`"
            )
        return None


class SchemaMismatch(ValueError):
    """A store a service cannot start on (the message is the one line naming what to run)."""


@cache
def _scripts(migrations: Path) -> ScriptDirectory:
    config = Config()
    config.set_main_option("script_location", str(ENV_DIR))
    config.set_main_option("version_locations", str(migrations))
    config.set_main_option("path_separator", "os")
    return ScriptDirectory.from_config(config)


def _head(line: SchemaLine) -> str:
    heads = _scripts(line.migrations).get_heads()
    if len(heads) != 1:  # two migrations written from the same parent: merge them before release
        raise RuntimeError(f"the {line.name} migrations have {len(heads)} heads {heads}: one expected")
    return heads[0]


def _step(script: Script) -> Step:
    module = script.module
    online = getattr(module, "online", None)
    if not isinstance(online, bool):
        raise RuntimeError(f"migration {script.revision} does not declare `online: bool`")
    description = (script.doc or script.revision).strip().splitlines()[0]
    return Step(script.revision, description, online)


def steps(line: SchemaLine, since: str | None) -> tuple[Step, ...]:
    """The migrations after ``since`` (None: all of them), oldest first."""
    scripts = _scripts(line.migrations)
    walked = list(scripts.iterate_revisions(_head(line), since or "base"))
    return tuple(_step(s) for s in reversed(walked))


def _known(line: SchemaLine, revision: str) -> bool:
    try:
        return _scripts(line.migrations).get_revision(revision) is not None
    except Exception:  # alembic raises several kinds for an unknown id
        return False


def read_status(conn: Connection, line: SchemaLine) -> LineStatus:
    """Where the store behind ``conn`` stands on ``line`` (reads only)."""
    head = _head(line)
    inspector = inspect(conn)
    if not inspector.has_table(line.version_table):
        present = any(inspector.has_table(name) for name in line.tables)
        state = State.UNVERSIONED if present else State.EMPTY
        return LineStatus(line.name, state, None, head, steps(line, None))
    heads = MigrationContext.configure(conn, opts={"version_table": line.version_table}).get_current_heads()
    if not heads:  # a version table without a row: an install that never finished (it is one transaction)
        return LineStatus(line.name, State.EMPTY, None, head, steps(line, None))
    revision = heads[0]
    if len(heads) > 1 or not _known(line, revision):
        return LineStatus(line.name, State.AHEAD, ",".join(heads), head, ())
    if revision == head:
        return LineStatus(line.name, State.CURRENT, revision, head, ())
    return LineStatus(line.name, State.BEHIND, revision, head, steps(line, revision))


def _lock(conn: Connection, line: SchemaLine) -> None:
    """Serialise installs and upgrades of one line across processes, for the transaction: SQLite's
    write lock is taken at BEGIN (IMMEDIATE); PostgreSQL takes an advisory lock."""
    if conn.dialect.name == "postgresql":
        key = int.from_bytes(
            hashlib.blake2b(line.version_table.encode(), digest_size=8).digest(), "big", signed=True
        )
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


# Told of each migration once it ran (its line and revision): ``mwp db upgrade``'s progress.
Progress = Callable[[str, str], None]


def _migrate(
    conn: Connection,
    line: SchemaLine,
    progress: Progress | None = None,
    secrets: Mapping[str, Any] | None = None,
) -> None:
    """Run every migration the store lacks, in the caller's transaction. ``secrets`` are what a
    migration may need from outside the store (``context.config.attributes``: the administrator's
    key that vouches for rows older than grants, D170)."""
    scripts = _scripts(line.migrations)

    def plan(revision: Any, _context: Any) -> Any:
        # What `alembic upgrade heads` runs (alembic.command.upgrade does the same).
        return scripts._upgrade_revs("heads", revision)

    def applied(**kw: Any) -> None:  # alembic passes ctx, step, heads, run_args by keyword
        if progress is not None:
            progress(line.name, kw["step"].up_revision_id)

    with EnvironmentContext(
        Config(attributes=dict(secrets or {})), scripts, fn=plan, destination_rev="heads"
    ) as env:
        env.configure(
            connection=conn,
            target_metadata=line.metadata,
            version_table=line.version_table,
            render_as_batch=conn.dialect.name == "sqlite",
            on_version_apply=applied,  # type: ignore[arg-type]
        )
        env.run_migrations()


def upgrade_line(
    conn: Connection,
    line: SchemaLine,
    *,
    offline_ok: bool,
    progress: Progress | None = None,
    secrets: Mapping[str, Any] | None = None,
) -> tuple[LineStatus, tuple[Step, ...]]:
    """Bring ``line`` to this code's head in the caller's transaction; the status before and the
    steps run. Refuses a store ahead of this code, and a migration that needs the services stopped
    unless ``offline_ok``."""
    _lock(conn, line)
    before = read_status(conn, line)
    refusal = before.upgrade_refusal(offline_ok)
    if refusal is not None:
        raise SchemaMismatch(refusal)
    if before.pending:
        _migrate(conn, line, progress, secrets)
    return before, before.pending


def _install_or_check(conn: Connection, line: SchemaLine) -> str | None:
    """The revision installed into an empty store, or None when the store was at this code's head."""
    _lock(conn, line)
    current = read_status(conn, line)
    if current.state is State.EMPTY:
        _migrate(conn, line)
        return current.head
    refusal = current.refusal()
    if refusal is not None:
        raise SchemaMismatch(refusal)
    return None


async def _in_write_transaction(engine: AsyncEngine, body: Any) -> Any:
    async with engine.connect() as conn:
        conn = await conn.execution_options(**{SQLITE_IMMEDIATE: True})
        async with conn.begin():
            return await conn.run_sync(body)


async def prepare(engine: AsyncEngine, lines: Iterable[SchemaLine]) -> None:
    """At a service's start: install the newest schema of each line into an empty store, and refuse
    (``SchemaMismatch``) a store of any other revision than this code's."""
    installed = [
        revision
        for line in lines
        if (
            revision := await _in_write_transaction(
                engine, lambda conn, line=line: _install_or_check(conn, line)
            )
        )
    ]
    if installed:
        log.info("installed the schema into an empty store", extra={"revisions": ",".join(installed)})


async def statuses(engine: AsyncEngine, lines: Sequence[SchemaLine]) -> list[LineStatus]:
    async with engine.connect() as conn:
        return [await conn.run_sync(read_status, line) for line in lines]


async def upgrade(
    engine: AsyncEngine,
    lines: Sequence[SchemaLine],
    *,
    offline_ok: bool = False,
    progress: Progress | None = None,
    secrets: Mapping[str, Any] | None = None,
) -> list[tuple[LineStatus, tuple[Step, ...]]]:
    """``mwp db upgrade``: each line in a transaction of its own (a failure leaves that line as it
    was, and the lines before it upgraded). Refused before any line runs when one is ahead of this
    code, or needs a migration that cannot run online and ``offline_ok`` is not given (each line
    checks again under its lock)."""
    for found in await statuses(engine, lines):
        refusal = found.upgrade_refusal(offline_ok)
        if refusal is not None:
            raise SchemaMismatch(refusal)
    done = []
    for line in lines:
        done.append(
            await _in_write_transaction(
                engine,
                lambda conn, line=line: upgrade_line(
                    conn, line, offline_ok=offline_ok, progress=progress, secrets=secrets
                ),
            )
        )
    return done


def drop_line(conn: Connection, line: SchemaLine) -> None:
    """Drop a line's tables and its version table (tests that reuse one PostgreSQL database)."""
    line.metadata.drop_all(conn)
    conn.execute(text(f"DROP TABLE IF EXISTS {line.version_table}"))
