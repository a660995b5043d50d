"""The Group event store: ordered, fenced, idempotent appends with group commit.

Appends queued by concurrent commands are written by one writer task in a single transaction
(group commit), which amortises fsync and round trips across Groups. Each append is fenced by
``WHERE writer_epoch = :e AND head_seq = :expected`` so that a second authority instance, or a
lost race, can never interleave events (ARCHITECTURE "Scale-out").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import and_, bindparam, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from missionweave.clock import Clock, to_micros
from missionweave.errors import Rejected
from missionweave.v1 import common_pb2
from services.authority.schema import commands, events, groups

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.authority.store")

# The fenced head advance, built once: it runs for every append.
_ADVANCE_HEAD = (
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


@dataclass(frozen=True)
class StoredEvent:
    sequence: int
    event_id: str
    type: str
    recorded_us: int
    envelope: bytes


@dataclass(frozen=True)
class CommandRecord:
    fingerprint: bytes
    first_seq: int
    last_seq: int


@dataclass
class AppendRequest:
    group_id: str
    writer_epoch: int
    expected_head: int
    command_id: str
    fingerprint: bytes
    events: list[StoredEvent]
    creates_group: bool
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class EventStore:
    def __init__(
        self,
        engine: AsyncEngine,
        clock: Clock,
        *,
        instance_id: str = "local",
        ownership_ttl: timedelta = timedelta(seconds=30),
        max_batch: int = 512,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.instance_id = instance_id
        self.ownership_ttl = ownership_ttl
        self.max_batch = max_batch
        self._queue: asyncio.Queue[AppendRequest] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self.batches = 0
        self.appends = 0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop(), name="event-store-writer")

    async def close(self) -> None:
        if self._writer is not None:
            # Let queued appends finish before stopping (graceful drain).
            while not self._queue.empty():  # noqa: ASYNC110 (the writer task owns the queue)
                await asyncio.sleep(0.005)
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None

    # ------------------------------------------------------------ reads

    async def acquire(self, group_id: str) -> tuple[int, int] | None:
        """Take (or keep) ownership of an existing Group: returns (writer_epoch, head) or None if absent.

        Raises NOT_OWNER while another instance holds an unexpired ownership lease.
        """
        now = to_micros(self.clock.now())
        expires = now + int(self.ownership_ttl.total_seconds() * 1_000_000)
        async with self.engine.begin() as conn:
            result = await conn.execute(
                update(groups)
                .where(
                    and_(
                        groups.c.group_id == group_id,
                        or_(groups.c.owner_instance == self.instance_id, groups.c.lease_expires_us < now),
                    )
                )
                .values(
                    writer_epoch=groups.c.writer_epoch + 1,
                    owner_instance=self.instance_id,
                    lease_expires_us=expires,
                )
                .returning(groups.c.writer_epoch, groups.c.head_seq)
            )
            row = result.first()
            if row is not None:
                return int(row[0]), int(row[1])
            owner = (
                await conn.execute(select(groups.c.owner_instance).where(groups.c.group_id == group_id))
            ).scalar_one_or_none()
        if owner is None:
            return None
        raise Rejected(
            R.REJECTION_REASON_NOT_OWNER, f"group {group_id} is owned by authority instance {owner}", owner=owner
        )

    async def head(self, group_id: str) -> int | None:
        async with self.engine.connect() as conn:
            value = (
                await conn.execute(select(groups.c.head_seq).where(groups.c.group_id == group_id))
            ).scalar_one_or_none()
        return None if value is None else int(value)

    async def read(self, group_id: str, after: int = 0, limit: int = 1024) -> list[StoredEvent]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(events.c.seq, events.c.event_id, events.c.type, events.c.recorded_us, events.c.envelope)
                .where(and_(events.c.group_id == group_id, events.c.seq > after))
                .order_by(events.c.seq)
                .limit(limit)
            )
            return [StoredEvent(int(r[0]), r[1], r[2], int(r[3]), bytes(r[4])) for r in rows]

    async def read_range(self, group_id: str, first: int, last: int) -> list[StoredEvent]:
        return await self.read(group_id, first - 1, last - first + 1)

    async def find_command(self, group_id: str, command_id: str) -> CommandRecord | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(commands.c.fingerprint, commands.c.first_seq, commands.c.last_seq).where(
                        and_(commands.c.group_id == group_id, commands.c.command_id == command_id)
                    )
                )
            ).first()
        return None if row is None else CommandRecord(bytes(row[0]), int(row[1]), int(row[2]))

    async def commands_of(self, group_id: str) -> dict[str, CommandRecord]:
        """Every accepted command id of a Group (loaded once when an instance takes the Group)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(commands.c.command_id, commands.c.fingerprint, commands.c.first_seq, commands.c.last_seq).where(
                    commands.c.group_id == group_id
                )
            )
            return {r[0]: CommandRecord(bytes(r[1]), int(r[2]), int(r[3])) for r in rows}

    async def group_ids(self) -> list[str]:
        async with self.engine.connect() as conn:
            return [r[0] for r in await conn.execute(select(groups.c.group_id).order_by(groups.c.group_id))]

    # ------------------------------------------------------------ appends

    async def append(self, request: AppendRequest) -> None:
        """Queue an append and wait until it is durable (or raises Rejected)."""
        if self._writer is None:
            self.start()
        await self._queue.put(request)
        await request.done

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._commit_batch(batch)
            except Exception as exc:  # never let the writer die: fail the batch, keep serving
                log.exception("group commit failed", extra={"batch": len(batch)})
                for req in batch:
                    if not req.done.done():
                        req.done.set_exception(exc)

    async def _commit_batch(self, batch: list[AppendRequest]) -> None:
        try:
            async with self.engine.begin() as conn:
                outcomes = await self._advance_all(conn, batch)
                if outcomes is None:  # someone lost a race: find out who, request by request
                    outcomes = [await self._apply(conn, req) for req in batch]
                await self._insert_rows(conn, [req for req, ok in zip(batch, outcomes, strict=True) if ok is None])
        except IntegrityError:
            # One request collided (a Group created twice, a command raced on another instance):
            # retry each on its own so the others still land.
            if len(batch) == 1:
                batch[0].done.set_exception(self._integrity_rejection(batch[0]))
                return
            for req in batch:
                await self._commit_batch([req])
            return
        self.batches += 1
        for req, outcome in zip(batch, outcomes, strict=True):
            if outcome is None:
                self.appends += 1
                req.done.set_result(None)
            else:
                req.done.set_exception(outcome)

    async def _advance_all(self, conn: AsyncConnection, batch: list[AppendRequest]) -> list[Rejected | None] | None:
        """Fast path: advance every Group head of the batch in one executemany.

        Returns None (and changes nothing) when the driver cannot count rows per batch or when any
        head did not match, so that the caller falls back to one fenced UPDATE per request.
        """
        updates = [req for req in batch if not req.creates_group]
        if len(updates) < 2 or not conn.dialect.supports_sane_multi_rowcount:
            return None
        expires = to_micros(self.clock.now()) + int(self.ownership_ttl.total_seconds() * 1_000_000)
        async with conn.begin_nested() as savepoint:
            result = await conn.execute(
                _ADVANCE_HEAD,
                [
                    {
                        "g": req.group_id,
                        "e": req.writer_epoch,
                        "expected": req.expected_head,
                        "new_head": req.expected_head + len(req.events),
                        "new_expiry": expires,
                    }
                    for req in updates
                ],
            )
            if result.rowcount != len(updates):
                await savepoint.rollback()
                return None
        outcomes: list[Rejected | None] = []
        for req in batch:
            outcomes.append(await self._apply(conn, req) if req.creates_group else None)
        return outcomes

    async def _apply(self, conn: AsyncConnection, req: AppendRequest) -> Rejected | None:
        now = to_micros(self.clock.now())
        expires = now + int(self.ownership_ttl.total_seconds() * 1_000_000)
        new_head = req.expected_head + len(req.events)
        if req.creates_group:
            await conn.execute(
                insert(groups).values(
                    group_id=req.group_id,
                    head_seq=new_head,
                    writer_epoch=req.writer_epoch,
                    owner_instance=self.instance_id,
                    lease_expires_us=expires,
                    created_us=now,
                )
            )
            return None
        result = await conn.execute(
            update(groups)
            .where(
                and_(
                    groups.c.group_id == req.group_id,
                    groups.c.writer_epoch == req.writer_epoch,
                    groups.c.head_seq == req.expected_head,
                )
            )
            .values(head_seq=new_head, lease_expires_us=expires)
        )
        if result.rowcount == 1:
            return None
        row = (
            await conn.execute(
                select(groups.c.writer_epoch, groups.c.head_seq).where(groups.c.group_id == req.group_id)
            )
        ).first()
        if row is None:
            return Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {req.group_id} does not exist")
        if int(row[0]) != req.writer_epoch:
            return Rejected(
                R.REJECTION_REASON_WRITER_FENCED,
                f"writer epoch {req.writer_epoch} of group {req.group_id} was superseded by {row[0]}",
                current_writer_epoch=row[0],
            )
        return Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"group {req.group_id} head moved to {row[1]} (expected {req.expected_head})",
            current_revision=row[1],
        )

    @staticmethod
    async def _insert_rows(conn: AsyncConnection, accepted: list[AppendRequest]) -> None:
        if not accepted:
            return
        await conn.execute(
            insert(events),
            [
                {
                    "group_id": req.group_id,
                    "seq": ev.sequence,
                    "event_id": ev.event_id,
                    "type": ev.type,
                    "command_id": req.command_id,
                    "recorded_us": ev.recorded_us,
                    "envelope": ev.envelope,
                }
                for req in accepted
                for ev in req.events
            ],
        )
        await conn.execute(
            insert(commands),
            [
                {
                    "group_id": req.group_id,
                    "command_id": req.command_id,
                    "fingerprint": req.fingerprint,
                    "first_seq": req.expected_head + 1,
                    "last_seq": req.expected_head + len(req.events),
                    "event_count": len(req.events),
                }
                for req in accepted
            ],
        )

    @staticmethod
    def _integrity_rejection(req: AppendRequest) -> Rejected:
        if req.creates_group:
            return Rejected(R.REJECTION_REASON_GROUP_EXISTS, f"group {req.group_id} already exists")
        return Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"a concurrent append to group {req.group_id} (or the same command id) won",
        )
