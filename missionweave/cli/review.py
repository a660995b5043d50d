"""``mwp mission review``: what the MissionOwner approves, checked, then approved or sent back.

The facts come from ``AuthorityService.GetMissionReview`` (the read model a web console uses too).
This command adds what only a client can do for itself: it verifies the manifest signature of each
Artifact the submission names through the public ArtifactService (``GetManifest``, then
``mwp artifact manifest --verify``'s check, with the producer's session key the review names, else
its registered key) and, with ``--verify-bytes``, downloads and re-hashes the bytes (MW-13.1-05,
``mwp artifact verify``'s path). ``--approve`` / ``--request-changes`` then answer exactly the
submission reviewed, through ``mwp mission approve`` / ``request-changes``; an approval is refused
while an Artifact fails its checks.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from dataclasses import dataclass
from typing import Any

import grpc

from missionweave.cli.artifact.arguments import digest_text
from missionweave.cli.artifact.manifest import ManifestView, check_signature, decode
from missionweave.cli.artifact.verify import verify_one
from missionweave.cli.common import (
    CliError,
    columns,
    emit,
    enum_label,
    reading,
    reading_command,
    to_dict,
    wants_json,
    when,
)
from missionweave.cli.mission_answers import cmd_approve, cmd_request_changes
from missionweave.kernel.errors import from_proto
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import session_key_id
from missionweave.sdk.client import MeshClient
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import authority_service_pb2 as pb
from missionweave.v1 import common_pb2, mission_pb2, work_pb2

Review = pb.GetMissionReviewResponse
OK, FAILED = "\u2713", "\u2717"  # ✓ ✗
DIMENSIONS = (
    ("financial_micros", "FINANCIAL"),
    ("tokens", "TOKENS"),
    ("tool_calls", "TOOL CALLS"),
    ("compute_ms", "COMPUTE MS"),
    ("wall_clock_ms", "WALL-CLOCK MS"),
    ("side_effects", "SIDE EFFECTS"),
)


@dataclass
class ArtifactCheck:
    """What this client verified of one Artifact of the submission."""

    artifact: pb.MissionReviewArtifact
    signature: str = "FAILED"  # verified | FAILED
    detail: str = ""
    manifest: apb.ArtifactManifest | None = None  # the manifest that verified
    manifest_hex: str = ""
    bytes_status: str = ""  # with --verify-bytes: OK, CORRUPTED, MISSING, ...
    bytes_detail: str = ""

    @property
    def ok(self) -> bool:
        return self.signature == "verified" and self.bytes_status in ("", "OK")

    @property
    def producer(self) -> str:
        return self.artifact.producer_id or (self.manifest.producer_agent_id if self.manifest else "")

    @property
    def media_type(self) -> str:
        return self.artifact.artifact.media_type or (self.manifest.media_type if self.manifest else "")

    @property
    def sources(self) -> list[common_pb2.Digest]:
        listed = self.artifact.source_artifacts or (self.manifest.source_artifacts if self.manifest else [])
        return list(listed)


# ------------------------------------------------------------------ checks


def _session_key(artifact: pb.MissionReviewArtifact, view: ManifestView) -> bytes | None:
    """The producer's session key, when the manifest is signed by the session the review names."""
    named = session_key_id(artifact.producer_id, artifact.producer_session_epoch)
    signed_by_it = artifact.producer_session_public_key and view.key_ids[:1] == [named]
    return bytes(artifact.producer_session_public_key) if signed_by_it else None


