"""Signed Artifact manifests (MW-13.1-03): an in-toto Statement v1 in a DSSE envelope, Ed25519.

The payload is the canonical JSON of the Statement (sorted keys, no whitespace), so one manifest
always yields the same bytes; verifiers never re-serialise: they check the signature over the DSSE
pre-authentication encoding of the exact payload bytes, then parse. The subject is named by its
BLAKE3 digest; the retrieval URI is only a location inside the predicate (MW-13.1-06).
Layout, verification steps and an example: docs/manifests.md.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import blake3
from google.protobuf import json_format
from nacl.signing import SigningKey

from missionweave.kernel.digests import HEX64
from missionweave.kernel.signing import sign_envelope, verify_signature
from missionweave.v1 import artifact_service_pb2, common_pb2

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "urn:missionweaveprotocol:predicate:artifact-manifest:v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
MAX_ENVELOPE_BYTES = 64 * 1024  # artifact_service.proto: "Manifest envelope: at most 64 KiB"


ArtifactManifest = artifact_service_pb2.ArtifactManifest
SignedEnvelope = common_pb2.SignedEnvelope


class ManifestErrorCode(enum.StrEnum):
    """The ArtifactErrorCode values a manifest check can fail with (without the prefix)."""

    MANIFEST_SIGNATURE_INVALID = "MANIFEST_SIGNATURE_INVALID"
    MANIFEST_MISMATCH = "MANIFEST_MISMATCH"
    MALFORMED_DIGEST = "MALFORMED_DIGEST"

    @property
    def artifact_error(self) -> str:
        """The value for Rejection.metadata["artifact_error"], e.g. ARTIFACT_ERROR_CODE_MANIFEST_MISMATCH."""
        return f"ARTIFACT_ERROR_CODE_{self.value}"

    @property
    def proto(self) -> artifact_service_pb2.ArtifactErrorCode.ValueType:
        return artifact_service_pb2.ArtifactErrorCode.Value(self.artifact_error)


class ManifestError(Exception):
    """A manifest that must not be used; ``code`` is stable, ``detail`` is for humans and logs."""

    def __init__(self, code: ManifestErrorCode, detail: str) -> None:
        super().__init__(f"{code.value}: {detail}")
        self.code = code
        self.detail = detail


# ------------------------------------------------------------------ producing


def statement_for(manifest: ArtifactManifest, sha256_hex: str) -> bytes:
    """The canonical in-toto Statement v1 JSON for ``manifest`` (the DSSE payload)."""
    blake3_hex = _check_producer_manifest(manifest, sha256_hex)
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f"blake3:{blake3_hex}", "digest": {"blake3": blake3_hex, "sha256": sha256_hex}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": _predicate(manifest),
    }
    return _canonical_json(statement)


def sign_manifest(
    manifest: ArtifactManifest, sha256_hex: str, key: SigningKey, key_id: str
) -> SignedEnvelope:
    """The producer-signed DSSE envelope (payload type application/vnd.in-toto+json)."""
    envelope = sign_envelope(statement_for(manifest, sha256_hex), PAYLOAD_TYPE, key, key_id)
    if envelope.ByteSize() > MAX_ENVELOPE_BYTES:
        raise _mismatch(f"envelope is {envelope.ByteSize()} bytes, at most {MAX_ENVELOPE_BYTES}")
    return envelope


def manifest_digest(envelope: SignedEnvelope) -> str:
    """BLAKE3 hex of the envelope's payload: the manifest reference in events and provenance.

    The payload (the signed Statement bytes), not the protobuf envelope: those bytes are the same
    in every language and do not change when a signature is added.
    """
    return blake3.blake3(envelope.payload).hexdigest()


def manifest_ref(envelope: SignedEnvelope) -> common_pb2.Digest:
    """``manifest_digest`` as a Digest message (UploadResponse/ProvenanceNode.manifest_digest)."""
    return common_pb2.Digest(
        algorithm="blake3", hex=manifest_digest(envelope), size_bytes=len(envelope.payload)
    )


def _predicate(manifest: ArtifactManifest) -> dict[str, Any]:
    # Every field with no presence is printed, even at its default, so the predicate lists them all.
    return json_format.MessageToDict(
        manifest, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _canonical_json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _check_producer_manifest(manifest: ArtifactManifest, sha256_hex: str) -> str:
    """Refuses to sign a manifest whose digests are malformed or disagree; returns the BLAKE3 hex."""
    _require_hex(sha256_hex, "sha256 digest")
    digest = manifest.content_digest
    if not manifest.HasField("content_digest") or digest.algorithm != "blake3":
        raise ManifestError(ManifestErrorCode.MALFORMED_DIGEST, "content_digest must be a blake3 digest")
    _require_hex(digest.hex, "content_digest")
    if manifest.size_bytes != digest.size_bytes:
        raise _mismatch(f"size_bytes {manifest.size_bytes} != content_digest.size_bytes {digest.size_bytes}")
    _check_sha256_aliases(manifest, sha256_hex)
    return digest.hex


# ------------------------------------------------------------------ verifying


def verify_manifest(
    envelope: SignedEnvelope,
    producer_public_key: bytes,
    *,
    expected_digest_hex: str,
    expected_size: int,
    producer_id: str | None = None,
) -> ArtifactManifest:
    """Verifies a manifest envelope for the blob (expected_digest_hex, expected_size).

    Checks, in order: envelope size; an Ed25519 signature by ``producer_public_key`` over
    PAE(payload_type, payload); the payload type; the Statement's shape; its one subject names the
    expected BLAKE3 digest; the predicate parses into an ArtifactManifest whose content_digest and
    size are the expected ones (and, when ``producer_id`` is given, whose producer_agent_id is it).
    Returns the manifest; raises ManifestError otherwise.
    """
    _require_hex(expected_digest_hex, "expected digest")
    _check_envelope(envelope, producer_public_key)
    statement = _parse_statement(envelope.payload)
    sha256_hex = _check_subject(statement["subject"], expected_digest_hex)
    manifest = _parse_predicate(statement["predicate"])
    _check_predicate(manifest, expected_digest_hex, expected_size, sha256_hex)
    if producer_id is not None and manifest.producer_agent_id != producer_id:
        raise _mismatch(f"producer_agent_id {manifest.producer_agent_id!r} is not the signer {producer_id!r}")
    return manifest


def _check_envelope(envelope: SignedEnvelope, public_key: bytes) -> None:
    if envelope.ByteSize() > MAX_ENVELOPE_BYTES:
        raise _mismatch(f"envelope is {envelope.ByteSize()} bytes, at most {MAX_ENVELOPE_BYTES}")
    if not any(verify_signature(envelope, public_key, i) for i in range(len(envelope.signatures))):
        raise ManifestError(
            ManifestErrorCode.MANIFEST_SIGNATURE_INVALID, "no signature by the producer's key verifies"
        )
    if envelope.payload_type != PAYLOAD_TYPE:
        raise _mismatch(f"payload type {envelope.payload_type!r}, expected {PAYLOAD_TYPE!r}")


def _parse_statement(payload: bytes) -> dict[str, Any]:
    try:
        statement = json.loads(payload, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _mismatch(f"payload is not JSON: {exc}") from None
    if not isinstance(statement, dict):
        raise _mismatch("statement is not a JSON object")
    if statement.get("_type") != STATEMENT_TYPE:
        raise _mismatch(f"_type {statement.get('_type')!r}, expected {STATEMENT_TYPE!r}")
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise _mismatch(f"predicateType {statement.get('predicateType')!r}, expected {PREDICATE_TYPE!r}")
    if not isinstance(statement.get("predicate"), dict):
        raise _mismatch("predicate is missing or not an object")
    return statement


def _check_subject(subject: Any, expected_digest_hex: str) -> str:
    """The one subject must be named and digested by the expected BLAKE3 hex; returns its sha256."""
    if not isinstance(subject, list) or len(subject) != 1 or not isinstance(subject[0], dict):
        raise _mismatch("statement must have exactly one subject")
    digest = subject[0].get("digest")
    if not isinstance(digest, dict) or digest.get("blake3") != expected_digest_hex:
        raise _mismatch("subject blake3 digest is not the blob's digest")
    if subject[0].get("name") != f"blake3:{expected_digest_hex}":
        raise _mismatch("subject name must be blake3:<hex> (a URI is never identity, MW-13.1-06)")
    sha256_hex = digest.get("sha256")
    if not isinstance(sha256_hex, str) or not HEX64.fullmatch(sha256_hex):
        raise _mismatch("subject sha256 digest is missing or not 64 lowercase hex characters")
    return sha256_hex


def _parse_predicate(predicate: dict[str, Any]) -> ArtifactManifest:
    # Unknown fields are ignored, as the in-toto parsing rules require (docs/decisions.md).
    try:
        return json_format.ParseDict(predicate, ArtifactManifest(), ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise _mismatch(f"predicate is not an ArtifactManifest: {exc}") from None


def _check_predicate(
    manifest: ArtifactManifest, expected_digest_hex: str, expected_size: int, sha256_hex: str
) -> None:
    digest = manifest.content_digest
    if digest.algorithm != "blake3" or digest.hex != expected_digest_hex:
        raise _mismatch("predicate content_digest is not the blob's blake3 digest")
    if digest.size_bytes != expected_size or manifest.size_bytes != expected_size:
        raise _mismatch(
            f"manifest size {manifest.size_bytes}/{digest.size_bytes} is not the blob's size {expected_size}"
        )
    _check_sha256_aliases(manifest, sha256_hex)


def _check_sha256_aliases(manifest: ArtifactManifest, sha256_hex: str) -> None:
    for alias in manifest.alias_digests:
        if alias.algorithm == "sha256" and (
            alias.hex != sha256_hex or alias.size_bytes != manifest.size_bytes
        ):
            raise _mismatch("alias sha256 digest disagrees with the subject's sha256 digest or size")


# ------------------------------------------------------------------ small helpers


def _require_hex(value: str, what: str) -> None:
    if not HEX64.fullmatch(value):
        raise ManifestError(ManifestErrorCode.MALFORMED_DIGEST, f"{what} must be 64 lowercase hex characters")


def _mismatch(detail: str) -> ManifestError:
    return ManifestError(ManifestErrorCode.MANIFEST_MISMATCH, detail)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Parsers disagree on duplicate keys (first or last wins), so a signed document must have none.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def missing_fields(manifest: ArtifactManifest) -> list[str]:
    """MW-13.1-03: the manifest fields a published Artifact must carry that this one leaves empty.

    The signature proves who said it; this makes sure they said everything the spec asks for.
    """
    required = {
        "media_type": manifest.media_type,
        "schema.schema_id": manifest.schema.schema_id,
        "producer_agent_id": manifest.producer_agent_id,
        "agent_card_version": manifest.agent_card_version,
        "mission_id": manifest.mission_id,
        "group_id": manifest.group_id,
        "work_item_id": manifest.work_item_id,
        "components": len(manifest.components),
        "created_at": manifest.HasField("created_at"),
        "classification": manifest.classification,
        "retrieval_uri": manifest.retrieval_uri,
    }
    return [name for name, value in required.items() if not value]


def stored_mission_id(envelope_bytes: bytes) -> str:
    """The Mission a manifest the store verified at upload (signature, subject, every field) names:
    read again without the checks, and without building the whole manifest (the Authority asks
    for it on every submission, D161)."""
    predicate = json.loads(SignedEnvelope.FromString(envelope_bytes).payload)["predicate"]
    return str(predicate.get("mission_id", ""))
