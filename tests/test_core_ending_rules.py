"""How WorkItems end, through decide/evolve: failure with Evidence and bounded automatic retries
(MW-10.2-T13, MW-11.4-08/10), cancellation (T14), open offers withdrawn with them (OP-13), and the
Mission's end reaching every unfinished WorkItem (T18)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import common_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.state import GroupState
from tests import builders
from tests.offline_core import LEASE_ID, NOW, started, with_mission, work_contract
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
)

BASE = started(with_mission())
TRANSIENT, PERMANENT = wp.WORK_FAILURE_KIND_TRANSIENT, wp.WORK_FAILURE_KIND_PERMANENT
ZERO = dict.fromkeys(
    ("financial_micros", "tokens", "tool_calls", "compute_ms", "wall_clock_ms", "side_effects"), 0
)


def recorded(producer: str, when: float) -> wp.Evidence:
    e = builders.evidence()
    e.subject.work_item_id = "wi"
    e.producer_id = producer
    e.recorded_at.CopyFrom(to_timestamp(at(when)))
    e.produced_at.CopyFrom(e.recorded_at)
    return e


def by_worker(kind: int = TRANSIENT, **kw: object) -> wp.WorkFail:
    return wp.WorkFail(
        **{  # type: ignore[arg-type]
            "work_item_id": "wi",
            "lease_id": LEASE_ID,
            "ownership_epoch": 1,
            "kind": kind,
            "evidence": [builders.evidence()],
            "reason": "upstream timeout",
            **kw,
        }
    )


def by_coordinator(kind: int = PERMANENT, **kw: object) -> wp.WorkFail:
    return wp.WorkFail(
        **{  # type: ignore[arg-type]
            "work_item_id": "wi",
            "coordinator_epoch": 1,
            "kind": kind,
            "evidence": [builders.evidence()],
            "reason": "wrong ledger",
            **kw,
        }
    )


def with_retry(**policy: object) -> GroupState:
    contract = work_contract()
    contract.retry_policy.CopyFrom(builders.with_overrides(wp.RetryPolicy(max_attempts=3), policy))
    return started(with_mission(), contract=contract)


def retry_at(state: GroupState, when: float = 10, body: wp.WorkFail | None = None) -> tuple[object, list]:
    """The revocation's retry time of a transient failure reported by the Worker, and the events."""
    _, decision = decide(state, "work_fail", body or by_worker(), at=at(when))
    got = events(decision)
    revoked = [p for t, p in got if t == "work.lease_revoked"]
    return (revoked[0].retry_not_before if revoked else None), got


# ---------------------------------------------------------------- failure (T13, MW-11.4-10)


@pytest.mark.req("MW-10.2-T13", "MW-11.4-10")
def test_the_coordinators_failure_records_its_evidence_and_revokes_the_lease() -> None:
    _, decision = decide(BASE, "work_fail", by_coordinator(), "coord", at=at(10))
    failed = wp.WorkFailed(
        work_item_id="wi",
        reported_by=wp.WORK_ACTOR_ROLE_COORDINATOR,
        kind=PERMANENT,
        evidence=[recorded("coord", 10)],
        reason="wrong ledger",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        attempts=1,
        previous_state=wp.WORK_ITEM_STATE_ACTIVE,
    )
    assert events(decision) == [("work.failed", failed)]
    item = evolve_all(BASE, decision).work_items["wi"]
    assert (item.state, item.owner, item.lease) == (wp.WORK_ITEM_STATE_FAILED, None, None)
    record = item.lease_history[LEASE_ID]
    assert (record.ended_at, record.end_kind) == (at(10), wp.LEASE_END_KIND_REVOKED)
    assert item.revision == BASE.work_items["wi"].revision + 1


@pytest.mark.req("MW-10.2-T13", "MW-11.4-10")
def test_a_permanent_failure_by_the_worker_under_its_lease_is_final_and_charges_usage_first() -> None:
    c, decision = decide(BASE, "work_fail", by_worker(PERMANENT, usage_delta=vector(tokens=4)), at=at(10))
    used = dict(ZERO, tokens=4)
    failed = wp.WorkFailed(
        work_item_id="wi",
        reported_by=wp.WORK_ACTOR_ROLE_WORKER,
        kind=PERMANENT,
        evidence=[recorded("worker", 10)],
        reason="upstream timeout",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        attempts=1,
        previous_state=wp.WORK_ITEM_STATE_ACTIVE,
    )
    assert events(decision) == [
        (USAGE, usage_event(c, vector(tokens=4), used, used)),
        ("work.failed", failed),
    ]
    assert evolve_all(BASE, decision).work_items["wi"].used == used


