"""The per-identity upload quota (D77, D119): who counts against it, the reservation an upload makes
before a byte is received, and its renewal while the upload lasts (a dead replica's lapses)."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from missionweave.kernel.clock import Clock, to_micros
from missionweave.v1 import common_pb2
from missionweave_server.edge.callers import Caller
from missionweave_server.services.artifacts.index import ArtifactIndex
from missionweave_server.services.artifacts.verify import artifact_error

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.artifacts")

DEFAULT_QUOTA_BYTES = 10 * 1024**3  # per identity (MWP_ARTIFACT_QUOTA_BYTES; 0 = no quota)
# An upload's quota reservation (D119) is renewed this often while it is received, and lapses this
# long after its last renewal (its replica died mid-upload).
RESERVATION_RENEW_S = 60.0
RESERVATION_TTL = timedelta(minutes=5)


class UploadQuota:
    """The quota's part of the servicer (a base of ``service.ArtifactServicer``, which sets these attributes)."""

    index: ArtifactIndex
    clock: Clock
    quota_bytes: int

    def _quota_of(self, caller: Caller) -> bool:
        """Whether the caller's uploads count against a quota (operators and mesh services have none)."""
        return bool(self.quota_bytes and caller.identity_id and not caller.operator)

    async def _reserve(self, identity: str, size: int, *, unless_stored: str = "") -> str | None:
        """For a caller with a quota (``_quota_of``). Refused before a byte is received: what the
        identity holds plus what it is uploading now, to any replica, would exceed
        MWP_ARTIFACT_QUOTA_BYTES. Otherwise the upload's reservation, counted by every replica until
        it ends (None when ``unless_stored`` names a blob of this size that is stored already)."""
        now = self.clock.now()
        reservation, used = await self.index.reserve(
            identity,
            size,
            self.quota_bytes,
            to_micros(now),
            to_micros(now + RESERVATION_TTL),
            unless_stored=unless_stored,
        )
        if reservation == "":
            raise artifact_error(
                R.REJECTION_REASON_QUOTA_EXCEEDED,
                "QUOTA_EXCEEDED",
                f"{identity} holds or is uploading {used} bytes; {size} more would exceed its quota of "
                f"{self.quota_bytes} bytes (nothing was stored)",
                quota_bytes=self.quota_bytes,
                used_bytes=used,
            )
        return reservation

    async def _keep_reserved(self, reservation: str) -> None:
        """While the upload lasts, however long: a replica that dies leaves a reservation that
        lapses one RESERVATION_TTL after its last renewal."""
        while True:
            await asyncio.sleep(RESERVATION_RENEW_S)
            try:
                await self.index.renew(reservation, to_micros(self.clock.now() + RESERVATION_TTL))
            except Exception:  # the next renewal tries again; the upload itself goes on
                log.warning("renewing an upload's quota reservation failed", exc_info=True)
