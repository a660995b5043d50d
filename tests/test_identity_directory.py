"""The identity directory across processes: an Authority-only mesh and Membership-only meshes on one
database, each its own gRPC server, reaching each other only through the contracts
(IdentityDirectoryService, AuthorityService.GetGroupState)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from nacl.signing import SigningKey

from missionweave.internal.v1 import identities_pb2, identities_pb2_grpc
from missionweave.kernel.clock import SystemClock
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.v1 import agent_card_pb2, common_pb2, membership_service_pb2
from missionweave_server.config import Settings
from missionweave_server.edge.callers import MeshServiceChannel
from missionweave_server.mesh.server import Mesh, start
from tests import builders
from tests.test_cli_serve import free_port

R = common_pb2.RejectionReason
G = "grp_dir"


@dataclass
class Split:
    membership: Mesh
    authority: Mesh
    membership_settings: Settings
    to_membership: MeshClient
    to_authority: MeshClient
    admin_key: SigningKey
    alice_key: SigningKey
    conversation: str = ""

    async def post(self, signer: SessionSigner, text: str = "hi") -> Any:
        body = builders.message(self.conversation, text)
        return await self.to_authority.execute(
            signer.sign(signer.command(G, "message_post", body, membership_epoch=1))
        )


async def rejection(call: Any) -> tuple[common_pb2.Rejection, grpc.aio.AioRpcError]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    out = rejection_from_rpc_error(info.value)
    assert out is not None, info.value
    return out, info.value


async def until(predicate: Any, timeout: float) -> None:  # noqa: ASYNC109 (a polling bound)
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def split_settings(
    tmp_path: Path, db_url: str, port: int, services: tuple[str, ...], peers: dict[str, str]
) -> Settings:
    return Settings(
        listen=f"127.0.0.1:{port}",
        data_dir=tmp_path / "data",
        database_url=db_url,
        services=services,
        peers=peers,
        grace_seconds=1,
        verify_workers=0,
    )


@pytest.fixture
async def split(db_url: str, tmp_path: Path) -> AsyncIterator[Split]:
    membership_port, authority_port = free_port(), free_port()
    m_addr, a_addr = f"127.0.0.1:{membership_port}", f"127.0.0.1:{authority_port}"
    m_settings = split_settings(tmp_path, db_url, membership_port, ("membership",), {"authority": a_addr})
    membership = await start(m_settings)
    authority = await start(
        split_settings(tmp_path, db_url, authority_port, ("authority",), {"membership": m_addr})
    )
    to_membership, to_authority = MeshClient(m_addr), MeshClient(a_addr)
    admin_key = read_key(m_settings.admin_key_path)
    alice_key = SigningKey.generate()
    await to_membership.register_identity(
        "admin", admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN, bytes(alice_key.verify_key)
    )
    coord_key = SigningKey.generate()
    await to_membership.register_identity(
        "admin", admin_key, "coord", common_pb2.IDENTITY_KIND_AGENT, bytes(coord_key.verify_key)
    )
    s = Split(membership, authority, m_settings, to_membership, to_authority, admin_key, alice_key)
    try:
        yield s
    finally:
        await to_membership.channel.close()
        await to_authority.channel.close()
        await s.authority.stop(grace=1)
        await s.membership.stop(grace=1)
        leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        if leftover:
            await asyncio.wait(leftover, timeout=5)
        assert not [t for t in leftover if not t.done()], "tasks still running after both meshes stopped"


async def create_mission(s: Split) -> SessionSigner:
    alice = await s.to_membership.open_session("alice", s.alice_key)
    s.to_authority.read_as(alice)
    body = builders.mission_create("alice", "coord", SystemClock().now())
    await s.to_authority.execute(alice.sign(alice.command(G, "mission_create", body)))
    s.conversation = (await s.to_authority.group_state(G)).mission.planning_conversation_id
    return alice


async def test_identity_lookups_cross_processes(split: Split) -> None:
    """The Authority process knows identities only through Membership's directory: registered there,
    they sign and are referenced in commands here; unknown ones are refused."""
    alice = await create_mission(split)
    assert split.authority.registry is None  # no registry, no membership tables read here
    assert split.authority.identities.current
    await split.post(alice)
    stranger = SessionSigner("mallory", 1, SigningKey.generate())
    refused, _ = await rejection(
        split.to_authority.execute(
            stranger.sign(stranger.command(G, "message_post", builders.message(split.conversation)))
        )
    )
    assert refused.reason == R.REJECTION_REASON_UNKNOWN_IDENTITY
    # Membership reads Group memberships from the Authority's public contract.
    listed = await split.to_membership.membership.ListMemberships(
        membership_service_pb2.ListMembershipsRequest(group_id=G)
    )
    assert {m.member_id for m in listed.memberships} == {"alice", "coord"}
    refused, _ = await rejection(
        split.to_membership.membership.ListMemberships(
            membership_service_pb2.ListMembershipsRequest(group_id="grp_none")
        )
    )
    assert refused.reason == R.REJECTION_REASON_NOT_A_MEMBER  # alice is not in it: no existence oracle


@pytest.mark.req("MW-11.3-09")
async def test_a_new_session_at_membership_fences_the_old_one_at_the_authority_at_once(split: Split) -> None:
    """MW-11.3-09 in the split topology: the old session's very next command, sent the moment
    OpenSession answered, is refused by the Authority process, from its followed cache."""
    old = await create_mission(split)
    await split.post(old)
    for round_ in range(10):
        new = await split.to_membership.open_session("alice", split.alice_key)
        refused, _ = await rejection(split.post(old, f"stale {round_}"))
        assert refused.reason == R.REJECTION_REASON_SESSION_EPOCH_STALE
        assert refused.metadata["current_epoch"] == str(new.session_epoch)
        await split.post(new, f"current {round_}")
        old = new
    assert split.authority.identities.current  # answered by the stream, not by fresh reads


async def test_a_broken_directory_stream_fails_closed_then_recovers(split: Split) -> None:
    """Membership stops: the Authority refuses session-dependent commands with a structured,
    retryable error at once instead of trusting a session that may have been fenced; once
    Membership is back it accepts them again, and a session opened meanwhile elsewhere is honoured."""
    alice = await create_mission(split)
    await split.post(alice)
    await split.membership.stop(grace=0.5)
    began = time.monotonic()
    refused, err = await rejection(split.post(alice, "while membership is down"))
    assert time.monotonic() - began < 3.0  # bounded: no hang on the missing peer
    assert refused.reason == R.REJECTION_REASON_PEER_UNAVAILABLE
    assert refused.metadata["peer"] == "membership" and int(refused.metadata["retry_after_ms"]) > 0
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None and any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details)
    assert not split.authority.identities.current

    # Another Membership instance on the same database opens a new session while the first is down.
    other = await start(
        split_settings(
            split.membership_settings.data_dir.parent,
            split.membership_settings.database_url,
            free_port(),
            ("membership",),
            {},
        )
    )
    try:
        async with MeshClient(f"127.0.0.1:{other.port}") as elsewhere:
            newer = await elsewhere.open_session("alice", split.alice_key)
    finally:
        await other.stop(grace=0.5)

    split.membership = await start(split.membership_settings)  # the first one is back, same address

    async def accepted() -> bool:
        try:
            await split.post(newer, "after recovery")
            return True
        except grpc.aio.AioRpcError as e:
            r = rejection_from_rpc_error(e)
            assert r is not None and r.reason == R.REJECTION_REASON_PEER_UNAVAILABLE, e
            return False

    await until(accepted, timeout=10)
    refused, _ = await rejection(split.post(alice, "from the fenced session"))
    assert refused.reason == R.REJECTION_REASON_SESSION_EPOCH_STALE
    assert await split.authority.identities.wait_current(10)
    assert split.authority.identities.reconnects >= 1
    refused, _ = await rejection(split.post(alice, "still fenced, from the cache"))
    assert refused.reason == R.REJECTION_REASON_SESSION_EPOCH_STALE


@pytest.mark.req("MW-11.3-09")
async def test_a_session_opened_at_another_membership_instance_fences_at_once_too(split: Split) -> None:
    """Two Membership instances on one database: the Authority follows the first; OpenSession at the
    second answers only once the first's stream to the Authority has been written the change."""
    old = await create_mission(split)
    other = await start(
        split_settings(
            split.membership_settings.data_dir.parent,
            split.membership_settings.database_url,
            free_port(),
            ("membership",),
            {},
        )
    )
    try:
        async with MeshClient(f"127.0.0.1:{other.port}") as elsewhere:
            for round_ in range(5):
                new = await elsewhere.open_session("alice", split.alice_key)
                refused, _ = await rejection(split.post(old, f"stale {round_}"))
                assert refused.reason == R.REJECTION_REASON_SESSION_EPOCH_STALE
                await split.post(new, f"current {round_}")
                old = new
        assert split.authority.identities.current
    finally:
        await other.stop(grace=0.5)


