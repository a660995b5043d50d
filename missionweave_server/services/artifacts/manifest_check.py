"""An upload's manifest (MW-13.1-03): signed by its producer's session key, describing the bytes it
comes with, complete; checked before a byte is stored, for Upload and for each blob of a BatchUpload."""

from __future__ import annotations

from missionweave.kernel.manifest import (
    ManifestError,
    ManifestErrorCode,
    manifest_digest,
    missing_fields,
    verify_manifest,
)
from missionweave.kernel.signing import parse_session_key_id
from missionweave.v1 import artifact_service_pb2 as pb
from missionweave.v1 import common_pb2
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.services.artifacts.index import ManifestRecord
from missionweave_server.services.artifacts.verify import artifact_error, check_digest

R = common_pb2.RejectionReason

MAX_MANIFEST_BYTES = 64 * 1024


class ManifestCheck:
    """The manifest's part of the servicer (a base of ``service.ArtifactServicer``, which sets ``identities``)."""

    identities: IdentityDirectoryClient

    async def _check_manifest(
        self, header: pb.UploadHeader, hex_digest: str, size: int
    ) -> tuple[ManifestRecord, list[str]]:
        """MW-13.1-03: the manifest is signed by its producer's session key and describes these bytes."""
        envelope = header.manifest
        if envelope.ByteSize() > MAX_MANIFEST_BYTES:
            raise artifact_error(
                R.REJECTION_REASON_TOO_LARGE, "TOO_LARGE", f"manifests are at most {MAX_MANIFEST_BYTES} bytes"
            )
        key = None
        if envelope.signatures:
            parsed = parse_session_key_id(envelope.signatures[0].key_id)
            if parsed is not None:
                key = await self.identities.session_key(*parsed)
        if key is None:
            raise artifact_error(
                R.REJECTION_REASON_SIGNATURE_INVALID,
                "MANIFEST_SIGNATURE_INVALID",
                "the manifest is not signed by a known session key",
            )
        signer = parsed[0] if parsed else ""
        try:
            manifest = verify_manifest(
                envelope, key, expected_digest_hex=hex_digest, expected_size=size, producer_id=signer
            )
        except ManifestError as error:
            signature = error.code == ManifestErrorCode.MANIFEST_SIGNATURE_INVALID
            reason = (
                R.REJECTION_REASON_SIGNATURE_INVALID if signature else R.REJECTION_REASON_INVALID_ARGUMENT
            )
            raise artifact_error(reason, error.code.value, str(error)) from None
        missing = missing_fields(manifest)
        if missing:
            raise artifact_error(
                R.REJECTION_REASON_INVALID_ARGUMENT,
                "MANIFEST_MISMATCH",
                f'the manifest leaves out {", ".join(missing)} (MW-13.1-03; use schema_id "none" for unstructured content)',
            )
        record = ManifestRecord(
            manifest_digest=manifest_digest(envelope),
            content_digest=hex_digest,
            producer_agent_id=manifest.producer_agent_id,
            group_id=manifest.group_id,
            work_item_id=manifest.work_item_id,
            media_type=manifest.media_type,
            envelope=envelope.SerializeToString(),
        )
        sources = [check_digest(s, "manifest.source_artifacts")[0] for s in manifest.source_artifacts]
        return record, sources
