"""The Coordinator's candidate ranking and offer helpers (MW-10.3-03, -04, -10, -11), pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.sdk.offering import OfferMade, OfferTracker, ineligibility
from missionweave.sdk.placement import Candidate, offer_body, rank, sequential, urgent_set
from missionweave.v1 import agent_card_pb2 as acpb
from missionweave.v1 import common_pb2, event_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.test_core_delegation import BASE, NOW, decide

PY = membership_pb2.Capability(capability_id="code.python", version="3.11")


def card(agent: str, version: str = "3.12.0") -> acpb.AgentCard:
    return acpb.AgentCard(
        agent_id=agent,
        card_version="1.0.0",
        max_concurrency=4,
        capabilities=[membership_pb2.Capability(capability_id="code.python", version=version)],
    )


def presence(free: int, fresh: bool = True) -> acpb.AgentPresence:
    return acpb.AgentPresence(availability=acpb.PRESENCE_AVAILABILITY_AVAILABLE, free_slots=free, fresh=fresh)


def contract() -> wp.WorkContract:
    c = builders.contract(NOW)
    c.required_capabilities.append(PY)
    return c


CANDIDATES = [
    Candidate("alpha", 3, card("alpha"), presence(2)),
    Candidate("beta", 4, card("beta", "3.10.0"), presence(4)),  # its Python is too old
    Candidate("gamma", 5, card("gamma"), presence(3, fresh=False)),  # presence stale
    Candidate("delta", 6, card("delta"), presence(3), expected_cost=common_pb2.ResourceVector(tokens=5)),
    Candidate("epsilon", 0, card("epsilon"), presence(9)),  # no Membership
]


@pytest.mark.req("MW-10.3-03", "MW-10.3-10", "MW-10.3-11")
def test_candidates_are_ranked_with_structured_criteria_and_offered_in_turn() -> None:
    ranked = rank(contract(), CANDIDATES)
    assert [r.candidate.agent_id for r in ranked if r.eligible] == ["delta", "alpha"]  # more free slots first
    assert [r.criteria.rank for r in ranked] == [1, 2, 3, 4, 5]
    beta = next(r for r in ranked if r.candidate.agent_id == "beta")
    assert [c.capability_id for c in beta.criteria.missing_capabilities] == [
        "code.python"
    ] and not beta.eligible
    epsilon = next(r for r in ranked if r.candidate.agent_id == "epsilon")
    assert not epsilon.criteria.authorization_eligible
    assert all(
        ":" in rule for r in ranked for rule in r.criteria.applied_policy_rules
    )  # rule ids, no reasoning
    first = sequential(ranked)
    assert first is not None and first.candidate.agent_id == "delta"
    after_decline = sequential(ranked, tried=["delta"])
    assert after_decline is not None and after_decline.candidate.agent_id == "alpha"
    assert sequential(ranked, tried=["delta", "alpha"]) is None


@pytest.mark.req("MW-10.3-04")
def test_urgent_placement_offers_a_bounded_set() -> None:
    ranked = rank(contract(), CANDIDATES)
    assert [r.candidate.agent_id for r in urgent_set(ranked, 5)] == ["delta", "alpha"]
    with pytest.raises(ValueError):
        urgent_set(ranked, 9)


def test_the_offer_carries_the_criteria_the_authority_requires() -> None:
    ranked = rank(builders.contract(NOW), [Candidate("worker", 4, card("worker"), presence(1))])
    body = offer_body(
        "root", ranked, to_timestamp(NOW + timedelta(minutes=5)), coordinator_epoch=1, offer_id="off-r"
    )
    assert [c.candidate_id for c in body.selection_criteria] == ["worker"]
    assert not isinstance(decide(BASE, "work_offer", body, "coord"), Rejected)


def test_each_ineligible_candidate_says_why() -> None:
    by_id = {r.candidate.agent_id: r for r in rank(contract(), [*CANDIDATES, Candidate("zeta", 7)])}
    assert {a: ineligibility(r) for a, r in by_id.items()} == {
        "alpha": "",
        "delta": "",
        "beta": "missing code.python >= 3.11",
        "gamma": "no fresh presence with a free slot",
        "epsilon": "no active Membership",
        "zeta": "no Agent Card in force",
    }


def made(*candidates: str) -> OfferMade:
    return OfferMade("off-1", candidates, (), 7, datetime(2026, 1, 1, tzinfo=UTC), "expired")


def declined(agent: str, offer_id: str = "off-1", work_item_id: str = "wi-1") -> event_pb2.Event:
    body = wp.WorkOfferDeclined(
        work_item_id=work_item_id,
        offer_id=offer_id,
        agent_id=agent,
        decline=wp.StructuredDecline(reason=wp.DECLINE_REASON_CAPACITY),
    )
    return event_pb2.Event(work_offer_declined=body)


@pytest.mark.req("MW-10.3-03", "MW-10.3-04")
def test_an_offer_ends_declined_only_when_every_candidate_declined() -> None:
    tracker = OfferTracker("wi-1", made("a", "b"))
    tracker.see(declined("a"))
    tracker.see(declined("b", offer_id="off-0"))  # another offer's answer
    tracker.see(declined("b", work_item_id="wi-2"))  # another WorkItem's
    assert tracker.ended is None  # b may still accept
    tracker.see(declined("b"))
    outcome, accepted = tracker.result()
    assert (outcome.ended, sorted(outcome.declines), accepted) == ("declined", ["a", "b"], None)


@pytest.mark.req("MW-10.3-04")
def test_the_first_acceptance_ends_an_offer_and_its_withdrawal_does_not_override_it() -> None:
    tracker = OfferTracker("wi-1", made("a", "b"))
    tracker.see(declined("a"))
    win = wp.WorkOfferAccepted(work_item_id="wi-1", offer_id="off-1", agent_id="b")
    tracker.see(event_pb2.Event(work_offer_accepted=win))
    gone = wp.WorkOffersWithdrawn(
        work_item_id="wi-1",
        offer_ids=["off-1"],
        reason=wp.OFFER_WITHDRAWAL_REASON_ACCEPTED_ELSEWHERE,
        winning_offer_id="off-1",
    )
    tracker.see(event_pb2.Event(work_offers_withdrawn=gone))
    outcome, accepted = tracker.result()
    assert (outcome.ended, outcome.accepted_by, accepted) == ("accepted", "b", win)


def test_an_offer_superseded_by_someone_else_ends_withdrawn_and_one_never_answered_expired() -> None:
    tracker = OfferTracker("wi-1", made("a"))
    gone = wp.WorkOffersWithdrawn(
        work_item_id="wi-1", offer_ids=["off-1"], reason=wp.OFFER_WITHDRAWAL_REASON_SUPERSEDED
    )
    tracker.see(event_pb2.Event(work_offers_withdrawn=gone))
    assert tracker.result()[0].ended == "withdrawn"
    assert OfferTracker("wi-1", made("a")).result()[0].ended == "expired"
