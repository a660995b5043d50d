"""Submission and evidence-based review through decide/evolve (MW-10.2-T11/T12, MW-13.2-02..05,
MW-7.2-11): the Evidence record the Authority completes, required criteria, review Evidence, the
combined evaluation with independent review, and the accepted result."""

from __future__ import annotations

import copy

import pytest

from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import MAX_REASON_CHARS
from missionweave_server.services.authority.state import GroupState
from tests import builders
from tests.offline_core import LEASE_ID, started, with_mission, work_contract
from tests.work_execution_fixtures import (
    USAGE,
    R,
    at,
    decide,
    events,
    evolve_all,
    invalid_field,
    refused,
    run,
    usage_event,
    vector,
    with_reviewer,
)

PASS, FAIL = wp.EVIDENCE_RESULT_PASS, wp.EVIDENCE_RESULT_FAIL
ZERO = dict.fromkeys(
    ("financial_micros", "tokens", "tool_calls", "compute_ms", "wall_clock_ms", "side_effects"), 0
)


def criterion(cid: str, *, required: bool = True, independent: bool = False) -> wp.AcceptanceCriterion:
    return wp.AcceptanceCriterion(
        criterion_id=cid,
        description=cid,
        required_evidence_methods=[wp.EVIDENCE_METHOD_TEST],
        deliverable_ids=["report"],
        required=required,
        independent_review_required=independent,
    )


def active(*criteria: wp.AcceptanceCriterion) -> GroupState:
    contract = work_contract()
    if criteria:
        del contract.acceptance_criteria[:]
        contract.acceptance_criteria.extend(criteria)
    return with_reviewer(started(with_mission(), contract=contract))


BASE = active()


def submit(*evidence: wp.Evidence, **kw: object) -> wp.WorkSubmit:
    return wp.WorkSubmit(
        **{  # type: ignore[arg-type]
            "work_item_id": "wi",
            "lease_id": LEASE_ID,
            "ownership_epoch": 1,
            "contract_revision": 1,
            "artifacts": [builders.artifact()],
            "evidence": list(evidence or [builders.evidence()]),
            **kw,
        }
    )


def recorded(e: wp.Evidence, producer: str, when: float) -> wp.Evidence:
    """``e`` as the Authority records it: about ``wi``, by the actor, at its clock (MW-13.2-04)."""
    out = wp.Evidence()
    out.CopyFrom(e)
    out.subject.work_item_id = "wi"
    out.producer_id = producer
    out.recorded_at.CopyFrom(to_timestamp(at(when)))
    if not out.HasField("produced_at"):
        out.produced_at.CopyFrom(out.recorded_at)
    return out


# ---------------------------------------------------------------- submission (T11, MW-13.2-02/04)


@pytest.mark.req("MW-10.2-T11", "MW-13.2-04", "MW-11.5-12")
def test_a_submission_records_artifacts_and_completed_evidence_and_ends_the_lease() -> None:
    body = submit(usage_delta=vector(tokens=9), summary="done")
    c, decision = decide(BASE, "work_submit", body, at=at(20))
    submitted = wp.WorkSubmitted(
        work_item_id="wi",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        contract_revision=1,
        artifacts=[builders.artifact()],
        evidence=[recorded(builders.evidence(), "worker", 20)],
        summary="done",
    )
    used = dict(ZERO, tokens=9)
    assert events(decision) == [
        ("work.submitted", submitted),
        (USAGE, usage_event(c, vector(tokens=9), used, used)),
    ]
    after = evolve_all(BASE, decision)
    item = after.work_items["wi"]
    assert item.state == wp.WORK_ITEM_STATE_SUBMITTED
    assert (item.latest_submission_event_id, item.submitted_by) == (decision[0].event_id, "worker")
    assert item.submitted_evidence_ids == ("ev-1",)
    assert item.evidence == {"ev-1": ("balances", PASS, "worker")}
    assert item.lease is None
    assert item.lease_history[LEASE_ID].end_kind == wp.LEASE_END_KIND_RELEASED
    assert item.lease_history[LEASE_ID].ended_at == at(20)


