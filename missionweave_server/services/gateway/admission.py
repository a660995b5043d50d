"""Which streams a gateway holds, and for how long: admission, per-identity counts and stalls.

A gateway holds at most ``max_streams`` streams (``service.GatewayServicer.Connect`` refuses the
next) and at most ``max_streams_per_identity`` authenticated streams of one agent
(``admit_identity``, at HELLO): past either the stream gets a fatal LIMIT_EXCEEDED and status
RESOURCE_EXHAUSTED with retry information. A stream that ends is forgotten at once (``forget``), its
clean-up tracked until shutdown (``track``). A watchdog runs while streams are open and ends every
stream whose agent has not taken the frame being sent for ``stall_timeout_s``
(``stream.Stream.stalled``), so an agent that stops reading gives back what it holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.observability import metrics
from missionweave_server.services.gateway.fatal import Fatal, over_limit
from missionweave_server.services.gateway.limits import GatewayLimits
from missionweave_server.services.gateway.stream import Stream

E = pb.GatewayErrorCode
log = logging.getLogger("missionweave.gateway")


class StreamAdmission:
    """The gateway's part (a base of ``service.GatewayServicer``, which sets these attributes)."""

    limits: GatewayLimits
    stopping: bool
    connections: set[Stream]
    _per_identity: Counter[str]  # authenticated streams per agent
    _streams_by_agent: dict[str, set[Stream]]
    _closing: set[asyncio.Task[None]]  # streams being ended (stalled) and released
    _watchdog: asyncio.Task[None] | None

    def admit_identity(self, connection: Stream, agent_id: str) -> None:
        """Count an authenticated stream for its agent, or refuse it (LIMIT_EXCEEDED)."""
        if connection.ended:  # ended while its HELLO was being checked: nothing to count
            raise Fatal(E.GATEWAY_ERROR_CODE_HELLO_REQUIRED, "the stream has ended")
        held = self._per_identity.get(agent_id, 0)
        if held >= self.limits.max_streams_per_identity:
            raise over_limit(
                f"{agent_id} already has {held} streams open on this gateway",
                self.limits.max_streams_per_identity,
                "identity",
            )
        self._per_identity[agent_id] += 1
        connection.counted = agent_id

    def forget(self, connection: Stream) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            metrics.GATEWAY_OPEN_STREAMS.dec()
        streams = self._streams_by_agent.get(connection.agent_id)
        if streams is not None:
            streams.discard(connection)
            if not streams:
                del self._streams_by_agent[connection.agent_id]
        if connection.counted:
            self._per_identity[connection.counted] -= 1
            if self._per_identity[connection.counted] <= 0:
                del self._per_identity[connection.counted]
            connection.counted = ""

    def track(self, task: asyncio.Task[None]) -> None:
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def streams_of(self, agent_id: str) -> int:
        return self._per_identity.get(agent_id, 0)

    def _start_watchdog(self) -> None:
        if (self._watchdog is None or self._watchdog.done()) and not self.stopping:
            self._watchdog = asyncio.create_task(self._close_stalled())

    async def _close_stalled(self) -> None:
        """Closes streams whose agent has not taken the frame being sent for ``stall_timeout_s``."""
        limit = self.limits.stall_timeout_s
        period = min(max(limit / 4, 0.05), 5.0)
        while self.connections:
            await asyncio.sleep(period)
            self._close_stalled_now(limit)

    def _close_stalled_now(self, limit: float) -> None:
        now = time.monotonic()
        for connection in list(self.connections):
            since = connection.sending_since
            if since is not None and now - since > limit:
                log.warning(
                    "closing a gateway stream that stopped reading",
                    extra={"agent": connection.agent_id, "stalled_s": round(now - since, 1)},
                )
                connection.stalled(now - since)
