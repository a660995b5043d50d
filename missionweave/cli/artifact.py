"""``mwp artifact ...``: put, get, stat, manifest, provenance and verify content-addressed blobs (spec 13.1).

A blob is named by its BLAKE3 hash *and* its size, written ``blake3:<64 hex>:<size>`` on the command
line: the server looks blobs up by both, so the hash alone is not enough. Files are streamed in
1 MiB chunks in both directions and never held whole in memory: ``put`` hashes the file in one
streaming pass, then uploads it reading chunk by chunk; ``get`` writes to a temporary file next to
the output and renames it only after the whole (server-verified) stream arrived and, for a full
download, re-hashed locally to the requested digest.

``put --manifest-for GROUP`` signs an ArtifactManifest (MW-13.1-03) with the actor's session key:
the same ``--as/--key`` session the other actor commands use. docs/cli.md documents every flag.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mimetypes
import os
import re
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Self

import blake3
import grpc
from google.protobuf import json_format

from missionweave import __version__, uploads
from missionweave.cli.common import (
    Actor,
    CliError,
    UsageError,
    acting,
    add_json_flag,
    add_reader_flags,
    emit,
    enum_label,
    mission_of,
    reading,
    target,
    to_dict,
    wants_json,
    when,
)
from missionweave.digests import CHUNK_BYTES
from missionweave.errors import Rejected, from_proto
from missionweave.manifest import ManifestError, sign_manifest, verify_manifest
from missionweave.rpc.status import rejection_from_rpc_error
from missionweave.sdk.artifacts import Described, Hashes, Origin
from missionweave.sdk.artifacts import build_manifest as describe
from missionweave.sdk.client import MeshClient
from missionweave.signing import parse_session_key_id, session_key_id
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2, membership_service_pb2

Digest = common_pb2.Digest
SignedEnvelope = common_pb2.SignedEnvelope

MiB = 1024 * 1024
PROGRESS_MIN_BYTES = 8 * MiB  # on a terminal, transfers at least this large show a progress bar
_DIGEST = re.compile(r"^blake3:([0-9a-f]{64})(?::(\d+))?$")
_CLASSIFICATIONS = {
    name: apb.DataClassification.Value(f"DATA_CLASSIFICATION_{name.upper()}")
    for name in ("public", "internal", "confidential", "restricted")
}
_COMPONENT_KINDS = {
    name: apb.ComponentKind.Value(f"COMPONENT_KIND_{name.upper()}")
    for name in ("tool", "model", "capability")
}
_DIRECTIONS = {
    name: apb.ProvenanceDirection.Value(f"PROVENANCE_DIRECTION_{name.upper()}")
    for name in ("ancestors", "descendants", "both")
}


class TransferError(CliError):
    """Received bytes that do not match what was asked for (a client-side check: exit code 1)."""


# ------------------------------------------------------------------ digests and other argument types


def parse_digest(text: str) -> Digest:
    """``blake3:<64 hex>:<size>`` -> Digest (an argparse type: bad input exits 2)."""
    match = _DIGEST.match(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not blake3:<64 lowercase hex>:<size in bytes>")
    hex_digest, size = match.groups()
    if size is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} lacks its size: a blob is named by hash and size, write blake3:<hex>:<size>"
        )
    return Digest(algorithm="blake3", hex=hex_digest, size_bytes=int(size))


def digest_text(digest: Digest) -> str:
    """The command-line form ``blake3:<hex>:<size>`` (what every ``mwp artifact`` command takes)."""
    return f"{digest.algorithm}:{digest.hex}:{digest.size_bytes}"


def non_negative(text: str) -> int:
    """A byte offset or length (an argparse type)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def public_key(text: str) -> bytes:
    """A hex Ed25519 public key (an argparse type)."""
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        raise argparse.ArgumentTypeError("an Ed25519 public key is 64 hex characters")
    return bytes.fromhex(text)


def parse_component(text: str) -> apb.ComponentVersion:
    """``KIND:NAME:VERSION`` with KIND tool, model or capability (an argparse type)."""
    kind, _, rest = text.partition(":")
    name, _, version = rest.rpartition(":")
    if kind not in _COMPONENT_KINDS or not name or not version:
        raise argparse.ArgumentTypeError(f"{text!r} is not tool|model|capability:NAME:VERSION")
    return apb.ComponentVersion(kind=_COMPONENT_KINDS[kind], name=name, version=version)


