"""Agent Cards and Presence over the public gRPC API (MW-11.1-13, MW-11.1-14; docs/agent-cards.md).

Cards: signed by the agent's current session key, published by the agent itself, every version
kept and resolvable exactly as signed, versions strictly increasing, republishing idempotent only
with the same card. Presence: capacity within the card in force, fresh until reported_at + ttl by
the server's clock (the world's OffsetClock moves it). The internal GetAgentCards answers mesh
services only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from missionweave.internal.v1 import identities_pb2, identities_pb2_grpc
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import AGENT_CARD_TYPE, session_key_id, sign_envelope
from missionweave.kernel.transport import open_channel
from missionweave.sdk.client import (
    MeshClient,
    SessionSigner,
    agent_card_envelope,
    decode_events,
    verify_agent_card,
)
from missionweave.sdk.credentials import call_proof
from missionweave.v1 import agent_card_pb2 as pb
from missionweave.v1 import common_pb2, membership_pb2, work_pb2
from missionweave.v1 import membership_service_pb2 as mpb
from missionweave.v1 import membership_service_pb2_grpc as mpb_grpc
from missionweave_server.edge.callers import CALL_PROOF_METADATA, MESH_TOKEN_METADATA
from tests.conftest import World
from tests.test_missions import G

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

R = common_pb2.RejectionReason
AVAILABLE = pb.PRESENCE_AVAILABILITY_AVAILABLE


def card(agent_id: str, version: str, **fields: Any) -> pb.AgentCard:
    fields.setdefault("max_concurrency", 4)
    return pb.AgentCard(agent_id=agent_id, card_version=version, **fields)


def request(signer: SessionSigner, c: pb.AgentCard) -> mpb.PublishAgentCardRequest:
    return mpb.PublishAgentCardRequest(card=agent_card_envelope(signer, c))


async def refusal(call: Any) -> common_pb2.Rejection:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    out = rejection_from_rpc_error(info.value)
    assert out is not None, info.value
    return out


@pytest.fixture
async def clients(world: World) -> AsyncIterator[dict[str, MeshClient]]:
    """One client proving each of the world's identities (and one proving nobody)."""
    w = world
    out = {
        "worker": MeshClient(w.target, reader=w.worker),
        "coordinator": MeshClient(w.target, reader=w.coordinator),
        "owner": MeshClient(w.target, reader=w.owner),
        "anonymous": MeshClient(w.target),
    }
    try:
        yield out
    finally:
        for client in out.values():
            await client.channel.close()


async def versions(client: MeshClient, agent_id: str) -> list[str]:
    return [v.card_version for v in await client.agent_card_versions(agent_id)]


# ------------------------------------------------------------------ cards


