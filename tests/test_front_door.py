"""One address for agents and people (issue 12, item 3): a process serving only the gateway routes
every other public service to the peer serving it, bytes, statuses and trailers unchanged."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from missionweave.internal.v1 import publications_pb2 as ppb
from missionweave.internal.v1.publications_pb2_grpc import PublicationServiceStub
from missionweave.kernel.clock import OffsetClock
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient, blob_digest
from missionweave.v1 import common_pb2
from missionweave_server.config import Settings
from tests import builders
from tests.conftest import register
from tests.split_mesh import free_port

R = common_pb2.RejectionReason


@pytest.fixture
async def split(db_url: str, tmp_path: Path) -> AsyncIterator[tuple[object, object, MeshClient]]:
    """Authority, Membership, Artifacts and Scheduling in one process; the gateway alone in another,
    configured with their address; the client knows only the gateway's address."""
    from missionweave_server.mesh.server import start

    data = tmp_path / "data"
    front_port = free_port()  # the back services accept call proofs made for the front door
    back = Settings(
        listen="127.0.0.1:0",
        data_dir=data,
        database_url=db_url,
        grace_seconds=1,
        services=("authority", "membership", "artifacts", "scheduling"),
        audience=f"127.0.0.1:{front_port}",
    )
    back_mesh = await start(back, OffsetClock())
    address = f"127.0.0.1:{back_mesh.port}"
    front = Settings(
        listen=f"127.0.0.1:{front_port}",
        data_dir=data,
        database_url=db_url,
        grace_seconds=1,
        services=("gateway",),
        peers={"authority": address, "membership": address, "artifacts": address, "scheduling": address},
    )
    front_mesh = await start(front, OffsetClock())
    client = MeshClient(f"127.0.0.1:{front_mesh.port}")
    try:
        yield back_mesh, front_mesh, client
    finally:
        await client.channel.close()
        await front_mesh.stop(grace=1)  # type: ignore[attr-defined]
        await back_mesh.stop(grace=1)  # type: ignore[attr-defined]


async def test_every_public_service_answers_at_the_gateways_address(
    split: tuple[object, object, MeshClient],
) -> None:
    back, _front, client = split
    admin_key = read_key(back.settings.admin_key_path)  # type: ignore[attr-defined]
    owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)  # MembershipService
    await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
    now = back.authority.clock.now()  # type: ignore[attr-defined]
    await client.execute(
        owner.sign(
            owner.command("grp_front", "mission_create", builders.mission_create("alice", "coord-bot", now))
        )
    )
    state = await client.group_state("grp_front")  # AuthorityService
    assert state.group_id == "grp_front" and state.head_sequence >= 1
    # A rejection arrives with its structured Rejection, as from the Authority itself.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.group_state("grp_missing")
    rejection = rejection_from_rpc_error(info.value)
    assert (
        rejection is not None and rejection.reason == R.REJECTION_REASON_NOT_A_MEMBER
    )  # no existence oracle
    # A server stream through the door, then a client stream (an upload the store refuses).
    sequences = [e.sequence async for e in client.read_events("grp_front")]
    assert sequences[:1] == [1]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.upload(b"no manifest", common_pb2.SignedEnvelope())
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None, info.value  # the ArtifactService's own structured refusal
    health = health_pb2_grpc.HealthStub(client.channel)
    for service in (
        "missionweave.v1.AuthorityService",
        "missionweave.v1.MembershipService",
        "missionweave.v1.ArtifactService",
    ):
        deadline = time.monotonic() + 5
        while (
            await health.Check(health_pb2.HealthCheckRequest(service=service))
        ).status != health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline, service
            await asyncio.sleep(0.05)


async def test_internal_contracts_are_not_reachable_through_the_front_door(
    split: tuple[object, object, MeshClient],
) -> None:
    _, _, client = split
    stub = PublicationServiceStub(client.channel)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.FindPublication(ppb.FindPublicationRequest(content_digest_hex=blob_digest(b"x").hex))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_peer_that_is_down_is_answered_peer_unavailable_in_bounded_time(
    split: tuple[object, object, MeshClient],
) -> None:
    back, _front, client = split
    await back.stop(grace=0)  # type: ignore[attr-defined]
    began = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.group_state("grp_front")
    assert time.monotonic() - began < 35
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_PEER_UNAVAILABLE
    assert rejection.metadata["peer"] == "authority"
    health = health_pb2_grpc.HealthStub(client.channel)
    deadline = time.monotonic() + 5
    while (
        await health.Check(health_pb2.HealthCheckRequest(service="missionweave.v1.AuthorityService"))
    ).status != (health_pb2.HealthCheckResponse.NOT_SERVING):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_the_first_call_after_a_peer_comes_up_waits_for_its_connection(
    db_url: str, tmp_path: Path
) -> None:
    """The gateway starts before its peers (a rolling restart, or a split mesh starting out of order):
    a call while nothing listens is refused PEER_UNAVAILABLE, and the first call once the peer listens
    is answered, not refused while the channel is still in its reconnect backoff."""
    from missionweave_server.mesh.server import start

    data = tmp_path / "data"
    front_port, back_port = free_port(), free_port()
    address = f"127.0.0.1:{back_port}"
    front = Settings(
        listen=f"127.0.0.1:{front_port}",
        data_dir=data,
        database_url=db_url,
        grace_seconds=1,
        services=("gateway",),
        peers={"authority": address, "membership": address, "artifacts": address, "scheduling": address},
    )
    front_mesh = await start(front, OffsetClock())
    client = MeshClient(f"127.0.0.1:{front_port}")
    back_mesh = None
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.authority_key()
        rejection = rejection_from_rpc_error(info.value)
        assert rejection is not None and rejection.reason == R.REJECTION_REASON_PEER_UNAVAILABLE
        await asyncio.sleep(1.5)  # the channel keeps failing to connect: its reconnect backoff grows
        back = Settings(
            listen=address,
            data_dir=data,
            database_url=db_url,
            grace_seconds=1,
            services=("authority", "membership", "artifacts", "scheduling"),
            audience=f"127.0.0.1:{front_port}",
        )
        back_mesh = await start(back, OffsetClock())
        key_id, _ = await client.authority_key()
        assert key_id
    finally:
        await client.channel.close()
        await front_mesh.stop(grace=1)  # type: ignore[attr-defined]
        if back_mesh is not None:
            await back_mesh.stop(grace=1)  # type: ignore[attr-defined]
