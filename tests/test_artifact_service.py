"""ArtifactService over gRPC (spec 13.1): verified uploads and downloads, manifests, provenance, and
publication into a Group under the current lease."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import grpc
import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.manifest import sign_manifest
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import session_key_id
from missionweave.sdk.client import SessionSigner, blob_digest, decode_events
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.artifacts.blobstore import EMPTY_BLAKE3
from missionweave_server.services.artifacts.verify import Counters
from tests.conftest import World
from tests.test_missions import G, refused
from tests.test_work_items import setup, started

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

R = common_pb2.RejectionReason
MiB = 1024 * 1024


def reason(err: grpc.aio.AioRpcError) -> tuple[str, str]:
    rejection = rejection_from_rpc_error(err)
    assert rejection is not None, err
    return R.Name(rejection.reason), rejection.metadata.get("artifact_error", "")


async def raw_upload(w: World, digest: common_pb2.Digest, chunks: list[tuple[int, bytes]]) -> Any:
    async def requests() -> Any:
        yield apb.UploadRequest(header=apb.UploadHeader(digest=digest))
        for offset, data in chunks:
            yield apb.UploadRequest(chunk=apb.UploadChunk(offset=offset, data=data))

    return await w.client.artifacts.Upload(requests())


async def missing(w: World, digest: common_pb2.Digest) -> bool:
    found = await w.client.artifacts.FindMissing(apb.FindMissingRequest(digests=[digest]))
    return len(found.missing_digests) == 1


def manifest_for(
    w: World,
    signer: SessionSigner,
    data: bytes,
    *,
    work_item_id: str = "wi-1",
    sources: tuple[common_pb2.Digest, ...] = (),
) -> common_pb2.SignedEnvelope:
    digest = blob_digest(data)
    manifest = apb.ArtifactManifest(
        content_digest=digest,
        media_type="text/csv",
        producer_agent_id=signer.identity_id,
        agent_card_version="1.0.0",
        mission_id="mis_lifecycle",
        group_id=G,
        work_item_id=work_item_id,
        source_artifacts=list(sources),
        created_at=to_timestamp(w.clock.now()),
        classification=apb.DATA_CLASSIFICATION_INTERNAL,
        size_bytes=len(data),
        retrieval_uri="s3://bucket/anything-mutable",
        schema=apb.ArtifactSchema(schema_id="none"),
        components=[apb.ComponentVersion(kind=apb.COMPONENT_KIND_TOOL, name="pandas", version="2.2.3")],
    )
    sha = hashlib.sha256(data).hexdigest()
    return sign_manifest(manifest, sha, signer.key, session_key_id(signer.identity_id, signer.session_epoch))


@pytest.mark.req("MW-13.1-01", "MW-13.1-05")
async def test_round_trip_ranges_stat_find_missing_and_the_empty_blob(world: World) -> None:
    w = world
    data = os.urandom(2 * MiB + 12345)
    digest = blob_digest(data)
    assert await missing(w, digest)
    first = await w.client.upload(data)
    assert first.digest == digest and not first.already_existed
    assert (await w.client.upload(data)).already_existed  # idempotent
    assert await w.client.download(digest) == data
    assert await w.client.download(digest, offset=MiB - 5, length=MiB + 10) == data[MiB - 5 : 2 * MiB + 5]
    stat = await w.client.artifacts.Stat(apb.StatRequest(digest=digest))
    assert stat.digest == digest and stat.HasField("stored_at")
    empty = common_pb2.Digest(algorithm="blake3", hex=EMPTY_BLAKE3, size_bytes=0)
    assert not await missing(w, empty) and await w.client.download(empty) == b""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await w.client.download(digest, offset=len(data) + 1)
    assert reason(info.value)[1] == "ARTIFACT_ERROR_CODE_RANGE_NOT_SATISFIABLE"


async def test_bad_uploads_are_refused_and_leave_nothing_visible(world: World) -> None:
    """Declared hash or size not matching, cut off mid-stream, chunks beyond the size or out of order,
    path-like digests: each a structured error, nothing stored."""
    w = world
    data = os.urandom(300_000)
    good = blob_digest(data)
    wrong_hash = common_pb2.Digest(algorithm="blake3", hex="ab" * 32, size_bytes=len(data))
    cases = [
        (wrong_hash, [(0, data)], "ARTIFACT_ERROR_CODE_DIGEST_MISMATCH"),
        (good, [(0, data[:1000])], "ARTIFACT_ERROR_CODE_INCOMPLETE_UPLOAD"),
        (good, [(0, data), (len(data), b"x")], "ARTIFACT_ERROR_CODE_CHUNK_OUT_OF_RANGE"),
        (good, [(10, data)], "ARTIFACT_ERROR_CODE_CHUNK_OUT_OF_RANGE"),
        (
            common_pb2.Digest(algorithm="blake3", hex="../../etc/passwd", size_bytes=3),
            [],
            "ARTIFACT_ERROR_CODE_MALFORMED_DIGEST",
        ),
        (
            common_pb2.Digest(algorithm="sha1", hex="ab" * 32, size_bytes=3),
            [],
            "ARTIFACT_ERROR_CODE_MALFORMED_DIGEST",
        ),
    ]
    for digest, chunks, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await raw_upload(w, digest, chunks)
        assert reason(info.value)[1] == code, (code, info.value.details())
    assert await missing(w, good) and await missing(w, wrong_hash)
    leftovers = list((w.settings.data_dir / "blobs").rglob("*"))
    assert not [p for p in leftovers if p.is_file()], leftovers


@pytest.mark.req("MW-13.1-05")
async def test_a_blob_altered_at_rest_never_reaches_a_client_whole(world: World) -> None:
    w = world
    data = os.urandom(3 * MiB)
    digest = blob_digest(data)
    await w.client.upload(data)
    path = w.mesh.blobstore.path_for(digest.hex)  # type: ignore[attr-defined]
    tampered = bytearray(path.read_bytes())
    tampered[-1] ^= 0xFF  # flip one bit in the last chunk
    path.write_bytes(bytes(tampered))
    before = Counters.corrupted_reads
    received = bytearray()
    call = w.client.artifacts.Download(apb.DownloadRequest(digest=digest))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for piece in call:
            received.extend(piece.data)
    assert info.value.code() == grpc.StatusCode.DATA_LOSS
    assert reason(info.value) == ("REJECTION_REASON_DATA_CORRUPTED", "ARTIFACT_ERROR_CODE_CORRUPTED")
    assert (
        len(received) < len(data) and bytes(received) == data[: len(received)]
    )  # the tampered tail was held back
    assert Counters.corrupted_reads == before + 1


@pytest.mark.req("MW-13.1-03", "MW-13.1-06")
async def test_manifests_are_signed_by_the_producer_and_form_the_provenance_graph(world: World) -> None:
    w = world
    raw = b"id,amount\n1,10\n"
    derived = b"total\n10\n"
    raw_up = await w.client.upload(raw, manifest_for(w, w.worker, raw))
    assert raw_up.manifest_digest.hex
    derived_manifest = manifest_for(w, w.worker, derived, sources=(blob_digest(raw),))
    await w.client.upload(derived, derived_manifest)
    got = await w.client.artifacts.GetManifest(apb.GetManifestRequest(digest=blob_digest(derived)))
    assert list(got.manifests) == [derived_manifest]
    up = await w.client.artifacts.QueryProvenance(
        apb.QueryProvenanceRequest(
            digest=blob_digest(derived), direction=apb.PROVENANCE_DIRECTION_ANCESTORS, max_depth=4
        )
    )
    assert [n.digest.hex for n in up.nodes] == [blob_digest(derived).hex, blob_digest(raw).hex]
    assert [(n.depth, n.is_ancestor) for n in up.nodes] == [(0, False), (1, True)]
    down = await w.client.artifacts.QueryProvenance(
        apb.QueryProvenanceRequest(
            digest=blob_digest(raw), direction=apb.PROVENANCE_DIRECTION_DESCENDANTS, max_depth=4
        )
    )
    assert [n.digest.hex for n in down.nodes] == [
        blob_digest(raw).hex,
        blob_digest(derived).hex,
    ] and down.nodes[1].producer_agent_id == "worker-bot"
    # A manifest naming one producer but signed by another is refused, and the blob is not stored.
    forged = manifest_for(w, w.coordinator, b"forged", work_item_id="wi-1")
    forged.signatures[0].key_id = session_key_id("worker-bot", w.worker.session_epoch)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await w.client.upload(b"forged", forged)
    assert reason(info.value) == (
        "REJECTION_REASON_SIGNATURE_INVALID",
        "ARTIFACT_ERROR_CODE_MANIFEST_SIGNATURE_INVALID",
    )
    assert await missing(w, blob_digest(b"forged"))


@pytest.mark.req("MW-11.3-04", "MW-13.1-02")
async def test_publication_cites_the_current_lease_and_logs_only_the_reference(world: World) -> None:
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    data = b"reconciled ledger " * 1000
    envelope = manifest_for(w, w.worker, data)
    ref = common_pb2.ArtifactRef(digest=blob_digest(data), media_type="text/csv")
    publish = wp.WorkPublishArtifact(
        work_item_id="wi-1", lease_id="lease-1", ownership_epoch=epoch, artifact=ref, deliverable_id="report"
    )
    await refused(
        w, w.worker, G, "work_publish_artifact", publish, R.REJECTION_REASON_NOT_FOUND, membership_epoch=3
    )  # not uploaded
    await w.client.upload(data, envelope)
    stale = wp.WorkPublishArtifact(
        work_item_id="wi-1", lease_id="lease-0", ownership_epoch=epoch, artifact=ref
    )
    await refused(
        w, w.worker, G, "work_publish_artifact", stale, R.REJECTION_REASON_LEASE_STALE, membership_epoch=3
    )
    result = await f.as_(w.worker, "work_publish_artifact", publish)
    event = decode_events(result.events)[0]
    assert event.type == "artifact.published"
    assert (
        event.artifact_published.manifest_digest.hex
        == (await w.client.upload(data, envelope)).manifest_digest.hex
    )
    assert data not in result.events[0].payload  # MW-13.1-02: no blob bytes in the log