@pytest.mark.req("MW-13.2-04")
def test_the_authority_derives_a_missing_evidence_id_and_keeps_the_production_time() -> None:
    first, second = builders.evidence(evidence_id=""), builders.evidence(evidence_id="")
    second.produced_at.CopyFrom(to_timestamp(at(3)))
    c, decision = decide(BASE, "work_submit", submit(first, second), at=at(20))
    got = events(decision)[0][1].evidence
    assert [e.evidence_id for e in got] == [
        ids.derived_id("evd", c.group_id, c.command_id, str(i)) for i in (0, 1)
    ]
    assert got[0].produced_at == to_timestamp(at(20)) and got[1].produced_at == to_timestamp(at(3))
    assert got[1].recorded_at == to_timestamp(at(20))


def _ev(**kw: object) -> wp.Evidence:
    return builders.with_overrides(builders.evidence(), kw)


@pytest.mark.req("MW-13.2-04", "MW-13.2-05")
@pytest.mark.parametrize(
    ("evidence", "field"),
    [
        ([], "body.evidence"),
        ([_ev(method=0)], "body.evidence[0]"),
        ([_ev(result=0)], "body.evidence[0]"),
        ([_ev(evidence_id="not valid!")], "body.evidence[0]"),
        (
            [builders.evidence(), _ev(evidence_id="ev-2", subject=wp.EvidenceSubject(work_item_id="other"))],
            "body.evidence[1].subject",
        ),
        ([_ev(producer_id="coord")], "body.evidence[0].producer_id"),
        ([_ev(summary="x" * 2049)], "body.evidence[0].summary"),
    ],
)
def test_evidence_lacking_a_required_part_or_about_something_else_is_refused(
    evidence: list, field: str
) -> None:
    body = submit()
    del body.evidence[:]
    body.evidence.extend(evidence)
    assert invalid_field(refused(BASE, "work_submit", body, at=at(20))) == field


@pytest.mark.req("MW-13.2-04")
def test_evidence_naming_its_own_subject_producer_and_longest_summary_is_accepted() -> None:
    e = _ev(subject=wp.EvidenceSubject(work_item_id="wi"), producer_id="worker", summary="x" * 2048)
    _, decision = decide(BASE, "work_submit", submit(e), at=at(20))
    assert events(decision)[0][1].evidence == [recorded(e, "worker", 20)]


@pytest.mark.req("MW-10.2-T11")
def test_a_submission_needs_the_current_revision_its_artifacts_and_a_bounded_summary() -> None:
    assert (
        refused(BASE, "work_submit", submit(contract_revision=2), at=at(20)).reason
        == R.REJECTION_REASON_REVISION_MISMATCH
    )
    assert invalid_field(refused(BASE, "work_submit", submit(artifacts=[]), at=at(20))) == "body.artifacts"
    too_long = submit(summary="s" * (MAX_REASON_CHARS + 1))
    assert invalid_field(refused(BASE, "work_submit", too_long, at=at(20))) == "body.summary"
    assert not isinstance(
        decide(BASE, "work_submit", submit(summary="s" * MAX_REASON_CHARS), at=at(20))[1], Exception
    )
    assert (
        refused(BASE, "work_submit", submit(lease_id="lease-0"), at=at(20)).reason
        == R.REJECTION_REASON_LEASE_STALE
    )


@pytest.mark.req("MW-13.2-02")
def test_a_submission_maps_evidence_to_every_required_criterion_but_not_the_optional_ones() -> None:
    state = active(criterion("balances"), criterion("style", required=False))
    assert (
        events(decide(state, "work_submit", submit(builders.evidence()), at=at(20))[1])[0][0]
        == "work.submitted"
    )
    only_optional = submit(builders.evidence(criterion_id="style"))
    rejection = refused(state, "work_submit", only_optional, at=at(20))
    assert invalid_field(rejection) == "body.evidence" and "balances" in rejection.message


# ---------------------------------------------------------------- review Evidence (MW-13.2-03)


SUBMITTED = run(BASE, "work_submit", submit(), at=at(20))


def record(evidence: wp.Evidence, **kw: object) -> wp.WorkRecordEvidence:
    return wp.WorkRecordEvidence(work_item_id="wi", evidence=evidence, **kw)  # type: ignore[arg-type]