async def test_revisions_are_durable_ordered_and_gap_free_across_instances(split: Split) -> None:
    """Changes made concurrently at two Membership instances get consecutive revisions; a stream
    resumed from any revision replays each later change once, in order."""
    other = await start(
        split_settings(
            split.membership_settings.data_dir.parent,
            split.membership_settings.database_url,
            free_port(),
            ("membership",),
            {},
        )
    )
    try:
        async with MeshClient(f"127.0.0.1:{other.port}") as elsewhere:
            keys = {f"agent-{i}": SigningKey.generate() for i in range(12)}
            await asyncio.gather(
                *[
                    (split.to_membership if i % 2 else elsewhere).register_identity(
                        "admin", split.admin_key, name, common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
                    )
                    for i, (name, key) in enumerate(keys.items())
                ]
            )
            await asyncio.gather(
                *[
                    (elsewhere if i % 2 else split.to_membership).open_session(name, key)
                    for i, (name, key) in enumerate(keys.items())
                ]
            )
        token = split.membership_settings.mesh_token_path.read_bytes().strip()  # internal: mesh services only
        stub = identities_pb2_grpc.IdentityDirectoryServiceStub(
            MeshServiceChannel(split.to_membership.channel, token)
        )
        call = stub.WatchIdentities(identities_pb2.WatchIdentitiesRequest(from_revision=1))
        first = await call.read()
        assert (
            first.start.revision == 1 and not first.start.reset and first.start.heartbeat_interval_ms == 1000
        )
        seen = []
        # admin's bootstrap (1) and alice's and coord's registrations (2, 3) came first.
        while len(seen) < 2 + 24:
            message = await asyncio.wait_for(call.read(), 5)
            assert message.WhichOneof("message") == "change", message
            seen.append(message.change)
        call.cancel()
        assert [c.revision for c in seen] == list(range(2, 2 + len(seen)))
        opened = [c for c in seen if c.kind == identities_pb2.IDENTITY_CHANGE_KIND_SESSION_OPENED]
        assert {c.identity.identity_id for c in opened} == set(keys)
        assert all(c.identity.session_epoch == 1 and len(c.session_public_key) == 32 for c in opened)
        # A revision ahead of the directory (a restored database) is answered with a reset.
        call = stub.WatchIdentities(identities_pb2.WatchIdentitiesRequest(from_revision=10_000))
        first = await call.read()
        assert first.start.reset and first.start.revision == seen[-1].revision
        call.cancel()
        found = await stub.GetIdentities(
            identities_pb2.GetIdentitiesRequest(identity_ids=["agent-0", "nobody", "agent-0"])
        )
        assert [i.identity_id for i in found.identities] == ["agent-0"] and found.revision == seen[
            -1
        ].revision
        assert found.identities[0].session_epoch == 1
    finally:
        await other.stop(grace=0.5)


