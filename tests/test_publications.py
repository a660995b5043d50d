"""The Authority asks the artifact store about a publication through the internal contract
(protos/missionweave/internal/v1/publications.proto), never through its tables (issue 12)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import grpc
import pytest

from missionweave.internal.v1 import publications_pb2 as ppb
from missionweave.internal.v1.publications_pb2_grpc import PublicationServiceStub
from missionweave.kernel.clock import OffsetClock
from missionweave.kernel.transport import open_channel
from missionweave.sdk.client import blob_digest
from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.config import Settings
from missionweave_server.edge.callers import MeshServiceChannel
from tests.conftest import World
from tests.test_artifact_service import manifest_for
from tests.test_missions import G, refused
from tests.test_work_items import setup, started

R = common_pb2.RejectionReason


def ask(w: World, **fields: str) -> ppb.FindPublicationRequest:
    base = {"group_id": G, "work_item_id": "wi-1", "publisher_id": "worker-bot"}
    return ppb.FindPublicationRequest(**{**base, **fields})


@pytest.mark.req("MW-13.1-03")
async def test_a_publication_is_found_only_for_its_group_workitem_publisher_and_manifest(
    world: World,
) -> None:
    w = world
    data = b"ledger rows " * 100
    uploaded = await w.client.upload(data, manifest_for(w, w.worker, data))
    token = w.settings.mesh_token_path.read_bytes().strip()  # an internal contract: mesh services only
    stub = PublicationServiceStub(MeshServiceChannel(open_channel(w.target), token))
    digest = blob_digest(data).hex
    found = await stub.FindPublication(ask(w, content_digest_hex=digest))
    assert found.found and found.size_bytes == len(data)
    assert found.manifest_digest_hex == uploaded.manifest_digest.hex
    cited = await stub.FindPublication(
        ask(w, content_digest_hex=digest, manifest_digest_hex=uploaded.manifest_digest.hex)
    )
    assert cited.found
    for other in (
        {"group_id": "grp_other"},
        {"work_item_id": "wi-2"},
        {"publisher_id": "coord-bot"},
        {"manifest_digest_hex": "0" * 64},
        {"content_digest_hex": blob_digest(b"never uploaded").hex},
    ):
        answer = await stub.FindPublication(ask(w, **{"content_digest_hex": digest, **other}))
        assert not answer.found, other
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.FindPublication(ask(w, content_digest_hex="XYZ"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_publishing_while_the_artifact_store_is_down_is_refused_peer_unavailable_and_writes_nothing(
    world: World,
) -> None:
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    data = b"reconciled ledger " * 100
    await w.client.upload(data, manifest_for(w, w.worker, data))
    # The Authority's peer now points at a port nobody listens on.
    dead = open_channel("127.0.0.1:9")
    w.mesh.authority.publications = PublicationServiceStub(dead)  # type: ignore[attr-defined]
    ref = common_pb2.ArtifactRef(digest=blob_digest(data), media_type="text/csv")
    publish = wp.WorkPublishArtifact(
        work_item_id="wi-1", lease_id="lease-1", ownership_epoch=epoch, artifact=ref
    )
    began = time.monotonic()
    rejection = await refused(
        w,
        w.worker,
        G,
        "work_publish_artifact",
        publish,
        R.REJECTION_REASON_PEER_UNAVAILABLE,
        membership_epoch=3,
    )
    assert time.monotonic() - began < 6  # bounded by the peer deadline, never a hang
    assert rejection.metadata["peer"] == "artifacts" and int(rejection.metadata["retry_after_ms"]) > 0
    await dead.close()


async def test_a_service_started_with_a_peer_that_does_not_answer_says_so_and_refuses_in_bounded_time(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer address nobody answers at: start-up names it, and a request needing it is refused
    PEER_UNAVAILABLE (never a hang)."""
    from missionweave_server.mesh.server import start

    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=db_url,
        grace_seconds=1,
        services=("authority", "membership"),
        peers={"artifacts": "127.0.0.1:9"},
    )
    caplog.set_level(logging.WARNING, logger="missionweave.server")
    mesh = await start(settings, OffsetClock())
    try:
        deadline = time.monotonic() + 10
        while not (warned := [r for r in caplog.records if "does not answer" in r.getMessage()]):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert warned and warned[0].peer == "artifacts" and warned[0].address == "127.0.0.1:9"  # type: ignore[attr-defined]
        assert mesh.authority.publications is not None
    finally:
        await mesh.stop(grace=1)


@pytest.mark.req("MW-13.1-03")
async def test_find_artifacts_answers_each_digest_with_only_the_producers_manifests_for_the_group(
    world: World,
) -> None:
    """publications.proto FindArtifacts: one answer per requested digest, in request order; a blob
    not stored is `stored = false`; only manifests `producer_id` signed for `group_id`; at most 64
    digests, each 64 lower-case hex digits, and group_id and producer_id required (INVALID_ARGUMENT)."""
    w = world
    f = await setup(w)
    await started(f, w)
    mine = await w.deliverable(w.worker, G, "wi-1", b"the worker's figures")
    theirs = await w.deliverable(w.coordinator, G, "wi-1", b"the coordinator's notes")
    never = blob_digest(b"never uploaded").hex
    token = w.settings.mesh_token_path.read_bytes().strip()
    stub = PublicationServiceStub(MeshServiceChannel(open_channel(w.target), token))
    asked = [mine.digest.hex, never, theirs.digest.hex, mine.digest.hex]
    found = await stub.FindArtifacts(
        ppb.FindArtifactsRequest(group_id=G, content_digests_hex=asked, producer_id="worker-bot")
    )
    assert [a.content_digest_hex for a in found.artifacts] == asked
    first, missing, other, again = found.artifacts
    assert first.stored and first.size_bytes == mine.digest.size_bytes and first == again
    [manifest] = first.manifests
    mission_id = (await w.client.group_state(G)).mission.mission_id
    assert (manifest.work_item_id, manifest.producer_id, manifest.mission_id) == (
        "wi-1",
        "worker-bot",
        mission_id,
    )
    assert not missing.stored and not missing.manifests
    assert other.stored and not other.manifests  # stored, but signed by someone else
    for _ in range(17):  # the same bytes signed again and again: at most 16 manifests are answered
        await w.deliverable(w.worker, G, "wi-1", b"the worker's figures")
    crowded = await stub.FindArtifacts(
        ppb.FindArtifactsRequest(group_id=G, content_digests_hex=[mine.digest.hex], producer_id="worker-bot")
    )
    listed = [m.manifest_digest_hex for m in crowded.artifacts[0].manifests]
    assert len(listed) == 16 and listed == sorted(listed)
    elsewhere = await stub.FindArtifacts(
        ppb.FindArtifactsRequest(
            group_id="grp_other", content_digests_hex=[mine.digest.hex], producer_id="worker-bot"
        )
    )
    assert elsewhere.artifacts[0].stored and not elsewhere.artifacts[0].manifests
    for bad in (
        ppb.FindArtifactsRequest(group_id=G, content_digests_hex=["XYZ"], producer_id="worker-bot"),
        ppb.FindArtifactsRequest(group_id=G, content_digests_hex=[never] * 65, producer_id="worker-bot"),
        ppb.FindArtifactsRequest(group_id=G, content_digests_hex=[], producer_id="worker-bot"),
        ppb.FindArtifactsRequest(group_id=G, content_digests_hex=[never]),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.FindArtifacts(bad)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
