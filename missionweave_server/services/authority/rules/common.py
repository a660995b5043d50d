"""What every rule module shares: the decision context, the event emitter and common checks.

Pure: no I/O, no wall clock, no randomness. Event ids derive from (group, command, index), times
come from ``ctx.now``, identities and other Groups' states from the context the shell prepares.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from google.protobuf.message import Message

from missionweave.kernel import ids
from missionweave.kernel.clock import from_timestamp, to_timestamp
from missionweave.kernel.digests import HEX64
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2, membership_pb2, mission_pb2, work_pb2
from missionweave_server.services.authority.state import SIX, GroupState, IdentityInfo, MissionRecord

R = common_pb2.RejectionReason
Role = membership_pb2.MemberRole
Kind = common_pb2.IdentityKind
MS = mission_pb2.MissionState

MAX_TEXT_BYTES = 16 * 1024
MAX_DATA_JSON_BYTES = 16 * 1024
MAX_REASON_CHARS = 4096
MAX_REFS = 32
# A Message with this topic in a WorkItem Conversation raises a material ambiguity (MW-10.1-02):
# the WorkItem cannot be accepted until an amended contract resolves it (MW-10.1-03/04).
AMBIGUITY_TOPIC = "ambiguity"
DEFAULT_LEASE = timedelta(minutes=5)
DEFAULT_RENEW_BEFORE = timedelta(minutes=1)
MIN_LEASE = timedelta(seconds=5)
MAX_LEASE = timedelta(hours=24)
TERMINAL_MISSION_STATES = frozenset(
    {MS.MISSION_STATE_APPROVED, MS.MISSION_STATE_CANCELLED, MS.MISSION_STATE_FAILED}
)


@dataclass(frozen=True)
class StoredArtifact:
    """What the shell verified about an artifact a command publishes (the core never reads blobs)."""

    content_digest: str
    size_bytes: int
    manifest_digest: str  # BLAKE3 of the producer-signed manifest envelope, verified by the shell
    producer_agent_id: str
    source_digests: tuple[str, ...] = ()


@dataclass(frozen=True)
class HeldManifest:
    """A manifest the command's actor signed for this Group, as the artifact store answered (D161)."""

    manifest_digest: str
    work_item_id: str  # empty when the manifest names no WorkItem
    mission_id: str
    source_digests: tuple[str, ...] = ()


@dataclass(frozen=True)
class HeldArtifact:
    """What the artifact store holds of a blob a command names as a deliverable or as Evidence:
    its verified size and the manifests the actor signed for this Group. Not held: absent."""

    size_bytes: int
    manifests: tuple[HeldManifest, ...] = ()


@dataclass(frozen=True)
class OrganizationPolicy:
    """The Organization's collaboration policy, as far as the Group rules consult it (operators set
    it: Settings, docs/configuration.md)."""

    # The deepest a delegated WorkItem may sit below its grant's scope root (MW-9.1-12).
    max_delegation_depth: int = 3
    # The default maximum depth of a Mission tree (MW-14-05; the root is at depth 0, OP-34): deeper
    # children need a recorded approval (MW-14-06).
    max_mission_depth: int = 2


@dataclass(frozen=True)
class CardInfo:
    """What a decision needs of an agent's Agent Card in force (MW-11.1-13)."""

    card_version: str
    capabilities: Mapping[str, str]  # capability id -> version declared
    max_concurrency: int


@dataclass(frozen=True)
class DecisionContext:
    """Everything ``decide`` may consult besides the state and the command."""

    now: datetime
    identities: Mapping[str, IdentityInfo]
    # Durable states of other Groups the command links to (follow-ups, revocations), by Group id.
    linked: Mapping[str, GroupState] = field(default_factory=dict)
    # The signed envelope the command arrived in, for events that keep the signer's own signature
    # (approvals and change requests, MW-7.3-06). None when deciding outside the shell.
    envelope: common_pb2.SignedEnvelope | None = None
    # Artifacts the command publishes, stored and with a verified manifest, by BLAKE3 hex.
    artifacts: Mapping[str, StoredArtifact] = field(default_factory=dict)
    policy: OrganizationPolicy = field(default_factory=OrganizationPolicy)
    # The Agent Card in force of each agent the command's kind names in ``card_holders`` (agents
    # without one are absent).
    cards: Mapping[str, CardInfo] = field(default_factory=dict)
    # The blobs the command names as deliverables or Evidence (its kind's ``named_artifacts``) that
    # the artifact store holds, by BLAKE3 hex (D161).
    held: Mapping[str, HeldArtifact] = field(default_factory=dict)


Handler = Callable[[GroupState | None, command_pb2.Command, DecisionContext, "Emitter"], None]
Applier = Callable[[GroupState, event_pb2.Event], None]


