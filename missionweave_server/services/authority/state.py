"""Group state: the deterministic fold of a Group's events (ARCHITECTURE principle 1).

Plain dataclasses, no I/O. ``evolve`` in ``decider.py`` is the only code that changes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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
    # A just-in-time Worker (MW-8-06) whose offer was accepted: it ends when its obligations do.
    just_in_time: bool = False

    def lapsed(self, now: datetime) -> bool:
        """A provisional Membership that accepted no offer before its expiry (MW-8-06)."""
        return self.provisional and self.expires_at is not None and self.expires_at <= now


@dataclass
class ConversationState:
    conversation_id: str
    kind: int
    work_item_id: str = ""
    title: str = ""
    message_count: int = 0
    # RESTRICTED Conversations: who may read and post besides the MissionOwner and the Coordinator.
    participant_ids: tuple[str, ...] = ()
    linked_conversation_id: str = ""


@dataclass(slots=True)  # one per Message of every owned Group
class MessageState:
    """An accepted Message is immutable (MW-9.1-19); amendments are recorded beside it."""

    conversation_id: str
    author_id: str
    # 0 = as posted; else the MessageAmendmentKind of the latest amendment.
    latest_amendment: int = 0
    amendments: int = 0
    # Sequences of the events that carry its content: the post, then each correction.
    content_sequences: list[int] = field(default_factory=list)
    # Set once an erasure removed that content from stored history (MW-7.4-04).
    erased: bool = False


@dataclass
class CoordinatorLeaseState:
    agent_id: str
    coordinator_epoch: int
    session_epoch: int
    expires_at: datetime
    lease_duration_s: float
    renew_before_s: float
    reconciled: bool = True
    granted_at_sequence: int = 0


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
    latest_submission_event_id: str = ""
    approval_event_id: str = ""
    approval_revoked_event_id: str = ""
    follow_up_mission_ids: list[str] = field(default_factory=list)
    # Coordinator epochs ever appointed: a command from any but the current one is stale (MW-7.2-06).
    coordinator_agents: dict[int, str] = field(default_factory=dict)
    # The tree (spec 14): for children, the parent's Group and every ancestor's, root first.
    parent_group_id: str = ""
    ancestor_group_ids: tuple[str, ...] = ()
    root_owner_id: str = ""  # the root Mission's human owner (for a root: owner_id)
    depth: int = 0  # parent links from the root (OP-34)
    scope: Any = None  # missionweave.v1.MissionScope of a child (MW-14-04); None for a root
    mandatory: bool = False
    latest_submission_artifacts: tuple[Any, ...] = ()  # ArtifactRefs of the latest submission
    root_owner_approval_event_id: str = ""  # MW-14-10, for the latest submission

    @property
    def owner_id(self) -> str:
        return self.definition.owner_id


@dataclass
class OfferState:
    offer_id: str
    candidate_ids: tuple[str, ...]
    expires_at: datetime
    contract_revision: int
    open: bool = True


@dataclass
class OwnershipState:
    """MW-11.3-02: the owner, its ownership epoch, start deadline and the bounded ownership lease."""

    agent_id: str
    ownership_epoch: int
    start_deadline: datetime
    expires_at: datetime
    offer_id: str = ""


@dataclass
class ExecutionLeaseState:
    """MW-11.3-03: a stable lease id bound to agent, session, WorkItem, ownership epoch, start, expiry."""

    lease_id: str
    agent_id: str
    session_epoch: int
    ownership_epoch: int
    started_at: datetime
    expires_at: datetime
    renewals: int = 0
    # The current capability token bound to this lease (MW-11.3-06): rotated on renewal, gone with it.
    token_id: str = ""
    token_scope: Any = None  # missionweave.v1.ExecutionPermissions


@dataclass
class LeaseRecord:
    """One execution lease of a WorkItem as the Authority recorded it, kept after it ended: the
    historical lease a buffered offline command is checked against (MW-11.5-10, OP-05, OP-23)."""

    lease_id: str
    agent_id: str
    session_epoch: int
    ownership_epoch: int
    started_at: datetime
    expires_at: datetime  # the last expiry: renewals move it
    ended_at: datetime | None = None  # released, revoked or replaced (None: current, or only expired)
    end_kind: int = 0  # a missionweave.v1.LeaseEndKind once ended


# The lease history a WorkItem keeps (oldest dropped): enough for any lease a reconnecting Worker can
# still cite inside a grace window, bounded whatever the number of restarts.
MAX_LEASE_HISTORY = 8

SIX = ("financial_micros", "tokens", "tool_calls", "compute_ms", "wall_clock_ms", "side_effects")


@dataclass
class WorkItemState:
    """A WorkItem: its contract, state, offers, ownership, execution lease and usage."""

    work_item_id: str
    state: int
    # Required for the Mission's completion (MW-7.3-04); optional work does not block submission.
    required: bool = True
    title: str = ""
    contract: Any = None  # missionweave.v1.WorkContract (the current revision)
    contract_revision: int = 1
    conversation_id: str = ""
    parent_work_item_id: str = ""
    depends_on: tuple[str, ...] = ()
    revision: int = 1  # the aggregate revision (MW-10.2-05, OP-10)
    offers: dict[str, OfferState] = field(default_factory=dict)
    # Structured selection criteria per offer (MW-10.3-10), recorded again on the winning acceptance.
    offer_criteria: dict[str, list[Any]] = field(default_factory=dict)
    owner: OwnershipState | None = None
    last_ownership_epoch: int = 0
    lease: ExecutionLeaseState | None = None
    # Its execution leases by id, the current one included, in start order (at most MAX_LEASE_HISTORY).
    lease_history: dict[str, LeaseRecord] = field(default_factory=dict)
    # The latest execution approval: (contract revision, ownership epoch or 0 = any owner, expiry or None).
    execution_approved: tuple[int, int, datetime | None] | None = None
    attempts: int = 0
    used: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIX, 0))
    # What the current attempt (since its work.start) and the attempts after the first used, for the
    # contract's CostPolicy.per_attempt_limit and retry_limit (MW-11.4-08).
    attempt_used: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIX, 0))
    retry_used: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIX, 0))
    latest_submission_event_id: str = ""
    submitted_by: str = ""
    last_checkpoint_id: str = ""
    preemption_request_id: str = ""  # an open cooperative preemption request (MW-11.3-12)
    blockers: tuple[str, ...] = ()  # required resolutions while blocked
    retry_not_before: datetime | None = None  # backoff after a transient failure (MW-11.4-08)
    submitted_evidence_ids: tuple[str, ...] = ()
    accepted_evidence_ids: tuple[str, ...] = ()
    # Evidence of the current submission and its review, by id: (criterion id, result, producer).
    evidence: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    published_artifacts: tuple[tuple[str, int], ...] = ()  # (BLAKE3 hex, size) published under its leases
    submitted_artifacts: tuple[tuple[str, int], ...] = ()  # (BLAKE3 hex, size) named by its submissions
    # Messages in the WorkItem Conversation that raised a material ambiguity (MW-10.1-02/03).
    open_ambiguities: set[str] = field(default_factory=set)
    # Child Missions promoted from it, oldest first (spec 14); at most the last one runs.
    children: list[ChildLink] = field(default_factory=list)
    # The sequence of its work.authorized event: a member whose visibility starts later sees it
    # only if it takes part in it (D124, MW-8-07).
    created_sequence: int = 0

    @property
    def running_child(self) -> ChildLink | None:
        last = self.children[-1] if self.children else None
        return last if last is not None and last.running else None


@dataclass
class ChildLink:
    """A child Mission promoted from a WorkItem (MW-14-02), as the parent's Group records it."""

    child_mission_id: str
    child_group_id: str
    reserved: dict[str, int]  # the child's budget, held back from the WorkItem's and the Mission's
    mandatory: bool
    running: bool = True


