"""The global scheduler policy of one Worker (spec 11.1, MW-11.3-10..12; docs/scheduling.md).

Pure: no I/O, no clock, no randomness. Every call carries `now`; the state is a function of the
sequence of calls, so replaying them rebuilds an equal scheduler (`snapshot`, `==`, `replay`).

A *flow* is one Group's work in one priority class. A flow is *waiting* while it has an eligible
queued item and its Group has quota to spare. A decision (`pick`):
1. aging: the flow that has waited longest, if it has waited at least H, whatever its class;
2. else the highest class with a waiting flow, and in it the flow of least pass (stride
   scheduling by Group weight, ties by the head's deadline);
3. inside the flow: earliest deadline first, then urgency, business impact, arrival.
Coordinator inputs (urgency, deadline, impact) only act in step 3, so they cannot move a Group's
share (MW-11.1-08); the class and the Group weight are what move it (MW-11.1-09).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from missionweave_server.services.scheduling.ordering import (
    AGED_RANK,
    CLASSES_DOWN,
    MAY_SET_CLASS,
    MAY_SET_GROUP,
    MAY_SET_INPUTS,
    Assignment,
    Call,
    NotPermitted,
    Params,
    Preemption,
    PriorityClass,
    QueuedView,
    Source,
)

INF = float("inf")


class _Keep:
    """Marks an argument as unchanged (a deadline may legitimately be set to None)."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()
QUEUED, RUNNING = "queued", "running"


@dataclass(eq=False)
class _Item:
    id: str
    group: str
    cls: PriorityClass
    deadline: float | None
    urgency: int
    impact: int
    enqueued_at: float
    seq: int
    estimate: float | None
    risk_gate_open: bool = True
    resources_available: bool = True
    dependencies_met: bool = True
    state: str = QUEUED
    ver: int = 0  # bumped on every change: heap entries citing an older ver are stale
    slot: str | None = None
    started_at: float = 0.0
    charged: float = 0.0
    run_cls: PriorityClass = PriorityClass.STANDARD  # the flow charged for the running item
    aged: bool = False

    @property
    def eligible(self) -> bool:
        return self.risk_gate_open and self.resources_available and self.dependencies_met

    def key(self) -> tuple[float, int, int, int]:
        # Within a flow: EDF, then the Coordinator's urgency and impact, then arrival (MW-11.1-07).
        return (INF if self.deadline is None else self.deadline, -self.urgency, -self.impact, self.seq)


@dataclass(eq=False)
class _Flow:
    group: str
    cls: PriorityClass
    seq: int
    heap: list[tuple[tuple[float, int, int, int], int, _Item]] = field(default_factory=list)
    pass_: float = 0.0  # stride pass: service received / weight, in the class's virtual time
    waiting_since: float | None = None
    joined: int = 0  # join order among waiting flows: aging serves FIFO by it
    fver: int = 0
    pushed: tuple[float, float, float | None] | None = None


@dataclass(eq=False)
class _Group:
    id: str
    weight: int
    quota: int
    running: int = 0
    classes: set[PriorityClass] = field(default_factory=set)


