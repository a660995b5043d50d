"""The blob backend suite: every test runs on the local filesystem and, when MWP_TEST_S3_ENDPOINT
is set (``.ci/run`` starts moto's standalone server and sets it), on S3.

Backends return raw bytes; detecting tampering is the verification layer's job. ``corrupt`` (and
``put_blob``/``read_blob``) are importable by other test modules for their corruption tests on
both backends::

    from tests.test_artifact_backends import blobstore, corrupt, put_blob  # noqa: F401 (fixture)
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from missionweave_server.services.artifacts import direct_io
from missionweave_server.services.artifacts.backends import (
    BlobStoreConfig,
    blobstore_from_env,
    make_blobstore,
)
from missionweave_server.services.artifacts.blobstore import (
    CHUNK_BYTES,
    EMPTY_BLAKE3,
    MAX_BLOB_BYTES,
    BlobStore,
)
from missionweave_server.services.artifacts.local import DIRECT_MIN_BYTES, STALE_TEMP_SECONDS, LocalBlobStore
from missionweave_server.services.artifacts.s3 import MAX_PARTS, MIN_PART_BYTES, S3BlobStore, part_size_for

S3_ENDPOINT = os.environ.get("MWP_TEST_S3_ENDPOINT", "")
MiB = 1024 * 1024


# ---------------------------------------------------------------------- fixtures and helpers


def _s3_test_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto accepts any credentials; a developer's real ones must never reach a test server."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))


@pytest.fixture(params=["local", "local-direct", "s3"])
async def blobstore(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[BlobStore]:
    """``local`` as configured by default (direct I/O from 4 MiB); ``local-direct`` with direct I/O
    for every blob, so each test below also runs through the aligned staging and reads."""
    store: BlobStore
    if request.param == "local-direct":
        monkeypatch.setattr("missionweave_server.services.artifacts.local.DIRECT_MIN_BYTES", 0)
    if request.param == "s3":
        if not S3_ENDPOINT:
            pytest.skip("S3 variant needs MWP_TEST_S3_ENDPOINT (.ci/run starts moto's server and sets it)")
        _s3_test_credentials(monkeypatch)
        # A bucket per test: tests share one moto server but never see each other's objects.
        store = S3BlobStore(f"mwp-test-{uuid.uuid4().hex[:16]}", endpoint_url=S3_ENDPOINT, create_bucket=True)
    else:
        store = LocalBlobStore(tmp_path / "data")
    try:
        yield store
    finally:
        await store.close()


def blob(size: int, seed: int = 0) -> tuple[bytes, str]:
    """Deterministic bytes that differ per seed, and their BLAKE3 digest."""
    data = blake3.blake3(seed.to_bytes(8, "big")).digest(length=size)
    return data, blake3.blake3(data).hexdigest()


async def put_blob(store: BlobStore, data: bytes, write_bytes: int = CHUNK_BYTES) -> str:
    digest_hex = blake3.blake3(data).hexdigest()
    writer = await store.open_writer(digest_hex, len(data))
    view = memoryview(data)
    for i in range(0, len(data), write_bytes):
        await writer.write(bytes(view[i : i + write_bytes]))
    await writer.commit()
    return digest_hex


async def read_blob(store: BlobStore, digest_hex: str, size: int, chunk_bytes: int = CHUNK_BYTES) -> bytes:
    return b"".join([chunk async for chunk in store.read(digest_hex, size, chunk_bytes)])


async def corrupt(store: BlobStore, digest_hex: str, *, truncate: bool = False) -> bytes:
    """Alter a stored blob behind the store's back (on disk or by overwriting the S3 object): flip one
    byte in the middle (same size, the hardest case to notice) or, with ``truncate``, drop the last
    byte. Returns the bytes now stored."""

    def altered(data: bytes) -> bytes:
        if truncate:
            return data[:-1]
        if not data:
            raise ValueError("cannot flip a byte of the empty blob")
        i = len(data) // 2
        return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]

    if isinstance(store, LocalBlobStore):
        path = store.path_for(digest_hex)

        def rewrite() -> bytes:
            new = altered(path.read_bytes())
            path.write_bytes(new)  # in place, as bit rot or a careless operator would
            return new

        return await asyncio.to_thread(rewrite)
    if isinstance(store, S3BlobStore):
        key = store.key_for(digest_hex)

        def overwrite() -> bytes:
            new = altered(store.client.get_object(Bucket=store.bucket, Key=key)["Body"].read())
            store.client.put_object(Bucket=store.bucket, Key=key, Body=new)
            return new

        return await asyncio.to_thread(overwrite)
    raise TypeError(f"corrupt() does not know {type(store).__name__}")


async def visible_blobs(store: BlobStore) -> list[str]:
    """Every committed blob name, found by listing (not by asking the store)."""
    if isinstance(store, LocalBlobStore):
        return sorted(p.name for p in store.root.glob("??/??/*") if p.is_file())
    assert isinstance(store, S3BlobStore)
    listing = await _s3_list(store, store.client.list_objects_v2)
    return sorted(obj["Key"].removeprefix("blobs/") for obj in listing.get("Contents", []))


async def leftovers(store: BlobStore) -> list[str]:
    """Uploads in progress: temp files (local) or unfinished multipart uploads (S3)."""
    if isinstance(store, LocalBlobStore):
        return sorted(os.listdir(store.tmp_dir))
    assert isinstance(store, S3BlobStore)
    listing = await _s3_list(store, store.client.list_multipart_uploads)
    return sorted(u["UploadId"] for u in listing.get("Uploads", []))


async def _s3_list(store: S3BlobStore, operation: Any) -> dict[str, Any]:
    try:
        return await asyncio.to_thread(operation, Bucket=store.bucket)
    except store.client.exceptions.NoSuchBucket:
        return {}  # the store never needed its bucket (every call was refused): nothing is there


async def wait_for_no_leftovers(store: BlobStore) -> list[str]:
    """S3 aborts a dropped upload from a background thread; give it up to 10 s."""
    deadline = time.monotonic() + 10
    # Polling the server is the only way to observe it: there is no event to wait on.
    while (found := await leftovers(store)) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return found


def is_s3(store: BlobStore) -> bool:
    return isinstance(store, S3BlobStore)


# ---------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    "size", [0, 1, 1000, CHUNK_BYTES - 1, CHUNK_BYTES, CHUNK_BYTES + 1, 3 * CHUNK_BYTES + 17]
)
async def test_round_trip(blobstore: BlobStore, size: int) -> None:
    data, digest_hex = blob(size, seed=size)
    assert not await blobstore.exists(digest_hex, size)
    await put_blob(blobstore, data)
    assert await blobstore.exists(digest_hex, size)
    assert await blobstore.stored_size(digest_hex) == size
    assert not await blobstore.exists(digest_hex, size + 1)  # identity is digest *and* size
    chunks = [c async for c in blobstore.read(digest_hex, size)]
    assert b"".join(chunks) == data
    assert all(0 < len(c) <= CHUNK_BYTES for c in chunks)
    assert await visible_blobs(blobstore) == [digest_hex]
    assert await leftovers(blobstore) == []


async def test_empty_blob_write_is_stored_like_any_other(blobstore: BlobStore) -> None:
    """The service answers for the empty blob itself; a 0-byte write still works on every backend."""
    assert await put_blob(blobstore, b"") == EMPTY_BLAKE3
    assert await blobstore.stored_size(EMPTY_BLAKE3) == 0
    assert await read_blob(blobstore, EMPTY_BLAKE3, 0) == b""


@pytest.mark.parametrize("write_bytes", [1, 4096, 100_000, 3 * MiB + 1])
async def test_irregular_write_sizes(blobstore: BlobStore, write_bytes: int) -> None:
    size = 5 * 4096 + 3 if write_bytes == 1 else 2 * MiB + 12_345
    data, digest_hex = blob(size, seed=write_bytes)
    await put_blob(blobstore, data, write_bytes=write_bytes)
    assert await read_blob(blobstore, digest_hex, size) == data


async def test_multipart_sizes(blobstore: BlobStore) -> None:
    """20 MiB (+5): three parts of 8, 8 and 4 MiB on S3, written in chunks that straddle part edges."""
    size = 20 * MiB + 5
    data, digest_hex = blob(size, seed=20)
    await put_blob(blobstore, data, write_bytes=3 * MiB)
    assert await read_blob(blobstore, digest_hex, size) == data
    if isinstance(blobstore, S3BlobStore):
        head = await asyncio.to_thread(
            blobstore.client.head_object, Bucket=blobstore.bucket, Key=blobstore.key_for(digest_hex)
        )
        assert head["ETag"].strip('"').endswith("-3")  # a multipart object's ETag counts its parts
        assert head["Metadata"] == {"blake3": digest_hex, "size": str(size)}
    assert await leftovers(blobstore) == []


def test_part_size_formula() -> None:
    assert part_size_for(0) == MIN_PART_BYTES == 8 * MiB
    assert part_size_for(MAX_BLOB_BYTES) == 8 * MiB  # 4 GiB fits 10,000 parts of 8 MiB
    big = 200 * 1024**3
    assert part_size_for(big) == -(-big // MAX_PARTS) > 8 * MiB
    for size in (MAX_BLOB_BYTES, big, big + 1, 10**13 + 7):
        assert -(-size // part_size_for(size)) <= MAX_PARTS


@pytest.mark.parametrize("chunk_bytes", [1000, 4096, 3 * MiB])
async def test_read_chunk_sizes(blobstore: BlobStore, chunk_bytes: int) -> None:
    size = 10 * 1000 + 1 if chunk_bytes == 1000 else 9 * MiB + 7
    data, digest_hex = blob(size, seed=chunk_bytes)
    await put_blob(blobstore, data)
    chunks = [c async for c in blobstore.read(digest_hex, size, chunk_bytes)]
    assert b"".join(chunks) == data
    assert all(len(c) == chunk_bytes for c in chunks[:-1])
    assert 0 < len(chunks[-1]) <= chunk_bytes


async def test_reader_closed_early(blobstore: BlobStore) -> None:
    size = 4 * CHUNK_BYTES
    data, digest_hex = blob(size, seed=4)
    await put_blob(blobstore, data)
    fds_before = _open_fds()
    for _ in range(5):
        reader = blobstore.read(digest_hex, size)
        assert await anext(reader) == data[:CHUNK_BYTES]
        await reader.aclose()  # type: ignore[attr-defined]  # a prefetch is in flight: no leak, no error
    if isinstance(blobstore, LocalBlobStore):
        await asyncio.sleep(0.2)  # the prefetch finishes, then its callback closes the file
        assert _open_fds() == fds_before
    assert await read_blob(blobstore, digest_hex, size) == data


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_s3_object_replaced_while_reading_fails_loudly(blobstore: BlobStore) -> None:
    """Ranges after the first carry If-Match: a reader never stitches two versions together."""
    if not isinstance(blobstore, S3BlobStore):
        pytest.skip("S3 only: a local reader keeps the file it opened")
    size = 40 * MiB  # five 8 MiB ranges: at most two are fetched ahead of the reader
    data, digest_hex = blob(size, seed=21)
    await put_blob(blobstore, data)
    reader = blobstore.read(digest_hex, size)
    first = [await anext(reader) for _ in range(9)]  # past the first 8 MiB range
    assert b"".join(first) == data[: 9 * CHUNK_BYTES]
    await corrupt(blobstore, digest_hex)
    with pytest.raises(Exception) as failure:
        async for _ in reader:
            pass
    assert "PreconditionFailed" in str(failure.value) or "412" in str(failure.value)


# ---------------------------------------------------------------------- idempotency and races


async def test_second_put_is_idempotent(blobstore: BlobStore) -> None:
    data, digest_hex = blob(CHUNK_BYTES + 99, seed=2)
    await put_blob(blobstore, data)
    before = await _stored_identity(blobstore, digest_hex)
    await put_blob(blobstore, data)
    assert await _stored_identity(blobstore, digest_hex) == before  # not rewritten
    assert await read_blob(blobstore, digest_hex, len(data)) == data
    assert await visible_blobs(blobstore) == [digest_hex]
    assert await leftovers(blobstore) == []


async def _stored_identity(store: BlobStore, digest_hex: str) -> Any:
    if isinstance(store, LocalBlobStore):
        st = store.path_for(digest_hex).stat()
        return (st.st_ino, st.st_mtime_ns)
    assert isinstance(store, S3BlobStore)
    head = await asyncio.to_thread(
        store.client.head_object, Bucket=store.bucket, Key=store.key_for(digest_hex)
    )
    return (head["ETag"], head["LastModified"])


async def test_concurrent_uploads_of_the_same_blob(blobstore: BlobStore) -> None:
    data, digest_hex = blob(3 * CHUNK_BYTES, seed=3)
    writers = [await blobstore.open_writer(digest_hex, len(data)) for _ in range(3)]
    for i in range(0, len(data), CHUNK_BYTES):
        for w in writers:
            await w.write(data[i : i + CHUNK_BYTES])
    await asyncio.gather(*(w.commit() for w in writers))
    assert await read_blob(blobstore, digest_hex, len(data)) == data
    assert await leftovers(blobstore) == []


async def test_damaged_blob_of_another_size_is_replaced_by_a_new_upload(blobstore: BlobStore) -> None:
    data, digest_hex = blob(CHUNK_BYTES + 5, seed=6)
    await put_blob(blobstore, data)
    await corrupt(blobstore, digest_hex, truncate=True)
    assert not await blobstore.exists(digest_hex, len(data))
    await put_blob(blobstore, data)
    assert await read_blob(blobstore, digest_hex, len(data)) == data


# ---------------------------------------------------------------------- nothing partial is ever visible


@pytest.mark.parametrize("size", [CHUNK_BYTES + 1, 20 * MiB])
async def test_abort_leaves_nothing(blobstore: BlobStore, size: int) -> None:
    data, digest_hex = blob(size, seed=7)
    writer = await blobstore.open_writer(digest_hex, size)
    for i in range(0, size - CHUNK_BYTES, CHUNK_BYTES):  # all but the last chunk (S3: parts were sent)
        await writer.write(data[i : i + CHUNK_BYTES])
    await writer.abort()
    await writer.abort()  # idempotent
    assert not await blobstore.exists(digest_hex, size)
    assert await blobstore.stored_size(digest_hex) is None
    assert await visible_blobs(blobstore) == []
    assert await leftovers(blobstore) == []
    with pytest.raises(KeyError):
        await read_blob(blobstore, digest_hex, size)
    with pytest.raises(RuntimeError):
        await writer.commit()


@pytest.mark.parametrize("size", [CHUNK_BYTES + 1, 20 * MiB])
async def test_upload_cut_off_mid_stream_leaves_nothing(blobstore: BlobStore, size: int) -> None:
    """The uploading task dies mid-stream without aborting (a client vanished, the task was
    cancelled): once the writer is garbage, no temp file or unfinished upload remains."""
    data, digest_hex = blob(size, seed=8)
    halfway = asyncio.Event()

    async def upload() -> None:
        writer = await blobstore.open_writer(digest_hex, size)
        for i in range(0, size, CHUNK_BYTES):
            await writer.write(data[i : i + CHUNK_BYTES])
            if i >= size // 2:
                halfway.set()
                await asyncio.sleep(3600)  # the rest of the stream never arrives

    task = asyncio.create_task(upload())
    await halfway.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    del task
    gc.collect()
    assert await wait_for_no_leftovers(blobstore) == []
    assert not await blobstore.exists(digest_hex, size)
    assert await visible_blobs(blobstore) == []


async def test_garbage_collected_writer_leaves_nothing(blobstore: BlobStore) -> None:
    size = 17 * MiB
    data, digest_hex = blob(size, seed=9)
    writer = await blobstore.open_writer(digest_hex, size)
    await writer.write(data[: 9 * MiB])
    del writer
    gc.collect()
    assert await wait_for_no_leftovers(blobstore) == []
    assert await visible_blobs(blobstore) == []


async def test_failed_write_breaks_the_writer(blobstore: BlobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk that never reached storage (disk full, S3 error) can never be skipped by a commit."""
    size = 20 * MiB
    data, digest_hex = blob(size, seed=14)
    if isinstance(blobstore, LocalBlobStore):
        import missionweave_server.services.artifacts.local

        def disk_full(self: object, bufs: list[bytes]) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(
            missionweave_server.services.artifacts.local._Temp, "write", disk_full
        )  # buffered and direct I/O alike
    else:
        assert isinstance(blobstore, S3BlobStore)

        def part_refused(**kwargs: Any) -> Any:
            raise RuntimeError("injected UploadPart failure")

        monkeypatch.setattr(blobstore.client, "upload_part", part_refused)
    writer = await blobstore.open_writer(digest_hex, size)
    with pytest.raises((OSError, RuntimeError)):
        for i in range(0, size, CHUNK_BYTES):
            await writer.write(data[i : i + CHUNK_BYTES])
        await writer.commit()
    with pytest.raises(RuntimeError):
        await writer.commit()
    await writer.abort()
    assert await visible_blobs(blobstore) == []
    assert await leftovers(blobstore) == []


