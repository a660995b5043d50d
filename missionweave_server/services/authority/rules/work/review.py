"""MW-10.2-T11, T12 / MW-13.2: submission with Evidence, review Evidence and the accepted result."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import (
    MAX_REASON_CHARS,
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    Role,
    check_artifact_refs,
    invalid,
    mission_of,
    named_digests,
)
from missionweave_server.services.authority.rules.deliverables import (
    evidence_refs,
    require_evidence_held,
    require_held,
)
from missionweave_server.services.authority.rules.work.common import (
    SUBMITTED,
    VERIFIED,
    coordination,
    end_lease,
    require_state,
    touch,
    work_item,
)
from missionweave_server.services.authority.rules.work.execution import under_lease
from missionweave_server.services.authority.rules.work.usage import record_usage
from missionweave_server.services.authority.state import GroupState, WorkItemState

MAX_EVIDENCE_SUMMARY = 2048


def require_evidence(
    evidence: Iterable[wp.Evidence],
    field: str,
    item: WorkItemState,
    command: command_pb2.Command,
    now: datetime,
) -> list[wp.Evidence]:
    """MW-13.2-04: each record carries subject, criterion, method, result, producer, timestamp and
    referenced Artifacts. The Authority completes what it knows for certain (the WorkItem as subject,
    the authenticated actor as producer, its clock as the recording time) and refuses the rest.

    MW-13.2-05: Evidence is a result, not a thought process: the only free text is a bounded summary
    of what was observed; there is no field for reasoning, and none is accepted.
    """
    records = []
    for i, given in enumerate(evidence):
        e = wp.Evidence()
        e.CopyFrom(given)
        if (
            not e.evidence_id
        ):  # the producer may leave it to the Authority: derived, so a retry gets the same id
            e.evidence_id = ids.derived_id("evd", command.group_id, command.command_id, str(i))
        if not ids.is_valid(e.evidence_id) or not e.method or not e.result:
            raise invalid(f"{field}[{i}]", "evidence_id, method and result are required (MW-13.2-04)")
        if e.subject.work_item_id and e.subject.work_item_id != item.work_item_id:
            raise invalid(f"{field}[{i}].subject", f"Evidence here is about {item.work_item_id}")
        if e.producer_id and e.producer_id != command.actor_id:
            raise invalid(f"{field}[{i}].producer_id", "the producer is the agent submitting it")
        if len(e.summary) > MAX_EVIDENCE_SUMMARY:
            raise invalid(
                f"{field}[{i}].summary", f"a result summary of at most {MAX_EVIDENCE_SUMMARY} characters"
            )
        check_artifact_refs(e.artifacts, f"{field}[{i}].artifacts")
        e.subject.work_item_id = item.work_item_id
        e.producer_id = command.actor_id
        e.recorded_at.CopyFrom(to_timestamp(now))
        if not e.HasField("produced_at"):
            e.produced_at.CopyFrom(e.recorded_at)
        records.append(e)
    if not records:
        raise invalid(field, "Evidence is required")
    return records


def work_submit(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T11: the owner submits Artifacts and Evidence under its current lease."""
    assert state is not None
    body = command.work_submit
    item, usage = under_lease(state, command, ctx, body, "work.submit")
    if body.contract_revision != item.contract_revision:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH, f"the contract is at revision {item.contract_revision}"
        )
    if not body.artifacts:
        raise invalid("body.artifacts", "a submission carries its Artifacts (MW-10.2-T11)")
    if len(body.summary) > MAX_REASON_CHARS:
        raise invalid("body.summary", f"at most {MAX_REASON_CHARS} characters")
    evidence = require_evidence(body.evidence, "body.evidence", item, command, ctx.now)
    covered = {e.criterion_id for e in evidence}
    missing = [
        c.criterion_id
        for c in item.contract.acceptance_criteria
        if c.required and c.criterion_id not in covered
    ]
    if missing:
        raise invalid("body.evidence", f"no Evidence for required acceptance criteria {', '.join(missing)}")
    require_held(state, command, ctx, body.artifacts, "body.artifacts", deliverables_of=item)
    require_evidence_held(state, command, ctx, evidence, "body.evidence", item)
    out.emit(
        "work.submitted",
        "work_submitted",
        wp.WorkSubmitted(
            work_item_id=item.work_item_id,
            lease_id=body.lease_id,
            ownership_epoch=body.ownership_epoch,
            contract_revision=body.contract_revision,
            artifacts=body.artifacts,
            evidence=evidence,
            summary=body.summary,
        ),
    )
    record_usage(out, state, command, item, body.usage_delta, usage)


