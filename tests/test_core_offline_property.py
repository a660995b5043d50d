"""Property: online usage and offline reconciliations in any order, with random deltas and random
windows, never take a WorkItem, the Mission or a grant over its cap (MW-11.5-13, OP-21), and the
usage event of every accepted buffered command precedes the event it carries (MW-11.5-12)."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.common import budget_dims, mission_of
from missionweave_server.services.authority.state import SIX, GroupState
from tests.aggregates_check import assert_aggregates_recompute
from tests.offline_core import (
    LEASE_ID,
    NOW,
    apply,
    binding,
    buffered,
    command,
    decide,
    started,
    with_mission,
    work_contract,
)

ITEMS = ("wi", "wd")
# Deltas near the caps as often as small ones: every cap gets reached within a few steps.
DELTAS = st.one_of(st.sampled_from([0, 2_500, 4_000, 6_000]), st.integers(0, 6_000))
APPLIED = {"work_report_progress": "work_progress_reported", "work_checkpoint": "work_checkpointed"}


def group() -> GroupState:
    """Two running WorkItems whose budgets together exceed the Mission's, one of them delegated
    under a grant whose cap its (amended) budget exceeds: every cap can be the one that binds."""
    state = with_mission(tokens=40_000)
    state = started(state, "wi")
    root = wp.WorkAuthorize(work_item_id="root", title="root", contract=work_contract(), coordinator_epoch=1)
    state = apply(state, command(state, "work_authorize", root, "coord"))
    caps = common_pb2.ResourceVector(currency="EUR", financial_micros=1_000_000, tokens=10_000, tool_calls=50)
    grant = membership_pb2.MembershipGrantDelegation(
        grantee_id="lead",
        target_work_item_id="root",
        caps=caps,
        max_descendant_depth=1,
        allowed_capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.11")],
        expires_at=to_timestamp(NOW + timedelta(hours=1)),
        coordinator_epoch=1,
    )
    state = apply(state, command(state, "membership_grant_delegation", grant, "coord"))
    state = started(
        state, "wd", work_contract(tokens=6_000), grant_id=next(iter(state.grants)), parent="root"
    )
    state.work_items["wd"].contract.budget.tokens = 10_000  # as a Coordinator's amendment would (uncharged)
    state.committed["tokens"] += 4_000  # what "wd" holds of the Mission's budget with it (D162)
    state.grants[next(iter(state.grants))].caps["tokens"] = 6_000
    # Budgets that no longer fit the Mission's (D162 refuses that at authorize and offer; a log from
    # before it can hold it): the Mission's cap still binds every usage report.
    assert state.mission is not None
    state.mission.definition.budget.tokens = 15_000
    return state


BASE = group()


class OfflineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = copy.deepcopy(BASE)  # evolve folds in place
        self.now = NOW

    def _decide(self, c: object) -> list | None:
        events = decide(self.state, c, self.now)  # type: ignore[arg-type]
        if isinstance(events, Rejected):
            return None
        for event in events:
            self.state = decider.evolve(self.state, event)
        return events

    @rule(item=st.sampled_from(ITEMS), tokens=DELTAS)
    def online_usage(self, item: str, tokens: int) -> None:
        body = wp.WorkRenewLease(
            work_item_id=item,
            lease_id=LEASE_ID,
            ownership_epoch=1,
            usage_delta=common_pb2.ResourceVector(currency="EUR", tokens=tokens),
        )
        self._decide(command(self.state, "work_renew_lease", body, "worker", session=1, at=self.now))

    @rule(
        item=st.sampled_from(ITEMS),
        kind=st.sampled_from(sorted(APPLIED)),
        tokens=DELTAS,
        offset_s=st.integers(-30, 400),
    )
    def reconcile(self, item: str, kind: str, tokens: int, offset_s: int) -> None:
        record = self.state.work_items[item].lease_history[LEASE_ID]
        usage = common_pb2.ResourceVector(currency="EUR", tokens=tokens)
        at = record.started_at + timedelta(seconds=offset_s)
        b = binding(self.state, at, item_id=item, usage=usage)
        b.disconnected_at.CopyFrom(min(b.disconnected_at, b.buffered_at, key=lambda t: t.ToDatetime()))
        self.now = max(self.now, at + timedelta(seconds=1))  # the Worker reconciles once it reconnected
        events = self._decide(buffered(self.state, kind, b))
        if events is None:
            return
        payloads = [e.WhichOneof("payload") for e in events]
        expected = [APPLIED[kind]] if tokens == 0 else ["resource_usage_recorded", APPLIED[kind]]
        assert payloads == expected
        if tokens:
            assert events[0].resource_usage_recorded.source == wp.USAGE_SOURCE_OFFLINE_RECONCILIATION

    @rule(seconds=st.integers(1, 90))
    def advance(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @invariant()
    def within_every_cap(self) -> None:
        state = self.state
        for item in state.work_items.values():
            caps = budget_dims(item.contract.budget)
            assert all(item.used[d] <= caps[d] for d in SIX), item.work_item_id
        mission_caps = budget_dims(mission_of(state).definition.budget)
        assert all(state.mission_used[d] <= mission_caps[d] for d in SIX)
        assert sum(i.used["tokens"] for i in state.work_items.values()) == state.mission_used["tokens"]
        for grant in state.grants.values():
            assert all(grant.used[d] <= grant.caps[d] for d in SIX), grant.grant_id
        assert_aggregates_recompute(state)


OfflineMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestOfflineReconciliation = OfflineMachine.TestCase
TestOfflineReconciliation.pytestmark = [pytest.mark.req("MW-11.5-11", "MW-11.5-12", "MW-11.5-13")]  # type: ignore[attr-defined]
