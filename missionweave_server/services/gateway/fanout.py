"""One shared follow of a Group per gateway process, fanned out to its subscriptions (D132).

A ``GroupFeed`` reads the Group's log once, as a ``GroupLogService.FollowGroup`` stream in the
SHARED view: every entry carries its signed envelope and its audience, the members the Authority
lets see it (restricted Conversations, MW-9-05; provisional members, D124), and a batch carries the
Group's active Memberships whenever they change. The feed keeps the last entries in a bounded window
(``FEED_ENTRIES``, ``FEED_BYTES``); each subscription takes the entries after its own delivered
sequence from it, as its own credits allow, and hands each envelope to its agent only when the
audience names it (otherwise the sequence is skipped). Nothing is parsed here.

The feed reads at the Authority's pace, not its slowest subscriber's: a subscription that falls
behind the window (a slow agent) leaves the feed and is served from history by its own member-view
FollowGroup stream, read as its credits allow, until it reaches the window again. So one slow agent
neither holds up the others nor makes the window grow.

``SharedFeeds`` is the gateway's register of these feeds, one per Group subscribed here: a caught-up
subscription joins its Group's feed (started on demand at its delivered sequence), and a Group whose
feed ended before its first batch is not followed shared again for ``FEED_RETRY_S``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import grpc

from missionweave.internal.v1 import group_log_pb2 as glpb
from missionweave.internal.v1 import group_log_pb2_grpc as glpb_grpc
from missionweave.kernel.errors import R
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.services.gateway import limits
from missionweave_server.services.gateway.authority_calls import (
    PeerRefused,
    open_follow,
    unavailable_rejection,
)

log = logging.getLogger("missionweave.gateway.fanout")
E = pb.GatewayErrorCode

# The window a subscription may join from: at most this many entries and (but always one) bytes.
FEED_ENTRIES = 4_096
FEED_BYTES = 4 * 1024 * 1024
# A Group whose shared follow ended before its first batch is not followed shared again before this.
FEED_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Members:
    """The Group's active Memberships in force for an entry."""

    full: frozenset[str]
    provisional: frozenset[str]

    def active(self, member_id: str) -> bool:
        return member_id in self.full or member_id in self.provisional


NO_MEMBERS = Members(frozenset(), frozenset())


@dataclass(frozen=True, slots=True)
class Shared:
    """One entry of the shared stream, as every subscription of the Group reads it."""

    sequence: int
    envelope: common_pb2.SignedEnvelope
    full_members: bool  # every full member of ``members`` may see it ...
    named: frozenset[str]  # ... and these (only these when not ``full_members``)
    members: Members
    size: int

    def visible_to(self, member_id: str) -> bool:
        return member_id in self.named or (self.full_members and member_id in self.members.full)


# Opens the SHARED FollowGroup stream after a sequence: the call, once it has answered `started`.
Opener = Callable[[int], Awaitable[Any]]


