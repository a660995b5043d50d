"""The Group decider: ``decide(state, command, ctx) -> events | Rejected`` and ``evolve(state, event)``.

Pure: no I/O, no wall clock, no randomness. Event ids derive from (group, command, index), times
come from ``ctx.now``, identities and linked Groups from ``ctx``. Replaying a log through ``evolve``
yields exactly the state the live Authority holds. The rules live in ``rules/``, one module per
command family, each kind declared once (``kinds.py``); this module dispatches by those
declarations and applies the checks every command shares.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, MutableMapping
from datetime import datetime
from typing import Any

from missionweave.kernel import ids
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2
from missionweave_server.services.authority import aggregates
from missionweave_server.services.authority.kinds import APPLIERS, kind_of
from missionweave_server.services.authority.rules import authorization, children
from missionweave_server.services.authority.rules.common import (
    MAX_DATA_JSON_BYTES,
    MAX_TEXT_BYTES,
    MS,
    DecisionContext,
    Emitter,
    R,
    check_expected_revision,
    check_membership,
    invalid,
    is_org_policy,
)
from missionweave_server.services.authority.rules.memberships import (
    check_provisional,
    end_just_in_time,
    may_end_just_in_time,
)
from missionweave_server.services.authority.rules.work.ending import propagate_mission_end
from missionweave_server.services.authority.rules.work.leases import revoke_replaced_session
from missionweave_server.services.authority.rules.work.offline import check_bufferable
from missionweave_server.services.authority.state import GroupState

__all__ = [
    "MAX_DATA_JSON_BYTES",
    "MAX_TEXT_BYTES",
    "DecisionContext",
    "decide",
    "decide_compensation",
    "decide_linked",
    "evolve",
    "fold",
]

Decision = list[event_pb2.Event] | Rejected


def decide(state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext) -> Decision:
    """Validate ``command`` against ``state`` and return the events it causes, or a Rejected."""
    kind = kind_of(command)
    if kind is None:
        return Rejected(R.REJECTION_REASON_UNKNOWN_COMMAND_KIND, "command carries no known body")
    try:
        check_bufferable(command, kind.body, kind.bufferable_offline)
        if kind.creates_group:
            if state is not None:
                raise children.cycle_rejection(command, ctx) or Rejected(
                    R.REJECTION_REASON_GROUP_EXISTS, f"group {command.group_id} already exists"
                )
            if command.membership_epoch:
                raise invalid("membership_epoch", "must be 0 when creating a Group")
        else:
            if state is None:
                raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {command.group_id} does not exist")
            organization = authorization.may_act_for_organization(kind.body) and is_org_policy(
                ctx, command.actor_id
            )
            if not _acts_for_organization(state, command, organization):
                check_membership(state, command)
                check_provisional(state, command, kind.body, ctx)
                # Who may issue the kind at all (rules/authorization.py); the handler checks the rest.
                authorization.check_role(
                    kind.body, state.members[command.actor_id].role, organization=organization
                )
            check_expected_revision(state, command)
        emitter = Emitter(command, state, ctx.now)
        kind.handler(state, command, ctx, emitter)
        if kind.ends_mission and state is not None:
            # MW-10.2-T18: the Mission's end reaches every unfinished WorkItem in the same append.
            propagate_mission_end(state, emitter, kind.ends_mission, getattr(command, kind.body).reason)
        if state is not None and emitter.events and may_end_just_in_time(state):
            end_just_in_time(state, _preview(state, emitter.events), emitter, ctx.now)
        return emitter.events
    except Rejected as rejected:
        return rejected


def decide_linked(
    target: GroupState | None, source: event_pb2.Event, source_state: GroupState, now: datetime
) -> Decision:
    """The events ``target`` appends for an event of another Group (rules/children.py): a linked
    effect has no signed command; its id derives from the source event."""
    if target is None:
        return Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, "the linked Group does not exist")
    emitter = Emitter(children.linked_command(target.group_id, source), target, now)
    try:
        children.decide_linked(target, source, source_state, now, emitter)
    except Rejected as rejected:
        return rejected
    _finish_mission_end(target, emitter, now)
    return emitter.events


def decide_compensation(
    source_state: GroupState, source: event_pb2.Event, refusal: Rejected, now: datetime
) -> list[event_pb2.Event]:
    """What the source Group appends when the target refused ``source``'s linked effect."""
    command = children.linked_command(source_state.group_id, source)
    command.command_id = ids.derived_id("xgc", source.group_id, str(source.sequence))
    emitter = Emitter(command, source_state, now)
    children.compensate(source_state, source, refusal, emitter)
    _finish_mission_end(source_state, emitter, now)
    return emitter.events


