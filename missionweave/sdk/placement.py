"""The Coordinator's side of placement (MW-10.3-01..04, -10, -11): rank candidate Workers from
their Agent Cards, presence, capability match, expected cost and reliability Evidence, and record
the structured selection criteria an offer must carry.

Pure: what the Coordinator already read (cards, presence) goes in, offers' bodies come out. An
exclusive WorkItem goes to the highest-ranked eligible Worker first (``sequential``), the next one
after a decline or expiry; urgent placement offers a bounded set at once (``urgent_set``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf.timestamp_pb2 import Timestamp

from missionweave.kernel.capabilities import missing_capability
from missionweave.v1 import agent_card_pb2, common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp

# Rule ids recorded in SelectionCriteria.applied_policy_rules (ids, never reasoning, MW-10.3-11).
RULE_CAPABILITY = "policy:capability-match"
RULE_AVAILABILITY = "policy:fresh-presence-available"
RULE_LOAD = "policy:most-free-slots"
RULE_COST = "policy:lowest-expected-cost"
RULE_RELIABILITY = "policy:reliability-evidence"
URGENT_SET_MAX = 8  # the Authority's bound on a candidate set (MW-10.3-04)


@dataclass(frozen=True)
class Candidate:
    """What the Coordinator knows of one possible Worker."""

    agent_id: str
    membership_epoch: int  # its active Membership in the Group (0: none)
    card: agent_card_pb2.AgentCard | None = None
    presence: agent_card_pb2.AgentPresence | None = None
    expected_cost: common_pb2.ResourceVector = field(default_factory=common_pb2.ResourceVector)
    reliability: Sequence[wp.ReliabilityRecord] = ()


@dataclass(frozen=True)
class Ranked:
    candidate: Candidate
    eligible: bool
    criteria: wp.SelectionCriteria


def _cost(vector: common_pb2.ResourceVector) -> tuple[int, ...]:
    return (
        vector.financial_micros,
        vector.tokens,
        vector.tool_calls,
        vector.compute_ms,
        vector.wall_clock_ms,
        vector.side_effects,
    )


def rank(contract: wp.WorkContract, candidates: Iterable[Candidate]) -> list[Ranked]:
    """Every candidate with its structured criteria, best first: eligible ones (a Membership, every
    required capability in its card at version, fresh presence with a free slot), then by free
    slots, expected cost and the amount of reliability Evidence; ties by agent id."""
    scored = []
    for c in candidates:
        declared: Mapping[str, str] = (
            {cap.capability_id: cap.version for cap in c.card.capabilities} if c.card else {}
        )
        missing = [
            cap for cap in contract.required_capabilities if missing_capability(declared, [cap]) is not None
        ]
        matched = [
            membership_pb2.Capability(capability_id=cap.capability_id, version=declared[cap.capability_id])
            for cap in contract.required_capabilities
            if cap not in missing
        ]
        p = c.presence
        available = (
            p is not None
            and p.fresh
            and p.availability == agent_card_pb2.PRESENCE_AVAILABILITY_AVAILABLE
            and p.free_slots > 0
        )
        authorized = c.membership_epoch > 0
        eligible = authorized and c.card is not None and not missing and available
        basis = [f"membership-epoch:{c.membership_epoch}"] if authorized else []
        if c.card is not None:
            basis.append(f"agent-card:{c.card.card_version}")
        criteria = wp.SelectionCriteria(
            candidate_id=c.agent_id,
            matched_capabilities=matched,
            missing_capabilities=missing,
            authorization_eligible=authorized,
            authorization_basis=basis,
            expected_cost=c.expected_cost,
            reliability=list(c.reliability),
            applied_policy_rules=[RULE_CAPABILITY, RULE_AVAILABILITY, RULE_LOAD, RULE_COST, RULE_RELIABILITY],
        )
        key = (
            not eligible,
            -(p.free_slots if p is not None else 0),
            _cost(c.expected_cost),
            -len(c.reliability),
            c.agent_id,
        )
        scored.append((key, Ranked(c, eligible, criteria)))
    out = [r for _, r in sorted(scored, key=lambda pair: pair[0])]
    for n, r in enumerate(out, start=1):
        r.criteria.rank = n
    return out


def sequential(ranked: Sequence[Ranked], tried: Iterable[str] = ()) -> Ranked | None:
    """The next eligible candidate for an exclusive offer (MW-10.3-03), skipping those that already
    declined or let their offer expire."""
    done = set(tried)
    return next((r for r in ranked if r.eligible and r.candidate.agent_id not in done), None)


def urgent_set(ranked: Sequence[Ranked], size: int) -> list[Ranked]:
    """The bounded candidate set for urgent placement (MW-10.3-04): the best ``size`` eligible."""
    if not 1 <= size <= URGENT_SET_MAX:
        raise ValueError(f"an urgent candidate set has 1..{URGENT_SET_MAX} candidates")
    return [r for r in ranked if r.eligible][:size]


def offer_body(
    work_item_id: str,
    chosen: Sequence[Ranked],
    expires_at: Timestamp,
    *,
    coordinator_epoch: int,
    offer_id: str = "",
) -> wp.WorkOffer:
    """A `work.offer` to ``chosen`` carrying each one's selection criteria (MW-10.3-10)."""
    body = wp.WorkOffer(
        work_item_id=work_item_id,
        offer_id=offer_id,
        candidate_ids=[r.candidate.agent_id for r in chosen],
        selection_criteria=[r.criteria for r in chosen],
        coordinator_epoch=coordinator_epoch,
    )
    body.expires_at.CopyFrom(expires_at)
    return body
