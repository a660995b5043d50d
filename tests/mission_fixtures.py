"""Shared setup of the Mission lifecycle tests (tests/test_core_mission_*.py): identities, a root
Mission driven through decide/evolve to each lifecycle state, and exact-event helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf.message import Message

from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2, event_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState, IdentityInfo
from tests import builders
from tests.core_group import CoreGroup, evolved

R = common_pb2.RejectionReason
MS = mission_pb2.MissionState
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LATE = NOW + timedelta(minutes=6)  # after the default 5-minute Coordinator lease
HUMAN, AGENT, CP = (
    common_pb2.IDENTITY_KIND_HUMAN,
    common_pb2.IDENTITY_KIND_AGENT,
    common_pb2.IDENTITY_KIND_CONTROL_PLANE,
)
IDS = {
    "alice": IdentityInfo("alice", HUMAN, session_epoch=1),
    "bob": IdentityInfo("bob", HUMAN, session_epoch=1),
    "coord": IdentityInfo("coord", AGENT, session_epoch=1),
    "coord2": IdentityInfo("coord2", AGENT, session_epoch=1),
    "coord3": IdentityInfo("coord3", AGENT, session_epoch=3),
    "worker": IdentityInfo("worker", AGENT, session_epoch=1),
    "ops": IdentityInfo("ops", CP, session_epoch=1),
    "admin": IdentityInfo("admin", HUMAN, session_epoch=1, org_admin=True),
}
CTX = decider.DecisionContext(NOW, IDS)
G = CoreGroup("grp_a", CTX, NOW)


def ctx(now: datetime = NOW, *linked: GroupState, **kw: object) -> decider.DecisionContext:
    return decider.DecisionContext(now, IDS, {s.group_id: s for s in linked}, **kw)  # type: ignore[arg-type]


def accepted(decision: decider.Decision) -> list[event_pb2.Event]:
    assert not isinstance(decision, Rejected), decision
    return decision


def payloads(events: list[event_pb2.Event]) -> list[tuple[str, Message]]:
    """Each event's type and payload message: the contract an event carries."""
    out = []
    for e in events:
        field = e.WhichOneof("payload")
        assert field is not None
        out.append((e.type, getattr(e, field)))
    return out


def fold_onto(state: GroupState | None, events: list[event_pb2.Event]) -> GroupState:
    return evolved(state, events)


def active(group: CoreGroup = G, owner: str = "alice") -> GroupState:
    return group.run(None, "mission_create", builders.mission_create(owner, "coord", NOW), owner)


def submit_body(state: GroupState, **kw: object) -> mission_pb2.MissionSubmitForApproval:
    assert state.mission is not None
    fields: dict[str, object] = {"coordinator_epoch": 1, "mission_revision": state.mission.revision}
    return mission_pb2.MissionSubmitForApproval(**{**fields, **kw})  # type: ignore[arg-type]


def awaiting(group: CoreGroup = G) -> GroupState:
    state = active(group)
    return group.run(
        state, "mission_submit_for_approval", submit_body(state, artifacts=[builders.artifact("b")]), "coord"
    )


def approved(group: CoreGroup = G) -> GroupState:
    state = awaiting(group)
    assert state.mission is not None
    body = mission_pb2.MissionApprove(
        submission_event_id=state.mission.latest_submission_event_id, comment="fine"
    )
    return group.run(state, "mission_approve", body, "alice")


def authorized(state: GroupState, group: CoreGroup = G, *names: str) -> GroupState:
    """WorkItems authorized by the Coordinator (their contract from tests/builders.py, with a budget
    small enough that 32 of them fit in the Mission's, D162)."""
    for name in names:
        contract = builders.contract(NOW)
        contract.budget.tool_calls = 10
        body = wp.WorkAuthorize(work_item_id=name, title=name, contract=contract, coordinator_epoch=1)
        state = group.run(state, "work_authorize", body, "coord")
    return state
