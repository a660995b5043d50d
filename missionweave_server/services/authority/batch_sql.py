"""The few statements a group-commit batch runs, behind one small interface with two drivers.

The batch logic (``group_commit.BatchWriter``) is written once against ``BatchOps``. On PostgreSQL it
runs over a SQLAlchemy ``Connection`` (asyncpg, inside ``run_sync``). On SQLite it runs in the
writer process (``writer_process.py``) straight over the ``sqlite3`` module with SQL text compiled once from the same Core
statements: per-statement SQLAlchemy execution held the GIL long enough to halve the Authority's
throughput (docs/decisions.md D19).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Protocol

from sqlalchemy import (
    BigInteger,
    Connection,
    String,
    Table,
    Update,
    and_,
    bindparam,
    column,
    delete,
    insert,
    select,
    update,
    values,
)
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import ClauseElement

from missionweave_server.services.authority.schema import (
    commands,
    cross_group_outbox,
    events,
    events_archive,
    groups,
    live_leases,
)
from missionweave_server.storage.db import begin_immediate

# Parameter order of every statement below; rows are passed as tuples in this order.
HEAD_PARAMS = ("g", "e", "expected", "new_head", "new_expiry")
GROUP_COLUMNS = (
    "group_id",
    "head_seq",
    "writer_epoch",
    "owner_instance",
    "lease_expires_us",
    "created_us",
    "owner_seal",
)
EVENT_COLUMNS = ("group_id", "seq", "event_id", "type", "command_id", "recorded_us", "envelope")
COMMAND_COLUMNS = ("group_id", "command_id", "fingerprint", "first_seq", "last_seq", "event_count")
LINK_COLUMNS = ("source_group_id", "source_seq", "target_group_id", "created_us")
LEASE_COLUMNS = ("group_id", "work_item_id", "agent_id", "session_epoch")
LEASE_KEY = ("g", "w")

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
INSERT_LINK = insert(cross_group_outbox).values({c: bindparam(c) for c in LINK_COLUMNS})
# A WorkItem's live lease row is replaced whenever its lease begins or ends (no upsert dialects).
DELETE_LEASE = delete(live_leases).where(
    and_(live_leases.c.group_id == bindparam("g"), live_leases.c.work_item_id == bindparam("w"))
)
INSERT_LEASE = insert(live_leases).values({c: bindparam(c) for c in LEASE_COLUMNS})
# An erasure (MW-7.4-04) replaces an event's envelope in whichever tier holds it; id and sequence stay.
REWRITE_PARAMS = ("env", "g", "s")
REWRITE_ENVELOPE = [
    update(tier)
    .where(and_(tier.c.group_id == bindparam("g"), tier.c.seq == bindparam("s")))
    .values(envelope=bindparam("env"))
    for tier in (events, events_archive)
]


class Collision(Exception):
    """A unique key was already taken (a Group created twice, a command id raced)."""


class BatchOps(Protocol):
    def transaction(self) -> Any: ...  # a context manager: commit on success, roll back on error
    def advance_heads(
        self, rows: Sequence[tuple[Any, ...]]
    ) -> bool: ...  # all rows matched, or nothing changed
    def advance_head(self, row: tuple[Any, ...]) -> bool: ...
    def head_of(self, group_id: str) -> tuple[int, int] | None: ...
    def insert_group(self, row: tuple[Any, ...]) -> None: ...
    def insert_rows(
        self, event_rows: Sequence[tuple[Any, ...]], command_rows: Sequence[tuple[Any, ...]]
    ) -> None: ...
    def rewrite_envelopes(self, rows: Sequence[tuple[Any, ...]]) -> None: ...  # (envelope, group_id, seq)
    def insert_links(
        self, rows: Sequence[tuple[Any, ...]]
    ) -> None: ...  # cross-Group outbox rows (LINK_COLUMNS)
    # (group_id, work_item_id, agent_id, session_epoch): the WorkItem's live lease now; agent "" = none.
    def record_leases(self, rows: Sequence[tuple[Any, ...]]) -> None: ...


def _named(names: Sequence[str], row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(names, row, strict=True))


class SqlAlchemyOps:
    """Over a SQLAlchemy Connection (PostgreSQL via asyncpg, in ``AsyncConnection.run_sync``)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    @contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            with self.conn.begin():
                yield
        except IntegrityError as exc:
            raise Collision(str(exc.orig)) from exc

    def advance_heads(self, rows: Sequence[tuple[Any, ...]]) -> bool:
        savepoint = self.conn.begin_nested()
        result = self.conn.execute(_advance_heads_from(rows))
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

    def insert_rows(
        self, event_rows: Sequence[tuple[Any, ...]], command_rows: Sequence[tuple[Any, ...]]
    ) -> None:
        self.conn.execute(INSERT_EVENT, [_named(EVENT_COLUMNS, r) for r in event_rows])
        self.conn.execute(INSERT_COMMAND, [_named(COMMAND_COLUMNS, r) for r in command_rows])

    def rewrite_envelopes(self, rows: Sequence[tuple[Any, ...]]) -> None:
        for statement in REWRITE_ENVELOPE:
            self.conn.execute(statement, [_named(REWRITE_PARAMS, r) for r in rows])

    def insert_links(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self.conn.execute(INSERT_LINK, [_named(LINK_COLUMNS, r) for r in rows])

    def record_leases(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self.conn.execute(DELETE_LEASE, [_named(LEASE_KEY, r[:2]) for r in rows])
        live = [_named(LEASE_COLUMNS, r) for r in rows if r[2]]
        if live:
            self.conn.execute(INSERT_LEASE, live)


def _advance_heads_from(rows: Sequence[tuple[Any, ...]]) -> Update:
    """The fenced head advance of distinct Groups as one statement (rows in ``HEAD_PARAMS`` order)."""
    v = values(
        column("g", String),
        column("e", BigInteger),
        column("expected", BigInteger),
        column("new_head", BigInteger),
        column("new_expiry", BigInteger),
        name="v",
    ).data(list(rows))
    return (
        update(groups)
        .where(
            and_(
                groups.c.group_id == v.c.g, groups.c.writer_epoch == v.c.e, groups.c.head_seq == v.c.expected
            )
        )
        .values(head_seq=v.c.new_head, lease_expires_us=v.c.new_expiry)
    )


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
_SQLITE_REWRITE_ENVELOPE = [_qmark(statement, REWRITE_PARAMS) for statement in REWRITE_ENVELOPE]
_SQLITE_INSERT_LINK = _qmark(INSERT_LINK, LINK_COLUMNS)
_SQLITE_DELETE_LEASE = _qmark(DELETE_LEASE, LEASE_KEY)
_SQLITE_INSERT_LEASE = _qmark(INSERT_LEASE, LEASE_COLUMNS)


# UPDATE ... FROM arrived in SQLite 3.33 (2020); older libraries (still shipped by some LTS
# distributions) get the per-Group statement instead.
_SQLITE_HAS_UPDATE_FROM = sqlite3.sqlite_version_info >= (3, 33, 0)
# SQLite's default bound-parameter limit before 3.32 (32766 since): safe on any build.
_MAX_SQLITE_PARAMS = 999


@lru_cache(maxsize=1024)
def _sqlite_insert_many(table: Table, columns: tuple[str, ...], rows: int) -> str:
    one = "(" + ",".join("?" * len(columns)) + ")"
    return f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES " + ",".join([one] * rows)


@lru_cache(maxsize=1024)
def _sqlite_advance_heads(rows: int) -> str:
    """The fenced head advance of ``rows`` distinct Groups in one UPDATE ... FROM (SQLite 3.33+).

    Parameters are ``HEAD_PARAMS`` per row, flattened. Each Group appears once (the store collapses
    a Group's chained appends first), so the number of changed rows says whether every fence held.
    """
    c = groups.c
    values = ",".join(["(?,?,?,?,?)"] * rows)
    return (
        f"UPDATE {groups.name} SET {c.head_seq.name} = v.column4, {c.lease_expires_us.name} = v.column5 "
        f"FROM (VALUES {values}) AS v WHERE {groups.name}.{c.group_id.name} = v.column1 "
        f"AND {groups.name}.{c.writer_epoch.name} = v.column2 AND {groups.name}.{c.head_seq.name} = v.column3"
    )


def _head_qmark(row: tuple[Any, ...]) -> tuple[Any, ...]:
    g, e, expected, new_head, new_expiry = row
    return (new_head, new_expiry, g, e, expected)


class SqliteOps:
    """Straight over the writer process's one ``sqlite3`` connection (autocommit mode)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    @contextmanager
    def transaction(self) -> Iterator[None]:
        # IMMEDIATE: take the write lock up front and wait for it rather than fail on upgrade.
        begin_immediate(self.conn)
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
        # One statement for the whole batch: fewer sqlite3 calls per batch (D48; the writer then was a
        # thread whose every call had to win the GIL back from the event loop, and still each call
        # is a round of Python work in the writer process).
        self.conn.execute("SAVEPOINT advance")
        if _SQLITE_HAS_UPDATE_FROM:
            matched = self.conn.execute(
                _sqlite_advance_heads(len(rows)), [v for r in rows for v in r]
            ).rowcount
        else:  # SQLite before 3.33: one execution per Group (rows are distinct Groups either way)
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

    def insert_rows(
        self, event_rows: Sequence[tuple[Any, ...]], command_rows: Sequence[tuple[Any, ...]]
    ) -> None:
        # Multi-row VALUES rather than executemany: one sqlite3 call per table, not one per row (D48).
        for table, columns, rows in (
            (events, EVENT_COLUMNS, event_rows),
            (commands, COMMAND_COLUMNS, command_rows),
        ):
            step = _MAX_SQLITE_PARAMS // len(columns)
            for start in range(0, len(rows), step):
                chunk = rows[start : start + step]
                self.conn.execute(
                    _sqlite_insert_many(table, columns, len(chunk)), [v for r in chunk for v in r]
                )

    def rewrite_envelopes(self, rows: Sequence[tuple[Any, ...]]) -> None:
        for statement in _SQLITE_REWRITE_ENVELOPE:
            self.conn.executemany(statement, rows)

    def insert_links(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self.conn.executemany(_SQLITE_INSERT_LINK, rows)

    def record_leases(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self.conn.executemany(_SQLITE_DELETE_LEASE, [r[:2] for r in rows])
        self.conn.executemany(_SQLITE_INSERT_LEASE, [r for r in rows if r[2]])
