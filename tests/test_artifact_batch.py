"""BatchUpload and BatchDownload (issue 18 item 2; protos/missionweave/v1/artifact_service.proto,
docs/artifacts-storage.md "Batches of small blobs", D128): per-blob outcomes in one call, each blob
verified, authorized, counted against the quota and made durable exactly as by Upload/Download,
nothing partial left by a refused blob, a structured refusal over the 3 MiB total, and a caller
that may not read a blob learning nothing about it (tests/test_artifact_authorization.py's rules).

Every test runs on the local disk and, when MWP_TEST_S3_ENDPOINT is set (a moto server, as
tests/test_artifact_backends.py), on S3: the mesh's blob store comes from the environment."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from sqlalchemy import func, select

from missionweave.kernel.errors import Rejected
from missionweave.kernel.uploads import MAX_BATCH_BYTES
from missionweave.sdk.client import MeshClient, blob_digest
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2
from missionweave_server.services.artifacts import local
from missionweave_server.services.artifacts.blobstore import EMPTY_BLAKE3, BlobStore
from missionweave_server.services.artifacts.local import LocalBlobStore
from missionweave_server.services.artifacts.schema import upload_reservations
from tests import test_artifact_authorization
from tests.conftest import World
from tests.test_artifact_authorization import (
    Cast,
    as_missing,
    manifest_in,
    missing,
    refused_with,
    upload_raw,
)
from tests.test_artifact_backends import S3_ENDPOINT, _s3_test_credentials, corrupt, leftovers, visible_blobs

R = common_pb2.RejectionReason
cast = test_artifact_authorization.cast  # the fixture: its callers, one client each
KiB = 1024
MiB = 1024 * KiB


@pytest.fixture(autouse=True, params=["local", "s3"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The mesh's blob store (read from the environment when the mesh starts, after this)."""
    if request.param == "s3":
        if not S3_ENDPOINT:
            pytest.skip("S3 variant needs MWP_TEST_S3_ENDPOINT (.ci/run starts moto's server and sets it)")
        _s3_test_credentials(monkeypatch)
        monkeypatch.setenv("MWP_S3_BUCKET", f"mwp-test-{uuid.uuid4().hex[:16]}")
        monkeypatch.setenv("MWP_S3_ENDPOINT", S3_ENDPOINT)
        monkeypatch.setenv("MWP_S3_CREATE_BUCKET", "1")
    yield str(request.param)


def store_of(w: World) -> BlobStore:
    return w.mesh.blobstore  # type: ignore[attr-defined, no-any-return]


def entry(data: bytes, digest: common_pb2.Digest | None = None, **kw: Any) -> apb.BatchUploadBlob:
    return apb.BatchUploadBlob(digest=digest or blob_digest(data), data=data, **kw)


def outcome(result: apb.BatchUploadResult | apb.BatchDownloadResult) -> str:
    """ "OK" or the artifact error of a blob's refusal, without its prefix."""
    if not result.HasField("rejection"):
        return "OK"
    return result.rejection.metadata["artifact_error"].removeprefix("ARTIFACT_ERROR_CODE_")


async def batch_upload(client: MeshClient, *blobs: apb.BatchUploadBlob) -> list[apb.BatchUploadResult]:
    return list((await client.artifacts.BatchUpload(apb.BatchUploadRequest(blobs=list(blobs)))).results)


async def batch_download(client: MeshClient, *digests: common_pb2.Digest) -> list[apb.BatchDownloadResult]:
    return list(
        (await client.artifacts.BatchDownload(apb.BatchDownloadRequest(digests=list(digests)))).results
    )


async def reservations(w: World) -> int:
    """Upload reservations (D119) still in the index."""
    async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
        return int(await conn.scalar(select(func.count()).select_from(upload_reservations)) or 0)


def limit_quota(w: World, quota_bytes: int) -> None:
    w.mesh.artifacts.quota_bytes = quota_bytes  # type: ignore[attr-defined]


# ------------------------------------------------------------------ uploads


