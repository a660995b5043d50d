"""Under the execution lease, through decide/evolve: renewal with its rotated capability token
(MW-11.3-04/06/07), checkpoint (T08), block (T09), unblock (T10) and structured progress
(MW-11.4-01/02), each with its exact events and the state later rules read."""

from __future__ import annotations

import copy

import pytest

from missionweave.kernel import ids
from missionweave.kernel.clock import from_timestamp, to_timestamp
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.state import ChildLink
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
    report,
    run,
    usage_event,
    vector,
)

BASE = started(with_mission())
ZERO = dict.fromkeys(
    ("financial_micros", "tokens", "tool_calls", "compute_ms", "wall_clock_ms", "side_effects"), 0
)


def base(contract: wp.WorkContract | None = None) -> object:
    return BASE if contract is None else started(with_mission(), contract=contract)


def renew(**kw: object) -> wp.WorkRenewLease:
    return wp.WorkRenewLease(**{"work_item_id": "wi", "lease_id": LEASE_ID, "ownership_epoch": 1, **kw})  # type: ignore[arg-type]


def checkpoint(**kw: object) -> wp.WorkCheckpoint:
    return wp.WorkCheckpoint(**{"work_item_id": "wi", "lease_id": LEASE_ID, "ownership_epoch": 1, **kw})  # type: ignore[arg-type]


BLOCKER = wp.Blocker(blocker_id="b1", kind=wp.BLOCKER_KIND_DEPENDENCY, required_resolution="ledger B access")


def block(**kw: object) -> wp.WorkBlock:
    kw.setdefault("checkpoint", wp.Checkpoint(checkpoint_id="ck-1"))
    kw.setdefault("blockers", [BLOCKER])
    return wp.WorkBlock(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1, **kw)  # type: ignore[arg-type]


def ownership(kind: int, granted: float, expires: float) -> wp.OwnershipGrant:
    """The ownership the owner keeps (start deadline: the contract's 120 s from the grant)."""
    return wp.OwnershipGrant(
        work_item_id="wi",
        agent_id="worker",
        ownership_epoch=1,
        granted_at=to_timestamp(at(granted)),
        start_deadline=to_timestamp(at(granted + 120)),
        lease_kind=kind,  # type: ignore[arg-type]
        expires_at=to_timestamp(at(expires)),
        offer_id="off-wi",
        contract_revision=1,
    )


# ---------------------------------------------------------------- renewal (MW-11.3-04/06/07)


@pytest.mark.req("MW-11.3-04", "MW-11.3-06", "MW-11.3-07", "MW-11.5-12")
def test_a_renewal_extends_the_lease_rotates_the_token_and_records_usage() -> None:
    item = BASE.work_items["wi"]
    c, decision = decide(BASE, "work_renew_lease", renew(usage_delta=vector(tokens=100)), at=at(30))
    token = wp.CapabilityToken(
        token_id=ids.derived_id("tok", c.group_id, c.command_id),
        lease_id=LEASE_ID,
        agent_id="worker",
        work_item_id="wi",
        ownership_epoch=1,
        scope=wp.ExecutionPermissions(),
        limit=vector(
            financial_micros=1_000_000, tokens=9_900, tool_calls=50
        ),  # the budget left after this usage
        issued_at=to_timestamp(at(30)),
        expires_at=to_timestamp(at(90)),
        replaces_token_id=item.lease.token_id,
        issuer_id="group-authority",
    )
    renewed = wp.WorkLeaseRenewed(
        work_item_id="wi",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        renewal=wp.LeaseRenewal(
            renewed_at=to_timestamp(at(30)),
            previous_expires_at=to_timestamp(at(60)),
            expires_at=to_timestamp(at(90)),
            session_epoch=1,
            command_id=c.command_id,
        ),
        token=token,
    )
    used = dict(ZERO, tokens=100)
    assert events(decision) == [
        ("work.lease_renewed", renewed),
        (USAGE, usage_event(c, vector(tokens=100), used, used)),
    ]
    after = evolve_all(BASE, decision)
    lease = after.work_items["wi"].lease
    assert (lease.expires_at, lease.renewals, lease.token_id) == (at(90), 1, token.token_id)
    assert after.work_items["wi"].lease_history[LEASE_ID].expires_at == at(90)
    assert after.work_items["wi"].used == used and after.mission_used == used
    assert after.work_items["wi"].revision == item.revision + 2  # the renewal and the usage
    assert after.last_work_change_sequence == decision[-1].sequence


