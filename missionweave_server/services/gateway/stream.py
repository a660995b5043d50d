"""One agent stream's state and how it ends: the base every part of a Connect stream builds on.

``Stream`` holds what a Connect call owns (the authenticated agent and session, its subscriptions,
the requests being answered, its reader task, its ``Outbox``) and the ways it ends: at its end or a
cancel (``end``, which lets go of everything at once), when its agent stops reading (``stalled``),
when a newer session of the agent replaces it (``replaced``, MW-11.3-09), when it is refused before
being read (``refuse``) and at shutdown (``go_away``). It also writes: frames go into the outbox
(``send_frame``, ``error``) and leave it as ConnectResponses, batched when the agent reads batches
(``response``). What a stream does with the frames it reads is in the modules built on it (HELLO in
``hello.py``, subscriptions in ``delivery.py``, COMMAND in ``commands.py``, FETCH in ``fetch.py``,
joined in ``connection.py``); what it uses of its gateway is the ``Gateway`` protocol here, so no
module of a stream imports the servicer.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from missionweave.internal.v1 import group_log_pb2_grpc as glpb_grpc
from missionweave.kernel.clock import Clock
from missionweave.kernel.errors import Rejected
from missionweave.v1 import authority_service_pb2_grpc, common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.edge.status import abort_with
from missionweave_server.services.gateway import limits
from missionweave_server.services.gateway.fanout import GroupFeed
from missionweave_server.services.gateway.fatal import Fatal, error_frame
from missionweave_server.services.gateway.limits import GatewayLimits
from missionweave_server.services.gateway.outbox import Outbox

R = common_pb2.RejectionReason
E = pb.GatewayErrorCode
log = logging.getLogger("missionweave.gateway")

# How long a closing stream's own tasks may take to finish their clean-up.
CLOSE_GRACE_S = 5.0
# A replaced session's stream that has not ended this long after its fatal SESSION_STALE frame was
# queued (its agent is not reading) is ended with the status alone.
REPLACED_GRACE_S = 2.0


class Gateway(Protocol):
    """What a stream uses of its gateway (``service.GatewayServicer``)."""

    limits: GatewayLimits
    clock: Clock
    registry: IdentityDirectoryClient
    group_log: glpb_grpc.GroupLogServiceAsyncStub
    commands: authority_service_pb2_grpc.AuthorityServiceAsyncStub

    async def verify_session_proof(self, proof: common_pb2.SignedEnvelope) -> tuple[str, int]: ...
    def admit_identity(self, connection: Stream, agent_id: str) -> None: ...
    def authenticated(self, connection: Stream) -> None: ...
    def forget(self, connection: Stream) -> None: ...
    def track(self, task: asyncio.Task[None]) -> None: ...
    def feed_for(self, group_id: str, delivered: int, caught_up: bool) -> GroupFeed | None: ...
    def note_cursor(self, agent_id: str, group_id: str, cursor: int) -> None: ...
    async def stored_cursor(self, agent_id: str, group_id: str) -> int: ...


@dataclass
class Subscription:
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


class Stream:
    """One Connect stream: the authenticated agent, its subscriptions and the outgoing queue."""

    def __init__(self, gateway: Gateway, outbox: Outbox) -> None:
        self.gateway = gateway
        self.outbox = outbox
        self.agent_id = ""
        self.session_epoch = 0
        self.subscriptions: dict[str, Subscription] = {}
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
        room = limits.BATCH_BYTES - size
        while room > 0 and len(response.more_frames) < limits.BATCH_FRAMES - 1:
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
        (missionweave/kernel/gc_policy.py: measured, 200 closed streams left 230 MB of such garbage), and whether or not
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
                retry_after_ms=limits.LIMIT_RETRY_AFTER_MS,
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
        fatal = Fatal(
            E.GATEWAY_ERROR_CODE_SESSION_STALE,
            f"session {self.session_epoch} of {self.agent_id} was replaced by session {current_epoch}: "
            "this stream has ended; connect with the current session",
            status=True,
            session_epoch=self.session_epoch,
            current_epoch=current_epoch,
        )
        log.info(
            "ending the gateway streams of a replaced session",
            extra={
                "agent": self.agent_id,
                "session_epoch": self.session_epoch,
                "current_epoch": current_epoch,
            },
        )
        this = asyncio.current_task()
        for task in self.tasks():
            if task is not this and not task.cancelling():
                task.cancel()
        for s in self.subscriptions.values():
            if s.follow is not None:
                s.follow.cancel()
        self.outbox.end(drop=True)
        self.outbox.force_control(pb.ServerFrame(error=error_frame(fatal)))
        self.ended_with = fatal.rejected
        if self.handler is not None and self.context is not None:
            self.gateway.track(
                asyncio.create_task(self._abort_unread(self.context, self.handler, fatal.rejected))
            )

    @classmethod
    async def _abort_unread(cls, context: Any, handler: asyncio.Task[Any], rejected: Rejected) -> None:
        """End the call with ``rejected`` if its handler has not ended it within REPLACED_GRACE_S (its
        agent does not take the frame in front of the fatal one)."""
        await asyncio.wait([handler], timeout=REPLACED_GRACE_S)
        if not handler.done():
            await cls._abort_stalled(context, handler, rejected)

    def refuse(self, fatal: Fatal) -> None:
        """Refuse the stream before reading it: one fatal ERROR frame, then its status."""
        self.outbox.end()  # what is queued (the frame below) is still sent
        self.outbox.force_control(pb.ServerFrame(error=error_frame(fatal)))
        self.ended_with = fatal.rejected

    def go_away(self) -> None:
        """End the stream now, dropping what is queued (never sent, so no cursor covers it: the
        agent gets it again after reconnecting)."""
        self.outbox.end(drop=True)

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
                reason=R.REJECTION_REASON_FRAME_OUT_OF_ORDER
                if fatal
                else R.REJECTION_REASON_INVALID_ARGUMENT,
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
