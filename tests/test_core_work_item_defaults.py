"""Pure core: what a new WorkItem starts from (missionweave_server/services/authority/state.py WorkItemState), as the
rules that read it show it through decider.decide/evolve: aggregate revision 1 (MW-10.2-05, OP-10),
no ownership epoch used yet (the first owner holds epoch 1, MW-11.3-02), no attempt made (the first
start is attempt 1, MW-11.4-08) and no checkpoint to resume from."""

from __future__ import annotations

from datetime import timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState
from tests import builders
from tests.steward_fixtures import BASE, GROUP, IDS, NOW, events, rejection

RK = common_pb2.RevisionKind


def authorized(max_attempts: int = 3) -> GroupState:
    contract = builders.contract(NOW, retry_policy=wp.RetryPolicy(max_attempts=max_attempts))
    body = wp.WorkAuthorize(work_item_id="wi", title="wi", contract=contract, coordinator_epoch=1)
    return GROUP.run(BASE, "work_authorize", body, "coord")


def offered(state: GroupState) -> GroupState:
    offer = wp.WorkOffer(
        work_item_id="wi",
        offer_id="off-1",
        candidate_ids=["worker"],
        expires_at=to_timestamp(NOW + timedelta(minutes=5)),
        selection_criteria=[builders.selection("worker")],
        coordinator_epoch=1,
    )
    return GROUP.run(state, "work_offer", offer, "coord")


ACCEPT = wp.WorkAcceptOffer(work_item_id="wi", offer_id="off-1", contract_revision=1)


def owned(state: GroupState) -> GroupState:
    return GROUP.run(offered(state), "work_accept_offer", ACCEPT, "worker")


@pytest.mark.req("MW-10.2-05")
def test_a_new_work_item_is_at_aggregate_revision_1() -> None:
    state = authorized()
    assert state.work_items["wi"].revision == 1
    for kind in (RK.REVISION_KIND_WORK_ITEM, RK.REVISION_KIND_WORK_CONTRACT):
        command = GROUP.command(
            "work_cancel", wp.WorkCancel(work_item_id="wi", reason="x", coordinator_epoch=1), "coord", state
        )
        command.expected_revision.CopyFrom(
            common_pb2.ExpectedRevision(kind=kind, aggregate_id="wi", revision=1)
        )
        assert isinstance(decider.decide(state, command, GROUP.ctx), list)
        command.expected_revision.revision = 2
        assert rejection(decider.decide(state, command, GROUP.ctx)) == (
            "REVISION_MISMATCH",
            {"current_revision": "1"},
        )


@pytest.mark.req("MW-11.3-02")
def test_the_first_owner_holds_ownership_epoch_1() -> None:
    state = offered(authorized())
    (accepted, *_) = events(state, "work_accept_offer", ACCEPT, "worker")
    assert accepted.work_offer_accepted.ownership.ownership_epoch == 1
    assert owned(authorized()).work_items["wi"].owner.ownership_epoch == 1  # type: ignore[union-attr]


@pytest.mark.req("MW-11.4-08", "MW-11.3-03")
def test_the_first_start_is_attempt_1_with_nothing_to_resume_even_when_one_attempt_is_allowed() -> None:
    state = owned(authorized(max_attempts=1))
    (started,) = events(
        state, "work_start", wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-1"), "worker"
    )
    assert (started.work_started.lease.attempt, started.work_started.resume_from_checkpoint_id) == (1, "")
    after = GROUP.run(
        state, "work_start", wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-1"), "worker"
    )
    assert after.work_items["wi"].attempts == 1


@pytest.mark.req("MW-11.3-02")
def test_a_work_item_never_started_nor_checkpointed_loses_its_owner_at_the_start_deadline() -> None:
    state = owned(authorized())
    late = decider.DecisionContext(
        NOW + timedelta(seconds=120), IDS
    )  # builders.contract: start deadline 120 s
    start = wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-1")
    assert rejection(GROUP.decide(state, "work_start", start, "worker", late))[0] == "LEASE_EXPIRED"