@pytest.mark.req("MW-11.3-04")
def test_a_renewal_never_lengthens_the_lease_beyond_the_policy_and_may_shorten_it() -> None:
    def expiry(body: wp.WorkRenewLease, when: float, state: object = BASE) -> object:
        _, decision = decide(state, "work_renew_lease", body, at=at(when))  # type: ignore[arg-type]
        return from_timestamp(events(decision)[0][1].renewal.expires_at)

    requested = renew()
    requested.requested_duration.FromSeconds(20)
    assert expiry(requested, 10) == at(30)
    requested.requested_duration.FromSeconds(600)
    assert expiry(requested, 10) == at(70)  # the contract's 60 s
    assert expiry(renew(), 10) == at(70)
    default = work_contract()
    default.time_policy.ClearField("execution_lease_duration")
    assert expiry(renew(), 10, base(default)) == at(310)  # the default five minutes
    requested.requested_duration.FromNanoseconds(500_000_000)
    assert invalid_field(refused(BASE, "work_renew_lease", requested, at=at(10))) == "body.requested_duration"


@pytest.mark.req("MW-11.3-04")
def test_a_renewal_ends_the_lease_by_the_attempt_time_limit() -> None:
    contract = work_contract()
    contract.time_policy.attempt_time_limit.FromSeconds(90)
    _, decision = decide(base(contract), "work_renew_lease", renew(), at=at(50))
    assert from_timestamp(events(decision)[0][1].renewal.expires_at) == at(90)


@pytest.mark.req("MW-11.3-06")
def test_a_renewed_token_only_narrows_the_current_scope() -> None:
    contract = work_contract()
    contract.permissions.allowed_tools.extend(["sql", "http"])
    state = base(contract)
    narrowed = renew(requested_scope=wp.ExecutionPermissions(allowed_tools=["sql"]))
    _c, decision = decide(state, "work_renew_lease", narrowed, at=at(10))
    assert events(decision)[0][1].token.scope == wp.ExecutionPermissions(allowed_tools=["sql"])
    after = evolve_all(state, decision)
    assert after.work_items["wi"].lease.token_scope == wp.ExecutionPermissions(allowed_tools=["sql"])
    # The next renewal is bound by the narrowed token, not the contract.
    wider = renew(requested_scope=wp.ExecutionPermissions(allowed_tools=["http"]))
    assert (
        invalid_field(refused(after, "work_renew_lease", wider, at=at(20)))
        == "body.requested_scope.allowed_tools"
    )
    _, decision = decide(after, "work_renew_lease", renew(), at=at(20))
    assert events(decision)[0][1].token.scope == wp.ExecutionPermissions(allowed_tools=["sql"])
    _, decision = decide(state, "work_renew_lease", renew(), at=at(20))
    assert events(decision)[0][1].token.scope == contract.permissions


@pytest.mark.req("MW-11.3-04")
def test_renewals_carry_the_ownership_lease_along_and_count() -> None:
    after = run(BASE, "work_renew_lease", renew(), at=at(50))
    assert after.work_items["wi"].owner.expires_at == at(120)  # its own expiry was later
    after = run(after, "work_renew_lease", renew(), at=at(100))
    item = after.work_items["wi"]
    assert (item.lease.expires_at, item.owner.expires_at, item.lease.renewals) == (at(160), at(160), 2)
    assert events(decide(after, "work_renew_lease", renew(), at=at(110))[1])[0][
        1
    ].renewal.previous_expires_at == (to_timestamp(at(160)))


