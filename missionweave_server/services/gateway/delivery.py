"""Subscriptions: SUBSCRIBE, ordered EVENT delivery within credits, ACK and UNSUBSCRIBE (MW-16-01..11).

A subscription starts on its member's own ``GroupLogService.FollowGroup`` stream from its
``after_sequence`` (the Authority raises it to the member's visibility start) and, once caught up
and unfiltered, moves to the gateway's shared follow of its Group (``fanout.py``, D132), falling
back to its own stream whenever it drops behind that window. Either way ``deliver`` relays the log
in sequence order as EVENT frames with contiguous ranges, each within the subscription's credits,
``limits.MAX_EVENTS_PER_FRAME`` events and ``limits.EVENT_FRAME_BYTES`` of envelopes; an event the
agent may not see is listed as ``skipped``, and a gap is never skipped silently (HISTORY_UNAVAILABLE).
FLOW frames report the credit window; ACK moves the durable cursor (stored write-behind by the
gateway, ``cursor_store.py``) and grants credits; a follow that the Authority ends with NOT_OWNER is
resumed at the new owner unnoticed, and one that breaks ends the subscription with
AUTHORITY_UNAVAILABLE (subscribe again from the cursor).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from missionweave.internal.v1 import group_log_pb2 as glpb
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.observability import metrics
from missionweave_server.services.gateway import limits
from missionweave_server.services.gateway.authority_calls import (
    PeerRefused,
    open_follow,
    unavailable_only,
    unavailable_rejection,
)
from missionweave_server.services.gateway.fanout import GroupFeed, still_members
from missionweave_server.services.gateway.stream import Stream, Subscription
from missionweave_server.storage.aio import cancel_and_wait

R = common_pb2.RejectionReason
E = pb.GatewayErrorCode
_T = TypeVar("_T")


class Subscriptions(Stream):
    """A stream's subscriptions: the frames that open, feed, acknowledge and close them."""

    async def subscribe(self, sub: pb.SubscribeFrame) -> None:
        if not 1 <= len(sub.subscription_id) <= limits.MAX_SUBSCRIPTION_ID:
            await self.malformed(
                f"subscription_id must be 1..{limits.MAX_SUBSCRIPTION_ID} characters",
                "subscription_id",
                sub.subscription_id,
            )
            return
        if sub.subscription_id in self.subscriptions:
            await self.error(
                E.GATEWAY_ERROR_CODE_SUBSCRIPTION_EXISTS,
                "subscription id in use",
                subscription_id=sub.subscription_id,
            )
            return
        if len(self.subscriptions) >= limits.MAX_SUBSCRIPTIONS or sub.initial_credits > limits.MAX_CREDITS:
            await self.error(
                E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED,
                "too many subscriptions or credits",
                subscription_id=sub.subscription_id,
            )
            return
        try:
            follow, started = await self.follow(sub.group_id, sub.after_sequence, sub.filter)
        except PeerRefused as refused:
            await self.error(
                refused.code,
                refused.rejection.message,
                subscription_id=sub.subscription_id,
                rejection=unavailable_only(refused),
            )
            return
        try:
            # OP-36 / MW-8-07: never before the member's visibility start (the Authority raised it).
            after = started.effective_after_sequence
            acked = await self.gateway.stored_cursor(self.agent_id, sub.group_id)
        except BaseException:
            follow.cancel()
            raise
        s = Subscription(
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
            max_batch_entries=limits.MAX_EVENTS_PER_FRAME,
        )
        return await open_follow(self.gateway.group_log, request)

    async def deliver(self, s: Subscription) -> None:
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
                    entries[taken : taken + min(s.credits, limits.MAX_EVENTS_PER_FRAME)],
                    lambda entry: (
                        len(entry.envelope.payload) + limits.ENVELOPE_OVERHEAD
                        if entry.HasField("envelope")
                        else 0
                    ),
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
            await self.authority_lost(
                s, f"the Group Authority stream failed: {err.code().name}: {err.details()}"
            )
        finally:
            if s.follow is not None:
                s.follow.cancel()
            if s.feed is not None:
                s.feed.leave()
                s.feed = None

    def join_feed(self, s: Subscription) -> None:
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

    async def deliver_shared(self, s: Subscription, feed: GroupFeed) -> bool:
        """One EVENT frame from the shared follow, or a wait for it: this agent's view of the entries
        after its delivered sequence, as the Authority named their audiences. False once the
        subscription is over (its Membership ended, or it could not follow on its own)."""
        got = feed.take(s.delivered, min(s.credits, limits.MAX_EVENTS_PER_FRAME))
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

    def event_frame(self, s: Subscription, first: int, last: int, head: int) -> pb.EventFrame:
        frame = pb.EventFrame(
            subscription_id=s.subscription_id, group_id=s.group_id, head_sequence=max(head, last)
        )
        frame.first_sequence, frame.last_sequence = first, last
        return frame

    async def emit(self, s: Subscription, frame: pb.EventFrame, count: int) -> None:
        s.delivered = frame.last_sequence
        s.credits -= count
        frame.credits_remaining = s.credits
        metrics.DELIVERY_LAG.observe(frame.head_sequence - frame.last_sequence)
        await self.send(event=frame)

    async def membership_ended(self, s: Subscription) -> None:
        await self.error(
            E.GATEWAY_ERROR_CODE_NOT_A_MEMBER,
            "the Membership ended",
            subscription_id=s.subscription_id,
            group_id=s.group_id,
            fatal=False,
        )

    async def next_answer(self, s: Subscription) -> Any:
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

    async def refollow(self, s: Subscription) -> bool:
        """Open the subscription's own FollowGroup stream again from its delivered sequence. False when
        that fails (the agent got the ERROR; AUTHORITY_UNAVAILABLE makes it subscribe again)."""
        s.follow = None
        try:
            s.follow, started = await self.follow(s.group_id, s.delivered, s.attention)
        except PeerRefused as refused:
            if self.subscriptions.get(s.subscription_id) is s:
                del self.subscriptions[s.subscription_id]
            await self.error(
                refused.code,
                refused.rejection.message,
                subscription_id=s.subscription_id,
                group_id=s.group_id,
                rejection=unavailable_only(refused),
            )
            return False
        if started.effective_after_sequence != s.delivered:  # not where this stream left off
            await self.authority_lost(s, "the Group Authority that took the Group over starts elsewhere")
            return False
        s.head = started.head_sequence
        return True

    async def too_old(self, s: Subscription, ended: glpb.CursorTooOld) -> None:
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

    async def history_unavailable(self, s: Subscription) -> None:
        self.subscriptions.pop(s.subscription_id, None)
        await self.error(
            E.GATEWAY_ERROR_CODE_HISTORY_UNAVAILABLE,
            f"events after {s.delivered} are not online and no snapshot covers them",
            subscription_id=s.subscription_id,
            group_id=s.group_id,
        )

    async def authority_lost(self, s: Subscription, message: str) -> None:
        """The FollowGroup stream broke (the Authority went away): the subscription ends with
        AUTHORITY_UNAVAILABLE and retry information; SUBSCRIBE again from the cursor."""
        if self.subscriptions.get(s.subscription_id) is s:
            del self.subscriptions[s.subscription_id]
        await self.error(
            E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
            message,
            subscription_id=s.subscription_id,
            group_id=s.group_id,
            rejection=unavailable_rejection(message),
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
                    f"subscription {s.subscription_id} follows {s.group_id}, not {cursor.group_id}",
                    "group_id",
                    s.subscription_id,
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
            if s.credits + cursor.credits > limits.MAX_CREDITS:
                await self.error(
                    E.GATEWAY_ERROR_CODE_CREDIT_OVERFLOW,
                    f"at most {limits.MAX_CREDITS} credits",
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

    async def flow(self, s: Subscription, reason: int, state: int, *, effective_after: int = 0) -> None:
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


def _within_bytes(entries: Sequence[_T], size: Callable[[_T], int]) -> Sequence[_T]:
    """The first of ``entries`` whose sizes stay within ``limits.EVENT_FRAME_BYTES`` (at least one)."""
    total = 0
    for i, entry in enumerate(entries):
        total += size(entry)
        if i and total > limits.EVENT_FRAME_BYTES:
            return entries[:i]
    return entries