async def check_manifest(
    mesh: MeshClient, group_id: str, artifact: pb.MissionReviewArtifact
) -> ArtifactCheck:
    """The manifest the publication recorded (else any naming this Group), verified as
    ``mwp artifact manifest --verify`` verifies it."""
    out = ArtifactCheck(artifact)
    digest = artifact.artifact.digest
    request = apb.GetManifestRequest(
        digest=digest, work_item_id=artifact.work_item_id, producer_agent_id=artifact.producer_id
    )
    try:
        views = [decode(e) for e in (await mesh.artifacts.GetManifest(request)).manifests]
        if artifact.HasField("manifest_digest"):
            candidates = [v for v in views if v.manifest_hex == artifact.manifest_digest.hex]
            out.detail = f"the store serves no manifest blake3:{artifact.manifest_digest.hex}, the one its publication recorded"
        else:
            candidates = [v for v in views if v.manifest is not None and v.manifest.group_id == group_id]
            out.detail = f"the store serves no manifest of {digest_text(digest)} naming {group_id}"
        for view in candidates:
            key = _session_key(artifact, view)
            await check_signature(argparse.Namespace(public_key=key, digest=digest), mesh, view)
            # check_signature names a key it was handed as --public-key: say whose it is.
            whose = f"the session key of {artifact.producer_id} (session {artifact.producer_session_epoch})"
            out.detail = (
                view.signature_detail.replace("the given --public-key", whose)
                if key
                else view.signature_detail
            )
            if view.signature == "verified":
                out.signature, out.manifest, out.manifest_hex = "verified", view.manifest, view.manifest_hex
                break
    except grpc.aio.AioRpcError as err:
        rejection = rejection_from_rpc_error(err)
        if rejection is None:
            raise  # unreachable: no verdict about the Artifact
        refused = from_proto(rejection)
        out.detail = f"refused: {refused.reason_name}: {refused.message}"
    return out


async def check_artifacts(args: argparse.Namespace, mesh: MeshClient, review: Review) -> list[ArtifactCheck]:
    checks = []
    for artifact in review.artifacts:
        check = await check_manifest(mesh, review.group_id, artifact)
        if args.verify_bytes:
            verdict = await verify_one(args, mesh, artifact.artifact.digest)
            check.bytes_status, check.bytes_detail = verdict["status"], verdict["detail"]
        checks.append(check)
    return checks


# ------------------------------------------------------------------ rendering


def _short(digest: common_pb2.Digest) -> str:
    return f"blake3:{digest.hex[:12]}\u2026"


def _submission_lines(review: Review) -> list[str]:
    if not review.HasField("submission"):
        return ["No submission yet: what follows is the Mission as it stands."]
    s = review.submission
    answer = enum_label(pb.MissionReviewAnswer, s.answer, "MISSION_REVIEW_ANSWER_").lower().replace("_", " ")
    status = ("latest" if s.latest else "NOT the latest") + f", {answer}"
    if s.answer_event_id:
        status += f" ({s.answer_event_id})"
    return [
        f"Submission {s.submission_event_id} ({status})",
        f"  by {s.submitted_by} at {when(s.submitted_at)}, Mission revision {s.mission_revision} (Coordinator epoch {s.coordinator_epoch})",
        f"  summary: {s.summary or '(none)'}",
    ]


def _artifact_lines(checks: list[ArtifactCheck], verify_bytes: bool) -> list[str]:
    if not checks:
        return ["Artifacts: none"]
    signed = sum(c.signature == "verified" for c in checks)
    head = f"Artifacts ({len(checks)}): manifest signatures verified {signed} of {len(checks)}"
    if verify_bytes:
        head += (
            f", bytes re-hashed and matching {sum(c.bytes_status == 'OK' for c in checks)} of {len(checks)}"
        )
    rows = [
        [
            "SIG",
            *(["BYTES"] if verify_bytes else []),
            "DIGEST",
            "SIZE",
            "MEDIA TYPE",
            "PRODUCER",
            "WORK ITEM",
            "DERIVED FROM",
        ]
    ]
    for c in checks:
        digest = c.artifact.artifact.digest
        rows.append(
            [
                OK if c.signature == "verified" else FAILED,
                *([OK if c.bytes_status == "OK" else FAILED] if verify_bytes else []),
                f"blake3:{digest.hex}",
                str(digest.size_bytes),
                c.media_type or "-",
                c.producer or "-",
                c.artifact.work_item_id or "-",
                ", ".join(_short(s) for s in c.sources) or "-",
            ]
        )
    lines = [head, *columns(rows, "  ")]
    for c in checks:
        if c.signature != "verified":
            lines.append(f"  {FAILED} {digest_text(c.artifact.artifact.digest)}: manifest: {c.detail}")
        if c.bytes_status not in ("", "OK"):
            lines.append(
                f"  {FAILED} {digest_text(c.artifact.artifact.digest)}: bytes {c.bytes_status}: {c.bytes_detail}"
            )
    return lines


