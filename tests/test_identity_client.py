"""The identity directory client's cache and revision logic (missionweave_server/edge/identities.py), against a
scripted IdentityDirectoryService on an in-process channel (the same generated stubs and statuses)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from missionweave.internal.v1 import identities_pb2 as pb
from missionweave.internal.v1 import identities_pb2_grpc as pb_grpc
from missionweave.kernel.errors import Rejected
from missionweave.v1 import agent_card_pb2, common_pb2
from missionweave_server.edge.identities import IdentityDirectoryClient, _OutOfOrder
from missionweave_server.edge.local import LocalChannel

R = common_pb2.RejectionReason
SERVICE = pb.DESCRIPTOR.services_by_name["IdentityDirectoryService"].full_name


def ident(identity_id: str, epoch: int = 0) -> pb.DirectoryIdentity:
    return pb.DirectoryIdentity(
        identity_id=identity_id,
        public_key=b"k" * 32,
        kind=common_pb2.IDENTITY_KIND_AGENT,
        session_epoch=epoch,
    )


def change(revision: int, identity_id: str, epoch: int, key: bytes = b"") -> pb.WatchIdentitiesResponse:
    kind = pb.IDENTITY_CHANGE_KIND_SESSION_OPENED if epoch else pb.IDENTITY_CHANGE_KIND_REGISTERED
    return pb.WatchIdentitiesResponse(
        change=pb.IdentityChange(
            revision=revision, kind=kind, identity=ident(identity_id, epoch), session_public_key=key
        )
    )


def published(agent_id: str, version: str) -> agent_card_pb2.PublishedAgentCard:
    return agent_card_pb2.PublishedAgentCard(
        card=agent_card_pb2.AgentCard(agent_id=agent_id, card_version=version)
    )


def card_published(revision: int, agent_id: str) -> pb.WatchIdentitiesResponse:
    return pb.WatchIdentitiesResponse(
        change=pb.IdentityChange(
            revision=revision, kind=pb.IDENTITY_CHANGE_KIND_CARD_PUBLISHED, identity=ident(agent_id, 1)
        )
    )


class ScriptedDirectory(pb_grpc.IdentityDirectoryServiceServicer):
    """A directory whose streams send what the test puts on them."""

    def __init__(self, heartbeat_ms: int = 1000) -> None:
        self.identities: dict[str, pb.DirectoryIdentity] = {}
        self.keys: dict[tuple[str, int], bytes] = {}
        self.head = 0
        self.heartbeat_ms = heartbeat_ms
        self.calls: dict[str, int] = {"GetIdentities": 0, "GetSessionKey": 0, "GetAgentCards": 0}
        self.cards: dict[str, str] = {}  # agent -> card_version in force
        self.card_read: asyncio.Event | None = None  # set: GetAgentCards waits for it
        self.watches: list[int] = []  # from_revision of every WatchIdentities call
        self.streams: list[asyncio.Queue[pb.WatchIdentitiesResponse | None]] = []
        self.down = False  # every call fails UNAVAILABLE
        self.hang = False  # unary calls never answer
        self.reset_next = False

    async def _gate(self, context: Any) -> None:
        if self.hang:
            await asyncio.sleep(3600)
        if self.down:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "membership is down")

    async def GetIdentities(self, request: pb.GetIdentitiesRequest, context: Any) -> pb.GetIdentitiesResponse:
        self.calls["GetIdentities"] += 1
        await self._gate(context)
        found = [self.identities[i] for i in request.identity_ids if i in self.identities]
        return pb.GetIdentitiesResponse(identities=found, revision=self.head)

    async def GetSessionKey(self, request: pb.GetSessionKeyRequest, context: Any) -> pb.GetSessionKeyResponse:
        self.calls["GetSessionKey"] += 1
        await self._gate(context)
        return pb.GetSessionKeyResponse(
            session_public_key=self.keys.get((request.identity_id, request.session_epoch), b"")
        )

    async def GetAgentCards(self, request: pb.GetAgentCardsRequest, context: Any) -> pb.GetAgentCardsResponse:
        self.calls["GetAgentCards"] += 1
        await self._gate(context)
        found = [published(a, self.cards[a]) for a in request.agent_ids if a in self.cards]
        if self.card_read is not None:
            await self.card_read.wait()
        return pb.GetAgentCardsResponse(cards=found)

    async def WatchIdentities(
        self, request: pb.WatchIdentitiesRequest, context: Any
    ) -> AsyncIterator[pb.WatchIdentitiesResponse]:
        self.watches.append(request.from_revision)
        if self.down:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "membership is down")
        queue: asyncio.Queue[pb.WatchIdentitiesResponse | None] = asyncio.Queue()
        self.streams.append(queue)
        resumes = 0 < request.from_revision <= self.head and not self.reset_next
        start = request.from_revision if resumes else self.head
        reset, self.reset_next = self.reset_next, False
        yield pb.WatchIdentitiesResponse(
            start=pb.WatchStart(revision=start, reset=reset, heartbeat_interval_ms=self.heartbeat_ms)
        )
        while (message := await queue.get()) is not None:
            yield message

    def push(self, message: pb.WatchIdentitiesResponse) -> None:
        self.streams[-1].put_nowait(message)

    def end_stream(self) -> None:
        self.streams[-1].put_nowait(None)


async def started(directory: ScriptedDirectory, **kw: Any) -> IdentityDirectoryClient:
    channel = LocalChannel()
    channel.register(SERVICE, directory)
    client = IdentityDirectoryClient(
        channel, reconnect_initial=0.01, reconnect_cap=0.05, call_timeout=0.3, **kw
    )
    client.start()
    assert await client.wait_current(2)
    return client


async def until(predicate: Any, timeout: float = 2.0) -> None:  # noqa: ASYNC109 (a polling bound)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_a_cached_identity_is_answered_without_a_call_while_the_stream_is_current() -> None:
    directory = ScriptedDirectory()
    directory.identities["a"] = ident("a", 1)
    client = await started(directory)
    try:
        assert (await client.get("a")).session_epoch == 1  # type: ignore[union-attr]
        assert directory.calls["GetIdentities"] == 1
        for _ in range(10):
            assert (await client.get("a")).session_epoch == 1  # type: ignore[union-attr]
        assert (await client.get_many(["a", "", "a"])).keys() == {"a"}
        assert directory.calls["GetIdentities"] == 1  # every later lookup was a cache hit
        assert await client.get("nobody") is None  # unknown ids are asked each time (not cached)
        assert directory.calls["GetIdentities"] == 2
    finally:
        await client.close()


async def test_changes_raise_the_cached_epoch_and_carry_session_keys() -> None:
    directory = ScriptedDirectory()
    directory.identities["a"] = ident("a", 1)
    client = await started(directory)
    try:
        await client.get("a")
        directory.push(change(1, "a", 2, key=b"s" * 32))
        directory.push(change(2, "b", 0))  # never read: cached from the change alone
        await until(lambda: client.revision == 2)
        assert (await client.get("a")).session_epoch == 2  # type: ignore[union-attr]
        assert (await client.get("b")).session_epoch == 0  # type: ignore[union-attr]
        assert await client.session_key("a", 2) == b"s" * 32
        assert directory.calls == {"GetIdentities": 1, "GetSessionKey": 0, "GetAgentCards": 0}
    finally:
        await client.close()


async def test_a_read_that_crossed_a_change_never_rolls_the_epoch_back() -> None:
    directory = ScriptedDirectory()
    client = await started(directory)
    try:
        directory.push(change(1, "a", 5))
        await until(lambda: client.revision == 1)
        client._current_until = 0.0  # force the next lookup to read, as after a broken stream
        directory.identities["a"] = ident("a", 4)  # an answer read before the change
        assert (await client.get("a")).session_epoch == 5  # type: ignore[union-attr]
    finally:
        await client.close()


def test_revisions_apply_in_order_and_a_gap_is_refused() -> None:
    client = IdentityDirectoryClient(None)
    client.apply_start(pb.WatchStart(revision=7, heartbeat_interval_ms=1000), asked_from=7)
    client.apply(change(8, "a", 1))
    with pytest.raises(_OutOfOrder):
        client.apply(change(10, "a", 2))  # 9 is missing
    assert client.revision == 8
    with pytest.raises(_OutOfOrder):
        client.apply(change(8, "a", 1))  # a replay of what was applied
    with pytest.raises(_OutOfOrder):
        client.apply(pb.WatchIdentitiesResponse(heartbeat=pb.WatchHeartbeat(revision=9)))
    with pytest.raises(_OutOfOrder):
        client.apply(pb.WatchIdentitiesResponse(start=pb.WatchStart(revision=8)))


def test_a_resumed_stream_keeps_the_cache_a_reset_or_a_jump_discards_it() -> None:
    client = IdentityDirectoryClient(None)
    client.apply_start(pb.WatchStart(revision=0), asked_from=0)
    client.apply(change(1, "a", 1, key=b"s" * 32))
    client.apply_start(pb.WatchStart(revision=1), asked_from=1)  # resumed: the changes after 1 follow
    assert "a" in client._identities and ("a", 1) in client._session_keys
    client.apply_start(pb.WatchStart(revision=1, reset=True), asked_from=1)  # the database was replaced
    assert not client._identities and not client._session_keys
    client.apply(change(2, "a", 1))
    client.apply_start(pb.WatchStart(revision=9), asked_from=2)  # skips 3..9 without replaying them
    assert not client._identities and client.revision == 9


async def test_a_broken_stream_reconnects_and_resumes_from_the_last_revision() -> None:
    directory = ScriptedDirectory()
    directory.head = 3
    client = await started(directory)
    try:
        assert directory.watches == [0] and client.revision == 3
        directory.push(change(4, "a", 1))
        await until(lambda: client.revision == 4)
        directory.head = 6
        directory.end_stream()  # Membership went away (or restarted)
        await until(lambda: len(directory.watches) == 2)
        assert directory.watches[1] == 4  # resumes after what it applied
        directory.push(change(5, "a", 2))  # the catch-up
        directory.push(change(6, "a", 3))
        await until(lambda: client.revision == 6)
        assert (await client.get("a")).session_epoch == 3  # type: ignore[union-attr]
        assert client.reconnects == 1 and directory.calls["GetIdentities"] == 0
        directory.push(change(8, "a", 4))  # a gap: reconnect from 6
        await until(lambda: len(directory.watches) == 3)
        assert directory.watches[2] == 6
    finally:
        await client.close()


async def test_while_not_current_lookups_ask_membership_and_fail_closed_when_it_is_down() -> None:
    directory = ScriptedDirectory()
    directory.identities["a"] = ident("a", 1)
    directory.keys[("a", 1)] = b"s" * 32
    client = await started(directory)
    try:
        await client.get("a")
        await client.session_key("a", 1)
        directory.down = True
        directory.end_stream()
        await until(lambda: not client.current)
        with pytest.raises(Rejected) as refused:
            await client.get("a")  # cached, but no longer trusted
        assert refused.value.reason == R.REJECTION_REASON_PEER_UNAVAILABLE
        assert refused.value.metadata["peer"] == "membership"
        assert int(refused.value.metadata["retry_after_ms"]) >= 50
        with pytest.raises(Rejected):
            await client.get_many(["a"])
        assert await client.session_key("a", 1) == b"s" * 32  # keys never change: still served
        directory.identities["a"] = ident("a", 2)
        directory.down = False  # Membership is back: a fresh read answers at once...
        assert (await client.get("a")).session_epoch == 2  # type: ignore[union-attr]
        assert await client.wait_current(2)  # ...and the stream resumes
    finally:
        await client.close()


async def test_a_hanging_membership_is_a_structured_error_within_the_call_timeout() -> None:
    directory = ScriptedDirectory()
    client = await started(directory)
    try:
        directory.hang = True
        began = time.monotonic()
        with pytest.raises(Rejected) as refused:
            await client.get("a")
        assert refused.value.reason == R.REJECTION_REASON_PEER_UNAVAILABLE
        assert time.monotonic() - began < 1.0  # call_timeout is 0.3 s
        with pytest.raises(Rejected):
            await client.session_key("a", 1)
    finally:
        await client.close()


async def test_a_silent_stream_stops_being_trusted_after_three_heartbeat_intervals() -> None:
    directory = ScriptedDirectory(heartbeat_ms=50)
    directory.identities["a"] = ident("a", 1)
    client = await started(directory)
    try:
        await client.get("a")
        directory.push(pb.WatchIdentitiesResponse(heartbeat=pb.WatchHeartbeat(revision=0)))
        await asyncio.sleep(0.05)
        assert client.current
        began = time.monotonic()
        await until(lambda: not client.current, timeout=1.0)  # nothing more is sent: silence
        assert time.monotonic() - began < 0.3
        await client.get("a")
        assert directory.calls["GetIdentities"] == 2  # answered by a fresh read, not the cache
        await until(lambda: len(directory.watches) >= 2)  # and the silent stream was replaced
    finally:
        await client.close()


async def test_without_a_channel_every_lookup_fails_closed() -> None:
    client = IdentityDirectoryClient(None, unavailable_reason="MWP_MEMBERSHIP_ADDR is not set")
    client.start()  # nothing to follow
    with pytest.raises(Rejected) as refused:
        await client.get("a")
    assert refused.value.reason == R.REJECTION_REASON_PEER_UNAVAILABLE
    assert "MWP_MEMBERSHIP_ADDR" in refused.value.message
    await client.close()


async def versions(client: IdentityDirectoryClient, *agents: str) -> dict[str, str]:
    return {a: c.card.card_version for a, c in (await client.agent_cards(agents)).items()}


async def test_cards_in_force_are_kept_while_current_and_dropped_by_a_publication() -> None:
    """D145: a card (or its absence) is answered again without a call while the stream is current; a
    CARD_PUBLISHED change drops that agent's alone; out of date, every lookup reads afresh."""
    directory = ScriptedDirectory()
    directory.cards = {"a": "1.0.0"}
    client = await started(directory)
    try:
        assert await versions(client, "a", "b", "a") == {"a": "1.0.0"}
        assert await versions(client, "b", "a") == {"a": "1.0.0"}
        assert directory.calls["GetAgentCards"] == 1  # "b" has none: kept as such
        directory.cards = {"a": "1.1.0", "b": "2.0.0"}
        directory.push(card_published(1, "b"))
        await until(lambda: client.revision == 1)
        assert await versions(client, "a", "b") == {"a": "1.0.0", "b": "2.0.0"}  # only b's was dropped
        assert directory.calls["GetAgentCards"] == 2
        client._current_until = 0.0  # the stream is out of date: nothing kept is trusted
        assert await versions(client, "a") == {"a": "1.1.0"}
        assert directory.calls["GetAgentCards"] == 3
    finally:
        await client.close()


async def test_a_card_read_that_crossed_a_publication_is_not_kept() -> None:
    """A read answered before a publication but arriving after its change could hold the old version:
    it is answered to its caller but not kept, so the next lookup reads again."""
    directory = ScriptedDirectory()
    directory.cards = {"a": "1.0.0"}
    directory.card_read = asyncio.Event()
    client = await started(directory)
    try:
        read = asyncio.create_task(versions(client, "a"))
        await until(lambda: directory.calls["GetAgentCards"] == 1)
        directory.cards = {"a": "1.1.0"}
        directory.push(card_published(1, "a"))
        await until(lambda: client.revision == 1)
        directory.card_read.set()
        assert await read == {"a": "1.0.0"}
        assert await versions(client, "a") == {"a": "1.1.0"}
        assert directory.calls["GetAgentCards"] == 2
    finally:
        await client.close()


def test_a_reset_discards_kept_cards() -> None:
    client = IdentityDirectoryClient(None)
    client._cards["a"] = published("a", "1.0.0")
    client.apply_start(pb.WatchStart(revision=5, reset=True), asked_from=5)
    assert client._cards == {}