async def test_wrong_amount_of_bytes_refused(blobstore: BlobStore) -> None:
    data, digest_hex = blob(1000, seed=10)
    writer = await blobstore.open_writer(digest_hex, 1000)
    with pytest.raises(ValueError):
        await writer.write(data + b"x")  # past the declared size
    await writer.write(data[:999])
    with pytest.raises(ValueError):
        await writer.commit()  # short
    await writer.abort()
    assert await visible_blobs(blobstore) == []
    assert await leftovers(blobstore) == []


async def test_absent_blob(blobstore: BlobStore) -> None:
    _, digest_hex = blob(10, seed=11)
    assert await blobstore.stored_size(digest_hex) is None
    assert not await blobstore.exists(digest_hex, 10)
    with pytest.raises(KeyError):
        await read_blob(blobstore, digest_hex, 10)


# ---------------------------------------------------------------------- hostile digests and sizes

BAD_DIGESTS = [
    "../etc",
    "../../../../etc/passwd",
    "/etc/passwd",
    "ab/cd/" + "a" * 58,
    "A" * 64,  # uppercase
    "a" * 63,
    "a" * 65,
    "a" * 64 + "\n",  # HEX64's "$" matches before a trailing newline: we use fullmatch
    "g" * 64,
    "",
    "blake3:" + "a" * 64,
    "..",
    "a" * 62 + "/.",
    "a" * 63 + "\x00",
]


