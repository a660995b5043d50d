"""The Group decider: ``decide(state, command, ctx) -> events | Rejected`` and ``evolve(state, event)``.

Pure: no I/O, no wall clock, no randomness. Event ids derive from (group, command, index), times
come from ``ctx.now``, identities from ``ctx.identities``. Replaying a log through ``evolve`` yields
exactly the state the live Authority holds (tests/test_core_replay.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from missionweave import ids
from missionweave.clock import from_timestamp, to_timestamp
from missionweave.errors import Rejected
from missionweave.v1 import (
    command_pb2,
    common_pb2,
    conversation_pb2,
    event_pb2,
    membership_pb2,
    mission_pb2,
)
from services.authority.state import (
    ConversationState,
    CoordinatorLeaseState,
    GroupState,
    IdentityInfo,
    MemberState,
    MissionRecord,
)

R = common_pb2.RejectionReason
Role = membership_pb2.MemberRole
Kind = common_pb2.IdentityKind

MAX_TEXT_BYTES = 16 * 1024
MAX_DATA_JSON_BYTES = 16 * 1024
MAX_REFS = 32
DEFAULT_LEASE = timedelta(minutes=5)
DEFAULT_RENEW_BEFORE = timedelta(minutes=1)
MIN_LEASE = timedelta(seconds=5)
MAX_LEASE = timedelta(hours=24)

# Commands that create their Group rather than address an existing one.
CREATING_KINDS = frozenset({"mission_create", "mission_create_follow_up", "mission_create_child"})


@dataclass(frozen=True)
class DecisionContext:
    """Everything ``decide`` may consult besides the state and the command."""

    now: datetime
    identities: Mapping[str, IdentityInfo]


Decision = list[event_pb2.Event] | Rejected


def decide(state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext) -> Decision:
    """Validate ``command`` against ``state`` and return the events it causes, or a Rejected."""
    kind = command.WhichOneof("body")
    if kind is None:
        return Rejected(R.REJECTION_REASON_UNKNOWN_COMMAND_KIND, "command carries no known body")
    handler = _HANDLERS.get(kind)
    if handler is None:
        return Rejected(
            R.REJECTION_REASON_COMMAND_NOT_IMPLEMENTED,
            f"{_spec_name(kind)} is part of the contract but not implemented by this server yet",
            command_kind=_spec_name(kind),
        )
    try:
        if kind in CREATING_KINDS:
            if state is not None:
                raise Rejected(R.REJECTION_REASON_GROUP_EXISTS, f"group {command.group_id} already exists")
            if command.membership_epoch:
                raise _invalid("membership_epoch", "must be 0 when creating a Group")
        else:
            if state is None:
                raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {command.group_id} does not exist")
            _check_membership(state, command)
            _check_expected_revision(state, command)
        emitter = _Emitter(command, state, ctx.now)
        handler(state, command, ctx, emitter)
        return emitter.events
    except Rejected as rejected:
        return rejected


def evolve(state: GroupState | None, event: event_pb2.Event) -> GroupState:
    """Apply one event. Mutates and returns ``state`` (a new one for the first event)."""
    payload = event.WhichOneof("payload")
    if state is None:
        state = GroupState(group_id=event.group_id)
    if event.sequence != state.head_sequence + 1:
        raise ValueError(f"event {event.sequence} does not follow head {state.head_sequence}")
    applier = _APPLIERS.get(payload or "")
    if applier is None:
        raise ValueError(f"no evolve rule for event payload {payload!r} ({event.type})")
    applier(state, event)
    state.head_sequence = event.sequence
    return state


def fold(events: list[event_pb2.Event]) -> GroupState | None:
    state: GroupState | None = None
    for event in events:
        state = evolve(state, event)
    return state


# ---------------------------------------------------------------- helpers


def _spec_name(kind: str) -> str:
    """``mission_create_follow_up`` -> ``mission.create_follow_up`` (the spec's command name)."""
    head, _, rest = kind.partition("_")
    return f"{head}.{rest}"


def _invalid(field: str, message: str) -> Rejected:
    return Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, f"{field}: {message}", field=field)


class _Emitter:
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


def _check_membership(state: GroupState, command: command_pb2.Command) -> None:
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


def _check_expected_revision(state: GroupState, command: command_pb2.Command) -> None:
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
    else:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"no aggregate {expected.aggregate_id!r} of kind {RK.Name(expected.kind)} in this group",
        )
    if expected.revision != current:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"expected revision {expected.revision}, current is {current}",
            current_revision=current,
        )