def work_record_evidence(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-13.2-03: review Evidence on a submitted WorkItem (integrity, schema, tests, business rules by
    the Coordinator; qualitative review by a reviewer member), retained for the human approval."""
    assert state is not None
    body = command.work_record_evidence
    item = work_item(state, body.work_item_id)
    require_state(item, (SUBMITTED,), "work.record_evidence")
    # The authorization table admits the Coordinator's role (at its current epoch) and reviewers.
    if state.members[command.actor_id].role == Role.MEMBER_ROLE_COORDINATOR:
        coordination(state, command, ctx, body.coordinator_epoch, "work.record_evidence")
    (record,) = require_evidence([body.evidence], "body.evidence", item, command, ctx.now)
    if record.evidence_id in item.evidence:
        raise invalid("body.evidence.evidence_id", "already recorded for this WorkItem")
    require_held(state, command, ctx, record.artifacts, "body.evidence.artifacts", evidence_about=item)
    out.emit(
        "work.evidence_recorded",
        "evidence_recorded",
        wp.EvidenceRecorded(work_item_id=item.work_item_id, evidence=record),
    )


def _combined_evaluation(item: WorkItemState, review_ids: Iterable[str]) -> None:
    """MW-13.2-03 step 4: every required criterion's latest Evidence passes; criteria that demand an
    independent review have a passing record from someone other than the submitter (MW-7.2-11)."""
    for i, eid in enumerate(review_ids):
        if eid not in item.evidence:
            raise invalid(
                f"body.review_evidence_ids[{i}]", f"no Evidence {eid} recorded for {item.work_item_id}"
            )
    latest: dict[str, int] = {}
    independent: set[str] = set()
    for criterion, result, producer in item.evidence.values():
        latest[criterion] = result
        if result == wp.EVIDENCE_RESULT_PASS and producer != item.submitted_by:
            independent.add(criterion)
    for c in item.contract.acceptance_criteria:
        if not c.required:
            continue
        if latest.get(c.criterion_id) != wp.EVIDENCE_RESULT_PASS:
            raise Rejected(
                R.REJECTION_REASON_PRECONDITION_FAILED,
                f"criterion {c.criterion_id} has no passing Evidence as its latest result; request changes or fail the WorkItem",
            )
        if c.independent_review_required and c.criterion_id not in independent:
            raise Rejected(
                R.REJECTION_REASON_PRECONDITION_FAILED,
                f"criterion {c.criterion_id} needs passing Evidence from a reviewer other than the submitter",
            )


def work_accept_result(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T12 / MW-7.2-11: the Coordinator's review succeeds; never the sole reviewer of its own work."""
    assert state is not None
    body = command.work_accept_result
    item = work_item(state, body.work_item_id)
    mission = mission_of(state)
    if command.actor_id == mission.owner_id and item.submitted_by == (
        mission.coordinator.agent_id if mission.coordinator else ""
    ):
        pass  # the MissionOwner reviews work the Coordinator did itself
    else:
        coordination(state, command, ctx, body.coordinator_epoch, "work.accept_result")
        if item.submitted_by == command.actor_id:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED,
                "a Coordinator is never the sole reviewer of its own output; the MissionOwner accepts it (MW-7.2-11)",
            )
    require_state(item, (SUBMITTED,), "work.accept_result")
    _combined_evaluation(item, body.review_evidence_ids)
    if body.submission_event_id != item.latest_submission_event_id:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"the latest submission is {item.latest_submission_event_id}",
        )
    out.emit(
        "work.result_accepted",
        "work_result_accepted",
        wp.WorkResultAccepted(
            work_item_id=item.work_item_id,
            submission_event_id=body.submission_event_id,
            review_evidence_ids=body.review_evidence_ids,
            coordinator_epoch=body.coordinator_epoch,
            comment=body.comment,
        ),
    )


# ---------------------------------------------------------------- evolve rules


def _with(
    recorded: tuple[tuple[str, int], ...], refs: Iterable[common_pb2.ArtifactRef]
) -> tuple[tuple[str, int], ...]:
    """``recorded`` and then each of ``refs`` not in it yet, as (BLAKE3 hex, size)."""
    known = set(recorded)
    added = [(r.digest.hex, int(r.digest.size_bytes)) for r in refs]
    return recorded + tuple(dict.fromkeys(a for a in added if a not in known))


def _submitted(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_submitted
    item = touch(state, event, p.work_item_id)
    item.latest_submission_event_id = event.event_id
    item.submitted_by = event.actor_id
    item.submitted_artifacts = _with(item.submitted_artifacts, p.artifacts)
    item.submitted_evidence_ids = tuple(e.evidence_id for e in p.evidence)
    item.evidence = {e.evidence_id: (e.criterion_id, e.result, e.producer_id) for e in p.evidence}
    end_lease(item, event, wp.LEASE_END_KIND_RELEASED)
    item.state = SUBMITTED


def _evidence_recorded(state: GroupState, event: event_pb2.Event) -> None:
    item = touch(state, event, event.evidence_recorded.work_item_id)
    e = event.evidence_recorded.evidence
    if (
        item.state == SUBMITTED
    ):  # review Evidence of the current submission (failure Evidence is history only)
        item.evidence[e.evidence_id] = (e.criterion_id, e.result, e.producer_id)


def _result_accepted(state: GroupState, event: event_pb2.Event) -> None:
    item = touch(state, event, event.work_result_accepted.work_item_id)
    item.accepted_evidence_ids = item.submitted_evidence_ids + tuple(
        event.work_result_accepted.review_evidence_ids
    )
    item.state = VERIFIED
    item.owner = None


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "work_submit",
        work_submit,
        {"work_submitted": _submitted},
        named_artifacts=lambda c: named_digests(
            c.work_submit.artifacts, evidence_refs(c.work_submit.evidence)
        ),
    ),
    # Evidence: also recorded for a failed attempt that is retried.
    CommandKind(
        "work_record_evidence",
        work_record_evidence,
        {"evidence_recorded": _evidence_recorded},
        named_artifacts=lambda c: named_digests(c.work_record_evidence.evidence.artifacts),
    ),
    CommandKind("work_accept_result", work_accept_result, {"work_result_accepted": _result_accepted}),
)
