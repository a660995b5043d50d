"""BatchUpload and BatchDownload (spec 13.1): many small blobs in one call, each taken or answered as
Upload or Download would, stored with one grouped write and one index commit."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from missionweave.kernel.clock import to_micros
from missionweave.kernel.errors import Rejected
from missionweave.kernel.manifest import manifest_ref
from missionweave.kernel.uploads import MAX_BATCH_BYTES  # under the transport limit (D128)
from missionweave.v1 import artifact_service_pb2 as pb
from missionweave.v1 import common_pb2
from missionweave_server.edge.callers import Caller
from missionweave_server.services.artifacts.blobstore import EMPTY_BLAKE3, storage_full
from missionweave_server.services.artifacts.index import ManifestRecord
from missionweave_server.services.artifacts.reads import ARTIFACT_BYTES_OUT, MAX_FIND_MISSING, not_found
from missionweave_server.services.artifacts.uploads import ARTIFACT_BYTES_IN, Uploads
from missionweave_server.services.artifacts.verify import (
    artifact_error,
    check_digest,
    check_whole,
    verified_range,
)

R = common_pb2.RejectionReason


class Batches(Uploads):
    """The batch part of the servicer (a base of ``service.ArtifactServicer``)."""

    async def batch_upload(self, request: pb.BatchUploadRequest, caller: Caller) -> pb.BatchUploadResponse:
        """Each blob as Upload would take it (the same checks, in the same order: digest, manifest,
        quota, bytes), stored together: one grouped write and one index commit for the batch."""
        if len(request.blobs) > MAX_FIND_MISSING:
            raise _batch_too_large("blobs", f"at most {MAX_FIND_MISSING} blobs per request")
        entries = [_Entry(i, b) for i, b in enumerate(request.blobs)]
        # Not request.ByteSize(): upb encodes the whole message to size it (20 ms for 2 MiB).
        if sum(len(e.data) + e.blob.manifest.ByteSize() for e in entries) > MAX_BATCH_BYTES:
            raise _batch_too_large(
                "blobs", f"the blobs and manifests of a batch total at most {MAX_BATCH_BYTES} bytes"
            )
        for entry in entries:
            await self._judge_header(entry)
        live = [e for e in entries if e.refused is None]
        sizes = await self.index.sizes(e.hex for e in live if e.hex != EMPTY_BLAKE3)
        for e in live:
            e.stored = e.hex == EMPTY_BLAKE3 or sizes.get(e.hex) == e.size
        readable = await self._readers(caller).readable(e.hex for e in live if e.stored)
        for e in live:
            e.existed = e.stored and e.hex in readable
        identity = caller.identity_id  # "" for a mesh service
        reservations = await self._reserve_batch(caller, [e for e in live if not e.existed])
        try:
            for e in live:
                if e.refused is None and (e.data or not e.existed):
                    e.refuse_if(functools.partial(check_whole, e.hex, e.size, e.data))
            verified = [e for e in live if e.refused is None]
            await self._store_batch([e for e in verified if not e.stored])
            kept = [e for e in verified if e.refused is None]
            fresh = {(e.hex, e.size) for e in kept if not e.stored and e.hex != EMPTY_BLAKE3}
            held = {(e.hex, e.size) for e in kept if not e.existed}
            # The reservations end with the holdings they became (or, for refused blobs, nothing).
            await self.index.record_stored(fresh, held, identity, to_micros(self.clock.now()), reservations)
            reservations = []
            ARTIFACT_BYTES_IN.inc(sum(len(e.data) for e in kept))
            for e in kept:
                if e.manifest is not None:
                    await self.index.record_manifest(*e.manifest)
        finally:
            for reservation in reservations:
                await self.index.release(reservation)
        return pb.BatchUploadResponse(results=[e.result() for e in entries])

    async def _judge_header(self, entry: _Entry) -> None:
        """What Upload checks on its header: the digest, the batch's per-blob limit, the manifest."""
        try:
            entry.hex, entry.size = check_digest(entry.blob.digest, f"blobs[{entry.index}].digest")
            if entry.size > MAX_BATCH_BYTES:
                raise _batch_too_large(
                    f"blobs[{entry.index}]",
                    f"a blob in a batch is at most {MAX_BATCH_BYTES} bytes; use Upload",
                )
            if entry.blob.HasField("manifest"):
                header = pb.UploadHeader(digest=entry.blob.digest, manifest=entry.blob.manifest)
                entry.manifest = await self._check_manifest(header, entry.hex, entry.size)
        except Rejected as refusal:
            entry.refused = refusal

    async def _reserve_batch(self, caller: Caller, entries: list[_Entry]) -> list[str]:
        """Upload's quota reservation (D119) for the blobs the caller will newly hold: once for all
        of them, and only if they do not fit together, blob by blob in request order (each refused
        one is QUOTA_EXCEEDED as its Upload would be). Not renewed: a batch of at most 3 MiB ends
        long before a reservation lapses (RESERVATION_TTL)."""
        if not self._quota_of(caller) or not entries:
            return []
        try:
            whole = await self._reserve(caller.identity_id, sum(e.size for e in entries))
            return [whole] if whole else []
        except Rejected:
            pass
        reservations = []
        for e in entries:
            try:
                reservations.append(await self._reserve(caller.identity_id, e.size))
            except Rejected as refusal:
                e.refused = refusal
        return [r for r in reservations if r]

    async def _store_batch(self, entries: list[_Entry]) -> None:
        """Writes the verified new blobs (once each: a digest may come twice) together; a blob the
        store could not keep gets Upload's refusal (STORAGE_FULL), any other failure fails the call."""
        unique = list({e.hex: e for e in entries if e.hex != EMPTY_BLAKE3}.values())
        if not unique:
            return
        outcomes = dict(
            zip(
                (e.hex for e in unique),
                await self.store.put_many([(e.hex, e.data) for e in unique]),
                strict=True,
            )
        )
        for e in entries:
            failure = outcomes.get(e.hex)
            if failure is None:
                continue
            if not storage_full(failure):
                raise failure
            e.refused = self._storage_full(failure)

    async def batch_download(
        self, request: pb.BatchDownloadRequest, caller: Caller
    ) -> pb.BatchDownloadResponse:
        """Each blob as Download would answer it, whole, verified at rest before it is returned."""
        if len(request.digests) > MAX_FIND_MISSING:
            raise _batch_too_large("digests", f"at most {MAX_FIND_MISSING} digests per request")
        results = [pb.BatchDownloadResult(digest=d) for d in request.digests]
        wanted: dict[int, tuple[str, int]] = {}
        for i, digest in enumerate(request.digests):
            try:
                hex_digest, size = check_digest(digest, f"digests[{i}]")
                if size > MAX_BATCH_BYTES:
                    raise _batch_too_large(
                        f"digests[{i}]", f"a blob in a batch is at most {MAX_BATCH_BYTES} bytes; use Download"
                    )
                wanted[i] = (hex_digest, size)
            except Rejected as refusal:
                results[i].rejection.CopyFrom(refusal.to_proto())
        if sum(size for _, size in wanted.values()) > MAX_BATCH_BYTES:
            raise _batch_too_large(
                "digests", f"the blobs of a BatchDownload total at most {MAX_BATCH_BYTES} bytes"
            )
        sizes = await self.index.sizes(h for h, _ in wanted.values())
        readable = await self._readers(caller).readable(h for h, n in wanted.values() if sizes.get(h) == n)
        unique = {(h, n) for h, n in wanted.values() if h in readable and sizes.get(h) == n}
        read = dict(
            zip(unique, await asyncio.gather(*(self._read_whole(h, n) for h, n in unique)), strict=True)
        )
        for i, (hex_digest, size) in wanted.items():
            if hex_digest == EMPTY_BLAKE3:
                continue
            outcome = read.get((hex_digest, size), not_found(hex_digest, size))
            if isinstance(outcome, Rejected):
                results[i].rejection.CopyFrom(outcome.to_proto())
            else:
                results[i].data = outcome
        served = [d for d, outcome in read.items() if not isinstance(outcome, Rejected)]
        ARTIFACT_BYTES_OUT.inc(sum(size for _, size in served))
        if served:
            self.index.note_verified((h for h, _ in served), to_micros(self.clock.now()))
        return pb.BatchDownloadResponse(results=results)

    async def _read_whole(self, hex_digest: str, size: int) -> bytes | Rejected:
        """The whole blob through Download's verifying read, or its refusal (CORRUPTED, NOT_FOUND)."""
        try:
            return b"".join([piece async for _, piece in verified_range(self.store, hex_digest, size)])
        except Rejected as refusal:
            return refusal


class _Entry:
    """One blob of a BatchUpload on its way through Upload's checks."""

    def __init__(self, index: int, blob: pb.BatchUploadBlob) -> None:
        self.index, self.blob = index, blob
        self.data = blob.data  # once: each read of a bytes field copies it
        self.hex, self.size = "", 0
        self.manifest: tuple[ManifestRecord, list[str]] | None = None
        self.stored = self.existed = False
        self.refused: Rejected | None = None

    def refuse_if(self, check: Callable[[], None]) -> None:
        try:
            check()
        except Rejected as refusal:
            self.refused = refusal

    def result(self) -> pb.BatchUploadResult:
        result = pb.BatchUploadResult(digest=self.blob.digest)
        if self.refused is not None:
            result.rejection.CopyFrom(self.refused.to_proto())
            return result
        result.already_existed = self.existed
        if self.manifest is not None:
            result.manifest_digest.CopyFrom(manifest_ref(self.blob.manifest))
        return result


def _batch_too_large(field: str, message: str) -> Rejected:
    return artifact_error(
        R.REJECTION_REASON_TOO_LARGE, "TOO_LARGE", message, field=field, limit=MAX_BATCH_BYTES
    )