@pytest.mark.req("MW-11.1-13")
async def test_every_version_is_kept_and_resolves_exactly_as_signed(
    world: World, clients: dict[str, MeshClient]
) -> None:
    w, worker = world, clients["worker"]
    sent = {}
    for version in ("1.0.0", "1.2.0", "2.0.0-rc.1", "2.0.0"):
        c = card(
            "worker-bot",
            version,
            max_concurrency=int(version[0]) * 2,
            capabilities=[membership_pb2.Capability(capability_id="code.python", version="1.4.0")],
            extensions=["urn:missionweave:ext:review"],
            endpoints=["gateway://127.0.0.1:50051"],
            display_name="Worker",
            description=f"card {version}",
        )
        sent[version] = agent_card_envelope(w.worker, c)
        answer = await worker.membership.PublishAgentCard(mpb.PublishAgentCardRequest(card=sent[version]))
        assert not answer.replayed and answer.published.card == c
        assert answer.published.session_epoch == w.worker.session_epoch
    reader = clients["coordinator"]  # any authenticated identity reads
    for version, envelope in sent.items():
        got = await reader.membership.GetAgentCard(
            mpb.GetAgentCardRequest(agent_id="worker-bot", card_version=version)
        )
        assert got.published.envelope.SerializeToString() == envelope.SerializeToString()
        assert got.latest_version == "2.0.0"
        assert verify_agent_card(got.published).card_version == version
    # What an Artifact manifest cites (agent_card_version) still resolves after newer versions.
    cited = await reader.agent_card("worker-bot", "1.0.0")
    assert cited.card.max_concurrency == 2 and cited.card.description == "card 1.0.0"
    in_force = await reader.agent_card("worker-bot")
    assert in_force.card.card_version == "2.0.0" and in_force.card.max_concurrency == 4
    listed = await reader.agent_card_versions("worker-bot")
    assert [v.card_version for v in listed] == ["2.0.0", "2.0.0-rc.1", "1.2.0", "1.0.0"]
    stamps = [v.published_at.ToMicroseconds() for v in listed]
    assert stamps == sorted(stamps, reverse=True)
    first = await reader.membership.ListAgentCardVersions(
        mpb.ListAgentCardVersionsRequest(agent_id="worker-bot", page_size=3)
    )
    assert [v.card_version for v in first.versions] == [
        "2.0.0",
        "2.0.0-rc.1",
        "1.2.0",
    ] and first.next_page_token
    rest = await reader.membership.ListAgentCardVersions(
        mpb.ListAgentCardVersionsRequest(agent_id="worker-bot", page_size=3, page_token=first.next_page_token)
    )
    assert [v.card_version for v in rest.versions] == ["1.0.0"] and not rest.next_page_token
    r = await refusal(
        reader.membership.ListAgentCardVersions(
            mpb.ListAgentCardVersionsRequest(agent_id="worker-bot", page_size=1001)
        )
    )
    assert (r.reason, r.metadata["field"], r.metadata["limit"]) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        "page_size",
        "1000",
    )
    for agent, version in (("worker-bot", "3.0.0"), ("coord-bot", ""), ("nobody-bot", "1.0.0")):
        r = await refusal(
            reader.membership.GetAgentCard(mpb.GetAgentCardRequest(agent_id=agent, card_version=version))
        )
        assert r.reason == R.REJECTION_REASON_NOT_FOUND
    assert await versions(reader, "coord-bot") == []


@pytest.mark.req("MW-11.1-13")
async def test_republishing_is_idempotent_with_the_same_card_and_refused_with_another(
    world: World, clients: dict[str, MeshClient]
) -> None:
    w, worker = world, clients["worker"]
    original = card("worker-bot", "1.0.0")
    first = await worker.membership.PublishAgentCard(request(w.worker, original))
    again = await worker.membership.PublishAgentCard(request(w.worker, original))
    assert again.replayed and again.published == first.published
    # Signed again by a newer session: still the same card, answered as first stored.
    newer = await w.client.open_session("worker-bot", w.worker.key)
    worker.read_as(newer)
    resigned = await worker.membership.PublishAgentCard(request(newer, original))
    assert resigned.replayed and resigned.published.session_epoch == w.worker.session_epoch
    assert resigned.published.envelope == first.published.envelope

    other = await refusal(
        worker.membership.PublishAgentCard(request(newer, card("worker-bot", "1.0.0", max_concurrency=8)))
    )
    assert other.reason == R.REJECTION_REASON_REVISION_MISMATCH
    assert dict(other.metadata) == {
        "field": "card.card_version",
        "conflict": "content",
        "latest_version": "1.0.0",
    }
    assert (await worker.agent_card("worker-bot", "1.0.0")).card.max_concurrency == 4

    await worker.membership.PublishAgentCard(request(newer, card("worker-bot", "1.1.0")))
    for lower in ("1.0.5", "1.1.0-rc.1", "0.9.9"):
        r = await refusal(worker.membership.PublishAgentCard(request(newer, card("worker-bot", lower))))
        assert r.reason == R.REJECTION_REASON_REVISION_MISMATCH
        assert (r.metadata["conflict"], r.metadata["latest_version"]) == ("order", "1.1.0")
    assert await versions(worker, "worker-bot") == ["1.1.0", "1.0.0"]