def _none(command: command_pb2.Command) -> tuple[str, ...]:
    return ()


def _no_artifact(command: command_pb2.Command) -> work_pb2.WorkPublishArtifact | None:
    return None


def _never(command: command_pb2.Command) -> bool:
    return False


def named_digests(*groups: Iterable[common_pb2.ArtifactRef]) -> tuple[str, ...]:
    """The well-formed BLAKE3 digests among ``groups`` of refs, each once, in order: what the shell
    asks the artifact store about (a malformed one is refused by the rule, never looked up)."""
    seen: dict[str, None] = {}
    for refs in groups:
        for ref in refs:
            if ref.digest.algorithm == "blake3" and HEX64.fullmatch(ref.digest.hex):
                seen[ref.digest.hex] = None
    return tuple(seen)


@dataclass(frozen=True)
class CommandKind:
    """Everything the Authority knows about one command kind, declared once beside its rules.

    The registry (``missionweave_server/services/authority/kinds.py``) collects the declarations of every rule family;
    the decider and the shell read them, and no other list of kinds exists.
    """

    body: str  # the field of the Command ``body`` oneof, e.g. ``mission_create``
    handler: Handler  # decide: validate, then emit the events
    # The evolve rules of the events whose home is this kind, by Event payload field. An event that
    # several kinds emit (``conversation_opened``, ``lease_revoked``...) lives with one of them.
    appliers: Mapping[str, Applier] = field(default_factory=dict)
    creates_group: bool = False  # addresses a Group that must not exist yet (membership epoch 0)
    ends_mission: int = 0  # the MissionState it ends the Mission in; its unfinished WorkItems follow (T18)
    # Identities besides the actor whose registration the decision consults (the shell looks them up).
    references: Callable[[command_pb2.Command], Iterable[str]] = _none
    # Agents whose Agent Card in force the decision consults (the shell fetches them).
    card_holders: Callable[[command_pb2.Command], Iterable[str]] = _none
    # Other Groups whose durable state the decision consults (never written by this command).
    linked_groups: Callable[[command_pb2.Command], Iterable[str]] = _none
    # The artifact the command publishes, which the shell looks up in the artifact index.
    published_artifact: Callable[[command_pb2.Command], work_pb2.WorkPublishArtifact | None] = _no_artifact
    # The blobs it names as deliverables or Evidence, which the shell asks the artifact store about
    # (D161): BLAKE3 hex digests, each once (``named_digests``).
    named_artifacts: Callable[[command_pb2.Command], tuple[str, ...]] = _none
    # Whether its events rewrite earlier ones (an erasure re-signs them with their content cleared).
    erases: Callable[[command_pb2.Command], bool] = _never
    # Whether a Worker may buffer it offline under the bounded-offline-execution binding (MW-11.5-04).
    bufferable_offline: bool = False

    @property
    def name(self) -> str:
        """The spec's command name, ``mission.create``."""
        return spec_name(self.body)


def state_name(value: int) -> str:
    """``MISSION_STATE_ACTIVE`` for a MissionState number."""
    return MS.Name(MS.ValueType(value))


def budget_dims(vector: common_pb2.ResourceVector) -> dict[str, int]:
    """The six budget dimensions of a vector (MW-10.1-01), by name."""
    return {dim: int(getattr(vector, dim)) for dim in SIX}


def invalid(field: str, message: str) -> Rejected:
    return Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, f"{field}: {message}", field=field)


def enum_name(enum: Any, value: int) -> str:
    """The name of an enum value, or the number for a value the contract does not define (a client
    may send any int32: it must be refused with a reason, never fail to print)."""
    try:
        return str(enum.Name(value))
    except ValueError:
        return str(value)


# google.protobuf.Timestamp: 0001-01-01T00:00:00Z ..= 9999-12-31T23:59:59.999999999Z;
# google.protobuf.Duration: +-315,576,000,000 s, nanos +-999,999,999 with the sign of seconds.
_TIMESTAMP_SECONDS = (-62_135_596_800, 253_402_300_799)
_DURATION_SECONDS = 315_576_000_000
_NANOS = 999_999_999
_WELL_KNOWN = ("google.protobuf.Timestamp", "google.protobuf.Duration")


def _time_problem(full_name: str, seconds: int, nanos: int) -> str | None:
    if full_name == "google.protobuf.Timestamp":
        if not _TIMESTAMP_SECONDS[0] <= seconds <= _TIMESTAMP_SECONDS[1]:
            return "is not a valid Timestamp (seconds outside 0001-01-01 .. 9999-12-31)"
        if not 0 <= nanos <= _NANOS:
            return "is not a valid Timestamp (nanos outside 0 .. 999,999,999)"
        return None
    if not -_DURATION_SECONDS <= seconds <= _DURATION_SECONDS:
        return "is not a valid Duration (seconds outside +-315,576,000,000)"
    if not -_NANOS <= nanos <= _NANOS or (seconds > 0 > nanos) or (seconds < 0 < nanos):
        return "is not a valid Duration (nanos outside +-999,999,999 or of the other sign)"
    return None