async def test_each_blob_of_an_upload_batch_gets_its_own_outcome(world: World, cast: Cast) -> None:
    """ok, digest mismatch, too large, malformed digest, incomplete, a stored blob the caller may
    not read sent without its bytes (not authorized: Upload's refusal of a header alone) and over
    quota, in one call; each refusal is the Rejection the single Upload gives, and only the
    accepted blobs are stored."""
    w = world
    worker, outsider = cast["worker"], cast["outsider"]
    theirs = os.urandom(2 * KiB)
    await outsider.upload(theirs)
    ok, wrong, short, late = (os.urandom(4 * KiB) for _ in range(4))
    limit_quota(w, 3 * 4 * KiB + len(theirs))  # the worker holds nothing yet
    big = blob_digest(os.urandom(8))
    big.size_bytes = MAX_BATCH_BYTES + 1
    malformed = common_pb2.Digest(algorithm="sha256", hex="ab" * 32, size_bytes=4)
    sent = [
        entry(ok),
        entry(os.urandom(4 * KiB), blob_digest(wrong)),  # other bytes of the same size
        entry(b"x" * 8, big),
        entry(b"abcd", malformed),
        entry(short[:100], blob_digest(short)),
        entry(b"", blob_digest(theirs)),
        entry(late),  # the fourth 4 KiB the worker would hold: over its quota
    ]
    results = await batch_upload(worker, *sent)
    assert [outcome(r) for r in results] == [
        "OK",
        "DIGEST_MISMATCH",
        "TOO_LARGE",
        "MALFORMED_DIGEST",
        "INCOMPLETE_UPLOAD",
        "INCOMPLETE_UPLOAD",
        "QUOTA_EXCEEDED",
    ]
    assert results[1].rejection.reason == R.REJECTION_REASON_DIGEST_MISMATCH
    assert results[2].rejection.metadata["limit"] == str(MAX_BATCH_BYTES)
    over = results[6].rejection
    assert over.reason == R.REJECTION_REASON_QUOTA_EXCEEDED
    # Counted in request order from the blobs past their header checks (as Upload counts on the
    # header, before the bytes): the mismatched, the short and the bytes-less one took their room.
    assert (over.metadata["quota_bytes"], over.metadata["used_bytes"]) == (str(14 * KiB), str(14 * KiB))
    assert [r.digest for r in results] == [b.digest for b in sent]
    # Exactly what the single Upload answers for the same mistakes.
    single = await refused_with(upload_raw(worker, blob_digest(wrong), os.urandom(4 * KiB)))
    assert (single.reason, single.metadata["artifact_error"]) == (
        results[1].rejection.reason,
        results[1].rejection.metadata["artifact_error"],
    )
    single = await refused_with(upload_raw(worker, blob_digest(theirs), None))
    assert single == results[5].rejection
    # Only the accepted blob is there, readable by the worker; nothing else was kept.
    admin = cast["admin"]
    assert await missing(
        admin, blob_digest(ok), blob_digest(wrong), blob_digest(short), blob_digest(late)
    ) == [blob_digest(wrong).hex, blob_digest(short).hex, blob_digest(late).hex]
    assert await worker.download(blob_digest(ok)) == ok
    assert await missing(worker, blob_digest(theirs)) == [
        blob_digest(theirs).hex
    ]  # no holder by digest alone
    store = store_of(w)
    assert sorted(await visible_blobs(store)) == sorted([blob_digest(theirs).hex, blob_digest(ok).hex])
    assert await leftovers(store) == []
    assert await reservations(w) == 0  # each ended: as the holding it became, or with its refusal
    # What the worker holds now counts: 4 KiB held, so two more 4 KiB blobs fit its 14 KiB, a third not.
    more = [os.urandom(4 * KiB) for _ in range(3)]
    assert [outcome(r) for r in await batch_upload(worker, *(entry(m) for m in more))] == [
        "OK",
        "OK",
        "QUOTA_EXCEEDED",
    ]