@pytest.mark.req("MW-10.2-T13")
@pytest.mark.parametrize(
    ("body", "field"),
    [
        (by_coordinator(evidence=[]), "body.evidence"),
        (by_coordinator(reason=""), "body.reason"),
        (by_coordinator(kind=0), "body.kind"),
        (
            by_coordinator(usage_delta=common_pb2.ResourceVector(currency="USD", financial_micros=1)),
            "body.usage_delta.currency",
        ),
    ],
)
def test_a_failure_without_evidence_reason_or_kind_is_refused(body: wp.WorkFail, field: str) -> None:
    assert invalid_field(refused(BASE, "work_fail", body, "coord", at=at(10))) == field


@pytest.mark.req("MW-10.2-T13", "MW-11.3-05")
def test_a_failure_comes_from_the_owner_under_its_lease_or_the_coordinator() -> None:
    assert (
        refused(BASE, "work_fail", by_worker(lease_id="lease-0"), at=at(10)).reason
        == R.REJECTION_REASON_LEASE_STALE
    )
    assert refused(BASE, "work_fail", by_coordinator(coordinator_epoch=2), "coord", at=at(10)).reason == (
        R.REJECTION_REASON_COORDINATOR_EPOCH_STALE
    )
    failed = run(BASE, "work_fail", by_coordinator(), "coord", at=at(10))
    assert (
        refused(failed, "work_fail", by_coordinator(), "coord", at=at(11)).reason
        == R.REJECTION_REASON_INVALID_TRANSITION
    )


# ---------------------------------------------------------------- automatic retries (MW-11.4-08)


@pytest.mark.req("MW-11.4-08")
def test_a_transient_failure_within_the_budgets_is_retried_after_a_backoff() -> None:
    _when, got = retry_at(BASE)
    revoked = wp.LeaseRevoked(
        work_item_id="wi",
        lease_kind=wp.WORK_LEASE_KIND_EXECUTION,
        lease_id=LEASE_ID,
        ownership_epoch=1,
        agent_id="worker",
        session_epoch=1,
        end_kind=wp.LEASE_END_KIND_REVOKED,
        cause=wp.LEASE_REVOCATION_CAUSE_FAILED,
        resulting_state=wp.WORK_ITEM_STATE_QUEUED,
        retry_not_before=to_timestamp(at(11)),  # the default 1 s
        revoked_token_ids=[BASE.work_items["wi"].lease.token_id],
    )
    # The failed attempt's Evidence stays in the log beside the revocation.
    assert got == [
        ("work.evidence_recorded", wp.EvidenceRecorded(work_item_id="wi", evidence=recorded("worker", 10))),
        ("work.lease_revoked", revoked),
    ]
    _, decision = decide(BASE, "work_fail", by_worker(), at=at(10))
    item = evolve_all(BASE, decision).work_items["wi"]
    assert item.state == wp.WORK_ITEM_STATE_QUEUED
    assert item.evidence == BASE.work_items["wi"].evidence  # failure Evidence is history, not review Evidence


def _second_attempt(state: GroupState) -> GroupState:
    state = run(state, "work_fail", by_worker(), at=at(10))
    start = wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-2")
    return run(state, "work_start", start, at=at(20))


@pytest.mark.req("MW-11.4-08")
def test_the_backoff_grows_by_the_multiplier_up_to_its_ceiling() -> None:
    initial = wp.RetryPolicy().initial_backoff
    initial.FromSeconds(10)
    state = with_retry(initial_backoff=initial, backoff_multiplier_milli=3000)
    assert retry_at(state)[0] == to_timestamp(at(20))  # attempt 1: the initial backoff
    second = _second_attempt(state)
    assert second.work_items["wi"].attempts == 2
    body = by_worker(lease_id="lease-2")
    assert retry_at(second, 30, body)[0] == to_timestamp(at(60))  # 10 s x 3
    ceiling = wp.RetryPolicy().max_backoff
    ceiling.FromSeconds(25)
    capped = _second_attempt(
        with_retry(initial_backoff=initial, backoff_multiplier_milli=3000, max_backoff=ceiling)
    )
    assert retry_at(capped, 30, body)[0] == to_timestamp(at(55))
    doubled = _second_attempt(with_retry(initial_backoff=initial))  # the default multiplier: 2
    assert retry_at(doubled, 30, body)[0] == to_timestamp(at(50))


