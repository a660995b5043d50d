"""Handing in Artifacts: hash, describe with a signed manifest, upload (spec 13.1, D161).

An Artifact is accepted as a deliverable or as Evidence only if the artifact store holds its bytes
with a manifest its producer signed for the Mission's Group and WorkItem (docs/decisions.md D161).
:func:`put_artifact` does all three steps for bytes, a file, or a stream of any size: the content is
hashed in one streaming pass (BLAKE3 for identity, SHA-256 for the in-toto subject), the manifest
carries every field MW-13.1-03 names and is signed with the producer's session key, and the upload
sends the bytes only if the store does not hold them yet. Uploading the same content again with
the same manifest is answered as already stored, so a retry after a crash repeats safely.

Streams are spooled to a temporary file first (hashing needs one pass before the upload header,
which names the digest); memory stays at one chunk whatever the size.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import blake3
import grpc

from missionweave import __version__
from missionweave.kernel import uploads
from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.digests import CHUNK_BYTES
from missionweave.kernel.manifest import sign_manifest
from missionweave.kernel.signing import session_key_id
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2

Content = bytes | os.PathLike[str] | str | Iterable[bytes] | AsyncIterable[bytes]
# What a manifest names as the Agent Card version of a producer that has published none (a person,
# a script): MW-13.1-03 asks for the field, and an empty one is refused by the store.
NO_AGENT_CARD = "none"
SDK_COMPONENT = apb.ComponentVersion(
    kind=apb.COMPONENT_KIND_TOOL, name="missionweave-sdk", version=__version__
)


@dataclass(frozen=True)
class Hashes:
    """One streaming pass over some content: its identity and the in-toto alias."""

    blake3_hex: str
    size: int
    sha256_hex: str

    @property
    def digest(self) -> common_pb2.Digest:
        return common_pb2.Digest(algorithm="blake3", hex=self.blake3_hex, size_bytes=self.size)


def file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while data := fh.read(CHUNK_BYTES):
            yield data


def hash_chunks(chunks: Iterable[bytes]) -> Hashes:
    b3 = blake3.blake3(max_threads=blake3.blake3.AUTO)
    sha = hashlib.sha256()
    size = 0
    for data in chunks:
        b3.update(data)
        sha.update(data)
        size += len(data)
    return Hashes(b3.hexdigest(), size, sha.hexdigest())


@dataclass(frozen=True)
class Origin:
    """Where an Artifact comes from: the manifest's fields besides the content (MW-13.1-03)."""

    group_id: str
    mission_id: str
    work_item_id: str = ""
    lease_id: str = ""
    ownership_epoch: int = 0
    agent_card_version: str = ""
    # The Artifacts it was derived from: its provenance edges (MW-13.1-04).
    sources: Sequence[common_pb2.Digest] = ()
    components: Sequence[apb.ComponentVersion] = (SDK_COMPONENT,)
    classification: int = apb.DATA_CLASSIFICATION_INTERNAL
    schema_id: str = "none"


@dataclass(frozen=True)
class Described:
    """Content's hashes with how to describe it; ``retrieval_uri`` empty: the mesh's own URI."""

    hashes: Hashes
    media_type: str
    producer_id: str
    origin: Origin
    retrieval_uri: str = ""


def build_manifest(described: Described) -> apb.ArtifactManifest:
    """Every MW-13.1-03 field of ``described``."""
    h, o = described.hashes, described.origin
    return apb.ArtifactManifest(
        content_digest=h.digest,
        alias_digests=[common_pb2.Digest(algorithm="sha256", hex=h.sha256_hex, size_bytes=h.size)],
        media_type=described.media_type,
        schema=apb.ArtifactSchema(schema_id=o.schema_id),
        producer_agent_id=described.producer_id,
        agent_card_version=o.agent_card_version,
        mission_id=o.mission_id,
        group_id=o.group_id,
        work_item_id=o.work_item_id,
        source_artifacts=list(o.sources),
        components=list(o.components),
        created_at=to_timestamp(SystemClock().now()),
        classification=o.classification,  # type: ignore[arg-type]
        size_bytes=h.size,
        retrieval_uri=described.retrieval_uri or f"mwp-artifact://mesh/blake3/{h.blake3_hex}/{h.size}",
        lease_id=o.lease_id,
        ownership_epoch=o.ownership_epoch,
    )


def signed_manifest(described: Described, signer: SessionSigner) -> common_pb2.SignedEnvelope:
    return sign_manifest(
        build_manifest(described),
        described.hashes.sha256_hex,
        signer.key,
        session_key_id(signer.identity_id, signer.session_epoch),
    )


async def card_version(mesh: MeshClient, identity_id: str) -> str:
    """The version of ``identity_id``'s Agent Card in force, or NO_AGENT_CARD when it has none."""
    try:
        return (await mesh.agent_card(identity_id)).card.card_version
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return NO_AGENT_CARD
        raise


async def spool(content: Content, directory: Path | None = None) -> Path:
    """``content`` copied to a new private file (0600) in ``directory``, readable twice: once to
    hash, once to upload. The caller removes it."""
    fd, name = tempfile.mkstemp(prefix=".mwp-spool-", dir=directory)
    with os.fdopen(fd, "wb") as fh:
        if isinstance(content, AsyncIterable):
            async for data in content:
                fh.write(data)
        elif isinstance(content, bytes):
            fh.write(content)
        elif isinstance(content, (str, os.PathLike)):
            await asyncio.to_thread(_copy, Path(content), fh)
        else:
            for data in content:
                fh.write(data)
    return Path(name)


def _copy(source: Path, sink: BinaryIO) -> None:
    with source.open("rb") as src:
        shutil.copyfileobj(src, sink, CHUNK_BYTES)


async def put_artifact(
    artifacts_stub: Any,
    signer: SessionSigner,
    content: Content,
    *,
    media_type: str,
    origin: Origin,
    spool_dir: Path | None = None,
) -> common_pb2.ArtifactRef:
    """Hashes ``content``, signs its manifest as ``signer`` and uploads both (idempotent). Returns
    the reference a submission or Evidence names. ``artifacts_stub``: an ArtifactService stub."""
    if isinstance(content, bytes):
        data = content
        return await _put(
            artifacts_stub, signer, lambda: uploads.slices(data, CHUNK_BYTES), media_type, origin
        )
    if isinstance(content, (str, os.PathLike)):
        path = Path(content)
        return await _put(artifacts_stub, signer, lambda: file_chunks(path), media_type, origin)
    spooled = await spool(content, spool_dir)
    try:
        return await _put(artifacts_stub, signer, lambda: file_chunks(spooled), media_type, origin)
    finally:
        spooled.unlink(missing_ok=True)


async def _put(
    stub: Any, signer: SessionSigner, read: Callable[[], Iterable[bytes]], media_type: str, origin: Origin
) -> common_pb2.ArtifactRef:
    """``read`` reads the content afresh on each call: once to hash, once to upload."""
    hashes = hash_chunks(read())
    described = Described(hashes, media_type, signer.identity_id, origin)
    header = apb.UploadHeader(digest=hashes.digest, manifest=signed_manifest(described, signer))
    await uploads.upload(stub, header, read())
    return common_pb2.ArtifactRef(digest=hashes.digest, media_type=media_type)
