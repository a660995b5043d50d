"""The Coordinator's candidate ranking and offer helpers (MW-10.3-03, -04, -10, -11), pure."""

from __future__ import annotations

from datetime import timedelta

import pytest

from missionweave.clock import to_timestamp
from missionweave.errors import Rejected
from missionweave.sdk.placement import Candidate, offer_body, rank, sequential, urgent_set
from missionweave.v1 import agent_card_pb2 as acpb
from missionweave.v1 import common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.test_core_delegation import BASE, NOW, decide

PY = membership_pb2.Capability(capability_id="code.python", version="3.11")


def card(agent: str, version: str = "3.12.0") -> acpb.AgentCard:
    return acpb.AgentCard(agent_id=agent, card_version="1.0.0", max_concurrency=4,
                          capabilities=[membership_pb2.Capability(capability_id="code.python", version=version)])


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
    assert [c.capability_id for c in beta.criteria.missing_capabilities] == ["code.python"] and not beta.eligible
    epsilon = next(r for r in ranked if r.candidate.agent_id == "epsilon")
    assert not epsilon.criteria.authorization_eligible
    assert all(":" in rule for r in ranked for rule in r.criteria.applied_policy_rules)  # rule ids, no reasoning
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
    body = offer_body("root", ranked, to_timestamp(NOW + timedelta(minutes=5)), coordinator_epoch=1, offer_id="off-r")
    assert [c.candidate_id for c in body.selection_criteria] == ["worker"]
    assert not isinstance(decide(BASE, "work_offer", body, "coord"), Rejected)
