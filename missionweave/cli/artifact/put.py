"""``mwp artifact put``: hashes the file locally (BLAKE3, and SHA-256 for a manifest) before any
connection, then uploads it chunk by chunk if the store asks for the bytes; with ``--manifest-for
GROUP`` it first builds every MW-13.1-03 field of an ArtifactManifest from the flags, the file's
hashes, the actor and the Group's Mission, and signs it with the actor's session key.
"""

from __future__ import annotations

import argparse
import mimetypes
import sys
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from missionweave import __version__
from missionweave.cli.artifact.arguments import Digest, digest_text
from missionweave.cli.artifact.transfer import FileHashes, hash_file, progress, read_chunks
from missionweave.cli.common import Actor, UsageError, acting, emit, mission_of, reading, target, wants_json
from missionweave.kernel import uploads
from missionweave.kernel.manifest import sign_manifest
from missionweave.kernel.signing import session_key_id
from missionweave.sdk.artifacts import Described, Hashes, Origin
from missionweave.sdk.artifacts import build_manifest as describe
from missionweave.sdk.client import MeshClient
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2

SignedEnvelope = common_pb2.SignedEnvelope


CLASSIFICATIONS = {
    name: apb.DataClassification.Value(f"DATA_CLASSIFICATION_{name.upper()}")
    for name in ("public", "internal", "confidential", "restricted")
}


@asynccontextmanager
async def connection(args: argparse.Namespace) -> AsyncIterator[tuple[MeshClient, Actor | None]]:
    """As the actor when a manifest is to be signed, else a plain connection."""
    if args.manifest_for:
        async with acting(args) as actor:
            actor.mesh.read_as(actor.signer)  # the upload and the Group read prove the actor (issue 13)
            yield actor.mesh, actor
    else:
        async with reading(args) as mesh:
            yield mesh, None


def check_put_flags(args: argparse.Namespace) -> None:
    """--manifest-for needs --work-item, --as and --key; the manifest flags need --manifest-for."""
    if args.manifest_for:
        missing = [
            flag
            for flag, value in (("--work-item", args.work_item), ("--as", args.actor), ("--key", args.key))
            if not value
        ]
        if missing:
            raise UsageError(f"--manifest-for needs {', '.join(missing)}")
    elif args.work_item or args.source or args.component or args.lease_id:
        raise UsageError(
            "--work-item, --source, --component and --lease-id describe a manifest: add --manifest-for GROUP"
        )


def build_manifest(
    args: argparse.Namespace, hashes: FileHashes, producer: str, mission_id: str
) -> apb.ArtifactManifest:
    """Every MW-13.1-03 field, from the flags, the file's hashes, the actor and the Group's Mission."""
    origin = Origin(
        group_id=args.manifest_for,
        mission_id=mission_id,
        work_item_id=args.work_item,
        lease_id=args.lease_id or "",
        ownership_epoch=args.ownership_epoch,
        agent_card_version=args.agent_card_version,
        sources=args.source or [],
        components=args.component
        or [apb.ComponentVersion(kind=apb.COMPONENT_KIND_TOOL, name="mwp-cli", version=__version__)],
        classification=CLASSIFICATIONS[args.classification],
        schema_id=args.schema,
    )
    uri = args.retrieval_uri or f"mwp://{target(args)}/blake3:{hashes.blake3_hex}"
    return describe(
        Described(
            Hashes(hashes.blake3_hex, hashes.size, hashes.sha256_hex), args.media_type, producer, origin, uri
        )
    )


async def signed_manifest(args: argparse.Namespace, actor: Actor, hashes: FileHashes) -> SignedEnvelope:
    mission_id = mission_of(await actor.state(args.manifest_for)).mission_id
    signer = actor.signer
    manifest = build_manifest(args, hashes, signer.identity_id, mission_id)
    return sign_manifest(
        manifest, hashes.sha256_hex, signer.key, session_key_id(signer.identity_id, signer.session_epoch)
    )


async def upload_file(
    args: argparse.Namespace, mesh: MeshClient, path: Path, digest: Digest, manifest: SignedEnvelope | None
) -> apb.UploadResponse:
    """Streams the file if the store asks for it (a caller that may read it already sends only the
    header and manifest)."""
    header = apb.UploadHeader(digest=digest, manifest=manifest)
    with progress(args, "put", digest.size_bytes) as bar:

        def chunks() -> Iterator[bytes]:
            for _, data in read_chunks(path):
                yield data
                bar.advance(len(data))

        return await uploads.upload(mesh.artifacts, header, chunks())


def cmd_put(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    """Hashes the file (a local streaming pass, before any connection), then returns the upload."""
    check_put_flags(args)
    path = Path(args.file)
    args.media_type = args.media_type or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    with progress(args, "hash", path.stat().st_size) as bar:
        hashes = hash_file(path, bar, sha256=bool(args.manifest_for))
    return put_hashed(args, path, hashes)


async def put_hashed(args: argparse.Namespace, path: Path, hashes: FileHashes) -> int:
    async with connection(args) as (mesh, actor):
        manifest = await signed_manifest(args, actor, hashes) if actor else None
        response = await upload_file(args, mesh, path, hashes.digest, manifest)
    if response.already_existed and not wants_json(args):
        print(f"mwp: blake3:{hashes.blake3_hex} was already stored; no bytes were sent", file=sys.stderr)
    lines = [f"blake3:{hashes.blake3_hex} {hashes.size}"]
    if manifest is not None:
        lines.append(f"manifest blake3:{response.manifest_digest.hex}")
    document = {
        "digest": digest_text(hashes.digest),
        "blake3": hashes.blake3_hex,
        "size_bytes": hashes.size,
        "sha256": hashes.sha256_hex or None,
        "already_existed": response.already_existed,
        "manifest_digest": f"blake3:{response.manifest_digest.hex}" if manifest is not None else None,
    }
    emit(args, lines, document)
    return 0