@pytest.mark.req("MW-11.3-05")
def test_a_renewal_citing_another_lease_or_after_expiry_is_refused() -> None:
    assert (
        refused(BASE, "work_renew_lease", renew(lease_id="lease-0"), at=at(10)).reason
        == R.REJECTION_REASON_LEASE_STALE
    )
    assert refused(BASE, "work_renew_lease", renew(), at=at(60)).reason == R.REJECTION_REASON_LEASE_EXPIRED


# ---------------------------------------------------------------- checkpoint (T08)


@pytest.mark.req("MW-10.2-T08")
def test_a_checkpoint_releases_execution_and_keeps_a_bounded_ownership_lease() -> None:
    given = wp.Checkpoint(completed_operation_ids=["op-1"])
    c, decision = decide(
        BASE, "work_checkpoint", checkpoint(checkpoint=given, usage_delta=vector(tool_calls=2)), at=at(10)
    )
    recorded = wp.Checkpoint(
        completed_operation_ids=["op-1"], checkpoint_id=ids.derived_id("ckpt", c.group_id, c.command_id)
    )
    used = dict(ZERO, tool_calls=2)
    assert events(decision) == [
        (
            "work.checkpointed",
            wp.WorkCheckpointed(
                work_item_id="wi",
                lease_id=LEASE_ID,
                ownership_epoch=1,
                checkpoint=recorded,
                ownership=ownership(wp.WORK_LEASE_KIND_OWNERSHIP, 10, 10 + 30 * 60),  # the default 30 min
            ),
        ),
        (USAGE, usage_event(c, vector(tool_calls=2), used, used)),
    ]
    after = evolve_all(BASE, decision)
    item = after.work_items["wi"]
    assert item.state == wp.WORK_ITEM_STATE_QUEUED
    assert item.lease is None
    assert item.last_checkpoint_id == recorded.checkpoint_id
    assert (item.owner.agent_id, item.owner.ownership_epoch, item.owner.offer_id) == ("worker", 1, "off-wi")
    assert (item.owner.start_deadline, item.owner.expires_at) == (at(130), at(10 + 30 * 60))
    record = item.lease_history[LEASE_ID]
    assert (record.ended_at, record.end_kind) == (at(10), wp.LEASE_END_KIND_RELEASED)
    assert item.blockers == ()


@pytest.mark.req("MW-10.2-T08")
def test_a_checkpoint_keeps_ownership_for_the_contracts_duration_and_its_own_id() -> None:
    contract = work_contract()
    contract.time_policy.checkpoint_ownership_duration.FromSeconds(600)
    _, decision = decide(
        base(contract),
        "work_checkpoint",
        checkpoint(checkpoint=wp.Checkpoint(checkpoint_id="ck-7")),
        at=at(5),
    )
    [(kind, p)] = events(decision)  # no usage: none was reported
    assert kind == "work.checkpointed"
    assert p.checkpoint.checkpoint_id == "ck-7"
    assert p.ownership == ownership(wp.WORK_LEASE_KIND_OWNERSHIP, 5, 605)
    bad = checkpoint(checkpoint=wp.Checkpoint(checkpoint_id="not an id!"))
    assert invalid_field(refused(BASE, "work_checkpoint", bad, at=at(5))) == "body.checkpoint.checkpoint_id"


@pytest.mark.req("MW-10.2-T08")
def test_a_checkpoint_answering_a_preemption_request_names_it_and_clears_it() -> None:
    state = copy.deepcopy(BASE)
    state.work_items["wi"].preemption_request_id = "pre-1"
    unknown = checkpoint(preemption_request_id="pre-2")
    assert refused(state, "work_checkpoint", unknown, at=at(5)).reason == R.REJECTION_REASON_NOT_FOUND
    _, decision = decide(state, "work_checkpoint", checkpoint(preemption_request_id="pre-1"), at=at(5))
    assert events(decision)[0][1].preemption_request_id == "pre-1"
    assert evolve_all(state, decision).work_items["wi"].preemption_request_id == ""
    after = run(state, "work_checkpoint", checkpoint(), at=at(5))  # any checkpoint answers it
    assert after.work_items["wi"].preemption_request_id == ""


