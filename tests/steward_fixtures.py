"""A Group for the pure-core rule tests of Conversations, Memberships and delegation: the owner,
the Coordinator, one member per granted role and Organization identities, driven through
decider.decide/evolve only (tests/core_group.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2, event_pb2, membership_pb2, mission_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState, IdentityInfo
from tests import builders
from tests.core_group import CoreGroup

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
R = common_pb2.RejectionReason
Role = membership_pb2.MemberRole
AGENT, HUMAN = common_pb2.IDENTITY_KIND_AGENT, common_pb2.IDENTITY_KIND_HUMAN
GROUP_ID = "grp_rules"
# Granted after the Mission's creation, in this order (epochs 3, 4, 5, ...).
GRANTED = {
    "worker": Role.MEMBER_ROLE_WORKER,
    "rev": Role.MEMBER_ROLE_REVIEWER,
    "lead": Role.MEMBER_ROLE_WORK_DELEGATE,
    "obs": Role.MEMBER_ROLE_OBSERVER,
    "admin": Role.MEMBER_ROLE_WORKER,  # an Organization administrator who also holds a Membership
}
IDS = {
    "alice": IdentityInfo("alice", HUMAN, session_epoch=1),
    "coord": IdentityInfo("coord", AGENT, session_epoch=1),
    "coord2": IdentityInfo("coord2", AGENT, session_epoch=1),
    "worker": IdentityInfo("worker", AGENT, session_epoch=1),
    "worker2": IdentityInfo("worker2", AGENT, session_epoch=1),
    "rev": IdentityInfo("rev", AGENT, session_epoch=1),
    "lead": IdentityInfo("lead", AGENT, session_epoch=1),
    "obs": IdentityInfo("obs", AGENT, session_epoch=1),
    "admin": IdentityInfo("admin", HUMAN, org_admin=True, session_epoch=1),
    "ops": IdentityInfo("ops", common_pb2.IDENTITY_KIND_CONTROL_PLANE, session_epoch=1),
}
CTX = decider.DecisionContext(NOW, IDS)
LATE = decider.DecisionContext(NOW + timedelta(hours=2), IDS)  # after the Coordinator's 1 h lease
GROUP = CoreGroup(GROUP_ID, CTX, NOW)


def base() -> GroupState:
    """The Mission (Coordinator lease of 1 h) with every member of GRANTED."""
    create = builders.mission_create("alice", "coord", NOW)
    create.coordinator_renewal.lease_duration.FromSeconds(3_600)
    state = GROUP.run(None, "mission_create", create, "alice")
    for member, role in GRANTED.items():
        state = GROUP.run(
            state, "membership_grant", membership_pb2.MembershipGrant(member_id=member, role=role), "alice"
        )
    return state


BASE = base()
PLANNING: str = BASE.mission.planning_conversation_id  # type: ignore[union-attr]


def events(
    state: GroupState | None, kind: str, body: object, actor: str, ctx: decider.DecisionContext | None = None
) -> list[event_pb2.Event]:
    decision = GROUP.decide(state, kind, body, actor, ctx)
    assert not isinstance(decision, Rejected), decision
    return decision


def replaced(state: GroupState = BASE) -> GroupState:
    """coord replaced by coord2 once its lease lapsed (at LATE; coord keeps its role, not the lease)."""
    body = mission_pb2.MissionReplaceCoordinator(coordinator_id="coord2", replaced_coordinator_epoch=1)
    return GROUP.run(state, "mission_replace_coordinator", body, "alice", LATE)


def cancelled(state: GroupState = BASE) -> GroupState:
    return GROUP.run(state, "mission_cancel", mission_pb2.MissionCancel(reason="no longer needed"), "alice")


def rejection(decision: object) -> tuple[str, dict[str, str]]:
    assert isinstance(decision, Rejected), f"accepted: {decision!r}"
    return decision.reason_name, decision.metadata
