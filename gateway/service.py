"""GatewayService.Connect: one authenticated stream per agent session (spec 16, MW-8-11..18).

This first slice implements HELLO/WELCOME, SUBSCRIBE with replay from ``after_sequence`` and live
follow, EVENT batches with contiguous ranges (undeliverable events listed as ``skipped``), per
subscription credit windows with FLOW frames, durable ACK cursors per (agent, Group), COMMAND ->
RESULT and UNSUBSCRIBE, CURSOR_TOO_OLD with signed snapshot references, attention filters. The frame
protocol is documented in protos/missionweave/v1/gateway_service.proto.

The gateway reaches the Group Authority only through its contracts, on one channel (in process or
to the Authority's address, ``missionweave/mesh/peers.py``): a subscription starts on its own
``GroupLogService.FollowGroup`` stream (missionweave.internal.v1), which decides what the member may
see and pushes new events as they become durable, and once caught up moves to the gateway's one
shared follow of the Group, where the Authority names each event's audience (``fanout.py``, D132); FETCH and GetSnapshot are
``GroupLogService.FetchEvents`` and ``GetMemberSnapshot``; COMMAND is the public
``AuthorityService.ExecuteCommand``. What stays here is what agents see: streams, credit windows,
fairness across Groups (``outbox.py``) and the durable ACK cursors (``schema.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.cursor_store import CursorStore
from gateway.fanout import GroupFeed, still_members
from gateway.fetch import FetchRefused, requested
from gateway.limits import GatewayLimits
from gateway.outbox import Outbox
from gateway.schema import cursors
from missionweave import metrics
from missionweave.aio import cancel_and_wait, finish_on_cancel
from missionweave.clock import Clock, from_timestamp, to_micros, to_timestamp
from missionweave.errors import Rejected, from_proto
from missionweave.internal.v1 import group_log_pb2 as glpb
from missionweave.internal.v1 import group_log_pb2_grpc as glpb_grpc
from missionweave.replay import NONCE_MAX, NONCE_MIN, NonceCache, SharedNonces
from missionweave.rpc.callers import Access, CallAuthenticator, normalize_audience, requires
from missionweave.rpc.identities import IdentityDirectoryClient
from missionweave.rpc.status import (
    MalformedRequest,
    abort_with,
    peer_unavailable,
    rejection_from_rpc_error,
    rejections_as_status,
)
from missionweave.signing import (
    HELLO_PROOF_TYPE,
    MAX_SIGNATURES,
    parse_session_key_id,
    session_key_id,
    verify_signature,
)
from missionweave.v1 import authority_service_pb2, authority_service_pb2_grpc, command_pb2, common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc

R = common_pb2.RejectionReason
E = pb.GatewayErrorCode
log = logging.getLogger("missionweave.gateway")
_T = TypeVar("_T")


MAX_EVENTS_PER_FRAME = 256
MAX_CREDITS = 65_536
MAX_SUBSCRIPTIONS = 1_024
MAX_FRAME_BYTES = 4 * 1024 * 1024
# A batched ConnectResponse (HELLO.accepts_frame_batches): at most so many frames and bytes, as
# gateway_service.proto promises.
BATCH_FRAMES = 64
BATCH_BYTES = 256 * 1024
# An EVENT frame stops growing once its envelopes reach this (it always holds one event). With
# BATCH_BYTES and the Authority's FollowGroup batch (``group_log.MAX_BATCH_BYTES``) it bounds what a
# stream whose agent does not read holds beyond its outbox, whatever the credits it granted
# (docs/gateway.md "What a slow agent costs").
EVENT_FRAME_BYTES = 256 * 1024
# An envelope's bytes beyond its payload (type, one signature, key id), as counted against that.
ENVELOPE_OVERHEAD = 128
MAX_SUBSCRIPTION_ID = 128  # characters (SubscribeFrame.subscription_id)
# ACKs arriving within this window share one transaction (SQLite FULL sync costs a disk flush each).
CURSOR_FLUSH_DELAY_S = 0.05
# Longest the gateway waits for the Authority: a unary answer (FETCH, GetSnapshot) or the first
# answer of a FollowGroup stream; a COMMAND (which waits for its commit) a little longer, still
# below the SDK's own 30 s. A peer that is down answers UNAVAILABLE at once; these bound a peer
# that does not answer at all. Past them the agent gets AUTHORITY_UNAVAILABLE, never a hang.
PEER_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 20.0


# A Group whose shared follow ended before its first batch is not followed shared again before this.
FEED_RETRY_S = 1.0
# How long a closing stream's own tasks may take to finish their clean-up.
CLOSE_GRACE_S = 5.0
# A refused stream (too many streams) is told to retry after this long.
LIMIT_RETRY_AFTER_MS = 1000
# A replaced session's stream that has not ended this long after its fatal SESSION_STALE frame was
# queued (its agent is not reading) is ended with the status alone.
REPLACED_GRACE_S = 2.0
# Each fatal code's general reason (the Rejection in its ERROR frame).
_FATAL_REASONS: dict[int, R.ValueType] = {
    E.GATEWAY_ERROR_CODE_HELLO_INVALID: R.REJECTION_REASON_SIGNATURE_INVALID,
    E.GATEWAY_ERROR_CODE_SESSION_STALE: R.REJECTION_REASON_SESSION_EPOCH_STALE,
    E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED: R.REJECTION_REASON_OVERLOADED,
}


class _Fatal(Exception):
    """A fatal ERROR frame: the stream ends after it. ``status``: it also ends with the Rejection as
    its gRPC status (limits: RESOURCE_EXHAUSTED), not OK."""

    def __init__(self, code: int, message: str, *, status: bool = False, **metadata: object) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        reason = _FATAL_REASONS.get(code, R.REJECTION_REASON_FRAME_OUT_OF_ORDER)
        self.rejected = Rejected(reason, message, **metadata)


def _over_limit(message: str, limit: int, scope: str) -> _Fatal:
    return _Fatal(
        E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED,
        message,
        status=True,
        limit=limit,
        scope=scope,
        retry_after_ms=LIMIT_RETRY_AFTER_MS,
    )


# Every gateway of this process (tests start several), for the credits gauge.
_GATEWAYS: weakref.WeakSet[GatewayServicer] = weakref.WeakSet()


@dataclass
class _Subscription:
    subscription_id: str
    group_id: str
    delivered: int  # highest sequence covered by an EVENT frame
    acked: int
    credits: int
    follow: Any = None  # its own FollowGroup call (grpc.aio or in process): read only as credits allow
    feed: GroupFeed | None = None  # ... or, instead, the gateway's shared follow of the Group (D132)
    head: int = 0  # the Group's head as last reported to it
    attention: pb.AttentionFilter = field(default_factory=pb.AttentionFilter)
    granted: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class _PeerRefused(Exception):
    """The Authority refused a request, or could not be reached: the ERROR frame to answer with."""

    def __init__(self, code: int, rejection: common_pb2.Rejection) -> None:
        super().__init__(rejection.message)
        self.code = code
        self.rejection = rejection


def _credits_outstanding() -> float:
    """mwp_gateway_credits_outstanding, read at scrape time (from the metrics thread: the list()
    copies are taken under the GIL, so the loop's changes cannot break the iteration)."""
    return float(
        sum(s.credits for g in list(_GATEWAYS) for c in list(g.connections) for s in list(c.subscriptions.values()))
    )


metrics.GATEWAY_CREDITS.set_function(_credits_outstanding)


@rejections_as_status
class GatewayServicer(pb_grpc.GatewayServiceServicer):
    SERVICE = "missionweave.v1.GatewayService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave/mesh/server.py)

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
        self.audiences: Collection[str] = frozenset(normalize_audience(a) for a in audiences)
        # HELLO and GetSnapshot; ``shared_nonces``: also the other gateway replicas' (D118).
        self.nonces = NonceCache(clock, max_entries=self.limits.max_hello_nonces, shared=shared_nonces)
        self.connections: set[_Connection] = set()
        _GATEWAYS.add(self)
        self._per_identity: Counter[str] = Counter()  # authenticated streams per agent
        self.stopping = False
        self._cursor_writes: dict[tuple[str, str], int] = {}
        self._cursor_flusher: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()  # streams being ended (stalled) and released
        self.feeds: dict[str, GroupFeed] = {}  # the shared follow of each Group subscribed here (D132)
        self._feed_failed: dict[str, float] = {}  # when a Group's shared follow last ended unread
        # The authenticated streams of each agent: those of a replaced session end (MW-11.3-09).
        self._streams_by_agent: dict[str, set[_Connection]] = {}
        self._unlisten_sessions: Callable[[], None] | None = None
        self._resync: asyncio.Task[None] | None = None
        self.listen_sessions()

    @requires(Access.SIGNED)
    async def Connect(
        self, request_iterator: AsyncIterator[pb.ConnectRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ConnectResponse]:
        if self.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, GOING_AWAY_MESSAGE)
        # Bounded per Group and in bytes: backpressure, and fair across Groups.
        outbox = Outbox(max_bytes=self.limits.stream_buffer_bytes, max_events_per_frame=MAX_EVENTS_PER_FRAME)
        connection = _Connection(self, outbox)
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
                    _over_limit(f"the gateway has {len(self.connections)} streams open; retry later",
                                self.limits.max_streams, "gateway")
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

    # ------------------------------------------------------------ stream bookkeeping

    def admit_identity(self, connection: _Connection, agent_id: str) -> None:
        """Count an authenticated stream for its agent, or refuse it (LIMIT_EXCEEDED)."""
        if connection.ended:  # ended while its HELLO was being checked: nothing to count
            raise _Fatal(E.GATEWAY_ERROR_CODE_HELLO_REQUIRED, "the stream has ended")
        held = self._per_identity.get(agent_id, 0)
        if held >= self.limits.max_streams_per_identity:
            raise _over_limit(
                f"{agent_id} already has {held} streams open on this gateway", self.limits.max_streams_per_identity, "identity"
            )
        self._per_identity[agent_id] += 1
        connection.counted = agent_id

    def forget(self, connection: _Connection) -> None:
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

    # ------------------------------------------------------------ replaced sessions (MW-11.3-09)

    def listen_sessions(self) -> None:
        """Be told by the identity directory client of every session opened (and of every restart of
        its cache), as the Authority's session fence is: once, at the first HELLO."""
        if self._unlisten_sessions is None:
            self._unlisten_sessions = self.registry.listen_sessions(self.session_opened, self.sessions_resync)

    def authenticated(self, connection: _Connection) -> None:
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
        except _Fatal as refused:
            raise refused.rejected from None
        # Membership, the snapshot and the reference signed by the Authority: decided over there.
        ask = glpb.GetMemberSnapshotRequest(group_id=request.group_id, member_id=agent_id, digest=request.digest)
        try:
            answer = await self.group_log.GetMemberSnapshot(ask, timeout=PEER_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            rejection = rejection_from_rpc_error(err)
            raise from_proto(rejection) if rejection is not None else peer_unavailable("authority", err) from None
        return pb.GetSnapshotResponse(snapshot=answer.snapshot, signed_reference=answer.signed_reference)

    async def verify_session_proof(self, proof: common_pb2.SignedEnvelope) -> tuple[str, int]:
        """The (agent, session epoch) a HelloProof proves: signed by that session's key, about that
        session, for this gateway (its audience), fresh (30 s) and not seen before (its nonce, once
        per replay window), from the agent's current session. Raises _Fatal otherwise, and the
        directory's Rejected (PEER_UNAVAILABLE, retry_after_ms) when Membership cannot confirm the
        session. HELLO and GetSnapshot share one nonce cache: a proof is used once, for either."""
        if not proof.signatures or len(proof.signatures) > MAX_SIGNATURES:
            raise _Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "a HelloProof signed by a session key is required")
        key_id = parse_session_key_id(proof.signatures[0].key_id)
        if key_id is None or proof.payload_type != HELLO_PROOF_TYPE:
            raise _Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "a HelloProof signed by a session key is required")
        agent_id, session_epoch = key_id
        key = await self.registry.session_key(agent_id, session_epoch)
        if key is None or not verify_signature(proof, key):
            raise _Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "the proof does not verify with the session key")
        try:
            claim = pb.HelloProof.FromString(proof.payload)
        except DecodeError:
            raise _Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "the proof is not a HelloProof") from None
        if (claim.agent_id, claim.session_epoch) != key_id or not NONCE_MIN <= len(claim.nonce) <= NONCE_MAX:
            raise _Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "the proof names another session or has no nonce")
        if normalize_audience(claim.audience) not in self.audiences:
            raise _Fatal(
                E.GATEWAY_ERROR_CODE_HELLO_INVALID,
                f"the proof is for audience {claim.audience!r}, not this gateway; "
                f"make it for one of {', '.join(sorted(self.audiences)) or '(none configured)'}",
                field="audience",
            )
        try:
            issued_at = from_timestamp(claim.issued_at)
        except (ValueError, OverflowError):
            raise _Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "the proof's issued_at is not a valid time", field="issued_at") from None
        if not self.nonces.fresh(issued_at):
            raise _Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "the proof is stale (clock skew over 30 s)", field="issued_at")
        if not await self.nonces.use(session_key_id(agent_id, session_epoch), claim.nonce, issued_at):
            if self.nonces.full:
                raise _over_limit("too many HELLO proofs in the replay window; retry later", self.limits.max_hello_nonces, "nonces")
            raise _Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "the proof's nonce was already used: make a fresh proof", field="nonce")
        identity = await self.registry.get(agent_id, at_least_epoch=session_epoch)
        if identity is None or identity.session_epoch != session_epoch:
            raise _Fatal(E.GATEWAY_ERROR_CODE_SESSION_STALE, "a newer session of this agent exists")
        return key_id

    # ------------------------------------------------------------ shared follows (D132)

    def feed_for(self, group_id: str, delivered: int, caught_up: bool) -> GroupFeed | None:
        """The Group's shared follow if a subscription at ``delivered`` may continue from it; a new
        one from ``delivered`` when there is none and the subscription is ``caught_up`` with the
        head (a feed never starts behind: subscriptions at the head would wait for its replay). Not
        within FEED_RETRY_S of one that ended without a single batch (an Authority that refuses or
        drops the SHARED view would otherwise be asked again for every batch)."""
        feed = self.feeds.get(group_id)
        if feed is not None:
            return feed if feed.covers(delivered) else None
        if not caught_up or self.stopping or time.monotonic() - self._feed_failed.get(group_id, -FEED_RETRY_S) < FEED_RETRY_S:
            return None
        feed = GroupFeed(group_id, delivered, lambda after: self.open_shared(group_id, after), self._feed_ended)
        self.feeds[group_id] = feed
        return feed

    def _feed_ended(self, feed: GroupFeed) -> None:
        if self.feeds.get(feed.group_id) is feed:
            del self.feeds[feed.group_id]
        if feed.position == feed.start and feed.subscribers > 0:
            self._feed_failed[feed.group_id] = time.monotonic()
        else:
            self._feed_failed.pop(feed.group_id, None)

    async def open_shared(self, group_id: str, after: int) -> Any:
        """The SHARED FollowGroup stream of a Group after ``after`` (no member: every view at once)."""
        request = glpb.FollowGroupRequest(
            group_id=group_id, after_sequence=after, max_batch_entries=MAX_EVENTS_PER_FRAME, view=glpb.FOLLOW_VIEW_SHARED
        )
        call, started = await _open_follow(self.group_log, request)
        if started.effective_after_sequence != after:
            call.cancel()
            raise _PeerRefused(E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE, _unavailable_rejection("the shared follow starts elsewhere"))
        return call

    def note_cursor(self, agent_id: str, group_id: str, cursor: int) -> None:
        """Record an acknowledged cursor; it is stored shortly after, with every other ACK of that
        moment in one transaction (an ACK never waits for the disk before credits flow again)."""
        key = (agent_id, group_id)
        if cursor > self._cursor_writes.get(key, 0):
            self._cursor_writes[key] = cursor
        if self._cursor_flusher is None or self._cursor_flusher.done():
            self._cursor_flusher = asyncio.create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(CURSOR_FLUSH_DELAY_S)
        await self.flush_cursors()

    async def flush_cursors(self) -> None:
        """Store every noted cursor now (a stream's end and shutdown call this)."""
        while self._cursor_writes:
            rows, self._cursor_writes = self._cursor_writes, {}
            try:
                await self.store_cursors(rows)
            except Exception:
                log.exception("storing ACK cursors failed; retrying with the next flush")
                for key, cursor in rows.items():
                    self._cursor_writes[key] = max(cursor, self._cursor_writes.get(key, 0))
                return

    @finish_on_cancel
    async def store_cursors(self, rows: dict[tuple[str, str], int]) -> None:
        """The acknowledged cursors per (agent, Group), durable (MW-16-06/07), only ever forward; ACK
        never deletes history (MW-16-09)."""
        await self.cursor_store.store(rows, to_micros(self.clock.now()))

    @finish_on_cancel
    async def stored_cursor(self, agent_id: str, group_id: str) -> int:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(cursors.c.cursor).where(
                        cursors.c.agent_id == agent_id, cursors.c.group_id == group_id
                    )
                )
            ).first()
        return int(row[0]) if row else 0