class GroupFeed:
    def __init__(
        self, group_id: str, after: int, opener: Opener, on_end: Callable[[GroupFeed], None]
    ) -> None:
        self.group_id = group_id
        self.start = after
        self.position = after  # the last sequence received
        self.head = after  # the Group's head as last reported
        # The window: ``_entries[_first:]``, one entry per sequence up to ``position``, so a
        # subscription's next entries are a slice found by arithmetic (D152: walking a deque to them
        # cost ~10 us a take once a busy Group filled its window). Entries that left it are None
        # until the list is compacted, once they are half of it.
        self._entries: list[Shared | None] = []
        self._first = 0
        self.ended = False  # the stream is over: subscriptions drain the window, then follow on their own
        self.subscribers = 0
        self.advanced = asyncio.Event()  # set (and cleared) whenever entries arrive or the feed ends
        self._bytes = 0
        self._members = NO_MEMBERS
        self._opener = opener
        self._on_end = on_end
        self.task = asyncio.create_task(self._run())

    def oldest_after(self) -> int:
        """The lowest delivered sequence a subscription may continue from here."""
        return self.position - (len(self._entries) - self._first)

    def covers(self, delivered: int) -> bool:
        return not self.ended and delivered >= self.oldest_after()

    def take(self, delivered: int, most: int) -> list[Shared] | None:
        """Up to ``most`` entries after ``delivered``: [] when there are none yet, None when the
        next one has left the window (or the feed ended with none): follow on your own."""
        if delivered < self.oldest_after():
            return None
        if delivered >= self.position:
            return None if self.ended else []
        start = len(self._entries) - (self.position - delivered)
        return cast(list[Shared], self._entries[start : start + most])

    def join(self) -> None:
        self.subscribers += 1

    def leave(self) -> None:
        """A subscription stops reading here; the last one out ends the feed."""
        self.subscribers -= 1
        if self.subscribers <= 0:
            self._end()
            self.task.cancel()

    async def _run(self) -> None:
        call: Any = None
        try:
            call = await self._opener(self.position)
            while True:
                try:
                    response = await call.read()
                except grpc.aio.AioRpcError as err:
                    # NOT_OWNER: another instance took the Group over; follow it there from where
                    # this stream left off (the routing remembered the owner it named).
                    rejection = rejection_from_rpc_error(err)
                    if rejection is None or rejection.reason != R.REJECTION_REASON_NOT_OWNER:
                        raise
                    call.cancel()
                    call = await self._opener(self.position)
                    continue
                if response is grpc.aio.EOF or response.WhichOneof("response") != "batch":
                    return  # ended (or cannot continue): each subscription finds out on its own stream
                self._append(response.batch)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            # The Authority went away or refused: each subscription follows on its own stream, which
            # answers its agent exactly as an unshared one would (AUTHORITY_UNAVAILABLE, ...).
            log.info("a shared Group follow ended", extra={"group": self.group_id, "detail": repr(err)})
        finally:
            if call is not None:
                call.cancel()
            self._end()

    def _append(self, batch: glpb.LogBatch) -> None:
        if batch.HasField("members"):
            self._members = Members(
                frozenset(batch.members.full_member_ids), frozenset(batch.members.provisional_member_ids)
            )
        members = self._members
        for entry in batch.entries:
            if entry.sequence != self.position + 1:  # the contract forbids it; never pass a gap on
                raise ValueError(f"the shared stream skipped from {self.position} to {entry.sequence}")
            audience = entry.audience
            shared = Shared(
                entry.sequence,
                entry.envelope,
                audience.full_members,
                frozenset(audience.member_ids),
                members,
                entry.envelope.ByteSize(),
            )
            self._entries.append(shared)
            self._bytes += shared.size
            self.position = entry.sequence
        entries = self._entries
        while len(entries) - self._first > 1 and (
            len(entries) - self._first > FEED_ENTRIES or self._bytes > FEED_BYTES
        ):
            self._bytes -= cast(Shared, entries[self._first]).size
            entries[self._first] = None
            self._first += 1
        if self._first * 2 > len(entries):
            del entries[: self._first]
            self._first = 0
        self.head = max(self.head, batch.head_sequence, self.position)
        self.advanced.set()
        self.advanced.clear()

    def _end(self) -> None:
        if not self.ended:
            self.ended = True
            self._on_end(self)
            self.advanced.set()
            self.advanced.clear()


def still_members(entries: list[Shared], member_id: str) -> tuple[list[Shared], bool]:
    """The prefix of ``entries`` still in ``member_id``'s Membership, and whether it ended there."""
    for i, entry in enumerate(entries):
        if not entry.members.active(member_id):
            return entries[:i], True
    return entries, False


class SharedFeeds:
    """The shared follows of a gateway (a base of ``service.GatewayServicer``, which sets these
    attributes)."""

    group_log: glpb_grpc.GroupLogServiceAsyncStub
    stopping: bool
    feeds: dict[str, GroupFeed]  # the shared follow of each Group subscribed here (D132)
    _feed_failed: dict[str, float]  # when a Group's shared follow last ended unread

    def feed_for(self, group_id: str, delivered: int, caught_up: bool) -> GroupFeed | None:
        """The Group's shared follow if a subscription at ``delivered`` may continue from it; a new
        one from ``delivered`` when there is none and the subscription is ``caught_up`` with the
        head (a feed never starts behind: subscriptions at the head would wait for its replay). Not
        within FEED_RETRY_S of one that ended without a single batch (an Authority that refuses or
        drops the SHARED view would otherwise be asked again for every batch)."""
        feed = self.feeds.get(group_id)
        if feed is not None:
            return feed if feed.covers(delivered) else None
        if (
            not caught_up
            or self.stopping
            or time.monotonic() - self._feed_failed.get(group_id, -FEED_RETRY_S) < FEED_RETRY_S
        ):
            return None
        feed = GroupFeed(
            group_id, delivered, lambda after: self.open_shared(group_id, after), self._feed_ended
        )
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
            group_id=group_id,
            after_sequence=after,
            max_batch_entries=limits.MAX_EVENTS_PER_FRAME,
            view=glpb.FOLLOW_VIEW_SHARED,
        )
        call, started = await open_follow(self.group_log, request)
        if started.effective_after_sequence != after:
            call.cancel()
            raise PeerRefused(
                E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
                unavailable_rejection("the shared follow starts elsewhere"),
            )
        return call