@pytest.mark.req("MW-10.2-T08", "MW-11.3-05")
def test_a_checkpoint_outside_the_lease_or_state_is_refused() -> None:
    assert (
        refused(BASE, "work_checkpoint", checkpoint(lease_id="lease-x"), at=at(5)).reason
        == R.REJECTION_REASON_LEASE_STALE
    )
    queued = run(BASE, "work_checkpoint", checkpoint(), at=at(5))
    assert (
        refused(queued, "work_checkpoint", checkpoint(), at=at(6)).reason
        == R.REJECTION_REASON_INVALID_TRANSITION
    )


# ---------------------------------------------------------------- block (T09) and unblock (T10)


@pytest.mark.req("MW-10.2-T09", "MW-11.4-04", "MW-11.4-05")
def test_a_block_checkpoints_states_the_resolution_and_keeps_a_blocked_lease() -> None:
    c, decision = decide(BASE, "work_block", block(usage_delta=vector(tokens=7)), at=at(10))
    used = dict(ZERO, tokens=7)
    assert events(decision) == [
        (
            "work.blocked",
            wp.WorkBlocked(
                work_item_id="wi",
                lease_id=LEASE_ID,
                ownership_epoch=1,
                checkpoint=wp.Checkpoint(checkpoint_id="ck-1"),
                blockers=[BLOCKER],
                ownership=ownership(wp.WORK_LEASE_KIND_BLOCKED, 10, 10 + 3600),  # default 1 h
            ),
        ),
        (USAGE, usage_event(c, vector(tokens=7), used, used)),
    ]
    item = evolve_all(BASE, decision).work_items["wi"]
    assert item.state == wp.WORK_ITEM_STATE_BLOCKED
    assert item.blockers == ("ledger B access",)
    assert item.lease is None and item.last_checkpoint_id == "ck-1"
    assert item.owner.expires_at == at(3610)
    assert item.lease_history[LEASE_ID].end_kind == wp.LEASE_END_KIND_RELEASED


@pytest.mark.req("MW-11.4-05")
def test_the_blocked_lease_is_bounded_by_the_contract_and_may_be_shorter() -> None:
    contract = work_contract()
    contract.time_policy.blocked_lease_duration.FromSeconds(1200)
    state = base(contract)

    def kept(body: wp.WorkBlock, s: object = state) -> object:
        _, decision = decide(s, "work_block", body, at=at(10))  # type: ignore[arg-type]
        return from_timestamp(events(decision)[0][1].ownership.expires_at)

    longer, shorter = block(), block()
    longer.requested_blocked_duration.FromSeconds(7200)
    shorter.requested_blocked_duration.FromSeconds(300)
    assert (kept(block()), kept(longer), kept(shorter)) == (at(1210), at(1210), at(310))
    assert kept(longer, BASE) == at(3610)


@pytest.mark.req("MW-11.4-04", "MW-10.2-T09")
@pytest.mark.parametrize(
    ("body", "field"),
    [
        (block(blockers=[]), "body.blockers"),
        (block(blockers=[wp.Blocker(blocker_id="b", required_resolution="x")]), "body.blockers[0]"),
        (
            block(blockers=[BLOCKER, wp.Blocker(blocker_id="b", kind=wp.BLOCKER_KIND_DEPENDENCY)]),
            "body.blockers[1]",
        ),
        (
            wp.WorkBlock(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1, blockers=[BLOCKER]),
            "body.checkpoint",
        ),
    ],
)
def test_a_block_without_its_resolution_or_checkpoint_is_refused(body: wp.WorkBlock, field: str) -> None:
    assert invalid_field(refused(BASE, "work_block", body, at=at(10))) == field


_held = block()
_held.requested_blocked_duration.FromSeconds(200)  # ends before the Coordinator's lease (5 min)
BLOCKED = run(BASE, "work_block", _held, at=at(10))


def unblock(**kw: object) -> wp.WorkUnblock:
    kw.setdefault("resolution", "access granted")
    return wp.WorkUnblock(work_item_id="wi", coordinator_epoch=1, **kw)  # type: ignore[arg-type]


