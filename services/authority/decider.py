"""The Group decider: ``decide(state, command, ctx) -> events | Rejected`` and ``evolve(state, event)``.

Pure: no I/O, no wall clock, no randomness. Event ids derive from (group, command, index), times
come from ``ctx.now``, identities and linked Groups from ``ctx``. Replaying a log through ``evolve``
yields exactly the state the live Authority holds. The rules live in ``rules/``, one module per
command family; this module dispatches and applies the checks every command shares.
"""

from __future__ import annotations

from missionweave.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2, mission_pb2
from services.authority.rules import conversations, memberships, missions, work
from services.authority.rules.common import (
    MAX_DATA_JSON_BYTES,
    MAX_TEXT_BYTES,
    Applier,
    DecisionContext,
    Emitter,
    Handler,
    R,
    check_expected_revision,
    check_membership,
    invalid,
    is_org_policy,
    spec_name,
)
from services.authority.state import GroupState

__all__ = ["MAX_DATA_JSON_BYTES", "MAX_TEXT_BYTES", "DecisionContext", "decide", "evolve", "fold"]

# Commands that create their Group rather than address an existing one.
CREATING_KINDS = frozenset({"mission_create", "mission_create_follow_up", "mission_create_child"})

_HANDLERS: dict[str, Handler] = {**missions.HANDLERS, **conversations.HANDLERS, **memberships.HANDLERS, **work.HANDLERS}
_APPLIERS: dict[str, Applier] = {**missions.APPLIERS, **conversations.APPLIERS, **memberships.APPLIERS, **work.APPLIERS}

IMPLEMENTED_COMMANDS = frozenset(spec_name(k) for k in _HANDLERS)
_MISSION_ENDINGS = {
    "mission_cancel": mission_pb2.MISSION_STATE_CANCELLED,
    "mission_terminate": mission_pb2.MISSION_STATE_FAILED,
}

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
            f"{spec_name(kind)} is part of the contract but not implemented by this server yet",
            command_kind=spec_name(kind),
        )
    try:
        if kind in CREATING_KINDS:
            if state is not None:
                raise Rejected(R.REJECTION_REASON_GROUP_EXISTS, f"group {command.group_id} already exists")
            if command.membership_epoch:
                raise invalid("membership_epoch", "must be 0 when creating a Group")
        else:
            if state is None:
                raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {command.group_id} does not exist")
            if not _acts_for_organization(state, command, kind, ctx):
                check_membership(state, command)
            check_expected_revision(state, command)
        emitter = Emitter(command, state, ctx.now)
        handler(state, command, ctx, emitter)
        if kind in _MISSION_ENDINGS and state is not None:
            # MW-10.2-T18: the Mission's end reaches every unfinished WorkItem in the same append.
            ending, reason = _MISSION_ENDINGS[kind], getattr(command, kind).reason
            work.propagate_mission_end(state, emitter, ending, reason)
        return emitter.events
    except Rejected as rejected:
        return rejected


def _acts_for_organization(state: GroupState, command: command_pb2.Command, kind: str, ctx: DecisionContext) -> bool:
    """Organization policy (control plane, administrators) cancels, terminates and replaces
    Coordinators without holding a Membership; it then sends membership epoch 0."""
    if kind not in missions.ORG_POLICY_KINDS or command.actor_id in state.members:
        return False
    if not is_org_policy(ctx, command.actor_id):
        return False
    if command.membership_epoch:
        raise invalid("membership_epoch", "must be 0 when acting for Organization policy without a Membership")
    return True


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