def check_well_formed_times(message: Message, prefix: str = "") -> None:
    """Every google.protobuf.Timestamp and Duration set anywhere in ``message`` lies within the
    range its definition allows, else MALFORMED (metadata ``field``): one outside it cannot be
    converted to a time at all, so no rule could judge it (tests/test_fuzz_extremes.py)."""
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None or descriptor.message_type.GetOptions().map_entry:
            continue
        name = f"{prefix}{descriptor.name}"
        values = list(value) if descriptor.is_repeated else [value]
        for item in values:
            full_name = descriptor.message_type.full_name
            if full_name in _WELL_KNOWN:
                problem = _time_problem(full_name, item.seconds, item.nanos)
                if problem is not None:
                    raise Rejected(R.REJECTION_REASON_MALFORMED, f"{name} {problem}", field=name)
            else:
                check_well_formed_times(item, f"{name}.")


def spec_name(kind: str) -> str:
    """``mission_create_follow_up`` -> ``mission.create_follow_up`` (the spec's command name)."""
    head, _, rest = kind.partition("_")
    return f"{head}.{rest}"


def mission_of(state: GroupState) -> MissionRecord:
    if state.mission is None:  # every Group is created with its Mission
        raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {state.group_id} has no Mission")
    return state.mission


def check_artifact_refs(refs: Iterable[common_pb2.ArtifactRef], field: str) -> None:
    """Artifacts are named by content: a BLAKE3 digest of 64 lowercase hex characters (MW-13.1-06)."""
    for i, ref in enumerate(refs):
        if ref.digest.algorithm != "blake3" or not HEX64.fullmatch(ref.digest.hex):
            raise invalid(f"{field}[{i}].digest", "a blake3 digest of 64 lowercase hex characters")


def require_reason(text: str, field: str) -> None:
    if not text.strip():
        raise invalid(field, "a reason is required")
    if len(text) > MAX_REASON_CHARS:
        raise invalid(field, f"at most {MAX_REASON_CHARS} characters")


def is_org_policy(ctx: DecisionContext, actor_id: str) -> bool:
    """An Organization control-plane identity or administrator acts for Organization policy."""
    info = ctx.identities.get(actor_id)
    return info is not None and (info.kind == Kind.IDENTITY_KIND_CONTROL_PLANE or info.org_admin)


class Emitter:
    """Builds fully formed events with deterministic ids and sequences."""

    def __init__(self, command: command_pb2.Command, state: GroupState | None, now: datetime) -> None:
        self.command = command
        self.next_sequence = (state.head_sequence if state else 0) + 1
        self.recorded_at = to_timestamp(now)
        self.events: list[event_pb2.Event] = []

    def emit(self, type_name: str, field: str, payload: object) -> event_pb2.Event:
        cmd = self.command
        event = event_pb2.Event(
            event_id=ids.derived_id("evt", cmd.group_id, cmd.command_id, str(len(self.events))),
            group_id=cmd.group_id,
            sequence=self.next_sequence,
            recorded_at=self.recorded_at,
            type=type_name,
            causing_command_id=cmd.command_id,
            correlation_id=cmd.correlation_id,
            actor_id=cmd.actor_id,
        )
        getattr(event, field).CopyFrom(payload)
        self.next_sequence += 1
        self.events.append(event)
        return event


def check_membership(state: GroupState, command: command_pb2.Command) -> None:
    """MW-8-02 / MW-8-03: every Group-scoped command carries the current Membership epoch."""
    member = state.members.get(command.actor_id)
    if member is None:
        raise Rejected(
            R.REJECTION_REASON_NOT_A_MEMBER, f"{command.actor_id} holds no Membership in {state.group_id}"
        )
    if not member.active:
        raise Rejected(
            R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE,
            f"membership epoch {member.membership_epoch} of {command.actor_id} was revoked",
            current_epoch=0,
        )
    if command.membership_epoch != member.membership_epoch:
        raise Rejected(
            R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE,
            f"membership epoch {command.membership_epoch} is not the current {member.membership_epoch}",
            current_epoch=member.membership_epoch,
        )


