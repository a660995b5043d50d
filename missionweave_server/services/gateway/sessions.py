"""Replaced sessions (MW-11.3-09): a newer session of an agent ends its streams on this gateway.

The gateway keeps the authenticated streams of each agent and listens to the identity directory
client for every session opened (as the Authority's session fence does), from the first HELLO on. A
session opened ends at once every stream of that agent that HELLO'd with an older one
(``stream.Stream.replaced``: a fatal SESSION_STALE frame, then FAILED_PRECONDITION). When the
directory client restarts its cache, announcements may have been missed, so the current session of
every agent with a stream here is asked from Membership again (``sessions_resync``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.services.gateway.stream import Stream

log = logging.getLogger("missionweave.gateway")


class SessionWatch:
    """The gateway's part (a base of ``service.GatewayServicer``, which sets these attributes)."""

    registry: IdentityDirectoryClient
    stopping: bool
    # The authenticated streams of each agent: those of a replaced session end (MW-11.3-09).
    _streams_by_agent: dict[str, set[Stream]]
    _unlisten_sessions: Callable[[], None] | None
    _resync: asyncio.Task[None] | None

    def listen_sessions(self) -> None:
        """Be told by the identity directory client of every session opened (and of every restart of
        its cache), as the Authority's session fence is: once, at the first HELLO."""
        if self._unlisten_sessions is None:
            self._unlisten_sessions = self.registry.listen_sessions(self.session_opened, self.sessions_resync)

    def authenticated(self, connection: Stream) -> None:
        """``connection`` has passed HELLO: a newer session of its agent ends it from now on."""
        self._streams_by_agent.setdefault(connection.agent_id, set()).add(connection)
        self.listen_sessions()

    def session_opened(self, agent_id: str, session_epoch: int) -> None:
        """``agent_id`` opened session ``session_epoch``: its streams HELLO'd with an older one end at
        once, with a fatal SESSION_STALE frame and status FAILED_PRECONDITION (SESSION_EPOCH_STALE)."""
        for connection in list(self._streams_by_agent.get(agent_id, ())):
            if connection.session_epoch < session_epoch:
                connection.replaced(session_epoch)

    def sessions_resync(self) -> None:
        """The directory client restarted its cache (changes may have been missed): ask Membership for
        the current session of every agent with a stream here."""
        if self._streams_by_agent and (self._resync is None or self._resync.done()) and not self.stopping:
            self._resync = asyncio.get_running_loop().create_task(self._check_sessions())

    async def _check_sessions(self) -> None:
        agents = list(self._streams_by_agent)
        try:
            current = await self.registry.get_many(agents)
        except Exception as err:  # Membership unreachable: its next resync tries again
            log.warning("could not check the sessions of the gateway's streams", extra={"detail": repr(err)})
            return
        for agent_id, identity in current.items():
            self.session_opened(agent_id, identity.session_epoch)
