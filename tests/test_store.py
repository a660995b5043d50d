"""Event store: ordered fenced appends, group commit, idempotency records (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.kernel.clock import ManualClock
from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2
from missionweave_server.services.authority.batch_sql import SqlAlchemyOps, SqliteOps
from missionweave_server.services.authority.group_commit import BatchWriter
from missionweave_server.services.authority.schema import create_schema
from missionweave_server.services.authority.store import AppendRequest, EventStore, StoredEvent
from missionweave_server.services.authority.writer_process import open_writer_connection
from missionweave_server.storage.db import make_engine, sqlite_writer_target

R = common_pb2.RejectionReason


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    eng = make_engine(db_url)
    await create_schema(eng)
    yield eng
    await eng.dispose()


def rows(group: str, first: int, n: int, tag: str = "") -> list[StoredEvent]:
    return [
        StoredEvent(first + i, f"evt_{group}_{first + i}{tag}", "test.event", 0, b"payload-%d" % (first + i))
        for i in range(n)
    ]


def request(group: str, epoch: int, head: int, n: int, cmd: str, create: bool = False) -> AppendRequest:
    return AppendRequest(
        group, epoch, head, cmd, b"fp-" + cmd.encode(), rows(group, head + 1, n, cmd), create
    )


async def test_append_read_and_command_records(engine: AsyncEngine) -> None:
    store = EventStore(engine, ManualClock())
    await store.append(request("g1", 1, 0, 3, "c1", create=True))
    await store.append(request("g1", 1, 3, 2, "c2"))
    assert [e.sequence for e in await store.read("g1")] == [1, 2, 3, 4, 5]
    assert [e.sequence for e in await store.read("g1", after=3)] == [4, 5]
    record = await store.find_command("g1", "c2")
    assert record is not None and (record.first_seq, record.last_seq) == (4, 5)
    assert await store.head("g1") == 5
    await store.close()


async def test_expected_head_mismatch_is_rejected_and_writes_nothing(engine: AsyncEngine) -> None:
    store = EventStore(engine, ManualClock())
    await store.append(request("g1", 1, 0, 2, "c1", create=True))
    with pytest.raises(Rejected) as info:
        await store.append(request("g1", 1, 1, 1, "c2"))
    assert info.value.reason == R.REJECTION_REASON_REVISION_MISMATCH
    assert await store.head("g1") == 2 and await store.find_command("g1", "c2") is None
    await store.close()


async def test_creating_an_existing_group_is_rejected(engine: AsyncEngine) -> None:
    store = EventStore(engine, ManualClock())
    await store.append(request("g1", 1, 0, 1, "c1", create=True))
    with pytest.raises(Rejected) as info:
        await store.append(request("g1", 1, 0, 1, "c2", create=True))
    assert info.value.reason == R.REJECTION_REASON_GROUP_EXISTS
    await store.close()


async def test_a_command_id_its_group_has_is_never_appended_again(engine: AsyncEngine) -> None:
    """D159: event ids are derived from (Group, command id, index) and have no unique index of their
    own; the commands key is what keeps them from repeating. An append that reuses a command id of
    its Group is refused whole, even at the right head and with other events, and writes nothing."""
    store = EventStore(engine, ManualClock())
    await store.append(request("g1", 1, 0, 1, "c1", create=True))
    with pytest.raises(Rejected) as info:
        await store.append(request("g1", 1, 1, 2, "c1"))
    assert info.value.reason == R.REJECTION_REASON_REVISION_MISMATCH
    assert await store.head("g1") == 1
    assert [e.sequence for e in await store.read("g1")] == [1]
    record = await store.find_command("g1", "c1")
    assert record is not None and (record.first_seq, record.last_seq) == (1, 1)
    # The same command id in another Group is another command: its events are that Group's.
    await store.append(request("g2", 1, 0, 1, "c1", create=True))
    assert await store.head("g2") == 1
    await store.close()


async def test_second_authority_instance_fences_the_first(engine: AsyncEngine) -> None:
    """Writer epoch per Group: once another instance takes over, the old one can never append."""
    clock = ManualClock()
    a = EventStore(engine, clock, instance_id="a", ownership_ttl=timedelta(seconds=30))
    b = EventStore(engine, clock, instance_id="b", ownership_ttl=timedelta(seconds=30))
    await a.append(request("g1", 1, 0, 1, "c1", create=True))
    with pytest.raises(Rejected) as info:
        await b.acquire("g1")
    assert info.value.reason == R.REJECTION_REASON_NOT_OWNER and info.value.metadata["owner"] == "a"
    clock.advance(seconds=31)  # a stops renewing: its ownership lease lapses
    acquired = await b.acquire("g1")
    assert acquired == (2, 1)
    with pytest.raises(Rejected) as info:
        await a.append(request("g1", 1, 1, 1, "c2"))
    assert info.value.reason == R.REJECTION_REASON_WRITER_FENCED
    await b.append(request("g1", 2, 1, 1, "c3"))
    assert [e.event_id for e in await a.read("g1")] == ["evt_g1_1c1", "evt_g1_2c3"]
    await a.close()
    await b.close()


async def test_concurrent_appends_are_group_committed(engine: AsyncEngine) -> None:
    store = EventStore(engine, ManualClock())
    groups = [f"g{i}" for i in range(20)]
    await asyncio.gather(*(store.append(request(g, 1, 0, 1, "create", create=True)) for g in groups))

    async def writer(g: str) -> None:
        for i in range(10):
            await store.append(request(g, 1, 1 + i, 1, f"c{i}"))

    await asyncio.gather(*(writer(g) for g in groups))
    for g in groups:
        assert [e.sequence for e in await store.read(g)] == list(range(1, 12))
    assert store.appends == 220
    assert store.batches < store.appends / 2, (store.batches, store.appends)
    await store.close()


async def test_one_bad_append_does_not_sink_its_batch(engine: AsyncEngine) -> None:
    store = EventStore(engine, ManualClock())
    await store.append(request("g1", 1, 0, 1, "c1", create=True))
    results = await asyncio.gather(
        store.append(request("g1", 1, 0, 1, "dup", create=True)),
        store.append(request("g2", 1, 0, 1, "c1", create=True)),
        store.append(request("g1", 1, 1, 1, "c2")),
        return_exceptions=True,
    )
    assert isinstance(results[0], Rejected) and results[0].reason == R.REJECTION_REASON_GROUP_EXISTS
    assert results[1] is None and results[2] is None
    assert await store.head("g1") == 2 and await store.head("g2") == 1
    await store.close()


async def test_a_stale_append_in_a_batch_of_head_advances_fails_alone(engine: AsyncEngine) -> None:
    """The one-statement head advance falls back to per-request fencing when any head is stale."""
    store = EventStore(engine, ManualClock())
    await asyncio.gather(*(store.append(request(g, 1, 0, 1, "c0", create=True)) for g in ("g1", "g2", "g3")))
    results = await asyncio.gather(
        store.append(request("g1", 1, 1, 1, "c1")),
        store.append(request("g2", 1, 0, 1, "stale")),
        store.append(request("g3", 1, 1, 2, "c1")),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], Rejected) and results[1].reason == R.REJECTION_REASON_REVISION_MISMATCH
    assert (await store.head("g1"), await store.head("g2"), await store.head("g3")) == (2, 1, 3)
    assert await store.find_command("g2", "stale") is None
    await store.close()


async def test_a_batch_that_fails_late_leaves_no_head_advanced(engine: AsyncEngine) -> None:
    """Atomic group commit: a collision at insert time (after the heads moved) undoes the whole
    transaction, so the loser's head never points past events that were not written."""
    store = EventStore(engine, ManualClock())
    await asyncio.gather(*(store.append(request(g, 1, 0, 1, "c0", create=True)) for g in ("g1", "g2", "g3")))
    clash = request("g2", 1, 1, 1, "c0")  # g2's own first command id: its record collides on insert
    results = await asyncio.gather(
        store.append(request("g1", 1, 1, 1, "c1")),
        store.append(clash),
        store.append(request("g3", 1, 1, 1, "c1")),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], Rejected)
    assert (await store.head("g1"), await store.head("g2"), await store.head("g3")) == (2, 1, 2)
    assert [e.sequence for e in await store.read("g2")] == [1]
    record = await store.find_command("g2", "c0")
    assert record is not None and (record.first_seq, record.last_seq) == (1, 1)
    await store.close()


