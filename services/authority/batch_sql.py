"""The few statements a group-commit batch runs, behind one small interface with two drivers.

The batch logic (``EventStore._write_batch``) is written once against ``BatchOps``. On PostgreSQL it
runs over a SQLAlchemy ``Connection`` (asyncpg, inside ``run_sync``). On SQLite it runs on the
writer thread straight over the ``sqlite3`` module with SQL text compiled once from the same Core
statements: per-statement SQLAlchemy execution held the GIL long enough to halve the Authority's
throughput (docs/decisions.md D19).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from sqlalchemy import Connection, and_, bindparam, insert, select, update
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import ClauseElement

from services.authority.schema import commands, events, events_archive, groups

# Parameter order of every statement below; rows are passed as tuples in this order.
HEAD_PARAMS = ("g", "e", "expected", "new_head", "new_expiry")
GROUP_COLUMNS = ("group_id", "head_seq", "writer_epoch", "owner_instance", "lease_expires_us", "created_us")
EVENT_COLUMNS = ("group_id", "seq", "event_id", "type", "command_id", "recorded_us", "envelope")
COMMAND_COLUMNS = ("group_id", "command_id", "fingerprint", "first_seq", "last_seq", "event_count")

# The fenced head advance: it runs for every append.
ADVANCE_HEAD = (
    update(groups)
    .where(
        and_(
            groups.c.group_id == bindparam("g"),
            groups.c.writer_epoch == bindparam("e"),
            groups.c.head_seq == bindparam("expected"),
        )
    )
    .values(head_seq=bindparam("new_head"), lease_expires_us=bindparam("new_expiry"))
)
HEAD_OF = select(groups.c.writer_epoch, groups.c.head_seq).where(groups.c.group_id == bindparam("g"))
INSERT_GROUP = insert(groups).values({c: bindparam(c) for c in GROUP_COLUMNS})
INSERT_EVENT = insert(events).values({c: bindparam(c) for c in EVENT_COLUMNS})
INSERT_COMMAND = insert(commands).values({c: bindparam(c) for c in COMMAND_COLUMNS})
# An erasure (MW-7.4-04) replaces an event's envelope in whichever tier holds it; id and sequence stay.
REWRITE_PARAMS = ("env", "g", "s")
REWRITE_ENVELOPE = [
    update(tier).where(and_(tier.c.group_id == bindparam("g"), tier.c.seq == bindparam("s"))).values(envelope=bindparam("env"))
    for tier in (events, events_archive)
]


class Collision(Exception):
    """A unique key was already taken (a Group created twice, a command id raced)."""


class BatchOps(Protocol):
    supports_batch_rowcount: bool

    def transaction(self) -> Any: ...  # a context manager: commit on success, roll back on error
    def advance_heads(self, rows: Sequence[tuple[Any, ...]]) -> bool: ...  # all rows matched, or nothing changed
    def advance_head(self, row: tuple[Any, ...]) -> bool: ...
    def head_of(self, group_id: str) -> tuple[int, int] | None: ...
    def insert_group(self, row: tuple[Any, ...]) -> None: ...
    def insert_rows(self, event_rows: Sequence[tuple[Any, ...]], command_rows: Sequence[tuple[Any, ...]]) -> None: ...
    def rewrite_envelopes(self, rows: Sequence[tuple[Any, ...]]) -> None: ...  # (envelope, group_id, seq)


def _named(names: Sequence[str], row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(names, row, strict=True))


class SqlAlchemyOps:
    """Over a SQLAlchemy Connection (PostgreSQL via asyncpg, in ``AsyncConnection.run_sync``)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.supports_batch_rowcount = bool(conn.dialect.supports_sane_multi_rowcount)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            with self.conn.begin():
                yield
        except IntegrityError as exc:
            raise Collision(str(exc.orig)) from exc

    def advance_heads(self, rows: Sequence[tuple[Any, ...]]) -> bool:
        savepoint = self.conn.begin_nested()
        result = self.conn.execute(ADVANCE_HEAD, [_named(HEAD_PARAMS, r) for r in rows])
        if result.rowcount != len(rows):
            savepoint.rollback()
            return False
        savepoint.commit()
        return True

    def advance_head(self, row: tuple[Any, ...]) -> bool:
        return bool(self.conn.execute(ADVANCE_HEAD, _named(HEAD_PARAMS, row)).rowcount == 1)

    def head_of(self, group_id: str) -> tuple[int, int] | None:
        found = self.conn.execute(HEAD_OF, {"g": group_id}).first()
        return None if found is None else (int(found[0]), int(found[1]))

    def insert_group(self, row: tuple[Any, ...]) -> None:
        self.conn.execute(INSERT_GROUP, _named(GROUP_COLUMNS, row))

    def insert_rows(self, event_rows: Sequence[tuple[Any, ...]], command_rows: Sequence[tuple[Any, ...]]) -> None:
        self.conn.execute(INSERT_EVENT, [_named(EVENT_COLUMNS, r) for r in event_rows])
        self.conn.execute(INSERT_COMMAND, [_named(COMMAND_COLUMNS, r) for r in command_rows])

    def rewrite_envelopes(self, rows: Sequence[tuple[Any, ...]]) -> None:
        for statement in REWRITE_ENVELOPE:
            self.conn.execute(statement, [_named(REWRITE_PARAMS, r) for r in rows])


