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
from typing import Any

from nacl.signing import SigningKey
from sqlalchemy import (
    Executable,
    Select,
    Table,
    and_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from missionweave.kernel.clock import Clock, to_micros
from missionweave.kernel.errors import Rejected
from missionweave.kernel.logs import RateLimitedLog
from missionweave.v1 import common_pb2
from missionweave_server.observability import metrics, tracing
from missionweave_server.services.authority.batch_sql import SqlAlchemyOps
from missionweave_server.services.authority.group_commit import AppendRecord, BatchWriter, StoredEvent
from missionweave_server.services.authority.ownership_seal import OwnershipSeal
from missionweave_server.services.authority.schema import (
    authority_instances,
    chain_checkpoints,
    checkpoint_upsert,
    commands,
    cross_group_outbox,
    events,
    events_archive,
    groups,
    instance_upsert,
    live_leases,
    snapshots,
)
from missionweave_server.services.authority.writer_process import WriterLost, WriterProcess, unknown_outcome
from missionweave_server.storage.aio import finish_on_cancel
from missionweave_server.storage.db import SQLITE_IMMEDIATE, sqlite_writer_target

__all__ = ["AppendRequest", "CommandRecord", "EventStore", "RecordedSequences", "StoredEvent"]

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.authority.store")

# A group commit slower than this is logged (at most once per interval): every append in it, and
# every command behind it, waited that long. Normal commits take ~0.5-6 ms; a disk that stalls its
# fsync (a shared volume, a full device queue) shows up here before anywhere else.
SLOW_COMMIT_S = 0.1
SLOW_COMMIT_LOG_INTERVAL_S = 10.0
slow_commit_log = RateLimitedLog(SLOW_COMMIT_LOG_INTERVAL_S, log)


@dataclass(frozen=True)
class CommandRecord:
    fingerprint: bytes
    first_seq: int
    last_seq: int


@dataclass(frozen=True)
class RecordedSequences:
    """A Group's head and the furthest sequence each record written beside its events names, read
    in one statement (one snapshot of the store): every append writes its command record (and any
    outbox rows) in the transaction that moves the head, and snapshots and chain checkpoints are
    only ever taken at a durable head, so in an intact store none of them is past the head."""

    head: int
    last_command: int | None  # max(commands.last_seq)
    last_snapshot: int | None  # max(snapshots.seq)
    checkpoint: int | None  # chain_checkpoints.seq
    last_outbox: int | None  # max(cross_group_outbox.source_seq)


@dataclass(frozen=True)
class LiveLease:
    """A row of the live-lease index: ``agent_id`` runs ``work_item_id`` of ``group_id`` under a
    lease of its session ``session_epoch``."""

    group_id: str
    work_item_id: str
    agent_id: str
    session_epoch: int


@dataclass
class AppendRequest(AppendRecord):
    """An append on its way through the group commit: the record, and what its caller awaits."""

    # When the writer signed the ``payloads`` (``EventStore.sign_events_with``): its signatures, one
    # per event, once ``done`` resolves.
    signatures: list[bytes] = field(default_factory=list)
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    # The event loop's time when it was queued (mwp_append_latency_seconds).
    queued_at: float = 0.0


class EventStore:
    def __init__(
        self,
        engine: AsyncEngine,
        clock: Clock,
        *,
        instance_id: str = "local",
        ownership_ttl: timedelta = timedelta(seconds=30),
        max_batch: int = 512,
        linger: float = 0.008,
        linger_idle: float = 0.001,
        linger_batch: int = 32,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.instance_id = instance_id
        self.ownership_ttl = ownership_ttl
        # How recent an instance's heartbeat (authority_instances) keeps its Groups from being taken
        # over once their leases lapse; 0 where instances send none (set with the hand-back rounds).
        self.owner_alive_us = 0
        self.max_batch = max_batch
        # Group commit under load waits for more appends (D51): up to ``linger`` seconds, ending as
        # soon as none arrived for ``linger_idle`` or ``linger_batch`` are waiting. 0 writes whatever
        # is queued at once.
        self.linger = linger
        self.linger_idle = linger_idle
        self.linger_batch = max(1, min(linger_batch, max_batch))
        self._last_enqueue = 0.0  # loop time of the latest enqueue
        self._queue: asyncio.Queue[AppendRequest | None] = asyncio.Queue()  # None: stop (close)
        self._closing = False
        self._writer: asyncio.Task[None] | None = None
        self.batches = 0
        self.appends = 0
        self._ttl_us = int(ownership_ttl.total_seconds() * 1_000_000)
        self._batch_writer = BatchWriter(instance_id, self._ttl_us)
        target = sqlite_writer_target(engine)
        self._sqlite_writer = None if target is None else WriterProcess(*target, instance_id, self._ttl_us)
        self._writer_seen: int | None = None  # the writer process that made the last commit
        # Seals ownership rows and checks other instances' (``seal_ownership_with``); None: neither
        # (a store opened for reads or by tests of the store alone).
        self.ownership: OwnershipSeal | None = None

    # ------------------------------------------------------------ lifecycle

    def seal_ownership_with(self, seal: OwnershipSeal) -> None:
        """Seal the ownership rows this instance takes; treat another's without a valid seal as lapsed."""
        self.ownership = seal

    def owner_seal(self, group_id: str, writer_epoch: int) -> bytes:
        """The seal of this instance's ownership of a Group it creates at ``writer_epoch``."""
        return (
            b"" if self.ownership is None else self.ownership.seal(group_id, self.instance_id, writer_epoch)
        )

    def sign_events_with(self, key: SigningKey, key_id: str) -> bool:
        """Let the store's writer sign the events of appends that carry ``payloads`` (D56). True
        when it can: the SQLite writer process does it beside the commit, off the event loop; with
        PostgreSQL the caller signs (False). Set before the first append."""
        if self._sqlite_writer is None:
            return False
        if self._writer is not None:
            raise RuntimeError("sign_events_with must be called before the store's first append")
        self._sqlite_writer.set_signer(key.encode(), key_id)
        return True

    def start(self) -> None:
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop(), name="event-store-writer")

    async def close(self) -> None:
        if self._writer is not None:
            # Graceful drain: the writer commits everything queued before the stop mark, waits for
            # its commits in flight, then ends.
            self._closing = True
            self._queue.put_nowait(None)
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
            self._closing = False
        if self._sqlite_writer is not None:
            await self._sqlite_writer.close()

    # ------------------------------------------------------------ reads

    @finish_on_cancel
    async def acquire(self, group_id: str) -> tuple[int, int] | None:
        """Take (or keep) ownership of an existing Group: returns (writer_epoch, head) or None if absent.

        Raises NOT_OWNER while another instance holds an unexpired ownership lease, or (with
        heartbeats, ``owner_alive_us``) while the owner is alive: an idle Group's lapsed lease does
        not let a caller's stale placement take it from a live owner (rebalance.py).
        """
        now = to_micros(self.clock.now())
        expires = now + int(self.ownership_ttl.total_seconds() * 1_000_000)
        takeable: Any = groups.c.lease_expires_us < now
        if self.owner_alive_us:
            alive = select(authority_instances.c.instance_id).where(
                authority_instances.c.updated_us >= now - self.owner_alive_us
            )
            takeable = and_(takeable, groups.c.owner_instance.not_in(alive))
        async with self.engine.begin() as conn:
            taken = await self._take(
                conn, group_id, or_(groups.c.owner_instance == self.instance_id, takeable), expires
            )
            if taken is not None:
                return taken
            held = await _owner_row(conn, group_id)
            if held is not None and not self._sealed(group_id, held):
                # Not taken by an instance of this Authority: a row edited outside the service.
                log.error(
                    "a Group's ownership row is not sealed by the Authority key: taking the Group over",
                    extra={
                        "group_id": group_id,
                        "owner": held.owner_instance,
                        "writer_epoch": int(held.writer_epoch),
                    },
                )
                unsealed = and_(
                    groups.c.writer_epoch == held.writer_epoch, groups.c.owner_instance == held.owner_instance
                )
                taken = await self._take(conn, group_id, unsealed, expires)
                if taken is not None:
                    return taken
                held = await _owner_row(conn, group_id)  # another instance took it meanwhile
        if held is None:
            return None
        owner, address = held.owner_instance, held.address or ""
        raise Rejected(
            R.REJECTION_REASON_NOT_OWNER,
            f"group {group_id} is owned by authority instance {owner}"
            + (f" at {address}" if address else ""),
            owner=owner,
            owner_address=address,
        )

    async def _take(
        self, conn: AsyncConnection, group_id: str, when: Any, expires: int
    ) -> tuple[int, int] | None:
        """Take the Group if ``when`` holds of its row, raising its writer epoch and sealing the new
        ownership: (writer_epoch, head), or None when ``when`` does not hold."""
        row = (
            await conn.execute(
                update(groups)
                .where(and_(groups.c.group_id == group_id, when))
                .values(
                    writer_epoch=groups.c.writer_epoch + 1,
                    owner_instance=self.instance_id,
                    lease_expires_us=expires,
                )
                .returning(groups.c.writer_epoch, groups.c.head_seq)
            )
        ).first()
        if row is None:
            return None
        epoch, head = int(row[0]), int(row[1])
        if self.ownership is not None:
            await conn.execute(
                update(groups)
                .where(and_(groups.c.group_id == group_id, groups.c.writer_epoch == epoch))
                .values(owner_seal=self.ownership.seal(group_id, self.instance_id, epoch))
            )
        return epoch, head

    def _sealed(self, group_id: str, held: Any) -> bool:
        return self.ownership is None or self.ownership.holds(
            group_id, held.owner_instance, int(held.writer_epoch), held.owner_seal
        )

    @finish_on_cancel
    async def owner(self, group_id: str) -> tuple[str, str] | None:
        """The instance that owns the Group, or last did (its lease may have lapsed since its last
        append), and its address ("" when it never announced one); None when the Group does not
        exist or its ownership row is not sealed (no instance validly owns it: the next to need it
        takes it)."""
        async with self.engine.connect() as conn:
            held = await _owner_row(conn, group_id)
        if held is None or not self._sealed(group_id, held):
            return None
        return str(held.owner_instance), str(held.address or "")

    @finish_on_cancel
    async def announce(self, address: str) -> None:
        """Say where this instance is reached, for the NOT_OWNER answers of the other instances."""
        row = {"instance_id": self.instance_id, "address": address, "updated_us": to_micros(self.clock.now())}
        async with self.engine.begin() as conn:
            await conn.execute(instance_upsert(self.engine.dialect.name), [row])

    @finish_on_cancel
    async def retire(self) -> None:
        """Stop counting as alive (a graceful stop): no hand-back round gives this instance a Group."""
        async with self.engine.begin() as conn:
            await conn.execute(
                update(authority_instances)
                .where(authority_instances.c.instance_id == self.instance_id)
                .values(updated_us=0)
            )

    @finish_on_cancel
    async def live_instances(self, since_us: int) -> dict[str, str]:
        """The instances that announced themselves at or after ``since_us``: id -> address, the most
        recent announcement last (of two at one address, a restarted process's is the newer)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(authority_instances.c.instance_id, authority_instances.c.address)
                .where(authority_instances.c.updated_us >= since_us)
                .order_by(authority_instances.c.updated_us)
            )
            return {str(r[0]): str(r[1]) for r in rows}

    @finish_on_cancel
    async def owned_groups(self) -> list[str]:
        """The Groups whose ownership row names this instance (its lease lapsed or not)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(groups.c.group_id).where(groups.c.owner_instance == self.instance_id)
            )
            return [str(r[0]) for r in rows]

    @finish_on_cancel
    async def hand_over(self, group_id: str, to_instance: str) -> bool:
        """Make ``to_instance`` the Group's owner, if this instance still is: the writer epoch is
        raised (an append this instance still had in flight is fenced) and the new ownership sealed,
        with a full lease, so nobody but ``to_instance`` takes the Group until it lapses. False when
        this instance no longer owns the Group."""
        expires = to_micros(self.clock.now()) + int(self.ownership_ttl.total_seconds() * 1_000_000)
        async with self.engine.begin() as conn:
            row = (
                await conn.execute(
                    update(groups)
                    .where(and_(groups.c.group_id == group_id, groups.c.owner_instance == self.instance_id))
                    .values(
                        writer_epoch=groups.c.writer_epoch + 1,
                        owner_instance=to_instance,
                        lease_expires_us=expires,
                    )
                    .returning(groups.c.writer_epoch)
                )
            ).first()
            if row is None:
                return False
            if self.ownership is not None:
                epoch = int(row[0])
                await conn.execute(
                    update(groups)
                    .where(and_(groups.c.group_id == group_id, groups.c.writer_epoch == epoch))
                    .values(owner_seal=self.ownership.seal(group_id, to_instance, epoch))
                )
        return True

    @finish_on_cancel
    async def head(self, group_id: str) -> int | None:
        async with self.engine.connect() as conn:
            value = (
                await conn.execute(select(groups.c.head_seq).where(groups.c.group_id == group_id))
            ).scalar_one_or_none()
        return None if value is None else int(value)

    @finish_on_cancel
    async def recorded_sequences(self, group_id: str) -> RecordedSequences | None:
        """The Group's head and what its records name (``RecordedSequences``); None when it has no
        Group row. One statement, by primary-key prefixes: the command records' maximum reads the
        Group's command rows (no more rows than its events, which a load reads anyway)."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(_RECORDED, {"g": group_id})).first()
        if row is None:
            return None
        return RecordedSequences(int(row[0]), *(None if v is None else int(v) for v in row[1:]))

    @finish_on_cancel
    async def read(self, group_id: str, after: int = 0, limit: int = 1024) -> list[StoredEvent]:
        return await self._read(_READ_ONLINE, group_id, after, limit)

    @finish_on_cancel
    async def read_history(self, group_id: str, after: int = 0, limit: int = 1024) -> list[StoredEvent]:
        """Like ``read`` but across both tiers: compaction moves events to the archive, and the
        Authority's fold still needs every one of them (the online log alone would start mid-way)."""
        return await self._read(_READ_HISTORY, group_id, after, limit)

    async def _read(self, query: Executable, group_id: str, after: int, limit: int) -> list[StoredEvent]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(query, {"g": group_id, "after": after, "n": limit})
            return [StoredEvent(int(r[0]), r[1], r[2], int(r[3]), bytes(r[4])) for r in rows]

    async def read_range(self, group_id: str, first: int, last: int) -> list[StoredEvent]:
        """Events ``first..last`` from whichever tier holds them (a replayed command's answer)."""
        return await self.read_history(group_id, first - 1, last - first + 1)

    @finish_on_cancel
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

    @finish_on_cancel
    async def commands_of(self, group_id: str) -> dict[str, CommandRecord]:
        """Every accepted command id of a Group (loaded once when an instance takes the Group)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(
                    commands.c.command_id, commands.c.fingerprint, commands.c.first_seq, commands.c.last_seq
                ).where(commands.c.group_id == group_id)
            )
            return {r[0]: CommandRecord(bytes(r[1]), int(r[2]), int(r[3])) for r in rows}

    @finish_on_cancel
    async def pending_links(self, limit: int = 64) -> list[tuple[str, int, str]]:
        """Cross-Group outbox rows not yet applied by their target, oldest first."""
        o = cross_group_outbox.c
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(o.source_group_id, o.source_seq, o.target_group_id)
                .order_by(o.created_us, o.source_seq)
                .limit(limit)
            )
            return [(str(r[0]), int(r[1]), str(r[2])) for r in rows]

    @finish_on_cancel
    async def drop_link(self, source_group_id: str, source_seq: int, target_group_id: str) -> None:
        """The target applied the row (or the link was compensated): it is done."""
        o = cross_group_outbox.c
        async with self.engine.begin() as conn:
            await conn.execute(
                delete(cross_group_outbox).where(
                    and_(
                        o.source_group_id == source_group_id,
                        o.source_seq == source_seq,
                        o.target_group_id == target_group_id,
                    )
                )
            )

    @finish_on_cancel
    async def running_leases(self, agent_id: str | None = None) -> list[LiveLease]:
        """The running execution leases the index holds (of one agent, or all), by Group."""
        c = live_leases.c
        query = select(c.group_id, c.work_item_id, c.agent_id, c.session_epoch).order_by(
            c.group_id, c.work_item_id
        )
        if agent_id is not None:
            query = query.where(c.agent_id == agent_id)
        async with self.engine.connect() as conn:
            rows = await conn.execute(query)
            return [LiveLease(str(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows]

    @finish_on_cancel
    async def drop_running_leases(self, group_id: str, agent_id: str, below_epoch: int) -> None:
        """Rows of ``agent_id`` in ``group_id`` from sessions before ``below_epoch`` that its log no
        longer backs (the lease ended by a path the index did not see): nothing to revoke."""
        c = live_leases.c
        async with self.engine.begin() as conn:
            await conn.execute(
                delete(live_leases).where(
                    and_(c.group_id == group_id, c.agent_id == agent_id, c.session_epoch < below_epoch)
                )
            )

    @finish_on_cancel
    async def first_online(self, group_id: str) -> int | None:
        """The first sequence still in the online log (None when the Group has no online events)."""
        async with self.engine.connect() as conn:
            value = (
                await conn.execute(select(func.min(events.c.seq)).where(events.c.group_id == group_id))
            ).scalar_one_or_none()
        return None if value is None else int(value)

    @finish_on_cancel
    async def save_snapshot(
        self,
        group_id: str,
        sequence: int,
        digest: str,
        envelope: bytes,
        archival: bool,
        now_us: int,
        *,
        compact: bool,
    ) -> None:
        """Store a signed snapshot; with ``compact``, move the online events up to it into the archive
        tier in the same transaction (history is moved, never deleted: MW-7.4-01, MW-16-09).

        It reads, then writes: on SQLite it takes the write lock at BEGIN (IMMEDIATE), or a commit by the
        writer process between the two would fail the insert at once with "database is locked" (WAL
        cannot upgrade a read snapshot another commit has passed; the busy timeout does not apply)."""
        async with self.engine.connect() as plain:
            conn = await plain.execution_options(**{SQLITE_IMMEDIATE: True})
            async with conn.begin():
                existing = (
                    await conn.execute(
                        select(snapshots.c.digest).where(
                            snapshots.c.group_id == group_id, snapshots.c.seq == sequence
                        )
                    )
                ).first()
                if existing is None:
                    await conn.execute(
                        insert(snapshots).values(
                            group_id=group_id,
                            seq=sequence,
                            digest=digest,
                            archival=int(archival),
                            created_us=now_us,
                            envelope=envelope,
                        )
                    )
                if compact:
                    online = and_(events.c.group_id == group_id, events.c.seq <= sequence)
                    await conn.execute(
                        insert(events_archive).from_select(
                            list(events.c.keys()), select(events).where(online)
                        )
                    )
                    await conn.execute(delete(events).where(online))

    @finish_on_cancel
    async def latest_snapshot(self, group_id: str, at_least: int = 0) -> tuple[int, str, bytes] | None:
        """(sequence, digest, envelope) of the newest snapshot at or after ``at_least``."""
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(snapshots.c.seq, snapshots.c.digest, snapshots.c.envelope)
                    .where(snapshots.c.group_id == group_id, snapshots.c.seq >= at_least)
                    .order_by(snapshots.c.seq.desc())
                    .limit(1)
                )
            ).first()
        return None if row is None else (int(row[0]), row[1], bytes(row[2]))

    @finish_on_cancel
    async def snapshot_by_digest(self, group_id: str, digest: str) -> bytes | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(snapshots.c.envelope).where(
                        snapshots.c.group_id == group_id, snapshots.c.digest == digest
                    )
                )
            ).first()
        return None if row is None else bytes(row[0])

    @finish_on_cancel
    async def chain_checkpoint(self, group_id: str) -> tuple[int, bytes] | None:
        """(sequence, signed envelope) of the Group's chain checkpoint (docs/integrity.md)."""
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(chain_checkpoints.c.seq, chain_checkpoints.c.envelope).where(
                        chain_checkpoints.c.group_id == group_id
                    )
                )
            ).first()
        return None if row is None else (int(row[0]), bytes(row[1]))

    @finish_on_cancel
    async def save_chain_checkpoint(self, group_id: str, sequence: int, envelope: bytes) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                checkpoint_upsert(self.engine.dialect.name),
                [{"group_id": group_id, "seq": sequence, "envelope": envelope}],
            )

    @finish_on_cancel
    async def group_ids(self) -> list[str]:
        async with self.engine.connect() as conn:
            return [r[0] for r in await conn.execute(select(groups.c.group_id).order_by(groups.c.group_id))]

    @finish_on_cancel
    async def group_ids_after(self, after: str, limit: int) -> list[str]:
        """At most ``limit`` Group ids greater than ``after``, in order (one indexed range read)."""
        query = (
            select(groups.c.group_id)
            .where(groups.c.group_id > after)
            .order_by(groups.c.group_id)
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            return [r[0] for r in await conn.execute(query)]

    # ------------------------------------------------------------ appends

    async def append(self, request: AppendRequest) -> None:
        """Queue an append and wait until it is durable (or raises Rejected)."""
        self.enqueue(request)
        await request.done

    def enqueue(self, request: AppendRequest) -> None:
        """Queue an append; ``request.done`` resolves once it is durable (or fails with Rejected).

        Appends are written in the order they are queued, so a caller may queue an append that
        builds on one not yet durable: it is fenced on the head its predecessor leaves.
        """
        if self._writer is None:
            self.start()
        self._last_enqueue = request.queued_at = asyncio.get_running_loop().time()
        self._queue.put_nowait(request)

    async def _write_loop(self) -> None:
        if self._sqlite_writer is not None:
            await self._sqlite_writer.start()
        previous = 1
        stop = False
        while not stop:
            first = await self._queue.get()
            if first is None:
                break
            # A lone append (nothing queued behind it, the last batch a single one too) goes at once:
            # lingering only pays when there are others to share the commit with.
            if self.linger > 0 and (previous > 1 or not self._queue.empty()):
                await self._linger()
            batch = [first]
            while len(batch) < self.max_batch and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    stop = True
                    break
                batch.append(item)
            previous = len(batch)
            # One commit at a time, on purpose: handing the writer the next batch while one commits
            # (SQLite would run them in order) made batches half as big and throughput lower; the
            # batch that waits meanwhile keeps growing instead.
            try:
                await self._commit_batch(batch)
            except Exception as exc:  # never let the writer die: fail the batch, keep serving
                log.exception("group commit failed", extra={"batch": len(batch)})
                for req in batch:
                    if not req.done.done():
                        req.done.set_exception(exc)

    async def _linger(self) -> None:
        """Let a batch fill (like PostgreSQL's commit_delay or Kafka's linger.ms).

        Every commit costs the event loop a round trip to the writer, the writer a transaction with a
        WAL write of each touched page and an fsync, whatever the batch size; and each batch's
        answers leave as one burst, which the transport handles more cheaply than a trickle. The wait ends once no
        append arrived for ``linger_idle``, or once ``linger_batch`` appends wait: past that a
        bigger batch saves little and only holds the commit back (with 256 commands in flight the
        8 ms bound made every cycle 8 ms longer). It counts from now, not from the oldest queued
        append: appends that queued behind the previous commit going at once made batches half as
        big and throughput lower (bench/README has the figures).
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.linger
        while self._queue.qsize() + 1 < self.linger_batch and not self._closing:
            now = loop.time()
            quiet_from = max(start, self._last_enqueue) + self.linger_idle
            if now >= deadline or now >= quiet_from:
                return
            await asyncio.sleep(min(deadline, quiet_from) - now)

    async def _commit_batch(self, batch: list[AppendRequest]) -> None:
        # A root span of its own (the writer task's context is whatever started it), linked to
        # the decision of every append it commits: one batch serves many traces.
        with tracing.tracer().start_as_current_span(
            "authority.group_commit",
            context=tracing.context_of(""),
            links=tracing.link_to([r.traceparent for r in batch]) if tracing.active() else (),
            attributes={
                "mwp.batch_size": len(batch),
                "mwp.writer": "process" if self._sqlite_writer else "sqlalchemy",
            },
        ):
            await self._commit_traced(batch)

    async def _commit_traced(self, batch: list[AppendRequest]) -> None:
        now = to_micros(self.clock.now())
        loop = asyncio.get_running_loop()
        started = loop.time()
        outcomes: list[Rejected | None]
        if self._sqlite_writer is not None:
            try:
                outcomes, signatures = await self._sqlite_writer.commit(batch, now)
                for req, sigs in zip(batch, signatures, strict=True):
                    req.signatures = sigs
            except WriterLost as lost:
                outcomes = list(unknown_outcome(batch, lost))
        else:
            async with self.engine.connect() as aconn:
                outcomes = await aconn.run_sync(
                    lambda conn: self._batch_writer.write(SqlAlchemyOps(conn), batch, now)
                )
        self.batches += 1
        ended = loop.time()
        metrics.BATCH_LATENCY.observe(ended - started)
        # A writer process's first commit also waits for its start-up (its imports), not the disk.
        writer_pid = self._sqlite_writer.pid if self._sqlite_writer is not None else None
        warm, self._writer_seen = writer_pid == self._writer_seen, writer_pid
        if ended - started > SLOW_COMMIT_S and warm:
            slow_commit_log.warning(
                "group commit",
                "a group commit was slow: its appends (and the commands behind them) waited for it",
                seconds=round(ended - started, 3),
                appends=len(batch),
                groups=len({req.group_id for req in batch}),
                writer="process" if self._sqlite_writer is not None else "sqlalchemy",
            )
        metrics.BATCH_SIZE.observe(len(batch))
        for req, outcome in zip(batch, outcomes, strict=True):
            if outcome is None:
                self.appends += 1
                metrics.APPEND_LATENCY.observe(ended - req.queued_at)
            if req.done.done():  # its waiter was cancelled with it: the outcome stands in the store
                continue
            if outcome is None:
                req.done.set_result(None)
            else:
                req.done.set_exception(outcome)


def _events_after(tier: Table) -> Select[Any]:
    return select(tier.c.seq, tier.c.event_id, tier.c.type, tier.c.recorded_us, tier.c.envelope).where(
        and_(tier.c.group_id == bindparam("g"), tier.c.seq > bindparam("after"))
    )


# Built once: the gateway reads on every delivery, and building a statement per call (and its cache
# key) cost more than running it.
_READ_ONLINE = _events_after(events).order_by(events.c.seq).limit(bindparam("n"))
_READ_HISTORY = (
    union_all(_events_after(events_archive), _events_after(events)).order_by("seq").limit(bindparam("n"))
)


def _most(column: Any, key: Any) -> Any:
    return select(func.max(column)).where(key == bindparam("g")).scalar_subquery()


_RECORDED = select(
    groups.c.head_seq,
    _most(commands.c.last_seq, commands.c.group_id),
    _most(snapshots.c.seq, snapshots.c.group_id),
    _most(chain_checkpoints.c.seq, chain_checkpoints.c.group_id),
    _most(cross_group_outbox.c.source_seq, cross_group_outbox.c.source_group_id),
).where(groups.c.group_id == bindparam("g"))


async def _owner_row(conn: AsyncConnection, group_id: str) -> Any:
    """The Group's owner instance, its announced address (or None), writer epoch and seal; None when
    the Group does not exist."""
    return (
        await conn.execute(
            select(
                groups.c.owner_instance,
                authority_instances.c.address,
                groups.c.writer_epoch,
                groups.c.owner_seal,
            )
            .select_from(
                groups.outerjoin(
                    authority_instances, authority_instances.c.instance_id == groups.c.owner_instance
                )
            )
            .where(groups.c.group_id == group_id)
        )
    ).first()