async def test_concurrent_identical_publications_store_one_version(
    world: World, clients: dict[str, MeshClient]
) -> None:
    w, worker = world, clients["worker"]
    answers = await asyncio.gather(
        *(
            worker.membership.PublishAgentCard(request(w.worker, card("worker-bot", "1.0.0")))
            for _ in range(6)
        )
    )
    assert sorted(a.replayed for a in answers) == [False] + [True] * 5
    assert len({a.published.published_at.ToMicroseconds() for a in answers}) == 1
    assert await versions(worker, "worker-bot") == ["1.0.0"]


@pytest.mark.req("MW-11.1-13")
async def test_only_the_agent_itself_publishes_signed_by_its_current_session(
    world: World, clients: dict[str, MeshClient]
) -> None:
    w, worker = world, clients["worker"]
    mine = card("worker-bot", "1.0.0")
    forged = SessionSigner("worker-bot", w.worker.session_epoch, SigningKey.generate())
    r = await refusal(worker.membership.PublishAgentCard(request(forged, mine)))
    assert r.reason == R.REJECTION_REASON_SIGNATURE_INVALID
    # Signed by another identity's session (the Coordinator's), sent by the worker.
    r = await refusal(worker.membership.PublishAgentCard(request(w.coordinator, mine)))
    assert r.reason == R.REJECTION_REASON_SIGNATURE_INVALID
    # The worker's own, properly signed card, published by someone else.
    r = await refusal(clients["coordinator"].membership.PublishAgentCard(request(w.worker, mine)))
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED
    # Humans publish no cards, even their own.
    r = await refusal(clients["owner"].membership.PublishAgentCard(request(w.owner, card("alice", "1.0.0"))))
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED
    r = await refusal(clients["anonymous"].membership.PublishAgentCard(request(w.worker, mine)))
    assert r.reason == R.REJECTION_REASON_UNAUTHENTICATED
    unsigned = agent_card_envelope(w.worker, mine)
    del unsigned.signatures[:]
    r = await refusal(worker.membership.PublishAgentCard(mpb.PublishAgentCardRequest(card=unsigned)))
    assert r.reason == R.REJECTION_REASON_SIGNATURE_MISSING
    # A newer session fences cards signed by the older one.
    newer = await w.client.open_session("worker-bot", w.worker.key)
    worker.read_as(newer)
    r = await refusal(worker.membership.PublishAgentCard(request(w.worker, mine)))
    assert r.reason == R.REJECTION_REASON_SESSION_EPOCH_STALE
    assert await versions(worker, "worker-bot") == []
    assert (
        await worker.publish_agent_card(pb.AgentCard(card_version="1.0.0", max_concurrency=1))
    ).published.card.agent_id == "worker-bot"


def _unknown_field(number: int, size: int) -> bytes:
    """A length-delimited unknown field of ``size`` bytes (parses; counts towards the payload)."""

    def varint(value: int) -> bytes:
        out = bytearray()
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        return bytes([*out, value])

    return varint(number << 3 | 2) + varint(size) + b"x" * size