async def _enqueued_together(store: EventStore, requests: list[AppendRequest]) -> list[BaseException | None]:
    for req in requests:
        store.enqueue(req)  # all queued before the writer runs: one batch
    return await asyncio.gather(*(req.done for req in requests), return_exceptions=True)


async def _write_directly(
    engine: AsyncEngine, writer: BatchWriter, batch: list[AppendRequest]
) -> list[Rejected | None]:
    """One batch through the batch logic in this process (the store runs it in its writer process
    for SQLite), so that a test can watch which path it takes."""
    target = sqlite_writer_target(engine)
    if target is not None:
        conn = open_writer_connection(*target)
        try:
            return writer.write(SqliteOps(conn), batch, 0)
        finally:
            conn.close()
    async with engine.connect() as aconn:
        return await aconn.run_sync(lambda conn: writer.write(SqlAlchemyOps(conn), batch, 0))


@pytest.mark.parametrize("update_from", [True, False], ids=["update-from", "sqlite-before-3.33"])
async def test_pipelined_appends_of_one_group_advance_its_head_once_per_batch(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, update_from: bool
) -> None:
    """A Group's chained appends (each expecting the head its predecessor leaves) share one fenced
    head advance with the other Groups of the batch: no per-request fallback, every event stored.
    Also with the per-Group statement SQLite libraries older than 3.33 get."""
    monkeypatch.setattr(
        "missionweave_server.services.authority.batch_sql._SQLITE_HAS_UPDATE_FROM", update_from
    )
    store = EventStore(engine, ManualClock())
    await asyncio.gather(*(store.append(request(g, 1, 0, 1, "c0", create=True)) for g in ("g1", "g2")))
    writer = BatchWriter("local", 30_000_000)
    per_request: list[str] = []
    apply = writer._apply
    monkeypatch.setattr(
        writer,
        "_apply",
        lambda ops, req, now, expires: per_request.append(req.command_id) or apply(ops, req, now, expires),
    )
    chain = [
        request("g1", 1, 1, 1, "c1"),
        request("g2", 1, 1, 1, "c1"),
        request("g1", 1, 2, 2, "c2"),
        request("g1", 1, 4, 1, "c3"),
    ]
    assert await _write_directly(engine, writer, chain) == [None] * 4
    assert per_request == []
    assert (await store.head("g1"), await store.head("g2")) == (5, 2)
    assert [e.sequence for e in await store.read("g1")] == [1, 2, 3, 4, 5]
    # And through the store: one batch, same heads.
    batches = store.batches
    more = [request("g1", 1, 5, 1, "c4"), request("g2", 1, 2, 1, "c2"), request("g1", 1, 6, 1, "c5")]
    assert await _enqueued_together(store, more) == [None] * 3
    assert store.batches == batches + 1
    assert (await store.head("g1"), await store.head("g2")) == (7, 3)
    await store.close()