def _evidence_line(e: work_pb2.Evidence, indent: str) -> str:
    result = enum_label(work_pb2.EvidenceResult, e.result, "EVIDENCE_RESULT_")
    method = enum_label(work_pb2.EvidenceMethod, e.method, "EVIDENCE_METHOD_")
    return f"{indent}{result:<8} {method:<10} by {e.producer_id or '-'}  {e.summary}".rstrip()


def _work_item_lines(item: pb.MissionReviewWorkItem) -> list[str]:
    state = enum_label(work_pb2.WorkItemState, item.state, "WORK_ITEM_STATE_")
    submitted = (
        f", submitted by {item.submitted_by}: {item.submission_summary!r}" if item.submission_event_id else ""
    )
    lines = [f"  {item.work_item_id} {item.title!r} {state}{submitted}"]
    for c in item.criteria:
        need = "required" if c.required else "optional"
        if c.independent_review_required:
            need += ", independent review"
        latest = (
            enum_label(work_pb2.EvidenceResult, c.latest_result, "EVIDENCE_RESULT_")
            if c.evidence
            else "no Evidence"
        )
        lines.append(f"    {OK if c.satisfied else FAILED} {c.criterion_id} ({need}): {latest}")
        lines += [_evidence_line(e, "        ") for e in c.evidence]
    if item.other_evidence:
        lines.append("    other Evidence:")
        lines += [
            _evidence_line(e, "        ") + f" ({e.criterion_id or 'no criterion'})"
            for e in item.other_evidence
        ]
    for a in item.artifacts:
        facts = [a.artifact.media_type, "submitted" if a.submitted else "published only"]
        if a.work_item_id and a.work_item_id != item.work_item_id:
            facts.append(f"published by {a.work_item_id}")
        lines.append(f"    artifact {digest_text(a.artifact.digest)}  {', '.join(f for f in facts if f)}")
    return lines


def _blocker_lines(review: Review) -> list[str]:
    if not review.blockers:
        return ["Blockers: none"]
    lines = ["Blockers"]
    for b in review.blockers:
        kind = enum_label(pb.MissionReviewBlockerKind, b.kind, "MISSION_REVIEW_BLOCKER_KIND_")
        state = enum_label(work_pb2.WorkItemState, b.state, "WORK_ITEM_STATE_")
        need = "required" if b.required else "optional"
        details = f": {'; '.join(b.details)}" if b.details else ""
        lines.append(f"  {kind:<12} {b.work_item_id} ({state}, {need}){details}")
    return lines


def _cell(dim: str, budget: common_pb2.Budget) -> str:
    used, cap = getattr(budget.used, dim), getattr(budget.limit, dim)
    if dim == "financial_micros":
        return f"{used / 1e6:.2f}/{cap / 1e6:.2f} {budget.limit.currency}".rstrip()
    return f"{used}/{cap}"


def _budget_lines(review: Review) -> list[str]:
    rows = [["", *(title for _, title in DIMENSIONS)]]
    rows.append(["Mission", *(_cell(dim, review.budget) for dim, _ in DIMENSIONS)])
    rows += [[w.work_item_id, *(_cell(dim, w.budget) for dim, _ in DIMENSIONS)] for w in review.work_items]
    return ["Budget (used/cap)", *columns(rows, "  ")]


