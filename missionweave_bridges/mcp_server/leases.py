"""Keeping the execution leases of WorkItems held through MCP alive while the host thinks.

An LLM host is slow: minutes can pass between two tool calls. For each WorkItem this server
started (or, after a restart, finds active under its own session), a keeper renews the lease at
half its remaining term, as the Worker runtime does (docs/sdk.md). It stops when the WorkItem is no
longer active under this session (submitted, failed, blocked, checkpointed away, revoked) and when
a renewal is refused.

When the host disappears: over stdio the host's end of the pipe closes, ``mwp mcp`` exits and
renewals stop with it; over HTTP the server outlives its clients, so renewals stop once no request
(a tool call, a ``tasks/get`` poll) has come for ``idle_release_s``. Either way the lease then lapses at its expiry
(``LEASE_EXPIRED`` for a late command) and the ownership after it; the Coordinator's next offer
fences the old owner (docs/workitems.md "Leases"). Nothing is submitted or failed on the host's
behalf.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.mcp_server.desk import Desk
from missionweave_bridges.mcp_server.refusals import Refused

log = logging.getLogger(__name__)
MIN_RENEW_DELAY_S = 0.5
# Refusals that say nothing about the lease (the mesh did not answer, or was busy): the keeper tries
# again after RETRY_S rather than letting a lease lapse over a blip or a mesh restart.
PASSING = frozenset({"MESH_UNAVAILABLE", "MESH_TIMEOUT", "PEER_UNAVAILABLE", "OVERLOADED"})
RETRY_S = 1.0


class LeaseKeeper:
    """One renewal loop per WorkItem held; ``close`` stops them all (the leases then run out)."""

    def __init__(self, desk: Desk, idle_release_s: float) -> None:
        self.desk = desk
        self.idle_release_s = idle_release_s
        self.loops: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.renewals: dict[tuple[str, str], int] = {}

    def hold(self, group_id: str, work_item_id: str) -> None:
        key = (group_id, work_item_id)
        if key not in self.loops or self.loops[key].done():
            self.loops[key] = asyncio.create_task(self._keep(group_id, work_item_id), name=f"lease {key}")

    def holding(self) -> list[tuple[str, str]]:
        return [k for k, t in self.loops.items() if not t.done()]

    async def adopt(self) -> None:
        """After a restart: keep every lease this session still holds (the saved session is reused)."""
        for group_id in await self.desk.groups():
            try:
                items = await self.desk.call(self.desk.mesh.work_items(group_id, wp.WORK_ITEM_STATE_ACTIVE))
            except Refused as refused:
                log.warning("leases of %s not adopted: %s", group_id, refused)
                continue
            for item in items:
                lease = item.lease
                if lease.agent_id == self.desk.me and lease.session_epoch == self.desk.signer.session_epoch:
                    self.hold(group_id, item.work_item_id)

    async def close(self) -> None:
        for task in self.loops.values():
            task.cancel()
        await asyncio.gather(*self.loops.values(), return_exceptions=True)

    async def _keep(self, group_id: str, work_item_id: str) -> None:
        key = (group_id, work_item_id)
        while True:
            try:
                item = await self.desk.work_item(group_id, work_item_id)
                lease = self.desk.held_lease(item)
            except Refused as refused:
                if refused.reason in PASSING:
                    await asyncio.sleep(RETRY_S)
                    continue
                log.info("%s/%s: no longer held (%s): renewals stop", group_id, work_item_id, refused.reason)
                return
            left = (lease.expires_at.ToDatetime(tzinfo=UTC) - datetime.now(UTC)).total_seconds()
            await asyncio.sleep(max(MIN_RENEW_DELAY_S, left / 2))
            if time.monotonic() - self.desk.touched > self.idle_release_s:
                log.warning(
                    "%s/%s: no request for %.0f s: the host is gone; the lease is left to lapse",
                    group_id,
                    work_item_id,
                    self.idle_release_s,
                )
                return
            try:
                item = await self.desk.work_item(group_id, work_item_id)
                lease = self.desk.held_lease(item)
                body = wp.WorkRenewLease(
                    work_item_id=work_item_id, lease_id=lease.lease_id, ownership_epoch=lease.ownership_epoch
                )
                await self.desk.execute(group_id, "work_renew_lease", body)
                self.renewals[key] = self.renewals.get(key, 0) + 1
            except Refused as refused:
                if refused.reason in PASSING:  # the next turn reads the lease again and retries
                    log.info(
                        "%s/%s: renewal not answered (%s): trying again", group_id, work_item_id, refused
                    )
                    continue
                log.warning("%s/%s: renewal refused (%s): renewals stop", group_id, work_item_id, refused)
                return
