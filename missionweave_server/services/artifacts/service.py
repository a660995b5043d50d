"""ArtifactService over gRPC: verified streaming upload/download, stat, find-missing, manifests and
the provenance graph (spec 13.1). Contract and limits: protos/missionweave/v1/artifact_service.proto.

Who may do what (issue 13 item 3, docs/artifacts-storage.md "Authorization and quota", D77):
uploads by proven identities within a per-identity quota; reads by operators, by the blob's holders
and by active members of a Group that references it (``missionweave_server/services/artifacts/access.py``); any other read
is answered as for a blob that does not exist."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import blake3
import grpc

from missionweave.kernel.clock import Clock, to_micros, to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.kernel.manifest import (
    ManifestError,
    ManifestErrorCode,
    manifest_digest,
    manifest_ref,
    missing_fields,
    verify_manifest,
)
from missionweave.kernel.signing import parse_session_key_id
from missionweave.kernel.uploads import GO_AHEAD, MAX_BATCH_BYTES  # under the transport limit (D128)
from missionweave.v1 import artifact_service_pb2 as pb
from missionweave.v1 import artifact_service_pb2_grpc as pb_grpc
from missionweave.v1 import common_pb2
from missionweave_server.edge.callers import Access, CallAuthenticator, Caller, requires
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.edge.status import rejections_as_status, streaming_edge
from missionweave_server.observability import metrics
from missionweave_server.services.artifacts.access import Readers
from missionweave_server.services.artifacts.blobstore import (
    CHUNK_BYTES,
    EMPTY_BLAKE3,
    BlobStore,
    BlobWriter,
    CountingWriter,
    storage_full,
)
from missionweave_server.services.artifacts.download_frame import download_frame
from missionweave_server.services.artifacts.index import ArtifactIndex, BlobRecord, Edge, ManifestRecord
from missionweave_server.services.artifacts.verify import (
    Counters,
    artifact_error,
    check_digest,
    check_piece,
    check_received,
    check_whole,
    verified_range,
)
from missionweave_server.storage.aio import cancel_and_wait

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.artifacts")

MAX_MANIFEST_BYTES = 64 * 1024
MAX_FIND_MISSING = 10_000
# Blob bytes received and served (one increment per chunk).
ARTIFACT_BYTES_IN = metrics.ARTIFACT_BYTES.labels("in")
ARTIFACT_BYTES_OUT = metrics.ARTIFACT_BYTES.labels("out")
MAX_PROVENANCE_DEPTH = 32
MAX_PROVENANCE_NODES = 10_000
DEFAULT_QUOTA_BYTES = 10 * 1024**3  # per identity (MWP_ARTIFACT_QUOTA_BYTES; 0 = no quota)
# An upload's quota reservation (D119) is renewed this often while it is received, and lapses this
# long after its last renewal (its replica died mid-upload).
RESERVATION_RENEW_S = 60.0
RESERVATION_TTL = timedelta(minutes=5)


def blake3_digest(hex_digest: str, size: int) -> common_pb2.Digest:
    return common_pb2.Digest(algorithm="blake3", hex=hex_digest, size_bytes=size)


@rejections_as_status
class ArtifactServicer(pb_grpc.ArtifactServiceServicer):
    SERVICE = "missionweave.v1.ArtifactService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave_server/mesh/server.py)

    def __init__(
        self,
        store: BlobStore,
        index: ArtifactIndex,
        identities: IdentityDirectoryClient,
        clock: Clock,
        *,
        authority: Any | None = None,
        quota_bytes: int = DEFAULT_QUOTA_BYTES,
    ) -> None:
        self.store = store
        self.index = index
        self.identities = identities
        self.clock = clock
        # The Authority's public contract on a mesh channel (GetGroupState answers a mesh service in
        # full): whether a caller is an active member of a Group that references a blob.
        self.authority = authority
        self.quota_bytes = quota_bytes

    def _readers(self, caller: Caller) -> Readers:
        return Readers(caller, self.index, self.authority)

    # ------------------------------------------------------------ upload

    @requires(Access.IDENTITY, streamed_request=True)
    async def Upload(
        self, request_iterator: AsyncIterator[pb.UploadRequest], context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.UploadResponse:
        try:
            return await self._upload(request_iterator, context, caller)
        except Rejected:
            Counters.rejected_uploads += 1
            raise

    async def _upload(
        self, requests: AsyncIterator[pb.UploadRequest], context: grpc.aio.ServicerContext, caller: Caller  # type: ignore[type-arg]
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
            stored = _same_size(await self.index.blob(hex_digest), size)
        # Dedup is no access grant: only a caller that may already read the blob skips the bytes.
        # Anyone else streams them, and they must hash to the digest (proof of possession) before
        # it becomes a holder; a blob already stored is verified, not stored again. The answer is
        # the same whether or not someone else had stored these bytes (no existence oracle).
        existed = stored and await self._readers(caller).may_read(hex_digest)
        if not existed:
            await self._receive_as_holder(requests, context, caller, hex_digest, size, stored=stored, reservation=reservation)
        response = pb.UploadResponse(digest=blake3_digest(hex_digest, size), already_existed=existed)
        if manifest is not None:
            record, sources = manifest
            await self.index.record_manifest(record, sources)
            response.manifest_digest.CopyFrom(manifest_ref(header.manifest))
        return response

    def _quota_of(self, caller: Caller) -> bool:
        """Whether the caller's uploads count against a quota (operators and mesh services have none)."""
        return bool(self.quota_bytes and caller.identity_id and not caller.operator)

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
            await self.index.record_stored(fresh, [(hex_digest, size)], identity, now, [reservation] if reservation else [])
            reservation = ""  # it became the holding
        finally:
            await cancel_and_wait(renewals)
            if reservation:
                await self.index.release(reservation)

    async def _reserve(self, identity: str, size: int, *, unless_stored: str = "") -> str | None:
        """For a caller with a quota (``_quota_of``). Refused before a byte is received: what the
        identity holds plus what it is uploading now, to any replica, would exceed
        MWP_ARTIFACT_QUOTA_BYTES. Otherwise the upload's reservation, counted by every replica until
        it ends (None when ``unless_stored`` names a blob of this size that is stored already)."""
        now = self.clock.now()
        reservation, used = await self.index.reserve(
            identity, size, self.quota_bytes, to_micros(now), to_micros(now + RESERVATION_TTL), unless_stored=unless_stored
        )
        if reservation == "":
            raise artifact_error(
                R.REJECTION_REASON_QUOTA_EXCEEDED,
                "QUOTA_EXCEEDED",
                f"{identity} holds or is uploading {used} bytes; {size} more would exceed its quota of "
                f"{self.quota_bytes} bytes (nothing was stored)",
                quota_bytes=self.quota_bytes,
                used_bytes=used,
            )
        return reservation

    async def _keep_reserved(self, reservation: str) -> None:
        """While the upload lasts, however long: a replica that dies leaves a reservation that
        lapses one RESERVATION_TTL after its last renewal."""
        while True:
            await asyncio.sleep(RESERVATION_RENEW_S)
            try:
                await self.index.renew(reservation, to_micros(self.clock.now() + RESERVATION_TTL))
            except Exception:  # the next renewal tries again; the upload itself goes on
                log.warning("renewing an upload's quota reservation failed", exc_info=True)

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

    async def _check_manifest(
        self, header: pb.UploadHeader, hex_digest: str, size: int
    ) -> tuple[ManifestRecord, list[str]]:
        """MW-13.1-03: the manifest is signed by its producer's session key and describes these bytes."""
        envelope = header.manifest
        if envelope.ByteSize() > MAX_MANIFEST_BYTES:
            raise artifact_error(
                R.REJECTION_REASON_TOO_LARGE, "TOO_LARGE", f"manifests are at most {MAX_MANIFEST_BYTES} bytes"
            )
        key = None
        if envelope.signatures:
            parsed = parse_session_key_id(envelope.signatures[0].key_id)
            if parsed is not None:
                key = await self.identities.session_key(*parsed)
        if key is None:
            raise artifact_error(
                R.REJECTION_REASON_SIGNATURE_INVALID,
                "MANIFEST_SIGNATURE_INVALID",
                "the manifest is not signed by a known session key",
            )
        signer = parsed[0] if parsed else ""
        try:
            manifest = verify_manifest(
                envelope, key, expected_digest_hex=hex_digest, expected_size=size, producer_id=signer
            )
        except ManifestError as error:
            signature = error.code == ManifestErrorCode.MANIFEST_SIGNATURE_INVALID
            reason = (
                R.REJECTION_REASON_SIGNATURE_INVALID if signature else R.REJECTION_REASON_INVALID_ARGUMENT
            )
            raise artifact_error(reason, error.code.value, str(error)) from None
        missing = missing_fields(manifest)
        if missing:
            raise artifact_error(
                R.REJECTION_REASON_INVALID_ARGUMENT,
                "MANIFEST_MISMATCH",
                f'the manifest leaves out {", ".join(missing)} (MW-13.1-03; use schema_id "none" for unstructured content)',
            )
        record = ManifestRecord(
            manifest_digest=manifest_digest(envelope),
            content_digest=hex_digest,
            producer_agent_id=manifest.producer_agent_id,
            group_id=manifest.group_id,
            work_item_id=manifest.work_item_id,
            media_type=manifest.media_type,
            envelope=envelope.SerializeToString(),
        )
        sources = [check_digest(s, "manifest.source_artifacts")[0] for s in manifest.source_artifacts]
        return record, sources

    # ------------------------------------------------------------ batches of small blobs

    @requires(Access.IDENTITY)
    async def BatchUpload(
        self, request: pb.BatchUploadRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.BatchUploadResponse:
        """Each blob as Upload would take it (the same checks, in the same order: digest, manifest,
        quota, bytes), stored together: one grouped write and one index commit for the batch."""
        if len(request.blobs) > MAX_FIND_MISSING:
            raise _batch_too_large("blobs", f"at most {MAX_FIND_MISSING} blobs per request")
        entries = [_Entry(i, b) for i, b in enumerate(request.blobs)]
        # Not request.ByteSize(): upb encodes the whole message to size it (20 ms for 2 MiB).
        if sum(len(e.data) + e.blob.manifest.ByteSize() for e in entries) > MAX_BATCH_BYTES:
            raise _batch_too_large("blobs", f"the blobs and manifests of a batch total at most {MAX_BATCH_BYTES} bytes")
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
                raise _batch_too_large(f"blobs[{entry.index}]", f"a blob in a batch is at most {MAX_BATCH_BYTES} bytes; use Upload")
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
        outcomes = dict(zip((e.hex for e in unique), await self.store.put_many([(e.hex, e.data) for e in unique]), strict=True))
        for e in entries:
            failure = outcomes.get(e.hex)
            if failure is None:
                continue
            if not storage_full(failure):
                raise failure
            e.refused = self._storage_full(failure)

    @requires(Access.IDENTITY)
    async def BatchDownload(
        self, request: pb.BatchDownloadRequest, context: grpc.aio.ServicerContext, caller: Caller
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
                    raise _batch_too_large(f"digests[{i}]", f"a blob in a batch is at most {MAX_BATCH_BYTES} bytes; use Download")
                wanted[i] = (hex_digest, size)
            except Rejected as refusal:
                results[i].rejection.CopyFrom(refusal.to_proto())
        if sum(size for _, size in wanted.values()) > MAX_BATCH_BYTES:
            raise _batch_too_large("digests", f"the blobs of a BatchDownload total at most {MAX_BATCH_BYTES} bytes")
        sizes = await self.index.sizes(h for h, _ in wanted.values())
        readable = await self._readers(caller).readable(h for h, n in wanted.values() if sizes.get(h) == n)
        unique = {(h, n) for h, n in wanted.values() if h in readable and sizes.get(h) == n}
        read = dict(zip(unique, await asyncio.gather(*(self._read_whole(h, n) for h, n in unique)), strict=True))
        for i, (hex_digest, size) in wanted.items():
            if hex_digest == EMPTY_BLAKE3:
                continue
            outcome = read.get((hex_digest, size), _not_found(hex_digest, size))
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

    # ------------------------------------------------------------ download and lookups
    # Each read answers a blob the caller may not read exactly as one that is not stored.

    @requires(Access.IDENTITY)
    async def Download(
        self, request: pb.DownloadRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> AsyncIterator[pb.DownloadResponse]:
        async for offset, data in self._download(request, caller):
            yield pb.DownloadResponse(offset=offset, data=data)

    async def download_serialized(
        self, request: pb.DownloadRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> AsyncIterator[bytes]:
        """Download as registered on the server: each response serialized here (``download_frame``),
        not by grpc.aio, whose own serialization of 1 MiB messages halved the throughput
        (bench/README.md, artifacts). The same rule as ``Download``: it is what the server runs for
        that RPC."""
        async for offset, data in self._download(request, caller):
            yield download_frame(offset, data)

    download_serialized.__name__ = "Download"  # the call proof names the RPC, not this method
    download_serialized = requires(Access.IDENTITY)(download_serialized)

    async def _download(self, request: pb.DownloadRequest, caller: Caller) -> AsyncIterator[tuple[int, bytes]]:
        hex_digest, size, _ = await self._known(request.digest, self._readers(caller))
        async for offset, data in verified_range(self.store, hex_digest, size, request.offset, request.length):
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
        if not _same_size(record, size) or not await readers.may_read(hex_digest, held):
            raise _not_found(hex_digest, size)
        return hex_digest, size, record

    async def _visible_manifests(self, readers: Readers, records: list[ManifestRecord]) -> list[ManifestRecord]:
        return [r for r in records if await readers.sees_manifest(r)]

    @requires(Access.IDENTITY)
    async def Stat(self, request: pb.StatRequest, context: grpc.aio.ServicerContext, caller: Caller) -> pb.StatResponse:
        readers = self._readers(caller)
        hex_digest, size, record = await self._known(request.digest, readers)
        manifests = await self._visible_manifests(readers, await self.index.manifests_of(hex_digest))
        response = pb.StatResponse(digest=blake3_digest(hex_digest, size), manifest_count=len(manifests))
        if record is not None:
            response.stored_at.CopyFrom(to_timestamp(_from_us(record.stored_us)))
            response.last_verified_at.CopyFrom(to_timestamp(_from_us(record.verified_us)))
        return response

    @requires(Access.IDENTITY)
    async def FindMissing(
        self, request: pb.FindMissingRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.FindMissingResponse:
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

    @requires(Access.IDENTITY)
    async def GetManifest(
        self, request: pb.GetManifestRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetManifestResponse:
        hex_digest, _size = check_digest(request.digest)
        readers = self._readers(caller)
        if not await readers.may_read(hex_digest):
            return pb.GetManifestResponse()  # as for a blob without manifests
        records = await self.index.manifests_of(hex_digest, request.work_item_id, request.producer_agent_id)
        return pb.GetManifestResponse(
            manifests=[
                common_pb2.SignedEnvelope.FromString(r.envelope) for r in await self._visible_manifests(readers, records)
            ]
        )

    @requires(Access.IDENTITY)
    async def QueryProvenance(
        self, request: pb.QueryProvenanceRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.QueryProvenanceResponse:
        hex_digest, _size = check_digest(request.digest)
        if request.max_depth > MAX_PROVENANCE_DEPTH:
            raise artifact_error(
                R.REJECTION_REASON_INVALID_ARGUMENT,
                "PROTOCOL_VIOLATION",
                f"max_depth is at most {MAX_PROVENANCE_DEPTH}",
                field="max_depth",
                limit=MAX_PROVENANCE_DEPTH,
            )
        return await self._walk(
            hex_digest,
            request.direction or pb.PROVENANCE_DIRECTION_BOTH,
            request.max_depth or 8,
            self._readers(caller),
            request.group_id,
        )

    async def _walk(
        self, root: str, direction: int, max_depth: int, readers: Readers, group_id: str = ""
    ) -> pb.QueryProvenanceResponse:
        """Breadth-first over the manifest-declared edges (ancestors = sources, descendants = derived).

        Only edges whose manifest the caller may see (and of ``group_id`` when given) are followed,
        and only to blobs it may read: the walk neither shows nor passes through anything else, so
        no digest of a blob the caller may not read is revealed. A root it may not read has no graph.
        """
        up = direction in (pb.PROVENANCE_DIRECTION_ANCESTORS, pb.PROVENANCE_DIRECTION_BOTH)
        down = direction in (pb.PROVENANCE_DIRECTION_DESCENDANTS, pb.PROVENANCE_DIRECTION_BOTH)
        response = pb.QueryProvenanceResponse()
        if not await readers.may_read(root):
            return response
        depth_of: dict[str, tuple[int, bool]] = {root: (0, False)}
        frontier: list[str] = [root]
        seen_edges: set[Edge] = set()
        while frontier:
            level = set(frontier)
            frontier = []
            steps: list[tuple[Edge, str, int, bool]] = []  # edge, the node it leads to, its depth, upwards
            for edge in await self.index.edges_touching(level):
                if edge in seen_edges or (group_id and edge.group_id != group_id):
                    continue
                for here, there, is_up in ((edge.derived, edge.source, True), (edge.source, edge.derived, False)):
                    if here not in level or (is_up and not up) or (not is_up and not down):
                        continue
                    depth = depth_of[here][0] + 1
                    if depth <= max_depth:
                        steps.append((edge, there, depth, is_up))
            visible = {edge for edge, *_ in steps if await readers.sees_edge(edge)}
            reachable = await readers.readable(there for edge, there, *_ in steps if edge in visible)
            for edge, there, depth, is_up in steps:
                if edge not in visible or there not in reachable:
                    continue
                seen_edges.add(edge)
                if there not in depth_of:
                    if len(depth_of) >= MAX_PROVENANCE_NODES:
                        response.truncated = True
                        continue
                    depth_of[there] = (depth, is_up)
                    frontier.append(there)
        described: dict[str, ManifestRecord] = {}
        for digest in depth_of:
            seen = await self._visible_manifests(readers, await self.index.manifests_of(digest))
            if seen:  # the first GetManifest would list: the same answer on every call
                described[digest] = seen[0]
        sizes = {d: (b.size_bytes if (b := await self.index.blob(d)) else 0) for d in depth_of}
        for digest, (depth, is_up) in depth_of.items():  # the start first (inserted first)
            info = described.get(digest)
            node = pb.ProvenanceNode(digest=blake3_digest(digest, sizes[digest]), depth=depth, is_ancestor=is_up)
            if info is not None:
                node.media_type, node.producer_agent_id, node.work_item_id = (
                    info.media_type, info.producer_agent_id, info.work_item_id
                )
                node.manifest_digest.CopyFrom(manifest_ref(common_pb2.SignedEnvelope.FromString(info.envelope)))
            response.nodes.append(node)
        for edge in sorted(seen_edges, key=lambda e: (e.source, e.derived, e.manifest_digest)):
            response.edges.append(
                pb.ProvenanceEdge(
                    source=blake3_digest(edge.source, sizes.get(edge.source, 0)),
                    derived=blake3_digest(edge.derived, sizes.get(edge.derived, 0)),
                    manifest_digest=common_pb2.Digest(algorithm="blake3", hex=edge.manifest_digest),
                )
            )
        return response


def _not_found(hex_digest: str, size: int) -> Rejected:
    """The one answer for a blob that is absent, stored with another size or not readable."""
    return artifact_error(R.REJECTION_REASON_NOT_FOUND, "NOT_FOUND", f"no blob blake3:{hex_digest} of {size} bytes")


def _same_size(record: BlobRecord | None, size: int) -> bool:
    """Stored under this digest with this size (the index names a blob by both)."""
    return record is not None and record.size_bytes == size


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
    return artifact_error(R.REJECTION_REASON_TOO_LARGE, "TOO_LARGE", message, field=field, limit=MAX_BATCH_BYTES)


def _from_us(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1_000_000, UTC)


def add_artifact_service(servicer: ArtifactServicer, server: grpc.aio.Server) -> None:
    """Add the generated handlers, except that Download streams pre-serialized responses."""

    class _Capture:
        name = ""
        handlers: dict[str, grpc.RpcMethodHandler] = {}

        def add_generic_rpc_handlers(self, _handlers: object) -> None:
            pass  # rebuilt below from the registered handler table

        def add_registered_method_handlers(self, name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
            self.name, self.handlers = name, dict(handlers)

    capture = _Capture()
    pb_grpc.add_ArtifactServiceServicer_to_server(servicer, capture)  # type: ignore[arg-type]  # duck-typed capture
    download = capture.handlers["Download"]
    capture.handlers["Download"] = download._replace(  # type: ignore[attr-defined]
        unary_stream=streaming_edge("Artifact", "Download", type(servicer).download_serialized).__get__(servicer),
        response_serializer=None
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.name, capture.handlers),))
