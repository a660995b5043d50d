"""Delegated work authority (spec 9.1), on the pure core: grants by the current Coordinator, each
field recorded, and every use checked against the grant and the state now."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.common import OrganizationPolicy
from missionweave_server.services.authority.rules.delegation import remaining
from missionweave_server.services.authority.state import CoordinatorLeaseState, GroupState, IdentityInfo
from tests import builders
from tests.core_group import CoreGroup

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
AGENT, HUMAN = common_pb2.IDENTITY_KIND_AGENT, common_pb2.IDENTITY_KIND_HUMAN
IDS = {
    name: IdentityInfo(name, HUMAN if name == "alice" else AGENT, session_epoch=1)
    for name in ("alice", "coord", "worker", "lead", "lead2", "coord2")
}
CTX = decider.DecisionContext(NOW, IDS)
R = common_pb2.RejectionReason
Role = membership_pb2.MemberRole
WS = wp.WorkItemState
_n = iter(range(1, 10**6))


GROUP = CoreGroup("grp_d", CTX, NOW)
command, decide, run, refused = GROUP.command, GROUP.decide, GROUP.run, GROUP.refused


def caps(**dims: int) -> common_pb2.ResourceVector:
    base = {"currency": "EUR", "financial_micros": 3_000_000, "tokens": 30_000, "tool_calls": 150}
    return common_pb2.ResourceVector(**{**base, **dims})  # type: ignore[arg-type]


def contract(*capabilities: tuple[str, str], **budget: int) -> wp.WorkContract:
    c = builders.contract(NOW)
    c.required_capabilities.extend(
        membership_pb2.Capability(capability_id=i, version=v) for i, v in capabilities
    )
    for dim, value in budget.items():
        setattr(c.budget, dim, value)
    return c


def authorize(
    work_item_id: str, parent: str = "", grant_id: str = "", c: wp.WorkContract | None = None
) -> wp.WorkAuthorize:
    return wp.WorkAuthorize(
        work_item_id=work_item_id,
        title=work_item_id,
        contract=c or contract(("code.python", "3.12")),
        parent_work_item_id=parent,
        coordinator_epoch=0 if grant_id else 1,
        grant_id=grant_id,
    )


def offer(work_item_id: str, grant_id: str, candidate: str = "worker", offer_id: str = "") -> wp.WorkOffer:
    return wp.WorkOffer(
        work_item_id=work_item_id,
        offer_id=offer_id or f"off-{work_item_id}-{next(_n)}",
        candidate_ids=[candidate],
        expires_at=to_timestamp(NOW + timedelta(minutes=5)),
        selection_criteria=[builders.selection(candidate)],
        grant_id=grant_id,
        coordinator_epoch=0 if grant_id else 1,
    )


def grant_body(**overrides: object) -> membership_pb2.MembershipGrantDelegation:
    body = membership_pb2.MembershipGrantDelegation(
        grantee_id="lead",
        target_work_item_id="root",
        allowed_capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.11")],
        caps=caps(),
        max_descendant_depth=2,
        expires_at=to_timestamp(NOW + timedelta(hours=1)),
        coordinator_epoch=1,
    )
    return builders.with_overrides(body, overrides)


def base() -> GroupState:
    state = run(None, "mission_create", builders.mission_create("alice", "coord", NOW), "alice")
    for member, role in (
        ("worker", Role.MEMBER_ROLE_WORKER),
        ("lead", Role.MEMBER_ROLE_WORK_DELEGATE),
        ("lead2", Role.MEMBER_ROLE_WORK_DELEGATE),
    ):
        state = run(
            state, "membership_grant", membership_pb2.MembershipGrant(member_id=member, role=role), "alice"
        )
    state = run(state, "work_authorize", authorize("root"), "coord")
    state = run(state, "work_authorize", authorize("child", parent="root"), "coord")
    return run(state, "work_authorize", authorize("elsewhere"), "coord")


BASE = base()


def granted(state: GroupState = BASE, **overrides: object) -> tuple[GroupState, str]:
    after = run(state, "membership_grant_delegation", grant_body(**overrides), "coord")
    [grant_id] = set(after.grants) - set(state.grants)
    return after, grant_id


# ---------------------------------------------------------------- granting


@pytest.mark.req("MW-9.1-04", "MW-9.1-05", "MW-9.1-06", "MW-9.1-07")
def test_the_current_coordinator_grants_and_every_field_is_recorded() -> None:
    events = decide(BASE, "membership_grant_delegation", grant_body(), "coord")
    assert not isinstance(events, Rejected)
    [event] = events
    assert event.type == "membership.delegation.granted"
    g = event.delegation_granted.grant
    assert g.grant_id.startswith("grant_") and g.grantee_id == "lead"
    assert (g.mission_id, g.group_id, g.target_work_item_id) == (BASE.mission.mission_id, "grp_d", "root")  # type: ignore[union-attr]
    assert [(c.capability_id, c.version) for c in g.allowed_capabilities] == [("code.python", "3.11")]
    assert g.caps == caps() and g.max_descendant_depth == 2
    assert g.grantee_membership_epoch == BASE.members["lead"].membership_epoch and g.coordinator_epoch == 1
    assert g.issuer_id == "coord" and g.granted_at == to_timestamp(NOW)
    assert g.expires_at == to_timestamp(NOW + timedelta(hours=1))


@pytest.mark.req("MW-9.1-04")
def test_only_the_current_coordinator_grants() -> None:
    assert (
        refused(BASE, "membership_grant_delegation", grant_body(), "alice").reason
        == R.REJECTION_REASON_PERMISSION_DENIED
    )
    assert (
        refused(BASE, "membership_grant_delegation", grant_body(), "lead").reason
        == R.REJECTION_REASON_PERMISSION_DENIED
    )
    stale = refused(BASE, "membership_grant_delegation", grant_body(coordinator_epoch=7), "coord")
    assert stale.reason == R.REJECTION_REASON_COORDINATOR_EPOCH_STALE


def finished(state_value: int, state: GroupState = BASE, item: str = "root") -> GroupState:
    state = copy.deepcopy(state)
    state.work_items[item].state = state_value
    return state


BAD_GRANTS = {
    "no grantee": (grant_body(grantee_id=""), R.REJECTION_REASON_INVALID_ARGUMENT),
    "grantee not a work_delegate": (grant_body(grantee_id="worker"), R.REJECTION_REASON_PRECONDITION_FAILED),
    "grantee not a member": (grant_body(grantee_id="coord2"), R.REJECTION_REASON_PRECONDITION_FAILED),
    "no such target": (grant_body(target_work_item_id="nope"), R.REJECTION_REASON_NOT_FOUND),
    "no capabilities": (grant_body(allowed_capabilities=[]), R.REJECTION_REASON_INVALID_ARGUMENT),
    "capability without version": (
        grant_body(allowed_capabilities=[membership_pb2.Capability(capability_id="code.python")]),
        R.REJECTION_REASON_INVALID_ARGUMENT,
    ),
    "no caps": (grant_body(caps=None), R.REJECTION_REASON_INVALID_ARGUMENT),
    "no currency": (grant_body(caps=caps(currency="")), R.REJECTION_REASON_INVALID_ARGUMENT),
    "another currency": (grant_body(caps=caps(currency="USD")), R.REJECTION_REASON_INVALID_ARGUMENT),
    "a cap beyond the Mission's budget": (
        grant_body(caps=caps(tokens=2**63)),
        R.REJECTION_REASON_BUDGET_EXCEEDED,
    ),
    "depth over the Organization's limit": (
        grant_body(max_descendant_depth=4),
        R.REJECTION_REASON_PERMISSION_DENIED,
    ),
    "no expiry": (grant_body(expires_at=None), R.REJECTION_REASON_INVALID_ARGUMENT),
    "expiry in the past": (
        grant_body(expires_at=to_timestamp(NOW - timedelta(seconds=1))),
        R.REJECTION_REASON_INVALID_ARGUMENT,
    ),
    "expiry after the deadline": (
        grant_body(expires_at=to_timestamp(NOW + timedelta(days=365))),
        R.REJECTION_REASON_INVALID_ARGUMENT,
    ),
}


@pytest.mark.req("MW-9.1-05")
@pytest.mark.parametrize("case", sorted(BAD_GRANTS))
def test_a_grant_missing_a_field_or_unbounded_is_refused(case: str) -> None:
    body, reason = BAD_GRANTS[case]
    rejection = refused(BASE, "membership_grant_delegation", body, "coord")
    assert R.Name(rejection.reason) == R.Name(reason), rejection.message


@pytest.mark.parametrize(
    "state_value", [WS.WORK_ITEM_STATE_FAILED, WS.WORK_ITEM_STATE_CANCELLED, WS.WORK_ITEM_STATE_VERIFIED]
)
def test_a_grant_is_not_rooted_at_a_finished_target(state_value: int) -> None:
    rejection = refused(finished(state_value), "membership_grant_delegation", grant_body(), "coord")
    assert rejection.reason == R.REJECTION_REASON_TERMINAL_STATE


# ---------------------------------------------------------------- using a grant


def check_of(rejection: Rejected) -> tuple[str, str]:
    return R.Name(rejection.reason).removeprefix("REJECTION_REASON_"), rejection.metadata.get("check", "")


@pytest.mark.req("MW-9.1-03", "MW-9.1-09", "MW-9.1-02")
def test_the_grantee_authorizes_new_descendants_linked_into_the_subtree() -> None:
    state, g = granted()
    state = run(state, "work_authorize", authorize("sub", parent="child", grant_id=g), "lead")
    assert state.work_items["sub"].parent_work_item_id == "child"
    assert check_of(refused(state, "work_authorize", authorize("loose", grant_id=g), "lead")) == (
        "OUTSIDE_GRANT",
        "scope",
    )
    outside = authorize("stray", parent="elsewhere", grant_id=g)
    assert check_of(refused(state, "work_authorize", outside, "lead")) == ("OUTSIDE_GRANT", "scope")
    # The role alone confers nothing (MW-9.1-02), and a grant id must name a persisted grant (MW-9.1-03).
    assert (
        refused(state, "work_authorize", authorize("x", parent="root"), "lead2").reason
        == R.REJECTION_REASON_PERMISSION_DENIED
    )
    assert (
        refused(state, "work_authorize", authorize("x", parent="root", grant_id="grant_nope"), "lead").reason
        == R.REJECTION_REASON_NOT_FOUND
    )


@pytest.mark.req("MW-9.1-12")
def test_descendant_depth_is_within_the_grant_and_the_organization_policy() -> None:
    state, g = granted(max_descendant_depth=2)
    state = run(state, "work_authorize", authorize("d2", parent="child", grant_id=g), "lead")  # depth 2
    deeper = authorize("d3", parent="d2", grant_id=g)
    assert check_of(refused(state, "work_authorize", deeper, "lead")) == ("OUTSIDE_GRANT", "depth")
    # The Organization lowered its limit since: the stricter one holds.
    strict = decider.DecisionContext(NOW, IDS, policy=OrganizationPolicy(max_delegation_depth=1))
    assert check_of(
        refused(state, "work_authorize", authorize("d2b", parent="child", grant_id=g), "lead", strict)
    ) == (
        "OUTSIDE_GRANT",
        "depth_policy",
    )


@pytest.mark.req("MW-9.1-12", "MW-9.1-08")
def test_an_existing_descendant_deeper_than_the_grant_reaches_is_not_offered_under_it() -> None:
    """D122: the Coordinator may have planned deeper than the grant's maximum; such an item is in
    the subtree but beyond the grant, so a delegated offer of it is refused like a delegated
    authorize at that depth would be."""
    state = run(
        BASE, "work_authorize", authorize("deep", parent="child"), "coord"
    )  # depth 2, by the Coordinator
    state, g = granted(state, max_descendant_depth=1)
    state = run(state, "work_offer", offer("child", g), "lead")  # depth 1: within the grant
    deep = refused(state, "work_offer", offer("deep", g), "lead")
    assert check_of(deep) == ("OUTSIDE_GRANT", "depth") and deep.metadata["depth"] == "2"
    strict = decider.DecisionContext(NOW, IDS, policy=OrganizationPolicy(max_delegation_depth=0))
    assert check_of(refused(state, "work_offer", offer("child", g), "lead", strict)) == (
        "OUTSIDE_GRANT",
        "depth_policy",
    )


@pytest.mark.req("MW-9.1-10")
def test_every_required_capability_is_allowed_at_the_minimum_version() -> None:
    state, g = granted()
    below = authorize("old", parent="root", grant_id=g, c=contract(("code.python", "3.10")))
    assert check_of(refused(state, "work_authorize", below, "lead")) == ("OUTSIDE_GRANT", "capability")
    other = authorize(
        "sql", parent="root", grant_id=g, c=contract(("code.python", "3.12"), ("db.sql", "1.0"))
    )
    assert check_of(refused(state, "work_authorize", other, "lead")) == ("OUTSIDE_GRANT", "capability")
    run(
        state,
        "work_authorize",
        authorize("newer", parent="root", grant_id=g, c=contract(("code.python", "3.11.4"))),
        "lead",
    )


@pytest.mark.req("MW-9.1-11")
def test_the_cumulative_budget_under_a_grant_fits_every_cap() -> None:
    state, g = granted(caps=caps(tokens=25_000))
    state = run(
        state, "work_authorize", authorize("a", parent="root", grant_id=g, c=contract(tokens=10_000)), "lead"
    )
    state = run(
        state, "work_authorize", authorize("b", parent="root", grant_id=g, c=contract(tokens=10_000)), "lead"
    )
    over = refused(
        state, "work_authorize", authorize("c", parent="root", grant_id=g, c=contract(tokens=10_000)), "lead"
    )
    assert over.reason == R.REJECTION_REASON_BUDGET_EXCEEDED and over.metadata["dimension"] == "tokens"
    assert over.metadata["grant_id"] == g
    # Offering an item created under the grant does not count it twice; offering the root adds it.
    state = run(state, "work_offer", offer("a", g), "lead")
    assert remaining(state.grants[g])["tokens"] == 5_000
    assert refused(state, "work_offer", offer("root", g), "lead").reason == R.REJECTION_REASON_BUDGET_EXCEEDED
    # A failed or cancelled item stays counted: the charge is cumulative.
    state = run(
        state,
        "work_cancel",
        wp.WorkCancel(work_item_id="b", reason="not needed", coordinator_epoch=1),
        "coord",
    )
    assert remaining(state.grants[g])["tokens"] == 5_000


@pytest.mark.req("MW-9.1-08")
def test_the_grantee_offers_the_scope_root_or_its_existing_descendants() -> None:
    state, g = granted()
    state = run(state, "work_offer", offer("root", g), "lead")
    state = run(state, "work_offer", offer("child", g), "lead")
    assert check_of(refused(state, "work_offer", offer("elsewhere", g), "lead")) == ("OUTSIDE_GRANT", "scope")
    assert state.work_items["child"].state == WS.WORK_ITEM_STATE_OFFERED


@pytest.mark.req("MW-9.1-13", "MW-9.1-16")
def test_only_the_grantee_at_its_recorded_membership_epoch_uses_a_grant() -> None:
    state, g = granted()
    theft = refused(state, "work_authorize", authorize("x", parent="root", grant_id=g), "lead2")
    assert check_of(theft) == ("PERMISSION_DENIED", "not_grantee")
    assert check_of(refused(state, "work_authorize", authorize("x", parent="root", grant_id=g), "coord")) == (
        "PERMISSION_DENIED",
        "not_grantee",
    )
    regranted = run(
        state,
        "membership_grant",
        membership_pb2.MembershipGrant(member_id="lead", role=Role.MEMBER_ROLE_WORK_DELEGATE),
        "alice",
    )
    assert check_of(
        refused(regranted, "work_authorize", authorize("x", parent="root", grant_id=g), "lead")
    ) == (
        "GRANT_INVALID",
        "membership_changed",
    )


@pytest.mark.req("MW-9.1-14", "MW-9.1-15")
def test_a_replaced_coordinator_an_expiry_or_a_finished_target_ends_the_grant_at_once() -> None:
    state, g = granted()
    use = authorize("x", parent="root", grant_id=g)
    replaced = copy.deepcopy(state)
    assert replaced.mission is not None
    replaced.mission.coordinator = CoordinatorLeaseState("coord2", 2, 1, NOW + timedelta(minutes=5), 300, 60)
    assert check_of(refused(replaced, "work_authorize", use, "lead")) == (
        "GRANT_INVALID",
        "coordinator_replaced",
    )
    reappointed = copy.deepcopy(replaced)  # the same agent, appointed again: a new epoch all the same
    reappointed.mission.coordinator = CoordinatorLeaseState(
        "coord", 2, 1, NOW + timedelta(minutes=5), 300, 60
    )  # type: ignore[union-attr]
    assert check_of(refused(reappointed, "work_authorize", use, "lead")) == (
        "GRANT_INVALID",
        "coordinator_replaced",
    )
    later = decider.DecisionContext(NOW + timedelta(hours=1), IDS)
    assert check_of(refused(state, "work_authorize", use, "lead", later)) == ("GRANT_INVALID", "expired")
    for state_value in (WS.WORK_ITEM_STATE_FAILED, WS.WORK_ITEM_STATE_CANCELLED, WS.WORK_ITEM_STATE_VERIFIED):
        assert check_of(refused(finished(state_value, state), "work_authorize", use, "lead")) == (
            "GRANT_INVALID",
            "target_finished",
        )
    gone = copy.deepcopy(state)
    del gone.work_items["root"]
    del gone.work_items["child"]
    assert check_of(refused(gone, "work_offer", offer("elsewhere", g), "lead")) == (
        "GRANT_INVALID",
        "target_missing",
    )


def test_the_coordinator_revokes_a_grant_and_it_cannot_be_used_after() -> None:
    state, g = granted()
    body = membership_pb2.MembershipRevokeDelegation(grant_id=g, reason="plan changed")
    assert (
        refused(state, "membership_revoke_delegation", body, "lead").reason
        == R.REJECTION_REASON_PERMISSION_DENIED
    )
    no_reason = membership_pb2.MembershipRevokeDelegation(grant_id=g)
    assert (
        refused(state, "membership_revoke_delegation", no_reason, "coord").reason
        == R.REJECTION_REASON_INVALID_ARGUMENT
    )
    state = run(state, "membership_revoke_delegation", body, "coord")
    assert check_of(refused(state, "work_authorize", authorize("x", parent="root", grant_id=g), "lead")) == (
        "GRANT_INVALID",
        "revoked",
    )
    assert (
        refused(state, "membership_revoke_delegation", body, "alice").reason
        == R.REJECTION_REASON_INVALID_TRANSITION
    )


@pytest.mark.req("MW-9.1-17", "MW-9.1-18", "MW-9.1-01")
def test_a_worker_without_a_grant_proposes_but_creates_no_obligation_for_another() -> None:
    for kind, body in (("work_authorize", authorize("x", parent="root")), ("work_offer", offer("root", ""))):
        b = copy.deepcopy(body)
        b.coordinator_epoch = 0
        assert refused(BASE, kind, b, "worker").reason == R.REJECTION_REASON_PERMISSION_DENIED
    run(
        BASE,
        "work_propose",
        wp.WorkPropose(proposal_id="p1", title="split the report", contract=contract(), rationale="too big"),
        "worker",
    )


def test_a_grant_does_not_combine_with_the_override_or_a_coordinator_epoch() -> None:
    state, g = granted()
    with_epoch = authorize("x", parent="root", grant_id=g)
    with_epoch.coordinator_epoch = 1
    assert refused(state, "work_authorize", with_epoch, "lead").reason == R.REJECTION_REASON_INVALID_ARGUMENT
    with_override = authorize("x", parent="root", grant_id=g)
    with_override.emergency_override, with_override.override_reason = True, "now"
    assert (
        refused(state, "work_authorize", with_override, "lead").reason == R.REJECTION_REASON_INVALID_ARGUMENT
    )