def _identity(ctx: DecisionContext, identity_id: str, field: str) -> IdentityInfo:
    if not identity_id:
        raise _invalid(field, "is required")
    info = ctx.identities.get(identity_id)
    if info is None:
        raise Rejected(R.REJECTION_REASON_UNKNOWN_IDENTITY, f"{field}: {identity_id} is not registered", field=field)
    return info


def _validate_budget(budget: common_pb2.ResourceVector, field: str) -> None:
    if budget.financial_micros < 0:
        raise _invalid(f"{field}.financial_micros", "must not be negative")
    if budget.financial_micros and not (
        len(budget.currency) == 3 and budget.currency.isascii() and budget.currency.isupper()
    ):
        raise _invalid(f"{field}.currency", "an ISO 4217 code such as EUR is required for a financial budget")


def _validate_definition(definition: mission_pb2.MissionDefinition, ctx: DecisionContext) -> None:
    """MW-7.1-01: every item of the definition is a machine-readable field (OP-28)."""
    field = "body.definition"
    if not 1 <= len(definition.title) <= 200:
        raise _invalid(f"{field}.title", "1..200 characters required")
    if not 1 <= len(definition.objective) <= 4096:
        raise _invalid(f"{field}.objective", "a bounded objective of 1..4096 characters is required")
    if not definition.definition_of_done:
        raise _invalid(f"{field}.definition_of_done", "at least one completion criterion is required")
    seen: set[str] = set()
    for i, criterion in enumerate(definition.definition_of_done):
        if not criterion.criterion_id or not ids.is_valid(criterion.criterion_id):
            raise _invalid(f"{field}.definition_of_done[{i}].criterion_id", "a valid id is required")
        if criterion.criterion_id in seen:
            raise _invalid(f"{field}.definition_of_done[{i}].criterion_id", "duplicate criterion id")
        seen.add(criterion.criterion_id)
        if not criterion.description:
            raise _invalid(f"{field}.definition_of_done[{i}].description", "is required")
    if not definition.HasField("deadline"):
        raise _invalid(f"{field}.deadline", "is required")
    if from_timestamp(definition.deadline) <= ctx.now:
        raise _invalid(f"{field}.deadline", "must be in the future")
    if not definition.HasField("budget"):
        raise _invalid(f"{field}.budget", "an enforceable budget is required")
    _validate_budget(definition.budget, f"{field}.budget")
    if not definition.HasField("risk_policy") or not definition.risk_policy.risk_class:
        raise _invalid(f"{field}.risk_policy.risk_class", "a risk/approval policy is required")
    if len(definition.notes) > MAX_TEXT_BYTES:
        raise _invalid(f"{field}.notes", f"at most {MAX_TEXT_BYTES} characters")


def _renewal(policy: mission_pb2.RenewalPolicy) -> tuple[timedelta, timedelta]:
    duration = policy.lease_duration.ToTimedelta() if policy.HasField("lease_duration") else DEFAULT_LEASE
    renew_before = (
        policy.renew_before.ToTimedelta() if policy.HasField("renew_before") else min(DEFAULT_RENEW_BEFORE, duration / 5)
    )
    if not MIN_LEASE <= duration <= MAX_LEASE:
        raise _invalid("body.coordinator_renewal.lease_duration", f"must lie within {MIN_LEASE}..{MAX_LEASE}")
    if not timedelta(0) <= renew_before < duration:
        raise _invalid("body.coordinator_renewal.renew_before", "must be shorter than the lease")
    return duration, renew_before


# ---------------------------------------------------------------- command handlers

Handler = Callable[[GroupState | None, command_pb2.Command, DecisionContext, _Emitter], None]


