"""ArtifactService over gRPC: verified streaming upload/download, stat, find-missing, manifests and
the provenance graph (spec 13.1). Contract and limits: protos/missionweave/v1/artifact_service.proto.

Who may do what (issue 13 item 3, docs/artifacts-storage.md "Authorization and quota", D77):
uploads by proven identities within a per-identity quota; reads by operators, by the blob's holders
and by active members of a Group that references it (``missionweave_server/services/artifacts/access.py``); any other read
is answered as for a blob that does not exist.

This module is the servicer, its RPCs' rules and its registration (Download's pre-serialized
responses); each mechanism is in the module named for it: Upload (``uploads.py``), the quota and
its reservations (``quota.py``), an upload's manifest (``manifest_check.py``), Download and the
lookups (``reads.py``), the batches of small blobs (``batches.py``) and QueryProvenance
(``provenance.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from missionweave.kernel.clock import Clock
from missionweave.kernel.errors import Rejected
from missionweave.v1 import artifact_service_pb2 as pb
from missionweave.v1 import artifact_service_pb2_grpc as pb_grpc
from missionweave_server.edge.callers import Access, CallAuthenticator, Caller, requires
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.edge.status import rejections_as_status, streaming_edge
from missionweave_server.services.artifacts.batches import Batches
from missionweave_server.services.artifacts.blobstore import BlobStore
from missionweave_server.services.artifacts.download_frame import download_frame
from missionweave_server.services.artifacts.index import ArtifactIndex
from missionweave_server.services.artifacts.provenance import Provenance
from missionweave_server.services.artifacts.quota import DEFAULT_QUOTA_BYTES
from missionweave_server.services.artifacts.verify import Counters


@rejections_as_status
class ArtifactServicer(Batches, Provenance, pb_grpc.ArtifactServiceServicer):
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

    # ------------------------------------------------------------ upload

    @requires(Access.IDENTITY, streamed_request=True)
    async def Upload(
        self,
        request_iterator: AsyncIterator[pb.UploadRequest],
        context: grpc.aio.ServicerContext,
        caller: Caller,
    ) -> pb.UploadResponse:
        try:
            return await self._upload(request_iterator, context, caller)
        except Rejected:
            Counters.rejected_uploads += 1
            raise

    # ------------------------------------------------------------ batches of small blobs

    @requires(Access.IDENTITY)
    async def BatchUpload(
        self, request: pb.BatchUploadRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.BatchUploadResponse:
        return await self.batch_upload(request, caller)

    @requires(Access.IDENTITY)
    async def BatchDownload(
        self, request: pb.BatchDownloadRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.BatchDownloadResponse:
        return await self.batch_download(request, caller)

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

    @requires(Access.IDENTITY)
    async def Stat(
        self, request: pb.StatRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.StatResponse:
        return await self.stat(request, caller)

    @requires(Access.IDENTITY)
    async def FindMissing(
        self, request: pb.FindMissingRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.FindMissingResponse:
        return await self.find_missing(request, caller)

    @requires(Access.IDENTITY)
    async def GetManifest(
        self, request: pb.GetManifestRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetManifestResponse:
        return await self.get_manifest(request, caller)

    @requires(Access.IDENTITY)
    async def QueryProvenance(
        self, request: pb.QueryProvenanceRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.QueryProvenanceResponse:
        return await self.query_provenance(request, caller)


def add_artifact_service(servicer: ArtifactServicer, server: grpc.aio.Server) -> None:
    """Add the generated handlers, except that Download streams pre-serialized responses."""

    class _Capture:
        name = ""
        handlers: dict[str, grpc.RpcMethodHandler] = {}

        def add_generic_rpc_handlers(self, _handlers: object) -> None:
            pass  # rebuilt below from the registered handler table

        def add_registered_method_handlers(
            self, name: str, handlers: dict[str, grpc.RpcMethodHandler]
        ) -> None:
            self.name, self.handlers = name, dict(handlers)

    capture = _Capture()
    pb_grpc.add_ArtifactServiceServicer_to_server(servicer, capture)  # type: ignore[arg-type]  # duck-typed capture
    download = capture.handlers["Download"]
    capture.handlers["Download"] = download._replace(  # type: ignore[attr-defined]
        unary_stream=streaming_edge("Artifact", "Download", type(servicer).download_serialized).__get__(
            servicer
        ),
        response_serializer=None,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.name, capture.handlers),))
