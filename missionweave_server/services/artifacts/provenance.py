"""QueryProvenance (spec 13.1): the walk over the manifest-declared edges between blobs, bounded in
depth and nodes, showing only what the caller may see."""

from __future__ import annotations

from missionweave.kernel.manifest import manifest_ref
from missionweave.v1 import artifact_service_pb2 as pb
from missionweave.v1 import common_pb2
from missionweave_server.edge.callers import Caller
from missionweave_server.services.artifacts.access import Readers
from missionweave_server.services.artifacts.index import Edge, ManifestRecord
from missionweave_server.services.artifacts.reads import Reads, blake3_digest
from missionweave_server.services.artifacts.verify import artifact_error, check_digest

R = common_pb2.RejectionReason

MAX_PROVENANCE_DEPTH = 32
MAX_PROVENANCE_NODES = 10_000


class Provenance(Reads):
    """The provenance part of the servicer (a base of ``service.ArtifactServicer``)."""

    async def query_provenance(
        self, request: pb.QueryProvenanceRequest, caller: Caller
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
                for here, there, is_up in (
                    (edge.derived, edge.source, True),
                    (edge.source, edge.derived, False),
                ):
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
            node = pb.ProvenanceNode(
                digest=blake3_digest(digest, sizes[digest]), depth=depth, is_ancestor=is_up
            )
            if info is not None:
                node.media_type, node.producer_agent_id, node.work_item_id = (
                    info.media_type,
                    info.producer_agent_id,
                    info.work_item_id,
                )
                node.manifest_digest.CopyFrom(
                    manifest_ref(common_pb2.SignedEnvelope.FromString(info.envelope))
                )
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
