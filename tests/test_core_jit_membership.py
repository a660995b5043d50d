"""Just-in-time Worker Memberships (MW-8-06), on the pure core: a bounded provisional Membership
with no authority beyond its offer, activated by accepting the offer in the same append, lapsing
unseen if it never does, and ending by itself when its obligations are done or the Mission ends."""

from __future__ import annotations

from datetime import timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState
from missionweave_server.services.authority.visibility import active_member
from tests import builders
from tests.test_core_delegation import IDS, NOW, R, Role, check_of, decide, refused, run

SOON = NOW + timedelta(minutes=30)
LATER = decider.DecisionContext(SOON + timedelta(seconds=1), IDS)


def provisional(member: str = "worker", expires: object = SOON) -> membership_pb2.MembershipGrant:
    grant = membership_pb2.MembershipGrant(member_id=member, role=Role.MEMBER_ROLE_WORKER, provisional=True)
    if expires is not None:
        grant.expires_at.CopyFrom(to_timestamp(expires))  # type: ignore[arg-type]
    return grant


def offer(work_item_id: str, candidate: str = "worker", minutes: int = 10) -> wp.WorkOffer:
    return wp.WorkOffer(
        work_item_id=work_item_id,
        offer_id=f"off-{work_item_id}",
        candidate_ids=[candidate],
        expires_at=to_timestamp(NOW + timedelta(minutes=minutes)),
        selection_criteria=[builders.selection(candidate)],
        coordinator_epoch=1,
    )


def accept(work_item_id: str) -> wp.WorkAcceptOffer:
    return wp.WorkAcceptOffer(work_item_id=work_item_id, offer_id=f"off-{work_item_id}", contract_revision=1)


def base() -> GroupState:
    create = builders.mission_create("alice", "coord", NOW)
    create.coordinator_renewal.lease_duration.FromSeconds(3_600)
    state = run(None, "mission_create", create, "alice")
    for wid in ("wi-1", "wi-2"):
        body = wp.WorkAuthorize(
            work_item_id=wid, title=wid, contract=builders.contract(NOW), coordinator_epoch=1
        )
        state = run(state, "work_authorize", body, "coord")
    return run(state, "membership_grant", provisional(), "coord")


BASE = base()


def types(events: decider.Decision) -> list[str]:
    assert not isinstance(events, Rejected), events
    return [e.type for e in events]


@pytest.mark.req("MW-8-06")
def test_a_provisional_membership_is_for_a_worker_and_expires_within_the_mission() -> None:
    state = run(None, "mission_create", builders.mission_create("alice", "coord", NOW), "alice")
    reviewer = provisional("lead")
    reviewer.role = Role.MEMBER_ROLE_REVIEWER
    for body in (
        reviewer,
        provisional("lead", expires=None),
        provisional("lead", NOW - timedelta(seconds=1)),
        provisional("lead", NOW + timedelta(days=365)),
    ):
        assert refused(state, "membership_grant", body, "coord").reason == R.REJECTION_REASON_INVALID_ARGUMENT
    member = BASE.members["worker"]
    assert member.provisional and member.active and member.expires_at == SOON


@pytest.mark.req("MW-8-06")
def test_a_provisional_member_may_only_answer_its_offer() -> None:
    state = run(BASE, "work_offer", offer("wi-1"), "coord")
    post = builders.message(state.mission.planning_conversation_id, "hello")  # type: ignore[union-attr]
    propose = wp.WorkPropose(proposal_id="p", title="t", contract=builders.contract(NOW), rationale="r")
    for kind, body in (("message_post", post), ("work_propose", propose)):
        assert check_of(refused(state, kind, body, "worker")) == ("PERMISSION_DENIED", "provisional")
    decline = wp.WorkDeclineOffer(
        work_item_id="wi-1",
        offer_id="off-wi-1",
        decline=wp.StructuredDecline(reason=wp.DECLINE_REASON_CAPACITY),
    )
    assert types(decide(state, "work_decline_offer", decline, "worker")) == ["work.offer_declined"]


@pytest.mark.req("MW-8-06")
def test_an_offer_to_a_provisional_candidate_expires_no_later_than_its_membership() -> None:
    too_long = offer("wi-1", minutes=31)
    assert refused(BASE, "work_offer", too_long, "coord").reason == R.REJECTION_REASON_INVALID_ARGUMENT


