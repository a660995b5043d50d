"""IdentityDirectoryService over gRPC: the identity directory the other services read and follow.

Contract: ``protos/missionweave/internal/v1/identities.proto`` (revisions, the stream's first
message, heartbeats). Lookups read the database; ``WatchIdentities`` streams the change log after a
revision, woken at once by changes made in this process and by a shared poll of the revision counter
(every ``POLL_S``) for changes made by other Membership instances on the same database.

``delivered`` lets OpenSession answer only once its change has been written to every live stream,
of this instance (tracked in memory) and of every other instance on the database (each stream keeps
a ``directory_streams`` row: how far it has been written, alive until when): a service following the
directory learns of the new session before its holder can use it, so the older session is fenced
at once (MW-11.3-09).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator

import grpc

from missionweave.internal.v1 import identities_pb2 as pb
from missionweave.internal.v1 import identities_pb2_grpc as pb_grpc
from missionweave.kernel.errors import R, Rejected
from missionweave_server.edge.callers import Access, CallAuthenticator, Caller, requires
from missionweave_server.edge.status import rejections_as_status
from missionweave_server.services.membership.cards import AgentCards, unique_ids
from missionweave_server.services.membership.registry import IdentityRegistry

log = logging.getLogger("missionweave.membership.directory")

# The longest a stream stays silent (WatchStart.heartbeat_interval_ms); clients give up on a stream
# after three intervals without a message (STALE_INTERVALS).
HEARTBEAT_S = 1.0
STALE_INTERVALS = 3
# A stream's row counts as alive this long after its last refresh (as long as its client trusts it).
ALIVE_FOR_S = STALE_INTERVALS * HEARTBEAT_S
# How often the streams look for changes made by other Membership instances (one shared read).
POLL_S = 0.1
# How often OpenSession looks at other instances' streams while it waits for them.
DELIVERY_POLL_S = 0.02
# Changes per read of the change log while a stream catches up.
WATCH_BATCH = 256
MAX_IDENTITIES_PER_CALL = 1024
# OpenSession waits at most this long for its change to reach every stream: by then a stream that
# did not take it has been silent longer than its client trusts it.
DELIVERY_WAIT_S = ALIVE_FOR_S + 0.5


class _Stream:
    """One WatchIdentities stream of this instance: the last revision written to it."""

    __slots__ = ("delivered",)

    def __init__(self, delivered: int) -> None:
        self.delivered = delivered


@rejections_as_status
class IdentityDirectoryServicer(pb_grpc.IdentityDirectoryServiceServicer):
    SERVICE = "missionweave.internal.v1.IdentityDirectoryService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave_server/mesh/server.py)

    def __init__(self, registry: IdentityRegistry) -> None:
        self.registry = registry
        self.cards = AgentCards(registry)
        self.instance_id = os.urandom(8).hex()
        self.stopping = False
        self._streams: set[_Stream] = set()
        # Set (and replaced) when the directory's revision rises, a stream takes a change or ends,
        # or the service stops.
        self._wake = asyncio.Event()
        registry.listeners.append(self._on_change)

    def _on_change(self, revision: int) -> None:
        self._poke()

    def _poke(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    @requires(Access.MESH)
    async def GetIdentities(
        self, request: pb.GetIdentitiesRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetIdentitiesResponse:
        ids = unique_ids(request.identity_ids, MAX_IDENTITIES_PER_CALL, "identity_ids")
        revision, records = (
            await self.registry.read_identities(ids) if ids else (await self.registry.head(0), [])
        )
        return pb.GetIdentitiesResponse(identities=[r.to_directory() for r in records], revision=revision)

    @requires(Access.MESH)
    async def GetSessionKey(
        self, request: pb.GetSessionKeyRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetSessionKeyResponse:
        key = await self.registry.session_key(request.identity_id, request.session_epoch)
        return pb.GetSessionKeyResponse(session_public_key=key or b"")

    @requires(Access.MESH)
    async def GetAgentCards(
        self, request: pb.GetAgentCardsRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetAgentCardsResponse:
        """The card in force of each agent asked (the Authority checks capabilities against it)."""
        ids = unique_ids(request.agent_ids, MAX_IDENTITIES_PER_CALL, "agent_ids")
        return pb.GetAgentCardsResponse(cards=await self.cards.in_force(ids))

    @requires(Access.MESH)
    async def WatchIdentities(
        self, request: pb.WatchIdentitiesRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> AsyncIterator[pb.WatchIdentitiesResponse]:
        if self.stopping:
            raise Rejected(
                R.REJECTION_REASON_PEER_UNAVAILABLE,
                "this Membership instance is shutting down",
                peer="membership",
                retry_after_ms=100,
            )
        stream_id = os.urandom(12).hex()
        stream = _Stream(0)
        # Registered before the head is read: a session opened from here on waits for this stream.
        self._streams.add(stream)
        await self.registry.stream_opened(stream_id, self.instance_id, ALIVE_FOR_S)
        try:
            head = await self.registry.head(max_age=0)
            after = request.from_revision
            reset = after > head
            if after == 0 or reset:
                after = head  # the client reads what it needs: everything up to head is covered
            yield pb.WatchIdentitiesResponse(
                start=pb.WatchStart(
                    revision=after, reset=reset, heartbeat_interval_ms=int(HEARTBEAT_S * 1000)
                )
            )
            stream.delivered = after
            self._poke()
            await self.registry.stream_progress(stream_id, after, ALIVE_FOR_S)
            last_sent = time.monotonic()
            while not self.stopping:
                wake = self._wake  # taken before looking, so a change made meanwhile is not slept through
                if self.registry.head_seen > after:
                    changes = await self.registry.changes_after(after, WATCH_BATCH)
                    for change in changes:
                        yield pb.WatchIdentitiesResponse(change=change)
                        after = stream.delivered = change.revision
                        self._poke()  # OpenSession may be waiting for this
                    if changes:
                        await self.registry.stream_progress(stream_id, after, ALIVE_FOR_S)
                        last_sent = time.monotonic()
                        continue
                silent = time.monotonic() - last_sent
                if silent >= HEARTBEAT_S:
                    yield pb.WatchIdentitiesResponse(heartbeat=pb.WatchHeartbeat(revision=after))
                    await self.registry.stream_progress(stream_id, after, ALIVE_FOR_S)
                    last_sent, silent = time.monotonic(), 0.0
                try:
                    async with asyncio.timeout(min(POLL_S, HEARTBEAT_S - silent)):
                        await wake.wait()
                except TimeoutError:
                    await self.registry.head(max_age=POLL_S)  # changes made by other instances
        finally:
            self._streams.discard(stream)
            self._poke()
            try:
                await self.registry.stream_closed(stream_id)
            except Exception:  # the row expires on its own
                log.debug("could not remove a directory stream's row", exc_info=True)

    async def delivered(self, revision: int, timeout: float = DELIVERY_WAIT_S) -> bool:  # noqa: ASYNC109 (a bounded wait)
        """Wait until every live stream, of this instance and of the others on the database, has been
        written the change ``revision`` (True), or ``timeout`` passed (False: by then those streams'
        clients have stopped trusting them)."""
        deadline = time.monotonic() + timeout
        while True:  # this instance's streams: in memory, woken by each delivery
            wake = self._wake
            behind = sum(1 for s in self._streams if s.delivered < revision)
            if not behind:
                break
            if not await self._wait(wake, deadline):
                return self._late(revision, behind)
        while True:  # the other instances' streams pick the change up at their next poll
            behind = await self.registry.streams_behind(revision, self.instance_id)
            if not behind:
                return True
            if time.monotonic() >= deadline:
                return self._late(revision, behind)
            await asyncio.sleep(DELIVERY_POLL_S)

    @staticmethod
    async def _wait(wake: asyncio.Event, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            async with asyncio.timeout(remaining):
                await wake.wait()
        except TimeoutError:
            pass
        return True

    @staticmethod
    def _late(revision: int, behind: int) -> bool:
        log.warning(
            "a directory change did not reach every stream in time",
            extra={"revision": revision, "streams_behind": behind},
        )
        return False

    def stop(self) -> None:
        """End every stream (their clients reconnect elsewhere and resume) and refuse new ones."""
        self.stopping = True
        self._poke()