# ------------------------------------------------------------------ progress


class Progress:
    """A one-line transfer meter on stderr (percent, MiB done, MB/s); does nothing when disabled."""

    REDRAW_SECONDS = 0.1
    WIDTH = 24

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label = label
        self.total = total
        self.enabled = enabled
        self.done = 0
        self.started = time.monotonic()
        self.drawn = 0.0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            sys.stderr.write("\n")

    def advance(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if self.enabled and now - self.drawn >= self.REDRAW_SECONDS:
            self.drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        percent = 100 * self.done // self.total if self.total else 100
        filled = self.WIDTH * percent // 100
        rate = self.done / max(now - self.started, 1e-6) / 1e6
        sys.stderr.write(
            f"\r{self.label:<6} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {percent:3d}%"
            f" {self.done / MiB:8.1f}/{self.total / MiB:.1f} MiB {rate:8.1f} MB/s"
        )
        sys.stderr.flush()


def progress(args: argparse.Namespace, label: str, total: int) -> Progress:
    """Shown with --progress, or on a terminal for transfers of at least PROGRESS_MIN_BYTES."""
    shown = bool(args.progress) or (sys.stderr.isatty() and total >= PROGRESS_MIN_BYTES)
    return Progress(label, total, shown)


# ------------------------------------------------------------------ local files


@dataclass(frozen=True)
class FileHashes:
    blake3_hex: str
    size: int
    sha256_hex: str = ""

    @property
    def digest(self) -> Digest:
        return Digest(algorithm="blake3", hex=self.blake3_hex, size_bytes=self.size)


def read_chunks(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` of the file in CHUNK_BYTES pieces."""
    with path.open("rb") as fh:
        offset = 0
        while data := fh.read(CHUNK_BYTES):
            yield offset, data
            offset += len(data)


def hash_file(path: Path, bar: Progress, *, sha256: bool) -> FileHashes:
    """BLAKE3 (and, for a manifest, SHA-256) of the file in one streaming pass."""
    b3 = blake3.blake3(max_threads=blake3.blake3.AUTO)
    sha = hashlib.sha256() if sha256 else None
    size = 0
    for _, data in read_chunks(path):
        b3.update(data)
        if sha is not None:
            sha.update(data)
        size += len(data)
        bar.advance(len(data))
    return FileHashes(b3.hexdigest(), size, sha.hexdigest() if sha else "")


@contextmanager
def replacing(output: Path) -> Iterator[BinaryIO]:
    """A file object on a temporary file next to ``output``, renamed onto it only when the block
    completes; on any error the temporary file is removed and ``output`` is left untouched."""
    temp = output.with_name(f".{output.name}.{secrets.token_hex(4)}.part")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, output)
    finally:
        temp.unlink(missing_ok=True)


# ------------------------------------------------------------------ put


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
        classification=_CLASSIFICATIONS[args.classification],
        schema_id=args.schema,
    )
    uri = args.retrieval_uri or f"mwp://{target(args)}/blake3:{hashes.blake3_hex}"
    return describe(Described(Hashes(hashes.blake3_hex, hashes.size, hashes.sha256_hex), args.media_type, producer, origin, uri))


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


# ------------------------------------------------------------------ get and verify


async def receive(
    mesh: MeshClient, digest: Digest, offset: int, length: int, sink: Callable[[bytes], object], bar: Progress
) -> bool:
    """Streams ``[offset, offset+length)`` (length 0 = to the end) into ``sink``, checking that the
    pieces are contiguous and complete. A full download is also re-hashed locally; returns whether
    it was. The server verifies the whole blob either way (it holds back the last piece until then)."""
    full = offset == 0 and length in (0, digest.size_bytes)
    hasher = blake3.blake3() if full else None
    end = offset + length if length else digest.size_bytes
    position = offset
    call = mesh.artifacts.Download(apb.DownloadRequest(digest=digest, offset=offset, length=length))
    async for piece in call:
        if piece.offset != position:
            raise TransferError(f"the server sent bytes at offset {piece.offset}, expected {position}")
        if hasher is not None:
            hasher.update(piece.data)
        sink(piece.data)
        position += len(piece.data)
        bar.advance(len(piece.data))
    if position != end:
        raise TransferError(f"received {position - offset} of {end - offset} bytes of {digest_text(digest)}")
    if hasher is not None and hasher.hexdigest() != digest.hex:
        raise TransferError(
            f"the received bytes hash to blake3:{hasher.hexdigest()}, not blake3:{digest.hex}"
        )
    return full


async def cmd_get(args: argparse.Namespace) -> int:
    digest, output = args.digest, Path(args.output)
    total = args.length or max(0, digest.size_bytes - args.offset)
    try:
        with replacing(output) as fh, progress(args, "get", total) as bar:
            async with reading(args) as mesh:
                rehashed = await receive(mesh, digest, args.offset, args.length, fh.write, bar)
    except TransferError as err:
        raise TransferError(f"refused: {err}; {output} was not written") from None
    check = "re-hashed locally" if rehashed else "range; the server verified the whole blob"
    lines = [f"wrote {output}: {total} bytes of {digest_text(digest)} from offset {args.offset} ({check})"]
    document = {
        "output": str(output),
        "digest": digest_text(digest),
        "offset": args.offset,
        "length": total,
        "rehashed": rehashed,
    }
    emit(args, lines, document)
    return 0


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
                results.append({"digest": digest_text(digest), "status": "OK", "detail": "hash and size match"})
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


# ------------------------------------------------------------------ stat


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


# ------------------------------------------------------------------ manifest


@dataclass
class ManifestView:
    """One stored manifest envelope, decoded for display and, with --verify, checked."""

    envelope: SignedEnvelope
    manifest: apb.ArtifactManifest | None
    sha256_hex: str
    decode_error: str = ""
    signature: str = "unchecked"  # unchecked | verified | FAILED
    signature_detail: str = ""

    @property
    def manifest_hex(self) -> str:
        return blake3.blake3(self.envelope.payload).hexdigest()

    @property
    def key_ids(self) -> list[str]:
        return [s.key_id for s in self.envelope.signatures]


def decode(envelope: SignedEnvelope) -> ManifestView:
    """The Statement's predicate and sha256 subject digest, *unverified* (for display only)."""
    try:
        statement = json.loads(envelope.payload)
        sha256_hex = str(statement["subject"][0]["digest"].get("sha256", ""))
        manifest = json_format.ParseDict(
            statement["predicate"], apb.ArtifactManifest(), ignore_unknown_fields=True
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, json_format.ParseError) as err:
        return ManifestView(envelope, None, "", decode_error=f"not an ArtifactManifest statement: {err}")
    return ManifestView(envelope, manifest, sha256_hex)


async def producer_key(args: argparse.Namespace, mesh: MeshClient, identity_id: str) -> bytes:
    """--public-key, else the producer's registered identity key (MembershipService.GetIdentity)."""
    if args.public_key:
        return bytes(args.public_key)
    response = await mesh.membership.GetIdentity(
        membership_service_pb2.GetIdentityRequest(identity_id=identity_id)
    )
    return bytes(response.identity.public_key)


_SESSION_KEY_HINT = (
    "; a manifest signed with a session key other than the identity key can only be checked"
    " with --public-key (no RPC returns session public keys)"
)


async def check_signature(args: argparse.Namespace, mesh: MeshClient, view: ManifestView) -> None:
    """Verifies the DSSE signature and that the manifest describes this blob and names its signer."""
    parsed = parse_session_key_id(view.key_ids[0]) if view.key_ids else None
    signer = parsed[0] if parsed else (view.manifest.producer_agent_id if view.manifest else "")
    key = await producer_key(args, mesh, signer)
    whose = "the given --public-key" if args.public_key else f"the registered identity key of {signer}"
    try:
        verify_manifest(
            view.envelope,
            key,
            expected_digest_hex=args.digest.hex,
            expected_size=args.digest.size_bytes,
            producer_id=signer,
        )
    except ManifestError as err:
        hint = "" if args.public_key else _SESSION_KEY_HINT
        view.signature, view.signature_detail = "FAILED", f"{err} (checked against {whose}){hint}"
        return
    view.signature = "verified"
    view.signature_detail = f"signature by {view.key_ids[0]} verifies against {whose}"


def render_manifest(view: ManifestView, index: int, count: int) -> list[str]:
    head = f"manifest {index} of {count}: blake3:{view.manifest_hex}  signed by {', '.join(view.key_ids) or 'nobody'}"
    check = {"unchecked": "signature not checked here (--verify checks it)"}.get(
        view.signature, f"signature {view.signature}: {view.signature_detail}"
    )
    m = view.manifest
    if m is None:
        return [head, f"  {view.decode_error}", f"  {check}"]
    schema = " ".join(x for x in (m.schema.schema_id, m.schema.version) if x) or "-"
    if m.schema.HasField("schema_digest"):
        schema += f" ({digest_text(m.schema.schema_digest)})"
    lease = f"{m.lease_id} (ownership epoch {m.ownership_epoch})" if m.lease_id else "-"
    rows = [
        ("content", digest_text(m.content_digest)),
        ("sha256", view.sha256_hex or "-"),
        ("media type", m.media_type or "-"),
        ("schema", schema),
        ("producer", f"{m.producer_agent_id} (Agent Card version {m.agent_card_version or '-'})"),
        ("mission", m.mission_id or "-"),
        ("group", m.group_id or "-"),
        ("work item", m.work_item_id or "-"),
        ("lease", lease),
        ("created", when(m.created_at)),
        ("classification", enum_label(apb.DataClassification, m.classification, "DATA_CLASSIFICATION_")),
        ("size", f"{m.size_bytes} bytes"),
        ("retrieval URI", f"{m.retrieval_uri or '-'} (a location, not identity)"),
    ]
    rows += _listed("sources", [digest_text(s) for s in m.source_artifacts])
    rows += _listed(
        "components",
        [
            f"{enum_label(apb.ComponentKind, c.kind, 'COMPONENT_KIND_').lower()} {c.name} {c.version}"
            for c in m.components
        ],
    )
    return [head, *(f"  {label:<15}{value}" for label, value in rows), f"  {check}"]


def _listed(label: str, values: list[str]) -> list[tuple[str, str]]:
    """One row per value, the label on the first only (``-`` when there are none)."""
    return [(label if i == 0 else "", value) for i, value in enumerate(values or ["-"])]


def manifest_document(args: argparse.Namespace, views: list[ManifestView]) -> dict[str, Any]:
    return {
        "digest": digest_text(args.digest),
        "manifests": [
            {
                "manifest_digest": f"blake3:{v.manifest_hex}",
                "key_ids": v.key_ids,
                "sha256": v.sha256_hex,
                "predicate": to_dict(v.manifest) if v.manifest is not None else None,
                "decode_error": v.decode_error or None,
                "signature": v.signature,
                "signature_detail": v.signature_detail or None,
            }
            for v in views
        ],
    }


async def cmd_manifest(args: argparse.Namespace) -> int:
    request = apb.GetManifestRequest(
        digest=args.digest, work_item_id=args.work_item or "", producer_agent_id=args.producer or ""
    )
    async with reading(args) as mesh:
        envelopes = (await mesh.artifacts.GetManifest(request)).manifests
        views = [decode(envelope) for envelope in envelopes]
        if args.verify:
            for view in views:
                await check_signature(args, mesh, view)
    lines = [line for i, view in enumerate(views, 1) for line in render_manifest(view, i, len(views))]
    emit(
        args, lines or [f"no manifests stored for {digest_text(args.digest)}"], manifest_document(args, views)
    )
    if args.verify and not views:
        raise CliError("--verify: there is no manifest to verify")
    failed = sum(v.signature == "FAILED" for v in views)
    if failed:
        raise CliError(f"{failed} of {len(views)} manifest signatures did not verify")
    return 0


# ------------------------------------------------------------------ provenance


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
        digest=args.digest, direction=_DIRECTIONS[args.direction], max_depth=args.depth
    )
    async with reading(args) as mesh:
        response = await mesh.artifacts.QueryProvenance(request)
    emit(
        args,
        render_provenance(args.digest, args.direction, response),
        {"digest": digest_text(args.digest), **to_dict(response)},
    )
    return 0


# ------------------------------------------------------------------ parser


DIGEST_HELP = "blake3:<64 hex>:<size in bytes> (the size is part of the name)"


def _digest_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("digest", type=parse_digest, metavar="DIGEST", help=DIGEST_HELP)


def _progress_flag(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--progress", action="store_true", help="always show the progress bar on stderr")


def _add_put(art: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = art.add_parser(
        "put", help="upload a file (streamed, verified by the store); optionally with a signed manifest"
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--media-type",
        help="RFC 6838 media type (default: guessed from the name, else application/octet-stream)",
    )
    _progress_flag(p)
    add_json_flag(p)
    m = p.add_argument_group("signed manifest (MW-13.1-03)")
    m.add_argument("--manifest-for", metavar="GROUP", help="sign a manifest for this Group's Mission")
    m.add_argument("--work-item", help="the WorkItem that produced it")
    m.add_argument("--as", dest="actor", help="the producer's identity id")
    m.add_argument("--key", help="the producer's key file (the session is saved next to it)")
    m.add_argument(
        "--source",
        action="append",
        type=parse_digest,
        metavar="DIGEST",
        help="a source Artifact (repeatable)",
    )
    m.add_argument("--classification", choices=sorted(_CLASSIFICATIONS), default="internal")
    m.add_argument("--schema", default="none", help="schema id (default: none)")
    m.add_argument("--agent-card-version", default="1", help="the producer's Agent Card version (default: 1)")
    m.add_argument(
        "--component",
        action="append",
        type=parse_component,
        metavar="KIND:NAME:VERSION",
        help=f"tool|model|capability (repeatable; default tool:mwp-cli:{__version__})",
    )
    m.add_argument(
        "--retrieval-uri", help="where a copy can be fetched (default mwp://<target>/blake3:<hex>)"
    )
    m.add_argument("--lease-id", help="the execution lease it was produced under")
    m.add_argument("--ownership-epoch", type=int, default=0, help="the ownership epoch it was produced under")
    p.set_defaults(func=cmd_put)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    art = sub.add_parser(
        "artifact", help="content-addressed Artifacts: put, get, stat, manifest, provenance, verify"
    )
    arts = art.add_subparsers(dest="sub", required=True)
    _add_put(arts)

    g = arts.add_parser("get", help="download a blob (or a byte range) to a file, verified")
    _digest_arg(g)
    g.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="written only once complete and verified"
    )
    g.add_argument("--offset", type=non_negative, default=0, help="first byte (default 0)")
    g.add_argument("--length", type=non_negative, default=0, help="bytes to fetch (default 0: to the end)")
    _progress_flag(g)
    add_json_flag(g)
    add_reader_flags(g)
    g.set_defaults(func=cmd_get)

    s = arts.add_parser("stat", help="a blob's size, storage time, last verification and manifest count")
    _digest_arg(s)
    add_json_flag(s)
    add_reader_flags(s)
    s.set_defaults(func=cmd_stat)

    m = arts.add_parser("manifest", help="the signed manifests stored for a blob")
    _digest_arg(m)
    m.add_argument(
        "--verify", action="store_true", help="check each DSSE signature against the producer's key"
    )
    m.add_argument(
        "--public-key",
        type=public_key,
        help="hex Ed25519 key to verify with (default: the producer's registered key)",
    )
    m.add_argument("--work-item", help="only manifests for this WorkItem")
    m.add_argument("--producer", help="only manifests by this producer")
    add_json_flag(m)
    add_reader_flags(m)
    m.set_defaults(func=cmd_manifest)

    pv = arts.add_parser("provenance", help="the provenance graph around a blob, as a tree")
    _digest_arg(pv)
    pv.add_argument("--direction", choices=sorted(_DIRECTIONS), default="both")
    pv.add_argument("--depth", type=int, default=8, help="how far to walk (1..32, default 8)")
    add_json_flag(pv)
    add_reader_flags(pv)
    pv.set_defaults(func=cmd_provenance)

    v = arts.add_parser("verify", help="download each blob through the verifying path and re-hash it")
    v.add_argument("digests", nargs="+", type=parse_digest, metavar="DIGEST", help=DIGEST_HELP)
    _progress_flag(v)
    add_json_flag(v)
    add_reader_flags(v)
    v.set_defaults(func=cmd_verify)
