"""S3 blob backend (boto3; AWS S3 or any S3-compatible server: MinIO, Ceph RGW, moto, ...).

Objects are keyed ``blobs/<64 hex>``. An upload is invisible until S3 makes it an object:

* at most one part (``size <= part_size_for(size)``): the bytes are buffered and sent with one
  PutObject at commit;
* larger: a multipart upload with parts of ``max(8 MiB, ceil(size / 10000))`` bytes (S3 allows at
  most 10,000 parts), completed by CompleteMultipartUpload at commit; ``abort`` and a writer that is
  garbage collected mid-stream call AbortMultipartUpload, so nothing is ever visible.

boto3's client is synchronous and thread-safe: calls run on a private thread pool whose size matches
the client's connection pool. Reads are ranged GETs, one range always in flight ahead of the caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from missionweave_server.services.artifacts.blobstore import (
    CHUNK_BYTES,
    CountingWriter,
    check_digest,
    check_size,
    put_each,
)

T = TypeVar("T")

MIN_PART_BYTES = 8 * 1024 * 1024
MAX_PARTS = 10_000
KEY_PREFIX = "blobs/"


def part_size_for(size: int) -> int:
    """max(8 MiB, ceil(size / 10000)): the smallest part size that fits any size in 10,000 parts."""
    return max(MIN_PART_BYTES, -(-size // MAX_PARTS))


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}


class S3BlobStore:
    name = "s3"

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        create_bucket: bool = False,
        max_concurrency: int = 8,
        parts_in_flight: int = 4,
        range_bytes: int = MIN_PART_BYTES,
    ) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.parts_in_flight = parts_in_flight
        self.range_bytes = range_bytes
        options: dict[str, Any] = {
            "max_pool_connections": max_concurrency + 2,
            "retries": {"mode": "standard", "max_attempts": 5},
            "connect_timeout": 10,
            "read_timeout": 120,
        }
        if endpoint_url:
            # Path-style URLs work on every S3-compatible server; virtual hosts need DNS set up for it.
            options["s3"] = {"addressing_style": "path"}
        try:
            # botocore >= 1.36 sends CRC trailers by default, which several S3-compatible servers
            # reject; our own BLAKE3 verification covers integrity, so send checksums only when required.
            config = Config(
                **options,
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            )
        except TypeError:  # older botocore: no such options and no such default either
            config = Config(**options)
        # A session of our own: boto3's default session is not safe to create clients from in threads.
        # Credentials come from boto3's usual chain (AWS_ACCESS_KEY_ID/..., profiles, instance roles).
        self.client: Any = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config
        )
        self._region = region or self.client.meta.region_name
        self._pool = concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix="blobs-s3")
        self._bucket_unchecked = create_bucket

    def key_for(self, digest_hex: str) -> str:
        """The object key ``blobs/<hex>``; ValueError for anything but 64 lowercase hex."""
        return KEY_PREFIX + check_digest(digest_hex)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def _ready(self) -> None:
        """Create the bucket on first use when configured to (the constructor makes no request).

        A plain flag, not a shared future: callers racing here both run the idempotent check, which
        is cheaper than tying the store to one event loop."""
        if self._bucket_unchecked:
            await self._run(self._ensure_bucket)
            self._bucket_unchecked = False

    def _ensure_bucket(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return
        except Exception as exc:
            if _error_code(exc) not in {"404", "NoSuchBucket", "NotFound"}:
                raise
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if self._region and self._region != "us-east-1":  # us-east-1 refuses an explicit constraint
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self._region}
        try:
            self.client.create_bucket(**kwargs)
        except Exception as exc:
            if _error_code(exc) != "BucketAlreadyOwnedByYou":  # another account's name is an error
                raise

    # ------------------------------------------------------------------ BlobStore

    async def stored_size(self, digest_hex: str) -> int | None:
        key = self.key_for(digest_hex)
        await self._ready()
        try:
            head = await self._run(self.client.head_object, Bucket=self.bucket, Key=key)
        except Exception as exc:
            if _error_code(exc) in _NOT_FOUND:
                return None
            raise
        return int(head["ContentLength"])

    async def exists(self, digest_hex: str, size: int) -> bool:
        check_size(size)
        return await self.stored_size(digest_hex) == size

    async def open_writer(self, digest_hex: str, size: int) -> S3BlobWriter | CountingWriter:
        key = self.key_for(digest_hex)
        check_size(size)
        # Idempotent: an object of this digest and size is already there, so the upload's bytes are
        # only counted (the verification layer still hashes them) and nothing is sent to S3.
        if await self.stored_size(digest_hex) == size:
            return CountingWriter(size)
        return S3BlobWriter(self, key, digest_hex, size)

    async def put_many(self, blobs: Sequence[tuple[str, bytes]]) -> list[BaseException | None]:
        # One PutObject each (after the HEAD of open_writer), side by side on the client's pool.
        return await put_each(self, blobs)

    def read(self, digest_hex: str, size: int, chunk_bytes: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
        key = self.key_for(digest_hex)  # validated at the call, not at the first iteration
        if chunk_bytes <= 0:
            raise ValueError("chunk_bytes must be positive")
        return self._read_chunks(key, chunk_bytes)

    async def _read_chunks(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        await self._ready()
        loop = asyncio.get_running_loop()
        # Each GET covers a whole number of chunks, so every chunk but the last is exactly chunk_bytes.
        span = max(1, -(-self.range_bytes // chunk_bytes)) * chunk_bytes
        first = await self._run(self._get_range, key, 0, span, chunk_bytes, None)
        if first is None:
            return  # an empty object (S3 answers a range on 0 bytes with 416)
        chunks, total, etag = first
        start = span
        while True:
            pending: asyncio.Future[Any] | None = None
            if start < total:
                # If-Match: an object overwritten while we read fails loudly instead of mixing versions.
                pending = loop.run_in_executor(
                    self._pool, self._get_range, key, start, span, chunk_bytes, etag
                )
                pending.add_done_callback(_retrieve_exception)  # the caller may stop reading early
                start += span
            for chunk in chunks:
                yield chunk
            if pending is None:
                return
            result = await pending
            assert result is not None
            chunks = result[0]

    def _get_range(
        self, key: str, start: int, span: int, chunk_bytes: int, etag: str | None
    ) -> tuple[list[bytes], int, str] | None:
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": key,
            "Range": f"bytes={start}-{start + span - 1}",
        }
        if etag is not None:
            kwargs["IfMatch"] = etag
        try:
            response = self.client.get_object(**kwargs)
        except Exception as exc:
            code = _error_code(exc)
            if code in _NOT_FOUND:
                raise KeyError(key) from None
            if code == "InvalidRange" and start == 0:
                return None
            raise
        body = response["Body"]
        try:
            chunks = []
            while chunk := body.read(chunk_bytes):
                chunks.append(chunk)
        finally:
            body.close()
        content_range = response.get("ContentRange") or ""  # "bytes 0-1048575/20971520"
        total = (
            int(content_range.rsplit("/", 1)[1]) if "/" in content_range else int(response["ContentLength"])
        )
        return chunks, total, response["ETag"]

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown, True)
        close = getattr(self.client, "close", None)
        if close is not None:
            close()


def _retrieve_exception(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # marks it retrieved: no "exception was never retrieved" noise


class _Upload:
    """What it takes to abort a multipart upload, kept apart from the writer so that a weakref
    finalizer can hold it without keeping the writer alive."""

    def __init__(self, client: Any, bucket: str, key: str) -> None:
        self.client = client
        self.bucket = bucket
        self.key = key
        self.upload_id: str | None = None
        self.creating: concurrent.futures.Future[Any] | None = None  # CreateMultipartUpload
        self.parts: list[concurrent.futures.Future[Any]] = []

    @property
    def started(self) -> bool:
        return self.upload_id is not None or self.creating is not None

    def abort(self) -> None:
        """Blocking: wait for parts still being sent (a part landing after the abort would linger),
        then abort. S3 keeps nothing of an aborted upload, and it was never an object."""
        if self.upload_id is None and self.creating is not None:
            # The writer was interrupted while S3 was creating the upload: it exists all the same.
            with contextlib.suppress(Exception):
                self.upload_id = self.creating.result()["UploadId"]
        self.creating = None
        if self.upload_id is None:
            return
        concurrent.futures.wait(self.parts)
        self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)
        self.upload_id = None

    def abort_in_background(self) -> None:
        # Runs from the garbage collector, possibly on the event loop's thread: never block there.
        if self.started:
            threading.Thread(target=self._abort_quietly, name="blobs-s3-abort", daemon=True).start()

    def _abort_quietly(self) -> None:
        try:
            self.abort()
        except Exception:
            pass  # best effort; a bucket lifecycle rule removes stale uploads (docs/artifacts-storage.md)


class S3BlobWriter:
    def __init__(self, store: S3BlobStore, key: str, digest_hex: str, size: int) -> None:
        self._store = store
        self._key = key
        self._size = size
        self._part_size = part_size_for(size)
        self._multipart = size > self._part_size
        self._metadata = {"blake3": digest_hex, "size": str(size)}
        self._pieces: list[bytes | memoryview] = []
        self._pieces_bytes = 0
        self._written = 0
        self._finished = False
        self._upload = _Upload(store.client, store.bucket, key)
        self._inflight: deque[tuple[int, concurrent.futures.Future[Any]]] = deque()
        self._etags: dict[int, str] = {}
        self._next_part = 1
        self._failed: BaseException | None = None
        self._finalizer = weakref.finalize(self, self._upload.abort_in_background)

    def _check_usable(self) -> None:
        if self._finished:
            raise RuntimeError("writer already committed or aborted")
        if self._failed is not None:
            raise RuntimeError("an earlier part failed; abort this upload") from self._failed

    async def write(self, data: bytes) -> None:
        self._check_usable()
        if self._written + len(data) > self._size:
            raise ValueError(f"more bytes than the declared size {self._size}")
        if not isinstance(data, bytes):
            data = bytes(data)  # sent later, from another thread: a mutable buffer could change
        self._written += len(data)
        view = memoryview(data)
        while view:
            # Slicing a memoryview copies nothing; the one copy is the join into a part body.
            take = min(len(view), self._part_size - self._pieces_bytes) if self._multipart else len(view)
            self._pieces.append(view[:take])
            self._pieces_bytes += take
            view = view[take:]
            if self._multipart and self._pieces_bytes == self._part_size:
                await self._guarded(self._send_part())

    async def _guarded(self, step: Awaitable[None]) -> None:
        """Any failure or cancellation of a part breaks the writer: a part that never arrived must
        never be skipped by a later commit (S3 would happily complete an object with a gap)."""
        try:
            await step
        except BaseException as exc:
            self._failed = exc
            raise

    def _take_body(self) -> bytes:
        body = b"".join(self._pieces)
        self._pieces, self._pieces_bytes = [], 0
        return body

    async def _send_part(self) -> None:
        store, upload = self._store, self._upload
        if upload.upload_id is None:
            # Kept on the upload so an abort can still find the id if we are interrupted right here.
            upload.creating = upload.creating or store._pool.submit(
                store.client.create_multipart_upload,
                Bucket=store.bucket,
                Key=self._key,
                ContentType="application/octet-stream",
                Metadata=self._metadata,
            )
            upload.upload_id = (await asyncio.wrap_future(upload.creating))["UploadId"]
            upload.creating = None
        # Bounded parallelism: a few parts travel at once, memory stays at (parts_in_flight + 1) parts.
        while len(self._inflight) >= store.parts_in_flight:
            await self._collect_oldest()
        number, body = self._next_part, self._take_body()
        self._next_part += 1
        future = store._pool.submit(
            store.client.upload_part,
            Bucket=store.bucket,
            Key=self._key,
            UploadId=upload.upload_id,
            PartNumber=number,
            Body=body,
        )
        upload.parts.append(future)
        self._inflight.append((number, future))

    async def _collect_oldest(self) -> None:
        number, future = self._inflight[0]
        result = await asyncio.wrap_future(future)
        self._inflight.popleft()
        self._etags[number] = result["ETag"]

    async def commit(self) -> None:
        self._check_usable()
        if self._written != self._size:
            raise ValueError(f"wrote {self._written} bytes, declared {self._size}")
        self._finished = True
        store = self._store
        try:
            if not self._multipart:
                await store._run(
                    store.client.put_object,
                    Bucket=store.bucket,
                    Key=self._key,
                    Body=self._take_body(),
                    ContentType="application/octet-stream",
                    Metadata=self._metadata,
                )
                return
            if self._pieces_bytes:
                await self._guarded(self._send_part())  # the last, shorter part
            while self._inflight:
                await self._guarded(self._collect_oldest())
            expected = -(-self._size // self._part_size)
            if sorted(self._etags) != list(range(1, expected + 1)):
                raise RuntimeError(f"parts {sorted(self._etags)} do not cover 1..{expected}")
            parts = [{"PartNumber": n, "ETag": self._etags[n]} for n in sorted(self._etags)]
            # The object appears here, whole, or not at all.
            await store._run(
                store.client.complete_multipart_upload,
                Bucket=store.bucket,
                Key=self._key,
                UploadId=self._upload.upload_id,
                MultipartUpload={"Parts": parts},
            )
            self._upload.upload_id = None
        except BaseException:
            await self._abort_upload()
            raise
        finally:
            self._finalizer.detach()

    async def abort(self) -> None:
        self._finished = True
        self._pieces, self._pieces_bytes = [], 0
        await self._abort_upload()
        self._finalizer.detach()

    async def _abort_upload(self) -> None:
        if not self._upload.started:
            return
        # Shielded: a cancelled caller must not leave the upload half-aborted. The default executor,
        # not ours: the abort waits for parts queued on our pool and must not take one of its threads.
        await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, self._upload.abort))
