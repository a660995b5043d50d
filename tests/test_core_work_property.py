"""Stateful property test of the WorkItem rules with a fake clock (hypothesis RuleBasedStateMachine).

Random commands from a Coordinator and two Workers, with fresh, stale and foreign epochs and lease
ids, and random clock jumps. Invariants after every step:
* at most one owner per WorkItem, and a running lease always belongs to it, under its epoch;
* a command citing a lease or ownership epoch is only accepted if both were current;
* no WorkItem or Mission budget dimension is ever exceeded;
* replaying the accepted events gives exactly the live state.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import SIX, GroupState, IdentityInfo
from tests import builders
from tests.aggregates_check import assert_aggregates_recompute

START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
IDS = {
    "alice": IdentityInfo("alice", common_pb2.IDENTITY_KIND_HUMAN, session_epoch=1),
    "coord": IdentityInfo("coord", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
    "w1": IdentityInfo("w1", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
    "w2": IdentityInfo("w2", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
}
ITEMS = ["wi-a", "wi-b"]
WORKERS = ["w1", "w2"]


class WorkMachine(RuleBasedStateMachine):
    # Workers whose Memberships are just-in-time ones (MW-8-06): provisional until they accept an offer.
    PROVISIONAL: frozenset[str] = frozenset()

    def __init__(self) -> None:
        super().__init__()
        self.now = START
        self.n = 0
        self.log: list[event_pb2.Event] = []
        self.state: GroupState | None = None
        self.epochs: dict[str, int] = {"alice": 0}
        create = builders.mission_create("alice", "coord", START)
        create.coordinator_renewal.lease_duration.FromSeconds(86_400)
        self._apply("mission_create", create, "alice", must=True)
        self.epochs.update(alice=1, coord=2)
        for i, worker in enumerate(WORKERS, start=3):
            self._apply("membership_grant", self._membership(worker), "alice", must=True)
            self.epochs[worker] = i
        contract = builders.contract(START, budget=common_pb2.ResourceVector(tokens=1_000, tool_calls=10))
        self._apply(
            "work_authorize",
            wp.WorkAuthorize(work_item_id="wi-a", title="a", contract=contract, coordinator_epoch=1),
            "coord",
            must=True,
        )
        dependent = builders.contract(
            START, depends_on=("wi-a",), budget=common_pb2.ResourceVector(tokens=1_000)
        )
        self._apply(
            "work_authorize",
            wp.WorkAuthorize(work_item_id="wi-b", title="b", contract=dependent, coordinator_epoch=1),
            "coord",
            must=True,
        )

    # ------------------------------------------------------------ plumbing

    def _membership(self, worker: str) -> membership_pb2.MembershipGrant:
        grant = membership_pb2.MembershipGrant(member_id=worker, role=membership_pb2.MEMBER_ROLE_WORKER)
        if worker in self.PROVISIONAL:
            grant.provisional = True
            grant.expires_at.CopyFrom(to_timestamp(self.now + timedelta(hours=2)))
        return grant

    def _decide(self, c: command_pb2.Command) -> decider.Decision:
        return decider.decide(self.state, c, decider.DecisionContext(self.now, IDS))

    def _apply(self, kind: str, body: object, actor: str, *, must: bool = False) -> bool:
        self.n += 1
        c = command_pb2.Command(
            command_id=f"c{self.n}",
            group_id="grp_w",
            actor_id=actor,
            session_epoch=1,
            membership_epoch=self.epochs.get(actor, 0),
            issued_at=to_timestamp(self.now),
        )
        getattr(c, kind).CopyFrom(body)
        before = copy.deepcopy(self.state)
        decision = self._decide(c)
        assert self.state == before, "decide mutated the state"
        if isinstance(decision, Rejected):
            assert not must, decision
            return False
        self._check_fencing(kind, body, actor, before)
        if not must:
            hypothesis_event(f"accepted {kind}")
        for event in decision:
            self.state = decider.evolve(self.state, event)
            self.log.append(event)
        return True

    def _check_fencing(self, kind: str, body: object, actor: str, before: GroupState | None) -> None:
        """An accepted lease-citing command cited the lease and epoch that were current."""
        lease_id = getattr(body, "lease_id", "")
        if not lease_id or kind == "work_start" or before is None:
            return
        item = before.work_items[body.work_item_id]  # type: ignore[attr-defined]
        assert item.lease is not None and item.lease.lease_id == lease_id
        assert item.owner is not None and item.owner.agent_id == actor
        assert item.owner.ownership_epoch == body.ownership_epoch  # type: ignore[attr-defined]

    def item(self, wid: str) -> object:
        assert self.state is not None
        return self.state.work_items[wid]

    # ------------------------------------------------------------ rules

    @rule(seconds=st.sampled_from([1, 1, 5, 5, 20, 90, 400]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule(
        wid=st.sampled_from(ITEMS),
        candidates=st.lists(st.sampled_from(WORKERS), min_size=1, max_size=2, unique=True),
    )
    def offer(self, wid: str, candidates: list[str]) -> None:
        body = wp.WorkOffer(
            work_item_id=wid,
            offer_id=f"o{self.n}",
            candidate_ids=candidates,
            coordinator_epoch=1,
            expires_at=to_timestamp(self.now + timedelta(seconds=60)),
            selection_criteria=[builders.selection(c) for c in candidates],
        )
        self._apply("work_offer", body, "coord")

    @rule(wid=st.sampled_from(ITEMS), worker=st.sampled_from(WORKERS), pick=st.integers(0, 5))
    def accept(self, wid: str, worker: str, pick: int) -> None:
        item = self.item(wid)
        offers = [o for o, rec in item.offers.items() if rec.open] or list(item.offers)  # type: ignore[attr-defined]
        if offers:
            body = wp.WorkAcceptOffer(
                work_item_id=wid, offer_id=offers[pick % len(offers)], contract_revision=1
            )
            self._apply("work_accept_offer", body, worker)

    @rule(wid=st.sampled_from(ITEMS), worker=st.sampled_from(WORKERS), stale=st.integers(0, 3))
    def start(self, wid: str, worker: str, stale: int) -> None:
        owner = self.item(wid).owner  # type: ignore[attr-defined]
        epoch = (owner.ownership_epoch if owner else 1) + (1 if stale == 0 else 0)
        self._apply(
            "work_start", wp.WorkStart(work_item_id=wid, ownership_epoch=epoch, lease_id=f"l{self.n}"), worker
        )

    def _lease_args(self, wid: str, stale: int) -> tuple[str, int]:
        item = self.item(wid)
        lease = item.lease.lease_id if item.lease else "none"  # type: ignore[attr-defined]
        epoch = item.owner.ownership_epoch if item.owner else 1  # type: ignore[attr-defined]
        if stale == 1:
            lease = f"old-{lease}"
        elif stale == 2:
            epoch += 1
        return lease, epoch

    @rule(
        wid=st.sampled_from(ITEMS),
        worker=st.sampled_from(WORKERS),
        stale=st.integers(0, 3),
        tokens=st.integers(0, 600),
    )
    def renew(self, wid: str, worker: str, stale: int, tokens: int) -> None:
        lease, epoch = self._lease_args(wid, stale)
        body = wp.WorkRenewLease(
            work_item_id=wid,
            lease_id=lease,
            ownership_epoch=epoch,
            usage_delta=common_pb2.ResourceVector(tokens=tokens),
        )
        self._apply("work_renew_lease", body, worker)

    @rule(wid=st.sampled_from(ITEMS), worker=st.sampled_from(WORKERS), stale=st.integers(0, 3))
    def checkpoint(self, wid: str, worker: str, stale: int) -> None:
        lease, epoch = self._lease_args(wid, stale)
        body = wp.WorkCheckpoint(
            work_item_id=wid,
            lease_id=lease,
            ownership_epoch=epoch,
            checkpoint=wp.Checkpoint(checkpoint_id=f"ck{self.n}"),
        )
        self._apply("work_checkpoint", body, worker)

    @rule(wid=st.sampled_from(ITEMS), worker=st.sampled_from(WORKERS), stale=st.integers(0, 3))
    def submit(self, wid: str, worker: str, stale: int) -> None:
        lease, epoch = self._lease_args(wid, stale)
        body = wp.WorkSubmit(
            work_item_id=wid,
            lease_id=lease,
            ownership_epoch=epoch,
            contract_revision=1,
            artifacts=[builders.artifact()],
            evidence=[builders.evidence()],
        )
        self._apply("work_submit", body, worker)

    @rule(wid=st.sampled_from(ITEMS))
    def accept_result(self, wid: str) -> None:
        item = self.item(wid)
        body = wp.WorkAcceptResult(
            work_item_id=wid, coordinator_epoch=1, submission_event_id=item.latest_submission_event_id
        )  # type: ignore[attr-defined]
        self._apply("work_accept_result", body, "coord")

    @rule(wid=st.sampled_from(ITEMS), ending=st.sampled_from(["none"] * 8 + ["fail", "cancel"]))
    def fail_or_cancel(self, wid: str, ending: str) -> None:
        """Rarely: the Coordinator fails or cancels a WorkItem (both end its ownership)."""
        if ending == "fail":
            body = wp.WorkFail(
                work_item_id=wid,
                coordinator_epoch=1,
                kind=wp.WORK_FAILURE_KIND_TRANSIENT,
                evidence=[builders.evidence()],
                reason="r",
            )
            self._apply("work_fail", body, "coord")
        elif ending == "cancel":
            self._apply(
                "work_cancel", wp.WorkCancel(work_item_id=wid, coordinator_epoch=1, reason="r"), "coord"
            )

    # ------------------------------------------------------------ invariants

    @invariant()
    def one_owner_and_its_lease(self) -> None:
        assert self.state is not None
        for item in self.state.work_items.values():
            if item.lease is not None:
                assert item.owner is not None and item.lease.agent_id == item.owner.agent_id
                assert item.lease.ownership_epoch == item.owner.ownership_epoch
                assert item.state == wp.WORK_ITEM_STATE_ACTIVE
            if item.owner is not None:
                assert item.owner.ownership_epoch == item.last_ownership_epoch

    @invariant()
    def budgets_hold(self) -> None:
        assert self.state is not None
        for item in self.state.work_items.values():
            for dim in SIX:
                assert item.used[dim] <= getattr(item.contract.budget, dim)
        budget = self.state.mission.definition.budget  # type: ignore[union-attr]
        for dim in SIX:
            assert self.state.mission_used[dim] <= getattr(budget, dim)

    @invariant()
    def aggregates_equal_a_recomputation(self) -> None:
        assert_aggregates_recompute(self.state)

    @invariant()
    def replay_equals_live(self) -> None:
        assert decider.fold(self.log) == self.state


WorkMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=80, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestWorkProperties = WorkMachine.TestCase
TestWorkProperties.pytestmark = [pytest.mark.req("MW-10.2-05", "MW-11.3-05", "MW-10.3-05", "MW-11.3-04")]  # type: ignore[attr-defined]
