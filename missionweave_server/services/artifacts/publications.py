"""PublicationService: the Authority's questions "is this blob published with a signed manifest for
this Group, WorkItem and publisher?" and "which of these blobs are stored, with which manifests for
this Group?" (internal contract, protos/missionweave/internal/v1/)."""

from __future__ import annotations

import grpc

from missionweave.internal.v1 import publications_pb2 as pb
from missionweave.internal.v1 import publications_pb2_grpc as pb_grpc
from missionweave.kernel.digests import HEX64
from missionweave.kernel.errors import R, Rejected
from missionweave.kernel.manifest import stored_mission_id
from missionweave_server.edge.callers import Access, CallAuthenticator, Caller, requires
from missionweave_server.edge.status import rejections_as_status
from missionweave_server.services.artifacts.index import ArtifactIndex, ManifestRecord

# A command names at most 32 deliverables and 32 Evidence records with their Artifacts; the shell
# asks in pages of this size.
MAX_FIND_ARTIFACTS = 64
# Manifests of one blob by one producer for one Group answered (only the actor's own manifests are
# asked for, and those naming the command's WorkItem when it is about one, so nobody else's and no
# other WorkItem's can crowd them out).
MAX_MANIFESTS_ANSWERED = 16


@rejections_as_status
class PublicationServicer(pb_grpc.PublicationServiceServicer):
    SERVICE = "missionweave.internal.v1.PublicationService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave_server/mesh/server.py)

    def __init__(self, index: ArtifactIndex) -> None:
        self.index = index

    @requires(Access.MESH)
    async def FindPublication(
        self, request: pb.FindPublicationRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.FindPublicationResponse:
        if not HEX64.fullmatch(request.content_digest_hex):
            raise Rejected(
                R.REJECTION_REASON_INVALID_ARGUMENT,
                "content_digest_hex is 64 lower-case hex digits",
                field="content_digest_hex",
            )
        if request.manifest_digest_hex and not HEX64.fullmatch(request.manifest_digest_hex):
            raise Rejected(
                R.REJECTION_REASON_INVALID_ARGUMENT,
                "manifest_digest_hex is 64 lower-case hex digits",
                field="manifest_digest_hex",
            )
        if not (request.group_id and request.work_item_id and request.publisher_id):
            raise Rejected(
                R.REJECTION_REASON_INVALID_ARGUMENT, "group_id, work_item_id and publisher_id are required"
            )
        blob = await self.index.blob(request.content_digest_hex)
        if blob is None:
            return pb.FindPublicationResponse(found=False)
        for record in await self.index.manifests_of(
            request.content_digest_hex, request.work_item_id, request.publisher_id
        ):
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

    @requires(Access.MESH)
    async def FindArtifacts(
        self, request: pb.FindArtifactsRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.FindArtifactsResponse:
        if not (request.group_id and request.producer_id):
            raise Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, "group_id and producer_id are required")
        digests = list(request.content_digests_hex)
        if not 1 <= len(digests) <= MAX_FIND_ARTIFACTS:
            raise Rejected(
                R.REJECTION_REASON_INVALID_ARGUMENT,
                f"1..{MAX_FIND_ARTIFACTS} content digests",
                field="content_digests_hex",
            )
        for i, digest in enumerate(digests):
            if not HEX64.fullmatch(digest):
                raise Rejected(
                    R.REJECTION_REASON_INVALID_ARGUMENT,
                    "a content digest is 64 lower-case hex digits",
                    field=f"content_digests_hex[{i}]",
                )
        held = await self.index.held(
            digests, request.group_id, request.producer_id, MAX_MANIFESTS_ANSWERED, request.work_item_id
        )
        return pb.FindArtifactsResponse(artifacts=[_answer(digest, held.get(digest)) for digest in digests])


def _answer(
    digest: str, held: tuple[int, list[tuple[ManifestRecord, tuple[str, ...]]]] | None
) -> pb.HeldArtifact:
    if held is None:
        return pb.HeldArtifact(content_digest_hex=digest, stored=False)
    size, records = held
    return pb.HeldArtifact(
        content_digest_hex=digest,
        stored=True,
        size_bytes=size,
        manifests=[
            pb.GroupManifest(
                manifest_digest_hex=record.manifest_digest,
                work_item_id=record.work_item_id,
                producer_id=record.producer_agent_id,
                mission_id=stored_mission_id(record.envelope),
                source_digests_hex=sources,
                media_type=record.media_type,
            )
            for record, sources in records
        ],
    )
