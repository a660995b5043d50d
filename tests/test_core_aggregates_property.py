"""Property: the running aggregates a GroupState keeps (D134) equal a recomputation from scratch after
any history, and the decider's cheap preview decides exactly as a deep copy of the state did.

The WorkItem machine of test_core_work_property.py, its two Workers just-in-time ones (MW-8-06):
provisional until they accept an offer, ending by themselves once their obligations are done, then
granted again; besides its rules, declines and (rarely) the Mission's cancellation. Every command is
decided twice, once with the preview ``decide`` uses and once with the deep copy it used before
D135, and both decisions must be the same. (The existing machines check the aggregates too: grants
and their charges in test_core_delegation_property.py, usage under a grant in
test_core_offline_property.py.)"""

from __future__ import annotations

import copy
from unittest import mock

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState
from tests.test_core_work_property import ITEMS, WORKERS, WorkMachine


def deep_preview(state: GroupState, events: list[event_pb2.Event]) -> GroupState:
    """The preview as it was before D135: the whole state copied."""
    after = copy.deepcopy(state)
    for event in events:
        decider.evolve(after, event)
    return after


def contents(decision: decider.Decision) -> object:
    """A decision, but for the order of the events: several Memberships ending in one append now
    end in Membership epoch order, before in the order the Group first granted them (D135)."""
    if isinstance(decision, Rejected):
        return decision.reason, decision.message
    return sorted((e.type, getattr(e, e.WhichOneof("payload") or "").SerializeToString()) for e in decision)


class JustInTimeMachine(WorkMachine):
    PROVISIONAL = frozenset(WORKERS)

    def _decide(self, c: command_pb2.Command) -> decider.Decision:
        with mock.patch.object(decider, "_preview", deep_preview):
            expected = super()._decide(c)
        decision = super()._decide(c)
        assert contents(decision) == contents(expected)
        if not isinstance(decision, Rejected):
            for e in decision:
                if e.WhichOneof("payload") == "membership_ended":
                    hypothesis_event(f"membership ended ({e.membership_ended.reason})")
        return decision

    def _ended(self) -> list[str]:
        assert self.state is not None
        return [
            w for w in WORKERS if not self.state.members[w].active or self.state.members[w].lapsed(self.now)
        ]

    @precondition(lambda self: self._ended())
    @rule(pick=st.integers(0, 1))
    def granted_again(self, pick: int) -> None:
        """A just-in-time Worker whose Membership ended (or lapsed) gets a new provisional one."""
        ended = self._ended()
        worker = ended[pick % len(ended)]
        if self._apply("membership_grant", self._membership(worker), "coord"):
            assert self.state is not None
            self.epochs[worker] = self.state.members[worker].membership_epoch

    @rule(wid=st.sampled_from(ITEMS), worker=st.sampled_from(WORKERS), pick=st.integers(0, 5))
    def decline(self, wid: str, worker: str, pick: int) -> None:
        offers = list(self.item(wid).offers)  # type: ignore[attr-defined]
        if offers:
            body = wp.WorkDeclineOffer(
                work_item_id=wid,
                offer_id=offers[pick % len(offers)],
                decline=wp.StructuredDecline(reason=wp.DECLINE_REASON_CAPACITY),
            )
            self._apply("work_decline_offer", body, worker)

    @rule(ending=st.sampled_from(["none"] * 49 + ["cancel"]))
    def mission_cancelled(self, ending: str) -> None:
        """Rarely: the MissionOwner cancels the Mission (every just-in-time Membership ends with it)."""
        if ending == "cancel":
            self._apply("mission_cancel", mission_pb2.MissionCancel(reason="r"), "alice")


JustInTimeMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestJustInTimeAggregates = JustInTimeMachine.TestCase
TestJustInTimeAggregates.pytestmark = [pytest.mark.req("MW-8-06")]  # type: ignore[attr-defined]
