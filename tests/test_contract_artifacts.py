"""Contract truth (issue 17 item 7) of artifact_service.proto, through the public gRPC API: what
its comments promise about limits, error codes, defaults and orderings that the neighbouring
modules (test_artifact_service.py, test_artifact_authorization.py) do not already prove."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable

import pytest

from missionweave.sdk.client import blob_digest
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2
from missionweave_server.services.artifacts.blobstore import EMPTY_BLAKE3
from tests.conftest import World
from tests.test_artifact_authorization import refusal, refused_with
from tests.test_artifact_service import manifest_for

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

MiB = 1024 * 1024
DIR = apb.ProvenanceDirection


def upload(w: World, *messages: apb.UploadRequest) -> Awaitable[apb.UploadResponse]:
    """An upload stream of exactly ``messages``, sent at once."""

    async def requests() -> AsyncIterator[apb.UploadRequest]:
        for message in messages:
            yield message

    return w.client.artifacts.Upload(requests())  # type: ignore[no-any-return]


def header(digest: common_pb2.Digest, manifest: common_pb2.SignedEnvelope | None = None) -> apb.UploadRequest:
    return apb.UploadRequest(header=apb.UploadHeader(digest=digest, manifest=manifest))


def chunk(offset: int, data: bytes) -> apb.UploadRequest:
    return apb.UploadRequest(chunk=apb.UploadChunk(offset=offset, data=data))


async def chain(w: World, length: int) -> list[common_pb2.Digest]:
    """``length`` blobs, each derived from the one before (its manifest names it as a source)."""
    digests: list[common_pb2.Digest] = []
    for i in range(length):
        data = f"step {i}\n".encode()
        await w.client.upload(data, manifest_for(w, w.worker, data, sources=tuple(digests[-1:])))
        digests.append(blob_digest(data))
    return digests


def provenance(w: World, digest: common_pb2.Digest, **fields: int) -> Awaitable[apb.QueryProvenanceResponse]:
    return w.client.artifacts.QueryProvenance(apb.QueryProvenanceRequest(digest=digest, **fields))  # type: ignore[no-any-return, arg-type]


async def test_provenance_starts_with_the_start_node_and_its_own_manifest(world: World) -> None:
    """artifact_service.proto: QueryProvenanceResponse.nodes ("the start first (depth 0), then by
    increasing depth"), ProvenanceNode.depth / is_ancestor / manifest_digest, and
    QueryProvenanceRequest.direction ("UNSPECIFIED walks both ways")."""
    w = world
    raw, mid, top = b"raw\n", b"mid\n", b"top\n"
    manifests = {}
    for data, sources in ((raw, ()), (mid, (blob_digest(raw),)), (top, (blob_digest(mid),))):
        manifests[data] = (
            await w.client.upload(data, manifest_for(w, w.worker, data, sources=sources))
        ).manifest_digest
    graph = await provenance(w, blob_digest(mid))  # direction unset: both ways
    facts = [(n.digest.hex, n.depth, n.is_ancestor) for n in graph.nodes]
    assert facts[0] == (blob_digest(mid).hex, 0, False)
    assert sorted(facts[1:]) == sorted([(blob_digest(raw).hex, 1, True), (blob_digest(top).hex, 1, False)])
    by_hex = {blob_digest(data).hex: data for data in manifests}
    for node in graph.nodes:
        data = by_hex[node.digest.hex]
        assert node.manifest_digest == manifests[data]  # the node's own manifest, as the upload answered it
        assert (node.media_type, node.producer_agent_id, node.work_item_id) == (
            "text/csv",
            "worker-bot",
            "wi-1",
        )
        assert node.digest.size_bytes == len(data)
    assert {(e.source.hex, e.derived.hex) for e in graph.edges} == {
        (blob_digest(raw).hex, blob_digest(mid).hex),
        (blob_digest(mid).hex, blob_digest(top).hex),
    }
    both = await provenance(w, blob_digest(mid), direction=DIR.PROVENANCE_DIRECTION_BOTH)
    assert both == graph
    # A blob stored without a manifest: its node is there, with nothing from a manifest.
    await w.client.upload(b"bare\n")
    [bare] = (await provenance(w, blob_digest(b"bare\n"))).nodes
    assert bare.depth == 0 and not bare.HasField("manifest_digest") and not bare.media_type


async def test_provenance_depth_defaults_to_8_and_is_at_most_32(world: World) -> None:
    """artifact_service.proto: QueryProvenanceRequest.max_depth ("1..32, 0 means 8; over 32:
    INVALID_ARGUMENT, artifact error PROTOCOL_VIOLATION, metadata field max_depth, limit")."""
    w = world
    steps = await chain(w, 10)
    down = DIR.PROVENANCE_DIRECTION_DESCENDANTS
    default = await provenance(w, steps[0], direction=down)
    assert [n.depth for n in default.nodes] == list(range(9)) and not default.truncated
    assert [n.digest.hex for n in default.nodes] == [d.hex for d in steps[:9]]
    assert [n.depth for n in (await provenance(w, steps[0], direction=down, max_depth=1)).nodes] == [0, 1]
    assert len((await provenance(w, steps[0], direction=down, max_depth=32)).nodes) == 10
    rejection = await refused_with(provenance(w, steps[0], direction=down, max_depth=33))
    assert (
        rejection.metadata["artifact_error"],
        rejection.metadata["field"],
        rejection.metadata["limit"],
    ) == ("ARTIFACT_ERROR_CODE_PROTOCOL_VIOLATION", "max_depth", "32")
    code, reason, _ = await refusal(provenance(w, steps[0], max_depth=33))
    assert (code, reason) == ("INVALID_ARGUMENT", "REJECTION_REASON_INVALID_ARGUMENT")


async def test_get_manifest_lists_every_manifest_in_a_stable_order_and_filters(world: World) -> None:
    """artifact_service.proto: GetManifestResponse ("the same bytes may have several manifests",
    listed "in a stable order (by manifest digest)"), GetManifestRequest.work_item_id and
    producer_agent_id filters, StatResponse.manifest_count ("as GetManifest")."""
    w = world
    data = b"shared bytes\n"
    mine = [manifest_for(w, w.worker, data, work_item_id=f"wi-{i}") for i in range(4)]
    for envelope in mine:
        await w.client.upload(data, envelope)
    theirs = manifest_for(w, w.coordinator, data, work_item_id="wi-1")
    await w.client.upload(data, theirs)
    digest = blob_digest(data)

    async def listed(**filters: str) -> list[common_pb2.SignedEnvelope]:
        return list(
            (await w.client.artifacts.GetManifest(apb.GetManifestRequest(digest=digest, **filters))).manifests
        )

    everything = await listed()
    refs = [(await w.client.upload(data, e)).manifest_digest.hex for e in everything]
    assert len(everything) == 5 and refs == sorted(refs)
    assert await listed() == everything  # the same order on every call
    assert await listed(work_item_id="wi-1") == [e for e in everything if e in (mine[1], theirs)]
    assert await listed(producer_agent_id="coord-bot") == [theirs]
    assert await listed(work_item_id="wi-2", producer_agent_id="worker-bot") == [mine[2]]
    assert (await w.client.artifacts.Stat(apb.StatRequest(digest=digest))).manifest_count == 5


async def test_upload_limits_and_protocol_errors(world: World) -> None:
    """artifact_service.proto: ArtifactErrorCode TOO_LARGE (a chunk over 1 MiB, a digest over
    4 GiB with `limit`, a manifest envelope over 64 KiB: RESOURCE_EXHAUSTED), PROTOCOL_VIOLATION
    (no header first, or a second header: INVALID_ARGUMENT), MALFORMED_DIGEST; nothing is stored."""
    w = world
    big = os.urandom(MiB + 1)
    small = b"small\n"
    over = common_pb2.Digest(algorithm="blake3", hex="ab" * 32, size_bytes=4 * 1024**3 + 1)
    oversized_manifest = common_pb2.SignedEnvelope(
        payload=b"x" * (64 * 1024), payload_type="application/vnd.in-toto+json"
    )
    cases = [
        ((header(blob_digest(big)), chunk(0, big)), "RESOURCE_EXHAUSTED", "TOO_LARGE"),
        ((header(over),), "RESOURCE_EXHAUSTED", "TOO_LARGE"),
        (
            (header(blob_digest(small), oversized_manifest), chunk(0, small)),
            "RESOURCE_EXHAUSTED",
            "TOO_LARGE",
        ),
        ((chunk(0, small),), "INVALID_ARGUMENT", "PROTOCOL_VIOLATION"),
        ((header(blob_digest(small)), header(blob_digest(small))), "INVALID_ARGUMENT", "PROTOCOL_VIOLATION"),
        (
            (header(common_pb2.Digest(algorithm="blake3", hex="AB" * 32, size_bytes=6)),),
            "INVALID_ARGUMENT",
            "MALFORMED_DIGEST",
        ),
    ]
    for messages, code, error in cases:
        got = await refusal(upload(w, *messages))
        assert (got[0], got[2]) == (code, f"ARTIFACT_ERROR_CODE_{error}"), (error, got)
    rejection = await refused_with(upload(w, header(over)))
    assert rejection.metadata["limit"] == str(4 * 1024**3)
    found = await w.client.artifacts.FindMissing(
        apb.FindMissingRequest(digests=[blob_digest(big), blob_digest(small)])
    )
    assert len(found.missing_digests) == 2
    # The declared digest comes back as the committed one.
    assert (await upload(w, header(blob_digest(small)), chunk(0, small))).digest == blob_digest(small)


async def test_find_missing_is_bounded_and_answers_in_request_order(world: World) -> None:
    """artifact_service.proto: FindMissingRequest.digests ("at most 10,000": TOO_LARGE) and
    FindMissingResponse.missing_digests ("in request order"); the empty blob "is always present"."""
    w = world
    await w.client.upload(b"present\n")
    absent = [blob_digest(f"absent {i}".encode()) for i in range(5)]
    empty = common_pb2.Digest(algorithm="blake3", hex=EMPTY_BLAKE3, size_bytes=0)
    asked = [absent[3], blob_digest(b"present\n"), absent[0], empty, absent[4], absent[1]]
    found = await w.client.artifacts.FindMissing(apb.FindMissingRequest(digests=asked))
    assert list(found.missing_digests) == [absent[3], absent[0], absent[4], absent[1]]
    at_limit = await w.client.artifacts.FindMissing(apb.FindMissingRequest(digests=[absent[0]] * 10_000))
    assert len(at_limit.missing_digests) == 10_000
    code, _, error = await refusal(
        w.client.artifacts.FindMissing(apb.FindMissingRequest(digests=[absent[0]] * 10_001))
    )
    assert (code, error) == ("RESOURCE_EXHAUSTED", "ARTIFACT_ERROR_CODE_TOO_LARGE")


async def test_download_chunks_ranges_and_stat(world: World) -> None:
    """artifact_service.proto: DownloadResponse ("at most 1 MiB", `offset` of `data`),
    DownloadRequest.length ("0 = to the end"), Stat ("NOT_FOUND if absent"), and
    StatResponse.last_verified_at ("when its hash was last re-verified", here by a whole download)."""
    w = world
    data = os.urandom(2 * MiB + 7)
    digest = blob_digest(data)
    await w.client.upload(data)
    pieces = [
        p async for p in w.client.artifacts.Download(apb.DownloadRequest(digest=digest, offset=MiB // 2))
    ]
    assert all(len(p.data) <= MiB for p in pieces) and len(pieces) >= 2
    assert [p.offset for p in pieces] == [
        MiB // 2 + sum(len(q.data) for q in pieces[:i]) for i in range(len(pieces))
    ]
    assert b"".join(p.data for p in pieces) == data[MiB // 2 :]
    before = await w.client.artifacts.Stat(apb.StatRequest(digest=digest))
    assert before.digest == digest and before.manifest_count == 0
    w.clock.advance(seconds=90)
    assert await w.client.download(digest) == data
    after = await w.client.artifacts.Stat(apb.StatRequest(digest=digest))
    assert after.stored_at == before.stored_at
    assert after.last_verified_at.ToSeconds() - before.last_verified_at.ToSeconds() >= 90
    code, reason, error = await refusal(
        w.client.artifacts.Stat(apb.StatRequest(digest=blob_digest(b"never stored")))
    )
    assert (code, reason, error) == (
        "NOT_FOUND",
        "REJECTION_REASON_NOT_FOUND",
        "ARTIFACT_ERROR_CODE_NOT_FOUND",
    )
    # The size is part of the name: the same hash with another size is not this blob.
    other_size = common_pb2.Digest(algorithm="blake3", hex=digest.hex, size_bytes=digest.size_bytes + 1)
    assert (await refusal(w.client.artifacts.Stat(apb.StatRequest(digest=other_size))))[0] == "NOT_FOUND"


async def test_the_server_answers_the_header_first(world: World) -> None:
    """artifact_service.proto: Upload ("when it wants the bytes it sends initial metadata
    mwp-upload: send ...; any other answer ends the call (a refusal, or a blob the caller may read
    already)"; UploadResponse.already_existed)."""
    w = world
    data = b"header first\n"
    call = w.client.artifacts.Upload()
    await call.write(header(blob_digest(data)))
    assert ("mwp-upload", "send") in tuple(await call.initial_metadata())
    await call.write(chunk(0, data))
    await call.done_writing()
    assert not (await call).already_existed
    again = w.client.artifacts.Upload()
    await again.write(header(blob_digest(data)))
    assert "mwp-upload" not in dict(await again.initial_metadata())
    await again.done_writing()
    assert (await again).already_existed  # answered on the header alone


async def test_a_manifest_must_describe_the_uploaded_bytes(world: World) -> None:
    """artifact_service.proto: ArtifactErrorCode MANIFEST_MISMATCH ("does not describe the uploaded
    blob (subject digest, size)": INVALID_ARGUMENT), and nothing of the upload is kept."""
    w = world
    data, other = b"these bytes\n", b"other bytes\n"
    code, _, error = await refusal(
        upload(w, header(blob_digest(data), manifest_for(w, w.worker, other)), chunk(0, data))
    )
    assert (code, error) == ("INVALID_ARGUMENT", "ARTIFACT_ERROR_CODE_MANIFEST_MISMATCH")
    found = await w.client.artifacts.FindMissing(apb.FindMissingRequest(digests=[blob_digest(data)]))
    assert list(found.missing_digests) == [blob_digest(data)]


async def test_the_node_limit_truncates_the_walk(
    world: World, topology: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """artifact_service.proto: QueryProvenanceResponse.truncated ("true when the node limit cut the
    walk short"; the limit is 10,000 nodes, lowered here)."""
    if topology.startswith("split"):
        pytest.skip("patches the in-process artifact service")
    import missionweave_server.services.artifacts.provenance as walk

    w = world
    steps = await chain(w, 5)
    down = DIR.PROVENANCE_DIRECTION_DESCENDANTS
    assert not (await provenance(w, steps[0], direction=down)).truncated
    monkeypatch.setattr(walk, "MAX_PROVENANCE_NODES", 3)
    cut = await provenance(w, steps[0], direction=down)
    assert cut.truncated and [n.digest.hex for n in cut.nodes] == [d.hex for d in steps[:3]]
