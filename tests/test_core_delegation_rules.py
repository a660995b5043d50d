"""Pure core: delegation grants (spec 9.1) through decider.decide/evolve, field by field: what a
grant records (MW-9.1-05/06/07), each bound it must state and the exact refusal when one is missing
or unbounded, its revocation, and the metadata of each refusal of a use under it (MW-9.1-10..16)."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.common import OrganizationPolicy
from missionweave_server.services.authority.rules.delegation import remaining
from missionweave_server.services.authority.state import SIX, GrantState, GroupState
from tests import builders
from tests.steward_fixtures import (
    BASE,
    GROUP,
    GROUP_ID,
    IDS,
    LATE,
    NOW,
    Role,
    cancelled,
    events,
    rejection,
    replaced,
)

GD, RD, Cap = (
    membership_pb2.MembershipGrantDelegation,
    membership_pb2.MembershipRevokeDelegation,
    membership_pb2.Capability,
)
FIELD = "body.membership_grant_delegation"
DEADLINE = NOW + timedelta(days=3)  # builders.definition
# The Mission's budget (builders.definition): EUR, 50 M micros, 1 M tokens, 500 tool calls, the rest 0.
CAPS = common_pb2.ResourceVector(currency="EUR", financial_micros=3_000_000, tokens=30_000, tool_calls=150)


def contract(*capabilities: tuple[str, str], **budget: int) -> wp.WorkContract:
    c = builders.contract(NOW)
    c.required_capabilities.extend(Cap(capability_id=i, version=v) for i, v in capabilities)
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


def planned() -> GroupState:
    state = GROUP.run(BASE, "work_authorize", authorize("root"), "coord")
    return GROUP.run(state, "work_authorize", authorize("child", parent="root"), "coord")


PLANNED = planned()


def body(**fields: object) -> GD:
    b = GD(
        grantee_id="lead",
        target_work_item_id="root",
        allowed_capabilities=[Cap(capability_id="code.python", version="3.11")],
        caps=CAPS,
        max_descendant_depth=2,
        expires_at=to_timestamp(NOW + timedelta(hours=1)),
        coordinator_epoch=1,
    )
    return builders.with_overrides(b, fields)


def refusal(
    state: GroupState = PLANNED,
    actor: str = "coord",
    ctx: decider.DecisionContext | None = None,
    **fields: object,
) -> tuple[str, dict[str, str]]:
    return rejection(GROUP.decide(state, "membership_grant_delegation", body(**fields), actor, ctx))


def granted(state: GroupState = PLANNED, **fields: object) -> tuple[GroupState, str]:
    after = GROUP.run(state, "membership_grant_delegation", body(**fields), "coord")
    [grant_id] = set(after.grants) - set(state.grants)
    return after, grant_id


GRANTED, GRANT_ID = granted()


# ---------------------------------------------------------------- what a grant records


@pytest.mark.req("MW-9.1-05", "MW-9.1-06", "MW-9.1-07")
def test_a_grant_records_every_bound_and_the_state_keeps_them() -> None:
    command = GROUP.command("membership_grant_delegation", body(), "coord", PLANNED)
    decision = decider.decide(PLANNED, command, GROUP.ctx)
    assert isinstance(decision, list)
    (event,) = decision
    grant_id = ids.derived_id("grant", GROUP_ID, command.command_id)
    expected = membership_pb2.DelegationGrant(
        grant_id=grant_id,
        grantee_id="lead",
        mission_id=PLANNED.mission.mission_id,
        group_id=GROUP_ID,  # type: ignore[union-attr]
        target_work_item_id="root",
        allowed_capabilities=[Cap(capability_id="code.python", version="3.11")],
        caps=CAPS,
        max_descendant_depth=2,
        grantee_membership_epoch=5,
        coordinator_epoch=1,
        issuer_id="coord",
        granted_at=to_timestamp(NOW),
        expires_at=to_timestamp(NOW + timedelta(hours=1)),
    )
    assert (event.type, event.delegation_granted) == (
        "membership.delegation.granted",
        membership_pb2.DelegationGranted(grant=expected),
    )
    state = decider.evolve(copy.deepcopy(PLANNED), event)
    assert state.grants[grant_id] == GrantState(
        grant_id=grant_id,
        grantee_id="lead",
        mission_id=PLANNED.mission.mission_id,
        group_id=GROUP_ID,  # type: ignore[union-attr]
        target_work_item_id="root",
        allowed={"code.python": "3.11"},
        caps={**dict.fromkeys(SIX, 0), "financial_micros": 3_000_000, "tokens": 30_000, "tool_calls": 150},
        currency="EUR",
        max_descendant_depth=2,
        grantee_membership_epoch=5,
        coordinator_epoch=1,
        issuer_id="coord",
        granted_at=NOW,
        expires_at=NOW + timedelta(hours=1),
        record=expected,
    )
    assert dict(remaining(state.grants[grant_id])) == state.grants[grant_id].caps


# ---------------------------------------------------------------- each bound, with its exact refusal


@pytest.mark.req("MW-9.1-05")
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"grantee_id": ""}, ("INVALID_ARGUMENT", {"field": f"{FIELD}.grantee_id"})),
        ({"grantee_id": "ghost"}, ("PRECONDITION_FAILED", {"field": f"{FIELD}.grantee_id"})),
        ({"grantee_id": "worker"}, ("PRECONDITION_FAILED", {"field": f"{FIELD}.grantee_id"})),
        ({"target_work_item_id": "nope"}, ("NOT_FOUND", {"field": f"{FIELD}.target_work_item_id"})),
        ({"allowed_capabilities": []}, ("INVALID_ARGUMENT", {"field": f"{FIELD}.allowed_capabilities"})),
        (
            {"allowed_capabilities": [Cap(capability_id="a", version="1"), Cap(capability_id="b")]},
            ("INVALID_ARGUMENT", {"field": f"{FIELD}.allowed_capabilities[1]"}),
        ),
        (
            {"allowed_capabilities": [Cap(version="1")]},
            ("INVALID_ARGUMENT", {"field": f"{FIELD}.allowed_capabilities[0]"}),
        ),
        (
            {
                "allowed_capabilities": [
                    Cap(capability_id="a", version="1"),
                    Cap(capability_id="a", version="2"),
                ]
            },
            ("INVALID_ARGUMENT", {"field": f"{FIELD}.allowed_capabilities[1]"}),
        ),
        (
            {"allowed_capabilities": [Cap(capability_id=f"c{i}", version="1") for i in range(65)]},
            ("INVALID_ARGUMENT", {"field": f"{FIELD}.allowed_capabilities"}),
        ),
        ({"caps": None}, ("INVALID_ARGUMENT", {"field": f"{FIELD}.caps"})),
        (
            {"caps": common_pb2.ResourceVector(tokens=1)},
            ("INVALID_ARGUMENT", {"field": f"{FIELD}.caps.currency"}),
        ),
        (
            {"caps": common_pb2.ResourceVector(currency="USD")},
            ("INVALID_ARGUMENT", {"field": f"{FIELD}.caps.currency"}),
        ),
        (
            {"caps": common_pb2.ResourceVector(currency="EUR", financial_micros=-1)},
            ("INVALID_ARGUMENT", {"field": f"{FIELD}.caps.financial_micros"}),
        ),
        (
            {"caps": common_pb2.ResourceVector(currency="EUR", tokens=1_000_001, compute_ms=1)},
            ("BUDGET_EXCEEDED", {"field": f"{FIELD}.caps.tokens", "dimension": "tokens"}),
        ),
        (
            {"caps": common_pb2.ResourceVector(currency="EUR", side_effects=1)},
            ("BUDGET_EXCEEDED", {"field": f"{FIELD}.caps.side_effects", "dimension": "side_effects"}),
        ),
        (
            {"max_descendant_depth": 4},
            ("PERMISSION_DENIED", {"field": f"{FIELD}.max_descendant_depth", "policy_limit": "3"}),
        ),
        ({"expires_at": None}, ("INVALID_ARGUMENT", {"field": f"{FIELD}.expires_at"})),
        ({"expires_at": to_timestamp(NOW)}, ("INVALID_ARGUMENT", {"field": f"{FIELD}.expires_at"})),
        (
            {"expires_at": to_timestamp(DEADLINE + timedelta(seconds=1))},
            ("INVALID_ARGUMENT", {"field": f"{FIELD}.expires_at"}),
        ),
    ],
)
def test_each_bound_of_a_grant_is_stated_and_within_the_mission(
    fields: dict[str, object], expected: tuple[str, dict[str, str]]
) -> None:
    assert refusal(**fields) == expected


@pytest.mark.req("MW-9.1-05", "MW-9.1-12")
def test_bounds_at_their_limits_are_granted() -> None:
    full = common_pb2.ResourceVector(
        currency="EUR", financial_micros=50_000_000, tokens=1_000_000, tool_calls=500
    )
    caps64 = [Cap(capability_id=f"c{i}", version="1") for i in range(64)]
    state, grant_id = granted(
        caps=full, max_descendant_depth=3, expires_at=to_timestamp(DEADLINE), allowed_capabilities=caps64
    )
    grant = state.grants[grant_id]
    assert (grant.caps["tokens"], grant.max_descendant_depth, grant.expires_at, len(grant.allowed)) == (
        1_000_000,
        3,
        DEADLINE,
        64,
    )
    zero = common_pb2.ResourceVector(currency="EUR")  # zero is explicit: it permits nothing (OP-02)
    state, grant_id = granted(caps=zero)
    assert state.grants[grant_id].caps == dict.fromkeys(SIX, 0)
    strict = decider.DecisionContext(NOW, IDS, policy=OrganizationPolicy(max_delegation_depth=1))
    assert refusal(ctx=strict)[1]["policy_limit"] == "1"


@pytest.mark.req("MW-9.1-02", "MW-8-06")
def test_the_grantee_holds_an_active_full_work_delegate_membership() -> None:
    revoked = GROUP.run(
        PLANNED, "membership_revoke", membership_pb2.MembershipRevoke(member_id="lead"), "alice"
    )
    assert refusal(revoked) == ("PRECONDITION_FAILED", {"field": f"{FIELD}.grantee_id"})
    provisional = membership_pb2.MembershipGrant(
        member_id="lead",
        role=Role.MEMBER_ROLE_WORKER,
        provisional=True,
        expires_at=to_timestamp(NOW + timedelta(hours=1)),
    )
    state = GROUP.run(PLANNED, "membership_grant", provisional, "alice")
    state.members[
        "lead"
    ].role = Role.MEMBER_ROLE_WORK_DELEGATE  # only Workers are provisional: the check stands alone
    assert refusal(state) == ("PRECONDITION_FAILED", {"field": f"{FIELD}.grantee_id"})


@pytest.mark.req("MW-9.1-04", "MW-7.1-06")
def test_only_a_live_mission_and_its_current_coordinator_grant() -> None:
    assert refusal(cancelled(PLANNED)) == ("TERMINAL_STATE", {"state": "MISSION_STATE_CANCELLED"})
    reason, _ = refusal(replaced(PLANNED), ctx=LATE)
    assert reason == "COORDINATOR_EPOCH_STALE"


# ---------------------------------------------------------------- membership.revoke_delegation


@pytest.mark.req("MW-9.1-15")
@pytest.mark.parametrize("actor", ["coord", "alice"])
def test_a_steward_revokes_a_grant_with_a_reason(actor: str) -> None:
    (event,) = events(
        GRANTED, "membership_revoke_delegation", RD(grant_id=GRANT_ID, reason="plan changed"), actor
    )
    assert (event.type, event.delegation_revoked) == (
        "membership.delegation.revoked",
        membership_pb2.DelegationRevoked(grant_id=GRANT_ID, reason="plan changed"),
    )
    state = GROUP.run(
        GRANTED, "membership_revoke_delegation", RD(grant_id=GRANT_ID, reason="plan changed"), actor
    )
    assert state.grants[GRANT_ID].revoked is True


def test_revoking_needs_a_known_grant_not_yet_revoked_and_a_live_coordinator_lease() -> None:
    assert rejection(
        GROUP.decide(GRANTED, "membership_revoke_delegation", RD(grant_id="grant_x", reason="r"), "coord")
    ) == ("NOT_FOUND", {"field": "body.membership_revoke_delegation.grant_id"})
    for reason in ("", " ", "r" * 4097):
        assert rejection(
            GROUP.decide(
                GRANTED, "membership_revoke_delegation", RD(grant_id=GRANT_ID, reason=reason), "coord"
            )
        ) == ("INVALID_ARGUMENT", {"field": "body.membership_revoke_delegation.reason"})
    assert rejection(
        GROUP.decide(
            GRANTED, "membership_revoke_delegation", RD(grant_id=GRANT_ID, reason="r"), "coord", LATE
        )
    ) == ("LEASE_EXPIRED", {})


# ---------------------------------------------------------------- refusals of a use under the grant


@pytest.mark.req("MW-9.1-10")
def test_a_capability_outside_the_grant_names_the_capability() -> None:
    for capability in (("db.sql", "1.0"), ("code.python", "3.10")):
        use = authorize("x", parent="root", grant_id=GRANT_ID, c=contract(capability))
        assert rejection(GROUP.decide(GRANTED, "work_authorize", use, "lead")) == (
            "OUTSIDE_GRANT",
            {"grant_id": GRANT_ID, "check": "capability", "capability": capability[0]},
        )
    exact = authorize("x", parent="root", grant_id=GRANT_ID, c=contract(("code.python", "3.11")))
    assert isinstance(GROUP.decide(GRANTED, "work_authorize", exact, "lead"), list)


@pytest.mark.req("MW-9.1-11")
def test_a_charge_over_a_cap_names_the_dimension_the_cap_and_the_total() -> None:
    fits = authorize(
        "a", parent="root", grant_id=GRANT_ID, c=contract(("code.python", "3.11"), tokens=30_000)
    )
    state = GROUP.run(GRANTED, "work_authorize", fits, "lead")
    assert state.item_grants["a"] == {
        GRANT_ID: {**dict.fromkeys(SIX, 0), "financial_micros": 1_000_000, "tokens": 30_000, "tool_calls": 50}
    }
    assert remaining(state.grants[GRANT_ID])["tokens"] == 0
    over = authorize("b", parent="root", grant_id=GRANT_ID, c=contract(("code.python", "3.11"), tokens=1))
    assert rejection(GROUP.decide(state, "work_authorize", over, "lead")) == (
        "BUDGET_EXCEEDED",
        {"grant_id": GRANT_ID, "dimension": "tokens", "cap": "30000", "charged": "30001"},
    )


@pytest.mark.req("MW-9.1-12")
def test_a_use_below_the_grants_depth_names_the_depth() -> None:
    state, grant_id = granted(max_descendant_depth=1)
    deep = authorize("d2", parent="child", grant_id=grant_id)
    assert rejection(GROUP.decide(state, "work_authorize", deep, "lead")) == (
        "OUTSIDE_GRANT",
        {"grant_id": grant_id, "check": "depth", "depth": "2"},
    )
    strict = decider.DecisionContext(NOW, IDS, policy=OrganizationPolicy(max_delegation_depth=0))
    shallow = authorize("d1", parent="root", grant_id=grant_id)
    assert rejection(GROUP.decide(state, "work_authorize", shallow, "lead", strict)) == (
        "OUTSIDE_GRANT",
        {"grant_id": grant_id, "check": "depth_policy", "depth": "1"},
    )
    assert isinstance(
        GROUP.decide(state, "work_authorize", shallow, "lead"), list
    )  # depth 1 = the grant's maximum


@pytest.mark.req("MW-9.1-09", "MW-9.1-08")
def test_a_use_outside_the_subtree_names_the_scope_check() -> None:
    state = GROUP.run(GRANTED, "work_authorize", authorize("elsewhere"), "coord")
    for kind, use in (
        ("work_authorize", authorize("x", grant_id=GRANT_ID)),
        ("work_authorize", authorize("x", parent="elsewhere", grant_id=GRANT_ID)),
        ("work_offer", _offer("elsewhere")),
    ):
        assert rejection(GROUP.decide(state, kind, use, "lead")) == (
            "OUTSIDE_GRANT",
            {"grant_id": GRANT_ID, "check": "scope"},
        )


def _offer(work_item_id: str, grant_id: str = GRANT_ID) -> wp.WorkOffer:
    return wp.WorkOffer(
        work_item_id=work_item_id,
        offer_id=f"off-{work_item_id}",
        candidate_ids=["worker"],
        expires_at=to_timestamp(NOW + timedelta(minutes=5)),
        selection_criteria=[builders.selection("worker")],
        grant_id=grant_id,
    )


@pytest.mark.req("MW-9.1-11", "MW-9.1-08")
def test_offering_the_scope_root_charges_the_grant_once() -> None:
    state = GROUP.run(GRANTED, "work_offer", _offer("root"), "lead")
    charged = {**dict.fromkeys(SIX, 0), "financial_micros": 1_000_000, "tokens": 10_000, "tool_calls": 50}
    assert (state.grants[GRANT_ID].charged, state.item_grants["root"]) == (charged, {GRANT_ID: charged})
    assert dict(remaining(state.grants[GRANT_ID])) == {
        dim: state.grants[GRANT_ID].caps[dim] - charged[dim] for dim in SIX
    }


@pytest.mark.req("MW-9.1-13", "MW-9.1-15", "MW-9.1-16")
def test_the_refusals_of_an_invalid_grant_name_the_grant_and_the_check() -> None:
    use = authorize("x", parent="root", grant_id=GRANT_ID)
    assert (
        rejection(GROUP.decide(GRANTED, "work_authorize", use, "worker"))[1]["check"] == "role"
    )  # a Worker holds no grant
    regranted = GROUP.run(
        GRANTED,
        "membership_grant",
        membership_pb2.MembershipGrant(member_id="worker", role=Role.MEMBER_ROLE_WORK_DELEGATE),
        "alice",
    )
    assert rejection(GROUP.decide(regranted, "work_authorize", use, "worker")) == (
        "PERMISSION_DENIED",
        {"grant_id": GRANT_ID, "check": "not_grantee"},
    )
    expiry = NOW + timedelta(hours=1)
    assert rejection(
        GROUP.decide(GRANTED, "work_authorize", use, "lead", decider.DecisionContext(expiry, IDS))
    ) == ("GRANT_INVALID", {"grant_id": GRANT_ID, "check": "expired"})
    assert isinstance(
        GROUP.decide(
            GRANTED,
            "work_authorize",
            use,
            "lead",
            decider.DecisionContext(expiry - timedelta(microseconds=1), IDS),
        ),
        list,
    )
    revoked = GROUP.run(GRANTED, "membership_revoke_delegation", RD(grant_id=GRANT_ID, reason="r"), "coord")
    assert rejection(GROUP.decide(revoked, "work_authorize", use, "lead")) == (
        "GRANT_INVALID",
        {"grant_id": GRANT_ID, "check": "revoked"},
    )
    assert rejection(
        GROUP.decide(GRANTED, "work_authorize", authorize("x", parent="root", grant_id="grant_none"), "lead")
    ) == ("NOT_FOUND", {"field": "grant_id"})


@pytest.mark.req("MW-9.1-08", "MW-9.1-09")
def test_a_use_outside_the_subtree_says_which_work_item_lies_outside() -> None:
    state = GROUP.run(GRANTED, "work_authorize", authorize("elsewhere"), "coord")
    messages = {
        GROUP.refused(state, "work_offer", _offer("elsewhere"), "lead").message,
        GROUP.refused(
            state, "work_authorize", authorize("x", parent="elsewhere", grant_id=GRANT_ID), "lead"
        ).message,
        GROUP.refused(state, "work_authorize", authorize("x", grant_id=GRANT_ID), "lead").message,
    }
    assert messages == {
        "elsewhere is outside the subtree of root (MW-9.1-08)",
        "elsewhere is outside the subtree of root (MW-9.1-09)",
        "a delegated WorkItem names its parent in the granted subtree (MW-9.1-09)",
    }


@pytest.mark.req("MW-9.1-05", "MW-9.1-10")
def test_the_refusals_of_missing_caps_and_an_old_capability_say_why() -> None:
    no_caps = GROUP.refused(PLANNED, "membership_grant_delegation", body(caps=None), "coord")
    assert (
        no_caps.message
        == f"{FIELD}.caps: caps in all six budget dimensions, with a currency, are required (MW-9.1-05)"
    )
    old = authorize("x", parent="root", grant_id=GRANT_ID, c=contract(("code.python", "3.10")))
    assert GROUP.refused(GRANTED, "work_authorize", old, "lead").message == (
        "code.python 3.10 is below the grant's minimum version 3.11 (MW-9.1-10)"
    )
