"""Bounded offline execution on the pure core (spec 11.5, MW-11.5-07..13): buffered progress,
checkpoints and Messages, judged against the Authority's own lease records and charged first."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.kernel.extensions import BOUNDED_OFFLINE_EXECUTION
from missionweave.v1 import common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.authentication import SUPPORTED_EXTENSIONS
from missionweave_server.services.authority.rules.work.offline import REQUIRED
from missionweave_server.services.authority.state import MAX_LEASE_HISTORY, GroupState
from tests import builders
from tests.offline_core import (
    LEASE_ID,
    LEASE_S,
    NOW,
    apply,
    binding,
    buffered,
    command,
    decide,
    over_committed,
    started,
    with_mission,
    work_contract,
)

R = common_pb2.RejectionReason
BASE = started(with_mission())
EXPIRY = NOW + timedelta(seconds=LEASE_S)
LATER = NOW + timedelta(minutes=10)  # reconnected: past the expiry and the grace deadline
IN_GRACE = EXPIRY + timedelta(seconds=30)  # buffered after the lease expired, inside the grace


def refused(
    state: GroupState, kind: str, b: wp.BoundedOfflineExecutionBinding, body: object = None
) -> Rejected:
    """Refused whole: a Rejected, no events, the state untouched (decide never writes)."""
    before = copy.deepcopy(state)
    decision = decide(state, buffered(state, kind, b, body), LATER)  # type: ignore[arg-type]
    assert isinstance(decision, Rejected), f"{kind} was accepted"
    assert state == before
    return decision


def accepted(state: GroupState, kind: str, b: wp.BoundedOfflineExecutionBinding, body: object = None) -> list:
    decision = decide(state, buffered(state, kind, b, body), LATER)  # type: ignore[arg-type]
    assert not isinstance(decision, Rejected), decision
    return decision


# ---------------------------------------------------------------- the binding (MW-11.5-07/08)


@pytest.mark.req("MW-11.5-07")
def test_the_authority_supports_the_critical_binding_and_requires_it_critical() -> None:
    assert BOUNDED_OFFLINE_EXECUTION in SUPPORTED_EXTENSIONS
    c = buffered(BASE, "work_report_progress", binding(BASE, IN_GRACE))
    c.extensions[0].critical = False
    rejection = decide(BASE, c, LATER)
    assert isinstance(rejection, Rejected)
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_BINDING_INVALID
    assert rejection.metadata["check"] == "not_critical"
    c.extensions[0].critical = True
    c.extensions.add().CopyFrom(c.extensions[0])
    rejection = decide(BASE, c, LATER)
    assert isinstance(rejection, Rejected) and rejection.metadata["check"] == "duplicate"
    del c.extensions[1]
    c.extensions[0].data = b"\xff\xff"
    rejection = decide(BASE, c, LATER)
    assert isinstance(rejection, Rejected) and rejection.metadata["check"] == "malformed"


@pytest.mark.req("MW-11.5-07")
@pytest.mark.parametrize("kind", ["work_submit", "work_renew_lease", "work_block"])
def test_only_progress_checkpoints_and_messages_are_buffered(kind: str) -> None:
    b = binding(BASE, IN_GRACE)
    body = {
        "work_submit": wp.WorkSubmit(
            work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1, contract_revision=1
        ),
        "work_renew_lease": wp.WorkRenewLease(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1),
        "work_block": wp.WorkBlock(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1),
    }[kind]
    rejection = refused(BASE, kind, b, body)
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_KIND_NOT_BUFFERABLE
    assert rejection.metadata["command_kind"] == kind.replace("_", ".", 1)


@pytest.mark.req("MW-11.5-08")
@pytest.mark.parametrize("name", REQUIRED)
def test_a_binding_missing_a_field_is_refused_naming_it(name: str) -> None:
    b = binding(BASE, IN_GRACE)
    b.ClearField(name)  # type: ignore[arg-type]
    rejection = refused(BASE, "work_report_progress", b, _progress_as_before(BASE))
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_BINDING_INVALID
    assert (rejection.metadata["field"], rejection.metadata["check"]) == (f"binding.{name}", "missing")


def _progress_as_before(state: GroupState) -> wp.WorkReportProgress:
    """The command's body as the Worker wrote it, from the complete binding."""
    from tests.offline_core import progress

    return progress(binding(state, IN_GRACE))


