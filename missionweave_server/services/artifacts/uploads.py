"""Upload (spec 13.1): the header's checks, dedup that grants no access, receiving and verifying the
bytes within the caller's quota, and the caller recorded as a holder of the blob."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import blake3
import grpc

from missionweave.kernel.clock import to_micros
from missionweave.kernel.errors import Rejected
from missionweave.kernel.manifest import manifest_ref
from missionweave.kernel.uploads import GO_AHEAD  # under the transport limit (D128)
from missionweave.v1 import artifact_service_pb2 as pb
from missionweave.v1 import common_pb2
from missionweave_server.edge.callers import Caller
from missionweave_server.observability import metrics
from missionweave_server.services.artifacts.blobstore import (
    CHUNK_BYTES,
    EMPTY_BLAKE3,
    BlobWriter,
    CountingWriter,
    storage_full,
)
from missionweave_server.services.artifacts.manifest_check import ManifestCheck
from missionweave_server.services.artifacts.quota import UploadQuota
from missionweave_server.services.artifacts.reads import Reads, blake3_digest, same_size
from missionweave_server.services.artifacts.verify import (
    artifact_error,
    check_digest,
    check_piece,
    check_received,
)
from missionweave_server.storage.aio import cancel_and_wait

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.artifacts")

# Blob bytes received (one increment per chunk).
ARTIFACT_BYTES_IN = metrics.ARTIFACT_BYTES.labels("in")


class Uploads(Reads, UploadQuota, ManifestCheck):
    """The upload part of the servicer (a base of ``service.ArtifactServicer``)."""

    async def _upload(
        self,
        requests: AsyncIterator[pb.UploadRequest],
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
        caller: Caller,
    ) -> pb.UploadResponse:
        first = await anext(requests, None)
        if first is None or not first.HasField("header"):
            raise artifact_error(
                R.REJECTION_REASON_MALFORMED, "PROTOCOL_VIOLATION", "an upload starts with its header"
            )
        header = first.header
        hex_digest, size = check_digest(header.digest, "header.digest")
        manifest = (
            await self._check_manifest(header, hex_digest, size) if header.HasField("manifest") else None
        )
        # A caller with a quota has its lookup and its reservation made in one transaction: a new
        # blob (the usual upload) is then reserved for before anyone knows it is new.
        reservation: str | None = None
        if hex_digest == EMPTY_BLAKE3:
            stored = True
        elif self._quota_of(caller):
            reservation = await self._reserve(caller.identity_id, size, unless_stored=hex_digest)
            stored = reservation is None
        else:
            stored = same_size(await self.index.blob(hex_digest), size)
        # Dedup is no access grant: only a caller that may already read the blob skips the bytes.
        # Anyone else streams them, and they must hash to the digest (proof of possession) before
        # it becomes a holder; a blob already stored is verified, not stored again. The answer is
        # the same whether or not someone else had stored these bytes (no existence oracle).
        existed = stored and await self._readers(caller).may_read(hex_digest)
        if not existed:
            await self._receive_as_holder(
                requests, context, caller, hex_digest, size, stored=stored, reservation=reservation
            )
        response = pb.UploadResponse(digest=blake3_digest(hex_digest, size), already_existed=existed)
        if manifest is not None:
            record, sources = manifest
            await self.index.record_manifest(record, sources)
            response.manifest_digest.CopyFrom(manifest_ref(header.manifest))
        return response

    async def _receive_as_holder(
        self,
        requests: AsyncIterator[pb.UploadRequest],
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
        caller: Caller,
        hex_digest: str,
        size: int,
        *,
        stored: bool,
        reservation: str | None = None,
    ) -> None:
        """Within the caller's quota (``reservation``, when made already): ask for the bytes
        (missionweave/kernel/uploads.py), receive and verify them (storing them unless already stored),
        then record the caller as a holder."""
        identity = caller.identity_id  # "" for a mesh service
        if reservation is None:
            reservation = await self._reserve(identity, size) if self._quota_of(caller) else ""
        renewals = asyncio.create_task(self._keep_reserved(reservation)) if reservation else None
        try:
            await context.send_initial_metadata(GO_AHEAD)
            await self._receive(requests, hex_digest, size, CountingWriter(size) if stored else None)
            # The blob (unless stored already), its holder and the end of its reservation in one
            # commit: one fsync, not two.
            fresh = [] if stored else [(hex_digest, size)]
            now = to_micros(self.clock.now())
            await self.index.record_stored(
                fresh, [(hex_digest, size)], identity, now, [reservation] if reservation else []
            )
            reservation = ""  # it became the holding
        finally:
            await cancel_and_wait(renewals)
            if reservation:
                await self.index.release(reservation)

    def _storage_full(self, exc: BaseException) -> Rejected:
        log.error(
            "the blob store is out of space: upload refused, nothing kept",
            extra={"backend": self.store.name, "error": f"{type(exc).__name__}: {exc}"},
        )
        return artifact_error(
            R.REJECTION_REASON_QUOTA_EXCEEDED,
            "STORAGE_FULL",
            "the artifact store is out of space; nothing of this upload was kept, retry later",
            backend=self.store.name,
        )

    async def _receive(
        self, requests: AsyncIterator[pb.UploadRequest], hex_digest: str, size: int, writer: BlobWriter | None
    ) -> None:
        """Hash while streaming into a temporary object (or, for a blob already stored, only hash:
        ``writer`` given); publish only when hash and size match."""
        if writer is None:
            try:
                writer = await self.store.open_writer(hex_digest, size)
            except Exception as exc:
                if storage_full(exc):
                    raise self._storage_full(exc) from exc
                raise
        hasher = blake3.blake3()
        received = 0
        try:
            async for request in requests:
                if not request.HasField("chunk"):
                    raise artifact_error(
                        R.REJECTION_REASON_MALFORMED, "PROTOCOL_VIOLATION", "only chunks follow the header"
                    )
                data = request.chunk.data
                if len(data) > CHUNK_BYTES:
                    raise artifact_error(
                        R.REJECTION_REASON_TOO_LARGE, "TOO_LARGE", f"chunks are at most {CHUNK_BYTES} bytes"
                    )
                check_piece(request.chunk.offset, len(data), received, size)
                hasher.update(data)
                await writer.write(data)
                received += len(data)
                ARTIFACT_BYTES_IN.inc(len(data))
            check_received(hex_digest, size, received, hasher.hexdigest())
            await writer.commit()
        except BaseException as exc:
            await writer.abort()  # cut off, refused, out of space or cancelled: nothing stays visible
            if isinstance(exc, Exception) and not isinstance(exc, Rejected) and storage_full(exc):
                raise self._storage_full(exc) from exc
            raise
