"""The Coordinator's Evidence review pipeline (spec 13.2), in the order MW-13.2-03 gives:

1. Artifact integrity (verified download and re-hash) and the required output schema (JSON Schema
   via ``jsonschema`` when a deliverable names one);
2. deterministic tests and business rules: pluggable ``Check`` functions per acceptance criterion;
3. reviewer-agent Evidence for qualitative criteria: recorded by reviewer members with
   ``work.record_evidence`` and read back from the log;
4. the combined evaluation (every required criterion's latest Evidence passes);
5. retention: every result is recorded as Evidence in the Group's log before the result is accepted,
   so the human approval sees all of it.

A Worker's claim of completion is not enough (MW-13.2-01): acceptance cites these records, and the
Authority refuses ``work.accept_result`` unless the combined evaluation holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import blake3
import jsonschema

from missionweave.kernel import ids
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp

PASS, FAIL = wp.EVIDENCE_RESULT_PASS, wp.EVIDENCE_RESULT_FAIL

# A check sees the submitted Artifacts (verified bytes by BLAKE3 hex) and returns (passed, summary).
CheckFunction = Callable[[Mapping[str, bytes]], tuple[bool, str]]


@dataclass(frozen=True)
class Check:
    criterion_id: str
    run: CheckFunction
    method: int = wp.EVIDENCE_METHOD_TEST  # or EVIDENCE_METHOD_BUSINESS_RULE


@dataclass
class ReviewOutcome:
    evidence: list[wp.Evidence] = field(default_factory=list)  # recorded by this review
    reviewer_evidence: list[wp.Evidence] = field(default_factory=list)  # found in the log
    failed_criteria: list[str] = field(default_factory=list)
    accepted: bool = False


class ReviewPipeline:
    def __init__(
        self,
        client: MeshClient,
        coordinator: SessionSigner,
        group_id: str,
        *,
        coordinator_epoch: int,
        membership_epoch: int,
    ) -> None:
        self.client = client
        self.coordinator = coordinator
        self.group_id = group_id
        self.coordinator_epoch = coordinator_epoch
        self.membership_epoch = membership_epoch

    async def review(
        self,
        work_item_id: str,
        contract: wp.WorkContract,
        submission: wp.WorkSubmitted,
        submission_event_id: str,
        checks: list[Check],
        *,
        accept: bool = True,
    ) -> ReviewOutcome:
        outcome = ReviewOutcome()
        blobs = await self._integrity(submission, outcome)  # step 1
        self._schemas(contract, submission, blobs, outcome, await self._schema_documents(contract))
        for check in checks:  # step 2
            passed, summary = _run(check, blobs)
            outcome.evidence.append(
                _evidence(f"check:{check.criterion_id}", check.criterion_id, check.method, passed, summary)
            )
        outcome.reviewer_evidence = await self._reviewer_evidence(work_item_id, submission_event_id)  # step 3
        outcome.failed_criteria = _combined(contract, submission, outcome)  # step 4
        for e in outcome.evidence:  # step 5: retained in the log before any decision
            await self._command(
                "work_record_evidence",
                wp.WorkRecordEvidence(
                    work_item_id=work_item_id, evidence=e, coordinator_epoch=self.coordinator_epoch
                ),
            )
        if accept and not outcome.failed_criteria:
            review_ids = [e.evidence_id for e in outcome.evidence + outcome.reviewer_evidence]
            body = wp.WorkAcceptResult(
                work_item_id=work_item_id,
                coordinator_epoch=self.coordinator_epoch,
                submission_event_id=submission_event_id,
                review_evidence_ids=review_ids,
                comment="review pipeline passed",
            )
            await self._command("work_accept_result", body)
            outcome.accepted = True
        return outcome

    async def _integrity(
        self, submission: wp.WorkSubmitted, outcome: ReviewOutcome
    ) -> dict[str, bytes] | None:
        blobs: dict[str, bytes] = {}
        ok = True
        fetched: list[bytes | Exception]
        try:  # small artifacts in batches, the rest streamed (MeshClient.download_many)
            fetched = list(await self.client.download_many([ref.digest for ref in submission.artifacts]))
        except Exception as error:  # a refused or corrupted download is a failed integrity check
            fetched = [error] * len(submission.artifacts)
        for ref, got in zip(submission.artifacts, fetched, strict=True):
            if isinstance(got, Exception):
                passed, data = False, b""
                summary = f"download failed: {type(got).__name__}"
            else:
                data = got
                passed = (
                    blake3.blake3(data).hexdigest() == ref.digest.hex and len(data) == ref.digest.size_bytes
                )
                summary = f"{len(data)} bytes, BLAKE3 verified"
            outcome.evidence.append(
                _evidence(
                    f"integrity:{ref.digest.hex[:16]}",
                    f"integrity:{ref.digest.hex[:16]}",
                    wp.EVIDENCE_METHOD_INTEGRITY,
                    passed,
                    summary,
                    ref,
                )
            )
            ok = ok and passed
            blobs[ref.digest.hex] = data
        return blobs if ok else None

    async def _schema_documents(self, contract: wp.WorkContract) -> dict[str, dict[str, object]]:
        documents = {}
        for d in contract.deliverables:
            if d.HasField("schema") and d.schema.HasField("artifact"):
                documents[d.deliverable_id] = json.loads(await self.client.download(d.schema.artifact.digest))
        return documents

    @staticmethod
    def _schemas(
        contract: wp.WorkContract,
        submission: wp.WorkSubmitted,
        blobs: Mapping[str, bytes] | None,
        outcome: ReviewOutcome,
        documents: Mapping[str, dict[str, object]],
    ) -> None:
        """Each JSON Artifact of a deliverable's media type must validate against its schema."""
        for d in contract.deliverables:
            schema = documents.get(d.deliverable_id)
            if schema is None:
                continue
            candidates = [r for r in submission.artifacts if r.media_type == d.media_type]
            errors = [] if candidates else [f"no artifact of media type {d.media_type}"]
            for ref in candidates:
                try:
                    jsonschema.validate(json.loads((blobs or {}).get(ref.digest.hex, b"null")), schema)
                except (jsonschema.ValidationError, ValueError) as error:
                    errors.append(str(getattr(error, "message", error))[:200])
            summary = "valid against the schema" if not errors else "; ".join(errors)
            outcome.evidence.append(
                _evidence(
                    f"schema:{d.deliverable_id}",
                    f"schema:{d.deliverable_id}",
                    wp.EVIDENCE_METHOD_SCHEMA,
                    not errors,
                    summary,
                )
            )

    async def _reviewer_evidence(self, work_item_id: str, submission_event_id: str) -> list[wp.Evidence]:
        """Evidence reviewer members recorded on this submission (read from the log)."""
        found: list[wp.Evidence] = []
        after_submission = False
        async for event in self.client.read_events(self.group_id):
            if event.event_id == submission_event_id:
                after_submission = True
            elif (
                after_submission
                and event.type == "work.evidence_recorded"
                and event.evidence_recorded.work_item_id == work_item_id
            ):
                if event.evidence_recorded.evidence.producer_id != self.coordinator.identity_id:
                    found.append(event.evidence_recorded.evidence)  # reviewers', not this pipeline's own
        return found

    async def _command(self, kind: str, body: object) -> None:
        command = self.coordinator.command(self.group_id, kind, body, membership_epoch=self.membership_epoch)  # type: ignore[arg-type]
        await self.client.execute(self.coordinator.sign(command))


