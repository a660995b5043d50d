"""The cross-Group relay: delivers the outbox rows the Authority wrote beside an append (MW-10.4-05).

Any instance delivers any row; the row's target is written by whichever instance owns it, so a
row whose target another shard owns answers NOT_OWNER here and is left for that shard's relay
(all shards of a PostgreSQL store see one outbox). A delivery is idempotent (the target's command
id derives from the source event), so a crash anywhere — after the source append, between the two
appends, before the row is dropped — at worst delivers a row again. docs/subtasks.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2
from missionweave_server.services.authority.authority import GroupAuthority

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.authority.links")

# A row that failed waits this long (doubling, up to the ceiling) before this instance tries it again.
RETRY_FIRST_S = 0.5
RETRY_CEILING_S = 30.0
BATCH = 64


class LinkRelay:
    def __init__(self, authority: GroupAuthority, poll_s: float) -> None:
        self.authority = authority
        self.poll_s = poll_s  # how often the outbox is read without a kick (other shards' rows)
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._retry_at: dict[tuple[str, int, str], tuple[float, float]] = {}  # row -> (when, delay)
        self.delivered = 0

    def start(self) -> None:
        self.authority.on_links = self._kick.set
        self._task = asyncio.create_task(self._run(), name="cross-group-relay")

    async def close(self) -> None:
        self.authority.on_links = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def drain(self) -> int:
        """Deliver every row that is due now, once; the number delivered (tests, ``mwp`` tools)."""
        delivered = 0
        rows = await self.authority.store.pending_links(BATCH)
        if len(rows) < BATCH:  # rows gone from the outbox (delivered elsewhere) need no retry record
            self._retry_at = {row: due for row, due in self._retry_at.items() if row in set(rows)}
        for row in rows:
            retry = self._retry_at.get(row)
            if retry is not None and retry[0] > time.monotonic():
                continue
            try:
                await self.authority.apply_link(*row)
            except (Rejected, ConnectionError, OSError) as failed:
                self._later(row, failed)
                continue
            self._retry_at.pop(row, None)
            delivered += 1
        self.delivered += delivered
        return delivered

    def _later(self, row: tuple[str, int, str], failed: Exception) -> None:
        delay = min(RETRY_CEILING_S, self._retry_at.get(row, (0.0, RETRY_FIRST_S / 2))[1] * 2)
        self._retry_at[row] = (time.monotonic() + delay, delay)
        if isinstance(failed, Rejected) and failed.reason == R.REJECTION_REASON_NOT_OWNER:
            return  # the target's owner delivers it
        log.warning(
            "a cross-Group link could not be delivered yet",
            extra={
                "group_id": row[2],
                "source_group_id": row[0],
                "source_sequence": row[1],
                "detail": str(failed),
                "retry_in_s": delay,
            },
        )

    async def _run(self) -> None:
        while True:
            try:
                if await self.drain() == BATCH:
                    continue  # more may be waiting
            except Exception:  # the store is unreachable: keep the relay alive, try again
                log.exception("the cross-Group relay failed to read the outbox")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self._kick.wait()
            self._kick.clear()