@dataclass
class GrantState:
    """A delegation grant as recorded (MW-9.1-05), with what it has been charged (MW-9.1-11)."""

    grant_id: str
    grantee_id: str
    mission_id: str
    group_id: str
    target_work_item_id: str
    allowed: dict[str, str]  # capability id -> minimum version
    caps: dict[str, int]  # the six dimensions
    currency: str
    max_descendant_depth: int
    grantee_membership_epoch: int
    coordinator_epoch: int
    issuer_id: str
    granted_at: datetime
    expires_at: datetime
    revoked: bool = False
    record: Any = None  # the missionweave.v1.DelegationGrant as recorded (what read models show)
    # Running totals evolve keeps (D134), so that a check under the grant costs the same however many
    # WorkItems it holds: the budgets it was charged (GroupState.item_grants), and what those
    # WorkItems have used. Nothing per WorkItem here: a preview copies a grant it touches (D135).
    charged: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIX, 0))
    used: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIX, 0))


@dataclass
class ProposalState:
    proposal_id: str
    proposed_by: str
    open: bool = True


@dataclass(frozen=True)
class TransferGrant:
    """A MissionOwner's authorization to carry this Group's context into another Group (MW-13.3-07)."""

    target_group_id: str
    work_item_ids: tuple[str, ...]  # empty = the whole Mission


