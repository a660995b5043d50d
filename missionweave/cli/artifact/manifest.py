"""``mwp artifact manifest``: the signed manifests stored for a blob, each decoded for display
(``decode``, unverified) and, with --verify, its DSSE signature checked against the producer's
registered identity key or --public-key and its subject against the blob (``check_signature``,
which ``mwp mission review`` uses too); any signature that does not verify ends it with exit code 1.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

import blake3
from google.protobuf import json_format

from missionweave.cli.artifact.arguments import digest_text
from missionweave.cli.common import CliError, emit, enum_label, reading, to_dict, when
from missionweave.kernel.manifest import ManifestError, verify_manifest
from missionweave.kernel.signing import parse_session_key_id
from missionweave.sdk.client import MeshClient
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2, membership_service_pb2

SignedEnvelope = common_pb2.SignedEnvelope


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
