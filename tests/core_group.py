"""Driving one Group through the pure decider in tests: commands as an actor with its current
Membership epoch, decisions, and the state after them (decide never mutates its input)."""

from __future__ import annotations

import copy
import itertools
from datetime import datetime

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState
from tests.store_double import as_if_uploaded


def evolved(state: GroupState | None, decision: decider.Decision) -> GroupState:
    """The state after an accepted decision's events (a copy: ``state`` is left as it was)."""
    assert not isinstance(decision, Rejected), decision
    after = copy.deepcopy(state)
    for event in decision:
        after = decider.evolve(after, event)
    assert after is not None
    return after


class CoreGroup:
    def __init__(self, group_id: str, ctx: decider.DecisionContext, now: datetime) -> None:
        self.group_id, self.ctx, self.now = group_id, ctx, now
        self._n = itertools.count(1)

    def command(self, kind: str, body: object, actor: str, state: GroupState | None) -> command_pb2.Command:
        member = state.members.get(actor) if state else None
        c = command_pb2.Command(
            command_id=f"c{next(self._n)}",
            group_id=self.group_id,
            actor_id=actor,
            session_epoch=1,
            membership_epoch=member.membership_epoch if member else 0,
            issued_at=to_timestamp(self.now),
        )
        getattr(c, kind).CopyFrom(body)
        return c

    def decide(
        self,
        state: GroupState | None,
        kind: str,
        body: object,
        actor: str,
        ctx: decider.DecisionContext | None = None,
    ) -> decider.Decision:
        command = self.command(kind, body, actor, state)
        return decider.decide(state, command, as_if_uploaded(state, command, ctx or self.ctx))

    def run(
        self,
        state: GroupState | None,
        kind: str,
        body: object,
        actor: str,
        ctx: decider.DecisionContext | None = None,
    ) -> GroupState:
        """The state after the command, which must be accepted (a copy: ``state`` is left as it was)."""
        events = self.decide(state, kind, body, actor, ctx)
        assert not isinstance(events, Rejected), f"{kind} by {actor}: {events!r}"
        return evolved(state, events)

    def refused(
        self,
        state: GroupState,
        kind: str,
        body: object,
        actor: str,
        ctx: decider.DecisionContext | None = None,
    ) -> Rejected:
        decision = self.decide(state, kind, body, actor, ctx)
        assert isinstance(decision, Rejected), f"{kind} by {actor} was accepted"
        return decision