@pytest.mark.parametrize("bad", BAD_DIGESTS, ids=repr)
async def test_malformed_or_path_like_digests_refused(blobstore: BlobStore, bad: str) -> None:
    with pytest.raises(ValueError):
        await blobstore.open_writer(bad, 1)
    with pytest.raises(ValueError):
        await blobstore.exists(bad, 1)
    with pytest.raises(ValueError):
        await blobstore.stored_size(bad)
    with pytest.raises(ValueError):
        blobstore.read(bad, 1)  # refused at the call, before any I/O
    assert await visible_blobs(blobstore) == []
    assert await leftovers(blobstore) == []


@pytest.mark.parametrize("size", [-1, MAX_BLOB_BYTES + 1, True, 1.5])
async def test_bad_sizes_refused(blobstore: BlobStore, size: Any) -> None:
    with pytest.raises(ValueError):
        await blobstore.open_writer("a" * 64, size)
    with pytest.raises(ValueError):
        await blobstore.exists("a" * 64, size)


# ---------------------------------------------------------------------- tampering


async def test_altered_blob_is_returned_raw(blobstore: BlobStore) -> None:
    """The backend does not judge: it returns what is stored, and the verification layer above
    (hashing every read) is what refuses it. Here we only prove the alteration reaches that layer."""
    data, digest_hex = blob(2 * CHUNK_BYTES + 3, seed=12)
    await put_blob(blobstore, data)
    altered = await corrupt(blobstore, digest_hex)
    got = await read_blob(blobstore, digest_hex, len(data))
    assert got == altered != data
    assert len(got) == len(data)
    assert blake3.blake3(got).hexdigest() != digest_hex
    assert await blobstore.stored_size(digest_hex) == len(data)