@pytest.mark.req("MW-10.2-T10", "MW-11.4-07")
def test_unblocked_work_returns_to_the_queue_while_its_owner_holds_it() -> None:
    body = unblock(resolved_blocker_ids=["b1"])
    _, decision = decide(BLOCKED, "work_unblock", body, "coord", at=at(20))
    expected = wp.WorkUnblocked(
        work_item_id="wi",
        next_state=wp.WORK_ITEM_STATE_QUEUED,
        resolution="access granted",
        resolved_blocker_ids=["b1"],
    )
    assert events(decision) == [("work.unblocked", expected)]
    item = evolve_all(BLOCKED, decision).work_items["wi"]
    assert (item.state, item.blockers, item.owner.agent_id) == (wp.WORK_ITEM_STATE_QUEUED, (), "worker")


@pytest.mark.req("MW-10.2-T10")
def test_unblocked_work_is_open_again_once_its_ownership_has_expired() -> None:
    _, decision = decide(BLOCKED, "work_unblock", unblock(), "coord", at=at(210))  # the blocked lease's end
    assert events(decision)[0][1].next_state == wp.WORK_ITEM_STATE_OPEN
    item = evolve_all(BLOCKED, decision).work_items["wi"]
    assert (item.state, item.owner, item.blockers) == (wp.WORK_ITEM_STATE_OPEN, None, ())
    _, decision = decide(BLOCKED, "work_unblock", unblock(), "coord", at=at(209))
    assert events(decision)[0][1].next_state == wp.WORK_ITEM_STATE_QUEUED


@pytest.mark.req("MW-10.2-T10", "MW-10.2-T16")
def test_unblock_needs_the_coordinator_a_resolution_and_no_running_child() -> None:
    assert (
        invalid_field(refused(BLOCKED, "work_unblock", unblock(resolution=""), "coord", at=at(20)))
        == "body.resolution"
    )
    assert (
        refused(BLOCKED, "work_unblock", unblock(), "worker", at=at(20)).reason
        != R.REJECTION_REASON_UNSPECIFIED
    )
    assert (
        refused(BASE, "work_unblock", unblock(), "coord", at=at(20)).reason
        == R.REJECTION_REASON_INVALID_TRANSITION
    )
    state = copy.deepcopy(BLOCKED)
    state.work_items["wi"].children.append(
        ChildLink("child-1", "grp_child", dict.fromkeys(ZERO, 0), mandatory=False)
    )
    rejection = refused(state, "work_unblock", unblock(), "coord", at=at(20))
    assert rejection.reason == R.REJECTION_REASON_PRECONDITION_FAILED
    assert rejection.metadata["child_mission_id"] == "child-1"


# ---------------------------------------------------------------- progress (MW-11.4-01/02)


def progress(**kw: object) -> wp.WorkReportProgress:
    kw.setdefault("report", report())
    return wp.WorkReportProgress(**{"work_item_id": "wi", "lease_id": LEASE_ID, "ownership_epoch": 1, **kw})  # type: ignore[arg-type]


@pytest.mark.req("MW-11.4-01", "MW-11.5-12")
def test_progress_under_the_lease_is_recorded_with_its_usage() -> None:
    c, decision = decide(BASE, "work_report_progress", progress(usage_delta=vector(tokens=5)), at=at(10))
    used = dict(ZERO, tokens=5)
    assert events(decision) == [
        (
            "work.progress_reported",
            wp.WorkProgressReported(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1, report=report()),
        ),
        (USAGE, usage_event(c, vector(tokens=5), used, used)),
    ]
    assert not events(decision)[0][1].HasField("schedule")
    after = evolve_all(BASE, decision)
    assert after.work_items["wi"].revision == BASE.work_items["wi"].revision + 2
    assert after.last_work_change_sequence == decision[-1].sequence
    assert after.work_items["wi"].state == wp.WORK_ITEM_STATE_ACTIVE