@pytest.mark.req("MW-8-06")
def test_accepting_the_offer_activates_the_membership_and_creates_ownership_in_one_append() -> None:
    state = run(BASE, "work_offer", offer("wi-1"), "coord")
    events = decide(state, "work_accept_offer", accept("wi-1"), "worker")
    assert types(events) == ["work.offer_accepted", "membership.activated"]
    assert not isinstance(events, Rejected)
    activated = events[1].membership_activated
    assert (activated.member_id, activated.work_item_id, activated.offer_id) == ("worker", "wi-1", "off-wi-1")
    state = run(state, "work_accept_offer", accept("wi-1"), "worker")
    member = state.members["worker"]
    assert not member.provisional and member.just_in_time and member.expires_at is None
    assert state.work_items["wi-1"].owner.agent_id == "worker"  # type: ignore[union-attr]
    assert activated.membership_epoch == member.membership_epoch  # the epoch the Worker already carries


@pytest.mark.req("MW-8-06")
def test_a_provisional_member_that_never_accepts_lapses_without_an_event() -> None:
    state = run(BASE, "work_offer", offer("wi-1"), "coord")
    head = state.head_sequence
    lapsed = refused(state, "work_accept_offer", accept("wi-1"), "worker", LATER)
    assert check_of(lapsed) == ("MEMBERSHIP_EPOCH_STALE", "lapsed")
    to_lapsed = refused(state, "work_offer", offer("wi-2", minutes=45), "coord", LATER)
    assert (
        to_lapsed.reason == R.REJECTION_REASON_INVALID_ARGUMENT
        and "no active Membership" in to_lapsed.message
    )
    with pytest.raises(Rejected) as read:
        active_member(state, state.group_id, "worker", SOON)
    assert read.value.reason == R.REJECTION_REASON_NOT_A_MEMBER
    assert state.head_sequence == head and state.members["worker"].active  # nothing was written for it


@pytest.mark.req("MW-8-06")
def test_the_membership_ends_by_itself_with_its_last_obligation() -> None:
    state = run(BASE, "work_offer", offer("wi-1"), "coord")
    state = run(state, "work_accept_offer", accept("wi-1"), "worker")
    state = run(state, "work_offer", offer("wi-2"), "coord")  # a second obligation: an open offer
    cancel_1 = wp.WorkCancel(work_item_id="wi-1", coordinator_epoch=1, reason="descoped")
    assert "membership.ended" not in types(decide(state, "work_cancel", cancel_1, "coord"))
    state = run(state, "work_cancel", cancel_1, "coord")
    cancel_2 = wp.WorkCancel(work_item_id="wi-2", coordinator_epoch=1, reason="descoped")
    events = decide(state, "work_cancel", cancel_2, "coord")
    assert types(events)[-1] == "membership.ended"
    assert not isinstance(events, Rejected)
    assert events[-1].membership_ended.reason == membership_pb2.MEMBERSHIP_END_REASON_OBLIGATIONS_COMPLETE
    state = run(state, "work_cancel", cancel_2, "coord")
    assert not state.members["worker"].active
    post = builders.message(state.mission.planning_conversation_id, "still here?")  # type: ignore[union-attr]
    assert refused(state, "message_post", post, "worker").reason == R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE


@pytest.mark.req("MW-8-06")
def test_the_mission_ending_ends_just_in_time_and_provisional_memberships() -> None:
    state = run(BASE, "work_offer", offer("wi-1"), "coord")
    state = run(state, "work_accept_offer", accept("wi-1"), "worker")
    state = run(state, "membership_grant", provisional("lead"), "coord")
    events = decide(state, "mission_cancel", mission_pb2.MissionCancel(reason="stopped"), "alice")
    assert not isinstance(events, Rejected)
    ended = {
        e.membership_ended.member_id: e.membership_ended.reason
        for e in events
        if e.type == "membership.ended"
    }
    assert ended == dict.fromkeys(("worker", "lead"), membership_pb2.MEMBERSHIP_END_REASON_MISSION_ENDED)
    state = run(state, "mission_cancel", mission_pb2.MissionCancel(reason="stopped"), "alice")
    assert not state.members["worker"].active and not state.members["lead"].active
    assert state.members["coord"].active  # Memberships not granted just in time stay


def test_a_worker_granted_in_full_does_not_end_by_itself() -> None:
    state = run(
        BASE,
        "membership_grant",
        membership_pb2.MembershipGrant(member_id="lead", role=Role.MEMBER_ROLE_WORKER),
        "coord",
    )
    state = run(state, "work_offer", offer("wi-1", "lead"), "coord")
    state = run(state, "work_accept_offer", accept("wi-1"), "lead")
    events = decide(
        state, "work_cancel", wp.WorkCancel(work_item_id="wi-1", coordinator_epoch=1, reason="r"), "coord"
    )
    assert "membership.ended" not in types(events)