@pytest.mark.req("MW-11.4-08")
def test_a_jittered_backoff_is_drawn_from_the_command_id() -> None:
    initial = wp.RetryPolicy().initial_backoff
    initial.FromSeconds(100)
    state = with_retry(initial_backoff=initial, jitter=True)
    c, decision = decide(state, "work_fail", by_worker(), at=at(10))
    fraction = int(ids.derived_id("jit", c.command_id).split("_", 1)[1], 16) / 2**104
    revoked = next(p for t, p in events(decision) if t == "work.lease_revoked")
    assert revoked.retry_not_before == to_timestamp(at(10) + timedelta(seconds=100) * fraction)
    assert revoked.retry_not_before != to_timestamp(at(110))


@pytest.mark.req("MW-11.4-08", "MW-11.4-10")
def test_spent_attempts_or_deadlines_turn_a_transient_failure_into_retries_exhausted() -> None:
    def exhausted(state: GroupState, when: float = 10) -> None:
        when_retry, got = retry_at(state, when)
        assert when_retry is None
        assert [t for t, _ in got] == ["work.failed"]
        assert got[0][1].kind == wp.WORK_FAILURE_KIND_RETRIES_EXHAUSTED
        assert got[0][1].reported_by == wp.WORK_ACTOR_ROLE_WORKER

    exhausted(with_retry(max_attempts=1))
    assert retry_at(with_retry(max_attempts=2))[0] is not None
    exhausted(with_retry(retry_deadline=to_timestamp(at(11))))  # the retry would start at the deadline
    assert retry_at(with_retry(retry_deadline=to_timestamp(at(12))))[0] == to_timestamp(at(11))
    contract = work_contract()
    contract.deadline.CopyFrom(to_timestamp(at(11)))
    exhausted(started(with_mission(), contract=contract))


# ---------------------------------------------------------------- cancellation (T14), offers (OP-13)


@pytest.mark.req("MW-10.2-T14")
def test_a_cancellation_by_the_coordinator_revokes_the_lease() -> None:
    body = wp.WorkCancel(work_item_id="wi", coordinator_epoch=1, reason="not needed")
    _, decision = decide(BASE, "work_cancel", body, "coord", at=at(10))
    cancelled = wp.WorkCancelled(
        work_item_id="wi",
        cancelled_by=wp.WORK_ACTOR_ROLE_COORDINATOR,
        reason="not needed",
        lease_id=LEASE_ID,
        previous_state=wp.WORK_ITEM_STATE_ACTIVE,
    )
    assert events(decision) == [("work.cancelled", cancelled)]
    item = evolve_all(BASE, decision).work_items["wi"]
    assert (item.state, item.owner, item.lease) == (wp.WORK_ITEM_STATE_CANCELLED, None, None)
    assert item.lease_history[LEASE_ID].end_kind == wp.LEASE_END_KIND_REVOKED
    assert invalid_field(
        refused(BASE, "work_cancel", wp.WorkCancel(work_item_id="wi", coordinator_epoch=1), "coord")
    ) == ("body.reason")
    assert refused(BASE, "work_cancel", body, "worker").reason != R.REJECTION_REASON_UNSPECIFIED
    done = evolve_all(BASE, decision)
    assert refused(done, "work_cancel", body, "coord", at=at(11)).reason == R.REJECTION_REASON_TERMINAL_STATE


def offered() -> GroupState:
    """A second WorkItem ``wo``, offered to the Worker and not yet accepted."""
    state = run(
        BASE,
        "work_authorize",
        wp.WorkAuthorize(work_item_id="wo", title="wo", contract=work_contract(), coordinator_epoch=1),
        "coord",
    )
    offer = wp.WorkOffer(
        work_item_id="wo",
        offer_id="off-wo",
        candidate_ids=["worker"],
        expires_at=to_timestamp(NOW + timedelta(minutes=5)),
        selection_criteria=[builders.selection("worker")],
        coordinator_epoch=1,
    )
    return run(state, "work_offer", offer, "coord")


WITHDRAWN = wp.WorkOffersWithdrawn(
    work_item_id="wo",
    offer_ids=["off-wo"],
    candidate_ids=["worker"],
    reason=wp.OFFER_WITHDRAWAL_REASON_WORK_ITEM_CLOSED,
)


