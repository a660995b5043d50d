"""Group state: the deterministic fold of a Group's events (ARCHITECTURE principle 1).

Plain dataclasses, no I/O. ``evolve`` in ``decider.py`` is the only code that changes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from missionweave.v1 import mission_pb2


@dataclass(frozen=True)
class IdentityInfo:
    """What the pure core needs to know about a registered identity (looked up by the shell)."""

    identity_id: str
    kind: int
    org_admin: bool = False
    session_epoch: int = 0


@dataclass
class MemberState:
    member_id: str
    role: int
    membership_epoch: int
    visibility_start_sequence: int
    capabilities: tuple[tuple[str, str], ...] = ()
    active: bool = True
    provisional: bool = False
    expires_at: datetime | None = None


@dataclass
class ConversationState:
    conversation_id: str
    kind: int
    work_item_id: str = ""
    title: str = ""
    message_count: int = 0


@dataclass
class CoordinatorLeaseState:
    agent_id: str
    coordinator_epoch: int
    session_epoch: int
    expires_at: datetime
    lease_duration_s: float
    renew_before_s: float
    reconciled: bool = True


@dataclass
class MissionRecord:
    mission_id: str
    kind: int
    definition: mission_pb2.MissionDefinition
    state: int
    revision: int
    planning_conversation_id: str
    created_at: datetime
    coordinator: CoordinatorLeaseState | None = None
    follows_up_mission_id: str = ""
    parent_mission_id: str = ""
    parent_work_item_id: str = ""


@dataclass
class GroupState:
    group_id: str
    head_sequence: int = 0
    mission: MissionRecord | None = None
    members: dict[str, MemberState] = field(default_factory=dict)
    conversations: dict[str, ConversationState] = field(default_factory=dict)
    # message id -> conversation id, to resolve replies and amendments.
    messages: dict[str, str] = field(default_factory=dict)
    # Membership epochs are Group-wide and never reused, even across revoke and re-grant.
    last_membership_epoch: int = 0