def _mission_create(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: _Emitter
) -> None:
    """MW-7.1-T01: a root Mission with one Group, one planning Conversation and a Coordinator lease."""
    body = command.mission_create
    definition = body.definition
    _validate_definition(definition, ctx)
    owner = _identity(ctx, definition.owner_id, "body.definition.owner_id")
    if owner.kind != Kind.IDENTITY_KIND_HUMAN:
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT,
            "the MissionOwner of a root Mission must be a human identity (MW-7.1-02)",
            field="body.definition.owner_id",
        )
    actor = _identity(ctx, command.actor_id, "actor_id")
    on_behalf = actor.kind == Kind.IDENTITY_KIND_CONTROL_PLANE or actor.org_admin
    if command.actor_id != definition.owner_id and not on_behalf:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "mission.create is issued by the human MissionOwner or the Organization control plane (MW-7.1-T01)",
        )
    coordinator = _identity(ctx, body.coordinator_id, "body.coordinator_id")
    if coordinator.kind not in (Kind.IDENTITY_KIND_AGENT, Kind.IDENTITY_KIND_HUMAN):
        raise _invalid("body.coordinator_id", "the Coordinator must be an agent or a human")
    if body.coordinator_id == definition.owner_id:
        raise _invalid("body.coordinator_id", "the MissionOwner cannot also be the Coordinator (separation of review)")
    duration, renew_before = _renewal(body.coordinator_renewal)

    mission_id = f"mis_{ids.suffix(command.group_id)}"
    planning_id = ids.derived_id("conv", command.group_id, "planning")
    out.emit(
        "mission.created",
        "mission_created",
        mission_pb2.MissionCreated(
            mission_id=mission_id,
            kind=mission_pb2.MISSION_KIND_ROOT,
            definition=definition,
            planning_conversation_id=planning_id,
        ),
    )
    out.emit(
        "conversation.opened",
        "conversation_opened",
        conversation_pb2.ConversationOpened(
            conversation_id=planning_id,
            kind=conversation_pb2.CONVERSATION_KIND_PLANNING,
            title=definition.title,
        ),
    )
    # MW-8-05: owner and Coordinator see the whole Group (visibility from sequence 1).
    for epoch, (member_id, role) in enumerate(
        ((definition.owner_id, Role.MEMBER_ROLE_MISSION_OWNER), (body.coordinator_id, Role.MEMBER_ROLE_COORDINATOR)),
        start=1,
    ):
        out.emit(
            "membership.granted",
            "membership_granted",
            membership_pb2.MembershipGranted(
                membership=membership_pb2.Membership(
                    member_id=member_id,
                    group_id=command.group_id,
                    membership_epoch=epoch,
                    role=role,
                    visibility_start_sequence=1,
                    active=True,
                )
            ),
        )
    lease = mission_pb2.CoordinatorLease(
        agent_id=body.coordinator_id,
        coordinator_epoch=1,
        session_epoch=coordinator.session_epoch,
        expires_at=to_timestamp(ctx.now + duration),
        renewal_policy=mission_pb2.RenewalPolicy(),
        reconciled=True,
    )
    lease.renewal_policy.lease_duration.FromTimedelta(duration)
    lease.renewal_policy.renew_before.FromTimedelta(renew_before)
    out.emit(
        "mission.coordinator_lease.granted",
        "coordinator_lease_granted",
        mission_pb2.CoordinatorLeaseGranted(lease=lease, appointed_by=command.actor_id),
    )


def _validate_content(content: conversation_pb2.MessageContent, state: GroupState, field: str) -> None:
    """MW-9-06/08/09: complete content; text, structured data and Artifact references, no blobs."""
    if len(content.text.encode("utf-8")) > MAX_TEXT_BYTES:
        raise Rejected(
            R.REJECTION_REASON_TOO_LARGE,
            f"{field}.text exceeds {MAX_TEXT_BYTES} bytes; carry large data as an Artifact reference (MW-9-09)",
            field=f"{field}.text",
            limit=MAX_TEXT_BYTES,
        )
    if len(content.data_json.encode("utf-8")) > MAX_DATA_JSON_BYTES:
        raise Rejected(
            R.REJECTION_REASON_TOO_LARGE,
            f"{field}.data_json exceeds {MAX_DATA_JSON_BYTES} bytes (MW-9-09)",
            field=f"{field}.data_json",
            limit=MAX_DATA_JSON_BYTES,
        )
    if content.data_json:
        try:
            parsed = json.loads(content.data_json)
        except ValueError:
            raise _invalid(f"{field}.data_json", "is not valid JSON") from None
        if not isinstance(parsed, dict):
            raise _invalid(f"{field}.data_json", "must be a JSON object")
    if len(content.artifacts) > MAX_REFS or len(content.mentions) > MAX_REFS:
        raise Rejected(R.REJECTION_REASON_TOO_LARGE, f"at most {MAX_REFS} artifacts and {MAX_REFS} mentions")
    for i, ref in enumerate(content.artifacts):
        d = ref.digest
        if d.algorithm != "blake3" or len(d.hex) != 64 or any(c not in "0123456789abcdef" for c in d.hex):
            raise _invalid(f"{field}.artifacts[{i}].digest", "a blake3 digest of 64 lowercase hex characters")
    for i, mention in enumerate(content.mentions):
        if mention not in state.members:
            raise _invalid(f"{field}.mentions[{i}]", f"{mention} is not a member of this Group")
    if not (content.text or content.data_json or content.artifacts):
        raise _invalid(field, "a Message needs text, data or Artifact references")


