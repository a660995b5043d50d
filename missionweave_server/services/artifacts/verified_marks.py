"""When each blob's hash last matched on a read (``StatResponse.last_verified_at``), written behind
the reads (D142).

Every whole Download and BatchDownload re-verifies the bytes it serves; recording that time was a
write transaction per read, awaited before the stream ended, which cost a 1 MiB Download about a
fifth of its time. The times are kept here instead and written in one transaction for all the
blobs read within ``delay_s``; until then reads in this process see them (``overlay``). The record
is advisory: a crash loses at most ``delay_s`` of verification times, and what the index holds is
still a time the blob did verify.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("missionweave.artifacts")

MARK_DELAY_S = 1.0  # how long a verification time may wait for the next write


class VerifiedMarks:
    def __init__(
        self, write: Callable[[dict[str, int]], Awaitable[None]], delay_s: float = MARK_DELAY_S
    ) -> None:
        self._write = write  # one transaction: digest -> verified time (µs), never moving a time back
        self._delay = delay_s
        self._pending: dict[str, int] = {}
        self._writing: dict[str, int] = {}  # taken by the write in progress, still shown by overlay
        self._task: asyncio.Task[None] | None = None

    def note(self, digest: str, now_us: int) -> None:
        """``digest`` verified at ``now_us``: written within ``delay_s``."""
        if now_us > self._pending.get(digest, 0):
            self._pending[digest] = now_us
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._later())

    def overlay(self, digest: str, stored_us: int) -> int:
        """The later of the index's verification time and one not yet written."""
        return max(stored_us, self._pending.get(digest, 0), self._writing.get(digest, 0))

    async def flush(self) -> None:
        """Write every time noted so far (a failed write keeps them for the next)."""
        while self._pending and not self._writing:
            self._writing, self._pending = self._pending, {}
            try:
                await self._write(self._writing)
            except BaseException:
                for digest, at in self._writing.items():
                    self._pending[digest] = max(at, self._pending.get(digest, 0))
                raise
            finally:
                self._writing = {}

    async def close(self) -> None:
        """Stop the timer and write what is pending (the service is stopping)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.flush()

    async def _later(self) -> None:
        await asyncio.sleep(self._delay)
        try:
            await self.flush()
        except Exception:  # the database is unavailable: kept in memory, tried again after the delay
            log.warning("verification times not written; trying again in %.1f s", self._delay, exc_info=True)
        self._task = None
        if self._pending:
            self._task = asyncio.get_running_loop().create_task(self._later())