@pytest.mark.parametrize("update_from", [True, False], ids=["update-from", "sqlite-before-3.33"])
async def test_a_broken_chain_in_a_batch_fails_only_its_stale_append(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, update_from: bool
) -> None:
    """Two appends of one Group expecting the same head cannot both land: the fast path must not
    merge them; the per-request path lets the first win and rejects the second, writing nothing."""
    monkeypatch.setattr(
        "missionweave_server.services.authority.batch_sql._SQLITE_HAS_UPDATE_FROM", update_from
    )
    store = EventStore(engine, ManualClock())
    await asyncio.gather(*(store.append(request(g, 1, 0, 1, "c0", create=True)) for g in ("g1", "g2")))
    results: list[Rejected | None] = list(
        await _write_directly(
            engine,
            BatchWriter("local", 30_000_000),
            [
                request("g1", 1, 1, 1, "a"),
                request("g2", 1, 1, 1, "c1"),
                request("g1", 1, 1, 1, "b"),
                request("g1", 2, 2, 1, "fenced"),
            ],
        )
    )
    assert results[0] is None and results[1] is None
    assert isinstance(results[2], Rejected) and results[2].reason == R.REJECTION_REASON_REVISION_MISMATCH
    assert isinstance(results[3], Rejected) and results[3].reason == R.REJECTION_REASON_WRITER_FENCED
    assert (await store.head("g1"), await store.head("g2")) == (2, 2)
    assert await store.find_command("g1", "b") is None and await store.find_command("g1", "fenced") is None
    await store.close()