def _message_post(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: _Emitter
) -> None:
    """MW-9-13: any Group member posts; the Message never carries authority (MW-9-10)."""
    assert state is not None
    body = command.message_post
    if body.conversation_id not in state.conversations:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no conversation {body.conversation_id}", field="conversation_id")
    message_id = body.message_id or f"msg_{ids.suffix(ids.derived_id('x', command.group_id, command.command_id))}"
    if not ids.is_valid(message_id):
        raise _invalid("body.message_post.message_id", "not a valid id")
    if message_id in state.messages:
        raise _invalid("body.message_post.message_id", "already used in this Group")
    if body.reply_to_message_id and body.reply_to_message_id not in state.messages:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no message {body.reply_to_message_id} to reply to")
    if len(body.topic) > 128:
        raise _invalid("body.message_post.topic", "at most 128 characters")
    _validate_content(body.content, state, "body.message_post.content")
    out.emit(
        "message.posted",
        "message_posted",
        conversation_pb2.MessagePosted(
            message_id=message_id,
            conversation_id=body.conversation_id,
            content=body.content,
            reply_to_message_id=body.reply_to_message_id,
            topic=body.topic,
            authority=False,
        ),
    )


def _require_steward(state: GroupState, command: command_pb2.Command, ctx: DecisionContext) -> None:
    """Membership changes: the MissionOwner, or the current Coordinator while its lease is live."""
    assert state.mission is not None
    actor = state.members[command.actor_id]
    if actor.role == Role.MEMBER_ROLE_MISSION_OWNER:
        return
    lease = state.mission.coordinator
    if actor.role == Role.MEMBER_ROLE_COORDINATOR and lease and lease.agent_id == command.actor_id:
        if lease.expires_at <= ctx.now:
            raise Rejected(R.REJECTION_REASON_LEASE_EXPIRED, "the Coordinator lease has expired; renew it first")
        return
    raise Rejected(
        R.REJECTION_REASON_PERMISSION_DENIED, "only the MissionOwner or the current Coordinator manage Memberships"
    )


_GRANTABLE = frozenset(
    {Role.MEMBER_ROLE_WORKER, Role.MEMBER_ROLE_REVIEWER, Role.MEMBER_ROLE_WORK_DELEGATE, Role.MEMBER_ROLE_OBSERVER}
)


def _membership_grant(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: _Emitter
) -> None:
    """MW-8-01: a Membership with role, epoch, visibility start and explicit capabilities."""
    assert state is not None
    _require_steward(state, command, ctx)
    body = command.membership_grant
    _identity(ctx, body.member_id, "body.membership_grant.member_id")
    if body.role not in _GRANTABLE:
        raise _invalid("body.membership_grant.role", "owner and Coordinator memberships come from the Mission itself")
    existing = state.members.get(body.member_id)
    if existing and existing.role in (Role.MEMBER_ROLE_MISSION_OWNER, Role.MEMBER_ROLE_COORDINATOR) and existing.active:
        raise _invalid("body.membership_grant.member_id", "cannot change the owner's or Coordinator's Membership")
    for i, cap in enumerate(body.capabilities):
        if not cap.capability_id or not cap.version:
            raise _invalid(f"body.membership_grant.capabilities[{i}]", "capability id and version are required")
    if body.provisional and not body.HasField("expires_at"):
        raise _invalid("body.membership_grant.expires_at", "a provisional Membership must expire (MW-8-06)")
    # MW-8-07: a late joiner starts at the sequence of its own grant, never earlier by default.
    visibility = body.visibility_start_sequence or out.next_sequence
    out.emit(
        "membership.granted",
        "membership_granted",
        membership_pb2.MembershipGranted(
            membership=membership_pb2.Membership(
                member_id=body.member_id,
                group_id=command.group_id,
                membership_epoch=state.last_membership_epoch + 1,
                role=body.role,
                visibility_start_sequence=visibility,
                capabilities=body.capabilities,
                provisional=body.provisional,
                expires_at=body.expires_at if body.HasField("expires_at") else None,
                active=True,
            )
        ),
    )


