"""One Group driven through the pure core for the WorkItem rule tests (offers, acceptance, start,
leases, preemption, proposals and contracts): a Mission, its Coordinator, three Workers and an
Observer, and one authorized WorkItem ``wi`` that the tests offer, accept and start."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2, event_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState, IdentityInfo
from tests import builders
from tests.core_group import CoreGroup, evolved

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
AGENT, HUMAN = common_pb2.IDENTITY_KIND_AGENT, common_pb2.IDENTITY_KIND_HUMAN
NAMES = ("alice", "coord", "worker", "w2", "w3", "obs", "m1", "m2", "m3", "m4", "m5")
IDS = {n: IdentityInfo(n, HUMAN if n == "alice" else AGENT, session_epoch=1) for n in NAMES}
CTX = decider.DecisionContext(NOW, IDS)
R = common_pb2.RejectionReason
Role = membership_pb2.MemberRole
WS = wp.WorkItemState
GROUP = CoreGroup("grp_w", CTX, NOW)
PY = membership_pb2.Capability(capability_id="code.python", version="3.12")


def at(minutes: float) -> datetime:
    return NOW + timedelta(minutes=minutes)


def ctx_at(minutes: float, **fields: object) -> decider.DecisionContext:
    """The context ``minutes`` after NOW (identities as in CTX)."""
    return decider.DecisionContext(at(minutes), IDS, **fields)  # type: ignore[arg-type]


def ts(minutes: float) -> object:
    return to_timestamp(at(minutes))


def _base() -> GroupState:
    state = GROUP.run(None, "mission_create", builders.mission_create("alice", "coord", NOW), "alice")
    for member, role, caps in (
        ("worker", Role.MEMBER_ROLE_WORKER, [PY]),
        ("w2", Role.MEMBER_ROLE_WORKER, [PY]),
        ("w3", Role.MEMBER_ROLE_WORKER, []),
        ("obs", Role.MEMBER_ROLE_OBSERVER, []),
        *((m, Role.MEMBER_ROLE_WORKER, []) for m in ("m1", "m2", "m3", "m4", "m5")),
    ):
        grant = membership_pb2.MembershipGrant(member_id=member, role=role, capabilities=caps)
        state = GROUP.run(state, "membership_grant", grant, "alice")
    return GROUP.run(state, "work_authorize", authorize("wi"), "coord")


def authorize(work_item_id: str, **overrides: object) -> wp.WorkAuthorize:
    body = wp.WorkAuthorize(
        work_item_id=work_item_id,
        title=f"title {work_item_id}",
        contract=builders.contract(NOW),
        coordinator_epoch=1,
    )
    return builders.with_overrides(body, overrides)


def offer(*candidates: str, offer_id: str = "off-1", minutes: float = 5, **overrides: object) -> wp.WorkOffer:
    cands = candidates or ("worker",)
    body = wp.WorkOffer(
        work_item_id="wi",
        offer_id=offer_id,
        candidate_ids=list(cands),
        expires_at=to_timestamp(at(minutes)),
        selection_criteria=[builders.selection(c) for c in cands],
        coordinator_epoch=1,
    )
    return builders.with_overrides(body, overrides)


def accept(offer_id: str = "off-1", revision: int = 1, **overrides: object) -> wp.WorkAcceptOffer:
    body = wp.WorkAcceptOffer(work_item_id="wi", offer_id=offer_id, contract_revision=revision)
    return builders.with_overrides(body, overrides)


def start(lease_id: str = "lease-1", epoch: int = 1, **overrides: object) -> wp.WorkStart:
    body = wp.WorkStart(work_item_id="wi", ownership_epoch=epoch, lease_id=lease_id)
    return builders.with_overrides(body, overrides)


BASE = _base()


def base() -> GroupState:
    return copy.deepcopy(BASE)


def offered(*candidates: str) -> GroupState:
    return GROUP.run(base(), "work_offer", offer(*candidates), "coord")


def queued(agent: str = "worker") -> GroupState:
    """``wi`` accepted by ``agent`` (ownership epoch 1), not started."""
    return GROUP.run(offered(agent), "work_accept_offer", accept(), agent)


def active(agent: str = "worker") -> GroupState:
    """``wi`` started by ``agent`` under lease ``lease-1``."""
    return GROUP.run(queued(agent), "work_start", start(), agent)


def events(
    state: GroupState | None, kind: str, body: object, actor: str, ctx: decider.DecisionContext | None = None
) -> list[event_pb2.Event]:
    decision = GROUP.decide(state, kind, body, actor, ctx)
    assert not isinstance(decision, Rejected), f"{kind} by {actor}: {decision!r}"
    return list(decision)


def after(state: GroupState, decision: list[event_pb2.Event]) -> GroupState:
    return evolved(state, decision)


def refused(
    state: GroupState,
    kind: str,
    body: object,
    actor: str,
    ctx: decider.DecisionContext | None = None,
) -> Rejected:
    return GROUP.refused(state, kind, body, actor, ctx)
