"""The identity directory as the other services see it: a cache that follows Membership's changes.

``IdentityDirectoryClient`` answers what the Authority, the artifact store and the gateway ask about
callers (``get``, ``get_many``, ``session_key``) over ``IdentityDirectoryServiceStub`` on the
channel it is given (``peers.channel("membership")``: in process or over the network), and keeps
what it learns. It follows ``WatchIdentities`` from the last revision it applied, so a session
opened anywhere raises the cached epoch, and fences the older session, as soon as Membership
commits it (MW-11.3-09): Membership's OpenSession answers only once every live stream has been
written the change. The contract: ``protos/missionweave/internal/v1/identities.proto``.

When is a cached identity trusted? Only while the stream is *current*: started, and a message
(change or heartbeat) arrived less than three heartbeat intervals ago. Otherwise (stream broken,
silent, not yet connected) every identity lookup is a fresh, authoritative ``GetIdentities`` call
with a bounded deadline, and when that fails too the lookup fails closed with the structured,
retryable ``Rejected(PEER_UNAVAILABLE, peer="membership", retry_after_ms=...)`` (D62): a command
is never accepted from a session that may have been fenced meanwhile. Meanwhile the stream
reconnects with backoff and resumes from its revision; a resumed stream replays what was missed, so
the cache stays valid.

Session keys never change: a cached key is used whatever the stream's state.

Agent Cards in force (``agent_cards``) are kept under the same rule as identities: a card, or the
absence of one, read with ``GetAgentCards`` is answered again while the stream is current, and a
``CARD_PUBLISHED`` change drops the agent's entry. Membership's PublishAgentCard answers only once
that change has been written to every live stream, so a new version takes effect on the next
decision that consults it, as an uncached read would (D145).

Cached messages are shared: callers must not change them. Nothing here imports a service package
(the kernel rule): only the generated stubs.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from missionweave.internal.v1 import identities_pb2 as pb
from missionweave.internal.v1 import identities_pb2_grpc as pb_grpc
from missionweave.v1 import agent_card_pb2
from missionweave_server.edge.status import peer_unavailable

log = logging.getLogger("missionweave_server.edge.identities")

DirectoryIdentity = pb.DirectoryIdentity

# Every unary call to Membership is bounded: a Membership that is down is a structured error.
CALL_TIMEOUT_S = 2.0
# The first message of a stream (WatchStart) must come within this.
START_TIMEOUT_S = 5.0
# A stream silent for this many heartbeat intervals is out of date (the contract's rule).
STALE_INTERVALS = 3
DEFAULT_HEARTBEAT_S = 1.0
# Reconnection backoff (with jitter), reset by every successful start.
RECONNECT_INITIAL_S = 0.05
RECONNECT_CAP_S = 2.0
# Session keys kept (oldest forgotten first); identities are kept all (an Organization's worth).
MAX_SESSION_KEYS = 100_000


class _OutOfOrder(Exception):
    """The stream broke the contract (a gap in revisions): reconnect and resume."""


@dataclass(frozen=True)
class SessionListener:
    opened: Callable[[str, int], None]
    resync: Callable[[], None]


class IdentityDirectoryClient:
    def __init__(
        self,
        channel: Any | None,
        *,
        call_timeout: float = CALL_TIMEOUT_S,
        reconnect_initial: float = RECONNECT_INITIAL_S,
        reconnect_cap: float = RECONNECT_CAP_S,
        unavailable_reason: str = "",
    ) -> None:
        """``channel`` None: Membership cannot be reached from here (``unavailable_reason`` says why);
        every lookup that needs it fails with the structured, retryable rejection."""
        self._stub: pb_grpc.IdentityDirectoryServiceAsyncStub | None = (
            pb_grpc.IdentityDirectoryServiceStub(channel) if channel is not None else None
        )
        self._unavailable_reason = unavailable_reason or "no channel to the membership service"
        self.call_timeout = call_timeout
        self.reconnect_initial = reconnect_initial
        self.reconnect_cap = reconnect_cap
        self._identities: dict[str, pb.DirectoryIdentity] = {}
        self._session_keys: dict[tuple[str, int], bytes] = {}
        # The card in force of each agent read (None: it had none); trusted as identities are.
        self._cards: dict[str, agent_card_pb2.PublishedAgentCard | None] = {}
        # Raised by every CARD_PUBLISHED change: a read in flight across one is not kept.
        self._card_changes = 0
        # Every change up to this revision has been applied to the cache.
        self.revision = 0
        # Raised whenever the cache is discarded: answers read before that are not cached.
        self._generation = 0
        # The cache is trusted until then (time.monotonic()); 0 while the stream is not current.
        self._current_until = 0.0
        self._stale_after = STALE_INTERVALS * DEFAULT_HEARTBEAT_S
        self._backoff = reconnect_initial
        self._task: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()
        self.reconnects = 0  # streams started after the first (observability, tests)
        # Told of every session the stream reports opened (identity, epoch), and of every restart of
        # the cache (changes may have been missed): the Authority's session fence and the gateway
        # (MW-11.3-09), each through ``listen_sessions``.
        self._session_listeners: list[SessionListener] = []

    def listen_sessions(
        self, opened: Callable[[str, int], None], resync: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``opened(identity, epoch)`` for every session opened from now on and ``resync()`` at
        every restart of the cache; returns what stops it."""
        listener = SessionListener(opened, resync)
        self._session_listeners.append(listener)
        return lambda: (
            self._session_listeners.remove(listener) if listener in self._session_listeners else None
        )

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start following the directory (in the running loop)."""
        if self._stub is not None and self._task is None:
            self._task = asyncio.create_task(self._follow(), name="identity-directory-watch")

    async def close(self) -> None:
        task, self._task = self._task, None
        self._current_until = 0.0
        if task is not None:
            # Not aio.cancel_and_wait: it skips its cancel while one is pending, and the follow loop's
            # own asyncio.timeout cancels (then swallows) on every stale heartbeat window, so a close
            # racing that would wait for a loop that goes on.
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise

    @property
    def current(self) -> bool:
        """Whether cached identities are trusted right now (the stream is current)."""
        return time.monotonic() < self._current_until

    async def wait_current(self, timeout: float) -> bool:  # noqa: ASYNC109 (a bounded wait)
        """Wait (at most ``timeout`` seconds) until the stream is current."""
        if self.current:
            return True
        try:
            async with asyncio.timeout(timeout):
                while not self.current:
                    self._synced.clear()
                    await self._synced.wait()
        except TimeoutError:
            return self.current
        return True

    # ------------------------------------------------------------ lookups

    async def get(self, identity_id: str, *, at_least_epoch: int = 0) -> pb.DirectoryIdentity | None:
        """The identity (None if it is not registered). Fails closed (``Rejected`` PEER_UNAVAILABLE)
        when the directory can be neither trusted nor asked. ``at_least_epoch``: a session epoch the
        caller has proven exists (a signature verified with its key); a cached identity naming an
        older one lags the directory (the stream has not delivered the change yet) and is read afresh."""
        cached = self._identities.get(identity_id)
        if (
            cached is not None
            and time.monotonic() < self._current_until
            and cached.session_epoch >= at_least_epoch
        ):
            return cached  # the hot path: no task, no call
        return (await self._fetch([identity_id])).get(identity_id)

    async def get_many(self, identity_ids: Iterable[str]) -> dict[str, pb.DirectoryIdentity]:
        """The registered identities among ``identity_ids`` (empty ids ignored), in one call at most."""
        out: dict[str, pb.DirectoryIdentity] = {}
        missing: list[str] = []
        trusted = time.monotonic() < self._current_until
        for identity_id in identity_ids:
            if not identity_id:
                continue
            cached = self._identities.get(identity_id) if trusted else None
            if cached is not None:
                out[identity_id] = cached
            else:
                missing.append(identity_id)
        if missing:
            out.update(await self._fetch(missing))
        return out

    async def session_key(self, identity_id: str, session_epoch: int) -> bytes | None:
        """The session's public key (None if there is no such session). A key never changes, so a
        cached one is used whatever the stream's state."""
        key = self._session_keys.get((identity_id, session_epoch))
        if key is not None:
            return key
        generation = self._generation
        response = await self._call(
            "GetSessionKey",
            pb.GetSessionKeyRequest(identity_id=identity_id, session_epoch=session_epoch),
            f"the session key of {identity_id}",
        )
        if not response.session_public_key:
            return None
        key = bytes(response.session_public_key)
        if generation == self._generation:
            self._remember_key(identity_id, session_epoch, key)
        return key

    async def agent_cards(self, agent_ids: Iterable[str]) -> dict[str, agent_card_pb2.PublishedAgentCard]:
        """The card in force of each agent that has one, in one call at most: kept ones while the
        stream is current (a publication drops the agent's before it is answered, D145)."""
        out: dict[str, agent_card_pb2.PublishedAgentCard] = {}
        missing: list[str] = []
        trusted = time.monotonic() < self._current_until
        for agent_id in sorted(set(agent_ids)):
            if trusted and agent_id in self._cards:
                card = self._cards[agent_id]
                if card is not None:
                    out[agent_id] = card
            else:
                missing.append(agent_id)
        if not missing:
            return out
        generation, changes = self._generation, self._card_changes
        response = await self._call(
            "GetAgentCards", pb.GetAgentCardsRequest(agent_ids=missing), f"the Agent Card of {missing[0]}"
        )
        read = {c.card.agent_id: c for c in response.cards}
        out.update(read)
        if generation == self._generation and changes == self._card_changes:
            for agent_id in missing:
                self._cards[agent_id] = read.get(agent_id)
        return out

    async def _fetch(self, identity_ids: list[str]) -> dict[str, pb.DirectoryIdentity]:
        """A fresh, authoritative read. Its answers are cached unless the cache was discarded while
        it was in flight; of two answers about one identity the higher session epoch wins (epochs
        only rise), so a read that crossed a change on the stream never rolls the cache back."""
        generation = self._generation
        response = await self._call(
            "GetIdentities", pb.GetIdentitiesRequest(identity_ids=identity_ids), f"identity {identity_ids[0]}"
        )
        out: dict[str, pb.DirectoryIdentity] = {}
        for identity in response.identities:
            if generation == self._generation:
                identity = self._merge(identity)
            out[identity.identity_id] = identity
        return out

    async def _call(self, method: str, request: Any, what: str) -> Any:
        if self._stub is None:
            raise peer_unavailable("membership", f"{what} cannot be read: {self._unavailable_reason}")
        try:
            return await getattr(self._stub, method)(request, timeout=self.call_timeout)
        except grpc.RpcError as err:
            raise peer_unavailable("membership", err) from None

    # ------------------------------------------------------------ the cache

    def _merge(self, identity: pb.DirectoryIdentity) -> pb.DirectoryIdentity:
        cached = self._identities.get(identity.identity_id)
        if cached is not None and cached.session_epoch >= identity.session_epoch:
            return cached
        self._identities[identity.identity_id] = identity
        return identity

    def _remember_key(self, identity_id: str, session_epoch: int, key: bytes) -> None:
        keys = self._session_keys
        keys[(identity_id, session_epoch)] = key
        if len(keys) > MAX_SESSION_KEYS:
            del keys[next(iter(keys))]

    def _discard(self) -> None:
        self._identities.clear()
        self._session_keys.clear()
        self._cards.clear()
        self._generation += 1

    def apply_start(self, start: pb.WatchStart, asked_from: int) -> None:
        """The first message of a stream that was asked to continue after ``asked_from``."""
        if start.reset or start.revision != asked_from:
            # Not a resumption: what is cached may predate changes this stream will never send.
            self._discard()
            for listener in list(self._session_listeners):
                listener.resync()
        self.revision = start.revision
        if start.heartbeat_interval_ms:
            self._stale_after = STALE_INTERVALS * start.heartbeat_interval_ms / 1000
        self._heard()

    def apply(self, message: pb.WatchIdentitiesResponse) -> None:
        """A later message of the stream: a change (the next revision) or a heartbeat."""
        kind = message.WhichOneof("message")
        if kind == "change":
            change = message.change
            if change.revision != self.revision + 1:
                raise _OutOfOrder(f"change {change.revision} after revision {self.revision}")
            self._merge(change.identity)
            if change.kind == pb.IDENTITY_CHANGE_KIND_SESSION_OPENED and change.session_public_key:
                self._remember_key(
                    change.identity.identity_id,
                    change.identity.session_epoch,
                    bytes(change.session_public_key),
                )
            if change.kind == pb.IDENTITY_CHANGE_KIND_CARD_PUBLISHED:
                self._cards.pop(change.identity.identity_id, None)
                self._card_changes += 1
            if change.kind == pb.IDENTITY_CHANGE_KIND_SESSION_OPENED:
                for listener in list(self._session_listeners):
                    listener.opened(change.identity.identity_id, change.identity.session_epoch)
            self.revision = change.revision
        elif kind == "heartbeat":
            if message.heartbeat.revision != self.revision:
                raise _OutOfOrder(f"heartbeat at {message.heartbeat.revision}, applied {self.revision}")
        else:
            raise _OutOfOrder(f"unexpected {kind!r} message")
        self._heard()

    def _heard(self) -> None:
        self._current_until = time.monotonic() + self._stale_after
        self._synced.set()

    # ------------------------------------------------------------ following the directory

    async def _follow(self) -> None:
        assert self._stub is not None
        first = True
        while True:
            asked_from = self.revision
            call = self._stub.WatchIdentities(pb.WatchIdentitiesRequest(from_revision=asked_from))
            try:
                async with asyncio.timeout(START_TIMEOUT_S):
                    message = await call.read()
                if (
                    not isinstance(message, pb.WatchIdentitiesResponse)
                    or message.WhichOneof("message") != "start"
                ):
                    raise _OutOfOrder("the stream did not begin with start")
                self.apply_start(message.start, asked_from)
                self._backoff = self.reconnect_initial
                if not first:
                    self.reconnects += 1
                first = False
                log.info("following the identity directory", extra={"revision": self.revision})
                while True:
                    # Silence beyond the trust window is a broken stream (the process or the network
                    # between went away without closing it).
                    async with asyncio.timeout(self._stale_after):
                        message = await call.read()
                    if not isinstance(message, pb.WatchIdentitiesResponse):
                        raise _OutOfOrder("the stream ended")
                    self.apply(message)
            except asyncio.CancelledError:
                raise
            except (grpc.aio.AioRpcError, TimeoutError, _OutOfOrder) as err:
                detail = (
                    err.code().name
                    if isinstance(err, grpc.aio.AioRpcError)
                    else str(err) or type(err).__name__
                )
                # Loud once when a stream that was current breaks, quiet while reconnection keeps failing.
                log.log(
                    logging.WARNING if self._backoff == self.reconnect_initial else logging.INFO,
                    "identity directory stream broken; lookups go to Membership until it resumes",
                    extra={
                        "revision": self.revision,
                        "detail": detail,
                        "retry_in_s": round(self._backoff, 3),
                    },
                )
            except Exception:
                log.exception("identity directory stream failed", extra={"revision": self.revision})
            finally:
                self._current_until = 0.0
                call.cancel()
            await asyncio.sleep(self._backoff * random.uniform(0.5, 1.0))
            self._backoff = min(self.reconnect_cap, self._backoff * 2)