async def test_malformed_or_oversized_cards_are_refused_naming_the_field_and_nothing_is_written(
    world: World, clients: dict[str, MeshClient]
) -> None:
    w, worker = world, clients["worker"]

    def caps(n: int, version: str = "1.0.0", same: bool = False) -> list[membership_pb2.Capability]:
        return [
            membership_pb2.Capability(capability_id="cap" if same else f"cap.{i}", version=version)
            for i in range(n)
        ]

    MAL, INV, BIG = (
        R.REJECTION_REASON_MALFORMED,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        R.REJECTION_REASON_TOO_LARGE,
    )
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"card_version": "1.0"}, MAL, "card.card_version"),
        ({"card_version": "1.0.0+build.7"}, MAL, "card.card_version"),
        ({"card_version": "01.0.0"}, MAL, "card.card_version"),
        ({"max_concurrency": 0}, INV, "card.max_concurrency"),
        ({"capabilities": caps(257)}, BIG, "card.capabilities"),
        ({"capabilities": caps(2, same=True)}, MAL, "card.capabilities[1].capability_id"),
        ({"capabilities": caps(1, version="latest")}, MAL, "card.capabilities[0].version"),
        ({"extensions": [f"urn:x:{i}" for i in range(65)]}, BIG, "card.extensions"),
        ({"extensions": ["https://example.org/ext"]}, MAL, "card.extensions[0]"),
        ({"extensions": ["urn:x:a", "urn:x:a"]}, MAL, "card.extensions"),
        ({"endpoints": [f"e{i}" for i in range(17)]}, BIG, "card.endpoints"),
        ({"endpoints": ["has space"]}, MAL, "card.endpoints[0]"),
        ({"endpoints": ["e" * 513]}, BIG, "card.endpoints[0]"),
        ({"display_name": "n" * 257}, BIG, "card.display_name"),
        ({"description": "d" * 4097}, BIG, "card.description"),
        ({"agent_id": "not an id"}, MAL, "card.agent_id"),
    ]
    for fields, reason, field in cases:
        c = card("worker-bot", "1.0.0")
        c.MergeFrom(pb.AgentCard(**{k: v for k, v in fields.items() if k != "max_concurrency"}))
        if "max_concurrency" in fields:
            c.max_concurrency = fields["max_concurrency"]
        r = await refusal(worker.membership.PublishAgentCard(request(w.worker, c)))
        assert (r.reason, r.metadata.get("field")) == (reason, field), (fields, r)
    key_id = session_key_id("worker-bot", w.worker.session_epoch)
    valid = card("worker-bot", "1.0.0").SerializeToString()
    for payload, payload_type, reason, field in (
        (valid + _unknown_field(100, 64 * 1024), AGENT_CARD_TYPE, BIG, "card.payload"),
        (valid, "application/vnd.missionweave.v1.command+protobuf", MAL, "card.payload_type"),
        (b"\xff" * 11, AGENT_CARD_TYPE, MAL, "card.payload"),
    ):
        envelope = sign_envelope(payload, payload_type, w.worker.key, key_id)
        r = await refusal(worker.membership.PublishAgentCard(mpb.PublishAgentCardRequest(card=envelope)))
        assert (r.reason, r.metadata.get("field")) == (reason, field), r
        if reason == BIG:
            assert r.metadata["limit"] == str(64 * 1024)
    assert await versions(worker, "worker-bot") == []
    r = await refusal(worker.membership.GetAgentCard(mpb.GetAgentCardRequest(agent_id="worker-bot")))
    assert r.reason == R.REJECTION_REASON_NOT_FOUND
    r = await refusal(
        worker.membership.GetAgentCard(mpb.GetAgentCardRequest(agent_id="worker-bot", card_version="v1"))
    )
    assert (r.reason, r.metadata["field"]) == (MAL, "card_version")
    r = await refusal(
        worker.membership.ListAgentCardVersions(
            mpb.ListAgentCardVersionsRequest(agent_id="worker-bot", page_token="x")
        )
    )
    assert (r.reason, r.metadata["field"]) == (INV, "page_token")


# ------------------------------------------------------------------ presence


def report(agent_id: str = "worker-bot", **fields: Any) -> mpb.ReportPresenceRequest:
    fields.setdefault("availability", AVAILABLE)
    return mpb.ReportPresenceRequest(report=pb.PresenceReport(agent_id=agent_id, **fields))


