"""The Python agent SDK: one resilient gateway stream, in-order handlers, durable cursors (spec 16).

An agent author writes ``async`` handlers; the SDK speaks the frame protocol of
``GatewayService.Connect`` (documented at the top of ``protos/missionweave/v1/gateway_service.proto``)::

    import asyncio
    from missionweave.sdk.agent import Agent, post_message
    from missionweave.v1 import event_pb2

    async def main() -> None:
        async with Agent.connect("127.0.0.1:50051", "coord", "coord.key", cursor_dir=".cursors") as agent:

            async def on_event(event: event_pb2.Event) -> None:
                if event.type == "message.posted" and event.actor_id != agent.identity_id:
                    posted = event.message_posted
                    reply = post_message(posted.conversation_id, "ack", reply_to_message_id=posted.message_id)
                    await agent.execute(event.group_id, reply)

            await agent.subscribe("grp_...", on_event)
            await asyncio.Event().wait()  # run until cancelled (Ctrl-C)

    asyncio.run(main())

What the SDK guarantees (MW-16-01..07, MW-16-10):

* **Ordered, exactly once per process run.** Each Group's events reach ``await handler(event)`` in
  sequence order, one at a time; frames that arrive out of order are buffered, duplicates (by event id
  and by sequence) are dropped (MW-16-02..04). Events filtered out by the gateway (``EventFrame.skipped``)
  never reach the handler but advance the cursor.
* **Durable cursor that never crosses a gap.** Behind the handler, the cursor (the highest contiguous
  sequence processed, MW-16-06) is written to ``<cursor_dir>/<agent>/cursors.json`` atomically
  (temporary file, fsync, rename), every Group's in one write per round (at most one per
  ``cursor_interval`` seconds, D143); only a written cursor is reported or
  ACKed (MW-16-05). A restarted agent resumes from it: at least once across restarts, since a crash
  before the write repeats the events handled since the previous one (MW-16-14: make side effects
  idempotent with :meth:`Agent.idempotency_key`).
* **Reconnects.** When the stream breaks the agent reconnects with capped, jittered exponential backoff,
  re-sends HELLO and re-SUBSCRIBEs every Group from its durable cursor (MW-16-10); commands still waiting
  for their RESULT are re-sent with the same command id (the Authority answers a retry idempotently).
* **Flow control.** ACKs carry the cursor and grant fresh credits in batches (when half of the window has
  been processed, or when the subscription is idle), so at most ``credits`` events are ever in flight.

Events are verified against the Authority key (``GetAuthorityKey``) before anything reads them.
Over TLS, pass ``tls=ClientTLS(ca_file=...)`` (and ``cert_file``/``key_file`` for mTLS) or
``tls=ClientTLS.from_env()`` to :meth:`Agent.connect` (docs/tls.md).
Logging goes to the ``missionweave.sdk.agent`` logger. See ``docs/sdk.md`` and ``examples/``.

This module holds :class:`Agent`: the channel, the session, the connection loop, frame routing and
commands. The pieces it is built from live in modules of their own and are re-exported here:
``sequencing`` (GroupSequencer, CreditWindow), ``backoff``, ``event_verification``
(AuthorityVerifier, NotVerified), ``subscription`` (Subscription), ``stream_commands`` (CommandBody,
the typed builders, the pending-command table), ``sessions`` (SessionFile, SessionReplaced),
``gateway_link`` (one ``Connect`` call) and ``errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.message import Message
from nacl.signing import SigningKey

from missionweave import __version__
from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.signing import read_key
from missionweave.kernel.transport import ClientTLS, open_channel
from missionweave.sdk.backoff import Backoff
from missionweave.sdk.client import SessionSigner
from missionweave.sdk.client import membership_epoch as active_membership_epoch
from missionweave.sdk.credentials import CallProofs
from missionweave.sdk.cursors import CURSOR_INTERVAL_S, CursorStore
from missionweave.sdk.errors import AgentError, CommandRejected, GatewayError, describe
from missionweave.sdk.event_verification import AuthorityVerifier, NotVerified
from missionweave.sdk.files import file_name, private_dir
from missionweave.sdk.files import write_json_atomic as write_json_atomic  # missionweave/cli/context_store.py
from missionweave.sdk.gateway_link import GatewayLink, being_cancelled, handshake, transient
from missionweave.sdk.idempotency import attempt_key
from missionweave.sdk.sequencing import CreditWindow, GroupSequencer, Slot
from missionweave.sdk.sessions import SessionFile, SessionReplaced, open_session, renewable, session_proof
from missionweave.sdk.stream_commands import (
    CommandBody,
    PendingCommands,
    accept_offer,
    checkpoint,
    fail,
    post_message,
    renew_lease,
    start_work,
    submit,
)
from missionweave.sdk.subscription import Handler, SnapshotHandler, Subscription, SubscriptionFailed
from missionweave.v1 import (
    authority_service_pb2,
    authority_service_pb2_grpc,
    command_pb2,
    common_pb2,
    event_pb2,
)
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc

__all__ = [
    "Agent",
    "AgentClosed",
    "AgentError",
    "AuthorityVerifier",
    "Backoff",
    "ClientTLS",
    "CommandBody",
    "CommandRejected",
    "CreditWindow",
    "CursorStore",
    "Fetched",
    "GatewayError",
    "GroupSequencer",
    "Handler",
    "NotVerified",
    "SessionFile",
    "SessionReplaced",
    "Slot",
    "SnapshotHandler",
    "Subscription",
    "SubscriptionFailed",
    "accept_offer",
    "attempt_key",
    "checkpoint",
    "fail",
    "post_message",
    "renew_lease",
    "start_work",
    "submit",
]

log = logging.getLogger("missionweave.sdk.agent")

CLIENT_VERSION = f"missionweave-py/{__version__}"
MAX_CREDITS = 65_536
# ACKs of all subscriptions queued within this window go out as one ACK frame: under a busy Group an
# agent would otherwise write one frame per event per subscription, on its stream and the gateway's.
ACK_COALESCE_S = 0.002
E = pb.GatewayErrorCode
R = common_pb2.RejectionReason
_clock = SystemClock()


class AgentClosed(AgentError):
    """The agent was closed while the operation was waiting."""


@dataclass(frozen=True)
class Fetched:
    """The answer to :meth:`Agent.fetch`."""

    events: list[event_pb2.Event]  # verified, in sequence order
    withheld: list[tuple[int, int]]  # inclusive ranges the Membership does not permit (or beyond the head)


_STALE_MEMBERSHIP = frozenset({R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE, R.REJECTION_REASON_NOT_A_MEMBER})


class Agent:
    """An agent's connection to the gateway: subscriptions with durable cursors, commands, reconnects.

    Open it with :meth:`connect`, preferably as an async context manager (closing stops the handlers
    gracefully, reports the final cursors and closes the channel)::

        async with Agent.connect("127.0.0.1:50051", "worker-1", "worker-1.key", cursor_dir="state") as agent:
            sub = await agent.subscribe("grp_...", handle, credits=128)
            result = await agent.execute("grp_...", post_message("conv_...", "on it"))

    ``key`` is the identity's Ed25519 key (a ``SigningKey`` or a key file written by ``mwp keygen``). It
    is used only to open a session: the agent keeps the session (epoch and its own session key) in
    ``<cursor_dir>/<agent>/session.json`` and reuses it until the gateway refuses it. Opening a session
    fences the identity's older sessions (MW-11.3-09), so do not run two processes as one identity.
    """

    def __init__(
        self,
        target: str,
        identity_id: str,
        key: SigningKey | str | os.PathLike[str],
        *,
        cursor_dir: str | os.PathLike[str],
        credentials: grpc.ChannelCredentials | None = None,
        tls: ClientTLS | None = None,
        backoff: Backoff | None = None,
        connect_timeout: float = 30.0,
        audience: str | None = None,
        command_timeout: float = 30.0,
        grace: float = 5.0,
        cursor_interval: float = CURSOR_INTERVAL_S,
    ) -> None:
        self.target = target
        self.identity_id = identity_id
        self.directory = private_dir(Path(cursor_dir) / file_name(identity_id))
        self._key = key if isinstance(key, SigningKey) else read_key(Path(key))
        self._session_file = SessionFile(self.directory / "session.json", identity_id)
        self._cursors = CursorStore(self.directory, identity_id, interval=cursor_interval)
        self._credentials = credentials
        self._tls = tls
        self._backoff = backoff or Backoff()
        self._connect_timeout = connect_timeout
        # What the HELLO proof names: the gateway's configured audience (MWP_AUDIENCE); by
        # default the target, which is what a gateway reached directly answers to.
        self.audience = target if audience is None else audience
        self._command_timeout = command_timeout
        self._grace = grace
        self._channel: grpc.aio.Channel | None = None
        self._link: GatewayLink | None = None
        self._session: SessionSigner | None = None
        self._proofs = CallProofs(
            self.audience
        )  # reads (GetGroupState, ...) prove the current session to that mesh
        self._verifier: AuthorityVerifier | None = None
        self._subscriptions: dict[str, Subscription] = {}  # by Group
        self._routes: dict[str, Subscription] = {}  # by subscription id, on the current stream
        # ACKs waiting for the next coalesced frame, by subscription id, and the stream they are for.
        self._acks: dict[str, pb.CursorAck] = {}
        self._acks_link: GatewayLink | None = None
        self._ack_flush: asyncio.Task[None] | None = None
        self._commands = PendingCommands()
        self._fetches: dict[str, tuple[pb.FetchFrame, asyncio.Future[pb.FetchedFrame]]] = {}
        self._epochs: dict[str, int] = {}
        self._numbers = itertools.count(1)
        self._opening = asyncio.Lock()  # subscriptions open exactly once per stream
        self._connected = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._first: asyncio.Future[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()

    @classmethod
    def connect(
        cls,
        target: str,
        identity_id: str,
        key: SigningKey | str | os.PathLike[str],
        *,
        cursor_dir: str | os.PathLike[str],
        **options: Any,
    ) -> _Connecting:
        """Connects (HELLO/WELCOME) and returns the agent; use with ``await`` or ``async with``.

        ``options`` are the keyword arguments of :class:`Agent` (``tls``, ``credentials``, ``backoff``,
        ``connect_timeout``, ``command_timeout``, ``grace``, ``audience``, ``cursor_interval``: the least
        time in seconds between two writes of the cursor file, D143). Raises :class:`AgentError` (or the gRPC
        error) if the first connection fails for a reason retrying cannot fix, or does not succeed
        within ``connect_timeout`` seconds.
        """
        return _Connecting(cls(target, identity_id, key, cursor_dir=cursor_dir, **options))

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Opens the channel and waits for the first WELCOME; :meth:`connect` calls it for you."""
        if self._runner is not None:
            raise AgentError("the agent was already started")
        self._channel = open_channel(
            self.target,
            self._tls,
            credentials=self._credentials,
            interceptors=self._proofs.unary_request_interceptors,
        )
        self._first = asyncio.get_running_loop().create_future()
        self._runner = asyncio.create_task(self._run(), name=f"missionweave-agent-{self.identity_id}")
        try:
            await asyncio.wait_for(asyncio.shield(self._first), self._connect_timeout)
        except TimeoutError:
            await self.close()
            raise AgentError(
                f"could not connect to {self.target} within {self._connect_timeout:.0f} s"
            ) from None
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stops the handlers (each may finish within ``grace`` s), sends the final ACKs, closes the stream."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            for subscription in list(self._subscriptions.values()):
                await subscription.stop(self._grace)
            self._commands.fail_all(AgentClosed("the agent was closed"))
            await self._hang_up()
            if self._runner is not None:
                self._runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._runner
            if self._channel is not None:
                await self._channel.close()
        finally:
            self._closed.set()
            log.info("%s: closed", self.identity_id)

    async def __aenter__(self) -> Agent:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _hang_up(self) -> None:
        """Half-closes the stream and lets the gateway finish (it processes the final ACKs first)."""
        if self._ack_flush is not None:
            self._ack_flush.cancel()
            self._ack_flush = None
        link = self._link
        if link is None or self._runner is None:
            return
        await self._flush_acks()  # the final ACKs go before the half-close
        try:
            await link.finish()
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            return
        except asyncio.CancelledError:
            if being_cancelled():
                raise
            return  # the stream was already dropped
        await asyncio.wait({self._runner}, timeout=self._grace)

    @property
    def connected(self) -> bool:
        return self._link is not None

    async def wait_connected(self) -> None:
        """Waits until a stream is up (after WELCOME and resubscribing)."""
        await self._connected.wait()

    @property
    def session(self) -> SessionSigner:
        """The current session (signs commands)."""
        if self._session is None:
            raise AgentError("the agent has no session yet; connect first")
        return self._session

    def reconnect(self) -> None:
        """Drops the current stream, as a network failure would: the agent reconnects with backoff,
        re-sends HELLO and resubscribes every Group from its durable cursor (MW-16-10)."""
        if self._link is not None:
            log.info("%s: dropping the stream on request", self.identity_id)
            self._link.cancel()

    # ------------------------------------------------------------------ subscriptions

    async def subscribe(
        self,
        group_id: str,
        handler: Handler,
        *,
        credits: int = 256,
        attention: pb.AttentionFilter | None = None,
        on_snapshot: SnapshotHandler | None = None,
        gap_timeout: float = 10.0,
    ) -> Subscription:
        """Delivers the Group's events to ``await handler(event)``, in order, once each, from the cursor.

        ``credits`` is the window of events in flight (1..65,536); ``attention`` an optional attention
        filter (unset: everything the Membership permits). ``on_snapshot`` restores a verified
        ``GroupSnapshot`` when the cursor is older than the online log (CURSOR_TOO_OLD, MW-16-11/12);
        without it such a subscription fails. A gap that does not fill within ``gap_timeout`` seconds
        makes the subscription resubscribe from its cursor.

        >>> async def handler(event):  # doctest: +SKIP
        ...     print(event.sequence, event.type)
        >>> subscription = await agent.subscribe("grp_...", handler)  # doctest: +SKIP
        >>> await subscription.reached(42)  # doctest: +SKIP
        """
        if not 1 <= credits <= MAX_CREDITS:
            raise ValueError(f"credits must be 1..{MAX_CREDITS}")
        if group_id in self._subscriptions:
            raise ValueError(f"{self.identity_id} is already subscribed to {group_id}")
        if self._runner is None or self._closing:
            raise AgentError("subscribe after connecting and before closing")
        async with self._opening:
            subscription = Subscription(
                self,
                next(self._numbers),
                group_id,
                handler,
                self._cursors,
                credits=credits,
                attention=attention,
                on_snapshot=on_snapshot,
                gap_timeout=gap_timeout,
            )
            self._subscriptions[group_id] = subscription
            if self._link is not None:
                await subscription.open()
        return subscription

    async def unsubscribe(self, group_id: str) -> None:
        """Stops the Group's subscription (the current handler may finish) and sends UNSUBSCRIBE."""
        subscription = self._subscriptions.pop(group_id, None)
        if subscription is not None:
            await subscription.stop(self._grace)
            frame = pb.UnsubscribeFrame(subscription_id=subscription.subscription_id)
            await self._send_frame(pb.ClientFrame(unsubscribe=frame))

    # ------------------------------------------------------------------ commands

    async def execute(
        self,
        group_id: str,
        command: str | CommandBody,
        body: Message | None = None,
        *,
        membership_epoch: int | None = None,
        command_id: str | None = None,
        correlation_id: str = "",
        expected_revision: common_pb2.ExpectedRevision | None = None,
    ) -> command_pb2.CommandResult:
        """Signs a command, sends it as a COMMAND frame and returns the RESULT's ``CommandResult``.

        Pass a builder's :class:`CommandBody` (``execute(g, post_message(...))``) or a kind and a body
        (``execute(g, "message_post", MessagePost(...))``). The Membership epoch is read from the Group
        state unless given. A given ``command_id`` makes retries idempotent: the Authority answers a
        repeat with the stored result (``replayed``). Waits at most ``command_timeout`` seconds (an
        :class:`Agent` option) for the RESULT. Raises :class:`CommandRejected` carrying the
        Rejection on refusal, :class:`GatewayError` if the gateway refuses the frame.

        >>> result = await agent.execute(group_id, post_message(conversation_id, "done"))  # doctest: +SKIP
        """
        if isinstance(command, CommandBody):
            kind, message = command
        elif body is not None:
            kind, message = command, body
        else:
            raise TypeError("execute(group_id, CommandBody) or execute(group_id, kind, body)")
        signer = self.session
        epoch = membership_epoch if membership_epoch is not None else await self.membership_epoch(group_id)
        cmd = signer.command(
            group_id,
            kind,
            message,
            membership_epoch=epoch,
            command_id=command_id,
            correlation_id=correlation_id,
            expected_revision=expected_revision,
        )
        return await self._send_command(signer, cmd)

    async def resubmit(self, command: command_pb2.Command) -> command_pb2.CommandResult:
        """Sends a command built earlier (a buffered offline one, MW-11.5-09): its body and extensions
        byte-for-byte as they were, rebased on the current session (``issued_at``, session epoch,
        Membership epoch read afresh) and signed anew. It keeps its command id, so a retry after a
        lost RESULT is answered from the Authority's record."""
        signer = self.session
        cmd = command_pb2.Command()
        cmd.CopyFrom(command)
        cmd.issued_at.CopyFrom(to_timestamp(_clock.now()))
        cmd.session_epoch = signer.session_epoch
        cmd.membership_epoch = await self.membership_epoch(cmd.group_id, refresh=True)
        return await self._send_command(signer, cmd)

    async def _send_command(
        self, signer: SessionSigner, cmd: command_pb2.Command
    ) -> command_pb2.CommandResult:
        frame = pb.CommandFrame(command_id=cmd.command_id, command=signer.sign(cmd))
        future = self._commands.add(frame)
        try:
            await self._send_frame(pb.ClientFrame(command=frame))  # when disconnected: sent on reconnect
            return await asyncio.wait_for(future, self._command_timeout)
        except CommandRejected as rejected:
            if rejected.reason in _STALE_MEMBERSHIP:
                self._epochs.pop(cmd.group_id, None)
            raise
        except TimeoutError:
            raise AgentError(
                f"no RESULT for {cmd.command_id}; it may still be applied: retry with command_id={cmd.command_id!r}"
            ) from None
        finally:
            self._commands.forget(cmd.command_id)

    async def fetch(
        self,
        group_id: str,
        first: int,
        last: int,
        *,
        context_package: common_pb2.SignedEnvelope | None = None,
    ) -> Fetched:
        """Events ``first..last`` of a Group on demand (at most 1,024), verified, in sequence order.

        Gets history an attention filter skipped (MW-8-13); a late joiner passes a Context Package
        the Authority signed for it to get the events it cites from before its visibility start
        (MW-8-09). Sequences the Membership does not permit come back in ``withheld``. Raises
        :class:`GatewayError` when the gateway refuses the request (not a member, too large, a
        package that does not verify), :class:`NotVerified` if an event's signature is wrong.

        >>> fetched = await agent.fetch(group_id, 1, 50, context_package=package)  # doctest: +SKIP
        """
        request_id = f"f{next(self._numbers)}"
        frame = pb.FetchFrame(
            request_id=request_id, group_id=group_id, ranges=[pb.SequenceRange(first=first, last=last)]
        )
        if context_package is not None:
            frame.context_package.CopyFrom(context_package)
        future: asyncio.Future[pb.FetchedFrame] = asyncio.get_running_loop().create_future()
        self._fetches[request_id] = (frame, future)
        try:
            await self._send_frame(pb.ClientFrame(fetch=frame))  # when disconnected: sent on reconnect
            answer = await asyncio.wait_for(future, self._command_timeout)
        except TimeoutError:
            raise AgentError(f"no answer to FETCH {first}..{last} of {group_id}") from None
        finally:
            self._fetches.pop(request_id, None)
        verifier = self._verifier_now()
        return Fetched(
            events=[verifier.event(envelope) for envelope in answer.events],
            withheld=[(r.first, r.last) for r in answer.withheld],
        )

    async def membership_epoch(self, group_id: str, *, refresh: bool = False) -> int:
        """This agent's active Membership epoch in the Group (cached; refreshed after a stale rejection)."""
        if refresh or group_id not in self._epochs:
            stub = authority_service_pb2_grpc.AuthorityServiceStub(self._require_channel())
            response = await stub.GetGroupState(authority_service_pb2.GetGroupStateRequest(group_id=group_id))
            epoch = active_membership_epoch(response.state, self.identity_id)
            if epoch == 0:
                raise AgentError(f"{self.identity_id} holds no active Membership in {group_id}")
            self._epochs[group_id] = epoch
        return self._epochs[group_id]

    @staticmethod
    def idempotency_key(mission_id: str, work_item_id: str, ownership_epoch: int, operation_id: str) -> str:
        """The stable key for an external side effect (MW-16-13): pass it to the external system.

        The same logical operation under the same ownership epoch always gets the same key, so a retry
        is recognised; a reassignment (a higher epoch) gets fresh keys.

        >>> Agent.idempotency_key("grp_1", "wi-1", 1, "send-invoice")  # doctest: +ELLIPSIS
        'mwk1_...'
        """
        return attempt_key(mission_id, work_item_id, ownership_epoch, operation_id)

    # ------------------------------------------------------------------ the connection loop

    async def _run(self) -> None:
        assert self._first is not None
        while not self._closing:
            try:
                link = await self._open_link()
            except SessionReplaced as replaced:
                log.error("%s: %s", self.identity_id, replaced)
                for subscription in list(self._subscriptions.values()):
                    await subscription._fail(replaced)
                self._commands.fail_all(replaced)
                return
            except Exception as err:
                if not self._first.done() and not transient(err):
                    self._first.set_exception(err)
                    return
                await self._pause(f"connecting to {self.target} failed ({describe(err)})")
                continue
            self._backoff.reset()
            await self._serve(link)
            if not self._closing:
                await self._pause(f"the stream to {self.target} broke")

    async def _pause(self, why: str) -> None:
        delay = self._backoff.next()
        log.warning("%s: %s; reconnecting in %.2f s", self.identity_id, why, delay)
        await asyncio.sleep(delay)

    async def _open_link(self) -> GatewayLink:
        channel = self._require_channel()
        key = await authority_service_pb2_grpc.AuthorityServiceStub(channel).GetAuthorityKey(
            authority_service_pb2.GetAuthorityKeyRequest()
        )
        self._verifier = AuthorityVerifier(
            key.key_id, key.public_key, {k.key_id: k.public_key for k in key.keys}
        )
        signer = self._session or await asyncio.to_thread(self._session_file.load)
        if signer is None:
            signer = await self._new_session()
            link = await self._hello(signer)
        else:
            try:
                link = await self._hello(signer)
            except GatewayError as err:
                if not renewable(err):
                    raise  # a proof for another gateway: a new session would be refused the same way
                if self._session is not None and err.code == E.GATEWAY_ERROR_CODE_SESSION_STALE:
                    # The session this process was running under was replaced meanwhile: by another
                    # process of this identity. Taking it back would fence that one, and so on.
                    raise SessionReplaced(
                        f"session {signer.session_epoch} of {self.identity_id} was replaced by a newer one "
                        "(another process runs as this identity); stopping"
                    ) from err
                log.warning(
                    "%s: session %d refused (%s); opening a new one",
                    self.identity_id,
                    signer.session_epoch,
                    err,
                )
                signer = await self._new_session()
                link = await self._hello(signer)
        self._session = self._proofs.signer = signer
        return link

    async def _new_session(self) -> SessionSigner:
        signer = await open_session(self._require_channel(), self.identity_id, self._key, self._session_file)
        self._epochs.clear()
        log.info("%s: opened session %d", self.identity_id, signer.session_epoch)
        return signer

    def _session_proof(self, signer: SessionSigner) -> common_pb2.SignedEnvelope:
        """A fresh HelloProof: what HELLO and GetSnapshot use to prove the session."""
        return session_proof(signer, self.audience)

    async def _hello(self, signer: SessionSigner) -> GatewayLink:
        envelope = self._session_proof(signer)
        hello = pb.HelloFrame(
            agent_id=signer.identity_id,
            session_epoch=signer.session_epoch,
            proof=envelope,
            client_version=CLIENT_VERSION,
            accepts_frame_batches=True,
        )
        link, welcome = await handshake(self._require_channel(), hello)
        log.info(
            "%s: connected to %s (session %d, connection %s)",
            self.identity_id,
            self.target,
            signer.session_epoch,
            welcome.connection_id,
        )
        return link

    async def _serve(self, link: GatewayLink) -> None:
        """Resubscribes, re-sends pending commands, then reads until the stream ends."""
        try:
            async with self._opening:
                self._link = link
                self._routes.clear()
                for subscription in list(self._subscriptions.values()):
                    await subscription.open()
                for command in self._commands.frames():
                    await self._send_frame(pb.ClientFrame(command=command))
                for fetch, _ in list(self._fetches.values()):  # a FETCH only reads: safe to repeat
                    await self._send_frame(pb.ClientFrame(fetch=fetch))
            self._connected.set()
            if self._first is not None and not self._first.done():
                self._first.set_result(None)
            while (frames := await link.read()) is not None:
                for frame in frames:
                    self._dispatch(frame)
            log.log(
                logging.INFO if self._closing else logging.WARNING,
                "%s: the gateway ended the stream",
                self.identity_id,
            )
        except grpc.aio.AioRpcError as err:
            log.warning("%s: stream failed: %s", self.identity_id, describe(err))
        except asyncio.CancelledError:
            if being_cancelled():
                raise
            log.info("%s: stream cancelled", self.identity_id)
        finally:
            self._link = None
            self._connected.clear()
            link.cancel()

    def _dispatch(self, frame: pb.ServerFrame) -> None:
        kind = frame.WhichOneof("frame")
        if kind == "result":
            self._commands.resolve(frame.result)
        elif kind == "error" and frame.error.command_id:
            self._commands.fail(frame.error.command_id, GatewayError(frame.error))
        elif kind == "fetched" or (kind == "error" and frame.error.request_id):
            request_id = frame.fetched.request_id if kind == "fetched" else frame.error.request_id
            entry = self._fetches.get(request_id)
            if entry is not None and not entry[1].done():
                if kind == "fetched":
                    entry[1].set_result(frame.fetched)
                else:
                    entry[1].set_exception(GatewayError(frame.error))
        elif kind in ("event", "flow", "cursor_too_old", "error"):
            subscription = self._routes.get(getattr(frame, kind).subscription_id)
            if subscription is not None:
                subscription.deliver(frame)
            elif kind == "error":
                level = logging.ERROR if frame.error.fatal else logging.WARNING
                log.log(level, "%s: gateway error %s", self.identity_id, GatewayError(frame.error))
        else:
            log.debug("%s: unexpected %s frame", self.identity_id, kind)

    # ------------------------------------------------------------------ what subscriptions use (subscription._Host)

    def _verifier_now(self) -> AuthorityVerifier:
        if self._verifier is None:
            raise AgentError("no Authority key yet")
        return self._verifier

    async def _send_frame(self, frame: pb.ClientFrame, route: Subscription | None = None) -> bool:
        """Writes a frame on the current stream; False when there is none (it is re-sent after
        reconnecting). ACKs go through ``_queue_ack``."""
        link = self._link
        if link is None:
            return False
        if route is not None:
            self._routes[frame.subscribe.subscription_id] = route
        return await self._write(link, frame)

    def _queue_ack(self, ack: pb.CursorAck) -> None:
        """A subscription's ACK (the subscription hands it over), queued and coalesced
        (``ACK_COALESCE_S``): per subscription the highest cursor and the sum of the credits, all
        subscriptions in one frame. Dropped when there is no stream, and a stream that ends drops its
        queued ACKs: the next attempt subscribes again from the cursor file."""
        link = self._link
        if link is None:
            return
        if self._acks_link is not link:
            self._acks, self._acks_link = {}, link
        queued = self._acks.get(ack.subscription_id)
        if queued is None:
            self._acks[ack.subscription_id] = ack
        else:
            queued.cursor = max(queued.cursor, ack.cursor)
            queued.credits += ack.credits
        if self._ack_flush is None:
            self._ack_flush = asyncio.create_task(self._flush_acks_soon())

    async def _flush_acks_soon(self) -> None:
        await asyncio.sleep(ACK_COALESCE_S)
        self._ack_flush = None
        await self._flush_acks()

    async def _flush_acks(self) -> None:
        acks, link = self._acks, self._acks_link
        self._acks, self._acks_link = {}, None
        if acks and link is not None and link is self._link:
            await self._write(link, pb.ClientFrame(ack=pb.AckFrame(cursors=list(acks.values()))))

    async def _write(self, link: GatewayLink, frame: pb.ClientFrame) -> bool:
        try:
            await link.send(frame)
            return True
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as err:
            log.debug("%s: write failed: %r", self.identity_id, err)
            return False
        except asyncio.CancelledError:
            if being_cancelled():
                raise
            return False  # the call was cancelled under us (a dropped stream), not this task

    async def _fetch_snapshot(self, group_id: str, digest: common_pb2.Digest) -> pb.GetSnapshotResponse:
        stub = pb_grpc.GatewayServiceStub(self._require_channel())
        request = pb.GetSnapshotRequest(
            group_id=group_id, digest=digest, proof=self._session_proof(self.session)
        )
        return await stub.GetSnapshot(request)

    @property
    def channel(self) -> grpc.aio.Channel:
        """The agent's channel to the mesh: unary calls on it carry the session's call proofs."""
        return self._require_channel()

    def _require_channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            raise AgentError("the agent is not started")
        return self._channel


class _Connecting:
    """What :meth:`Agent.connect` returns: ``await`` it, or use it as ``async with``."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def __await__(self) -> Generator[Any, None, Agent]:
        return self._agent.__aenter__().__await__()

    async def __aenter__(self) -> Agent:
        return await self._agent.__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._agent.close()
