"""MW-13.2: the Coordinator's review pipeline over the public API, and the Authority's combined check."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest
from nacl.signing import SigningKey

from missionweave.sdk.client import blob_digest, decode_events
from missionweave.sdk.review import Check, ReviewPipeline
from missionweave.v1 import common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.conftest import World
from tests.test_missions import G, refused
from tests.test_work_items import Flow, setup

R = common_pb2.RejectionReason
SCHEMA = {"type": "object", "required": ["total"], "properties": {"total": {"type": "number"}}}


async def submitted_json(
    w: World, f: Flow, payload: dict[str, object], *, independent: bool = False
) -> tuple[wp.WorkContract, wp.WorkSubmitted, str]:
    schema_bytes = json.dumps(SCHEMA).encode()
    await w.client.upload(schema_bytes)
    contract = builders.contract(w.clock.now())
    contract.deliverables[0].media_type = "application/json"
    contract.deliverables[0].schema.artifact.digest.CopyFrom(blob_digest(schema_bytes))
    contract.acceptance_criteria[0].independent_review_required = independent
    contract.acceptance_criteria.add(
        criterion_id="totals-positive",
        description="total > 0",
        required_evidence_methods=[wp.EVIDENCE_METHOD_BUSINESS_RULE],
        required=True,
    )
    await f.coord(
        "work_authorize",
        wp.WorkAuthorize(work_item_id="wi-1", title="report", contract=contract, coordinator_epoch=1),
    )
    epoch = await f.accept(w.worker, "wi-1", await f.offer("wi-1", "worker-bot"))
    await f.start(w.worker, "wi-1", epoch, "lease-1")
    data = json.dumps(payload).encode()
    ref = await w.deliverable(w.worker, G, "wi-1", data, media_type="application/json")
    body = Flow.submit_body("wi-1", epoch, "lease-1", [ref])
    body.evidence.append(builders.evidence("ev-2", "totals-positive"))
    result = await f.as_(w.worker, "work_submit", body)
    event = decode_events(result.events)[0]
    group = await w.mesh.authority.state(G)  # type: ignore[attr-defined]
    return group.work_items["wi-1"].contract, event.work_submitted, event.event_id


def positive_total(blobs: Mapping[str, bytes]) -> tuple[bool, str]:
    totals = [json.loads(b).get("total", 0) for b in blobs.values()]
    return all(t > 0 for t in totals), f"totals {totals}"


def pipeline(w: World) -> ReviewPipeline:
    return ReviewPipeline(w.client, w.coordinator, G, coordinator_epoch=1, membership_epoch=2)


@pytest.mark.req("MW-13.2-01", "MW-13.2-03", "MW-13.2-02")
async def test_review_in_order_then_accept_with_everything_retained(world: World) -> None:
    w = world
    f = await setup(w)
    contract, submission, submission_id = await submitted_json(w, f, {"total": 42})
    outcome = await pipeline(w).review(
        "wi-1",
        contract,
        submission,
        submission_id,
        [Check("totals-positive", positive_total, wp.EVIDENCE_METHOD_BUSINESS_RULE)],
    )
    assert outcome.accepted and not outcome.failed_criteria
    methods = [e.method for e in outcome.evidence]
    assert methods == [
        wp.EVIDENCE_METHOD_INTEGRITY,
        wp.EVIDENCE_METHOD_SCHEMA,
        wp.EVIDENCE_METHOD_BUSINESS_RULE,
    ]  # the spec's order
    recorded = [e async for e in w.client.read_events(G) if e.type == "work.evidence_recorded"]
    assert len(recorded) == 3  # retained for the human approval, before the acceptance
    events = [e async for e in w.client.read_events(G)]
    accepted = next(e for e in events if e.type == "work.result_accepted").work_result_accepted
    assert set(accepted.review_evidence_ids) == {e.evidence_id for e in outcome.evidence}


@pytest.mark.req("MW-13.2-03")
async def test_a_failing_check_or_schema_blocks_acceptance(world: World) -> None:
    w = world
    f = await setup(w)
    contract, submission, submission_id = await submitted_json(w, f, {"total": "not a number"})
    outcome = await pipeline(w).review(
        "wi-1",
        contract,
        submission,
        submission_id,
        [Check("totals-positive", positive_total, wp.EVIDENCE_METHOD_BUSINESS_RULE)],
    )
    assert not outcome.accepted and "schema:report" in outcome.failed_criteria
    # The Authority's combined evaluation refuses a direct acceptance too: the latest Evidence of the
    # criterion is the failing business-rule check.
    failing = wp.Evidence(
        evidence_id="coord-says-no",
        criterion_id="totals-positive",
        method=wp.EVIDENCE_METHOD_BUSINESS_RULE,
        result=wp.EVIDENCE_RESULT_FAIL,
    )
    await f.coord(
        "work_record_evidence",
        wp.WorkRecordEvidence(work_item_id="wi-1", evidence=failing, coordinator_epoch=1),
    )
    accept = wp.WorkAcceptResult(work_item_id="wi-1", coordinator_epoch=1, submission_event_id=submission_id)
    await refused(
        w,
        w.coordinator,
        G,
        "work_accept_result",
        accept,
        R.REJECTION_REASON_PRECONDITION_FAILED,
        membership_epoch=2,
    )


@pytest.mark.req("MW-13.2-03", "MW-7.2-11")
async def test_independent_review_needs_a_reviewer_members_passing_evidence(world: World) -> None:
    w = world
    reviewer_key = SigningKey.generate()
    await w.client.register_identity(
        "admin",
        w.keys["admin"],
        "reviewer-bot",
        common_pb2.IDENTITY_KIND_AGENT,
        bytes(reviewer_key.verify_key),
    )
    reviewer = await w.client.open_session("reviewer-bot", reviewer_key)
    f = await setup(w)
    await w.run(
        w.owner,
        G,
        "membership_grant",
        membership_pb2.MembershipGrant(member_id="reviewer-bot", role=membership_pb2.MEMBER_ROLE_REVIEWER),
        membership_epoch=1,
    )
    contract, submission, submission_id = await submitted_json(w, f, {"total": 7}, independent=True)
    checks = [Check("totals-positive", positive_total, wp.EVIDENCE_METHOD_BUSINESS_RULE)]
    first = await pipeline(w).review("wi-1", contract, submission, submission_id, checks, accept=False)
    assert not first.accepted
    accept = wp.WorkAcceptResult(work_item_id="wi-1", coordinator_epoch=1, submission_event_id=submission_id)
    await refused(
        w,
        w.coordinator,
        G,
        "work_accept_result",
        accept,
        R.REJECTION_REASON_PRECONDITION_FAILED,
        membership_epoch=2,
    )
    review = wp.Evidence(
        evidence_id="rev-balances",
        criterion_id="balances",
        method=wp.EVIDENCE_METHOD_REVIEW,
        result=wp.EVIDENCE_RESULT_PASS,
        summary="spot-checked 10 balances",
    )
    worker_try = wp.WorkRecordEvidence(work_item_id="wi-1", evidence=review)
    await refused(
        w,
        w.worker,
        G,
        "work_record_evidence",
        worker_try,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=3,
    )
    await w.run(
        reviewer, G, "work_record_evidence", worker_try, membership_epoch=await w.epoch_of(G, "reviewer-bot")
    )
    second = await pipeline(w).review("wi-1", contract, submission, submission_id, checks)
    assert second.accepted and [e.evidence_id for e in second.reviewer_evidence] == ["rev-balances"]