@pytest.mark.req("MW-11.1-14")
async def test_presence_reports_capacity_within_the_card_and_goes_stale_by_the_server_clock(
    world: World, clients: dict[str, MeshClient]
) -> None:
    w, worker, reader = world, clients["worker"], clients["coordinator"]
    r = await refusal(worker.membership.ReportPresence(report(free_slots=1)))
    assert r.reason == R.REJECTION_REASON_PRECONDITION_FAILED  # no card declares its capacity yet
    await worker.publish_agent_card(pb.AgentCard(card_version="1.0.0", max_concurrency=4))

    fresh = await worker.report_presence(AVAILABLE, free_slots=3, in_use_slots=1, note="warm", ttl_ms=5_000)
    assert (fresh.fresh, fresh.availability, fresh.max_concurrency, fresh.card_version) == (
        True,
        AVAILABLE,
        4,
        "1.0.0",
    )
    assert fresh.expires_at.ToMicroseconds() - fresh.reported_at.ToMicroseconds() == 5_000_000
    [seen] = await reader.presence("worker-bot", "coord-bot", "worker-bot", "nobody-bot")
    assert (seen.agent_id, seen.fresh, seen.free_slots, seen.in_use_slots, seen.note) == (
        "worker-bot",
        True,
        3,
        1,
        "warm",
    )

    w.clock.advance(seconds=6)
    [stale] = await reader.presence("worker-bot")
    assert not stale.fresh and stale.availability == pb.PRESENCE_AVAILABILITY_UNKNOWN
    assert stale.reported_availability == AVAILABLE and stale.free_slots == 3

    # Over the card's max concurrency, or outside the bounds: refused, the last report stays.
    r = await refusal(worker.membership.ReportPresence(report(free_slots=4, in_use_slots=1)))
    assert (r.reason, r.metadata["field"], r.metadata["limit"]) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        "report.free_slots",
        "4",
    )
    for bad, reason, field in (
        ({"ttl_ms": 999}, R.REJECTION_REASON_INVALID_ARGUMENT, "report.ttl_ms"),
        ({"ttl_ms": 600_001}, R.REJECTION_REASON_INVALID_ARGUMENT, "report.ttl_ms"),
        (
            {"availability": pb.PRESENCE_AVAILABILITY_UNKNOWN},
            R.REJECTION_REASON_MALFORMED,
            "report.availability",
        ),
        (
            {"availability": pb.PRESENCE_AVAILABILITY_UNSPECIFIED},
            R.REJECTION_REASON_MALFORMED,
            "report.availability",
        ),
        ({"note": "n" * 513}, R.REJECTION_REASON_TOO_LARGE, "report.note"),
    ):
        r = await refusal(worker.membership.ReportPresence(report(free_slots=1, **bad)))
        assert (r.reason, r.metadata["field"]) == (reason, field), (bad, r)
    assert (await reader.presence("worker-bot"))[0] == stale

    # The default ttl is 60 s.
    busy = await worker.report_presence(pb.PRESENCE_AVAILABILITY_BUSY, free_slots=0, in_use_slots=4)
    assert busy.fresh and busy.expires_at.ToMicroseconds() - busy.reported_at.ToMicroseconds() == 60_000_000
    w.clock.advance(seconds=59)
    assert (await reader.presence("worker-bot"))[0].availability == pb.PRESENCE_AVAILABILITY_BUSY
    w.clock.advance(seconds=2)
    assert not (await reader.presence("worker-bot"))[0].fresh

    # The card in force bounds the next report.
    await worker.publish_agent_card(pb.AgentCard(card_version="1.1.0", max_concurrency=2))
    r = await refusal(worker.membership.ReportPresence(report(free_slots=3)))
    assert (r.reason, r.metadata["limit"], r.metadata["card_version"]) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        "2",
        "1.1.0",
    )