@pytest.mark.req("MW-11.5-08")
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("agent_id", "coord"),
        ("group_id", "grp_other"),
        ("work_item_id", "wi-other"),
        ("historical_lease_id", "lease-other"),
        ("ownership_epoch", 7),
        ("usage_delta", common_pb2.ResourceVector(currency="EUR", tokens=5)),  # altered after buffering
    ],
)
def test_a_binding_that_does_not_match_its_command_is_refused(name: str, value: object) -> None:
    b = binding(BASE, IN_GRACE, **{name: value})
    rejection = refused(BASE, "work_report_progress", b, _progress_as_before(BASE))
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_BINDING_INVALID
    assert (rejection.metadata["field"], rejection.metadata["check"]) == (f"binding.{name}", "mismatch")


@pytest.mark.req("MW-11.5-08")
def test_a_negative_or_foreign_currency_delta_is_refused() -> None:
    negative = common_pb2.ResourceVector(currency="EUR", financial_micros=-5)
    rejection = refused(BASE, "work_report_progress", binding(BASE, IN_GRACE, usage=negative))
    assert (rejection.reason, rejection.metadata["check"]) == (
        R.REJECTION_REASON_OFFLINE_BINDING_INVALID,
        "negative",
    )
    foreign = common_pb2.ResourceVector(currency="USD", financial_micros=5)
    rejection = refused(BASE, "work_report_progress", binding(BASE, IN_GRACE, usage=foreign))
    assert (rejection.metadata["field"], rejection.metadata["check"]) == (
        "binding.usage_delta.currency",
        "currency",
    )


@pytest.mark.req("MW-11.5-08")
def test_the_binding_times_are_in_order() -> None:
    b = binding(BASE, NOW + timedelta(seconds=5))  # before the disconnect (NOW + 30 s)
    assert refused(BASE, "work_report_progress", b).metadata["field"] == "binding.disconnected_at"
    b = binding(BASE, IN_GRACE, grace_deadline=to_timestamp(EXPIRY - timedelta(seconds=1)))
    assert refused(BASE, "work_report_progress", b).metadata["field"] == "binding.grace_deadline"


# ---------------------------------------------------------------- MW-11.5-10


@pytest.mark.req("MW-11.5-10")
def test_buffered_after_the_grace_deadline_is_refused_and_within_it_accepted() -> None:
    deadline = EXPIRY + timedelta(seconds=120)
    accepted(BASE, "work_report_progress", binding(BASE, deadline))
    rejection = refused(BASE, "work_report_progress", binding(BASE, deadline + timedelta(seconds=1)))
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_OUTSIDE_WINDOW
    assert (rejection.metadata["rule"], rejection.metadata["check"]) == ("window", "after_grace_deadline")


@pytest.mark.req("MW-11.5-10")
@pytest.mark.parametrize(
    ("check", "overrides", "buffered_at"),
    [
        # The Worker claims a longer grace than the contract's 120 s: checked against the record (OP-05).
        ("grace_deadline", {"grace_deadline": to_timestamp(EXPIRY + timedelta(seconds=121))}, IN_GRACE),
        (
            "before_lease_start",
            {"disconnected_at": to_timestamp(NOW - timedelta(seconds=2))},
            NOW - timedelta(seconds=1),
        ),
        (
            "disconnected_after_expiry",
            {"disconnected_at": to_timestamp(EXPIRY + timedelta(seconds=1))},
            IN_GRACE,
        ),
        ("in_future", {}, LATER + timedelta(seconds=1)),
    ],
)
def test_buffered_outside_the_historical_lease_window_is_refused(
    check: str, overrides: dict[str, object], buffered_at: object
) -> None:
    b = binding(BASE, buffered_at, **overrides)  # type: ignore[arg-type]
    if check == "in_future":
        b.grace_deadline.CopyFrom(to_timestamp(LATER + timedelta(seconds=1)))
        state = started(with_mission(), contract=work_contract(grace_s=86_000))
        b = binding(state, LATER + timedelta(seconds=1))
    else:
        state = BASE
    rejection = refused(state, "work_report_progress", b)
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_OUTSIDE_WINDOW
    assert (rejection.metadata["rule"], rejection.metadata["check"]) == ("window", check)


