"""Property: in a Mission tree, no sequence of online charges, offline reconciliations (buffered
commands reconciled from a new session, MW-11.5-11..13), child creations and child endings lets any
WorkItem's, any Mission's or the tree's usage exceed a cap, and every accepted charge is counted
exactly once (MW-14-04, OP-21, D98). Every step goes through the pure decider; what it refuses
changes nothing."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.kernel.extensions import BOUNDED_OFFLINE_EXECUTION
from missionweave.v1 import command_pb2, common_pb2, event_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.work.common import begin_lease
from missionweave_server.services.authority.state import SIX, ExecutionLeaseState, GroupState, OwnershipState
from tests import builders
from tests.core_group import CoreGroup
from tests.offline_core import progress
from tests.test_core_children import (
    CHILD,
    LATER,
    NOW,
    PARENT,
    child_definition,
    create_body,
    ctx_with,
    ended,
    parent_state,
)

DIMS = ("tokens", "tool_calls")
MS = mission_pb2.MissionState


def equip(state: GroupState, work_item_id: str, lease_id: str) -> None:
    """An active WorkItem under a live lease of ``worker`` (what a charge needs), which allows
    offline continuation for 5 minutes past the lease."""
    item = state.work_items[work_item_id]
    item.state = wp.WORK_ITEM_STATE_ACTIVE
    item.owner = OwnershipState("worker", 1, LATER, LATER)
    item.last_ownership_epoch = 1
    begin_lease(item, ExecutionLeaseState(lease_id, "worker", 1, 1, NOW - timedelta(minutes=2), LATER))
    item.contract.time_policy.offline_grace_period.FromSeconds(300)


def offline_command(
    group: CoreGroup, state: GroupState, work_item_id: str, lease_id: str, usage: common_pb2.ResourceVector
) -> command_pb2.Command:
    """A progress report the Worker buffered while cut off, sent from its next session (MW-11.5-09)."""
    item = state.work_items[work_item_id]
    record = item.lease_history[lease_id]
    binding = wp.BoundedOfflineExecutionBinding(
        agent_id="worker",
        group_id=group.group_id,
        work_item_id=work_item_id,
        original_session_epoch=1,
        # Cut off a minute ago: reconciled now, also after the WorkItem became a child (its lease ended now).
        ownership_epoch=1,
        historical_lease_id=lease_id,
        disconnected_at=to_timestamp(NOW - timedelta(minutes=1)),
        buffered_at=to_timestamp(NOW - timedelta(minutes=1)),
        grace_deadline=to_timestamp(record.expires_at + timedelta(minutes=5)),
        historical_lease_expires_at=to_timestamp(record.expires_at),
        usage_delta=usage,
        conversation_id=item.conversation_id,
    )
    command = group.command("work_report_progress", progress(binding), "worker", state)
    command.session_epoch = 2
    command.extensions.add(urn=BOUNDED_OFFLINE_EXECUTION, critical=True, data=binding.SerializeToString())
    return command


def charge(
    group: CoreGroup,
    state: GroupState,
    work_item_id: str,
    lease_id: str,
    dim: str,
    amount: int,
    *,
    offline: bool = False,
) -> GroupState:
    usage = common_pb2.ResourceVector(**{dim: amount})
    if offline:
        decision = decider.decide(
            state, offline_command(group, state, work_item_id, lease_id, usage), group.ctx
        )
    else:
        body = wp.WorkRenewLease(
            work_item_id=work_item_id, lease_id=lease_id, ownership_epoch=1, usage_delta=usage
        )
        decision = group.decide(state, "work_renew_lease", body, "worker")
    if isinstance(decision, Rejected):
        return state
    after = copy.deepcopy(state)
    for event in decision:
        after = decider.evolve(after, event)
    return after


def apply(state: GroupState, events: list[event_pb2.Event]) -> GroupState:
    after = copy.deepcopy(state)
    for event in events:
        after = decider.evolve(after, event)
    return after


def running(state: GroupState | None) -> bool:
    return state is not None and state.mission is not None and state.mission.state == MS.MISSION_STATE_ACTIVE


@dataclass
class Tree:
    parent: GroupState
    child: GroupState | None = None
    # What was charged, as the test counts it: the parent's accepted charges and ended children's usage.
    charged: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIX, 0))
    item_charged: dict[tuple[str, str], int] = field(default_factory=dict)  # (WorkItem, dimension)

    def check(self) -> None:
        p = self.parent
        assert p.mission is not None
        caps = {d: getattr(p.mission.definition.budget, d) for d in SIX}
        budget_held = (
            self.child.mission.definition.budget
            if running(self.child) and self.child and self.child.mission
            else None
        )
        for dim in SIX:
            # Conservation: every charge counted once, the running child's budget held, nothing else.
            assert p.mission_used[dim] == self.charged[dim], dim
            assert p.reserved[dim] == (getattr(budget_held, dim) if budget_held is not None else 0), dim
            assert p.mission_used[dim] + p.reserved[dim] <= caps[dim], dim
            for item in p.work_items.values():
                assert item.used[dim] == self.item_charged.get((item.work_item_id, dim), 0), (
                    item.work_item_id,
                    dim,
                )
                held = item.running_child.reserved[dim] if item.running_child else 0
                assert item.used[dim] + held <= getattr(item.contract.budget, dim), (item.work_item_id, dim)
            if self.child is not None and self.child.mission is not None:
                child_cap = getattr(self.child.mission.definition.budget, dim)
                assert self.child.mission_used[dim] <= child_cap
                if running(
                    self.child
                ):  # the whole tree: the parent's charges (ended children's too) and the running child's
                    assert p.mission_used[dim] + self.child.mission_used[dim] <= caps[dim]


# Amounts near the caps matter most (parent WorkItems: 10,000 tokens and 50 tool calls each; the
# Mission: 15,000 and 80): drawn from round sizes around them, plus any small number.
AMOUNT = st.one_of(
    st.sampled_from([1_000, 3_000, 5_000, 6_000, 9_000, 10_000, 12_000]), st.integers(0, 12_000)
)
CALLS = st.one_of(st.sampled_from([10, 25, 40, 50, 60]), st.integers(0, 60))
OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("charge_parent"),
            st.sampled_from(["wi", "other"]),
            st.just("tokens"),
            AMOUNT,
            st.booleans(),
        ),
        st.tuples(
            st.just("charge_parent"),
            st.sampled_from(["wi", "other"]),
            st.just("tool_calls"),
            CALLS,
            st.booleans(),
        ),
        st.tuples(st.just("charge_child"), st.sampled_from(DIMS), st.integers(0, 3_000), st.booleans()),
        st.tuples(st.just("create_child"), AMOUNT, CALLS),
        st.tuples(st.just("end_child"), st.sampled_from(["approved", "failed", "cancelled"])),
    ),
    max_size=25,
)


@given(OPS)
@settings(max_examples=300, deadline=None)
def test_no_cap_in_a_mission_tree_is_ever_exceeded(ops: list[tuple[object, ...]]) -> None:
    parent = parent_state()
    assert parent.mission is not None
    parent.mission.definition.budget.tokens = 15_000  # less than its two WorkItems' budgets together
    parent.mission.definition.budget.tool_calls = 80
    for wid in ("wi", "other"):
        equip(parent, wid, f"lease-{wid}")
    tree = Tree(parent)
    child_group = CHILD
    for op in ops:
        kind = op[0]
        if kind == "charge_parent":
            _, wid, dim, amount, offline = op
            before = tree.parent.mission_used[str(dim)]
            tree.parent = charge(
                PARENT, tree.parent, str(wid), f"lease-{wid}", str(dim), int(amount), offline=bool(offline)
            )  # type: ignore[call-overload]
            if tree.parent.mission_used[str(dim)] != before:
                tree.charged[str(dim)] += int(amount)  # type: ignore[call-overload]
                key = (str(wid), str(dim))
                tree.item_charged[key] = tree.item_charged.get(key, 0) + int(amount)  # type: ignore[call-overload]
        elif kind == "charge_child" and tree.child is not None and running(tree.child):
            _, dim, amount, offline = op
            tree.child = charge(
                child_group, tree.child, "w1", "lease-w1", str(dim), int(amount), offline=bool(offline)
            )  # type: ignore[call-overload]
        elif kind == "create_child" and not running(tree.child):
            _, tokens, tool_calls = op
            budget = child_definition().budget
            budget.tokens, budget.tool_calls, budget.financial_micros = int(tokens), int(tool_calls), 0  # type: ignore[call-overload]
            n = len(tree.parent.work_items["wi"].children)  # each child in a Group of its own
            group = CoreGroup(f"grp_child{n}", ctx_with(tree.parent), NOW)
            child_group = CoreGroup(f"grp_child{n}", CHILD.ctx, NOW)
            created = group.decide(
                None,
                "mission_create_child",
                create_body(tree.parent, definition=child_definition(budget=budget)),
                "coord",
            )
            if isinstance(created, Rejected):
                continue
            child = decider.fold(created)
            assert child is not None
            linked = decider.decide_linked(
                tree.parent, next(e for e in created if e.type == "mission.parent.linked"), child, NOW
            )
            if isinstance(linked, Rejected):
                continue
            tree.parent = apply(tree.parent, linked)
            child = child_group.run(
                child,
                "mission_renew_coordinator_lease",
                mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
                "ccoord",
            )
            contract = builders.contract(
                NOW, budget=common_pb2.ResourceVector(tokens=int(tokens), tool_calls=int(tool_calls))
            )  # type: ignore[call-overload]
            authorize = wp.WorkAuthorize(
                work_item_id="w1", title="w1", contract=contract, coordinator_epoch=1
            )
            child = child_group.run(child, "work_authorize", authorize, "ccoord")
            grant = membership_pb2.MembershipGrant(member_id="worker", role=membership_pb2.MEMBER_ROLE_WORKER)
            child = child_group.run(child, "membership_grant", grant, "coord")
            equip(child, "w1", "lease-w1")
            tree.child = child
        elif kind == "end_child" and tree.child is not None and running(tree.child):
            _, how = op
            if (
                how == "approved"
            ):  # its WorkItem closed first: a Mission is submitted with its required work done
                cancel = wp.WorkCancel(work_item_id="w1", coordinator_epoch=1, reason="done")
                tree.child = child_group.run(tree.child, "work_cancel", cancel, "ccoord")
            finished, source = ended(tree.child, str(how), child_group)
            back = decider.decide_linked(tree.parent, source, finished, NOW)
            assert not isinstance(back, Rejected), back
            for dim in SIX:
                tree.charged[dim] += finished.mission_used[dim]
                tree.item_charged[("wi", dim)] = (
                    tree.item_charged.get(("wi", dim), 0) + finished.mission_used[dim]
                )
            tree.parent, tree.child = apply(tree.parent, back), finished
        tree.check()
