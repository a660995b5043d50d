"""What every WorkItem rule shares, through decide/evolve: the WorkItem lookup, the state table's
refusals (MW-10.2-02/05), the Coordinator's authority and the MissionOwner's audited emergency
override (MW-7.1-13), delegation grants not combined with either (MW-9.1-01), and the bounds of
policy durations (1 s .. 24 h)."""

from __future__ import annotations

import copy

import pytest

from missionweave.kernel.clock import from_timestamp
from missionweave.v1 import work_pb2 as wp
from tests.offline_core import LEASE_ID, started, with_mission, work_contract
from tests.work_execution_fixtures import R, at, decide, events, invalid_field, refused

BASE = started(with_mission())
CHECKPOINT = wp.WorkCheckpoint(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1)


@pytest.mark.req("MW-10.2-05")
def test_an_unknown_work_item_is_not_found_naming_the_field() -> None:
    rejection = refused(
        BASE, "work_cancel", wp.WorkCancel(work_item_id="nope", coordinator_epoch=1, reason="r"), "coord"
    )
    assert rejection.reason == R.REJECTION_REASON_NOT_FOUND
    assert rejection.metadata["field"] == "work_item_id"


@pytest.mark.req("MW-10.2-05", "MW-10.2-02")
def test_a_transition_the_table_lacks_names_the_state_and_terminal_states_are_never_left() -> None:
    state = copy.deepcopy(BASE)
    state.work_items["wi"].state = wp.WORK_ITEM_STATE_BLOCKED
    rejection = refused(state, "work_checkpoint", CHECKPOINT, at=at(5))
    assert rejection.reason == R.REJECTION_REASON_INVALID_TRANSITION
    assert rejection.metadata["state"] == "blocked"
    assert "work.checkpoint" in rejection.message
    for terminal in (wp.WORK_ITEM_STATE_VERIFIED, wp.WORK_ITEM_STATE_CANCELLED):
        state.work_items["wi"].state = terminal
        rejection = refused(state, "work_checkpoint", CHECKPOINT, at=at(5))
        assert rejection.reason == R.REJECTION_REASON_TERMINAL_STATE
        assert "state" not in rejection.metadata


def authorize(**kw: object) -> wp.WorkAuthorize:
    return wp.WorkAuthorize(**{"work_item_id": "w2", "title": "w2", "contract": work_contract(), **kw})  # type: ignore[arg-type]


@pytest.mark.req("MW-7.1-13")
def test_the_mission_owner_steers_the_work_only_with_an_audited_emergency_override() -> None:
    body = authorize(emergency_override=True, override_reason="Coordinator unreachable")
    _, decision = decide(BASE, "work_authorize", body, "alice")
    kind, p = events(decision)[0]  # the Conversation of the WorkItem follows
    assert kind == "work.authorized" and (p.emergency_override, p.override_reason) == (
        True,
        "Coordinator unreachable",
    )
    assert refused(BASE, "work_authorize", body, "coord").reason == R.REJECTION_REASON_PERMISSION_DENIED
    assert (
        invalid_field(refused(BASE, "work_authorize", authorize(emergency_override=True), "alice"))
        == "body.override_reason"
    )
    assert refused(BASE, "work_authorize", authorize(coordinator_epoch=2), "coord").reason == (
        R.REJECTION_REASON_COORDINATOR_EPOCH_STALE
    )
    assert (
        events(decide(BASE, "work_authorize", authorize(coordinator_epoch=1), "coord")[1])[0][0]
        == "work.authorized"
    )


@pytest.mark.req("MW-9.1-01")
def test_a_delegation_grant_combines_with_neither_the_override_nor_a_coordinator_epoch() -> None:
    both = authorize(grant_id="grt_1", emergency_override=True, override_reason="r")
    assert invalid_field(refused(BASE, "work_authorize", both, "alice")) == "body.grant_id"
    epoch = authorize(grant_id="grt_1", coordinator_epoch=1)
    assert invalid_field(refused(BASE, "work_authorize", epoch, "lead")) == "body.coordinator_epoch"


@pytest.mark.req("MW-11.3-04")
def test_a_requested_duration_lies_within_one_second_and_a_day() -> None:
    def renewal(seconds: int) -> wp.WorkRenewLease:
        body = wp.WorkRenewLease(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1)
        body.requested_duration.FromSeconds(seconds)
        return body

    _, decision = decide(BASE, "work_renew_lease", renewal(1), at=at(10))
    assert from_timestamp(events(decision)[0][1].renewal.expires_at) == at(11)
    _, decision = decide(BASE, "work_renew_lease", renewal(86_400), at=at(10))
    assert from_timestamp(events(decision)[0][1].renewal.expires_at) == at(
        70
    )  # within the day, capped by policy
    rejection = refused(BASE, "work_renew_lease", renewal(86_401), at=at(10))
    assert invalid_field(rejection) == "body.requested_duration"
    assert "1 s .. 24 h" in rejection.message


@pytest.mark.req("MW-10.2-T08")
def test_the_kept_ownership_starts_by_the_default_start_deadline_when_the_contract_names_none() -> None:
    contract = work_contract()
    contract.time_policy.ClearField("start_deadline")
    _, decision = decide(started(with_mission(), contract=contract), "work_checkpoint", CHECKPOINT, at=at(5))
    assert from_timestamp(events(decision)[0][1].ownership.start_deadline) == at(5 + 600)  # ten minutes
