"""``mwp artifact provenance``: the provenance graph around a blob (ArtifactService.QueryProvenance)
drawn as trees, the Artifacts it was derived from and those derived from it, a node met again
marked rather than repeated, then whatever else the walk linked.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from missionweave.cli.artifact.arguments import Digest, digest_text
from missionweave.cli.common import emit, reading, to_dict
from missionweave.v1 import artifact_service_pb2 as apb

DIRECTIONS = {
    name: apb.ProvenanceDirection.Value(f"PROVENANCE_DIRECTION_{name.upper()}")
    for name in ("ancestors", "descendants", "both")
}


def _label(digest: Digest, nodes: dict[str, apb.ProvenanceNode]) -> str:
    node = nodes.get(digest.hex)
    size = node.digest.size_bytes if node is not None else digest.size_bytes
    text = f"blake3:{digest.hex}:{size}"
    if node is not None:
        facts = [
            node.media_type,
            f"by {node.producer_agent_id}" if node.producer_agent_id else "",
            f"work item {node.work_item_id}" if node.work_item_id else "",
        ]
        text += "".join(f"  {fact}" for fact in facts if fact)
    return text


def _tree(
    start: str,
    links: dict[str, list[Digest]],
    nodes: dict[str, apb.ProvenanceNode],
    prefix: str,
    shown: set[str],
) -> Iterator[str]:
    """``links`` from ``start`` drawn as a tree; a node met again is marked instead of repeated."""
    children = links.get(start, [])
    for i, child in enumerate(children):
        last = i == len(children) - 1
        again = child.hex in shown
        yield f"{prefix}{'└─ ' if last else '├─ '}{_label(child, nodes)}{'  (shown above)' if again else ''}"
        if not again:
            shown.add(child.hex)
            yield from _tree(child.hex, links, nodes, prefix + ("   " if last else "│  "), shown)


def render_provenance(root: Digest, direction: str, response: apb.QueryProvenanceResponse) -> list[str]:
    nodes = {n.digest.hex: n for n in response.nodes}
    sources: dict[str, list[Digest]] = {}
    derived: dict[str, list[Digest]] = {}
    for edge in response.edges:
        sources.setdefault(edge.derived.hex, []).append(edge.source)
        derived.setdefault(edge.source.hex, []).append(edge.derived)
    shown = {root.hex}
    lines = [_label(root, nodes)]
    sections = [("ancestors", "derived from", sources), ("descendants", "used to derive", derived)]
    for name, title, links in sections:
        if direction in (name, "both"):
            lines.append(f"  {title}:")
            lines += list(_tree(root.hex, links, nodes, "    ", shown)) or ["    (none)"]
    others = [n for n in response.nodes if n.digest.hex not in shown]
    if others:
        lines.append("  also linked (other sources or derivations of the artifacts above):")
        lines += [f"    {_label(n.digest, nodes)}" for n in others]
    if response.truncated:
        lines.append("  (truncated: the node limit cut the walk short)")
    return lines


async def cmd_provenance(args: argparse.Namespace) -> int:
    request = apb.QueryProvenanceRequest(
        digest=args.digest, direction=DIRECTIONS[args.direction], max_depth=args.depth
    )
    async with reading(args) as mesh:
        response = await mesh.artifacts.QueryProvenance(request)
    emit(
        args,
        render_provenance(args.digest, args.direction, response),
        {"digest": digest_text(args.digest), **to_dict(response)},
    )
    return 0
