"""The session fence: a replacement session's older leases revoked without waiting (MW-11.3-09).

An agent opens a replacement session at the Organization level (the membership service); its
leases live in Groups. The Authority learns of the new session from the identity directory it
follows, finds in the live-lease index (``schema.live_leases``, written in every append's
transaction) the Groups where an older session of that agent still runs a lease, and appends there
the revocations that return the WorkItems to ``queued``. A periodic sweep of the whole index catches
what a notification missed (a restart of this process, a resynchronised directory stream). The
Authority's own command id derives from the new session, so a revocation is appended once however
often it is tried. Until it lands, the old lease is already unusable (every lease command checks its
session) and the new runtime's ``work.start`` revokes it in its own append (docs/decisions.md D28).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.observability import metrics
from missionweave_server.services.authority.authority import GroupAuthority
from missionweave_server.services.authority.store import LiveLease

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.authority.sessions")

# The sweep that catches missed notifications; a notified session is handled at once.
SWEEP_S = 10.0


class SessionFence:
    def __init__(
        self, authority: GroupAuthority, identities: IdentityDirectoryClient, sweep_s: float = SWEEP_S
    ) -> None:
        self.authority = authority
        self.identities = identities
        self.sweep_s = sweep_s
        self._opened: dict[str, int] = {}  # agent -> newest session epoch heard of, not yet handled
        self._sweep = True  # the first pass reads the whole index
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.revoked = 0  # Groups where leases were revoked (tests, observability)
        self._unlisten: Callable[[], None] | None = None

    def start(self) -> None:
        self._unlisten = self.identities.listen_sessions(self.session_opened, self.resync)
        self._task = asyncio.create_task(self._run(), name="session-fence")

    async def close(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def session_opened(self, agent_id: str, session_epoch: int) -> None:
        self._opened[agent_id] = max(session_epoch, self._opened.get(agent_id, 0))
        self._kick.set()

    def resync(self) -> None:
        self._sweep = True
        self._kick.set()

    async def drain(self) -> int:
        """Handle what is due now, once: the notified agents, or the whole index when a sweep is
        due. The number of Groups where leases were revoked."""
        opened, self._opened = self._opened, {}
        sweep, self._sweep = self._sweep, False
        try:
            if sweep:
                rows = await self.authority.store.running_leases()
            else:
                rows = [row for agent in opened for row in await self.authority.store.running_leases(agent)]
            epochs = await self._current_epochs(rows, opened)
        except Exception:
            # The store or Membership is unreachable: everything is tried again by the next sweep.
            self._sweep = True
            raise
        revoked = 0
        done: set[tuple[str, str]] = set()
        for row in rows:
            epoch = epochs.get(row.agent_id, 0)
            if row.session_epoch >= epoch or (row.group_id, row.agent_id) in done:
                continue
            done.add((row.group_id, row.agent_id))
            try:
                if await self.authority.revoke_replaced_session(row.group_id, row.agent_id, epoch):
                    revoked += 1
            except Rejected as refused:
                if refused.reason != R.REJECTION_REASON_NOT_OWNER:  # another shard's Group: its fence
                    self._sweep = True
                    log.warning(
                        "a replaced session's leases could not be revoked yet",
                        extra={
                            "group_id": row.group_id,
                            "agent_id": row.agent_id,
                            "session_epoch": epoch,
                            "reason": R.Name(refused.reason),
                            "detail": refused.message,
                        },
                    )
        if revoked:
            metrics.SESSION_LEASES_REVOKED.inc(revoked)
        self.revoked += revoked
        return revoked

    async def _current_epochs(self, rows: list[LiveLease], opened: dict[str, int]) -> dict[str, int]:
        epochs = dict(opened)
        unknown = {row.agent_id for row in rows} - set(epochs)
        if unknown:
            for agent_id, identity in (await self.identities.get_many(unknown)).items():
                epochs[agent_id] = identity.session_epoch
        return epochs

    async def _run(self) -> None:
        while True:
            try:
                await self.drain()
            except Exception:
                log.exception("the session fence failed; it tries again at the next sweep")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sweep_s):
                    await self._kick.wait()
            if not self._kick.is_set():
                self._sweep = True  # woken by the timer
            self._kick.clear()
