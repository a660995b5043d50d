"""MW-10.2-05: the generated matrix. Every WorkItem state x every transition command is either
accepted (the table allows it) or refused with the exact reason: TERMINAL_STATE for verified and
cancelled (MW-10.2-02), INVALID_TRANSITION otherwise. Every other precondition is satisfied, so
only the state decides."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import (
    ExecutionLeaseState,
    GroupState,
    IdentityInfo,
    OfferState,
    OwnershipState,
)
from tests import builders
from tests.store_double import as_if_uploaded

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
IDS = {
    "alice": IdentityInfo("alice", common_pb2.IDENTITY_KIND_HUMAN, session_epoch=1),
    "coord": IdentityInfo("coord", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
    "worker": IdentityInfo("worker", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
}
CTX = decider.DecisionContext(NOW, IDS)
WS = wp.WorkItemState
STATES = [s for s in WS.values() if s]
TERMINAL = {WS.WORK_ITEM_STATE_VERIFIED, WS.WORK_ITEM_STATE_CANCELLED}
UNFINISHED = {
    WS.WORK_ITEM_STATE_OPEN,
    WS.WORK_ITEM_STATE_OFFERED,
    WS.WORK_ITEM_STATE_QUEUED,
    WS.WORK_ITEM_STATE_ACTIVE,
    WS.WORK_ITEM_STATE_BLOCKED,
    WS.WORK_ITEM_STATE_SUBMITTED,
}
ACTORS = {"alice": 1, "coord": 2, "worker": 3}  # membership epochs
_n = iter(range(1, 10**6))


def command(kind: str, body: object, actor: str) -> command_pb2.Command:
    c = command_pb2.Command(
        command_id=f"c{next(_n)}",
        group_id="grp_m",
        actor_id=actor,
        session_epoch=1,
        membership_epoch=ACTORS[actor],
        issued_at=to_timestamp(NOW),
    )
    getattr(c, kind).CopyFrom(body)
    return c


def apply(state: GroupState | None, c: command_pb2.Command) -> GroupState:
    decision = decider.decide(state, c, as_if_uploaded(state, c, CTX))
    assert not isinstance(decision, Rejected), decision
    for event in decision:
        state = decider.evolve(state, event)
    assert state is not None
    return state


def base() -> GroupState:
    create = command("mission_create", builders.mission_create("alice", "coord", NOW), "alice")
    create.membership_epoch = 0
    state = apply(None, create)
    grant = membership_pb2.MembershipGrant(member_id="worker", role=membership_pb2.MEMBER_ROLE_WORKER)
    state = apply(state, command("membership_grant", grant, "alice"))
    body = wp.WorkAuthorize(
        work_item_id="wi", title="t", contract=builders.contract(NOW), coordinator_epoch=1
    )
    return apply(state, command("work_authorize", body, "coord"))


def equipped(state_value: int, *, owner: bool, lease: bool, offer: bool) -> GroupState:
    """A Group whose WorkItem is in ``state_value`` with exactly the records a command needs."""
    state = copy.deepcopy(BASE)
    item = state.work_items["wi"]
    item.state = state_value
    later = NOW + timedelta(minutes=5)
    if offer:
        item.offers["offer-1"] = OfferState("offer-1", ("worker",), later, item.contract_revision)
    if owner:
        item.owner = OwnershipState("worker", 1, later, later, "offer-1")
        item.last_ownership_epoch = 1
    if lease:
        item.lease = ExecutionLeaseState("lease-1", "worker", 1, 1, NOW, later)
    item.latest_submission_event_id = "evt_sub"
    item.submitted_by = "worker"
    item.evidence = {"ev-1": ("balances", wp.EVIDENCE_RESULT_PASS, "worker")}
    return state


BASE = base()
SUBMIT = wp.WorkSubmit(
    work_item_id="wi",
    lease_id="lease-1",
    ownership_epoch=1,
    contract_revision=1,
    artifacts=[builders.artifact()],
    evidence=[builders.evidence()],
)
BLOCKER = wp.Blocker(blocker_id="b", kind=wp.BLOCKER_KIND_DEPENDENCY, required_resolution="input")
# command kind -> (body, actor, records needed, states the table allows it from)
TRANSITIONS: dict[str, tuple[object, str, dict[str, bool], set[int]]] = {
    "work_offer": (
        wp.WorkOffer(
            work_item_id="wi",
            offer_id="offer-2",
            candidate_ids=["worker"],
            expires_at=to_timestamp(NOW + timedelta(minutes=1)),
            selection_criteria=[builders.selection("worker")],
            coordinator_epoch=1,
        ),
        "coord",
        {"owner": False, "lease": False, "offer": False},
        {
            WS.WORK_ITEM_STATE_OPEN,
            WS.WORK_ITEM_STATE_OFFERED,
            WS.WORK_ITEM_STATE_QUEUED,
            WS.WORK_ITEM_STATE_ACTIVE,
            WS.WORK_ITEM_STATE_BLOCKED,
            WS.WORK_ITEM_STATE_FAILED,
        },  # T03 (with no live owner)
    ),
    "work_accept_offer": (
        wp.WorkAcceptOffer(work_item_id="wi", offer_id="offer-1", contract_revision=1),
        "worker",
        {"owner": False, "lease": False, "offer": True},
        {WS.WORK_ITEM_STATE_OFFERED},  # T04
    ),
    "approval_grant_execution": (
        wp.ApprovalGrantExecution(work_item_id="wi", contract_revision=1, ownership_epoch=1),
        "alice",
        {"owner": True, "lease": False, "offer": False},
        {WS.WORK_ITEM_STATE_QUEUED},  # T06
    ),
    "work_start": (
        wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-2"),
        "worker",
        {"owner": True, "lease": False, "offer": False},
        {WS.WORK_ITEM_STATE_QUEUED},  # T07
    ),
    "work_checkpoint": (
        wp.WorkCheckpoint(
            work_item_id="wi",
            lease_id="lease-1",
            ownership_epoch=1,
            checkpoint=wp.Checkpoint(checkpoint_id="ck"),
        ),
        "worker",
        {"owner": True, "lease": True, "offer": False},
        {WS.WORK_ITEM_STATE_ACTIVE},  # T08
    ),
    "work_block": (
        wp.WorkBlock(
            work_item_id="wi",
            lease_id="lease-1",
            ownership_epoch=1,
            checkpoint=wp.Checkpoint(checkpoint_id="ck"),
            blockers=[BLOCKER],
        ),
        "worker",
        {"owner": True, "lease": True, "offer": False},
        {WS.WORK_ITEM_STATE_ACTIVE},  # T09
    ),
    "work_unblock": (
        wp.WorkUnblock(work_item_id="wi", coordinator_epoch=1, resolution="resolved"),
        "coord",
        {"owner": True, "lease": False, "offer": False},
        {WS.WORK_ITEM_STATE_BLOCKED},  # T10
    ),
    "work_submit": (
        SUBMIT,
        "worker",
        {"owner": True, "lease": True, "offer": False},
        {WS.WORK_ITEM_STATE_ACTIVE},
    ),  # T11
    "work_accept_result": (
        wp.WorkAcceptResult(work_item_id="wi", coordinator_epoch=1, submission_event_id="evt_sub"),
        "coord",
        {"owner": False, "lease": False, "offer": False},
        {WS.WORK_ITEM_STATE_SUBMITTED},  # T12
    ),
    "work_fail": (
        wp.WorkFail(
            work_item_id="wi",
            coordinator_epoch=1,
            kind=wp.WORK_FAILURE_KIND_PERMANENT,
            evidence=[builders.evidence()],
            reason="r",
        ),
        "coord",
        {"owner": False, "lease": False, "offer": False},
        UNFINISHED,  # T13
    ),
    "work_cancel": (
        wp.WorkCancel(work_item_id="wi", coordinator_epoch=1, reason="r"),
        "coord",
        {"owner": False, "lease": False, "offer": False},
        UNFINISHED,  # T14
    ),
    "work_renew_lease": (
        wp.WorkRenewLease(work_item_id="wi", lease_id="lease-1", ownership_epoch=1),
        "worker",
        {"owner": True, "lease": True, "offer": False},
        {WS.WORK_ITEM_STATE_ACTIVE},  # MW-11.3-04
    ),
}


@pytest.mark.req(
    "MW-10.2-05",
    "MW-10.2-02",
    "MW-10.2-T03",
    "MW-10.2-T04",
    "MW-10.2-T06",
    "MW-10.2-T07",
    "MW-10.2-T08",
    "MW-10.2-T09",
    "MW-10.2-T10",
    "MW-10.2-T11",
    "MW-10.2-T12",
    "MW-10.2-T13",
    "MW-10.2-T14",
)
@pytest.mark.parametrize("kind", sorted(TRANSITIONS))
@pytest.mark.parametrize(
    "state_value", STATES, ids=[WS.Name(s).removeprefix("WORK_ITEM_STATE_").lower() for s in STATES]
)
def test_state_by_transition_matrix(kind: str, state_value: int) -> None:
    body, actor, records, allowed = TRANSITIONS[kind]
    state = equipped(state_value, **records)
    before = copy.deepcopy(state)
    c = command(kind, body, actor)
    decision = decider.decide(state, c, as_if_uploaded(state, c, CTX))
    assert state == before
    if state_value in allowed:
        assert not isinstance(decision, Rejected), f"{kind} from {WS.Name(state_value)}: {decision}"
        for event in decision:
            state = decider.evolve(state, event)  # and the events apply cleanly
    else:
        assert isinstance(decision, Rejected), f"{kind} from {WS.Name(state_value)} must be refused"
        expected = "TERMINAL_STATE" if state_value in TERMINAL else "INVALID_TRANSITION"
        assert common_pb2.RejectionReason.Name(decision.reason) == f"REJECTION_REASON_{expected}", (
            decision.message
        )