def render(review: Review, checks: list[ArtifactCheck], verify_bytes: bool) -> list[str]:
    state = enum_label(mission_pb2.MissionState, review.mission_state, "MISSION_STATE_")
    path = review.critical_path
    lines = [
        f"Mission {review.mission_id} {review.title!r}: {state}, owner {review.owner_id} "
        f"(Group {review.group_id} at revision {review.group_revision})",
        "",
        *_submission_lines(review),
        "",
        *_artifact_lines(checks, verify_bytes),
        "",
        f"WorkItems ({len(review.work_items)}): Evidence per acceptance criterion, Artifacts",
        *(line for item in review.work_items for line in _work_item_lines(item)),
        "",
        *_blocker_lines(review),
        "",
        *_budget_lines(review),
        "",
        f"Critical path (by wall-clock used, {path.wall_clock_ms} ms): {' -> '.join(path.work_item_ids) or '(none)'}",
    ]
    return lines


def document(review: Review, checks: list[ArtifactCheck], decision: Any) -> dict[str, Any]:
    return {
        "review": to_dict(review),
        "artifact_checks": [
            {
                "digest": digest_text(c.artifact.artifact.digest),
                "signature": c.signature,
                "signature_detail": c.detail,
                "manifest_digest": f"blake3:{c.manifest_hex}" if c.manifest_hex else None,
                "bytes": {"status": c.bytes_status, "detail": c.bytes_detail} if c.bytes_status else None,
            }
            for c in checks
        ],
        "verified": all(c.ok for c in checks),
        "decision": decision,
    }


# ------------------------------------------------------------------ the command


async def _answer(args: argparse.Namespace, submission: str) -> Any:
    """Approves or sends back ``submission`` through ``mission approve`` / ``request-changes``;
    with --json their document is returned (one document in all), else they print their report."""
    args.submission = submission
    args.changes = args.request_changes
    command = cmd_approve if args.approve else cmd_request_changes
    if not wants_json(args):
        return await command(args)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        await command(args)
    return json.loads(printed.getvalue())


async def cmd_review(args: argparse.Namespace) -> int:
    """The review, then the answer, if one was asked for. Exit 1 when an Artifact fails its checks,
    unless the submission was sent back; an approval is then refused (nothing written)."""
    async with reading(args) as mesh:
        review = await mesh.mission_review(args.group, args.submission or "")
        checks = await check_artifacts(args, mesh, review)
    failed = sum(not c.ok for c in checks)
    answering = args.approve or args.request_changes is not None
    if not wants_json(args):
        emit(args, render(review, checks, args.verify_bytes), {})
    if answering and not review.HasField("submission"):
        raise CliError(f"the Mission in {args.group} has no submission to answer yet")
    refused = bool(args.approve and failed)
    decision = (
        await _answer(args, review.submission.submission_event_id) if answering and not refused else None
    )
    if wants_json(args):
        emit(args, [], document(review, checks, decision))
    if refused:
        raise CliError(f"not approved: {failed} of {len(checks)} Artifacts failed verification")
    if failed and not answering:
        raise CliError(f"{failed} of {len(checks)} Artifacts failed verification")
    return 0


def add_review_parser(mis: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = reading_command(
        mis.add_parser(
            "review",
            help="what you approve: summary, Artifacts (manifest signatures verified), Evidence per criterion, "
            "blockers, budget, critical path; then --approve or --request-changes",
        )
    )
    r.add_argument("--submission", help="the submission event id to review (default: the latest)")
    r.add_argument(
        "--verify-bytes",
        action="store_true",
        help="also download each Artifact and re-hash its bytes (MW-13.1-05)",
    )
    answer = r.add_mutually_exclusive_group()
    answer.add_argument(
        "--approve", action="store_true", help="then approve the submission reviewed (MissionOwner)"
    )
    answer.add_argument(
        "--request-changes", metavar="TEXT", help="then send it back with what must change (MissionOwner)"
    )
    r.add_argument("--comment", help="a comment for --approve")
    r.set_defaults(func=cmd_review, progress=False)