async def test_a_batch_upload_is_verified_and_recorded_as_single_uploads_are(
    world: World, cast: Cast
) -> None:
    """A blob someone else stored is taken from a caller only with its bytes, and then the caller
    holds it (already_existed false, as a first upload); a blob the caller may read may come
    without bytes (already_existed true); a manifest is verified and recorded; a digest twice in
    one batch is fine; the empty blob is always there."""
    w = world
    worker, outsider = cast["worker"], cast["outsider"]
    shared, mine, described = os.urandom(3 * KiB), os.urandom(3 * KiB), os.urandom(5 * KiB)
    await outsider.upload(shared)
    await worker.upload(mine)
    manifest = manifest_in(w, w.worker, described)
    forged = manifest_in(w, w.worker, described)
    forged.signatures[0].sig = bytes(64)
    results = await batch_upload(
        worker,
        entry(shared),
        entry(b"", blob_digest(mine)),
        entry(described, manifest=manifest),
        entry(described),
        entry(b""),
        entry(os.urandom(KiB), manifest=manifest),  # a manifest of other bytes
        entry(described, manifest=forged),
    )
    assert [outcome(r) for r in results] == [
        "OK",
        "OK",
        "OK",
        "OK",
        "OK",
        "MANIFEST_MISMATCH",
        "MANIFEST_SIGNATURE_INVALID",
    ]
    assert [r.already_existed for r in results[:5]] == [False, True, False, False, True]
    assert results[2].manifest_digest.hex and not results[3].HasField("manifest_digest")
    assert await worker.download(blob_digest(shared)) == shared  # now a holder
    manifests = await cast["coordinator"].artifacts.GetManifest(
        apb.GetManifestRequest(digest=blob_digest(described))
    )
    assert [m.payload for m in manifests.manifests] == [manifest.payload]  # a member of G sees it
    # A digest nobody stored, sent without bytes, is refused as Upload refuses a header alone.
    absent = blob_digest(os.urandom(KiB))
    assert [outcome(r) for r in await batch_upload(worker, entry(b"", absent))] == ["INCOMPLETE_UPLOAD"]


async def test_a_batch_over_its_total_is_refused_whole_and_structured(world: World, cast: Cast) -> None:
    """Over 3 MiB of request (under the 4 MiB transport limit): RESOURCE_EXHAUSTED with the
    artifact error TOO_LARGE, `field` and `limit`; nothing stored. Downloads whose declared sizes
    total over 3 MiB, or more than 10,000 digests: the same."""
    w = world
    worker = cast["worker"]
    blobs = [os.urandom(800 * KiB) for _ in range(4)]  # 3.2 MiB
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await batch_upload(worker, *(entry(b) for b in blobs))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    rejection = await refused_with(batch_upload(worker, *(entry(b) for b in blobs)))
    assert (
        R.Name(rejection.reason),
        rejection.metadata["artifact_error"],
        rejection.metadata["field"],
        rejection.metadata["limit"],
    ) == ("REJECTION_REASON_TOO_LARGE", "ARTIFACT_ERROR_CODE_TOO_LARGE", "blobs", str(MAX_BATCH_BYTES))
    assert await missing(cast["admin"], *(blob_digest(b) for b in blobs)) == [
        blob_digest(b).hex for b in blobs
    ]
    assert await visible_blobs(store_of(w)) == [] and await leftovers(store_of(w)) == []
    # Within the limit the same blobs go in two batches (the SDK cuts them so).
    assert all(isinstance(r, apb.UploadResponse) for r in await worker.upload_many(blobs))
    rejection = await refused_with(batch_download(worker, *(blob_digest(b) for b in blobs)))
    assert (rejection.metadata["artifact_error"], rejection.metadata["field"]) == (
        "ARTIFACT_ERROR_CODE_TOO_LARGE",
        "digests",
    )
    many = [blob_digest(b"")] * 10_001
    rejection = await refused_with(batch_download(worker, *many))
    assert rejection.metadata["artifact_error"] == "ARTIFACT_ERROR_CODE_TOO_LARGE"
    assert [len(d) for d in await worker.download_many([blob_digest(b) for b in blobs])] == [
        len(b) for b in blobs
    ]


