"""``mwp artifact verify``: downloads each blob through the verifying path and re-hashes it; small
blobs in batches (``MeshClient.download_many``), larger ones streamed with a progress bar
(``verify_one``, which ``mwp mission review --verify-bytes`` uses too); each gets a status, OK,
CORRUPTED, MISSING or the refusal's code, and any failure ends the command with exit code 1.
"""

from __future__ import annotations

import argparse

import grpc

from missionweave.cli.artifact.arguments import Digest, digest_text
from missionweave.cli.artifact.transfer import TransferError, progress, receive
from missionweave.cli.common import CliError, emit, reading
from missionweave.kernel.digests import CHUNK_BYTES
from missionweave.kernel.errors import Rejected, from_proto
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.client import MeshClient


async def verify_one(args: argparse.Namespace, mesh: MeshClient, digest: Digest) -> dict[str, str]:
    """Downloads the blob through the verifying path, re-hashes it and classifies the outcome."""
    try:
        with progress(args, "verify", digest.size_bytes) as bar:
            await receive(mesh, digest, 0, 0, lambda _: None, bar)
    except TransferError as err:
        return {"digest": digest_text(digest), "status": "CORRUPTED", "detail": str(err)}
    except grpc.aio.AioRpcError as err:
        rejection = rejection_from_rpc_error(err)
        if rejection is None:
            raise  # unreachable or a transport failure: no verdict about the blob (exit 3 or 1)
        return verdict(digest, from_proto(rejection))
    return {"digest": digest_text(digest), "status": "OK", "detail": "hash and size match"}


def verdict(digest: Digest, refusal: Rejected) -> dict[str, str]:
    """A refused download's status: CORRUPTED, MISSING (not stored, or not readable), or its code."""
    code = refusal.metadata.get("artifact_error", "").removeprefix("ARTIFACT_ERROR_CODE_")
    status = {"CORRUPTED": "CORRUPTED", "NOT_FOUND": "MISSING"}.get(code, code or "REFUSED")
    return {"digest": digest_text(digest), "status": status, "detail": refusal.message}


async def cmd_verify(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        # Small blobs in batches (MeshClient.download_many: the server verifies each at rest, the
        # client re-hashes it), larger ones streamed with a progress bar.
        small = [d for d in args.digests if d.size_bytes <= CHUNK_BYTES]
        batched = iter(await mesh.download_many(small))
        results = []
        for digest in args.digests:
            if digest.size_bytes > CHUNK_BYTES:
                results.append(await verify_one(args, mesh, digest))
            elif isinstance(got := next(batched), Rejected):
                results.append(verdict(digest, got))
            else:
                results.append(
                    {"digest": digest_text(digest), "status": "OK", "detail": "hash and size match"}
                )
    failed = sum(r["status"] != "OK" for r in results)
    lines = [
        f"{r['status']:<9} {r['digest']}" + ("" if r["status"] == "OK" else f"  {r['detail']}")
        for r in results
    ]
    lines.append(f"{len(results) - failed} OK, {failed} failed")
    emit(args, lines, {"ok": not failed, "results": results})
    if failed:
        raise CliError(f"{failed} of {len(results)} blobs failed verification")
    return 0