@pytest.mark.req("MW-13.2-03")
def test_review_evidence_on_a_submission_is_recorded_by_a_reviewer_or_the_coordinator() -> None:
    e = _ev(evidence_id="rv-1", result=FAIL)
    _, decision = decide(SUBMITTED, "work_record_evidence", record(e), "rev", at=at(30))
    assert events(decision) == [
        ("work.evidence_recorded", wp.EvidenceRecorded(work_item_id="wi", evidence=recorded(e, "rev", 30)))
    ]
    after = evolve_all(SUBMITTED, decision)
    assert after.work_items["wi"].evidence == {
        "ev-1": ("balances", PASS, "worker"),
        "rv-1": ("balances", FAIL, "rev"),
    }
    assert after.work_items["wi"].revision == SUBMITTED.work_items["wi"].revision + 1
    _, decision = decide(
        SUBMITTED, "work_record_evidence", record(e, coordinator_epoch=1), "coord", at=at(30)
    )
    assert events(decision)[0][1].evidence.producer_id == "coord"
    assert refused(
        SUBMITTED, "work_record_evidence", record(e, coordinator_epoch=2), "coord", at=at(30)
    ).reason == (R.REJECTION_REASON_COORDINATOR_EPOCH_STALE)


@pytest.mark.req("MW-13.2-03")
def test_review_evidence_is_new_and_only_for_a_submitted_work_item() -> None:
    again = record(builders.evidence())  # ev-1 is the submission's own
    assert (
        invalid_field(refused(SUBMITTED, "work_record_evidence", again, "rev", at=at(30)))
        == "body.evidence.evidence_id"
    )
    assert invalid_field(
        refused(SUBMITTED, "work_record_evidence", record(_ev(method=0)), "rev", at=at(30))
    ) == ("body.evidence[0]")
    assert refused(BASE, "work_record_evidence", record(builders.evidence()), "rev", at=at(30)).reason == (
        R.REJECTION_REASON_INVALID_TRANSITION
    )


# ---------------------------------------------------------------- the accepted result (T12, MW-7.2-11)


def accept(state: GroupState, *review: str, **kw: object) -> wp.WorkAcceptResult:
    kw.setdefault("coordinator_epoch", 1)
    return wp.WorkAcceptResult(  # type: ignore[arg-type]
        work_item_id="wi",
        submission_event_id=state.work_items["wi"].latest_submission_event_id,
        review_evidence_ids=list(review),
        **kw,
    )


def reviewed(state: GroupState, *results: tuple[str, str, int, str]) -> GroupState:
    """Review Evidence (id, criterion, result, producer) recorded in order."""
    for eid, cid, result, producer in results:
        e = _ev(evidence_id=eid, criterion_id=cid, result=result)
        state = run(
            state,
            "work_record_evidence",
            record(e, coordinator_epoch=1 if producer == "coord" else 0),
            producer,
            at=at(30),
        )
    return state


@pytest.mark.req("MW-10.2-T12", "MW-13.2-03")
def test_an_accepted_result_verifies_the_work_item_and_retains_all_evidence() -> None:
    state = reviewed(SUBMITTED, ("rv-1", "balances", PASS, "rev"))
    _, decision = decide(
        state, "work_accept_result", accept(state, "rv-1", comment="fine"), "coord", at=at(40)
    )
    expected = wp.WorkResultAccepted(
        work_item_id="wi",
        submission_event_id=state.work_items["wi"].latest_submission_event_id,
        review_evidence_ids=["rv-1"],
        coordinator_epoch=1,
        comment="fine",
    )
    assert events(decision) == [("work.result_accepted", expected)]
    item = evolve_all(state, decision).work_items["wi"]
    assert (item.state, item.owner) == (wp.WORK_ITEM_STATE_VERIFIED, None)
    assert item.accepted_evidence_ids == ("ev-1", "rv-1")


@pytest.mark.req("MW-10.2-T12")
def test_only_the_latest_submission_with_recorded_review_evidence_is_accepted() -> None:
    wrong = accept(SUBMITTED)
    wrong.submission_event_id = "evt_other"
    assert (
        refused(SUBMITTED, "work_accept_result", wrong, "coord", at=at(40)).reason
        == R.REJECTION_REASON_REVISION_MISMATCH
    )
    state = reviewed(SUBMITTED, ("rv-1", "balances", PASS, "rev"))
    unknown = accept(state, "rv-1", "rv-9")
    assert (
        invalid_field(refused(state, "work_accept_result", unknown, "coord", at=at(40)))
        == "body.review_evidence_ids[1]"
    )
    assert (
        refused(BASE, "work_accept_result", accept(BASE), "coord", at=at(40)).reason
        == R.REJECTION_REASON_INVALID_TRANSITION
    )