# ---------------------------------------------------------------------- local specifics


async def test_local_layout(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "data")
    try:
        data, digest_hex = blob(100, seed=13)
        await put_blob(store, data)
        path = tmp_path / "data" / "blobs" / digest_hex[:2] / digest_hex[2:4] / digest_hex
        assert store.path_for(digest_hex) == path
        assert path.read_bytes() == data
        assert path.stat().st_mode & 0o777 == 0o644
        assert os.listdir(store.tmp_dir) == []
    finally:
        await store.close()


def _direct_io_supported(directory: Path) -> bool:
    directory.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        return direct_io.enable(fd)
    finally:
        os.close(fd)
        os.unlink(path)


@pytest.mark.parametrize("enabled", [True, False])
async def test_large_local_blobs_bypass_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    """From DIRECT_MIN_BYTES the local backend writes and reads with O_DIRECT (D49), through aligned
    buffers, with an unaligned tail; ``direct_io=False`` (MWP_BLOB_DIRECT_IO=false) keeps the cache."""
    if enabled and not _direct_io_supported(tmp_path / "probe"):
        pytest.skip("this filesystem refuses O_DIRECT (the backend then stays buffered)")
    calls = {"write": 0, "read": 0}
    stage_write, direct_read = direct_io.DirectStage.write, direct_io.DirectReader.read

    def counted_write(self: direct_io.DirectStage, fd: int, bufs: list[bytes]) -> None:
        calls["write"] += 1
        stage_write(self, fd, bufs)

    def counted_read(self: direct_io.DirectReader) -> bytes:
        calls["read"] += 1
        return direct_read(self)

    monkeypatch.setattr(direct_io.DirectStage, "write", counted_write)
    monkeypatch.setattr(direct_io.DirectReader, "read", counted_read)
    store = LocalBlobStore(tmp_path / "data", direct_io=enabled)
    try:
        size = DIRECT_MIN_BYTES + 3 * 4096 + 5  # aligned body plus a 5-byte tail
        data, digest_hex = blob(size, seed=49)
        await put_blob(store, data, write_bytes=1_000_003)  # pieces that never line up with 4 KiB
        assert store.path_for(digest_hex).read_bytes() == data
        assert await read_blob(store, digest_hex, size) == data
        assert (calls["write"] > 0 and calls["read"] > 0) is enabled
        assert (calls["write"] == 0 and calls["read"] == 0) is not enabled
        assert os.listdir(store.tmp_dir) == []
    finally:
        await store.close()


