"""GatewayService: one authenticated stream per agent session (spec 16, MW-8-11..18), and GetSnapshot.

The frame protocol is documented in protos/missionweave/v1/gateway_service.proto. This module is the
servicer itself and its wiring: ``Connect`` opens a stream (refused past ``max_streams``), starts its
reader and writes its outbox to the call, batched when the agent reads batches; ``GetSnapshot``
serves a CURSOR_TOO_OLD reference; ``stop`` ends every stream before the database goes away. The
rest of the gateway is in the modules named for it: the stream and how it ends (``stream.py``), its
reader (``connection.py``), HELLO and the proof checks (``hello.py``), subscriptions and delivery
within credits (``delivery.py``), COMMAND (``commands.py``), FETCH (``fetch.py``), replaced
sessions (``sessions.py``), admission, per-identity counts and stalls (``admission.py``), the shared
follows of Groups (``fanout.py``, D132), the write-behind ACK cursors (``cursor_store.py``), fairness
across Groups (``outbox.py``), the Authority's refusals and timeouts (``authority_calls.py``) and the
bounds (``limits.py``).

The gateway reaches the Group Authority only through its contracts, on one channel (in process or
to the Authority's address, ``missionweave_server/mesh/peers.py``): a subscription starts on its own
``GroupLogService.FollowGroup`` stream (missionweave.internal.v1), which decides what the member may
see and pushes new events as they become durable, and once caught up moves to the gateway's one
shared follow of the Group, where the Authority names each event's audience; FETCH and GetSnapshot
are ``GroupLogService.FetchEvents`` and ``GetMemberSnapshot``; COMMAND is the public
``AuthorityService.ExecuteCommand``. What stays in the gateway is what agents see: streams, credit
windows, fairness across Groups and the durable ACK cursors (``schema.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.internal.v1 import group_log_pb2 as glpb
from missionweave.internal.v1 import group_log_pb2_grpc as glpb_grpc
from missionweave.kernel.clock import Clock
from missionweave.kernel.errors import from_proto
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import authority_service_pb2_grpc
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc
from missionweave_server.edge.callers import Access, CallAuthenticator, normalize_audience, requires
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.edge.status import peer_unavailable, rejections_as_status
from missionweave_server.observability import metrics
from missionweave_server.services.gateway import authority_calls, limits
from missionweave_server.services.gateway.admission import StreamAdmission
from missionweave_server.services.gateway.connection import Connection
from missionweave_server.services.gateway.cursor_store import AckCursors, CursorStore
from missionweave_server.services.gateway.fanout import SharedFeeds
from missionweave_server.services.gateway.fatal import Fatal, over_limit
from missionweave_server.services.gateway.hello import SessionProofs
from missionweave_server.services.gateway.limits import GatewayLimits
from missionweave_server.services.gateway.outbox import Outbox
from missionweave_server.services.gateway.sessions import SessionWatch
from missionweave_server.storage.aio import cancel_and_wait
from missionweave_server.storage.replay import NonceCache, SharedNonces

log = logging.getLogger("missionweave.gateway")

GOING_AWAY_MESSAGE = "the gateway is shutting down: reconnect and resume from your cursors"

# Every gateway of this process (tests start several), for the credits gauge.
_GATEWAYS: weakref.WeakSet[GatewayServicer] = weakref.WeakSet()


def _credits_outstanding() -> float:
    """mwp_gateway_credits_outstanding, read at scrape time (from the metrics thread: the list()
    copies are taken under the GIL, so the loop's changes cannot break the iteration)."""
    return float(
        sum(
            s.credits
            for g in list(_GATEWAYS)
            for c in list(g.connections)
            for s in list(c.subscriptions.values())
        )
    )


metrics.GATEWAY_CREDITS.set_function(_credits_outstanding)


@rejections_as_status
class GatewayServicer(
    SessionProofs, SessionWatch, StreamAdmission, SharedFeeds, AckCursors, pb_grpc.GatewayServiceServicer
):
    SERVICE = "missionweave.v1.GatewayService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave_server/mesh/server.py)

    def __init__(
        self,
        authority: Any,
        registry: IdentityDirectoryClient,
        engine: AsyncEngine,
        clock: Clock,
        limits: GatewayLimits | None = None,
        audiences: Iterable[str] = (),
        shared_nonces: SharedNonces | None = None,
    ) -> None:
        # ``authority``: a channel to the Group Authority, over the network or in process (Peers).
        self.group_log = glpb_grpc.GroupLogServiceStub(authority)
        self.commands = authority_service_pb2_grpc.AuthorityServiceStub(authority)
        self.registry = registry
        self.engine = engine
        self.cursor_store = CursorStore(engine)
        self.clock = clock
        self.limits = limits or GatewayLimits()
        # The audiences a HelloProof may name (the mesh's, ``rpc.callers.audiences_for``); the mesh sets them once
        # it knows the port it listens on.
        self.audiences = frozenset(normalize_audience(a) for a in audiences)
        # HELLO and GetSnapshot; ``shared_nonces``: also the other gateway replicas' (D118).
        self.nonces = NonceCache(clock, max_entries=self.limits.max_hello_nonces, shared=shared_nonces)
        self.connections = set()
        _GATEWAYS.add(self)
        self._per_identity = Counter()  # authenticated streams per agent
        self.stopping = False
        self._cursor_writes = {}
        self._cursor_flusher = None
        self._cursor_flush_lock = asyncio.Lock()
        self._watchdog = None
        self._closing = set()  # streams being ended (stalled) and released
        self.feeds = {}  # the shared follow of each Group subscribed here (D132)
        self._feed_failed = {}  # when a Group's shared follow last ended unread
        # The authenticated streams of each agent: those of a replaced session end (MW-11.3-09).
        self._streams_by_agent = {}
        self._unlisten_sessions = None
        self._resync = None
        self.listen_sessions()

    @requires(Access.SIGNED)
    async def Connect(
        self, request_iterator: AsyncIterator[pb.ConnectRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ConnectResponse]:
        if self.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, GOING_AWAY_MESSAGE)
        # Bounded per Group and in bytes: backpressure, and fair across Groups.
        outbox = Outbox(
            max_bytes=self.limits.stream_buffer_bytes, max_events_per_frame=limits.MAX_EVENTS_PER_FRAME
        )
        connection = Connection(self, outbox)
        # However the call ends (its end, the client's cancel, a stall), the stream lets go of what
        # it holds at once; the clean-up below may not run when the call is cancelled mid-send. By
        # weak reference: gRPC keeps the latest call's state (and its callbacks) until the next call.
        ended = weakref.WeakMethod(connection.end)
        context.add_done_callback(lambda _: (end := ended()) is not None and end())  # type: ignore[arg-type]
        connection.handler = asyncio.current_task()
        connection.context = context
        self._start_watchdog()
        try:
            if len(self.connections) >= self.limits.max_streams:
                connection.refuse(
                    over_limit(
                        f"the gateway has {len(self.connections)} streams open; retry later",
                        self.limits.max_streams,
                        "gateway",
                    )
                )
            else:
                self.connections.add(connection)
                metrics.GATEWAY_OPEN_STREAMS.inc()
                connection.reader = asyncio.create_task(connection.read(request_iterator))
            while (taken := await outbox.get_sized()) is not None:
                response = connection.response(*taken)
                taken = None  # the response holds a copy: only one of them waits on a slow reader
                connection.sending_since = time.monotonic()
                yield response
                connection.sending_since = None
                del response
            if connection.ended_with is not None:
                raise connection.ended_with
            if self.stopping:
                # UNAVAILABLE is the status clients retry on: they reconnect (elsewhere) and resume
                # from their durable cursors; nothing queued-but-unsent is lost for good.
                await context.abort(grpc.StatusCode.UNAVAILABLE, GOING_AWAY_MESSAGE)
        finally:
            connection.end()
            await connection.wait_closed()
            await self.flush_cursors()  # a stream that ended has its last ACK stored

    async def stop(self, grace: float = 5.0) -> None:
        """End every stream before the server and the database go away.

        Each stream's own tasks (reader, deliveries, commands) are cancelled and awaited here, while
        the database is still open: a task left to be cancelled later by the server would wait
        forever on a connection pool that has been disposed under it. Then each stream ends with
        UNAVAILABLE. Streams that connect from now on are refused the same way.
        """
        self.stopping = True
        if self._unlisten_sessions is not None:
            self._unlisten_sessions()
            self._unlisten_sessions = None
        connections = list(self.connections)
        tasks = [task for connection in connections for task in connection.tasks()]
        for task in tasks:
            if not task.cancelling():
                task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            if pending:
                log.warning("gateway tasks still running at shutdown", extra={"tasks": len(pending)})
        for connection in connections:
            connection.go_away()
        for feed in list(self.feeds.values()):
            await cancel_and_wait(feed.task)
        await cancel_and_wait(self._resync)
        await cancel_and_wait(self._cursor_flusher)
        await cancel_and_wait(self._watchdog)
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=grace)
        await self.flush_cursors()
        await self.cursor_store.close()

    @requires(Access.SIGNED)
    async def GetSnapshot(
        self, request: pb.GetSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSnapshotResponse:
        """MW-16-12: the signed snapshot named by a CURSOR_TOO_OLD reference (verify hash and signature),
        for a caller who proves its session and holds an active Membership in the Group."""
        try:
            agent_id, _ = await self.verify_session_proof(request.proof)
        except Fatal as refused:
            raise refused.rejected from None
        # Membership, the snapshot and the reference signed by the Authority: decided over there.
        ask = glpb.GetMemberSnapshotRequest(
            group_id=request.group_id, member_id=agent_id, digest=request.digest
        )
        try:
            answer = await self.group_log.GetMemberSnapshot(ask, timeout=authority_calls.PEER_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            rejection = rejection_from_rpc_error(err)
            raise (
                from_proto(rejection) if rejection is not None else peer_unavailable("authority", err)
            ) from None
        return pb.GetSnapshotResponse(snapshot=answer.snapshot, signed_reference=answer.signed_reference)
