"""The database at one instant: taking a consistent copy of it while the mesh writes, and reading
from that same instant what the rest of the backup follows (the blobs the artifact index names,
every Group's head, the number of events, each schema line's revision).

SQLite: the online backup API copies the database in one read transaction, and the copy is read.
PostgreSQL: a REPEATABLE READ transaction exports its snapshot, is read, and stays open while
``pg_dump --snapshot`` dumps that same snapshot. A restore reads its result with ``read_snapshot``
too, to compare it with the manifest.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Connection, and_, create_engine, func, inspect, select, text
from sqlalchemy.pool import NullPool

from missionweave.kernel.eventlog import link_of
from missionweave.v1 import common_pb2, event_pb2
from missionweave_server.mesh.backup.manifest import GroupHead
from missionweave_server.mesh.backup.pg_tools import libpq_env, run_tool, tool
from missionweave_server.mesh.backup.store import BackupRefused, connect
from missionweave_server.mesh.schemas import LINES
from missionweave_server.services.artifacts import schema as artifact_schema
from missionweave_server.services.authority import schema as authority_schema
from missionweave_server.storage.schema_versions import read_status


@dataclass
class Snapshot:
    """What the backup needs to know of a database snapshot."""

    blobs: list[tuple[str, int]] = field(default_factory=list)
    heads: list[GroupHead] = field(default_factory=list)
    events: int = 0
    schema: dict[str, str | None] = field(default_factory=dict)  # each schema line's revision


def read_snapshot(conn: Connection) -> Snapshot:
    """The blobs the artifact index names, every Group's head and the number of events, read in the
    caller's transaction (the snapshot: a SQLite copy, or PostgreSQL's exported snapshot)."""
    tables = set(inspect(conn).get_table_names())
    snapshot = Snapshot(schema={name: read_status(conn, line).revision for name, line in LINES.items()})
    blobs = artifact_schema.blobs
    if blobs.name in tables:
        snapshot.blobs = [
            (str(r[0]), int(r[1]))
            for r in conn.execute(select(blobs.c.digest, blobs.c.size_bytes).order_by(blobs.c.digest))
        ]
    groups, events, archive = (
        authority_schema.groups,
        authority_schema.events,
        authority_schema.events_archive,
    )
    if not {groups.name, events.name, archive.name} <= tables:
        return snapshot
    online, archived = events.alias("head_online"), archive.alias("head_archived")
    query = (
        select(groups.c.group_id, groups.c.head_seq, online.c.envelope, archived.c.envelope)
        .select_from(
            groups.outerjoin(
                online, and_(online.c.group_id == groups.c.group_id, online.c.seq == groups.c.head_seq)
            ).outerjoin(
                archived, and_(archived.c.group_id == groups.c.group_id, archived.c.seq == groups.c.head_seq)
            )
        )
        .order_by(groups.c.group_id)
    )
    for group_id, head_seq, envelope, archived_envelope in conn.execute(query):
        stored = envelope if envelope is not None else archived_envelope
        snapshot.heads.append(GroupHead(str(group_id), int(head_seq), _chain_value(stored)))
    for table in (events, archive):
        snapshot.events += int(conn.execute(select(func.count()).select_from(table)).scalar_one())
    return snapshot


def _chain_value(stored: bytes | None) -> str:
    """The head event's chain value (what the next event names), unverified: ``mwp verify`` checks
    the event itself; "" when there is no readable event."""
    if stored is None:
        return ""
    try:
        payload = common_pb2.SignedEnvelope.FromString(bytes(stored)).payload
        return link_of(payload, event_pb2.Event.FromString(payload)).hex()
    except Exception:  # a damaged row: the integrity check names it
        return ""


def sqlite_backup(source: Path, copy: Path) -> None:
    """SQLite's online backup API in one step: one read transaction, so the copy is the database at
    one instant, committed WAL frames included, while writers go on (WAL lets them)."""
    src = sqlite3.connect(source, timeout=30)
    try:
        dst = sqlite3.connect(copy)
        try:
            src.backup(dst)  # pages=-1: every page in one step
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            problem = dst.execute("PRAGMA quick_check").fetchone()[0]
            if problem != "ok":
                raise BackupRefused(f"the copy of {source} fails SQLite's quick_check: {problem}")
        finally:
            dst.close()
    except sqlite3.Error as err:
        raise BackupRefused(f"SQLite's online backup of {source} failed: {err}") from None
    finally:
        src.close()


def sqlite_snapshot(path: Path) -> Snapshot:
    """``read_snapshot`` of the SQLite copy at ``path``."""
    engine = create_engine(f"sqlite:///{path}", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return read_snapshot(conn)
    finally:
        engine.dispose()


async def pg_backup(url: str, dump: Path) -> tuple[Snapshot, str]:
    """pg_dump of a snapshot exported by a REPEATABLE READ transaction that stays open while the
    dump runs, and the blobs and heads read in that same transaction: both see one instant."""
    pg_dump = tool("pg_dump")
    async with connect(url) as conn:
        conn = await conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        async with conn.begin():
            snapshot_id = str((await conn.execute(text("SELECT pg_export_snapshot()"))).scalar_one())
            snapshot = await conn.run_sync(read_snapshot)
            await run_tool(
                [
                    pg_dump,
                    "--format=custom",
                    "--no-owner",
                    "--no-privileges",
                    f"--snapshot={snapshot_id}",
                    f"--file={dump}",
                ],
                libpq_env(url),
            )
    return snapshot, snapshot_id
