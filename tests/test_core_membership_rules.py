"""Pure core: Memberships (spec 8) through decider.decide/evolve: who grants and revokes them, what
a grant records (role, epoch, visibility start, capabilities, MW-8-01/07), the epoch checks every
command passes (MW-8-02/03) and what a provisional Membership may do (MW-8-06)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import membership_pb2, mission_pb2, work_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import MemberState
from tests import builders
from tests.steward_fixtures import (
    BASE,
    CTX,
    GROUP,
    GROUP_ID,
    IDS,
    LATE,
    NOW,
    PLANNING,
    Role,
    cancelled,
    events,
    rejection,
    replaced,
)

MG, MR = membership_pb2.MembershipGrant, membership_pb2.MembershipRevoke
DEADLINE = NOW + timedelta(days=3)  # builders.definition
CAP = membership_pb2.Capability(capability_id="code.python", version="3.11")


def grant(
    member: str = "worker2", role: int = Role.MEMBER_ROLE_WORKER, **fields: object
) -> membership_pb2.MembershipGrant:
    return builders.with_overrides(MG(member_id=member, role=role), fields)


def invalid_field(decision: object) -> str:
    reason, metadata = rejection(decision)
    assert reason == "INVALID_ARGUMENT", decision
    return metadata["field"]


# ---------------------------------------------------------------- who manages Memberships


@pytest.mark.req("MW-8-01")
@pytest.mark.parametrize("actor", ["alice", "coord"])
def test_the_owner_or_the_current_coordinator_grants(actor: str) -> None:
    assert isinstance(GROUP.decide(BASE, "membership_grant", grant(), actor), list)
    assert isinstance(
        GROUP.decide(BASE, "membership_revoke", MR(member_id="worker", reason="x"), actor), list
    )


@pytest.mark.req("MW-8-01", "MW-7.2-04")
def test_a_replaced_coordinator_manages_no_membership() -> None:
    state = replaced()
    for kind, body in (("membership_grant", grant()), ("membership_revoke", MR(member_id="worker"))):
        assert rejection(GROUP.decide(state, kind, body, "coord", LATE)) == ("PERMISSION_DENIED", {})
        assert isinstance(GROUP.decide(state, kind, body, "coord2", LATE), list)


@pytest.mark.req("MW-7.2-02")
def test_a_coordinator_whose_lease_lapsed_renews_before_managing_memberships() -> None:
    expiry = BASE.mission.coordinator.expires_at  # type: ignore[union-attr]
    at_expiry = decider.DecisionContext(expiry, IDS)
    for ctx in (at_expiry, LATE):
        assert rejection(GROUP.decide(BASE, "membership_grant", grant(), "coord", ctx)) == (
            "LEASE_EXPIRED",
            {},
        )
    just_before = decider.DecisionContext(expiry - timedelta(microseconds=1), IDS)
    assert isinstance(GROUP.decide(BASE, "membership_grant", grant(), "coord", just_before), list)
    assert isinstance(
        GROUP.decide(BASE, "membership_grant", grant(), "alice", LATE), list
    )  # the owner holds no lease


@pytest.mark.req("MW-7.1-06")
def test_no_membership_changes_in_a_terminal_mission() -> None:
    state = cancelled()
    for kind, body in (("membership_grant", grant()), ("membership_revoke", MR(member_id="worker"))):
        assert rejection(GROUP.decide(state, kind, body, "alice")) == (
            "TERMINAL_STATE",
            {"state": "MISSION_STATE_CANCELLED"},
        )


# ---------------------------------------------------------------- membership.grant (MW-8-01, MW-8-07)


@pytest.mark.req("MW-8-01", "MW-8-07")
def test_a_grant_records_role_a_new_epoch_its_own_sequence_as_visibility_start_and_capabilities() -> None:
    (event,) = events(
        BASE, "membership_grant", grant(role=Role.MEMBER_ROLE_REVIEWER, capabilities=[CAP]), "coord"
    )
    sequence = BASE.head_sequence + 1
    assert (event.type, event.sequence) == ("membership.granted", sequence)
    assert event.membership_granted == membership_pb2.MembershipGranted(
        membership=membership_pb2.Membership(
            member_id="worker2",
            group_id=GROUP_ID,
            membership_epoch=BASE.last_membership_epoch + 1,
            role=Role.MEMBER_ROLE_REVIEWER,
            visibility_start_sequence=sequence,
            capabilities=[CAP],
            active=True,
        )
    )
    state = GROUP.run(
        BASE, "membership_grant", grant(role=Role.MEMBER_ROLE_REVIEWER, capabilities=[CAP]), "coord"
    )
    assert state.members["worker2"] == MemberState(
        member_id="worker2",
        role=Role.MEMBER_ROLE_REVIEWER,
        membership_epoch=8,
        visibility_start_sequence=sequence,
        capabilities=(("code.python", "3.11"),),
    )
    assert (state.last_membership_epoch, state.jit_members) == (8, set())


@pytest.mark.req("MW-8-07")
def test_an_explicit_visibility_start_is_kept() -> None:
    (event,) = events(BASE, "membership_grant", grant(visibility_start_sequence=1), "alice")
    assert event.membership_granted.membership.visibility_start_sequence == 1


@pytest.mark.req("MW-8-01")
@pytest.mark.parametrize(
    "role",
    [
        Role.MEMBER_ROLE_WORKER,
        Role.MEMBER_ROLE_REVIEWER,
        Role.MEMBER_ROLE_WORK_DELEGATE,
        Role.MEMBER_ROLE_OBSERVER,
    ],
)
def test_the_four_member_roles_are_granted(role: int) -> None:
    assert GROUP.run(BASE, "membership_grant", grant(role=role), "alice").members["worker2"].role == role


@pytest.mark.req("MW-8-01")
@pytest.mark.parametrize(
    "role", [Role.MEMBER_ROLE_MISSION_OWNER, Role.MEMBER_ROLE_COORDINATOR, Role.MEMBER_ROLE_UNSPECIFIED]
)
def test_owner_and_coordinator_memberships_come_from_the_mission(role: int) -> None:
    assert (
        invalid_field(GROUP.decide(BASE, "membership_grant", grant(role=role), "alice"))
        == "body.membership_grant.role"
    )


@pytest.mark.req("MW-8-01")
def test_the_member_is_a_registered_identity() -> None:
    assert (
        invalid_field(GROUP.decide(BASE, "membership_grant", grant(member=""), "alice"))
        == "body.membership_grant.member_id"
    )
    assert rejection(GROUP.decide(BASE, "membership_grant", grant(member="ghost"), "alice")) == (
        "UNKNOWN_IDENTITY",
        {"field": "body.membership_grant.member_id"},
    )


@pytest.mark.req("MW-8-01")
@pytest.mark.parametrize("member", ["alice", "coord"])
def test_the_owners_and_the_coordinators_membership_cannot_be_changed(member: str) -> None:
    decision = GROUP.decide(BASE, "membership_grant", grant(member=member), "alice")
    assert invalid_field(decision) == "body.membership_grant.member_id"


@pytest.mark.req("MW-8-01", "MW-8-03")
def test_a_member_is_granted_again_under_a_new_epoch_and_epochs_are_never_reused() -> None:
    regranted = GROUP.run(
        BASE, "membership_grant", grant(member="worker", role=Role.MEMBER_ROLE_REVIEWER), "alice"
    )
    assert (regranted.members["worker"].role, regranted.members["worker"].membership_epoch) == (
        Role.MEMBER_ROLE_REVIEWER,
        8,
    )
    revoked = GROUP.run(regranted, "membership_revoke", MR(member_id="worker"), "alice")
    again = GROUP.run(revoked, "membership_grant", grant(member="worker"), "alice")
    assert (again.members["worker"].membership_epoch, again.members["worker"].active) == (9, True)


@pytest.mark.req("MW-8-01")
@pytest.mark.parametrize(
    "cap", [membership_pb2.Capability(capability_id="x"), membership_pb2.Capability(version="1")]
)
def test_each_capability_names_an_id_and_a_version(cap: membership_pb2.Capability) -> None:
    decision = GROUP.decide(BASE, "membership_grant", grant(capabilities=[CAP, cap]), "alice")
    assert invalid_field(decision) == "body.membership_grant.capabilities[1]"


# ---------------------------------------------------------------- provisional Memberships (MW-8-06)


def provisional(expires: timedelta = timedelta(hours=1), **fields: object) -> membership_pb2.MembershipGrant:
    return grant(provisional=True, expires_at=to_timestamp(NOW + expires), **fields)


@pytest.mark.req("MW-8-06")
def test_a_provisional_grant_records_its_expiry_and_may_end_by_itself() -> None:
    (event,) = events(BASE, "membership_grant", provisional(), "alice")
    membership = event.membership_granted.membership
    assert (membership.provisional, membership.expires_at, membership.active) == (
        True,
        to_timestamp(NOW + timedelta(hours=1)),
        True,
    )
    state = GROUP.run(BASE, "membership_grant", provisional(), "alice")
    member = state.members["worker2"]
    assert (member.provisional, member.expires_at, member.just_in_time) == (
        True,
        NOW + timedelta(hours=1),
        False,
    )
    assert state.jit_members == {"worker2"}
    # A grant in full replaces it, and it no longer ends by itself.
    assert GROUP.run(state, "membership_grant", grant(), "alice").jit_members == set()


@pytest.mark.req("MW-8-06")
def test_a_provisional_membership_is_a_workers_and_expires_in_the_future_within_the_mission() -> None:
    assert invalid_field(
        GROUP.decide(BASE, "membership_grant", provisional(role=Role.MEMBER_ROLE_REVIEWER), "alice")
    ) == ("body.membership_grant.provisional")
    for body in (
        grant(provisional=True),
        provisional(timedelta(0)),
        provisional(timedelta(days=3, seconds=1)),
    ):
        assert (
            invalid_field(GROUP.decide(BASE, "membership_grant", body, "alice"))
            == "body.membership_grant.expires_at"
        )
    assert isinstance(
        GROUP.decide(BASE, "membership_grant", provisional(timedelta(days=3)), "alice"), list
    )  # the deadline


@pytest.mark.req("MW-8-06")
def test_a_provisional_member_only_answers_offers_and_is_stale_once_lapsed() -> None:
    state = GROUP.run(BASE, "membership_grant", provisional(), "alice")
    post = builders.message(PLANNING)
    refused = GROUP.refused(state, "message_post", post, "worker2")
    assert (refused.reason_name, refused.metadata) == ("PERMISSION_DENIED", {"check": "provisional"})
    decline = work_pb2.WorkDeclineOffer(work_item_id="wi", offer_id="o")
    assert (
        GROUP.refused(state, "work_decline_offer", decline, "worker2").metadata.get("check") != "provisional"
    )
    for at in (NOW + timedelta(hours=1), NOW + timedelta(hours=2)):
        lapsed = GROUP.refused(
            state, "work_decline_offer", decline, "worker2", decider.DecisionContext(at, IDS)
        )
        assert (lapsed.reason_name, lapsed.metadata) == (
            "MEMBERSHIP_EPOCH_STALE",
            {"current_epoch": "0", "check": "lapsed"},
        )


# ---------------------------------------------------------------- membership.revoke (MW-8-03)


@pytest.mark.req("MW-8-03")
def test_a_revocation_ends_the_membership_and_its_epoch_is_stale_from_then_on() -> None:
    (event,) = events(BASE, "membership_revoke", MR(member_id="rev", reason="left the team"), "alice")
    assert event.type == "membership.revoked"
    assert event.membership_revoked == membership_pb2.MembershipRevoked(
        member_id="rev", membership_epoch=4, reason="left the team"
    )
    state = GROUP.run(BASE, "membership_revoke", MR(member_id="rev", reason="left the team"), "alice")
    assert state.members["rev"].active is False
    command = GROUP.command("message_post", builders.message(PLANNING), "rev", BASE)  # its old epoch
    refused = decider.decide(state, command, CTX)
    assert rejection(refused) == ("MEMBERSHIP_EPOCH_STALE", {"current_epoch": "0"})
    assert rejection(GROUP.decide(state, "membership_revoke", MR(member_id="rev"), "alice"))[0] == "NOT_FOUND"


@pytest.mark.req("MW-8-03")
def test_only_an_active_membership_other_than_the_owners_and_coordinators_is_revoked() -> None:
    assert (
        rejection(GROUP.decide(BASE, "membership_revoke", MR(member_id="nobody"), "alice"))[0] == "NOT_FOUND"
    )
    for member in ("alice", "coord"):
        assert (
            invalid_field(GROUP.decide(BASE, "membership_revoke", MR(member_id=member), "alice"))
            == "body.membership_revoke.member_id"
        )


@pytest.mark.req("MW-8-06")
def test_revoking_a_provisional_membership_removes_it_from_those_that_end_by_themselves() -> None:
    state = GROUP.run(BASE, "membership_grant", provisional(), "alice")
    assert GROUP.run(state, "membership_revoke", MR(member_id="worker2"), "alice").jit_members == set()


@pytest.mark.req("MW-8-02")
def test_a_command_with_a_membership_epoch_other_than_the_current_one_is_stale() -> None:
    command = GROUP.command("message_post", builders.message(PLANNING), "worker", BASE)
    command.membership_epoch = 2
    assert rejection(decider.decide(BASE, command, CTX)) == ("MEMBERSHIP_EPOCH_STALE", {"current_epoch": "3"})
    command = GROUP.command("message_post", builders.message(PLANNING), "ghost", BASE)
    assert rejection(decider.decide(BASE, command, CTX)) == ("NOT_A_MEMBER", {})


@pytest.mark.req("MW-8-06")
def test_the_missions_end_ends_a_provisional_membership_in_the_same_append() -> None:
    state = GROUP.run(BASE, "membership_grant", provisional(), "alice")
    decision = GROUP.decide(state, "mission_cancel", mission_pb2.MissionCancel(reason="stop"), "alice")
    assert isinstance(decision, list)
    ended = [e for e in decision if e.type == "membership.ended"]
    assert [e.membership_ended for e in ended] == [
        membership_pb2.MembershipEnded(
            member_id="worker2", membership_epoch=8, reason=membership_pb2.MEMBERSHIP_END_REASON_MISSION_ENDED
        )
    ]
    after = GROUP.run(state, "mission_cancel", mission_pb2.MissionCancel(reason="stop"), "alice")
    assert (after.members["worker2"].active, after.jit_members) == (False, set())
