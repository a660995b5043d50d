"""The one replay rule for signed proofs (HELLO proofs, call proofs): a nonce once per window."""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
from datetime import timedelta
from pathlib import Path

from missionweave.kernel.clock import ManualClock, SystemClock
from missionweave_server.storage.db import make_engine
from missionweave_server.storage.replay import NonceCache, SharedNonces, create_schema, nonce_engine


def test_a_nonce_is_accepted_once_inside_its_window() -> None:
    clock = ManualClock()
    cache = NonceCache(clock)
    nonce = os.urandom(16)
    assert cache.accept("alice#session-1", nonce, clock.now())
    assert not cache.accept("alice#session-1", nonce, clock.now())  # the replay
    assert cache.accept("bob#session-1", nonce, clock.now())  # another signer's nonce is its own


def test_stale_future_and_badly_sized_proofs_are_refused() -> None:
    clock = ManualClock()
    cache = NonceCache(clock)
    assert not cache.accept("a", os.urandom(16), clock.now() - timedelta(seconds=31))
    assert not cache.accept("a", os.urandom(16), clock.now() + timedelta(seconds=31))
    assert not cache.accept("a", os.urandom(15), clock.now())
    assert not cache.accept("a", os.urandom(65), clock.now())
    assert len(cache) == 0


def test_pairs_are_forgotten_once_their_proof_is_stale_and_the_cache_is_bounded() -> None:
    clock = ManualClock()
    cache = NonceCache(clock, max_entries=2)
    first = os.urandom(16)
    assert cache.accept("a", first, clock.now())
    assert cache.accept("a", os.urandom(16), clock.now())
    assert (
        not cache.accept("a", os.urandom(16), clock.now()) and cache.full
    )  # full: refuse, never forget live pairs
    clock.advance(seconds=31)
    assert cache.accept("a", os.urandom(16), clock.now()) and not cache.full
    assert len(cache) == 1
    # The forgotten nonce's own proof is now stale, so forgetting it lets no replay through.
    assert not cache.accept("a", first, clock.now() - timedelta(seconds=31))


async def test_a_call_cancelled_while_its_nonce_waits_for_the_lock_leaves_sqlite_unlocked(
    tmp_path: Path,
) -> None:
    """A caller that goes away while its proof's nonce waits for SQLite's write lock: the INSERT ...
    RETURNING runs to its commit. Interrupted, its connection was closed mid-statement, and sqlite3
    kept it as a zombie holding the write lock until the garbage collector freed the cursor: every
    writer of the mesh then failed "database is locked" after its busy timeout (a flaky CI run)."""
    path = tmp_path / "mw.db"
    engine = make_engine(f"sqlite+aiosqlite:///{path}")
    await create_schema(engine)
    recording = nonce_engine(engine)
    nonces = SharedNonces(recording, SystemClock(), "call")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    probe = sqlite3.connect(path, isolation_level=None, timeout=0)
    nonce, expires = os.urandom(16), SystemClock().now() + timedelta(seconds=30)
    gc.disable()  # only the garbage collector ever released the lock: it must not hide the fault
    try:
        other.execute("BEGIN IMMEDIATE")  # another writer's moment
        call = asyncio.create_task(nonces.first_use("alice#session-1", nonce, expires))
        await asyncio.sleep(0.2)  # the INSERT waits in SQLite's busy handler
        call.cancel()
        await asyncio.sleep(0.05)
        other.execute("ROLLBACK")
        try:
            await call
        except asyncio.CancelledError:
            pass
        probe.execute("BEGIN IMMEDIATE")  # "database is locked" while a zombie holds the lock
        probe.execute("ROLLBACK")
        assert not await nonces.first_use(
            "alice#session-1", nonce, expires
        )  # recorded before the cancel took
    finally:
        gc.enable()
        other.close()
        probe.close()
        await recording.dispose()
        await engine.dispose()
