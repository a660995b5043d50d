"""What a caller may read, and the reads (spec 13.1): Download's verified range, Stat, FindMissing and
GetManifest. Each answers a blob the caller may not read exactly as one that is not stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from missionweave.kernel.clock import Clock, to_micros, to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import artifact_service_pb2 as pb
from missionweave.v1 import common_pb2
from missionweave_server.edge.callers import Caller
from missionweave_server.observability import metrics
from missionweave_server.services.artifacts.access import Readers
from missionweave_server.services.artifacts.blobstore import EMPTY_BLAKE3, BlobStore
from missionweave_server.services.artifacts.index import ArtifactIndex, BlobRecord, ManifestRecord
from missionweave_server.services.artifacts.verify import artifact_error, check_digest, verified_range

R = common_pb2.RejectionReason

MAX_FIND_MISSING = 10_000
# Blob bytes served (one increment per chunk).
ARTIFACT_BYTES_OUT = metrics.ARTIFACT_BYTES.labels("out")


def blake3_digest(hex_digest: str, size: int) -> common_pb2.Digest:
    return common_pb2.Digest(algorithm="blake3", hex=hex_digest, size_bytes=size)


class Reads:
    """The reading part of the servicer (a base of ``service.ArtifactServicer``, which sets these attributes)."""

    store: BlobStore
    index: ArtifactIndex
    clock: Clock
    # The Authority's public contract on a mesh channel (``service.ArtifactServicer``).
    authority: Any | None

    def _readers(self, caller: Caller) -> Readers:
        return Readers(caller, self.index, self.authority)

    async def _download(
        self, request: pb.DownloadRequest, caller: Caller
    ) -> AsyncIterator[tuple[int, bytes]]:
        hex_digest, size, _ = await self._known(request.digest, self._readers(caller))
        async for offset, data in verified_range(
            self.store, hex_digest, size, request.offset, request.length
        ):
            ARTIFACT_BYTES_OUT.inc(len(data))
            yield offset, data
        if size:  # whatever the range, verified_range hashed the whole blob before its last piece
            self.index.note_verified((hex_digest,), to_micros(self.clock.now()))

    async def _known(self, digest: common_pb2.Digest, readers: Readers) -> tuple[str, int, BlobRecord | None]:
        """The blob, stored with this size and readable by the caller, and its record (None for the
        empty blob); NOT_FOUND otherwise, with the same message whichever of the three is false."""
        hex_digest, size = check_digest(digest)
        if hex_digest == EMPTY_BLAKE3:
            return hex_digest, 0, None
        record, held = await self.index.blob_held(hex_digest, readers.caller.identity_id)
        if not same_size(record, size) or not await readers.may_read(hex_digest, held):
            raise not_found(hex_digest, size)
        return hex_digest, size, record

    async def _visible_manifests(
        self, readers: Readers, records: list[ManifestRecord]
    ) -> list[ManifestRecord]:
        return [r for r in records if await readers.sees_manifest(r)]

    async def stat(self, request: pb.StatRequest, caller: Caller) -> pb.StatResponse:
        readers = self._readers(caller)
        hex_digest, size, record = await self._known(request.digest, readers)
        manifests = await self._visible_manifests(readers, await self.index.manifests_of(hex_digest))
        response = pb.StatResponse(digest=blake3_digest(hex_digest, size), manifest_count=len(manifests))
        if record is not None:
            response.stored_at.CopyFrom(to_timestamp(_from_us(record.stored_us)))
            response.last_verified_at.CopyFrom(to_timestamp(_from_us(record.verified_us)))
        return response

    async def find_missing(self, request: pb.FindMissingRequest, caller: Caller) -> pb.FindMissingResponse:
        if len(request.digests) > MAX_FIND_MISSING:
            raise artifact_error(
                R.REJECTION_REASON_TOO_LARGE,
                "TOO_LARGE",
                f"at most {MAX_FIND_MISSING} digests per request",
            )
        checked = [(d, *check_digest(d, f"digests[{i}]")) for i, d in enumerate(request.digests)]
        present = await self.index.present(h for _, h, _ in checked)
        # A blob the caller may not read is missing for it (an upload then proves possession).
        present = await self._readers(caller).readable(present)
        return pb.FindMissingResponse(
            missing_digests=[d for d, h, _ in checked if h != EMPTY_BLAKE3 and h not in present]
        )

    async def get_manifest(self, request: pb.GetManifestRequest, caller: Caller) -> pb.GetManifestResponse:
        hex_digest, _size = check_digest(request.digest)
        readers = self._readers(caller)
        if not await readers.may_read(hex_digest):
            return pb.GetManifestResponse()  # as for a blob without manifests
        records = await self.index.manifests_of(hex_digest, request.work_item_id, request.producer_agent_id)
        return pb.GetManifestResponse(
            manifests=[
                common_pb2.SignedEnvelope.FromString(r.envelope)
                for r in await self._visible_manifests(readers, records)
            ]
        )


def not_found(hex_digest: str, size: int) -> Rejected:
    """The one answer for a blob that is absent, stored with another size or not readable."""
    return artifact_error(
        R.REJECTION_REASON_NOT_FOUND, "NOT_FOUND", f"no blob blake3:{hex_digest} of {size} bytes"
    )


def same_size(record: BlobRecord | None, size: int) -> bool:
    """Stored under this digest with this size (the index names a blob by both)."""
    return record is not None and record.size_bytes == size


def _from_us(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1_000_000, UTC)