class Scheduler:
    """One Worker's scheduler. Mutating calls are recorded in `journal` when one is given."""

    def __init__(self, params: Params, journal: list[Call] | None = None) -> None:
        self.params = params
        self.journal = journal
        self.now = -INF
        self.slots: dict[str, str | None] = {f"slot-{i}": None for i in range(params.slots)}
        self.preempting: set[str] = set()
        self._items: dict[str, _Item] = {}
        self._groups: dict[str, _Group] = {}
        self._flows: dict[tuple[str, PriorityClass], _Flow] = {}
        self._vtime: dict[PriorityClass, float] = dict.fromkeys(PriorityClass, 0.0)
        self._fair: dict[PriorityClass, list[tuple[float, float, int, int, _Flow]]] = {
            c: [] for c in PriorityClass
        }
        self._aging: list[tuple[float, int, int, _Flow]] = []
        self._waiting = 0
        self._item_seq = itertools.count()
        self._flow_seq = itertools.count()
        self._join_seq = itertools.count()

    # ------------------------------------------------------------ replay

    @classmethod
    def replay(cls, params: Params, calls: list[Call]) -> Scheduler:
        s = cls(params)
        for call in calls:
            s.apply(call)
        return s

    def apply(self, call: Call) -> Any:
        if call.method not in _CALLS:
            raise ValueError(f"not a scheduler call: {call.method}")
        return getattr(self, call.method)(**dict(call.kwargs))

    def _record(self, method: str, **kwargs: Any) -> None:
        now = kwargs["now"]
        if now < self.now:
            raise ValueError(f"time went backwards: {now} < {self.now}")
        self.now = now
        if self.journal is not None:
            self.journal.append(Call(method, tuple(kwargs.items())))

    def snapshot(self) -> dict[str, Any]:
        """The whole decision state as plain data (heaps are derived and left out)."""
        return {
            "now": self.now,
            "slots": dict(self.slots),
            "preempting": sorted(self.preempting),
            "vtime": dict(self._vtime),
            "waiting": self._waiting,
            "groups": {
                g.id: (g.weight, g.quota, g.running, sorted(g.classes)) for g in self._groups.values()
            },
            "flows": {k: (f.pass_, f.waiting_since, f.joined, f.seq) for k, f in self._flows.items()},
            "items": {
                i.id: (
                    i.group,
                    i.cls,
                    i.deadline,
                    i.urgency,
                    i.impact,
                    i.enqueued_at,
                    i.seq,
                    i.estimate,
                    i.risk_gate_open,
                    i.resources_available,
                    i.dependencies_met,
                    i.state,
                    i.slot,
                    i.started_at,
                    i.charged,
                    i.run_cls,
                    i.aged,
                )
                for i in self._items.values()
            },
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Scheduler):
            return NotImplemented
        return self.params == other.params and self.snapshot() == other.snapshot()

    __hash__ = None  # type: ignore[assignment]

    # ------------------------------------------------------------ inputs

    def set_group(
        self, now: float, group_id: str, source: Source, weight: int | None = None, quota: int | None = None
    ) -> None:
        """Group weight and slot quota: the Worker operator's or the Organization's (MW-11.1-09)."""
        if source not in MAY_SET_GROUP:
            raise NotPermitted(f"{source.name} may not change a Group's weight or quota")
        if (weight is not None and weight < 1) or (quota is not None and quota < 0):
            raise ValueError("weight must be >= 1 and quota >= 0")
        self._record("set_group", now=now, group_id=group_id, source=source, weight=weight, quota=quota)
        g = self._group(group_id)
        if weight is not None and weight != g.weight:
            # Rescale each waiting flow's lead over virtual time, so the new weight applies at once
            # (MW-11.3-10) and neither banks nor loses the service already received.
            for c in g.classes:
                f = self._flows[(group_id, c)]
                if f.waiting_since is not None:
                    v = self._vtime[c]
                    f.pass_ = v + (f.pass_ - v) * g.weight / weight
            g.weight = weight
        if quota is not None:
            g.quota = quota
        self._refresh(g)

    def enqueue(
        self,
        now: float,
        group_id: str,
        work_item_id: str,
        priority_class: PriorityClass = PriorityClass.STANDARD,
        deadline: float | None = None,
        urgency: int = 2,
        business_impact: int = 2,
        estimate: float | None = None,
        risk_gate_open: bool = True,
        resources_available: bool = True,
        dependencies_met: bool = True,
    ) -> None:
        """A WorkItem this Worker owns entered its Group's queue (projected from the Group log)."""
        if work_item_id in self._items:
            raise ValueError(f"{work_item_id} is already known")
        if estimate is not None and estimate <= 0:
            raise ValueError("estimate must be positive")
        self._record(
            "enqueue",
            now=now,
            group_id=group_id,
            work_item_id=work_item_id,
            priority_class=priority_class,
            deadline=deadline,
            urgency=urgency,
            business_impact=business_impact,
            estimate=estimate,
            risk_gate_open=risk_gate_open,
            resources_available=resources_available,
            dependencies_met=dependencies_met,
        )
        g = self._group(group_id)
        item = _Item(
            work_item_id,
            group_id,
            PriorityClass(priority_class),
            deadline,
            urgency,
            business_impact,
            now,
            next(self._item_seq),
            estimate,
            risk_gate_open,
            resources_available,
            dependencies_met,
        )
        self._items[work_item_id] = item
        self._queue(item)
        self._refresh(g)

    def set_priority(
        self,
        now: float,
        work_item_id: str,
        source: Source,
        priority_class: PriorityClass | None = None,
        deadline: float | _Keep | None = KEEP,
        urgency: int | None = None,
        business_impact: int | None = None,
    ) -> None:
        """Priority inputs of one WorkItem; queued work is reordered at once (MW-11.3-10)."""
        if priority_class is not None and source not in MAY_SET_CLASS:
            raise NotPermitted(f"{source.name} may not change a priority class (MW-11.1-08, MW-11.1-09)")
        if (
            deadline is not KEEP or urgency is not None or business_impact is not None
        ) and source not in MAY_SET_INPUTS:
            raise NotPermitted(f"{source.name} may not change urgency, deadline or business impact")
        item = self._item(work_item_id)
        self._record(
            "set_priority",
            now=now,
            work_item_id=work_item_id,
            source=source,
            priority_class=priority_class,
            deadline=deadline,
            urgency=urgency,
            business_impact=business_impact,
        )
        if priority_class is not None:
            item.cls = PriorityClass(priority_class)
        if not isinstance(deadline, _Keep):
            item.deadline = deadline
        if urgency is not None:
            item.urgency = urgency
        if business_impact is not None:
            item.impact = business_impact
        self._requeue_changed(item)

    def set_eligibility(
        self,
        now: float,
        work_item_id: str,
        risk_gate_open: bool | None = None,
        resources_available: bool | None = None,
        dependencies_met: bool | None = None,
    ) -> None:
        """Facts from the Group log (risk gate, dependencies) and the Worker (resources)."""
        item = self._item(work_item_id)
        self._record(
            "set_eligibility",
            now=now,
            work_item_id=work_item_id,
            risk_gate_open=risk_gate_open,
            resources_available=resources_available,
            dependencies_met=dependencies_met,
        )
        if risk_gate_open is not None:
            item.risk_gate_open = risk_gate_open
        if resources_available is not None:
            item.resources_available = resources_available
        if dependencies_met is not None:
            item.dependencies_met = dependencies_met
        self._requeue_changed(item)

    def dequeue(self, now: float, work_item_id: str) -> None:
        """A queued WorkItem left the queue without running (cancelled, reassigned, expired)."""
        item = self._item(work_item_id)
        if item.state != QUEUED:
            raise ValueError(f"{work_item_id} is running: release its slot instead")
        self._record("dequeue", now=now, work_item_id=work_item_id)
        del self._items[work_item_id]
        item.ver += 1
        self._refresh(self._groups[item.group])

    def release(self, now: float, slot_id: str, requeue: bool = False) -> None:
        """A slot is returned (submit, fail, block, checkpoint, preemption, lease end). With
        `requeue` the item re-enters its Group queue to resume later (MW-11.3-12 step 5)."""
        work_item_id = self.slots.get(slot_id)
        if work_item_id is None:
            raise ValueError(f"{slot_id} is not occupied")
        self._record("release", now=now, slot_id=slot_id, requeue=requeue)
        item = self._items[work_item_id]
        g = self._groups[item.group]
        f = self._flows[(item.group, item.run_cls)]
        # Charge the slot time actually used, not the estimate charged at start: shares are of slot time.
        f.pass_ += (max(now - item.started_at, 0.0) - item.charged) / g.weight
        self.slots[slot_id] = None
        self.preempting.discard(slot_id)
        g.running -= 1
        item.slot = None
        if requeue:
            item.state, item.enqueued_at = QUEUED, now
            self._queue(item)
        else:
            del self._items[work_item_id]
        self._refresh(g)

    def request_preemption(self, now: float, slot_id: str) -> None:
        """Note that the caller asked this slot to preempt (so it is not suggested again)."""
        if self.slots.get(slot_id) is None:
            raise ValueError(f"{slot_id} is not occupied")
        self._record("request_preemption", now=now, slot_id=slot_id)
        self.preempting.add(slot_id)

    # ------------------------------------------------------------ decisions

    def pick(self, now: float, slot_id: str | None = None) -> Assignment | None:
        """Place the next WorkItem into a free slot (`slot_id` or the first free one), or None
        when no slot is free or nothing is eligible. Deterministic in the calls so far and `now`."""
        self._record("pick", now=now, slot_id=slot_id)
        slot = slot_id if slot_id is not None else next((s for s, w in self.slots.items() if w is None), None)
        if slot is None or self.slots.get(slot, "") is not None:
            return None
        flow, aged = self._choose(now)
        if flow is None:
            return None
        item = self._head(flow)
        assert item is not None
        heapq.heappop(flow.heap)
        g = self._groups[flow.group]
        waited = now - item.enqueued_at
        if not aged:
            self._vtime[flow.cls] = max(self._vtime[flow.cls], flow.pass_)
        item.charged = item.estimate if item.estimate is not None else self.params.service_estimate
        flow.pass_ += item.charged / g.weight
        item.state, item.slot, item.started_at, item.run_cls, item.aged = RUNNING, slot, now, flow.cls, aged
        item.ver += 1
        self.slots[slot] = item.id
        g.running += 1
        self._stop_waiting(flow)  # served: it waits afresh from now if it still has work
        self._refresh(g)
        return Assignment(
            slot,
            g.id,
            item.id,
            item.cls,
            item.deadline,
            waited,
            item.urgency,
            item.impact,
            g.weight,
            max(g.quota - g.running, 0),
            aged,
        )

    def suggest_preemptions(self, now: float) -> list[Preemption]:
        """Running slots to ask to preempt cooperatively (MW-11.3-10..12), lowest effective
        priority first; none while a slot is free, and never more than the waiting work that
        outranks them needs (slots already asked count as freed). A recommendation only."""
        if any(w is None for w in self.slots.values()):
            return []
        running = sorted(
            (self._rank(self._items[w]), -self._items[w].started_at, s)
            for s, w in self.slots.items()
            if w is not None and s not in self.preempting
        )
        if not running:
            return []
        wanted = self._outranking(now, running[0][0], len(running) + len(self.preempting))
        wanted = wanted[len(self.preempting) :]  # the slots already asked serve the first ones
        out: list[Preemption] = []
        for rank, (run_rank, _, slot) in zip(wanted, running, strict=False):
            if rank <= run_rank:
                break
            item = self._items[self.slots[slot] or ""]
            out.append(Preemption(slot, item.id, item.group, rank))
        return out

    # ------------------------------------------------------------ queries

    def queue(self, group_id: str) -> list[QueuedView]:
        """One Group's queued items in its own order, eligible first (GetQueue)."""
        items = sorted(
            (i for i in self._items.values() if i.group == group_id and i.state == QUEUED),
            key=lambda i: (not i.eligible, -i.cls, i.key()),
        )
        return [
            QueuedView(
                i.id, n, i.eligible, _why_not(i), i.cls, i.deadline, i.urgency, i.impact, i.enqueued_at
            )
            for n, i in enumerate(items, start=1)
        ]

    def waiting_flows(self) -> dict[tuple[str, PriorityClass], float]:
        """Waiting flows and since when (for operators' tools and tests)."""
        return {k: f.waiting_since for k, f in self._flows.items() if f.waiting_since is not None}

    def group_weight(self, group_id: str) -> int:
        g = self._groups.get(group_id)
        return g.weight if g is not None else self.params.default_weight

    def group_quota(self, group_id: str) -> int:
        g = self._groups.get(group_id)
        if g is not None:
            return g.quota
        return self.params.default_quota if self.params.default_quota is not None else self.params.slots

    def running(self) -> dict[str, str]:
        return {s: w for s, w in self.slots.items() if w is not None}

    # ------------------------------------------------------------ internals

    def _group(self, group_id: str) -> _Group:
        g = self._groups.get(group_id)
        if g is None:
            quota = self.params.default_quota if self.params.default_quota is not None else self.params.slots
            g = self._groups[group_id] = _Group(group_id, self.params.default_weight, quota)
        return g

    def _item(self, work_item_id: str) -> _Item:
        item = self._items.get(work_item_id)
        if item is None:
            raise KeyError(work_item_id)
        return item

    def _flow(self, group_id: str, cls: PriorityClass) -> _Flow:
        f = self._flows.get((group_id, cls))
        if f is None:
            f = self._flows[(group_id, cls)] = _Flow(group_id, cls, next(self._flow_seq))
            self._groups[group_id].classes.add(cls)
        return f

    def _queue(self, item: _Item) -> None:
        item.ver += 1
        if item.eligible:  # ineligible items have no entry: they are never candidates
            heapq.heappush(self._flow(item.group, item.cls).heap, (item.key(), item.ver, item))
        else:
            self._flow(item.group, item.cls)

    def _requeue_changed(self, item: _Item) -> None:
        if item.state == QUEUED:
            self._queue(item)
        self._refresh(self._groups[item.group])

    def _head(self, f: _Flow) -> _Item | None:
        heap = f.heap
        while heap:
            _, ver, item = heap[0]
            if item.ver == ver:
                return item
            heapq.heappop(heap)
        return None

    def _stop_waiting(self, f: _Flow) -> None:
        if f.waiting_since is not None:
            f.waiting_since = None
            f.fver += 1
            f.pushed = None
            self._waiting -= 1

    def _refresh(self, g: _Group) -> None:
        """Re-derive which of the Group's flows wait, and re-index those whose keys moved."""
        room = g.running < g.quota
        for c in g.classes:
            f = self._flows[(g.id, c)]
            head = self._head(f) if room else None
            if head is None:
                self._stop_waiting(f)
                continue
            if f.waiting_since is None:
                f.waiting_since = self.now
                f.joined = next(self._join_seq)
                # Join at the class's virtual time: an idle Group banks no credit.
                f.pass_ = max(f.pass_, self._vtime[c])
                self._waiting += 1
            dl = INF if head.deadline is None else head.deadline
            key = (f.pass_, dl, f.waiting_since)
            if key != f.pushed:
                f.fver += 1
                f.pushed = key
                heapq.heappush(self._fair[c], (f.pass_, dl, f.seq, f.fver, f))
                heapq.heappush(self._aging, (f.waiting_since, f.joined, f.fver, f))
                self._compact(c)

    def _compact(self, c: PriorityClass) -> None:
        # Lazy deletion leaves stale entries; rebuild when they dominate, to bound memory and time.
        _purge(self._fair[c], 4 * len(self._flows) + 64)
        _purge(self._aging, 8 * len(self._flows) + 64)

    def _top(self, heap: list[Any]) -> _Flow | None:
        while heap:
            entry = heap[0]
            if entry[-1].fver == entry[-2]:
                return entry[-1]  # type: ignore[no-any-return]
            heapq.heappop(heap)
        return None

    def _choose(self, now: float) -> tuple[_Flow | None, bool]:
        oldest = self._top(self._aging)
        if (
            oldest is not None
            and oldest.waiting_since is not None
            and now - oldest.waiting_since >= self.params.aging_horizon
        ):
            return oldest, True
        for c in CLASSES_DOWN:
            f = self._top(self._fair[c])
            if f is not None:
                return f, False
        return None, False

    def _rank(self, item: _Item) -> int:
        return AGED_RANK if item.aged else int(item.run_cls)

    def _outranking(self, now: float, floor: int, limit: int) -> list[int]:
        """Ranks (highest first) of up to `limit` waiting flows ranked above `floor` that could
        start now, at most as many per Group as its spare quota."""
        room = {g.id: g.quota - g.running for g in self._groups.values()}
        ranks: list[int] = []
        starving = set()
        horizon = now - self.params.aging_horizon
        for ws, _, _, f in sorted(e for e in self._aging if e[-1].fver == e[-2]):
            if ws > horizon or len(ranks) >= limit:
                break
            if room[f.group] > 0:
                room[f.group] -= 1
                ranks.append(AGED_RANK)
                starving.add(id(f))
        for c in CLASSES_DOWN:
            if c <= floor or len(ranks) >= limit:
                break
            for f in (self._flows[k] for k in sorted(self._flows) if k[1] == c):
                if len(ranks) >= limit:
                    break
                if f.waiting_since is not None and id(f) not in starving and room[f.group] > 0:
                    room[f.group] -= 1
                    ranks.append(int(c))
        return ranks


def _purge(heap: list[Any], size: int) -> None:
    if len(heap) > size:
        heap[:] = [e for e in heap if e[-1].fver == e[-2]]
        heapq.heapify(heap)


def _why_not(item: _Item) -> str:
    reasons = [
        r
        for ok, r in (
            (item.risk_gate_open, "risk gate closed"),
            (item.resources_available, "resources unavailable"),
            (item.dependencies_met, "dependencies not met"),
        )
        if not ok
    ]
    return ", ".join(reasons)


_CALLS = frozenset(
    {
        "set_group",
        "enqueue",
        "set_priority",
        "set_eligibility",
        "dequeue",
        "release",
        "request_preemption",
        "pick",
    }
)