def test_direct_io_can_be_switched_off_by_env(tmp_path: Path) -> None:
    assert BlobStoreConfig.from_env(tmp_path, {}).direct_io is True
    assert BlobStoreConfig.from_env(tmp_path, {"MWP_BLOB_DIRECT_IO": "false"}).direct_io is False


async def test_local_sweeps_stale_temps_at_start(tmp_path: Path) -> None:
    tmp_dir = tmp_path / "data" / "blobs" / "tmp"
    tmp_dir.mkdir(parents=True)
    stale, fresh = tmp_dir / "stale.part", tmp_dir / "fresh.part"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    old = time.time() - STALE_TEMP_SECONDS - 60
    os.utime(stale, (old, old))
    store = LocalBlobStore(tmp_path / "data")
    await store.close()
    assert sorted(os.listdir(tmp_dir)) == ["fresh.part"]  # another process may still be writing it


B3SUM = shutil.which("b3sum")


@pytest.mark.skipif(B3SUM is None, reason="b3sum not installed (Debian package b3sum; .ci/run installs it)")
async def test_b3sum_agrees_with_our_digests(tmp_path: Path) -> None:
    """An independent BLAKE3 implementation (Debian's b3sum, Rust) names our stored files the same."""
    assert B3SUM is not None
    store = LocalBlobStore(tmp_path / "data")
    try:
        digests = [
            await put_blob(store, blob(size, seed=size)[0]) for size in (0, 1, 1025, CHUNK_BYTES + 7, 5 * MiB)
        ]
        paths = [str(store.path_for(d)) for d in digests]
        proc = await asyncio.create_subprocess_exec(
            B3SUM, "--no-names", *paths, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert out.decode().split() == digests  # b3sum's names are exactly the digests we stored under
        assert digests[0] == EMPTY_BLAKE3
    finally:
        await store.close()


# ---------------------------------------------------------------------- choosing the backend


async def test_factory_defaults_to_local(tmp_path: Path) -> None:
    store = make_blobstore(tmp_path / "d")
    assert isinstance(store, LocalBlobStore) and store.name == "local"
    assert store.root == tmp_path / "d" / "blobs"
    await store.close()
    store = blobstore_from_env(tmp_path / "d", env={})
    assert isinstance(store, LocalBlobStore)
    await store.close()


async def test_factory_chooses_s3_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _s3_test_credentials(monkeypatch)
    env = {
        "MWP_S3_BUCKET": "artifacts",
        "MWP_S3_ENDPOINT": "http://127.0.0.1:9",
        "MWP_S3_REGION": "eu-west-3",
        "MWP_S3_CREATE_BUCKET": "true",
    }
    config = BlobStoreConfig.from_env(tmp_path, env)
    assert config == BlobStoreConfig(tmp_path, "artifacts", "http://127.0.0.1:9", "eu-west-3", True)
    assert config.backend == "s3"
    store = blobstore_from_env(tmp_path, env)  # builds a client only: no request is made
    assert isinstance(store, S3BlobStore) and store.name == "s3"
    assert store.bucket == "artifacts"
    assert store.client.meta.endpoint_url == "http://127.0.0.1:9"
    assert store.client.meta.region_name == "eu-west-3"
    await store.close()
    assert not (tmp_path / "blobs").exists()


def test_factory_refuses_endpoint_without_bucket(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="MWP_S3_BUCKET"):
        blobstore_from_env(tmp_path, env={"MWP_S3_ENDPOINT": "http://127.0.0.1:9"})
