"""One Group's subscription over the agent's gateway stream (spec 16): ``Subscription`` takes the
frames the agent routes to it, verifies and orders the events (``GroupSequencer``), calls the
handler once per event in sequence order, persists the cursor behind it (``CursorStore``, D143),
ACKs it with fresh credits (``CreditWindow``), resubscribes across gaps and gateway trouble, and
restores a snapshot when the cursor is older than the online log (MW-16-11/12). It reaches the
agent only through the small ``_Host`` protocol, so it can be driven by hand in tests; the stream,
the commands and the session are the agent's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import grpc

from missionweave.sdk.backoff import Backoff
from missionweave.sdk.cursors import CursorStore
from missionweave.sdk.errors import AgentError, GatewayError, describe
from missionweave.sdk.event_verification import AuthorityVerifier, Linked, NotVerified
from missionweave.sdk.sequencing import CreditWindow, GroupSequencer
from missionweave.v1 import authority_service_pb2, common_pb2, event_pb2
from missionweave.v1 import gateway_service_pb2 as pb

__all__ = ["Handler", "SnapshotHandler", "Subscription", "SubscriptionFailed"]

log = logging.getLogger("missionweave.sdk.agent")  # the SDK's one logger (docs/sdk.md)

E = pb.GatewayErrorCode


class SubscriptionFailed(AgentError):
    """A subscription stopped for good (no Membership, history unavailable, unverifiable events, ...)."""


class _Stop(Exception):
    """Internal: the subscription is stopping while a handler is being retried."""


Handler = Callable[[event_pb2.Event], Awaitable[None]]
SnapshotHandler = Callable[[authority_service_pb2.GroupSnapshot], Awaitable[None]]

# ERROR codes after which a subscription cannot continue; those in _RESUBSCRIBES are retried from the
# cursor with backoff (the gateway stopped instead of skipping, MW-16-05, or lost its Group Authority);
# the others (ACK problems) are logged.
_FAILS_SUBSCRIPTION = frozenset(
    {
        E.GATEWAY_ERROR_CODE_NOT_A_MEMBER,
        E.GATEWAY_ERROR_CODE_SUBSCRIPTION_EXISTS,
        E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED,
        E.GATEWAY_ERROR_CODE_MALFORMED_FRAME,
    }
)


# EVENT frames a subscription that fell behind verifies and handles as one batch (_queued_events).
MAX_FRAMES_PER_BATCH = 64

_RESUBSCRIBES = frozenset(
    {E.GATEWAY_ERROR_CODE_HISTORY_UNAVAILABLE, E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE}
)


class _Host(Protocol):
    """What a Subscription needs from its Agent (a fake in unit tests)."""

    def _verifier_now(self) -> AuthorityVerifier: ...

    async def _send_frame(self, frame: pb.ClientFrame, route: Subscription | None = None) -> bool: ...

    def _queue_ack(self, ack: pb.CursorAck) -> None: ...

    async def _fetch_snapshot(self, group_id: str, digest: common_pb2.Digest) -> pb.GetSnapshotResponse: ...


class Subscription:
    """One Group's subscription: orders, deduplicates, calls the handler, persists and ACKs the cursor.

    Created by :meth:`Agent.subscribe`. Frames are processed by a worker task of their own, so a handler
    may ``await agent.execute(...)`` freely. A handler that raises is logged and retried with backoff: the
    cursor never moves past an event that was not processed (catch what you want to skip).
    """

    def __init__(
        self,
        host: _Host,
        number: int,
        group_id: str,
        handler: Handler,
        cursors: CursorStore,
        *,
        credits: int = 256,
        attention: pb.AttentionFilter | None = None,
        on_snapshot: SnapshotHandler | None = None,
        gap_timeout: float = 10.0,
    ) -> None:
        self.group_id = group_id
        self.subscription_id = ""
        self._host = host
        self._number = number
        self._handler = handler
        self._cursors = cursors
        self._credits = credits
        self._attention = attention
        self._on_snapshot = on_snapshot
        self._gap_timeout = gap_timeout
        # What the cursor file holds; the sequencer's cursor is what the handler has processed, which
        # the file follows behind (_persist_soon).
        self._durable = cursors.load(group_id)
        self._sequencer: GroupSequencer[Linked] = GroupSequencer(self._durable)
        self._saving: asyncio.Future[None] | None = None  # the cursor round asked for, not yet written
        self._asked = 0  # the highest cursor asked of the cursor store (written or not)
        # The chain value of the last event processed (or the restored snapshot's), with its
        # sequence and whether it was linked itself. Unknown after a start or a gap.
        self._link: tuple[int, bytes, bool] | None = None
        self._window = CreditWindow(credits, self.cursor)
        self._announced = 0  # the highest sequence the gateway reported delivering on this attempt (FLOW)
        self._attempt = 0
        self._queue: asyncio.Queue[pb.ServerFrame | None] = asyncio.Queue()
        self._held: pb.ServerFrame | None = None  # taken from the queue, to be handled next (_queued_events)
        self._waiters: list[asyncio.Future[None]] = []  # reached() calls, woken when the cursor moves
        self._failure: AgentError | None = None
        self._retry = Backoff(initial=0.5, cap=30.0)  # resubscribing after HISTORY_UNAVAILABLE
        self._stopping = False
        self._worker = asyncio.create_task(self._work(), name=f"missionweave-subscription-{group_id}")

    @property
    def cursor(self) -> int:
        """The highest contiguous sequence processed and persisted (MW-16-06)."""
        return self._durable

    @property
    def failure(self) -> AgentError | None:
        """Why the subscription stopped, if it did."""
        return self._failure

    async def reached(self, sequence: int) -> None:
        """Waits until the cursor is at least ``sequence``; raises the failure if the subscription stops.

        Bound the wait with ``async with asyncio.timeout(seconds):``.
        """
        while self.cursor < sequence and self._failure is None:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        if self._failure is not None and self.cursor < sequence:
            raise self._failure

    # ------------------------------------------------------------------ driven by the agent

    async def open(self, *, resync: bool = False) -> None:
        """SUBSCRIBEs from the durable cursor with a fresh window: on every new stream and after a resync
        (``resync``: first UNSUBSCRIBE the current attempt on this stream)."""
        if self._failure is not None or self._stopping:
            return
        if resync and self.subscription_id:
            previous = pb.UnsubscribeFrame(subscription_id=self.subscription_id)
            await self._host._send_frame(pb.ClientFrame(unsubscribe=previous))
        self._attempt += 1
        self.subscription_id = f"s{self._number}.{self._attempt}"
        self._sequencer.clear()  # whatever was buffered is replayed after the cursor (MW-16-10)
        self._window = CreditWindow(self._credits, self.cursor)
        self._announced = 0
        log.info("%s: subscribing after sequence %d (%s)", self.group_id, self.cursor, self.subscription_id)
        frame = pb.SubscribeFrame(
            subscription_id=self.subscription_id,
            group_id=self.group_id,
            after_sequence=self.cursor,
            filter=self._attention,
            initial_credits=self._credits,
        )
        await self._host._send_frame(pb.ClientFrame(subscribe=frame), route=self)

    def deliver(self, frame: pb.ServerFrame) -> None:
        """Hands a frame of this subscription to the worker, in arrival order."""
        self._queue.put_nowait(frame)

    async def stop(self, grace: float) -> None:
        """Lets the current handler finish (up to ``grace`` seconds), then reports the final cursor."""
        self._stopping = True
        self._queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._worker), grace)
        except TimeoutError:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        if self._failure is None:
            await self._flush()
            self._ack(idle=True)

    # ------------------------------------------------------------------ the worker

    async def _work(self) -> None:
        while not self._stopping:
            frame = await self._next_frame()
            if frame is None:
                continue
            try:
                await self._handle(frame)
            except _Stop:
                return
            except AgentError as failure:
                await self._fail(failure)
                return
            except Exception as err:  # a bug must not leave a silently dead subscription
                log.exception("%s: subscription worker failed", self.group_id)
                await self._fail(SubscriptionFailed(f"{self.group_id}: {err!r}"))
                return

    async def _next_frame(self) -> pb.ServerFrame | None:
        # A gap: events buffered behind a missing sequence, or sequences the gateway reported delivering
        # (FLOW) that never arrived on this attempt, with nothing buffered behind them (e.g. the last
        # frame of a window). What this attempt received counts, not what was processed: a frame lost
        # after a resubscribe may repeat only events already handled (their cursor not yet written),
        # and its credits come back only if it is asked for again.
        if self._held is not None:
            frame, self._held = self._held, None
            return frame
        if not self._sequencer.has_gap and self._window.delivered >= self._announced:
            return await self._queue.get()
        try:
            return await asyncio.wait_for(self._queue.get(), self._gap_timeout)
        except TimeoutError:
            log.warning(
                "%s: the gap after sequence %d did not fill within %g s; resubscribing from the cursor",
                self.group_id,
                self.cursor,
                self._gap_timeout,
            )
            await self.open(resync=True)
            return None

    async def _handle(self, frame: pb.ServerFrame) -> None:
        kind = frame.WhichOneof("frame")
        if kind is None or getattr(frame, kind).subscription_id != self.subscription_id:
            return  # an earlier attempt's frame: the current attempt replays it from the cursor
        if kind == "event":
            await self._on_events(self._queued_events(frame.event))
        elif kind == "flow":
            await self._on_flow(frame.flow)
        elif kind == "cursor_too_old":
            await self._restore(frame.cursor_too_old)
        elif kind == "error":
            await self._on_error(frame.error)

    def _queued_events(self, frame: pb.EventFrame) -> list[pb.EventFrame]:
        """``frame`` and the EVENT frames of this attempt queued right behind it: a subscription
        that falls behind verifies what it is behind on as one chain, with one signature check
        (AuthorityVerifier.events), instead of one per frame. The first other frame is held back
        for the next turn, so frames are still handled in arrival order."""
        frames = [frame]
        while len(frames) < MAX_FRAMES_PER_BATCH and self._held is None and not self._queue.empty():
            queued = self._queue.get_nowait()
            if queued is None:  # stop() woke the worker, which sees _stopping after this turn
                break
            if (
                queued.WhichOneof("frame") == "event"
                and queued.event.subscription_id == frame.subscription_id
            ):
                frames.append(queued.event)
            else:
                self._held = queued
        return frames

    def _idle(self) -> bool:
        return self._held is None and self._queue.empty()

    async def _on_events(self, frames: list[pb.EventFrame]) -> None:
        self._retry.reset()
        for frame in frames:
            self._window.received(frame.first_sequence, frame.last_sequence)
        for linked in self._host._verifier_now().events(
            [envelope for frame in frames for envelope in frame.events]
        ):
            event = linked.event
            if event.group_id != self.group_id:
                raise NotVerified(f"{self.group_id}: the gateway delivered an event of {event.group_id}")
            if not self._sequencer.add_event(event.sequence, event.event_id, linked):
                log.debug(
                    "%s: duplicate event %s (#%d) dropped", self.group_id, event.event_id, event.sequence
                )
        for frame in frames:
            for skipped in frame.skipped:
                self._sequencer.add_skipped(skipped.first, skipped.last)
        await self._drain()

    async def _drain(self) -> None:
        while not self._stopping and (slot := self._sequencer.next_ready()) is not None:
            if slot.item is not None:
                self._follows_the_chain(slot.item.event)
                await self._call_handler(slot.item.event)
                event = slot.item.event
                self._link = (event.sequence, slot.item.link, bool(event.previous_digest))
            else:
                self._link = None  # what was skipped is not seen here: the chain resumes unchecked
            self._sequencer.done(slot)
        self._persist_soon()
        if self._idle():
            self._ack(idle=True)

    def _follows_the_chain(self, event: event_pb2.Event) -> None:
        """The event continues the log this subscription has seen (event.proto: previous_digest), so
        a gateway cannot splice in another history, even one signed by the same Authority."""
        if self._link is None or event.sequence != self._link[0] + 1:
            return
        sequence, link, linked = self._link
        # An unlinked event (written before the chain existed) may follow only an unlinked one.
        if bytes(event.previous_digest) != link if event.previous_digest else linked:
            raise NotVerified(
                f"{self.group_id}: event #{event.sequence} does not follow the one at #{sequence}"
            )

    async def _call_handler(self, event: event_pb2.Event) -> None:
        backoff = Backoff(initial=0.5, cap=30.0)
        while True:
            try:
                await self._handler(event)
                return
            except Exception:
                delay = backoff.next()
                log.exception(
                    "%s: handler failed on %s (#%d); retrying in %.1f s",
                    self.group_id,
                    event.event_id,
                    event.sequence,
                    delay,
                )
            await asyncio.sleep(delay)
            if self._stopping:
                raise _Stop

    def _persist_soon(self) -> None:
        """Writes the processed cursor to the agent's cursor file behind the handler: the handler
        goes on with the next events meanwhile, and the agent's ``CursorStore`` writes whatever its
        Groups asked for since its last round in one round (D143), so one write covers every batch
        handled meanwhile. The round's end is a callback here, not a task per batch: with a thousand
        subscriptions in one process, that task and its awaits cost about a fifth of the agent's CPU
        per event (bench/README.md, the SDK's cursor bookkeeping). Only a written cursor is reported
        (``cursor``, ACKs, credits granted back), so the file and the ACKs never hold a sequence
        that was not processed, nor one past a gap (MW-16-05); a crash before the write hands the
        processed events to the handler again after the restart (at least once, MW-16-14)."""
        target = self._sequencer.cursor
        if target <= max(self._durable, self._asked) or self._failure is not None:
            return
        round_ = self._cursors.ask(self.group_id, target)
        if round_ is None:  # the file holds it already
            self._now_durable(target)
            return
        self._asked = target
        if round_ is not self._saving:
            self._saving = round_
            round_.add_done_callback(self._round_written)

    def _round_written(self, round_: asyncio.Future[None]) -> None:
        """The cursor round this subscription asked for has ended: what the file now holds is
        durable and acknowledged, or the write failed and the subscription stops."""
        if self._saving is round_:
            self._saving = None
        error = (
            AgentError(f"{self._cursors.path}: the write was cancelled")
            if round_.cancelled()
            else round_.exception()
        )
        if error is not None:
            self._cursor_write_failed(error)
            return
        self._now_durable(self._cursors.saved(self.group_id))
        self._ack(idle=self._idle() and self._sequencer.cursor == self._durable)

    def _now_durable(self, target: int) -> None:
        if target > self._durable:
            self._durable = target
            self._window.processed(target)
            self._wake()

    def _cursor_write_failed(self, error: BaseException) -> None:
        """The worker may be idle waiting for frames: stop it from here."""
        if self._failure is not None:
            return
        log.error("%s: writing the cursor file failed", self.group_id, exc_info=error)
        self._failure = SubscriptionFailed(f"{self.group_id}: writing the cursor file failed: {error!r}")
        self._stopping = True
        self._queue.put_nowait(None)
        self._wake()

    async def _flush(self) -> None:
        """Writes the processed cursor now, after the round in progress (if any)."""
        target = self._sequencer.cursor
        if self._failure is not None or target <= self._durable:
            return
        try:
            await self._cursors.save(self.group_id, target)
        except Exception as err:
            self._cursor_write_failed(err)
            raise
        self._now_durable(target)

    async def _jump(self, sequence: int) -> None:
        """Moves the cursor to a position the gateway declared (visibility start, restored snapshot)."""
        self._sequencer.jump(sequence)
        await self._flush()

    def _wake(self) -> None:
        """Wakes the reached() calls to look at the cursor (and the failure) again."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _ack(self, *, idle: bool) -> None:
        # Frames that only repeat what the file already holds (a redelivery after a resubscribe
        # whose save landed before them) release their credits here: no later save will.
        self._window.processed(self.cursor)
        if not self.subscription_id or not self._window.due(self.cursor, idle=idle):
            return
        cursor, credits = self._window.take(self.cursor)
        self._host._queue_ack(
            pb.CursorAck(
                subscription_id=self.subscription_id, group_id=self.group_id, cursor=cursor, credits=credits
            )
        )

    async def _on_flow(self, flow: pb.FlowFrame) -> None:
        self._announced = max(self._announced, flow.delivered_sequence)
        if flow.reason == pb.FLOW_REASON_SUBSCRIBED and flow.effective_after_sequence > self.cursor:
            # MW-8-07: nothing before the member's visibility start is ours to see; start after it.
            log.info("%s: visibility starts after sequence %d", self.group_id, flow.effective_after_sequence)
            self._window.start_at(flow.effective_after_sequence)
            await self._jump(flow.effective_after_sequence)
            self._ack(idle=False)
        else:
            log.debug("%s: flow %s", self.group_id, pb.FlowReason.Name(flow.reason))
        if self._idle():
            # The drain after the last EVENT skipped its idle ACK because this FLOW was queued behind
            # it; without this ACK a spent credit window would never be granted again.
            self._ack(idle=True)

    async def _restore(self, frame: pb.CursorTooOldFrame) -> None:
        """MW-16-11/12: verify the signed reference and the snapshot, restore, resume from its sequence."""
        verifier = self._host._verifier_now()
        reference = verifier.snapshot_reference(frame.signed_reference)
        if reference.group_id != self.group_id:
            raise NotVerified(f"{self.group_id}: the snapshot reference names {reference.group_id}")
        if self._on_snapshot is None:
            raise SubscriptionFailed(
                f"{self.group_id}: cursor {frame.requested_after_sequence} is older than the online log "
                f"(CURSOR_TOO_OLD); pass on_snapshot= to restore from the snapshot at {reference.sequence}"
            )
        try:
            response = await self._host._fetch_snapshot(self.group_id, reference.digest)
        except grpc.aio.AioRpcError as err:
            await self._resubscribe_later(f"fetching the snapshot failed ({describe(err)})")
            return
        answered = verifier.answering(response.signed_reference, reference, self._cursors.agent_id)
        snapshot = verifier.snapshot(response.snapshot, answered)
        await self._on_snapshot(snapshot)
        anchor = bytes(snapshot.last_event_digest)  # empty on snapshots older than the chain
        self._link = (snapshot.sequence, anchor, True) if anchor else None
        log.info("%s: restored the snapshot at sequence %d", self.group_id, reference.sequence)
        await self._jump(reference.sequence)
        await self.open()

    async def _on_error(self, error: pb.ErrorFrame) -> None:
        failure = GatewayError(error)
        if error.code in _FAILS_SUBSCRIPTION:
            raise SubscriptionFailed(f"{self.group_id}: {failure}")
        if error.code in _RESUBSCRIBES:
            await self._resubscribe_later(str(failure))
        else:
            log.warning("%s: gateway error %s", self.group_id, failure)

    async def _resubscribe_later(self, why: str) -> None:
        """The gateway cannot serve the subscription right now: subscribe again from the cursor, later."""
        delay = self._retry.next()
        log.error("%s: %s; subscribing again after %d in %.1f s", self.group_id, why, self.cursor, delay)
        await asyncio.sleep(delay)
        await self.open()

    async def _fail(self, failure: AgentError) -> None:
        with contextlib.suppress(Exception):  # what was processed before the failure stays processed
            await self._flush()
        log.error("%s: subscription stopped at sequence %d: %s", self.group_id, self.cursor, failure)
        self._failure = failure
        self._wake()