def check_expected_revision(state: GroupState, command: command_pb2.Command) -> None:
    if not command.HasField("expected_revision"):
        return
    expected = command.expected_revision
    RK = common_pb2.RevisionKind
    if expected.kind == RK.REVISION_KIND_GROUP:
        current = state.head_sequence
    elif expected.kind == RK.REVISION_KIND_MISSION:
        if state.mission is None or expected.aggregate_id not in ("", state.mission.mission_id):
            raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no mission {expected.aggregate_id} in this group")
        current = state.mission.revision
    elif expected.kind in (RK.REVISION_KIND_WORK_ITEM, RK.REVISION_KIND_WORK_CONTRACT):
        item = state.work_items.get(expected.aggregate_id)
        if item is None:
            raise Rejected(
                R.REJECTION_REASON_NOT_FOUND, f"no WorkItem {expected.aggregate_id!r} in this group"
            )
        # MW-10.2-05 / OP-10: the WorkItem aggregate revision, or its contract revision.
        current = item.revision if expected.kind == RK.REVISION_KIND_WORK_ITEM else item.contract_revision
    else:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"no aggregate {expected.aggregate_id!r} of kind {enum_name(RK, expected.kind)} in this group",
        )
    if expected.revision != current:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"expected revision {expected.revision}, current is {current}",
            current_revision=current,
        )


def identity(ctx: DecisionContext, identity_id: str, field: str) -> IdentityInfo:
    if not identity_id:
        raise invalid(field, "is required")
    info = ctx.identities.get(identity_id)
    if info is None:
        raise Rejected(
            R.REJECTION_REASON_UNKNOWN_IDENTITY, f"{field}: {identity_id} is not registered", field=field
        )
    return info


def validate_budget(budget: common_pb2.ResourceVector, field: str) -> None:
    if budget.financial_micros < 0:
        raise invalid(f"{field}.financial_micros", "must not be negative")
    if budget.financial_micros and not (
        len(budget.currency) == 3 and budget.currency.isascii() and budget.currency.isupper()
    ):
        raise invalid(f"{field}.currency", "an ISO 4217 code such as EUR is required for a financial budget")


def validate_definition(definition: mission_pb2.MissionDefinition, ctx: DecisionContext) -> None:
    """MW-7.1-01: every item of the definition is a machine-readable field (OP-28)."""
    field = "body.definition"
    if not 1 <= len(definition.title) <= 200:
        raise invalid(f"{field}.title", "1..200 characters required")
    if not 1 <= len(definition.objective) <= 4096:
        raise invalid(f"{field}.objective", "a bounded objective of 1..4096 characters is required")
    if not definition.definition_of_done:
        raise invalid(f"{field}.definition_of_done", "at least one completion criterion is required")
    seen: set[str] = set()
    for i, criterion in enumerate(definition.definition_of_done):
        if not criterion.criterion_id or not ids.is_valid(criterion.criterion_id):
            raise invalid(f"{field}.definition_of_done[{i}].criterion_id", "a valid id is required")
        if criterion.criterion_id in seen:
            raise invalid(f"{field}.definition_of_done[{i}].criterion_id", "duplicate criterion id")
        seen.add(criterion.criterion_id)
        if not criterion.description:
            raise invalid(f"{field}.definition_of_done[{i}].description", "is required")
    if not definition.HasField("deadline"):
        raise invalid(f"{field}.deadline", "is required")
    if from_timestamp(definition.deadline) <= ctx.now:
        raise invalid(f"{field}.deadline", "must be in the future")
    if not definition.HasField("budget"):
        raise invalid(f"{field}.budget", "an enforceable budget is required")
    validate_budget(definition.budget, f"{field}.budget")
    if not any(budget_dims(definition.budget).values()):
        # OP-02: a dimension left out permits nothing, so a Mission without any could fund no work
        # (D162: refused at creation rather than given a default nobody chose).
        raise invalid(
            f"{field}.budget",
            "a budget in at least one dimension is required (tokens, tool calls, money, ...)",
        )
    if not definition.HasField("risk_policy") or not definition.risk_policy.risk_class:
        raise invalid(f"{field}.risk_policy.risk_class", "a risk/approval policy is required")
    if len(definition.notes) > MAX_TEXT_BYTES:
        raise invalid(f"{field}.notes", f"at most {MAX_TEXT_BYTES} characters")


def renewal(policy: mission_pb2.RenewalPolicy) -> tuple[timedelta, timedelta]:
    duration = policy.lease_duration.ToTimedelta() if policy.HasField("lease_duration") else DEFAULT_LEASE
    renew_before = (
        policy.renew_before.ToTimedelta()
        if policy.HasField("renew_before")
        else min(DEFAULT_RENEW_BEFORE, duration / 5)
    )
    if not MIN_LEASE <= duration <= MAX_LEASE:
        raise invalid("body.coordinator_renewal.lease_duration", f"must lie within {MIN_LEASE}..{MAX_LEASE}")
    if not timedelta(0) <= renew_before < duration:
        raise invalid("body.coordinator_renewal.renew_before", "must be shorter than the lease")
    return duration, renew_before