def _membership_revoke(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: _Emitter
) -> None:
    """MW-8-03: ending a Membership makes every later command from its epoch stale."""
    assert state is not None
    _require_steward(state, command, ctx)
    body = command.membership_revoke
    member = state.members.get(body.member_id)
    if member is None or not member.active:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"{body.member_id} holds no active Membership here")
    if member.role in (Role.MEMBER_ROLE_MISSION_OWNER, Role.MEMBER_ROLE_COORDINATOR):
        raise _invalid("body.membership_revoke.member_id", "the owner's and Coordinator's Memberships cannot be revoked")
    out.emit(
        "membership.revoked",
        "membership_revoked",
        membership_pb2.MembershipRevoked(
            member_id=body.member_id, membership_epoch=member.membership_epoch, reason=body.reason
        ),
    )


_HANDLERS: dict[str, Handler] = {
    "mission_create": _mission_create,
    "message_post": _message_post,
    "membership_grant": _membership_grant,
    "membership_revoke": _membership_revoke,
}

IMPLEMENTED_COMMANDS = frozenset(_spec_name(k) for k in _HANDLERS)


# ---------------------------------------------------------------- evolve rules


def _apply_mission_created(state: GroupState, event: event_pb2.Event) -> None:
    p = event.mission_created
    state.mission = MissionRecord(
        mission_id=p.mission_id,
        kind=p.kind,
        definition=p.definition,
        state=mission_pb2.MISSION_STATE_ACTIVE,
        revision=1,
        planning_conversation_id=p.planning_conversation_id,
        created_at=from_timestamp(event.recorded_at),
        follows_up_mission_id=p.follows_up_mission_id,
        parent_mission_id=p.parent_mission_id,
        parent_work_item_id=p.parent_work_item_id,
    )


def _apply_conversation_opened(state: GroupState, event: event_pb2.Event) -> None:
    p = event.conversation_opened
    state.conversations[p.conversation_id] = ConversationState(
        conversation_id=p.conversation_id, kind=p.kind, work_item_id=p.work_item_id, title=p.title
    )


def _apply_membership_granted(state: GroupState, event: event_pb2.Event) -> None:
    m = event.membership_granted.membership
    state.members[m.member_id] = MemberState(
        member_id=m.member_id,
        role=m.role,
        membership_epoch=m.membership_epoch,
        visibility_start_sequence=m.visibility_start_sequence,
        capabilities=tuple((c.capability_id, c.version) for c in m.capabilities),
        active=m.active,
        provisional=m.provisional,
        expires_at=from_timestamp(m.expires_at) if m.HasField("expires_at") else None,
    )
    state.last_membership_epoch = max(state.last_membership_epoch, m.membership_epoch)


def _apply_membership_revoked(state: GroupState, event: event_pb2.Event) -> None:
    member = state.members[event.membership_revoked.member_id]
    member.active = False


def _apply_coordinator_lease_granted(state: GroupState, event: event_pb2.Event) -> None:
    assert state.mission is not None
    lease = event.coordinator_lease_granted.lease
    state.mission.coordinator = CoordinatorLeaseState(
        agent_id=lease.agent_id,
        coordinator_epoch=lease.coordinator_epoch,
        session_epoch=lease.session_epoch,
        expires_at=from_timestamp(lease.expires_at),
        lease_duration_s=lease.renewal_policy.lease_duration.ToTimedelta().total_seconds(),
        renew_before_s=lease.renewal_policy.renew_before.ToTimedelta().total_seconds(),
        reconciled=lease.reconciled,
    )


def _apply_message_posted(state: GroupState, event: event_pb2.Event) -> None:
    p = event.message_posted
    state.messages[p.message_id] = p.conversation_id
    state.conversations[p.conversation_id].message_count += 1


_APPLIERS: dict[str, Callable[[GroupState, event_pb2.Event], None]] = {
    "mission_created": _apply_mission_created,
    "conversation_opened": _apply_conversation_opened,
    "membership_granted": _apply_membership_granted,
    "membership_revoked": _apply_membership_revoked,
    "coordinator_lease_granted": _apply_coordinator_lease_granted,
    "message_posted": _apply_message_posted,
}