async def test_a_blob_the_store_cannot_keep_leaves_nothing(
    world: World, cast: Cast, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """A full disk while one blob of the batch is written: that blob is refused STORAGE_FULL with
    nothing of it left, the others are stored, and a retry succeeds."""
    if backend != "local":
        pytest.skip("the injected ENOSPC is the local disk's")
    w = world
    good, unlucky = os.urandom(4 * KiB), os.urandom(4 * KiB)
    real = local._write_all

    def full_for_one(fd: int, bufs: list[bytes]) -> None:
        if bufs and bufs[0] == unlucky:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, bufs)

    monkeypatch.setattr(local, "_write_all", full_for_one)
    results = await batch_upload(cast["worker"], entry(good), entry(unlucky))
    assert [outcome(r) for r in results] == ["OK", "STORAGE_FULL"]
    assert results[1].rejection.reason == R.REJECTION_REASON_QUOTA_EXCEEDED
    store = store_of(w)
    assert await visible_blobs(store) == [blob_digest(good).hex] and await leftovers(store) == []
    assert await missing(cast["admin"], blob_digest(unlucky)) == [blob_digest(unlucky).hex]
    monkeypatch.setattr(local, "_write_all", real)
    assert [outcome(r) for r in await batch_upload(cast["worker"], entry(unlucky))] == ["OK"]


