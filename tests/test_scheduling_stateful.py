"""A Hypothesis state machine of the scheduler policy (missionweave_server/services/scheduling/policy.py) driven the way
the Worker runtime drives it: items enqueued into Groups of random weights, classes and deadlines,
priority changes from every source, risk gates opened and closed, picks into chosen slots, releases
with and without requeue, preemptions as suggested, and a simulated clock. The caller is
work-conserving only when time passes (every free slot is offered before the clock moves), which is
assumption (b) of the bound; picks in between go into slots the machine chooses.

Invariants, against the machine's own model (not the policy's internals):
* no eligible flow waits past `Params.wait_bound` (docs/scheduling.md, "The bound");
* a slot holds at most one item and an item at most one slot, as the model says;
* no pick takes a Group past its quota;
* a Coordinator cannot change a class (so cannot raise it), and a refused call leaves no trace;
* replaying the journal gives a scheduler equal to the live one;
* in a long run with every flow of a class backlogged, each weight's slot time is its weight's share.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from missionweave_server.services.scheduling.ordering import Call, NotPermitted, Params, PriorityClass, Source
from missionweave_server.services.scheduling.policy import KEEP, Scheduler, _Keep

P = PriorityClass
GROUPS = ("a", "b", "c", "d")
SOURCES = (Source.ORGANIZATION_POLICY, Source.MISSION_OWNER, Source.WORKER_OPERATOR, Source.COORDINATOR)
# Who may change what, as the spec says it (MW-11.1-07..09), written out apart from the policy's own.
MAY_CLASS = {Source.ORGANIZATION_POLICY, Source.MISSION_OWNER}
MAY_INPUTS = {Source.ORGANIZATION_POLICY, Source.MISSION_OWNER, Source.COORDINATOR}
Flow = tuple[str, int]


class StatefulScheduler(RuleBasedStateMachine):
    # A horizon a few services long: aging decides often enough for a broken bound to show.
    params = Params(slots=3, aging_horizon=20.0, service_time_bound=6.0, service_estimate=3.0)

    def __init__(self) -> None:
        super().__init__()
        self.journal: list[Call] = []
        self.s = Scheduler(self.params, journal=self.journal)
        self.now = 0.0
        self.ids = itertools.count()
        self.items: dict[str, dict[str, object]] = {}  # id -> group, cls, eligible, state
        self.quota = dict.fromkeys(GROUPS, self.params.slots)
        self.slots: dict[str, tuple[str, float]] = {}  # slot -> (item, end of its run)
        self.waiting: dict[Flow, tuple[float, int]] = {}  # flow -> (since, flows waiting then)
        self.long_runs = 0

    # ---- model

    def _in_use(self, g: str) -> int:
        return sum(1 for item, _ in self.slots.values() if self.items[item]["group"] == g)

    def _queued(self) -> list[str]:
        return sorted(k for k, i in self.items.items() if i["state"] == "queued")

    def _sync(self) -> None:
        in_use: dict[str, int] = {}
        for item, _ in self.slots.values():
            g = str(self.items[item]["group"])
            in_use[g] = in_use.get(g, 0) + 1
        servable = {
            (str(i["group"]), int(i["cls"]))  # type: ignore[call-overload]
            for i in self.items.values()
            if i["state"] == "queued"
            and i["eligible"]
            and in_use.get(str(i["group"]), 0) < self.quota[str(i["group"])]
        }
        for f in set(self.waiting) - servable:
            del self.waiting[f]
        for f in servable - set(self.waiting):
            self.waiting[f] = (self.now, len(servable))

    def _pick(self, slot: str | None = None) -> bool:
        a = self.s.pick(self.now, slot)
        if a is None:
            return False
        item = self.items[a.work_item_id]
        flow = (a.group_id, int(a.priority_class))
        assert slot is None or a.slot_id == slot
        assert a.slot_id not in self.slots, "a slot got a second item"
        assert item["state"] == "queued" and item["eligible"], "an ineligible or running item was placed"
        assert (item["group"], item["cls"]) == flow
        assert self._in_use(a.group_id) < self.quota[a.group_id], "a pick exceeded the Group's quota"
        since, peers = self.waiting[flow]
        assert self.now - since <= self.params.wait_bound(peers), f"{flow} waited {self.now - since}"
        item["state"] = "running"
        # Run times vary within T_max, so the release corrects the estimate charged at the pick.
        run = 1.0 + int(a.work_item_id[1:]) % int(self.params.service_time_bound)
        self.slots[a.slot_id] = (a.work_item_id, self.now + run)
        del self.waiting[flow]  # served: it waits afresh from now
        self._sync()
        return True

    def _fill(self) -> None:
        while self._pick():
            pass

    def _release(self, slot: str, requeue: bool) -> None:
        item_id, _ = self.slots.pop(slot)
        self.s.release(self.now, slot, requeue=requeue)
        if requeue:
            self.items[item_id]["state"] = "queued"
        else:
            del self.items[item_id]
        self._sync()

    # ---- rules

    @rule(
        g=st.sampled_from(GROUPS),
        cls=st.sampled_from(list(P)),
        deadline=st.none() | st.floats(0, 300),
        urgency=st.integers(1, 4),
        eligible=st.booleans(),
        burst=st.integers(1, 8),
    )
    def enqueue(
        self, g: str, cls: P, deadline: float | None, urgency: int, eligible: bool, burst: int
    ) -> None:
        for _ in range(burst):
            item_id = f"w{next(self.ids)}"
            self.s.enqueue(
                self.now,
                g,
                item_id,
                priority_class=cls,
                deadline=deadline,
                urgency=urgency,
                risk_gate_open=eligible,
            )
            self.items[item_id] = {"group": g, "cls": int(cls), "eligible": eligible, "state": "queued"}
        self._sync()

    @rule(
        g=st.sampled_from(GROUPS),
        source=st.sampled_from(SOURCES),
        weight=st.none() | st.integers(1, 8),
        quota=st.none() | st.integers(0, 3),
    )
    def set_group(self, g: str, source: Source, weight: int | None, quota: int | None) -> None:
        if source not in (Source.ORGANIZATION_POLICY, Source.WORKER_OPERATOR):
            before = len(self.journal)
            with pytest.raises(NotPermitted):
                self.s.set_group(self.now, g, source, weight=weight, quota=quota)
            assert len(self.journal) == before
            return
        self.s.set_group(self.now, g, source, weight=weight, quota=quota)
        if quota is not None:
            self.quota[g] = quota
        self._sync()

    @precondition(lambda self: bool(self._queued()))
    @rule(
        data=st.data(),
        source=st.sampled_from(SOURCES),
        cls=st.none() | st.sampled_from(list(P)),
        deadline=st.just(KEEP) | st.none() | st.floats(0, 300),
        urgency=st.none() | st.integers(1, 4),
    )
    def set_priority(
        self,
        data: st.DataObject,
        source: Source,
        cls: P | None,
        deadline: float | _Keep | None,
        urgency: int | None,
    ) -> None:
        item_id = data.draw(st.sampled_from(self._queued()))
        inputs = deadline is not KEEP or urgency is not None
        if (cls is not None and source not in MAY_CLASS) or (inputs and source not in MAY_INPUTS):
            before, was = len(self.journal), self.s.queue(str(self.items[item_id]["group"]))
            with pytest.raises(NotPermitted):
                self.s.set_priority(
                    self.now, item_id, source, priority_class=cls, deadline=deadline, urgency=urgency
                )
            # MW-11.1-08: the refused call changed nothing, so a Coordinator never raised a class.
            assert len(self.journal) == before
            assert self.s.queue(str(self.items[item_id]["group"])) == was
            return
        self.s.set_priority(self.now, item_id, source, priority_class=cls, deadline=deadline, urgency=urgency)
        if cls is not None:
            self.items[item_id]["cls"] = int(cls)
        self._sync()

    @precondition(lambda self: bool(self._queued()))
    @rule(data=st.data(), open_=st.booleans())
    def risk_gate(self, data: st.DataObject, open_: bool) -> None:
        item_id = data.draw(st.sampled_from(self._queued()))
        self.s.set_eligibility(self.now, item_id, risk_gate_open=open_)
        self.items[item_id]["eligible"] = open_
        self._sync()

    @precondition(lambda self: len(self.slots) < self.params.slots)
    @rule(data=st.data())
    def pick_into_a_slot(self, data: st.DataObject) -> None:
        free = sorted(set(self.s.slots) - set(self.slots))
        self._pick(data.draw(st.sampled_from(free)))

    @precondition(lambda self: bool(self.slots))
    @rule(data=st.data(), requeue=st.booleans())
    def release(self, data: st.DataObject, requeue: bool) -> None:
        self._release(data.draw(st.sampled_from(sorted(self.slots))), requeue)

    @rule()
    def preempt_as_suggested(self) -> None:
        for p in self.s.suggest_preemptions(self.now):
            assert self.slots[p.slot_id][0] == p.work_item_id
            self.s.request_preemption(self.now, p.slot_id)
            self._release(p.slot_id, requeue=True)  # it checkpoints at a safe point, then pauses

    @rule(dt=st.floats(0, 30))
    def advance_clock(self, dt: float) -> None:
        end = self.now + dt
        self._fill()
        while self.slots:
            slot, (_, done) = min(self.slots.items(), key=lambda kv: (kv[1][1], kv[0]))
            if done > end:
                break
            self._check_bound(done)
            self.now = max(self.now, done)
            self._release(slot, requeue=False)
            self._fill()
        self._check_bound(end)
        self.now = end
        self._fill()

    @precondition(lambda self: self.long_runs == 0)  # one per example keeps the journal short
    @rule(weights=st.lists(st.integers(1, 4), min_size=2, max_size=4))
    def backlogged_run(self, weights: list[int]) -> None:
        """Fresh Groups, one per weight, each with more URGENT work than the slots can run; over a
        long work-conserving run, each one's slot time is its weight's share."""
        self.long_runs += 1
        steps = 80
        groups = {f"long-{n}": w for n, w in enumerate(weights)}
        for g, w in groups.items():
            self.quota[g] = self.params.slots
            self.s.set_group(self.now, g, Source.WORKER_OPERATOR, weight=w)
            # More than its share of the run's picks: backlogged throughout.
            for _ in range(steps * self.params.slots * w // sum(weights) + 2 * self.params.slots):
                item_id = f"x{next(self.ids)}"
                # Declared estimates equal to the run time: nothing to correct, the tight case.
                self.s.enqueue(self.now, g, item_id, priority_class=P.URGENT, estimate=2.0)
                self.items[item_id] = {"group": g, "cls": int(P.URGENT), "eligible": True, "state": "queued"}
        self._sync()
        used = dict.fromkeys(groups, 0.0)
        for _ in range(steps):
            self._fill()
            for slot, (item_id, _) in list(self.slots.items()):
                if item_id.startswith("x"):
                    self.slots[slot] = (item_id, self.now + 2.0)
            self._check_bound(self.now + 2.0)
            self.now += 2.0
            for slot, (item_id, _) in sorted(self.slots.items()):
                g = str(self.items[item_id]["group"])
                if g in used:
                    used[g] += 2.0
                self._release(slot, requeue=False)
        total, weight = sum(used.values()), sum(groups.values())
        for g, w in groups.items():
            assert used[g] / total == pytest.approx(w / weight, abs=0.03), (groups, used)
        for item_id in [k for k in self._queued() if str(self.items[k]["group"]) in groups]:
            self.s.dequeue(self.now, item_id)
            del self.items[item_id]
        self._sync()

    # ---- invariants

    def _check_bound(self, at: float) -> None:
        for flow, (since, peers) in self.waiting.items():
            assert at - since <= self.params.wait_bound(peers), f"{flow} waited {at - since} at {at}"

    @invariant()
    def no_eligible_flow_waits_past_the_bound(self) -> None:
        self._check_bound(self.now)

    @invariant()
    def one_item_per_slot_and_one_slot_per_item(self) -> None:
        running = self.s.running()
        assert running == {s: item for s, (item, _) in self.slots.items()}
        assert len(set(running.values())) == len(running)

    @invariant()
    def waiting_flows_agree_with_the_model(self) -> None:
        assert set(self.s.waiting_flows()) == set(self.waiting)

    @invariant()
    def replaying_the_journal_equals_the_live_scheduler(self) -> None:
        if len(self.journal) < 400:  # a long journal is replayed once, at the end (teardown)
            assert Scheduler.replay(self.params, self.journal) == self.s

    def teardown(self) -> None:
        assert Scheduler.replay(self.params, self.journal) == self.s


StatefulScheduler.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestStatefulScheduler = StatefulScheduler.TestCase
TestStatefulScheduler.pytestmark = [  # type: ignore[attr-defined]
    pytest.mark.req(
        "MW-11.1-03",
        "MW-11.1-05",
        "MW-11.1-08",
        "MW-11.1-09",
        "MW-11.1-10",
        "MW-11.1-11",
        "MW-11.1-12",
        "MW-11.3-10",
        "MW-11.3-12",
    )
]