def _qmark(statement: ClauseElement, names: Sequence[str]) -> str:
    """SQLite text of a Core statement, checked to take its parameters in ``names`` order."""
    compiled = statement.compile(dialect=sqlite_dialect.dialect(paramstyle="qmark"))
    order = tuple(getattr(compiled, "positiontup", None) or ())
    if order != tuple(names):
        raise AssertionError(f"parameter order {order} != {names}")
    return str(compiled)


_SQLITE_ADVANCE_HEAD = _qmark(ADVANCE_HEAD, ("new_head", "new_expiry", "g", "e", "expected"))
_SQLITE_HEAD_OF = _qmark(HEAD_OF, ("g",))
_SQLITE_INSERT_GROUP = _qmark(INSERT_GROUP, GROUP_COLUMNS)
_SQLITE_INSERT_EVENT = _qmark(INSERT_EVENT, EVENT_COLUMNS)
_SQLITE_INSERT_COMMAND = _qmark(INSERT_COMMAND, COMMAND_COLUMNS)
_SQLITE_REWRITE_ENVELOPE = [_qmark(statement, REWRITE_PARAMS) for statement in REWRITE_ENVELOPE]


def _head_qmark(row: tuple[Any, ...]) -> tuple[Any, ...]:
    g, e, expected, new_head, new_expiry = row
    return (new_head, new_expiry, g, e, expected)


class SqliteOps:
    """Straight over one ``sqlite3`` connection owned by the writer thread (autocommit mode)."""

    supports_batch_rowcount = True

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    @contextmanager
    def transaction(self) -> Iterator[None]:
        # IMMEDIATE: take the write lock up front and wait (busy_timeout) rather than fail on upgrade.
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except sqlite3.IntegrityError as exc:
            self.conn.rollback()
            raise Collision(str(exc)) from exc
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.commit()

    def advance_heads(self, rows: Sequence[tuple[Any, ...]]) -> bool:
        self.conn.execute("SAVEPOINT advance")
        matched = self.conn.executemany(_SQLITE_ADVANCE_HEAD, [_head_qmark(r) for r in rows]).rowcount
        if matched != len(rows):
            self.conn.execute("ROLLBACK TO advance")
            self.conn.execute("RELEASE advance")
            return False
        self.conn.execute("RELEASE advance")
        return True

    def advance_head(self, row: tuple[Any, ...]) -> bool:
        return self.conn.execute(_SQLITE_ADVANCE_HEAD, _head_qmark(row)).rowcount == 1

    def head_of(self, group_id: str) -> tuple[int, int] | None:
        found = self.conn.execute(_SQLITE_HEAD_OF, (group_id,)).fetchone()
        return None if found is None else (int(found[0]), int(found[1]))

    def insert_group(self, row: tuple[Any, ...]) -> None:
        self.conn.execute(_SQLITE_INSERT_GROUP, row)

    def insert_rows(self, event_rows: Sequence[tuple[Any, ...]], command_rows: Sequence[tuple[Any, ...]]) -> None:
        self.conn.executemany(_SQLITE_INSERT_EVENT, event_rows)
        self.conn.executemany(_SQLITE_INSERT_COMMAND, command_rows)

    def rewrite_envelopes(self, rows: Sequence[tuple[Any, ...]]) -> None:
        for statement in _SQLITE_REWRITE_ENVELOPE:
            self.conn.executemany(statement, rows)
