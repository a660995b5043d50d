"""The start gate, execution leases and cooperative preemption (spec 10.2 rows T06/T07, 11.3) through
decide and evolve: exact events, exact refusals and the state later rules read."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from google.protobuf.duration_pb2 import Duration

from missionweave.kernel import ids
from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.work.leases import token_valid
from missionweave_server.services.authority.state import SIX, ExecutionLeaseState, IdentityInfo, LeaseRecord
from tests import builders
from tests.work_rules_fixtures import (
    CTX,
    GROUP,
    IDS,
    WS,
    R,
    Role,
    accept,
    active,
    after,
    at,
    authorize,
    base,
    ctx_at,
    events,
    offer,
    queued,
    refused,
    start,
    ts,
)


def seconds(n: float) -> Duration:
    d = Duration()
    d.FromTimedelta(timedelta(seconds=n))
    return d


# ---------------------------------------------------------------- approval.grant_execution


def approval(revision: int = 1, epoch: int = 1, **overrides: object) -> wp.ApprovalGrantExecution:
    body = wp.ApprovalGrantExecution(work_item_id="wi", contract_revision=revision, ownership_epoch=epoch)
    return builders.with_overrides(body, overrides)


def gated() -> object:
    state = queued()
    state.work_items["wi"].contract.requires_execution_approval = True
    return state


@pytest.mark.req("MW-10.2-T06")
def test_an_execution_approval_appends_its_record_and_opens_the_start_gate() -> None:
    state = gated()
    r = refused(state, "work_start", start(), "worker")
    assert (
        r.message
        == "this WorkItem needs approval.grant_execution (in force, for this contract revision and owner) before it starts"
    )
    assert r.reason == R.REJECTION_REASON_PRECONDITION_FAILED
    body = approval(expires_at=ts(1), comment="go")
    out = events(state, "approval_grant_execution", body, "alice")
    assert [e.type for e in out] == ["approval.execution_granted"]
    assert out[0].execution_approval_granted == wp.ExecutionApprovalGranted(
        work_item_id="wi",
        contract_revision=1,
        ownership_epoch=1,
        approver_id="alice",
        expires_at=ts(1),
        comment="go",
    )
    approved = after(state, out)
    item = approved.work_items["wi"]
    assert (item.execution_approved, item.state) == ((1, 1, at(1)), WS.WORK_ITEM_STATE_QUEUED)
    assert item.revision == state.work_items["wi"].revision + 1  # type: ignore[attr-defined]
    assert events(approved, "work_start", start(), "worker", ctx_at(0.5))
    # The approval lapses at its expiry.
    r = refused(approved, "work_start", start(), "worker", ctx_at(1))
    assert (
        r.message
        == "this WorkItem needs approval.grant_execution (in force, for this contract revision and owner) before it starts"
    )
    assert r.reason == R.REJECTION_REASON_PRECONDITION_FAILED


@pytest.mark.req("MW-10.2-T06")
def test_an_approval_without_expiry_for_any_owner_stays_in_force() -> None:
    state = gated()
    out = events(state, "approval_grant_execution", approval(epoch=0), "alice")
    assert not out[0].execution_approval_granted.HasField("expires_at")
    approved = after(state, out)
    assert approved.work_items["wi"].execution_approved == (1, 0, None)
    assert events(approved, "work_start", start(), "worker", ctx_at(1))


@pytest.mark.req("MW-10.2-T06", "MW-10.1-05")
def test_an_approval_of_another_revision_or_owner_is_not_in_force() -> None:
    state = gated()
    approved = after(state, events(state, "approval_grant_execution", approval(), "alice"))
    for record in ((2, 1, None), (1, 2, None)):
        approved.work_items["wi"].execution_approved = record
        r = refused(approved, "work_start", start(), "worker")
        assert (
            r.message
            == "this WorkItem needs approval.grant_execution (in force, for this contract revision and owner) before it starts"
        )
        assert r.reason == R.REJECTION_REASON_PRECONDITION_FAILED


@pytest.mark.req("MW-10.2-T06", "OP-14")
def test_the_approvers_are_the_contracts_else_the_risk_policys_else_the_mission_owner() -> None:
    state = gated()
    for reviewer in ("m1", "m2"):
        state.members[reviewer].role = Role.MEMBER_ROLE_REVIEWER  # type: ignore[attr-defined]
    r = refused(state, "approval_grant_execution", approval(), "m1")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_PERMISSION_DENIED,
        "execution approval is given by alice",
    )
    policy = state.mission.definition.risk_policy  # type: ignore[attr-defined]
    policy.execution_approver_ids.append("m1")
    assert events(state, "approval_grant_execution", approval(), "m1")
    r = refused(state, "approval_grant_execution", approval(), "alice")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_PERMISSION_DENIED,
        "execution approval is given by m1",
    )
    state.work_items["wi"].contract.execution_approver_ids.append("m2")  # type: ignore[attr-defined]
    assert events(state, "approval_grant_execution", approval(), "m2")
    r = refused(state, "approval_grant_execution", approval(), "m1")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_PERMISSION_DENIED,
        "execution approval is given by m2",
    )


@pytest.mark.req("MW-10.2-T06")
@pytest.mark.parametrize(("revision", "epoch"), [(2, 1), (1, 2), (0, 1)])
def test_an_approval_names_the_current_revision_and_owner(revision: int, epoch: int) -> None:
    r = refused(gated(), "approval_grant_execution", approval(revision, epoch), "alice")
    assert (
        r.message
        == "approval names the current contract revision and the current ownership epoch (or 0 for any owner)"
    )
    assert r.reason == R.REJECTION_REASON_REVISION_MISMATCH


@pytest.mark.req("MW-10.2-T06")
def test_an_approval_of_a_work_item_without_owner_is_refused() -> None:
    state = gated()
    state.work_items["wi"].owner = None  # type: ignore[attr-defined]
    r = refused(state, "approval_grant_execution", approval(epoch=0), "alice")
    assert (
        r.message
        == "approval names the current contract revision and the current ownership epoch (or 0 for any owner)"
    )
    assert r.reason == R.REJECTION_REASON_REVISION_MISMATCH


@pytest.mark.req("MW-10.2-T06")
@pytest.mark.parametrize("minutes", [0, -1])
def test_an_approval_expiry_lies_in_the_future(minutes: float) -> None:
    r = refused(gated(), "approval_grant_execution", approval(expires_at=ts(minutes)), "alice")
    assert r.message == "body.expires_at: an approval expiry in the future, or none"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.expires_at"})


@pytest.mark.req("MW-10.2-T06", "MW-7.1-01")
def test_a_risk_class_at_or_above_the_missions_threshold_needs_approval() -> None:
    state = queued()
    policy = state.mission.definition.risk_policy  # type: ignore[union-attr]
    contract = state.work_items["wi"].contract
    policy.execution_approval_threshold = mission_pb2.RISK_CLASS_MEDIUM
    contract.risk_class = mission_pb2.RISK_CLASS_LOW
    assert events(state, "work_start", start(), "worker")
    contract.risk_class = mission_pb2.RISK_CLASS_MEDIUM
    r = refused(state, "work_start", start(), "worker")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_PRECONDITION_FAILED,
        "this WorkItem needs approval.grant_execution (in force, for this contract revision and owner) before it starts",
    )
    policy.execution_approval_threshold = 0  # no threshold: no gate
    contract.risk_class = mission_pb2.RISK_CLASS_CRITICAL
    assert events(state, "work_start", start(), "worker")


# ---------------------------------------------------------------- work.start


@pytest.mark.req("MW-10.2-T07", "MW-11.3-03", "MW-11.3-06", "MW-11.3-07")
def test_a_start_appends_the_lease_bound_to_agent_session_epoch_and_a_token_expiring_with_it() -> None:
    state = queued()
    state.work_items["wi"].used["tokens"] = 400
    c = GROUP.command("work_start", start(), "worker", state)
    out = decider.decide(state, c, CTX)
    assert not isinstance(out, Rejected)
    assert [e.type for e in out] == ["work.started"]
    limit = common_pb2.ResourceVector(currency="EUR", financial_micros=1_000_000, tokens=9_600, tool_calls=50)
    assert out[0].work_started == wp.WorkStarted(
        work_item_id="wi",
        lease=wp.ExecutionLease(
            lease_id="lease-1",
            agent_id="worker",
            session_epoch=1,
            work_item_id="wi",
            ownership_epoch=1,
            started_at=ts(0),
            expires_at=ts(1),
            attempt=1,
        ),
        token=wp.CapabilityToken(
            token_id=ids.derived_id("tok", "grp_w", c.command_id),
            lease_id="lease-1",
            agent_id="worker",
            work_item_id="wi",
            ownership_epoch=1,
            scope=wp.ExecutionPermissions(),
            limit=limit,
            issued_at=ts(0),
            expires_at=ts(1),
            issuer_id="group-authority",
        ),
    )
    assert out[0].work_started.HasField("token") and out[0].work_started.token.HasField("scope")
    item = after(state, list(out)).work_items["wi"]
    token = out[0].work_started.token
    assert item.lease == ExecutionLeaseState(
        "lease-1",
        "worker",
        1,
        1,
        at(0),
        at(1),
        token_id=token.token_id,
        token_scope=wp.ExecutionPermissions(),
    )
    assert item.lease_history == {"lease-1": LeaseRecord("lease-1", "worker", 1, 1, at(0), at(1))}
    assert (item.state, item.attempts) == (WS.WORK_ITEM_STATE_ACTIVE, 1)
    assert item.attempt_used == dict.fromkeys(SIX, 0)
    assert item.owner is not None and item.owner.expires_at == at(2)  # the later of ownership and lease
    assert item.revision == state.work_items["wi"].revision + 1


@pytest.mark.req("MW-11.3-03")
def test_ownership_lives_as_long_as_a_longer_execution_lease() -> None:
    state = queued()
    state.work_items["wi"].contract.time_policy.execution_lease_duration.CopyFrom(seconds(600))
    item = after(state, events(state, "work_start", start(), "worker")).work_items["wi"]
    assert item.owner is not None and item.owner.expires_at == at(10)


@pytest.mark.req("MW-11.3-03")
def test_a_start_without_a_lease_id_gets_one_derived_and_resumes_the_last_checkpoint() -> None:
    state = queued()
    state.work_items["wi"].last_checkpoint_id = "ck-3"
    c = GROUP.command("work_start", start(lease_id=""), "worker", state)
    out = decider.decide(state, c, CTX)
    assert not isinstance(out, Rejected)
    assert out[0].work_started.lease.lease_id == ids.derived_id("lease", "grp_w", c.command_id)
    assert out[0].work_started.resume_from_checkpoint_id == "ck-3"
    named = events(state, "work_start", start(resume_from_checkpoint_id="ck-1"), "worker")
    assert named[0].work_started.resume_from_checkpoint_id == "ck-1"


@pytest.mark.req("MW-11.3-05")
@pytest.mark.parametrize("lease_id", ["bad id", "old"])
def test_a_lease_id_is_valid_and_new_for_the_work_item(lease_id: str) -> None:
    state = queued()
    state.work_items["wi"].lease_history["old"] = LeaseRecord("old", "worker", 1, 1, at(-9), at(-8))
    r = refused(state, "work_start", start(lease_id=lease_id), "worker")
    assert r.message == "body.lease_id: a valid lease id not used before for this WorkItem"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.lease_id"})


@pytest.mark.req("MW-10.2-T07")
def test_only_the_owner_starts_at_its_current_epoch() -> None:
    state = queued()
    r = refused(state, "work_start", start(), "w2")
    assert (r.reason, r.message) == (R.REJECTION_REASON_PERMISSION_DENIED, "w2 does not own wi")
    r = refused(state, "work_start", start(epoch=2), "worker")
    assert r.message == "ownership epoch 1 is current"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE, {"current_epoch": "1"})
    state.work_items["wi"].owner = None
    r = refused(state, "work_start", start(), "worker")
    assert (r.reason, r.message) == (R.REJECTION_REASON_PERMISSION_DENIED, "worker does not own wi")


@pytest.mark.req("MW-10.2-T07", "MW-7.1-06")
def test_no_start_in_a_terminal_mission() -> None:
    state = queued()
    state.mission.state = mission_pb2.MISSION_STATE_CANCELLED  # type: ignore[union-attr]
    r = refused(state, "work_start", start(), "worker")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_TERMINAL_STATE,
        "work.start: the Mission is MISSION_STATE_CANCELLED, a terminal state; corrections go through a linked follow-up Mission (MW-7.1-08)",
    )


@pytest.mark.req("MW-10.2-T07", "MW-11.3-02")
def test_no_start_after_the_start_deadline_unless_resuming_from_a_checkpoint() -> None:
    state = queued()
    owner = state.work_items["wi"].owner
    assert owner is not None
    owner.expires_at = at(5)
    assert events(state, "work_start", start(), "worker", ctx_at(1.99))
    r = refused(state, "work_start", start(), "worker", ctx_at(2))
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_LEASE_EXPIRED,
        "the ownership lease (start deadline) has passed; the Coordinator re-offers",
    )
    state.work_items["wi"].last_checkpoint_id = "ck"
    assert events(state, "work_start", start(), "worker", ctx_at(2))
    r = refused(state, "work_start", start(), "worker", ctx_at(5))
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_LEASE_EXPIRED,
        "the ownership lease (start deadline) has passed; the Coordinator re-offers",
    )


@pytest.mark.req("MW-10.4-03")
def test_no_start_before_the_dependencies_are_satisfied() -> None:
    state = GROUP.run(queued(), "work_authorize", authorize("dep"), "coord")
    state.work_items["wi"].depends_on = ("dep",)
    r = refused(state, "work_start", start(), "worker")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_PRECONDITION_FAILED,
        "work.start: the dependencies of wi do not satisfy its dependency policy yet (MW-10.4-03)",
    )


@pytest.mark.req("MW-11.4-08")
def test_a_retry_waits_out_its_backoff() -> None:
    state = queued()
    state.work_items["wi"].retry_not_before = at(1)
    r = refused(state, "work_start", start(), "worker", ctx_at(0.5))
    assert r.message == "backing off after a transient failure until 2026-06-01T12:01:00+00:00 (MW-11.4-08)"
    assert r.reason == R.REJECTION_REASON_PRECONDITION_FAILED
    assert r.metadata == {"retry_not_before": at(1).isoformat()}
    assert events(state, "work_start", start(), "worker", ctx_at(1))


@pytest.mark.req("MW-11.4-08")
def test_no_start_beyond_the_retry_policys_attempts() -> None:
    state = queued()
    state.work_items["wi"].attempts = 2
    assert events(state, "work_start", start(), "worker")[0].work_started.lease.attempt == 3
    state.work_items["wi"].attempts = 3
    r = refused(state, "work_start", start(), "worker")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_PRECONDITION_FAILED,
        "3 attempts used of 3 (MW-11.4-08); fail the WorkItem",
    )


@pytest.mark.req("MW-11.3-03", "MW-11.3-07")
@pytest.mark.parametrize(
    ("policy", "requested", "limit", "expected"),
    [(60, 30, 0, 30), (60, 90, 0, 60), (60, 0, 0, 60), (0, 0, 0, 300), (0, 400, 0, 300), (60, 0, 20, 20)],
)
def test_the_lease_length_is_the_request_capped_by_policy_and_attempt_limit(
    policy: int, requested: int, limit: int, expected: int
) -> None:
    state = queued()
    time_policy = state.work_items["wi"].contract.time_policy
    time_policy.execution_lease_duration.CopyFrom(seconds(policy))
    time_policy.attempt_time_limit.CopyFrom(seconds(limit))
    out = events(state, "work_start", start(requested_duration=seconds(requested)), "worker")
    lease = out[0].work_started.lease
    assert lease.expires_at == ts(expected / 60)
    assert out[0].work_started.token.expires_at == lease.expires_at


@pytest.mark.req("MW-11.3-03")
def test_a_lease_length_outside_one_second_to_a_day_is_refused() -> None:
    state = queued()
    r = refused(state, "work_start", start(requested_duration=seconds(0.5)), "worker")
    assert r.message == "body.requested_duration: must lie within 1 s .. 24 h"
    assert r.metadata == {"field": "body.requested_duration"}
    state.work_items["wi"].contract.time_policy.execution_lease_duration.CopyFrom(seconds(0.5))
    r = refused(state, "work_start", start(), "worker")
    assert r.message == "time_policy.execution_lease_duration: must lie within 1 s .. 24 h"
    assert r.metadata == {"field": "time_policy.execution_lease_duration"}


@pytest.mark.req("MW-11.3-06")
def test_a_token_scope_only_narrows_the_contracts_permissions() -> None:
    state = queued()
    permissions = state.work_items["wi"].contract.permissions
    permissions.allowed_tools.extend(["git", "pytest"])
    permissions.allowed_egress_hosts.append("pypi.example")
    full = events(state, "work_start", start(), "worker")[0].work_started.token.scope
    assert full == permissions
    narrow = wp.ExecutionPermissions(allowed_tools=["git"])
    assert (
        events(state, "work_start", start(requested_scope=narrow), "worker")[0].work_started.token.scope
        == narrow
    )
    for field in ("allowed_tools", "allowed_data", "allowed_operations", "allowed_egress_hosts"):
        wider = wp.ExecutionPermissions(**{field: ["other"]})
        r = refused(state, "work_start", start(requested_scope=wider), "worker")
        assert (r.reason, r.metadata) == (
            R.REJECTION_REASON_INVALID_ARGUMENT,
            {"field": f"body.requested_scope.{field}"},
        )
        assert (
            r.message
            == f"body.requested_scope.{field}: other exceed the permitted scope; a token only narrows"
        )


@pytest.mark.req("MW-11.3-06")
def test_the_token_limit_is_what_the_budget_has_left_never_below_zero() -> None:
    state = queued()
    state.work_items["wi"].used.update(tokens=20_000, tool_calls=10)
    limit = events(state, "work_start", start(), "worker")[0].work_started.token.limit
    assert limit == common_pb2.ResourceVector(
        currency="EUR", financial_micros=1_000_000, tokens=0, tool_calls=40
    )


# ---------------------------------------------------------------- replaced sessions (MW-11.3-09)


def _session_two() -> decider.DecisionContext:
    return decider.DecisionContext(
        at(0), {**IDS, "worker": IdentityInfo("worker", IDS["worker"].kind, session_epoch=2)}
    )


@pytest.mark.req("MW-11.3-09")
def test_a_start_from_a_replacement_session_revokes_the_old_lease_first_and_keeps_ownership() -> None:
    state = active()
    token_id = state.work_items["wi"].lease.token_id  # type: ignore[union-attr]
    c = GROUP.command("work_start", start("lease-2"), "worker", state)
    c.session_epoch = 2
    out = decider.decide(state, c, _session_two())
    assert not isinstance(out, Rejected)
    assert [e.type for e in out] == ["work.lease_revoked", "work.started"]
    assert out[0].lease_revoked == wp.LeaseRevoked(
        work_item_id="wi",
        lease_kind=wp.WORK_LEASE_KIND_EXECUTION,
        lease_id="lease-1",
        ownership_epoch=1,
        agent_id="worker",
        session_epoch=1,
        end_kind=wp.LEASE_END_KIND_REVOKED,
        cause=wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED,
        resulting_state=WS.WORK_ITEM_STATE_QUEUED,
        revoked_token_ids=[token_id],
    )
    assert (out[1].work_started.lease.session_epoch, out[1].work_started.lease.attempt) == (2, 2)
    revoked = after(state, [out[0]]).work_items["wi"]
    assert (revoked.state, revoked.lease) == (WS.WORK_ITEM_STATE_QUEUED, None)
    assert revoked.owner is not None and revoked.owner.agent_id == "worker"
    assert revoked.lease_history["lease-1"].end_kind == wp.LEASE_END_KIND_REVOKED
    item = after(state, list(out)).work_items["wi"]
    assert (item.state, item.lease.lease_id if item.lease else "") == (WS.WORK_ITEM_STATE_ACTIVE, "lease-2")


@pytest.mark.req("MW-11.3-09")
def test_the_authority_revokes_only_leases_of_older_sessions_of_that_agent() -> None:
    state = active()
    assert decider.decide_session_replaced(state, "worker", 1, at(0)) == []
    assert decider.decide_session_replaced(state, "w2", 2, at(0)) == []
    out = decider.decide_session_replaced(state, "worker", 2, at(0))
    assert [(e.type, e.lease_revoked.cause, e.lease_revoked.resulting_state) for e in out] == [
        ("work.lease_revoked", wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED, WS.WORK_ITEM_STATE_QUEUED)
    ]
    item = after(state, out).work_items["wi"]
    assert item.state == WS.WORK_ITEM_STATE_QUEUED and item.owner is not None
    queued_state = queued()  # no lease: nothing to revoke
    assert decider.decide_session_replaced(queued_state, "worker", 2, at(0)) == []
    assert decider.decide_session_replaced(None, "worker", 2, at(0)) == []


@pytest.mark.req("MW-11.3-08")
def test_a_revocation_that_does_not_keep_ownership_clears_the_owner() -> None:
    state = active()
    out = decider.decide_session_replaced(state, "worker", 2, at(0))
    for cause, resulting in (
        (wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED, WS.WORK_ITEM_STATE_ACTIVE),
        (wp.LEASE_REVOCATION_CAUSE_EXPIRY_FENCED, WS.WORK_ITEM_STATE_QUEUED),
    ):
        event = copy.deepcopy(out[0])
        event.lease_revoked.cause, event.lease_revoked.resulting_state = cause, resulting
        item = after(state, [event]).work_items["wi"]
        assert (item.owner, item.lease, item.state) == (None, None, WS.WORK_ITEM_STATE_ACTIVE)


@pytest.mark.req("MW-11.4-08", "MW-11.3-08")
def test_a_retried_failure_keeps_ownership_and_opens_a_start_window_after_its_backoff() -> None:
    state = active()
    event = copy.deepcopy(decider.decide_session_replaced(state, "worker", 2, at(0))[0])
    event.lease_revoked.cause = wp.LEASE_REVOCATION_CAUSE_FAILED
    event.lease_revoked.end_kind = 0  # unset: a revocation
    event.lease_revoked.retry_not_before.CopyFrom(ts(30))
    item = after(state, [event]).work_items["wi"]
    assert (item.state, item.retry_not_before) == (WS.WORK_ITEM_STATE_QUEUED, at(30))
    assert item.owner is not None and item.owner.expires_at == at(32)  # backoff + start_deadline 120 s
    assert item.lease_history["lease-1"].end_kind == wp.LEASE_END_KIND_REVOKED
    state.work_items["wi"].contract.time_policy.ClearField("start_deadline")
    item = after(state, [event]).work_items["wi"]
    assert item.owner is not None and item.owner.expires_at == at(40)  # the default 10 min window


@pytest.mark.req("OP-18", "MW-11.3-08")
def test_a_token_is_valid_while_its_lease_lives() -> None:
    state = active()
    token_id = state.work_items["wi"].lease.token_id  # type: ignore[union-attr]
    assert token_valid(state, token_id, at(0.99))
    assert not token_valid(state, token_id, at(1))
    assert not token_valid(state, "tok_unknown", at(0))
    released = after(state, decider.decide_session_replaced(state, "worker", 2, at(0)))
    assert not token_valid(released, token_id, at(0))


# ---------------------------------------------------------------- the current lease (MW-11.3-04/05)


def renew(lease_id: str = "lease-1", epoch: int = 1) -> wp.WorkRenewLease:
    return wp.WorkRenewLease(work_item_id="wi", lease_id=lease_id, ownership_epoch=epoch)


@pytest.mark.req("MW-11.3-04", "MW-11.3-05")
def test_commands_under_a_lease_cite_the_owner_its_epoch_and_the_current_lease() -> None:
    state = active()
    assert events(state, "work_renew_lease", renew(), "worker", ctx_at(0.5))
    r = refused(state, "work_renew_lease", renew(epoch=2), "worker")
    assert r.message == "ownership epoch 2 is not the current 1"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE, {"current_epoch": "1"})
    r = refused(state, "work_renew_lease", renew(), "w2")
    assert (r.reason, r.message) == (R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE, "w2 does not own WorkItem wi")
    r = refused(state, "work_renew_lease", renew(epoch=0), "w2")
    assert (r.reason, r.message) == (R.REJECTION_REASON_PERMISSION_DENIED, "w2 does not own WorkItem wi")
    r = refused(state, "work_renew_lease", renew("lease-0"), "worker")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_LEASE_STALE,
        "lease 'lease-0' is not the current execution lease of wi (MW-11.3-05)",
    )
    r = refused(state, "work_renew_lease", renew(), "worker", ctx_at(1))
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_LEASE_EXPIRED,
        "lease lease-1 expired at 2026-06-01T12:01:00+00:00",
    )
    state.work_items["wi"].lease.session_epoch = 2  # type: ignore[union-attr]
    r = refused(state, "work_renew_lease", renew(), "worker")
    assert (r.reason, r.message) == (R.REJECTION_REASON_LEASE_STALE, "lease lease-1 belongs to session 2")
    state.work_items["wi"].lease = None
    r = refused(state, "work_renew_lease", renew(), "worker")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_LEASE_STALE,
        "lease 'lease-1' is not the current execution lease of wi (MW-11.3-05)",
    )
    state.work_items["wi"].owner = None
    r = refused(state, "work_renew_lease", renew(), "worker")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE,
        "worker does not own WorkItem wi",
    )


@pytest.mark.req("MW-11.3-06")
def test_a_renewed_token_replaces_the_old_one_and_narrows_within_its_scope() -> None:
    state = queued()
    state.work_items["wi"].contract.permissions.allowed_tools.extend(["git", "pytest"])
    state = GROUP.run(
        state, "work_start", start(requested_scope=wp.ExecutionPermissions(allowed_tools=["git"])), "worker"
    )
    old = state.work_items["wi"].lease.token_id  # type: ignore[union-attr]
    body = renew()
    body.requested_scope.allowed_tools.append("pytest")
    r = refused(state, "work_renew_lease", body, "worker")
    assert (
        r.message
        == "body.requested_scope.allowed_tools: pytest exceed the permitted scope; a token only narrows"
    )
    assert r.metadata == {"field": "body.requested_scope.allowed_tools"}
    token = events(state, "work_renew_lease", renew(), "worker")[0].work_lease_renewed.token
    assert (token.replaces_token_id, list(token.scope.allowed_tools)) == (old, ["git"])


# ---------------------------------------------------------------- work.request_preemption


def preempt(**overrides: object) -> wp.WorkRequestPreemption:
    body = wp.WorkRequestPreemption(
        work_item_id="wi",
        preemption_request_id="pre-1",
        lease_id="lease-1",
        ownership_epoch=1,
        reason=wp.PREEMPTION_REASON_PRIORITY,
        coordinator_epoch=1,
    )
    return builders.with_overrides(body, overrides)


@pytest.mark.req("MW-11.3-11", "MW-11.3-12")
def test_a_coordinator_preemption_request_interrupts_nothing_and_is_recorded() -> None:
    state = active()
    body = preempt(checkpoint_by=ts(0.5))
    out = events(state, "work_request_preemption", body, "coord")
    assert [e.type for e in out] == ["work.preemption_requested"]
    assert out[0].work_preemption_requested == wp.WorkPreemptionRequested(
        work_item_id="wi",
        preemption_request_id="pre-1",
        lease_id="lease-1",
        reason=wp.PREEMPTION_REASON_PRIORITY,
        checkpoint_by=ts(0.5),
        requested_by="coord",
    )
    item = after(state, out).work_items["wi"]
    assert (item.preemption_request_id, item.state) == ("pre-1", WS.WORK_ITEM_STATE_ACTIVE)
    assert item.lease is not None and item.lease.lease_id == "lease-1"
    assert item.revision == state.work_items["wi"].revision + 1


@pytest.mark.req("MW-11.3-12")
def test_a_preemption_request_without_an_id_or_checkpoint_time_gets_a_derived_id() -> None:
    state = active()
    c = GROUP.command("work_request_preemption", preempt(preemption_request_id=""), "coord", state)
    out = decider.decide(state, c, CTX)
    assert not isinstance(out, Rejected)
    p = out[0].work_preemption_requested
    assert p.preemption_request_id == ids.derived_id("pre", "grp_w", c.command_id)
    assert not p.HasField("checkpoint_by")


@pytest.mark.req("MW-11.3-12", "MW-11.3-04")
def test_the_owner_records_its_own_schedulers_request_under_its_current_lease() -> None:
    state = active()
    out = events(state, "work_request_preemption", preempt(coordinator_epoch=0), "worker")
    assert out[0].work_preemption_requested.requested_by == "worker"
    r = refused(state, "work_request_preemption", preempt(coordinator_epoch=0, lease_id="old"), "worker")
    assert r.message == "lease 'old' is not the current execution lease of wi (MW-11.3-05)"
    assert r.reason == R.REJECTION_REASON_LEASE_STALE
    r = refused(state, "work_request_preemption", preempt(coordinator_epoch=0), "worker", ctx_at(1))
    assert r.message == "lease lease-1 expired at 2026-06-01T12:01:00+00:00"
    assert r.reason == R.REJECTION_REASON_LEASE_EXPIRED
    queued_state = queued()
    r = refused(queued_state, "work_request_preemption", preempt(coordinator_epoch=0), "worker")
    assert r.message == "work.request_preemption is not allowed from queued (MW-10.2-05)"
    assert r.reason == R.REJECTION_REASON_INVALID_TRANSITION


@pytest.mark.req("MW-11.3-12")
def test_anyone_else_needs_the_coordinator_epoch() -> None:
    state = active()
    r = refused(state, "work_request_preemption", preempt(coordinator_epoch=0), "w2")
    assert r.message == "work.request_preemption is issued by the current Coordinator"
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED
    r = refused(state, "work_request_preemption", preempt(), "w2")
    assert r.message == "work.request_preemption is issued by the current Coordinator"
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED


@pytest.mark.req("MW-11.3-12")
def test_a_coordinator_preempts_only_active_work_under_its_current_lease() -> None:
    state = active()
    r = refused(queued(), "work_request_preemption", preempt(), "coord")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_INVALID_TRANSITION,
        "work.request_preemption is not allowed from queued (MW-10.2-05)",
    )
    r = refused(state, "work_request_preemption", preempt(lease_id="old"), "coord")
    assert (r.reason, r.message) == (R.REJECTION_REASON_LEASE_STALE, "the current lease of wi is lease-1")
    r = refused(state, "work_request_preemption", preempt(ownership_epoch=2), "coord")
    assert (r.reason, r.message) == (R.REJECTION_REASON_LEASE_STALE, "the current lease of wi is lease-1")
    r = refused(state, "work_request_preemption", preempt(reason=wp.PREEMPTION_REASON_UNSPECIFIED), "coord")
    assert r.message == "body.reason: a preemption reason is required"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.reason"})


# ---------------------------------------------------------------- refusals name the command (MW-10.2-05)


@pytest.mark.req("MW-10.2-05")
@pytest.mark.parametrize(
    ("kind", "body", "actor", "name", "state_value"),
    [
        ("work_offer", offer(offer_id="off-2"), "coord", "work.offer", WS.WORK_ITEM_STATE_SUBMITTED),
        ("work_accept_offer", accept(), "worker", "work.accept_offer", WS.WORK_ITEM_STATE_QUEUED),
        (
            "approval_grant_execution",
            approval(),
            "alice",
            "approval.grant_execution",
            WS.WORK_ITEM_STATE_ACTIVE,
        ),
        ("work_start", start(), "worker", "work.start", WS.WORK_ITEM_STATE_ACTIVE),
        ("work_request_preemption", preempt(), "coord", "work.request_preemption", WS.WORK_ITEM_STATE_QUEUED),
        (
            "work_request_preemption",
            preempt(coordinator_epoch=0),
            "worker",
            "work.request_preemption",
            WS.WORK_ITEM_STATE_QUEUED,
        ),
    ],
)
def test_a_transition_the_table_does_not_allow_names_the_command_and_the_state(
    kind: str, body: object, actor: str, name: str, state_value: int
) -> None:
    state = queued()
    item = state.work_items["wi"]
    item.offers["off-1"].open = True
    item.state = state_value
    if kind == "work_start":
        item.lease = ExecutionLeaseState("lease-0", "worker", 1, 1, at(0), at(1))
    r = refused(state, kind, body, actor)
    label = wp.WorkItemState.Name(state_value).removeprefix("WORK_ITEM_STATE_").lower()  # type: ignore[arg-type]
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_TRANSITION, {"state": label})
    assert r.message == f"{name} is not allowed from {label} (MW-10.2-05)"


@pytest.mark.req("MW-10.4-03")
@pytest.mark.parametrize(
    ("kind", "body", "actor", "name"),
    [
        ("work_start", start(), "worker", "work.start"),
        ("work_offer", offer(offer_id="off-2"), "coord", "work.offer"),
        ("work_accept_offer", accept(), "worker", "work.accept_offer"),
    ],
)
def test_a_dependency_refusal_names_the_command(kind: str, body: object, actor: str, name: str) -> None:
    state = GROUP.run(queued(), "work_authorize", authorize("dep"), "coord")
    item = state.work_items["wi"]
    item.depends_on = ("dep",)
    if kind == "work_accept_offer":
        item.state, item.owner = WS.WORK_ITEM_STATE_OFFERED, None
        item.offers["off-1"].open = True
    elif kind == "work_offer":
        item.owner = None
    r = refused(state, kind, body, actor)
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_PRECONDITION_FAILED,
        f"{name}: the dependencies of wi do not satisfy its dependency policy yet (MW-10.4-03)",
    )


@pytest.mark.req("MW-7.1-06")
@pytest.mark.parametrize(
    ("kind", "body", "actor", "name"),
    [
        ("work_offer", offer(offer_id="off-2"), "coord", "work.offer"),
        ("work_start", start(), "worker", "work.start"),
    ],
)
def test_a_terminal_mission_refusal_names_the_command(kind: str, body: object, actor: str, name: str) -> None:
    state = queued()
    state.work_items["wi"].owner = None if kind == "work_offer" else state.work_items["wi"].owner
    state.mission.state = mission_pb2.MISSION_STATE_CANCELLED  # type: ignore[union-attr]
    r = refused(state, kind, body, actor)
    assert r.reason == R.REJECTION_REASON_TERMINAL_STATE
    assert r.message.startswith(f"{name}: the Mission is ")


@pytest.mark.req("MW-7.2-03")
def test_only_the_coordinator_offers() -> None:
    r = refused(base(), "work_offer", offer(), "worker")
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED


@pytest.mark.req("MW-11.3-06", "OP-18")
def test_a_renewed_token_limit_counts_the_usage_the_renewal_reports() -> None:
    state = active()
    state.work_items["wi"].used["tokens"] = 1_000
    body = renew()
    body.usage_delta.CopyFrom(common_pb2.ResourceVector(currency="EUR", tokens=500, tool_calls=2))
    token = events(state, "work_renew_lease", body, "worker")[0].work_lease_renewed.token
    assert token.limit == common_pb2.ResourceVector(
        currency="EUR", financial_micros=1_000_000, tokens=8_500, tool_calls=48
    )


@pytest.mark.req("MW-11.3-08", "OP-11")
def test_fencing_an_expired_blocked_owner_revokes_its_blocked_lease() -> None:
    state = queued()
    state.work_items["wi"].state = WS.WORK_ITEM_STATE_BLOCKED
    out = events(state, "work_offer", offer("w2", offer_id="off-2", minutes=10), "coord", ctx_at(3))
    assert out[0].lease_revoked == wp.LeaseRevoked(
        work_item_id="wi",
        lease_kind=wp.WORK_LEASE_KIND_BLOCKED,
        ownership_epoch=1,
        agent_id="worker",
        end_kind=wp.LEASE_END_KIND_EXPIRED,
        cause=wp.LEASE_REVOCATION_CAUSE_EXPIRY_FENCED,
        resulting_state=WS.WORK_ITEM_STATE_BLOCKED,
    )


@pytest.mark.req("MW-11.3-08")
def test_a_lease_without_a_token_revokes_no_token() -> None:
    state = active()
    state.work_items["wi"].lease.token_id = ""  # type: ignore[union-attr]
    out = decider.decide_session_replaced(state, "worker", 2, at(0))
    assert list(out[0].lease_revoked.revoked_token_ids) == []


@pytest.mark.req("MW-11.3-09")
def test_only_a_running_lease_is_revoked_for_a_replaced_session() -> None:
    state = active()
    state.work_items["wi"].state = WS.WORK_ITEM_STATE_BLOCKED
    assert decider.decide_session_replaced(state, "worker", 2, at(0)) == []


@pytest.mark.req("MW-11.3-12")
def test_a_work_item_without_owner_takes_preemption_requests_only_from_the_coordinator() -> None:
    state = queued()
    state.work_items["wi"].owner = None
    r = refused(state, "work_request_preemption", preempt(coordinator_epoch=0), "worker")
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED


@pytest.mark.req("MW-11.3-03")
def test_an_active_work_item_without_an_owner_record_is_an_invariant_break_not_a_refusal() -> None:
    """Active work always has its owner and lease (T07): a state without the owner is a bug, and the
    preemption rule stops on it instead of answering as if the lease were merely stale."""
    state = active()
    state.work_items["wi"].owner = None
    with pytest.raises(AssertionError):
        GROUP.decide(state, "work_request_preemption", preempt(lease_id="other"), "coord")
