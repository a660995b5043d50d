"""Kept so ``from missionweave.client import MeshClient`` keeps working: the SDK lives in missionweave.sdk."""

from missionweave.sdk.client import (
    MeshClient,
    SessionSigner,
    SummaryNotVerified,
    VerifiedSummary,
    blob_digest,
    decode_events,
    membership_epoch,
    open_session_envelope,
    register_identity_envelope,
    verify_group_summary,
)

__all__ = [
    "MeshClient",
    "SessionSigner",
    "SummaryNotVerified",
    "VerifiedSummary",
    "blob_digest",
    "decode_events",
    "membership_epoch",
    "open_session_envelope",
    "register_identity_envelope",
    "verify_group_summary",
]