def session_replaced_command(group_id: str, agent_id: str, session_epoch: int) -> command_pb2.Command:
    """The Authority's own command revoking ``agent_id``'s older sessions' leases in ``group_id``:
    its id derives from the new session, so that running it twice appends once."""
    return command_pb2.Command(
        command_id=ids.derived_id("session-replaced", group_id, agent_id, str(session_epoch)),
        group_id=group_id,
        actor_id=children.AUTHORITY_ACTOR,
    )


def decide_session_replaced(
    state: GroupState | None, agent_id: str, session_epoch: int, now: datetime
) -> list[event_pb2.Event]:
    """MW-11.3-09: what a Group appends when ``agent_id`` opened session ``session_epoch`` (nothing
    when none of its leases here belong to an older session)."""
    if state is None:
        return []
    emitter = Emitter(session_replaced_command(state.group_id, agent_id, session_epoch), state, now)
    revoke_replaced_session(state, agent_id, session_epoch, emitter)
    return emitter.events


def _finish_mission_end(state: GroupState, emitter: Emitter, now: datetime) -> None:
    """MW-10.2-T18 for a Mission the Authority ended by itself: its unfinished WorkItems follow."""
    ended = children.ended_mission_state(emitter.events)
    if ended:
        last = emitter.events[-1]
        reason = (
            last.mission_cancelled.reason
            if ended == MS.MISSION_STATE_CANCELLED
            else last.mission_failed.reason
        )
        propagate_mission_end(state, emitter, ended, reason)
    if emitter.events and may_end_just_in_time(state):
        end_just_in_time(state, _preview(state, emitter.events), emitter, now)


def _acts_for_organization(state: GroupState, command: command_pb2.Command, organization: bool) -> bool:
    """Organization policy (control plane, administrators) issues the kinds the authorization table
    gives it without holding a Membership (MW-8-04); it then sends membership epoch 0."""
    if not organization or command.actor_id in state.members:
        return False
    if command.membership_epoch:
        raise invalid(
            "membership_epoch", "must be 0 when acting for Organization policy without a Membership"
        )
    return True


def _preview(state: GroupState, events: list[event_pb2.Event]) -> GroupState:
    """The state after ``events``, leaving ``state`` as it is (decide never mutates it).

    Not a deep copy of the whole state, which cost every command in a Group with a just-in-time
    Membership time in proportion to the Group's size (D135): each collection is seen through a
    ``_CopyOnRead``, so evolve changes copies of just the entries the events touch (and readers
    then copy just what they read); the rest of the state (the Mission, the counters) is copied."""
    after = copy.copy(state)
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        setattr(after, f.name, _CopyOnRead(value) if isinstance(value, dict) else copy.deepcopy(value))
    for event in events:
        evolve(after, event)
    return after


class _CopyOnRead(MutableMapping[Any, Any]):
    """A dict of the state as a preview sees it: an entry is deep-copied from the original the first
    time it is read, and writes and deletions stay here; the original is never changed."""

    def __init__(self, base: dict[Any, Any]) -> None:
        self._base, self._own, self._deleted = base, dict[Any, Any](), set[Any]()

    def __getitem__(self, key: Any) -> Any:
        if key not in self._own:
            if key in self._deleted:
                raise KeyError(key)
            self._own[key] = copy.deepcopy(self._base[key])
        return self._own[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._own[key] = value
        self._deleted.discard(key)

    def __delitem__(self, key: Any) -> None:
        if key not in self:
            raise KeyError(key)
        self._own.pop(key, None)
        self._deleted.add(key)

    def __contains__(self, key: object) -> bool:
        return key in self._own or (key not in self._deleted and key in self._base)

    def __iter__(self) -> Iterator[Any]:
        yield from self._own
        yield from (k for k in self._base if k not in self._own and k not in self._deleted)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def evolve(state: GroupState | None, event: event_pb2.Event) -> GroupState:
    """Apply one event. Mutates and returns ``state`` (a new one for the first event)."""
    payload = event.WhichOneof("payload")
    if state is None:
        state = GroupState(group_id=event.group_id)
    if event.sequence != state.head_sequence + 1:
        raise ValueError(f"event {event.sequence} does not follow head {state.head_sequence}")
    applier = APPLIERS.get(payload or "")
    if applier is None:
        raise ValueError(f"no evolve rule for event payload {payload!r} ({event.type})")
    # Every evolve rule that changes a WorkItem names it as its payload's work_item_id: the WorkItem
    # indexes (D134) re-file that one alone (the property tests check them against a recomputation).
    work_item_id = aggregates.named_work_item(event, payload)
    before = aggregates.keys_of(state.work_items.get(work_item_id)) if work_item_id else aggregates.NONE
    applier(state, event)
    if work_item_id:
        aggregates.refile(state, work_item_id, before)
    state.head_sequence = event.sequence
    return state


def fold(events: list[event_pb2.Event]) -> GroupState | None:
    state: GroupState | None = None
    for event in events:
        state = evolve(state, event)
    return state