@pytest.mark.req("MW-11.1-14")
async def test_only_the_agent_reports_its_presence(world: World, clients: dict[str, MeshClient]) -> None:
    worker = clients["worker"]
    await worker.publish_agent_card(pb.AgentCard(card_version="1.0.0", max_concurrency=1))
    r = await refusal(clients["coordinator"].membership.ReportPresence(report(free_slots=1)))
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED
    r = await refusal(clients["owner"].membership.ReportPresence(report("alice", free_slots=1)))
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED  # a human has no card, no slots
    r = await refusal(clients["anonymous"].membership.ReportPresence(report(free_slots=1)))
    assert r.reason == R.REJECTION_REASON_UNAUTHENTICATED
    r = await refusal(
        clients["anonymous"].membership.GetPresence(mpb.GetPresenceRequest(agent_ids=["worker-bot"]))
    )
    assert r.reason == R.REJECTION_REASON_UNAUTHENTICATED
    assert await clients["owner"].presence("worker-bot") == []
    await worker.report_presence(AVAILABLE, free_slots=1)
    await clients["coordinator"].publish_agent_card(pb.AgentCard(card_version="1.0.0", max_concurrency=2))
    await clients["coordinator"].report_presence(
        pb.PRESENCE_AVAILABILITY_DRAINING, free_slots=0, in_use_slots=2
    )
    for order in (["worker-bot", "coord-bot"], ["coord-bot", "nobody-bot", "worker-bot"]):
        answered = await clients["owner"].presence(*order)
        assert [p.agent_id for p in answered] == [a for a in order if a != "nobody-bot"]  # in the order asked
    r = await refusal(clients["owner"].membership.GetPresence(mpb.GetPresenceRequest()))
    assert (r.reason, r.metadata["field"]) == (R.REJECTION_REASON_MALFORMED, "agent_ids")
    r = await refusal(clients["owner"].presence(*(f"a{i}" for i in range(257))))
    assert (r.reason, r.metadata["limit"]) == (R.REJECTION_REASON_TOO_LARGE, "256")


# ------------------------------------------------------------------ the internal contract


def membership_address(w: World) -> str:
    peers = getattr(w.mesh, "peer_addresses", None)
    return str(peers["membership"]) if peers else w.target


@pytest.mark.req("MW-11.1-13")
async def test_get_agent_cards_answers_the_card_in_force_to_mesh_services_only(
    world: World, clients: dict[str, MeshClient]
) -> None:
    w = world
    await clients["worker"].publish_agent_card(pb.AgentCard(card_version="1.0.0", max_concurrency=1))
    await clients["worker"].publish_agent_card(pb.AgentCard(card_version="1.1.0", max_concurrency=3))
    await clients["coordinator"].publish_agent_card(pb.AgentCard(card_version="0.1.0", max_concurrency=1))
    address = membership_address(w)
    token = w.settings.mesh_token_path.read_bytes().strip().decode()
    method = "/missionweave.internal.v1.IdentityDirectoryService/GetAgentCards"
    asked = identities_pb2.GetAgentCardsRequest(
        agent_ids=["worker-bot", "coord-bot", "alice", "nobody-bot", "worker-bot"]
    )
    async with open_channel(address) as channel:
        stub = identities_pb2_grpc.IdentityDirectoryServiceStub(channel)
        answer = await stub.GetAgentCards(asked, metadata=((MESH_TOKEN_METADATA, token),))
        in_force = {c.card.agent_id: verify_agent_card(c) for c in answer.cards}
        assert {a: c.card_version for a, c in in_force.items()} == {
            "worker-bot": "1.1.0",
            "coord-bot": "0.1.0",
        }
        assert in_force["worker-bot"].max_concurrency == 3
        for metadata in (
            (),
            ((CALL_PROOF_METADATA, call_proof(w.worker, method, address)),),
            ((MESH_TOKEN_METADATA, "0" * 64),),
        ):
            r = await refusal(stub.GetAgentCards(asked, metadata=metadata))
            assert r.reason == R.REJECTION_REASON_UNAUTHENTICATED
        many = identities_pb2.GetAgentCardsRequest(agent_ids=[f"a{i}" for i in range(1025)])
        r = await refusal(stub.GetAgentCards(many, metadata=((MESH_TOKEN_METADATA, token),)))
        assert (r.reason, r.metadata["limit"]) == (R.REJECTION_REASON_TOO_LARGE, "1024")