@pytest.mark.req("MW-11.4-01", "MW-11.2-01")
def test_the_owner_of_queued_or_blocked_work_reports_without_a_lease() -> None:
    schedule = wp.ScheduleDisclosure()
    body = progress(lease_id="", schedule=schedule)
    for state in (BLOCKED, run(BASE, "work_checkpoint", checkpoint(), at=at(5))):
        _, decision = decide(state, "work_report_progress", body, at=at(30))
        [(kind, p)] = events(decision)
        assert kind == "work.progress_reported"
        assert p == wp.WorkProgressReported(
            work_item_id="wi", ownership_epoch=1, report=report(), schedule=schedule
        )
        assert p.HasField("schedule")
        assert evolve_all(state, decision).work_items["wi"].revision == state.work_items["wi"].revision + 1
    assert invalid_field(refused(BLOCKED, "work_report_progress", progress(), at=at(30))) == "body.lease_id"
    assert refused(BLOCKED, "work_report_progress", progress(lease_id=""), "coord", at=at(30)).reason == (
        R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE  # not the owner at the cited epoch
    )
    assert refused(BLOCKED, "work_report_progress", progress(lease_id=""), at=at(210)).reason == (
        R.REJECTION_REASON_LEASE_EXPIRED
    )
    c, decision = decide(
        BLOCKED, "work_report_progress", progress(lease_id="", usage_delta=vector(tokens=3)), at=at(30)
    )
    used = dict(ZERO, tokens=3)
    assert events(decision)[1] == (
        USAGE,
        usage_event(c, vector(tokens=3), used, used, lease_id="", session=0),
    )
    over = progress(lease_id="", usage_delta=vector(tokens=10_001))
    assert (
        refused(BLOCKED, "work_report_progress", over, at=at(30)).reason == R.REJECTION_REASON_BUDGET_EXCEEDED
    )


@pytest.mark.req("MW-11.4-01")
@pytest.mark.parametrize(
    ("given", "field"),
    [
        (report(phase=""), "body.report"),
        (report(next_checkpoint=None), "body.report"),
        (report(revised_estimate=None), "body.report"),
        (report(blockers=[wp.Blocker(blocker_id="b", required_resolution="x")]), "body.report.blockers[0]"),
        (
            report(blockers=[BLOCKER, wp.Blocker(blocker_id="b", kind=wp.BLOCKER_KIND_DEPENDENCY)]),
            "body.report.blockers[1]",
        ),
        (
            report(revised_estimate=wp.RevisedEstimate(reason="x" * 1025)),
            "body.report.revised_estimate.reason",
        ),
    ],
)
def test_a_progress_report_lacking_its_structure_is_refused(given: wp.ProgressReport, field: str) -> None:
    assert invalid_field(refused(BASE, "work_report_progress", progress(report=given), at=at(10))) == field


@pytest.mark.req("MW-11.4-01")
def test_a_progress_report_with_blockers_and_the_longest_estimate_reason_is_accepted() -> None:
    given = report(blockers=[BLOCKER], revised_estimate=wp.RevisedEstimate(reason="x" * 1024))
    _, decision = decide(BASE, "work_report_progress", progress(report=given), at=at(10))
    assert events(decision)[0][1].report == given
    assert (
        refused(BASE, "work_report_progress", progress(), at=at(60)).reason
        == R.REJECTION_REASON_LEASE_EXPIRED
    )


@pytest.mark.req("MW-11.4-01", "MW-10.2-05")
def test_progress_names_what_it_lacks_and_is_refused_outside_the_states_that_report() -> None:
    rejection = refused(BASE, "work_report_progress", progress(report=report(phase="")), at=at(10))
    assert all(part in rejection.message for part in ("phase", "next_checkpoint", "revised_estimate"))
    submitted = copy.deepcopy(BASE)
    submitted.work_items["wi"].state = wp.WORK_ITEM_STATE_SUBMITTED
    rejection = refused(submitted, "work_report_progress", progress(), at=at(10))
    assert rejection.reason == R.REJECTION_REASON_INVALID_TRANSITION
    assert rejection.message.startswith("work.report_progress is not allowed from submitted")