@pytest.mark.req("MW-11.5-10")
def test_a_zero_grace_period_allows_no_offline_continuation() -> None:
    state = started(with_mission(), contract=work_contract(grace_s=0))
    b = binding(state, NOW + timedelta(seconds=40))  # even before the expiry
    rejection = refused(state, "work_report_progress", b)
    assert (rejection.reason, rejection.metadata["check"]) == (
        R.REJECTION_REASON_OFFLINE_OUTSIDE_WINDOW,
        "no_grace_period",
    )


@pytest.mark.req("MW-11.5-10")
def test_buffered_after_the_lease_ended_is_refused() -> None:
    # The lease was released by an (online) checkpoint at NOW + 40 s; ownership stays.
    body = wp.WorkCheckpoint(
        work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1, checkpoint=wp.Checkpoint()
    )
    at = NOW + timedelta(seconds=40)
    state = apply(BASE, command(BASE, "work_checkpoint", body, "worker", at=at), at)
    assert state.work_items["wi"].lease_history[LEASE_ID].end_kind == wp.LEASE_END_KIND_RELEASED
    rejection = refused(state, "work_report_progress", binding(state, NOW + timedelta(seconds=45)))
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_AFTER_LEASE_END
    assert (rejection.metadata["rule"], rejection.metadata["end_kind"]) == (
        "lease_ended",
        "LEASE_END_KIND_RELEASED",
    )
    accepted(
        state, "work_report_progress", binding(state, NOW + timedelta(seconds=35))
    )  # buffered before it ended


@pytest.mark.req("MW-11.5-10")
def test_buffered_before_a_newer_lease_is_refused_as_stale_and_after_its_start_as_ended() -> None:
    # The new session started the work again without reconciling: MW-11.3-09 replaced the lease.
    start = wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-2")
    at = NOW + timedelta(seconds=50)
    state = apply(BASE, command(BASE, "work_start", start, "worker", session=2, at=at), at)
    rejection = refused(state, "work_report_progress", binding(state, NOW + timedelta(seconds=40)))
    assert rejection.reason == R.REJECTION_REASON_LEASE_STALE
    rejection = refused(state, "work_report_progress", binding(state, NOW + timedelta(seconds=55)))
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_AFTER_LEASE_END
    assert rejection.metadata["end_kind"] == "LEASE_END_KIND_REVOKED"


@pytest.mark.req("MW-11.5-10")
def test_buffered_after_an_ownership_change_is_refused() -> None:
    # The Coordinator re-offers the WorkItem once the owner's lease expired; the Worker accepts again.
    offer = wp.WorkOffer(
        work_item_id="wi",
        offer_id="off-2",
        candidate_ids=["worker"],
        expires_at=to_timestamp(LATER + timedelta(minutes=5)),
        selection_criteria=[builders.selection("worker")],
        coordinator_epoch=1,
    )
    at = NOW + timedelta(minutes=4)  # the ownership lease has lapsed too
    offered = apply(BASE, command(BASE, "work_offer", offer, "coord", at=at), at)
    rejection = refused(offered, "work_report_progress", binding(offered, IN_GRACE))
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_AFTER_OWNERSHIP_CHANGE
    assert (rejection.metadata["rule"], rejection.metadata["current_epoch"]) == ("ownership_changed", "0")
    accept = wp.WorkAcceptOffer(work_item_id="wi", offer_id="off-2", contract_revision=1)
    owned = apply(offered, command(offered, "work_accept_offer", accept, "worker", session=2, at=at), at)
    rejection = refused(owned, "work_report_progress", binding(owned, IN_GRACE))
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_AFTER_OWNERSHIP_CHANGE
    assert rejection.metadata["current_epoch"] == "2"