@pytest.mark.req("MW-13.2-03")
def test_every_required_criterion_needs_passing_evidence_as_its_latest_result() -> None:
    state = reviewed(SUBMITTED, ("rv-1", "balances", FAIL, "rev"))
    assert (
        refused(state, "work_accept_result", accept(state), "coord", at=at(40)).reason
        == R.REJECTION_REASON_PRECONDITION_FAILED
    )
    state = reviewed(state, ("rv-2", "balances", PASS, "rev"))  # a later pass supersedes the failure
    assert (
        events(decide(state, "work_accept_result", accept(state), "coord", at=at(40))[1])[0][0]
        == "work.result_accepted"
    )


@pytest.mark.req("MW-13.2-03")
def test_an_optional_criterion_does_not_hold_back_acceptance() -> None:
    state = run(
        active(criterion("style", required=False), criterion("balances")), "work_submit", submit(), at=at(20)
    )
    state = reviewed(state, ("rv-1", "style", FAIL, "rev"))
    assert (
        events(decide(state, "work_accept_result", accept(state), "coord", at=at(40))[1])[0][0]
        == "work.result_accepted"
    )
    state = reviewed(state, ("rv-2", "balances", FAIL, "rev"))
    assert (
        refused(state, "work_accept_result", accept(state), "coord", at=at(40)).reason
        == R.REJECTION_REASON_PRECONDITION_FAILED
    )


@pytest.mark.req("MW-7.2-11", "MW-13.2-03")
def test_a_criterion_demanding_independent_review_needs_a_pass_from_someone_else_than_the_submitter() -> None:
    state = run(active(criterion("balances", independent=True)), "work_submit", submit(), at=at(20))
    rejection = refused(state, "work_accept_result", accept(state), "coord", at=at(40))
    assert rejection.reason == R.REJECTION_REASON_PRECONDITION_FAILED and "reviewer" in rejection.message
    failed_review = reviewed(state, ("rv-1", "balances", FAIL, "rev"))
    assert refused(failed_review, "work_accept_result", accept(failed_review), "coord", at=at(40)).reason == (
        R.REJECTION_REASON_PRECONDITION_FAILED
    )
    state = reviewed(state, ("rv-1", "balances", PASS, "rev"))
    assert (
        events(decide(state, "work_accept_result", accept(state), "coord", at=at(40))[1])[0][0]
        == "work.result_accepted"
    )


@pytest.mark.req("MW-7.2-11")
def test_a_coordinator_never_accepts_its_own_output_the_mission_owner_does() -> None:
    state = copy.deepcopy(SUBMITTED)
    item = state.work_items["wi"]
    item.submitted_by = "coord"  # the Coordinator did the work itself
    item.evidence = {"ev-1": ("balances", PASS, "coord")}
    assert (
        refused(state, "work_accept_result", accept(state), "coord", at=at(40)).reason
        == R.REJECTION_REASON_PERMISSION_DENIED
    )
    _, decision = decide(state, "work_accept_result", accept(state, coordinator_epoch=0), "alice", at=at(40))
    assert events(decision)[0][0] == "work.result_accepted"
    # The MissionOwner reviews only the Coordinator's own work; anyone else's goes through the Coordinator.
    assert refused(
        SUBMITTED, "work_accept_result", accept(SUBMITTED, coordinator_epoch=0), "alice", at=at(40)
    ).reason != (R.REJECTION_REASON_UNSPECIFIED)


@pytest.mark.req("MW-7.2-11", "MW-10.2-05")
def test_with_no_coordinator_the_mission_owner_is_judged_by_the_state_table_alone() -> None:
    state = copy.deepcopy(BASE)
    state.mission.coordinator = None  # e.g. between a Coordinator's removal and its replacement
    rejection = refused(state, "work_accept_result", accept(state, coordinator_epoch=0), "alice", at=at(40))
    assert rejection.reason == R.REJECTION_REASON_INVALID_TRANSITION  # nothing submitted yet