@dataclass
class GroupState:
    group_id: str
    head_sequence: int = 0
    mission: MissionRecord | None = None
    members: dict[str, MemberState] = field(default_factory=dict)
    conversations: dict[str, ConversationState] = field(default_factory=dict)
    # message id -> its record, to resolve replies and amendments.
    messages: dict[str, MessageState] = field(default_factory=dict)
    # Membership epochs are Group-wide and never reused, even across revoke and re-grant.
    last_membership_epoch: int = 0
    # Sequence of the last event that changed WorkItem state; reconciliation must cite at least it.
    last_work_change_sequence: int = 0
    work_items: dict[str, WorkItemState] = field(default_factory=dict)
    # authorization event id -> grant
    transfers: dict[str, TransferGrant] = field(default_factory=dict)
    proposals: dict[str, ProposalState] = field(default_factory=dict)
    # Delegation grants by id (MW-9.1-05), revoked ones included.
    grants: dict[str, GrantState] = field(default_factory=dict)
    # Six-dimension usage of the whole Mission (sum over its WorkItems).
    mission_used: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIX, 0))
    # Budget held back for running child Missions (spec 14): no charge may eat into it.
    reserved: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIX, 0))
    # Recorded approvals of deeper children (MW-14-06): event id -> (parent WorkItem, max depth).
    depth_approvals: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Indexes evolve keeps beside the entities (D134): a command's checks look up the few entries
    # they concern instead of scanning every WorkItem or Membership; a fold rebuilds them exactly.
    # WorkItem id -> grant id -> the budget the grant was charged for it: each WorkItem created or
    # offered under a grant counts once against it, at its latest size (MW-9.1-11), grants in the
    # order they were charged.
    item_grants: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    # The current capability token of each live execution lease -> its WorkItem.
    tokens: dict[str, str] = field(default_factory=dict)
    # Member id -> the unfinished WorkItems it owns, has a submission awaiting review on, or is a
    # candidate of an open offer of (whether that offer has expired is for the reader's clock).
    obligations: dict[str, set[str]] = field(default_factory=dict)
    # Active Memberships that may end by themselves: just-in-time or provisional ones (MW-8-06).
    jit_members: set[str] = field(default_factory=set)
    # What the Mission's WorkItems hold of its budget (D162), per dimension: an unfinished WorkItem
    # its budget (or its usage, if larger), a verified, cancelled or failed one what it used.
    committed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIX, 0))