@pytest.mark.req("MW-10.2-T13", "MW-10.2-T14", "OP-13")
def test_an_offered_work_item_that_fails_or_is_cancelled_withdraws_its_open_offers() -> None:
    state = offered()
    cancel = wp.WorkCancel(work_item_id="wo", coordinator_epoch=1, reason="not needed")
    got = events(decide(state, "work_cancel", cancel, "coord", at=at(10))[1])
    assert [t for t, _ in got] == ["work.offers_withdrawn", "work.cancelled"]
    assert got[0][1] == WITHDRAWN
    assert got[1][1] == wp.WorkCancelled(
        work_item_id="wo",
        cancelled_by=wp.WORK_ACTOR_ROLE_COORDINATOR,
        reason="not needed",
        previous_state=wp.WORK_ITEM_STATE_OFFERED,
    )
    fail = by_coordinator(work_item_id="wo")
    got = events(decide(state, "work_fail", fail, "coord", at=at(10))[1])
    assert [t for t, _ in got] == ["work.offers_withdrawn", "work.failed"]
    assert got[0][1] == WITHDRAWN
    assert (got[1][1].lease_id, got[1][1].ownership_epoch, got[1][1].attempts) == ("", 0, 0)


# ---------------------------------------------------------------- the Mission's end (T18)


@pytest.mark.req("MW-10.2-T18")
def test_a_cancelled_mission_cancels_every_unfinished_work_item() -> None:
    state = offered()
    done = run(
        state, "work_cancel", wp.WorkCancel(work_item_id="wo", coordinator_epoch=1, reason="x"), "coord"
    )
    got = events(
        decide(state, "mission_cancel", mission_pb2.MissionCancel(reason="budget cut"), "alice", at=at(10))[1]
    )
    assert got == [
        ("mission.cancelled", mission_pb2.MissionCancelled(reason="budget cut")),
        (
            "work.cancelled",
            wp.WorkCancelled(
                work_item_id="wi",
                cancelled_by=wp.WORK_ACTOR_ROLE_AUTHORITY,
                reason="Mission cancelled: budget cut",
                lease_id=LEASE_ID,
                previous_state=wp.WORK_ITEM_STATE_ACTIVE,
            ),
        ),
        ("work.offers_withdrawn", WITHDRAWN),
        (
            "work.cancelled",
            wp.WorkCancelled(
                work_item_id="wo",
                cancelled_by=wp.WORK_ACTOR_ROLE_AUTHORITY,
                reason="Mission cancelled: budget cut",
                previous_state=wp.WORK_ITEM_STATE_OFFERED,
            ),
        ),
    ]
    got = events(decide(done, "mission_cancel", mission_pb2.MissionCancel(reason="r"), "alice", at=at(10))[1])
    assert [p.work_item_id for t, p in got if t == "work.cancelled"] == [
        "wi"
    ]  # a cancelled one stays as it is


@pytest.mark.req("MW-10.2-T18")
def test_a_failed_mission_fails_every_unfinished_work_item() -> None:
    state = offered()
    body = mission_pb2.MissionTerminate(coordinator_epoch=1, reason="infeasible")
    got = events(decide(state, "mission_terminate", body, "coord", at=at(10))[1])
    common = {
        "reported_by": wp.WORK_ACTOR_ROLE_AUTHORITY,
        "kind": wp.WORK_FAILURE_KIND_MISSION_FAILED,
        "reason": "Mission failed: infeasible",
    }
    assert got == [
        ("mission.failed", mission_pb2.MissionFailed(reason="infeasible")),
        (
            "work.failed",
            wp.WorkFailed(
                work_item_id="wi",
                ownership_epoch=1,
                attempts=1,
                previous_state=wp.WORK_ITEM_STATE_ACTIVE,
                **common,
            ),
        ),  # type: ignore[arg-type]
        ("work.offers_withdrawn", WITHDRAWN),
        (
            "work.failed",
            wp.WorkFailed(work_item_id="wo", previous_state=wp.WORK_ITEM_STATE_OFFERED, **common),
        ),  # type: ignore[arg-type]
    ]
    after = run(state, "mission_terminate", body, "coord", at=at(10))
    assert {i.state for i in after.work_items.values()} == {wp.WORK_ITEM_STATE_FAILED}


@pytest.mark.req("MW-11.4-08")
@pytest.mark.parametrize("name", ["initial_backoff", "max_backoff"])
def test_a_backoff_outside_one_second_and_a_day_is_refused_when_a_retry_is_computed(name: str) -> None:
    bad = wp.RetryPolicy().initial_backoff
    bad.FromMilliseconds(500)
    rejection = refused(with_retry(**{name: bad}), "work_fail", by_worker(), at=at(10))
    assert invalid_field(rejection) == f"retry_policy.{name}"