@pytest.mark.req("MW-11.5-10")
def test_buffered_messages_outside_the_work_item_conversation_are_refused() -> None:
    item = BASE.work_items["wi"]
    planning = BASE.mission.planning_conversation_id if BASE.mission else ""
    b = binding(BASE, IN_GRACE)
    events = accepted(BASE, "message_post", b, builders.message(item.conversation_id, "buffered note"))
    assert [e.WhichOneof("payload") for e in events] == ["resource_usage_recorded", "message_posted"]
    rejection = refused(BASE, "message_post", b, builders.message(planning, "elsewhere"))
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_OUTSIDE_CONVERSATION
    assert (rejection.metadata["rule"], rejection.metadata["conversation_id"]) == (
        "conversation",
        item.conversation_id,
    )
    rejection = refused(
        BASE, "message_post", binding(BASE, IN_GRACE, conversation_id=planning), builders.message(planning)
    )
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_OUTSIDE_CONVERSATION
    rejection = refused(BASE, "work_report_progress", binding(BASE, IN_GRACE, conversation_id=planning))
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_OUTSIDE_CONVERSATION


@pytest.mark.req("MW-11.5-10")
@pytest.mark.parametrize(
    ("check", "overrides"),
    [
        ("session_epoch", {"original_session_epoch": 2}),
        ("expiry", {"historical_lease_expires_at": to_timestamp(EXPIRY + timedelta(seconds=1))}),
    ],
)
def test_the_historical_lease_is_the_one_the_authority_recorded(
    check: str, overrides: dict[str, object]
) -> None:
    rejection = refused(BASE, "work_report_progress", binding(BASE, IN_GRACE, **overrides))
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_LEASE_UNKNOWN
    assert (rejection.metadata["rule"], rejection.metadata["check"]) == ("historical_lease", check)


def test_the_lease_history_is_bounded() -> None:
    state = BASE
    for n in range(2, MAX_LEASE_HISTORY + 3):  # restarts, each from a newer session
        start = wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id=f"lease-{n}")
        state = apply(state, command(state, "work_start", start, "worker", session=n), NOW)
    history = state.work_items["wi"].lease_history
    assert len(history) == MAX_LEASE_HISTORY and LEASE_ID not in history
    assert all(r.end_kind == wp.LEASE_END_KIND_REVOKED for r in list(history.values())[:-1])


# ---------------------------------------------------------------- MW-11.5-09, -11, -12


@pytest.mark.req("MW-11.5-09")
def test_a_rebased_command_from_the_new_session_is_accepted_under_the_historical_lease() -> None:
    b = binding(BASE, IN_GRACE)
    accepted(BASE, "work_report_progress", b)  # session 2; the lease was session 1's
    online = command(
        BASE,
        "work_report_progress",
        buffered(BASE, "work_report_progress", b).work_report_progress,
        "worker",
        session=2,
    )
    assert decide(BASE, online, NOW + timedelta(seconds=10)).reason == R.REJECTION_REASON_LEASE_STALE  # type: ignore[union-attr]
    stale = buffered(BASE, "work_report_progress", b)
    stale.membership_epoch -= 1  # not rebased to the current Membership epoch
    assert decide(BASE, stale, LATER).reason == R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE  # type: ignore[union-attr]


