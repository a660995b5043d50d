"""D162, budgets that add up: a WorkItem's budget fits in what its Mission has left, at authorize and
at an offer; what an unfinished WorkItem holds is its budget, what a finished or failed one holds
is what it used; a Mission without a budget in any dimension is refused at creation."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState
from tests import builders
from tests.aggregates_check import assert_aggregates_recompute
from tests.offline_core import NOW, apply, command, decide, started, with_mission, work_contract

R = common_pb2.RejectionReason


def authorize(work_item_id: str, contract: wp.WorkContract | None = None) -> wp.WorkAuthorize:
    return wp.WorkAuthorize(
        work_item_id=work_item_id,
        title=work_item_id,
        contract=contract or work_contract(),
        coordinator_epoch=1,
    )


def refusal(state: GroupState, kind: str, body: object, actor: str = "coord") -> Rejected:
    before = copy.deepcopy(state)
    decision = decide(state, command(state, kind, body, actor))
    assert state == before
    assert isinstance(decision, Rejected), decision
    return decision


def run(state: GroupState, kind: str, body: object, actor: str = "coord") -> GroupState:
    after = apply(state, command(state, kind, body, actor))
    assert_aggregates_recompute(after)
    return after


def used(state: GroupState, tokens: int) -> GroupState:
    report = wp.WorkReportProgress(
        work_item_id="wi",
        lease_id="lease-1",
        ownership_epoch=1,
        usage_delta=common_pb2.ResourceVector(currency="EUR", tokens=tokens),
        report=wp.ProgressReport(
            phase="p",
            next_checkpoint=wp.PlannedCheckpoint(description="n"),
            revised_estimate=wp.RevisedEstimate(reason="r"),
        ),
    )
    return run(state, "work_report_progress", report, "worker")


@pytest.mark.req("MW-10.1-01")
def test_a_work_items_budget_must_fit_in_what_the_mission_has_left() -> None:
    state = run(used(started(with_mission(tokens=25_000)), 2_000), "work_authorize", authorize("b"))
    assert state.committed["tokens"] == 20_000
    r = refusal(state, "work_authorize", authorize("c"))
    assert r.reason == R.REJECTION_REASON_BUDGET_EXCEEDED
    assert r.metadata == {
        "budget": "mission",
        "dimension": "tokens",
        "limit": "5000",
        "field": "body.contract.budget.tokens",
    }
    assert "5000 left of 25000" in r.message
    # A cancelled WorkItem holds only what it used: the rest of its budget is free again.
    cancelled = run(
        state, "work_cancel", wp.WorkCancel(work_item_id="wi", coordinator_epoch=1, reason="not needed")
    )
    assert cancelled.committed["tokens"] == 12_000
    assert "c" in run(cancelled, "work_authorize", authorize("c")).work_items


def test_an_offer_with_an_amended_contract_must_fit_too() -> None:
    state = run(with_mission(tokens=25_000), "work_authorize", authorize("a"))
    state = run(state, "work_authorize", authorize("b"))  # 20,000 held

    def offer(tokens: int) -> wp.WorkOffer:
        amended = work_contract(tokens=tokens)
        return wp.WorkOffer(
            work_item_id="b",
            offer_id=f"off-{tokens}",
            candidate_ids=["worker"],
            amended_contract=amended,
            expires_at=to_timestamp(NOW + timedelta(minutes=5)),
            selection_criteria=[builders.selection("worker")],
            coordinator_epoch=1,
        )

    assert run(state, "work_offer", offer(15_000)).committed["tokens"] == 25_000  # b's own hold counts once
    r = refusal(state, "work_offer", offer(15_001))
    assert (r.metadata["limit"], r.metadata["field"]) == ("15000", "body.amended_contract.budget.tokens")


@pytest.mark.req("OP-02")
def test_a_dimension_the_mission_leaves_out_funds_no_work_item() -> None:
    state = with_mission()  # no compute_ms in the Mission's budget
    r = refusal(state, "work_authorize", authorize("a", work_contract(compute_ms=1)))
    assert (r.metadata["dimension"], r.metadata["limit"]) == ("compute_ms", "0")


def test_a_mission_without_a_budget_in_any_dimension_is_refused_at_creation() -> None:
    create = builders.mission_create("alice", "coord", NOW)
    create.definition.budget.CopyFrom(common_pb2.ResourceVector())
    decision = decider.decide(
        None, command(None, "mission_create", create, "alice"), decider.DecisionContext(NOW, {})
    )
    assert isinstance(decision, Rejected) and decision.metadata.get("field") == "body.definition.budget"