async def test_a_stream_of_a_vanished_instance_delays_open_session_only_until_its_row_expires(
    split: Split,
) -> None:
    """A Membership instance that died leaves its streams' rows behind: OpenSession waits for them
    only until they expire (their clients stopped trusting those streams by then), never longer."""
    registry = split.membership.registry
    assert registry is not None
    await registry.stream_opened("ghost", "vanished-instance", alive_for_s=0.4)
    began = time.monotonic()
    await split.to_membership.open_session("alice", split.alice_key)
    assert 0.3 < time.monotonic() - began < 2.0
    began = time.monotonic()
    await split.to_membership.open_session("alice", split.alice_key)  # expired: no wait at all
    assert time.monotonic() - began < 0.3


@pytest.mark.req("MW-11.1-13")
async def test_a_card_published_at_another_membership_instance_is_in_force_at_the_authority_at_once(
    split: Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Authority keeps each agent's card in force while its directory stream is current (D145).
    PublishAgentCard at a second Membership instance answers only once the first instance's stream
    to the Authority has carried the CARD_PUBLISHED change (a 100 ms poll away), so the Authority's
    very next lookup, made the moment publishing answered, reads the new version."""
    directory = split.authority.identities
    reads: list[str] = []
    call = directory._call

    async def counted(method: str, request: Any, what: str) -> Any:
        reads.append(method)
        return await call(method, request, what)

    monkeypatch.setattr(directory, "_call", counted)
    other = await start(
        split_settings(
            split.membership_settings.data_dir.parent,
            split.membership_settings.database_url,
            free_port(),
            ("membership",),
            {},
        )
    )
    try:
        async with MeshClient(f"127.0.0.1:{other.port}") as elsewhere:
            key = SigningKey.generate()
            await elsewhere.register_identity(
                "admin", split.admin_key, "bot", common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
            )
            elsewhere.read_as(await elsewhere.open_session("bot", key))
            # Kept answers need a current stream; its first start (a reset) discards a read in flight.
            assert await directory.wait_current(10)
            assert await directory.agent_cards(["bot"]) == {}
            assert await directory.agent_cards(["bot"]) == {}  # no card: kept too
            assert reads == ["GetAgentCards"]
            for round_ in range(5):
                version = f"1.{round_}.0"
                await elsewhere.publish_agent_card(
                    agent_card_pb2.AgentCard(card_version=version, max_concurrency=2)
                )
                assert (await directory.agent_cards(["bot"]))["bot"].card.card_version == version
                assert (await directory.agent_cards(["bot"]))["bot"].card.card_version == version
            assert reads == ["GetAgentCards"] * 6  # one read per version: the second lookup was kept
            republished = await elsewhere.publish_agent_card(
                agent_card_pb2.AgentCard(card_version="1.4.0", max_concurrency=2)
            )
            assert republished.replayed
            await directory.agent_cards(["bot"])
            assert len(reads) == 6  # an identical republish changes nothing
        assert directory.current
    finally:
        await other.stop(grace=0.5)


async def test_publishing_a_card_waits_for_every_live_stream_even_when_it_is_a_republish(
    split: Split,
) -> None:
    """PublishAgentCard answers once its change reached every live stream: a vanished instance's stream
    row holds it until the row expires, like OpenSession. An identical republish (a retry whose first
    answer was lost) waits the same way, for the directory's head, which covers the first change."""
    registry = split.membership.registry
    assert registry is not None
    key = SigningKey.generate()
    await split.to_membership.register_identity(
        "admin", split.admin_key, "bot", common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
    )
    split.to_membership.read_as(await split.to_membership.open_session("bot", key))
    card = agent_card_pb2.AgentCard(card_version="1.0.0", max_concurrency=1)
    for replayed in (False, True):
        await registry.stream_opened(f"ghost-{replayed}", "vanished-instance", alive_for_s=0.4)
        began = time.monotonic()
        answer = await split.to_membership.publish_agent_card(card)
        assert answer.replayed is replayed
        assert 0.3 < time.monotonic() - began < 2.0