@pytest.mark.req("MW-11.5-11", "MW-11.5-12")
@pytest.mark.parametrize(
    ("kind", "applied"),
    [("work_report_progress", "work_progress_reported"), ("work_checkpoint", "work_checkpointed")],
)
def test_the_usage_event_comes_first_in_the_same_append_naming_both_sessions(kind: str, applied: str) -> None:
    usage = common_pb2.ResourceVector(currency="EUR", tokens=300, financial_micros=2_000)
    events = accepted(BASE, kind, binding(BASE, IN_GRACE, usage=usage))
    assert [e.WhichOneof("payload") for e in events] == ["resource_usage_recorded", applied]
    assert events[0].type == "ext.missionweaveprotocol.core.resource_usage_recorded"
    recorded = events[0].resource_usage_recorded
    assert recorded.source == wp.USAGE_SOURCE_OFFLINE_RECONCILIATION
    assert (recorded.lease_id, recorded.ownership_epoch) == (LEASE_ID, 1)
    assert (recorded.execution_session_epoch, recorded.reporting_session_epoch) == (1, 2)
    assert (recorded.work_item_used.tokens, recorded.mission_used.tokens) == (300, 300)
    assert recorded.delta == usage
    state = apply(BASE, buffered(BASE, kind, binding(BASE, IN_GRACE, usage=usage)), LATER)
    assert state.work_items["wi"].used["tokens"] == 300 and state.mission_used["financial_micros"] == 2_000


@pytest.mark.req("MW-11.5-12")
def test_a_zero_delta_records_no_usage_event() -> None:
    events = accepted(
        BASE, "work_report_progress", binding(BASE, IN_GRACE, usage=common_pb2.ResourceVector())
    )
    assert [e.WhichOneof("payload") for e in events] == ["work_progress_reported"]


# ---------------------------------------------------------------- MW-11.5-13


@pytest.mark.req("MW-11.5-13")
def test_an_overflow_of_the_work_items_budget_refuses_charge_and_progress() -> None:
    over = common_pb2.ResourceVector(currency="EUR", tokens=10_001)  # the contract allows 10 000
    rejection = refused(BASE, "work_checkpoint", binding(BASE, IN_GRACE, usage=over))
    assert rejection.reason == R.REJECTION_REASON_BUDGET_EXCEEDED
    assert (rejection.metadata["budget"], rejection.metadata["dimension"]) == ("work_item", "tokens")


@pytest.mark.req("MW-11.5-13")
def test_an_overflow_of_the_missions_budget_refuses_charge_and_progress() -> None:
    state = over_committed(started(with_mission()), tokens=5_000)  # the Mission allows less than the WorkItem
    over = common_pb2.ResourceVector(currency="EUR", tokens=6_000)
    rejection = refused(state, "work_report_progress", binding(state, IN_GRACE, usage=over))
    assert (rejection.reason, rejection.metadata["budget"]) == (R.REJECTION_REASON_BUDGET_EXCEEDED, "mission")


@pytest.mark.req("MW-11.5-13")
def test_an_overflow_of_an_enclosing_grant_refuses_charge_and_progress() -> None:
    state = with_mission()
    root = wp.WorkAuthorize(work_item_id="root", title="root", contract=work_contract(), coordinator_epoch=1)
    state = apply(state, command(state, "work_authorize", root, "coord"))
    caps = common_pb2.ResourceVector(currency="EUR", financial_micros=1_000_000, tokens=10_000, tool_calls=50)
    grant = membership_pb2.MembershipGrantDelegation(
        grantee_id="lead",
        target_work_item_id="root",
        caps=caps,
        max_descendant_depth=1,
        allowed_capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.11")],
        expires_at=to_timestamp(NOW + timedelta(hours=1)),
        coordinator_epoch=1,
    )
    state = apply(state, command(state, "membership_grant_delegation", grant, "coord"))
    [grant_id] = state.grants
    state = started(state, grant_id=grant_id, parent="root")
    # The Coordinator's amendment grew the WorkItem's budget past what the grant was charged.
    state.work_items["wi"].contract.budget.tokens = 20_000
    over = common_pb2.ResourceVector(currency="EUR", tokens=10_001)
    rejection = refused(state, "work_report_progress", binding(state, IN_GRACE, usage=over))
    assert rejection.reason == R.REJECTION_REASON_BUDGET_EXCEEDED
    assert (rejection.metadata["budget"], rejection.metadata["grant_id"]) == ("grant", grant_id)
    accepted(
        state,
        "work_report_progress",
        binding(state, IN_GRACE, usage=common_pb2.ResourceVector(tokens=10_000)),
    )
