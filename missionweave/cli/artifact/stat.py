"""``mwp artifact stat``: a blob's size, when it was stored and last verified at rest, and how many
manifests the store holds for it (ArtifactService.Stat).
"""

from __future__ import annotations

import argparse

from missionweave.cli.artifact.arguments import digest_text
from missionweave.cli.common import emit, reading, to_dict, when
from missionweave.v1 import artifact_service_pb2 as apb


async def cmd_stat(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        stat = await mesh.artifacts.Stat(apb.StatRequest(digest=args.digest))
    lines = [
        digest_text(stat.digest),
        f"  size           {stat.digest.size_bytes} bytes",
        f"  stored         {when(stat.stored_at)}",
        f"  last verified  {when(stat.last_verified_at)}",
        f"  manifests      {stat.manifest_count}",
    ]
    emit(
        args,
        lines,
        {**to_dict(stat), "digest": digest_text(stat.digest), "size_bytes": stat.digest.size_bytes},
    )
    return 0
