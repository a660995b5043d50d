"""ArtifactService over gRPC: verified streaming upload/download, stat, find-missing, manifests and
the provenance graph (spec 13.1). Contract and limits: protos/missionweave/v1/artifact_service.proto."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import blake3
import grpc

from artifactstore.blobstore import CHUNK_BYTES, EMPTY_BLAKE3, BlobStore, BlobWriter
from artifactstore.index import ArtifactIndex, ManifestRecord
from artifactstore.verify import Counters, artifact_error, check_digest, verified_range
from missionweave.clock import Clock, to_micros, to_timestamp
from missionweave.errors import Rejected
from missionweave.manifest import (
    ManifestError,
    ManifestErrorCode,
    manifest_digest,
    manifest_ref,
    missing_fields,
    verify_manifest,
)
from missionweave.rpc.callers import Access, CallAuthenticator, Caller, requires
from missionweave.rpc.identities import IdentityDirectoryClient
from missionweave.rpc.status import rejections_as_status, streaming_edge
from missionweave.signing import parse_session_key_id
from missionweave.v1 import artifact_service_pb2 as pb
from missionweave.v1 import artifact_service_pb2_grpc as pb_grpc
from missionweave.v1 import common_pb2

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.artifacts")

MAX_MANIFEST_BYTES = 64 * 1024
MAX_FIND_MISSING = 10_000
MAX_PROVENANCE_DEPTH = 32
MAX_PROVENANCE_NODES = 10_000


def blake3_digest(hex_digest: str, size: int) -> common_pb2.Digest:
    return common_pb2.Digest(algorithm="blake3", hex=hex_digest, size_bytes=size)


@rejections_as_status
class ArtifactServicer(pb_grpc.ArtifactServiceServicer):
    SERVICE = "missionweave.v1.ArtifactService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave/mesh/server.py)

    def __init__(
        self, store: BlobStore, index: ArtifactIndex, identities: IdentityDirectoryClient, clock: Clock
    ) -> None:
        self.store = store
        self.index = index
        self.identities = identities
        self.clock = clock

    # ------------------------------------------------------------ upload

    @requires(Access.IDENTITY)
    async def Upload(
        self, request_iterator: AsyncIterator[pb.UploadRequest], context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.UploadResponse:
        try:
            return await self._upload(request_iterator)
        except Rejected:
            Counters.rejected_uploads += 1
            raise

    async def _upload(self, requests: AsyncIterator[pb.UploadRequest]) -> pb.UploadResponse:
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
        existed = hex_digest == EMPTY_BLAKE3 or await self.index.blob(hex_digest) is not None
        if not existed:
            await self._receive(requests, hex_digest, size)
            await self.index.record_blob(hex_digest, size, to_micros(self.clock.now()))
        response = pb.UploadResponse(digest=blake3_digest(hex_digest, size), already_existed=existed)
        if manifest is not None:
            record, sources = manifest
            await self.index.record_manifest(record, sources)
            response.manifest_digest.CopyFrom(manifest_ref(header.manifest))
        return response

    async def _receive(self, requests: AsyncIterator[pb.UploadRequest], hex_digest: str, size: int) -> None:
        """Hash while streaming into a temporary object; publish only when hash and size match."""
        writer: BlobWriter = await self.store.open_writer(hex_digest, size)
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
                if request.chunk.offset != received or received + len(data) > size:
                    raise artifact_error(
                        R.REJECTION_REASON_INVALID_ARGUMENT,
                        "CHUNK_OUT_OF_RANGE",
                        f"chunk at {request.chunk.offset}+{len(data)}: expected offset {received} within size {size}",
                    )
                hasher.update(data)
                await writer.write(data)
                received += len(data)
            if received != size:
                raise artifact_error(
                    R.REJECTION_REASON_INVALID_ARGUMENT,
                    "INCOMPLETE_UPLOAD",
                    f"received {received} of {size} bytes",
                )
            if hasher.hexdigest() != hex_digest:
                raise artifact_error(
                    R.REJECTION_REASON_DIGEST_MISMATCH,
                    "DIGEST_MISMATCH",
                    f"the bytes hash to blake3:{hasher.hexdigest()}, not the declared blake3:{hex_digest}",
                )
            await writer.commit()
        except BaseException:
            await writer.abort()  # cut off, refused or cancelled: nothing stays visible
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

    # ------------------------------------------------------------ download and lookups

    @requires(Access.IDENTITY)
    async def Download(
        self, request: pb.DownloadRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> AsyncIterator[pb.DownloadResponse]:
        async for offset, data in self._download(request, context):
            yield pb.DownloadResponse(offset=offset, data=data)

    async def download_serialized(
        self, request: pb.DownloadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Download as registered on the server: each response serialized here, not by grpc.aio, whose
        own serialization of 1 MiB messages halved the throughput (bench/README.md, artifacts)."""
        async for offset, data in self._download(request, context):
            yield pb.DownloadResponse(offset=offset, data=data).SerializeToString()

    async def _download(
        self, request: pb.DownloadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tuple[int, bytes]]:
        hex_digest, size = await self._known(request.digest)
        async for piece in verified_range(self.store, hex_digest, size, request.offset, request.length):
            yield piece
        if size:  # the whole blob was hashed and matched: remember when (Stat.last_verified_at)
            await self.index.mark_verified(hex_digest, to_micros(self.clock.now()))

    async def _known(self, digest: common_pb2.Digest) -> tuple[str, int]:
        hex_digest, size = check_digest(digest)
        if hex_digest == EMPTY_BLAKE3:
            return hex_digest, 0
        record = await self.index.blob(hex_digest)
        if record is None or record.size_bytes != size:
            raise artifact_error(
                R.REJECTION_REASON_NOT_FOUND, "NOT_FOUND", f"no blob blake3:{hex_digest} of {size} bytes"
            )
        return hex_digest, size

    @requires(Access.IDENTITY)
    async def Stat(self, request: pb.StatRequest, context: grpc.aio.ServicerContext, caller: Caller) -> pb.StatResponse:
        hex_digest, size = await self._known(request.digest)
        record = await self.index.blob(hex_digest)
        response = pb.StatResponse(
            digest=blake3_digest(hex_digest, size), manifest_count=await self.index.manifest_count(hex_digest)
        )
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
        return pb.FindMissingResponse(
            missing_digests=[d for d, h, _ in checked if h != EMPTY_BLAKE3 and h not in present]
        )

    @requires(Access.IDENTITY)
    async def GetManifest(
        self, request: pb.GetManifestRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetManifestResponse:
        hex_digest, _size = check_digest(request.digest)
        records = await self.index.manifests_of(hex_digest, request.work_item_id, request.producer_agent_id)
        return pb.GetManifestResponse(
            manifests=[common_pb2.SignedEnvelope.FromString(r.envelope) for r in records]
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
            )
        return await self._walk(
            hex_digest, request.direction or pb.PROVENANCE_DIRECTION_BOTH, request.max_depth or 8
        )

    async def _walk(self, root: str, direction: int, max_depth: int) -> pb.QueryProvenanceResponse:
        """Breadth-first over the manifest-declared edges (ancestors = sources, descendants = derived)."""
        up = direction in (pb.PROVENANCE_DIRECTION_ANCESTORS, pb.PROVENANCE_DIRECTION_BOTH)
        down = direction in (pb.PROVENANCE_DIRECTION_DESCENDANTS, pb.PROVENANCE_DIRECTION_BOTH)
        response = pb.QueryProvenanceResponse()
        depth_of: dict[str, tuple[int, bool]] = {root: (0, False)}
        frontier: deque[str] = deque([root])
        seen_edges: set[tuple[str, str, str]] = set()
        while frontier:
            level = set(frontier)
            frontier.clear()
            for source, derived, manifest in await self.index.edges_touching(level):
                edge = (source, derived, manifest)
                if edge in seen_edges:
                    continue
                for here, there, is_up in ((derived, source, True), (source, derived, False)):
                    if here not in level or (is_up and not up) or (not is_up and not down):
                        continue
                    depth = depth_of[here][0] + 1
                    if depth > max_depth:
                        continue
                    seen_edges.add(edge)
                    if there not in depth_of:
                        if len(depth_of) >= MAX_PROVENANCE_NODES:
                            response.truncated = True
                            continue
                        depth_of[there] = (depth, is_up)
                        frontier.append(there)
        described = {
            r.content_digest: r for digest in depth_of for r in await self.index.manifests_of(digest)
        }
        sizes = {d: (b.size_bytes if (b := await self.index.blob(d)) else 0) for d in depth_of}
        for digest, (depth, is_up) in depth_of.items():
            if digest == root:
                continue
            info = described.get(digest)
            response.nodes.append(
                pb.ProvenanceNode(
                    digest=blake3_digest(digest, sizes[digest]),
                    depth=depth,
                    is_ancestor=is_up,
                    media_type=info.media_type if info else "",
                    producer_agent_id=info.producer_agent_id if info else "",
                    work_item_id=info.work_item_id if info else "",
                )
            )
        for source, derived, manifest in sorted(seen_edges):
            response.edges.append(
                pb.ProvenanceEdge(
                    source=blake3_digest(source, sizes.get(source, 0)),
                    derived=blake3_digest(derived, sizes.get(derived, 0)),
                    manifest_digest=common_pb2.Digest(algorithm="blake3", hex=manifest),
                )
            )
        return response


def _from_us(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1_000_000, UTC)


def add_artifact_service(servicer: ArtifactServicer, server: grpc.aio.Server) -> None:
    """Register the generated handlers, except that Download streams pre-serialized responses."""

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
    server.add_registered_method_handlers(capture.name, capture.handlers)