async def test_a_lone_append_never_waits_for_the_commit_linger(engine: AsyncEngine) -> None:
    """Group commit lingers only when others can share the batch (D51): a single client's
    sequential appends are written at once, however long the linger is."""
    store = EventStore(engine, ManualClock(), linger=30.0, linger_idle=30.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await store.append(request("g1", 1, 0, 1, "c0", create=True))
    for i in range(1, 4):
        await store.append(request("g1", 1, i, 1, f"c{i}"))
    assert loop.time() - started < 5.0
    assert (store.batches, store.appends) == (4, 4)
    await store.close()


async def test_commit_linger_gathers_appends_arriving_while_it_waits(engine: AsyncEngine) -> None:
    """Under load a batch waits for appends that arrive within the idle gap, and all of them
    land in one transaction; it goes as soon as none arrived for the idle gap, long before the
    linger bound."""
    store = EventStore(engine, ManualClock(), linger=30.0, linger_idle=0.3)
    groups = [f"g{i}" for i in range(6)]
    await asyncio.gather(*(store.append(request(g, 1, 0, 1, "create", create=True)) for g in groups))
    batches = store.batches
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def late(g: str, delay: float) -> None:
        await asyncio.sleep(delay)
        await store.append(request(g, 1, 1, 1, "late"))

    # Two arrive together (so the writer lingers), the others trickle in within the idle gap.
    await asyncio.gather(*(late(g, 0.05 * i if i > 1 else 0.0) for i, g in enumerate(groups)))
    assert store.batches == batches + 1, (store.batches, batches)
    assert loop.time() - started < 5.0  # ended by the idle gap, not the 30 s linger
    for g in groups:
        assert [e.sequence for e in await store.read(g)] == [1, 2]
    await store.close()


async def test_commit_linger_zero_writes_what_is_queued_at_once(engine: AsyncEngine) -> None:
    store = EventStore(engine, ManualClock(), linger=0.0)
    await store.append(request("g1", 1, 0, 1, "c0", create=True))

    async def late() -> None:
        await asyncio.sleep(0.2)
        await store.append(request("g1", 1, 2, 1, "c2"))

    batches = store.batches
    await asyncio.gather(store.append(request("g1", 1, 1, 1, "c1")), late())
    assert store.batches == batches + 2  # the late one was not waited for
    await store.close()


async def test_commit_linger_ends_once_its_batch_size_is_waiting(engine: AsyncEngine) -> None:
    """A full enough batch does not wait out the linger: with 3 appends waiting (linger_batch=3)
    the commit goes at once although the linger and the idle gap are 30 s."""
    store = EventStore(engine, ManualClock(), linger=30.0, linger_idle=30.0, linger_batch=3)
    groups = ["g1", "g2", "g3"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    await _enqueued_together(store, [request(g, 1, 0, 1, "create", create=True) for g in groups])
    await _enqueued_together(store, [request(g, 1, 1, 1, "next") for g in groups])
    assert loop.time() - started < 5.0
    assert [await store.head(g) for g in groups] == [2, 2, 2]
    await store.close()


async def test_a_cancelled_waiter_does_not_fail_the_other_appends_of_its_batch(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller that goes away while its append is in a batch (a deadline, a cancelled RPC) leaves
    its future cancelled; the batch still commits, and every other append of it is answered as
    durable, not failed (an acknowledged-but-failed answer would send a client into a retry of a
    command that did land, and make the Authority drop its view of those Groups)."""
    store = EventStore(engine, ManualClock())
    appends = [request(f"g{i}", 1, 0, 1, f"c{i}", create=True) for i in range(3)]
    for req in appends:
        store.enqueue(req)
    appends[1].done.cancel()
    await asyncio.wait_for(asyncio.gather(appends[0].done, appends[2].done), 10)
    assert [await store.head(f"g{i}") for i in range(3)] == [1, 1, 1]  # the cancelled one landed too
    assert not [r for r in caplog.records if r.getMessage() == "group commit failed"]
    await store.close()


async def test_a_slow_group_commit_is_logged_once_per_interval(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit slower than SLOW_COMMIT_S is a warning naming its size and writer, at most one per
    interval with the count of those not logged (a stalling disk stalls every Group: an operator must
    see it); a normal commit logs nothing."""
    from missionweave_server.services.authority import store as store_module

    store = EventStore(engine, ManualClock())
    store_module.slow_commit_log.reset()
    now = [1000.0]
    monkeypatch.setattr(store_module.slow_commit_log, "_now", lambda: now[0])
    caplog.set_level(logging.WARNING, logger="missionweave.authority.store")
    try:
        await store.append(request("g1", 1, 0, 1, "c0", create=True))
        assert not [r for r in caplog.records if "group commit was slow" in r.getMessage()]
        monkeypatch.setattr(store_module, "SLOW_COMMIT_S", 0.0)  # every commit is now "slow"
        await store.append(request("g1", 1, 1, 1, "c1"))
        await store.append(request("g1", 1, 2, 1, "c2"))  # within the interval: counted, not logged
        now[0] += store_module.SLOW_COMMIT_LOG_INTERVAL_S
        await store.append(request("g1", 1, 3, 2, "c3"))
        slow = [r for r in caplog.records if "group commit was slow" in r.getMessage()]
        assert [(r.appends, r.groups, r.suppressed) for r in slow] == [(1, 1, 0), (1, 1, 1)]  # type: ignore[attr-defined]
        assert all(
            r.levelno == logging.WARNING and r.seconds >= 0 and r.writer in ("process", "sqlalchemy")
            for r in slow
        )  # type: ignore[attr-defined]
    finally:
        store_module.slow_commit_log.reset()
        await store.close()


async def test_saving_snapshots_while_another_process_commits_never_fails_locked(tmp_path: Path) -> None:
    """save_snapshot reads, then writes: on SQLite (WAL) a commit by another connection between the
    two used to fail its insert at once with "database is locked", whatever the busy timeout (a read
    snapshot cannot be upgraded past another commit). It takes the write lock at BEGIN now."""

    path = Path(tmp_path) / "snap.db"
    engine = make_engine(f"sqlite+aiosqlite:///{path}")
    await create_schema(engine)
    store = EventStore(engine, ManualClock())
    stop = threading.Event()

    def other_writer() -> None:  # what the writer process does to the file: short commits, back to back
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        n = 0
        while not stop.is_set():
            n += 1
            conn.execute(
                "INSERT OR REPLACE INTO authority_instances (instance_id, address, updated_us) VALUES ('x', 'y', ?)",
                (n,),
            )
            time.sleep(0.0002)
        conn.close()

    thread = threading.Thread(target=other_writer)
    thread.start()
    try:
        for sequence in range(1, 101):
            await store.save_snapshot(
                "grp", sequence, f"{sequence:064x}", b"e", False, sequence, compact=False
            )
    finally:
        stop.set()
        thread.join()
        await store.close()
        await engine.dispose()