async def test_nothing_is_acknowledged_before_it_is_durable(
    world: World, cast: Cast, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Local disk: every stored blob's temp file is synced before it is renamed, and its directory
    (and the parent of a fan-out directory the batch created) is fsynced before the answer."""
    if backend != "local":
        pytest.skip("the fsyncs observed are the local disk's")
    w = world
    events: list[tuple[str, str]] = []
    real_sync, real_replace, real_fsync_dir = local._Temp.sync, os.replace, local._fsync_dir

    def sync(self: local._Temp) -> None:
        real_sync(self)
        events.append(("sync", str(self.path)))

    def replace(src: Any, dst: Any) -> None:
        real_replace(src, dst)
        events.append(("rename", f"{src}>{dst}"))

    def fsync_dir(path: Any) -> None:
        real_fsync_dir(path)
        events.append(("dir", str(path)))

    monkeypatch.setattr(local._Temp, "sync", sync)
    monkeypatch.setattr(local.os, "replace", replace)
    monkeypatch.setattr(local, "_fsync_dir", fsync_dir)
    blobs = [os.urandom(4 * KiB) for _ in range(20)]
    results = await batch_upload(cast["worker"], *(entry(b) for b in blobs))
    assert all(outcome(r) == "OK" for r in results)
    store = store_of(w)
    assert isinstance(store, LocalBlobStore)
    renames = {
        dst: i for i, (kind, what) in enumerate(events) if kind == "rename" for _src, dst in [what.split(">")]
    }
    synced = {what: i for i, (kind, what) in enumerate(events) if kind == "sync"}
    dirs = {what: i for i, (kind, what) in enumerate(events) if kind == "dir"}
    for data in blobs:
        final = store.path_for(blob_digest(data).hex)
        rename = renames[str(final)]
        temp = events[rename][1].split(">")[0]
        assert synced[temp] < rename < dirs[str(final.parent)]
        assert str(final.parent.parent) in dirs and str(store.root) in dirs  # fresh fan-out directories
        assert final.read_bytes() == data


# ------------------------------------------------------------------ downloads


async def test_each_blob_of_a_download_batch_gets_its_own_outcome(world: World, cast: Cast) -> None:
    """ok, not found, not readable by the caller (exactly the not-found answer), corrupted at rest
    (never sent), too large and malformed, in one call; the same Rejections as Download."""
    w = world
    worker, outsider = cast["worker"], cast["outsider"]
    ok, theirs, rotten = os.urandom(4 * KiB), os.urandom(4 * KiB), os.urandom(4 * KiB)
    await worker.upload(ok)
    await worker.upload(rotten)
    await outsider.upload(theirs)
    await corrupt(store_of(w), blob_digest(rotten).hex)
    absent = blob_digest(os.urandom(4 * KiB))
    big = blob_digest(b"big")
    big.size_bytes = MAX_BATCH_BYTES + 1
    malformed = common_pb2.Digest(algorithm="blake3", hex="../etc/passwd", size_bytes=4)
    results = await batch_download(
        worker,
        blob_digest(ok),
        absent,
        blob_digest(theirs),
        blob_digest(rotten),
        big,
        malformed,
        blob_digest(b""),
    )
    assert [outcome(r) for r in results] == [
        "OK",
        "NOT_FOUND",
        "NOT_FOUND",
        "CORRUPTED",
        "TOO_LARGE",
        "MALFORMED_DIGEST",
        "OK",
    ]
    assert results[0].data == ok and results[6].data == b"" and results[3].data == b""
    assert results[3].rejection.reason == R.REJECTION_REASON_DATA_CORRUPTED
    # Not readable is not found, to the letter; and what Download answers.
    assert as_missing(results[2].rejection, blob_digest(theirs)) == as_missing(results[1].rejection, absent)
    for digest, result in ((blob_digest(theirs), results[2]), (absent, results[1])):
        assert await refused_with(worker.download(digest)) == result.rejection
    assert [r.digest for r in results[:4]] == [
        blob_digest(ok),
        absent,
        blob_digest(theirs),
        blob_digest(rotten),
    ]
    # The owner reads its own; an operator reads all; the Stat shows the batch verified the blob.
    assert [outcome(r) for r in await batch_download(outsider, blob_digest(theirs), blob_digest(ok))] == [
        "OK",
        "NOT_FOUND",
    ]
    assert [
        outcome(r) for r in await batch_download(cast["admin"], blob_digest(theirs), blob_digest(ok))
    ] == ["OK", "OK"]


async def test_anonymous_callers_are_refused_and_learn_nothing(world: World, cast: Cast) -> None:
    """No call proof: both batch RPCs UNAUTHENTICATED, nothing stored. A Group member reads by
    batch exactly what it reads one by one."""
    w = world
    data = os.urandom(2 * KiB)
    anon = cast["anonymous"]
    for call in (batch_upload(anon, entry(data)), batch_download(anon, blob_digest(data))):
        rejection = await refused_with(call)
        assert rejection.reason == R.REJECTION_REASON_UNAUTHENTICATED
    assert await missing(cast["admin"], blob_digest(data)) == [blob_digest(data).hex]
    shared = os.urandom(2 * KiB)
    await cast["worker"].upload(shared, manifest_in(w, w.worker, shared))
    for role in ("coordinator", "other_group", "outsider"):
        single = await cast[role].download_many([blob_digest(shared)])
        batched = await batch_download(cast[role], blob_digest(shared))
        if role == "coordinator":
            assert single == [shared] and batched[0].data == shared
        else:
            assert isinstance(single[0], Rejected) and outcome(batched[0]) == "NOT_FOUND"


# ------------------------------------------------------------------ the SDK


async def test_upload_many_and_download_many_mix_batches_and_streams(world: World, cast: Cast) -> None:
    """Small blobs go in batches, blobs over 1 MiB by Upload/Download; outcomes in order."""
    worker = cast["worker"]
    blobs = [os.urandom(n) for n in (0, 1, 4 * KiB, MiB + 1, 64 * KiB)]
    answers = await worker.upload_many(blobs)
    assert all(isinstance(a, apb.UploadResponse) for a in answers)
    assert [a.digest for a in answers if isinstance(a, apb.UploadResponse)] == [blob_digest(b) for b in blobs]
    absent = blob_digest(os.urandom(10))
    got = await worker.download_many([*(blob_digest(b) for b in blobs), absent])
    assert got[:-1] == blobs
    refused = got[-1]
    assert (
        isinstance(refused, Rejected)
        and refused.metadata["artifact_error"] == "ARTIFACT_ERROR_CODE_NOT_FOUND"
    )
    assert EMPTY_BLAKE3 == blob_digest(b"").hex
