"""PublicationService: the Authority's question "is this blob published with a signed manifest for
this Group, WorkItem and publisher?" (internal contract, protos/missionweave/internal/v1/)."""

from __future__ import annotations

import grpc

from artifactstore.index import ArtifactIndex
from missionweave.digests import HEX64
from missionweave.errors import R, Rejected
from missionweave.internal.v1 import publications_pb2 as pb
from missionweave.internal.v1 import publications_pb2_grpc as pb_grpc
from missionweave.rpc.callers import Access, CallAuthenticator, Caller, requires
from missionweave.rpc.status import rejections_as_status


@rejections_as_status
class PublicationServicer(pb_grpc.PublicationServiceServicer):
    SERVICE = "missionweave.internal.v1.PublicationService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave/mesh/server.py)

    def __init__(self, index: ArtifactIndex) -> None:
        self.index = index

    @requires(Access.MESH)
    async def FindPublication(
        self, request: pb.FindPublicationRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.FindPublicationResponse:
        if not HEX64.fullmatch(request.content_digest_hex):
            raise Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, "content_digest_hex is 64 lower-case hex digits", field="content_digest_hex")
        if request.manifest_digest_hex and not HEX64.fullmatch(request.manifest_digest_hex):
            raise Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, "manifest_digest_hex is 64 lower-case hex digits", field="manifest_digest_hex")
        if not (request.group_id and request.work_item_id and request.publisher_id):
            raise Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, "group_id, work_item_id and publisher_id are required")
        blob = await self.index.blob(request.content_digest_hex)
        if blob is None:
            return pb.FindPublicationResponse(found=False)
        for record in await self.index.manifests_of(request.content_digest_hex, request.work_item_id, request.publisher_id):
            if record.group_id != request.group_id:
                continue
            if request.manifest_digest_hex and record.manifest_digest != request.manifest_digest_hex:
                continue
            sources = await self.index.sources_of(record.manifest_digest)
            return pb.FindPublicationResponse(
                found=True,
                size_bytes=blob.size_bytes,
                manifest_digest_hex=record.manifest_digest,
                source_digests_hex=sources,
            )
        return pb.FindPublicationResponse(found=False)