GOING_AWAY_MESSAGE = "the gateway is shutting down: reconnect and resume from your cursors"


class _Connection:
    """One Connect stream: the authenticated agent, its subscriptions and the outgoing queue."""

    def __init__(self, gateway: GatewayServicer, outbox: Outbox) -> None:
        self.gateway = gateway
        self.outbox = outbox
        self.agent_id = ""
        self.session_epoch = 0
        self.subscriptions: dict[str, _Subscription] = {}
        self.requests: set[asyncio.Task[None]] = set()  # COMMAND and FETCH being answered
        self.reader: asyncio.Task[None] | None = None
        self.ended_with: Rejected | None = None  # the status the stream ends with, after its frames
        self.handler: asyncio.Task[Any] | None = None  # the Connect call's own task
        self.context: Any = None  # ... and its ServicerContext
        self.sending_since: float | None = None  # when the frame being sent was handed to gRPC
        self.counted = ""  # the agent this stream is counted for (GatewayServicer.admit_identity)
        self.batches = False  # HELLO.accepts_frame_batches: ready frames share a response
        self.ended = False
        self._released: asyncio.Task[None] | None = None

    def response(self, frame: pb.ServerFrame, size: int) -> pb.ConnectResponse:
        """``frame``'s response, with the frames queued behind it when the client reads batches:
        under load a response then carries many frames (one gRPC message written here and read by
        the agent instead of one each), when idle it goes out alone, without waiting for company."""
        response = pb.ConnectResponse(frame=frame)
        if not self.batches:
            return response
        room = BATCH_BYTES - size
        while room > 0 and len(response.more_frames) < BATCH_FRAMES - 1:
            taken = self.outbox.take_ready(room)
            if taken is None:
                break
            response.more_frames.append(taken[0])
            room -= taken[1] + 8  # the tag and length of each frame
        return response

    def tasks(self) -> list[asyncio.Task[None]]:
        """Every task this stream started that has not finished yet."""
        started = [self.reader, *(s.task for s in self.subscriptions.values()), *self.requests]
        return [task for task in started if task is not None and not task.done()]

    def end(self) -> None:
        """The stream is over (its end, a cancel, a stall, shutdown): idempotent and synchronous, so
        it runs from gRPC's done callback too. It leaves the gateway's counts, its tasks are
        cancelled, its Authority streams closed and its queue dropped."""
        if self.ended:
            return
        self.ended = True
        self.gateway.forget(self)
        for task in self.tasks():
            if not task.cancelling():
                task.cancel()
        for s in self.subscriptions.values():
            if s.follow is not None:
                s.follow.cancel()
        self.outbox.end(drop=True)
        self._released = asyncio.get_running_loop().create_task(self._release())
        self.gateway.track(self._released)

    async def _release(self) -> None:
        """Wait (bounded) for the stream's cancelled tasks, then let go of them and of the call: a
        cancelled task keeps its exception, whose traceback holds its frames (a batch of events, the
        frame being sent), which hold the task again (a subscription's) and this stream. Breaking
        those cycles frees it all by reference count at once, rather than at a rare full gc pass
        (missionweave/gc_policy.py: measured, 200 closed streams left 230 MB of such garbage), and whether or not
        the call's handler ever resumes (one cancelled mid-send does not)."""
        tasks = self.tasks()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_GRACE_S)
        if not self.tasks():
            for sub in self.subscriptions.values():  # its task's traceback holds its frame, which holds it
                sub.task, sub.follow, sub.feed = None, None, None
            self.reader = None
            self.subscriptions.clear()
            self.requests.clear()
        self.handler = None
        self.context = None

    async def wait_closed(self) -> None:
        """Wait for ``end``'s clean-up."""
        if self._released is not None:
            await asyncio.wait([self._released])

    def stalled(self, stalled_s: float) -> None:
        """The agent stopped reading: end the stream now, with RESOURCE_EXHAUSTED (an OVERLOADED
        Rejection, ``scope=stalled``). Its task is stuck handing gRPC a frame the agent does not take,
        and cancelling a task does not end its call: the status is sent from another task, which
        then cancels the stuck one."""
        self.end()
        if self.context is not None:
            rejected = Rejected(
                R.REJECTION_REASON_OVERLOADED,
                f"the stream took no frame for {stalled_s:.0f} s: reconnect and resume from your cursors",
                scope="stalled",
                retry_after_ms=LIMIT_RETRY_AFTER_MS,
            )
            self.gateway.track(asyncio.create_task(self._abort_stalled(self.context, self.handler, rejected)))

    @staticmethod
    async def _abort_stalled(context: Any, handler: asyncio.Task[Any] | None, rejected: Rejected) -> None:
        try:
            await abort_with(context, rejected)
        except grpc.aio.AbortError:
            pass  # what abort raises once the status is sent
        except Exception as err:  # the call ended meanwhile: nothing left to end
            log.info("a stalled stream had already ended", extra={"detail": repr(err)})
        if handler is not None and not handler.done():
            handler.cancel()

    def replaced(self, current_epoch: int) -> None:
        """A newer session of the agent was opened (MW-11.3-09): the stream ends now. What is queued
        is dropped (never sent, so no cursor covers it), its subscriptions, commands and reader stop,
        and the agent gets a fatal ERROR SESSION_STALE, then status FAILED_PRECONDITION, both with
        the Rejection SESSION_EPOCH_STALE (metadata ``session_epoch``: the stream's, ``current_epoch``:
        the new one). An agent that does not read gets the status alone after REPLACED_GRACE_S."""
        if self.ended or self.ended_with is not None:
            return
        fatal = _Fatal(
            E.GATEWAY_ERROR_CODE_SESSION_STALE,
            f"session {self.session_epoch} of {self.agent_id} was replaced by session {current_epoch}: "
            "this stream has ended; connect with the current session",
            status=True,
            session_epoch=self.session_epoch,
            current_epoch=current_epoch,
        )
        log.info(
            "ending the gateway streams of a replaced session",
            extra={"agent": self.agent_id, "session_epoch": self.session_epoch, "current_epoch": current_epoch},
        )
        this = asyncio.current_task()
        for task in self.tasks():
            if task is not this and not task.cancelling():
                task.cancel()
        for s in self.subscriptions.values():
            if s.follow is not None:
                s.follow.cancel()
        self.outbox.end(drop=True)
        self.outbox.force_control(pb.ServerFrame(error=self._error_frame(fatal)))
        self.ended_with = fatal.rejected
        if self.handler is not None and self.context is not None:
            self.gateway.track(asyncio.create_task(self._abort_unread(self.context, self.handler, fatal.rejected)))

    @classmethod
    async def _abort_unread(cls, context: Any, handler: asyncio.Task[Any], rejected: Rejected) -> None:
        """End the call with ``rejected`` if its handler has not ended it within REPLACED_GRACE_S (its
        agent does not take the frame in front of the fatal one)."""
        await asyncio.wait([handler], timeout=REPLACED_GRACE_S)
        if not handler.done():
            await cls._abort_stalled(context, handler, rejected)

    def refuse(self, fatal: _Fatal) -> None:
        """Refuse the stream before reading it: one fatal ERROR frame, then its status."""
        self.outbox.end()  # what is queued (the frame below) is still sent
        self.outbox.force_control(pb.ServerFrame(error=self._error_frame(fatal)))
        self.ended_with = fatal.rejected

    def go_away(self) -> None:
        """End the stream now, dropping what is queued (never sent, so no cursor covers it: the
        agent gets it again after reconnecting)."""
        self.outbox.end(drop=True)

    async def read(self, requests: AsyncIterator[pb.ConnectRequest]) -> None:
        try:
            frames = aiter(requests)
            try:  # HELLO within hello_timeout_s of the stream's start
                async with asyncio.timeout(self.gateway.limits.hello_timeout_s):
                    first = await anext(frames, None)
            except TimeoutError:
                raise _Fatal(
                    E.GATEWAY_ERROR_CODE_HELLO_REQUIRED,
                    f"no HELLO within {self.gateway.limits.hello_timeout_s:g} s of the stream's start",
                ) from None
            if first is not None:
                await self.handle(first.frame)
                async for request in frames:
                    await self.handle(request.frame)
        except _Fatal as fatal:
            await self.send_frame(pb.ServerFrame(error=self._error_frame(fatal)))
            if fatal.status:
                self.ended_with = fatal.rejected
        except MalformedRequest as malformed:  # a frame that does not parse: say so, then end with it
            await self.error(E.GATEWAY_ERROR_CODE_MALFORMED_FRAME, str(malformed), fatal=True, rejection=malformed.to_proto())
            self.ended_with = malformed
        except Rejected as refused:  # a peer did not answer (Membership, the nonce store): retry later
            code = E.GATEWAY_ERROR_CODE_PEER_UNAVAILABLE if refused.reason == R.REJECTION_REASON_PEER_UNAVAILABLE else 0
            await self.error(E.ValueType(code), str(refused), fatal=True, rejection=refused.to_proto())
            self.ended_with = refused
        except Exception:
            log.exception("gateway stream failed")
        finally:
            self.outbox.end()  # never blocks: what is queued is still sent, then the stream ends

    async def handle(self, frame: pb.ClientFrame) -> None:
        kind = frame.WhichOneof("frame")
        if not self.agent_id:
            if kind != "hello":
                raise _Fatal(E.GATEWAY_ERROR_CODE_HELLO_REQUIRED, "the first frame is HELLO")
            await self.hello(frame.hello)
        elif kind == "hello":
            raise _Fatal(E.GATEWAY_ERROR_CODE_DUPLICATE_HELLO, "HELLO was already received on this stream")
        elif kind == "subscribe":
            await self.subscribe(frame.subscribe)
        elif kind == "ack":
            await self.ack(frame.ack)
        elif kind == "command":
            self._answer(self.command(frame.command))
        elif kind == "unsubscribe":
            await self.unsubscribe(frame.unsubscribe.subscription_id)
        elif kind == "fetch":
            self._answer(self.fetch(frame.fetch))
        else:
            raise _Fatal(E.GATEWAY_ERROR_CODE_MALFORMED_FRAME, "unknown frame")

    # ------------------------------------------------------------ HELLO

    def _answer(self, request: Coroutine[Any, Any, None]) -> None:
        """Answer a request in its own task, so the reader goes on reading (tracked for close)."""
        task = asyncio.create_task(request)
        self.requests.add(task)
        task.add_done_callback(self.requests.discard)

    async def hello(self, hello: pb.HelloFrame) -> None:
        claimed = (hello.agent_id, hello.session_epoch)
        proved = await self.gateway.verify_session_proof(hello.proof)
        if proved != claimed:
            raise _Fatal(E.GATEWAY_ERROR_CODE_HELLO_INVALID, "the proof must be signed by the session named in HELLO")
        self.gateway.admit_identity(self, hello.agent_id)
        now = self.gateway.clock.now()
        self.agent_id, self.session_epoch = claimed
        self.gateway.authenticated(self)
        # A session opened while the proof was being checked was announced before this stream was
        # registered: the directory's cache (updated before its announcement) says so now.
        identity = await self.gateway.registry.get(self.agent_id, at_least_epoch=self.session_epoch)
        if identity is not None and identity.session_epoch > self.session_epoch:
            raise _Fatal(E.GATEWAY_ERROR_CODE_SESSION_STALE, "a newer session of this agent exists")
        self.batches = hello.accepts_frame_batches
        await self.send(
            welcome=pb.WelcomeFrame(
                connection_id=os.urandom(8).hex(),
                server_time=to_timestamp(now),
                max_frame_bytes=MAX_FRAME_BYTES,
                max_credits=MAX_CREDITS,
                max_subscriptions=MAX_SUBSCRIPTIONS,
            )
        )

    # ------------------------------------------------------------ subscriptions

    async def subscribe(self, sub: pb.SubscribeFrame) -> None:
        if not 1 <= len(sub.subscription_id) <= MAX_SUBSCRIPTION_ID:
            await self.malformed(f"subscription_id must be 1..{MAX_SUBSCRIPTION_ID} characters", "subscription_id", sub.subscription_id)
            return
        if sub.subscription_id in self.subscriptions:
            await self.error(
                E.GATEWAY_ERROR_CODE_SUBSCRIPTION_EXISTS,
                "subscription id in use",
                subscription_id=sub.subscription_id,
            )
            return
        if len(self.subscriptions) >= MAX_SUBSCRIPTIONS or sub.initial_credits > MAX_CREDITS:
            await self.error(
                E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED,
                "too many subscriptions or credits",
                subscription_id=sub.subscription_id,
            )
            return
        try:
            follow, started = await self.follow(sub.group_id, sub.after_sequence, sub.filter)
        except _PeerRefused as refused:
            await self.error(
                refused.code,
                refused.rejection.message,
                subscription_id=sub.subscription_id,
                rejection=_unavailable_only(refused),
            )
            return
        try:
            # OP-36 / MW-8-07: never before the member's visibility start (the Authority raised it).
            after = started.effective_after_sequence
            acked = await self.gateway.stored_cursor(self.agent_id, sub.group_id)
        except BaseException:
            follow.cancel()
            raise
        s = _Subscription(
            sub.subscription_id,
            sub.group_id,
            delivered=after,
            acked=min(acked, after),
            credits=sub.initial_credits or 256,
            follow=follow,
            attention=sub.filter,
            head=started.head_sequence,
        )
        self.subscriptions[s.subscription_id] = s
        try:
            await self.flow(s, pb.FLOW_REASON_SUBSCRIBED, pb.FLOW_STATE_OPEN, effective_after=after)
        except BaseException:
            follow.cancel()
            raise
        s.task = asyncio.create_task(self.deliver(s))  # it owns the FollowGroup call from here on

    async def follow(
        self, group_id: str, after: int, attention: pb.AttentionFilter
    ) -> tuple[Any, glpb.FollowStarted]:
        """Open the member's FollowGroup stream and read its first answer (bounded: PEER_TIMEOUT_S)."""
        request = glpb.FollowGroupRequest(
            group_id=group_id,
            member_id=self.agent_id,
            after_sequence=after,
            filter=attention,
            max_batch_entries=MAX_EVENTS_PER_FRAME,
        )
        return await _open_follow(self.gateway.group_log, request)

    async def deliver(self, s: _Subscription) -> None:
        """Relay the Group's log in sequence order within the credit window (MW-16-01..05, MW-8-17):
        from the gateway's shared follow of the Group when the subscription can join it (D132),
        otherwise (behind it, or with an attention filter) from its own FollowGroup stream, whose
        next answer is read only when the subscription has credits and nothing left of the previous
        one; a batch larger than the credits left is kept for the next grants."""
        entries: Sequence[glpb.LogEntry] = ()
        taken = 0
        try:
            while True:
                if s.credits == 0:
                    s.granted.clear()  # before the await below: a grant that lands during it is kept
                    await self.flow(s, pb.FLOW_REASON_CREDIT_EXHAUSTED, pb.FLOW_STATE_PAUSED)
                    while s.credits == 0:
                        await s.granted.wait()
                        s.granted.clear()
                    continue
                if s.feed is None and taken == len(entries):
                    self.join_feed(s)
                if s.feed is not None:
                    if not await self.deliver_shared(s, s.feed):
                        return
                    continue
                if taken == len(entries):
                    response = await self.next_answer(s)
                    if response is None:
                        return  # the Group could not be followed again; the agent was told
                    kind = response.WhichOneof("response") if response is not grpc.aio.EOF else None
                    if kind == "batch":
                        entries, taken, s.head = response.batch.entries, 0, response.batch.head_sequence
                        if not entries:
                            continue
                    elif kind == "membership_ended":  # the Membership ended: stop
                        await self.membership_ended(s)
                        return
                    elif kind == "cursor_too_old":
                        await self.too_old(s, response.cursor_too_old)
                        return
                    elif kind == "history_unavailable":
                        await self.history_unavailable(s)
                        return
                    else:  # EOF or an answer out of place: the stream cannot go on
                        await self.authority_lost(s, "the Group Authority ended the stream")
                        return
                batch = _within_bytes(
                    entries[taken : taken + min(s.credits, MAX_EVENTS_PER_FRAME)],
                    lambda entry: len(entry.envelope.payload) + ENVELOPE_OVERHEAD if entry.HasField("envelope") else 0,
                )
                first, last = batch[0].sequence, batch[-1].sequence
                if first != s.delivered + 1 or last - first + 1 != len(batch):
                    await self.history_unavailable(s)  # never skip silently (the contract forbids it)
                    return
                taken += len(batch)
                frame = self.event_frame(s, first, last, s.head)
                for entry in batch:
                    if entry.HasField("envelope"):
                        frame.events.append(entry.envelope)
                    else:
                        frame.skipped.append(pb.SequenceRange(first=entry.sequence, last=entry.sequence))
                await self.emit(s, frame, len(batch))
        except grpc.aio.AioRpcError as err:
            await self.authority_lost(s, f"the Group Authority stream failed: {err.code().name}: {err.details()}")
        finally:
            if s.follow is not None:
                s.follow.cancel()
            if s.feed is not None:
                s.feed.leave()
                s.feed = None

    def join_feed(self, s: _Subscription) -> None:
        """Move to the Group's shared follow when it can continue this subscription from its delivered
        sequence (its own stream is closed). Attention filters are one member's: a filtered
        subscription keeps its own stream, where the Authority applies them."""
        if s.attention.mode not in (pb.ATTENTION_MODE_UNSPECIFIED, pb.ATTENTION_MODE_ALL):
            return
        feed = self.gateway.feed_for(s.group_id, s.delivered, caught_up=s.head <= s.delivered)
        if feed is None:
            return
        if s.follow is not None:
            s.follow.cancel()
            s.follow = None
        feed.join()
        s.feed = feed

    async def deliver_shared(self, s: _Subscription, feed: GroupFeed) -> bool:
        """One EVENT frame from the shared follow, or a wait for it: this agent's view of the entries
        after its delivered sequence, as the Authority named their audiences. False once the
        subscription is over (its Membership ended, or it could not follow on its own)."""
        got = feed.take(s.delivered, min(s.credits, MAX_EVENTS_PER_FRAME))
        if got is None:  # behind the window, or the feed ended: follow on its own from here
            feed.leave()
            s.feed = None
            return await self.refollow(s)
        if not got:
            await feed.advanced.wait()
            return True
        members, ended = still_members(got, self.agent_id)
        batch = _within_bytes(members, lambda entry: entry.size if entry.visible_to(self.agent_id) else 0)
        if len(batch) < len(members):
            ended = False  # the rest comes in the next frame (a Membership that ended is found then)
        if batch:
            s.head = max(s.head, feed.head)
            frame = self.event_frame(s, batch[0].sequence, batch[-1].sequence, s.head)
            for entry in batch:
                if entry.visible_to(self.agent_id):
                    frame.events.append(entry.envelope)
                else:
                    frame.skipped.add(first=entry.sequence, last=entry.sequence)
            await self.emit(s, frame, len(batch))
        if ended:
            await self.membership_ended(s)
            return False
        return True

    def event_frame(self, s: _Subscription, first: int, last: int, head: int) -> pb.EventFrame:
        frame = pb.EventFrame(subscription_id=s.subscription_id, group_id=s.group_id, head_sequence=max(head, last))
        frame.first_sequence, frame.last_sequence = first, last
        return frame

    async def emit(self, s: _Subscription, frame: pb.EventFrame, count: int) -> None:
        s.delivered = frame.last_sequence
        s.credits -= count
        frame.credits_remaining = s.credits
        metrics.DELIVERY_LAG.observe(frame.head_sequence - frame.last_sequence)
        await self.send(event=frame)

    async def membership_ended(self, s: _Subscription) -> None:
        await self.error(
            E.GATEWAY_ERROR_CODE_NOT_A_MEMBER,
            "the Membership ended",
            subscription_id=s.subscription_id,
            group_id=s.group_id,
            fatal=False,
        )

    async def next_answer(self, s: _Subscription) -> Any:
        """The next answer of the subscription's FollowGroup stream. A stream that its Authority ends
        with NOT_OWNER (another one took the Group over and writes it) is followed again from the
        delivered sequence, at the owner it names (the shard routing remembered it), without the agent
        noticing: every sequence still comes once, in order. None when that fails (the agent got the
        ERROR; AUTHORITY_UNAVAILABLE makes it subscribe again from its cursor)."""
        while True:
            try:
                return await s.follow.read()
            except grpc.aio.AioRpcError as err:
                rejection = rejection_from_rpc_error(err)
                if rejection is None or rejection.reason != R.REJECTION_REASON_NOT_OWNER:
                    raise
            s.follow.cancel()
            if not await self.refollow(s):
                return None

    async def refollow(self, s: _Subscription) -> bool:
        """Open the subscription's own FollowGroup stream again from its delivered sequence. False when
        that fails (the agent got the ERROR; AUTHORITY_UNAVAILABLE makes it subscribe again)."""
        s.follow = None
        try:
            s.follow, started = await self.follow(s.group_id, s.delivered, s.attention)
        except _PeerRefused as refused:
            if self.subscriptions.get(s.subscription_id) is s:
                del self.subscriptions[s.subscription_id]
            await self.error(
                refused.code,
                refused.rejection.message,
                subscription_id=s.subscription_id,
                group_id=s.group_id,
                rejection=_unavailable_only(refused),
            )
            return False
        if started.effective_after_sequence != s.delivered:  # not where this stream left off
            await self.authority_lost(s, "the Group Authority that took the Group over starts elsewhere")
            return False
        s.head = started.head_sequence
        return True

    async def fetch(self, frame: pb.FetchFrame) -> None:
        """MW-8-13 / MW-8-09: the requested events this agent's Membership lets it see (decided by
        the Authority, GroupLogService.FetchEvents)."""
        try:
            requested(frame.ranges)  # the frame itself first: its own error codes
        except FetchRefused as refused:
            await self.error(refused.code, str(refused), request_id=frame.request_id)
            return
        request = glpb.FetchEventsRequest(group_id=frame.group_id, member_id=self.agent_id, ranges=frame.ranges)
        if frame.HasField("context_package"):
            request.context_package.CopyFrom(frame.context_package)
        try:
            answer = await self.gateway.group_log.FetchEvents(request, timeout=PEER_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            answered = _refusal(err)
            await self.error(
                answered.code, answered.rejection.message, request_id=frame.request_id, rejection=_unavailable_only(answered)
            )
            return
        await self.send(
            fetched=pb.FetchedFrame(
                request_id=frame.request_id, group_id=frame.group_id, events=answer.events, withheld=answer.withheld
            )
        )

    async def too_old(self, s: _Subscription, ended: glpb.CursorTooOld) -> None:
        """MW-16-11: the cursor lies before the online log; point at the snapshot to restore, as the
        Authority signed the reference to it."""
        self.subscriptions.pop(s.subscription_id, None)
        await self.send(
            cursor_too_old=pb.CursorTooOldFrame(
                subscription_id=s.subscription_id,
                group_id=s.group_id,
                requested_after_sequence=s.delivered,
                oldest_available_after_sequence=ended.oldest_available_after_sequence,
                snapshot_digest=ended.snapshot_digest,
                snapshot_sequence=ended.snapshot_sequence,
                signed_reference=ended.signed_reference,
            )
        )

    async def history_unavailable(self, s: _Subscription) -> None:
        self.subscriptions.pop(s.subscription_id, None)
        await self.error(
            E.GATEWAY_ERROR_CODE_HISTORY_UNAVAILABLE,
            f"events after {s.delivered} are not online and no snapshot covers them",
            subscription_id=s.subscription_id,
            group_id=s.group_id,
        )

    async def authority_lost(self, s: _Subscription, message: str) -> None:
        """The FollowGroup stream broke (the Authority went away): the subscription ends with
        AUTHORITY_UNAVAILABLE and retry information; SUBSCRIBE again from the cursor."""
        if self.subscriptions.get(s.subscription_id) is s:
            del self.subscriptions[s.subscription_id]
        await self.error(
            E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
            message,
            subscription_id=s.subscription_id,
            group_id=s.group_id,
            rejection=_unavailable_rejection(message),
        )

    async def ack(self, frame: pb.AckFrame) -> None:
        for cursor in frame.cursors:
            s = self.subscriptions.get(cursor.subscription_id)
            if s is None:
                await self.error(
                    E.GATEWAY_ERROR_CODE_UNKNOWN_SUBSCRIPTION,
                    "no such subscription",
                    subscription_id=cursor.subscription_id,
                )
                continue
            if cursor.group_id and cursor.group_id != s.group_id:  # empty: the subscription's Group
                await self.malformed(
                    f"subscription {s.subscription_id} follows {s.group_id}, not {cursor.group_id}", "group_id", s.subscription_id
                )
                continue
            if cursor.cursor > s.delivered:
                await self.error(
                    E.GATEWAY_ERROR_CODE_ACK_BEYOND_DELIVERED,
                    f"delivered up to {s.delivered}",
                    subscription_id=s.subscription_id,
                )
                continue
            if cursor.cursor < s.acked:
                await self.error(
                    E.GATEWAY_ERROR_CODE_ACK_REGRESSED,
                    f"already acknowledged {s.acked}",
                    subscription_id=s.subscription_id,
                )
                continue
            if s.credits + cursor.credits > MAX_CREDITS:
                await self.error(
                    E.GATEWAY_ERROR_CODE_CREDIT_OVERFLOW,
                    f"at most {MAX_CREDITS} credits",
                    subscription_id=s.subscription_id,
                )
                continue
            if cursor.cursor > s.acked:
                s.acked = cursor.cursor
                self.gateway.note_cursor(self.agent_id, s.group_id, cursor.cursor)
            if cursor.credits:
                reopened = s.credits == 0
                s.credits += cursor.credits
                s.granted.set()
                if reopened:  # a paused subscription resumes; grants to an open window are not echoed
                    await self.flow(s, pb.FLOW_REASON_CREDIT_GRANTED, pb.FLOW_STATE_OPEN)

    async def unsubscribe(self, subscription_id: str) -> None:
        s = self.subscriptions.pop(subscription_id, None)
        if s is None:
            await self.error(
                E.GATEWAY_ERROR_CODE_UNKNOWN_SUBSCRIPTION,
                "no such subscription",
                subscription_id=subscription_id,
            )
            return
        await cancel_and_wait(s.task)
        await self.flow(s, pb.FLOW_REASON_UNSUBSCRIBED, pb.FLOW_STATE_CLOSED)

    # ------------------------------------------------------------ commands

    async def command(self, frame: pb.CommandFrame) -> None:
        """Forward to the Group Authority (AuthorityService.ExecuteCommand); its Rejection, read back
        from the status, is the RESULT. No answer at all is AUTHORITY_UNAVAILABLE: the command may
        or may not have been applied, and a retry with the same command id is safe.

        The frame's command id must be the signed command's: checked before anything is forwarded
        (the command is not verified here, only read for its id; the Authority verifies it)."""
        try:
            signed_id = command_pb2.Command.FromString(frame.command.payload).command_id
        except DecodeError:
            await self.error(
                E.GATEWAY_ERROR_CODE_MALFORMED_FRAME,
                "the command's payload is not a missionweave.v1.Command",
                command_id=frame.command_id,
                rejection=Rejected(R.REJECTION_REASON_MALFORMED, "the command's payload is not a missionweave.v1.Command",
                                   field="command.payload").to_proto(),
            )
            return
        if signed_id != frame.command_id:
            await self.error(
                E.GATEWAY_ERROR_CODE_COMMAND_ID_MISMATCH,
                f"the frame's command id {frame.command_id!r} is not the signed command's ({signed_id!r}); nothing was executed",
                command_id=frame.command_id,
            )
            return
        request = authority_service_pb2.ExecuteCommandRequest(command=frame.command)
        try:
            response = await self.gateway.commands.ExecuteCommand(request, timeout=COMMAND_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            rejection = rejection_from_rpc_error(err)
            if rejection is None:
                message = f"the Group Authority did not answer ({err.code().name}: {err.details()}); retry with the same command id"
                await self.error(
                    E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
                    message,
                    command_id=frame.command_id,
                    rejection=_unavailable_rejection(message),
                )
                return
            await self.send(result=pb.ResultFrame(command_id=frame.command_id, rejection=rejection))
            return
        await self.send(result=pb.ResultFrame(command_id=frame.command_id, result=response.result))

    # ------------------------------------------------------------ output

    async def send(self, **frame: object) -> None:
        await self.send_frame(pb.ServerFrame(**frame))  # type: ignore[arg-type]

    async def send_frame(self, frame: pb.ServerFrame, group_id: str = "") -> None:
        """A subscription's frames (EVENT, FLOW, CURSOR_TOO_OLD, its ERRORs) share their Group's queue,
        so they keep their order; the rest (WELCOME, RESULT, stream ERRORs) go ahead of all Groups."""
        kind = frame.WhichOneof("frame")
        if kind in ("event", "flow", "cursor_too_old"):
            group_id = getattr(frame, kind).group_id
        if group_id:
            await self.outbox.put_group(group_id, frame)
        else:
            await self.outbox.put_control(frame)

    async def flow(self, s: _Subscription, reason: int, state: int, *, effective_after: int = 0) -> None:
        await self.send(
            flow=pb.FlowFrame(
                subscription_id=s.subscription_id,
                group_id=s.group_id,
                reason=pb.FlowReason.ValueType(reason),
                state=pb.FlowState.ValueType(state),
                credits=s.credits,
                delivered_sequence=s.delivered,
                acked_sequence=s.acked,
                effective_after_sequence=effective_after,
            )
        )

    async def error(
        self,
        code: int,
        message: str,
        *,
        subscription_id: str = "",
        command_id: str = "",
        fatal: bool = False,
        group_id: str = "",
        request_id: str = "",
        rejection: common_pb2.Rejection | None = None,
    ) -> None:
        if rejection is None:
            rejection = common_pb2.Rejection(
                reason=R.REJECTION_REASON_FRAME_OUT_OF_ORDER if fatal else R.REJECTION_REASON_INVALID_ARGUMENT,
                message=message,
            )
        error = pb.ErrorFrame(
            rejection=rejection,
            code=E.ValueType(code),
            subscription_id=subscription_id,
            command_id=command_id,
            fatal=fatal,
            request_id=request_id,
        )
        await self.send_frame(pb.ServerFrame(error=error), group_id)

    async def malformed(self, message: str, field: str, subscription_id: str) -> None:
        """A non-fatal MALFORMED_FRAME about one subscription's frame: nothing of it was done."""
        await self.error(
            E.GATEWAY_ERROR_CODE_MALFORMED_FRAME,
            message,
            subscription_id=subscription_id,
            rejection=Rejected(R.REJECTION_REASON_MALFORMED, message, field=field).to_proto(),
        )

    @staticmethod
    def _error_frame(fatal: _Fatal) -> pb.ErrorFrame:
        return pb.ErrorFrame(rejection=fatal.rejected.to_proto(), code=E.ValueType(fatal.code), fatal=True)


# ------------------------------------------------------------ the Authority's answers


async def _open_follow(group_log: Any, request: glpb.FollowGroupRequest) -> tuple[Any, glpb.FollowStarted]:
    """Open a FollowGroup stream and read its first answer (bounded: PEER_TIMEOUT_S)."""
    call = group_log.FollowGroup(request)
    try:
        async with asyncio.timeout(PEER_TIMEOUT_S):
            first = await call.read()
    except TimeoutError:
        call.cancel()
        raise _PeerRefused(
            E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
            _unavailable_rejection(f"the Group Authority did not answer within {PEER_TIMEOUT_S:g} s"),
        ) from None
    except grpc.aio.AioRpcError as err:
        call.cancel()
        raise _refusal(err) from None
    except BaseException:
        call.cancel()
        raise
    if first is grpc.aio.EOF or first.WhichOneof("response") != "started":
        call.cancel()
        raise _PeerRefused(
            E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
            _unavailable_rejection("the Group Authority ended the stream without starting it"),
        )
    return call, first.started


def _within_bytes(entries: Sequence[_T], size: Callable[[_T], int]) -> Sequence[_T]:
    """The first of ``entries`` whose sizes stay within EVENT_FRAME_BYTES (at least one)."""
    total = 0
    for i, entry in enumerate(entries):
        total += size(entry)
        if i and total > EVENT_FRAME_BYTES:
            return entries[:i]
    return entries


def _refusal(err: grpc.aio.AioRpcError) -> _PeerRefused:
    """The ERROR frame for a failed GroupLogService call: the Authority's Rejection mapped to the
    gateway's codes, or AUTHORITY_UNAVAILABLE when no Authority answered."""
    rejection = rejection_from_rpc_error(err)
    if rejection is None:
        return _PeerRefused(
            E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
            _unavailable_rejection(f"the Group Authority is unreachable ({err.code().name}: {err.details()})"),
        )
    if rejection.metadata.get("field") == "context_package":
        code = E.GATEWAY_ERROR_CODE_CONTEXT_PACKAGE_INVALID
    elif rejection.reason in (R.REJECTION_REASON_NOT_A_MEMBER, R.REJECTION_REASON_GROUP_NOT_FOUND):
        code = E.GATEWAY_ERROR_CODE_NOT_A_MEMBER
    elif rejection.reason == R.REJECTION_REASON_TOO_LARGE:
        code = E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED
    elif rejection.reason in (R.REJECTION_REASON_OVERLOADED, R.REJECTION_REASON_NOT_OWNER, R.REJECTION_REASON_PEER_UNAVAILABLE):
        code = E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE
    else:
        code = E.GATEWAY_ERROR_CODE_MALFORMED_FRAME
    return _PeerRefused(code, rejection)


def _unavailable_only(refused: _PeerRefused) -> common_pb2.Rejection | None:
    """ERROR frames keep their usual general reason, except AUTHORITY_UNAVAILABLE, which carries the
    retry information."""
    return refused.rejection if refused.code == E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE else None


def _unavailable_rejection(message: str) -> common_pb2.Rejection:
    """AUTHORITY_UNAVAILABLE's general reason: PEER_UNAVAILABLE (retry with backoff), with retry_after_ms."""
    return peer_unavailable("authority", message).to_proto()