async def test_a_mesh_service_publishes_for_an_agent_only_what_the_agent_signed(
    world: World, clients: dict[str, MeshClient]
) -> None:
    """A service of the mesh acts for the agent it names (docs/agent-cards.md); the signature still rules."""
    w = world
    token = ((MESH_TOKEN_METADATA, w.settings.mesh_token_path.read_bytes().strip().decode()),)
    async with open_channel(membership_address(w)) as channel:
        stub = mpb_grpc.MembershipServiceStub(channel)
        forged = SessionSigner("worker-bot", w.worker.session_epoch, SigningKey.generate())
        r = await refusal(stub.PublishAgentCard(request(forged, card("worker-bot", "1.0.0")), metadata=token))
        assert r.reason == R.REJECTION_REASON_SIGNATURE_INVALID
        published = await stub.PublishAgentCard(
            request(w.worker, card("worker-bot", "1.0.0")), metadata=token
        )
        assert not published.replayed and published.published.card.agent_id == "worker-bot"
        presence = await stub.ReportPresence(report(free_slots=2), metadata=token)
        assert presence.presence.fresh
    assert await versions(clients["owner"], "worker-bot") == ["1.0.0"]


# ------------------------------------------------------------------ the card in force at offer and acceptance


@pytest.mark.req("MW-11.1-13")
async def test_offers_and_acceptance_check_the_card_in_force(
    world: World, clients: dict[str, MeshClient]
) -> None:
    """A candidate whose card in force lacks a required capability (or declares it too old) is not
    offered the work; the acceptance records the card version it was checked against."""
    from tests.test_work_items import setup

    w, worker = world, clients["worker"]
    flow = await setup(w)
    python = membership_pb2.Capability(capability_id="code.python", version="3.11")
    await flow.authorize("wi-1", required_capabilities=[python])
    # The Membership grants the capability; the worker's card says it has only 3.10.
    grant = membership_pb2.MembershipGrant(
        member_id="worker-bot",
        role=membership_pb2.MEMBER_ROLE_WORKER,
        capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.12")],
    )
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    old = membership_pb2.Capability(capability_id="code.python", version="3.10.0")
    await worker.membership.PublishAgentCard(
        request(w.worker, card("worker-bot", "1.0.0", capabilities=[old]))
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await flow.offer("wi-1", "worker-bot")
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_PRECONDITION_FAILED
    assert rejection.metadata["card_version"] == "1.0.0" and rejection.metadata["capability"] == "code.python"
    # A new card version takes effect on the next decision.
    new = membership_pb2.Capability(capability_id="code.python", version="3.12.1")
    await worker.membership.PublishAgentCard(
        request(w.worker, card("worker-bot", "1.1.0", capabilities=[new]))
    )
    offer_id = await flow.offer("wi-1", "worker-bot")
    body = work_pb2.WorkAcceptOffer(work_item_id="wi-1", offer_id=offer_id, contract_revision=1)
    # The card changes between offer and acceptance: acceptance checks the one in force then.
    await worker.membership.PublishAgentCard(
        request(w.worker, card("worker-bot", "1.2.0", capabilities=[old]))
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await flow.as_(w.worker, "work_accept_offer", body)
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.metadata["card_version"] == "1.2.0"
    await worker.membership.PublishAgentCard(
        request(w.worker, card("worker-bot", "1.3.0", capabilities=[new]))
    )
    accepted = await flow.as_(w.worker, "work_accept_offer", body)
    assert decode_events(accepted.events)[0].work_offer_accepted.agent_card_version == "1.3.0"