def _run(check: Check, blobs: Mapping[str, bytes] | None) -> tuple[bool, str]:
    """A check that cannot run, or raises, is a failed check, never a crashed review."""
    if blobs is None:
        return False, "not run: the artifacts failed integrity"
    try:
        return check.run(blobs)
    except Exception as error:
        return False, f"the check raised {type(error).__name__}: {error}"[:2048]


def _evidence(
    evidence_id: str,
    criterion_id: str,
    method: int,
    passed: bool,
    summary: str,
    ref: common_pb2.ArtifactRef | None = None,
) -> wp.Evidence:
    e = wp.Evidence(
        evidence_id=f"rev-{ids.new_id('x').split('_', 1)[1][:12]}-{evidence_id}"[:128].replace("/", "-"),
        criterion_id=criterion_id,
        method=method,  # type: ignore[arg-type]
        result=PASS if passed else FAIL,
        summary=summary[:2048],
    )
    if ref is not None:
        e.artifacts.append(ref)
    return e


def _combined(contract: wp.WorkContract, submission: wp.WorkSubmitted, outcome: ReviewOutcome) -> list[str]:
    """Step 4: the required criteria whose latest Evidence (submission, review, reviewers) is not a pass,
    and any failed integrity or schema check."""
    latest: dict[str, int] = {}
    for e in [*submission.evidence, *outcome.evidence, *outcome.reviewer_evidence]:
        latest[e.criterion_id] = e.result
    failed = [
        c.criterion_id
        for c in contract.acceptance_criteria
        if c.required and latest.get(c.criterion_id) != PASS
    ]
    failed += [e.criterion_id for e in outcome.evidence if e.result != PASS and ":" in e.criterion_id]
    return failed
