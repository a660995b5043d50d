"""gRPC's health servicer, with Watch streams that end when the process stops.

Front doors and operators watch each service's health (``mesh/front_door.py`` mirrors its peers'),
and a Watch never ends on its own: left alone, every one would hold the server's whole shutdown
grace period. ``stop_watches`` ends them right after the final NOT_SERVING has been sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

# Time for the final NOT_SERVING to reach every watcher before its stream is ended.
LAST_WORD_S = 0.05


class MeshHealth(health_aio.HealthServicer):
    def __init__(self, integrity_name: str = "") -> None:
        super().__init__()
        self._watches: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.integrity_name = integrity_name
        self.corrupted_groups: set[str] = set()
        self._updates: set[asyncio.Task[None]] = set()

    def group_corrupted(self, group_id: str) -> None:
        """The Authority refused a Group as DATA_CORRUPTED (docs/integrity.md): the integrity entry
        turns NOT_SERVING and the Group gets an entry of its own, "<integrity>/<group id>"."""
        self.corrupted_groups.add(group_id)
        task = asyncio.ensure_future(self._mark_corrupted(group_id))
        self._updates.add(task)
        task.add_done_callback(self._updates.discard)

    async def _mark_corrupted(self, group_id: str) -> None:
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        await self.set(self.integrity_name, not_serving)
        await self.set(f"{self.integrity_name}/{group_id}", not_serving)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        if self._stopping:
            return
        watch = asyncio.ensure_future(super().Watch(request, context))
        self._watches.add(watch)
        try:
            await watch
        except asyncio.CancelledError:
            if not (self._stopping and watch.cancelled()):
                raise  # the call itself was cancelled, not ended by stop_watches
        finally:
            self._watches.discard(watch)

    async def stop_watches(self) -> None:
        self._stopping = True
        await asyncio.sleep(LAST_WORD_S)
        for watch in list(self._watches):
            watch.cancel()
