"""The gateway's write-behind of ACK cursors (missionweave_server/services/gateway/cursor_store.py):
a stream's end flushes what is noted and returns only once it is stored, also when an earlier flush
had already taken that stream's last ACK and is still storing it. Found by tests/test_node_agent.py:
under load, the agent exited, the test read the cursor, and the flush holding the final ACK had not
committed yet (the end-of-stream flush saw nothing noted and returned at once)."""

from __future__ import annotations

import asyncio

from missionweave_server.services.gateway.cursor_store import AckCursors


class SlowStore(AckCursors):
    """AckCursors whose store waits for the test's go-ahead and records what it stored."""

    def __init__(self) -> None:
        self._cursor_writes = {}
        self._cursor_flusher = None
        self._cursor_flush_lock = asyncio.Lock()
        self.stopping = False
        self.stored: dict[tuple[str, str], int] = {}
        self.storing = asyncio.Event()
        self.go = asyncio.Event()

    async def store_cursors(self, rows: dict[tuple[str, str], int]) -> None:
        self.storing.set()
        await self.go.wait()
        self.stored.update(rows)


async def test_a_flush_returns_only_once_the_cursors_an_earlier_flush_took_are_stored() -> None:
    cursors = SlowStore()
    cursors._cursor_writes[("agent", "grp")] = 7  # the stream's last ACK, noted
    earlier = asyncio.create_task(cursors.flush_cursors())  # the timer's flush takes it...
    await cursors.storing.wait()  # ...and is storing it
    assert cursors._cursor_writes == {}
    at_the_end = asyncio.create_task(cursors.flush_cursors())  # the stream ends: nothing noted now
    await asyncio.sleep(0.05)
    assert not at_the_end.done(), "the end-of-stream flush returned before the last ACK was stored"
    cursors.go.set()
    await asyncio.wait_for(asyncio.gather(earlier, at_the_end), 5)
    assert cursors.stored == {("agent", "grp"): 7}


async def test_cursors_noted_during_a_flush_are_stored_by_the_next_one() -> None:
    cursors = SlowStore()
    cursors._cursor_writes[("agent", "grp")] = 7
    earlier = asyncio.create_task(cursors.flush_cursors())
    await cursors.storing.wait()
    cursors._cursor_writes[("agent", "grp")] = 9  # an ACK while the first flush stores
    later = asyncio.create_task(cursors.flush_cursors())
    cursors.go.set()
    await asyncio.wait_for(asyncio.gather(earlier, later), 5)
    assert cursors.stored == {("agent", "grp"): 9} and cursors._cursor_writes == {}
