"""Scheduler benchmark: fairness, waits against the aging bound, deadline misses and decision
latency of the Worker's global scheduler policy (missionweave_server/services/scheduling/policy.py, issue 15), with a
strict-priority scheduler and FIFO on the same arrivals in the same run.

    PYTHONPATH=. .venv/bin/python bench/scheduler.py            # 1,000 Groups, 10,000 WorkItems (~1 min)
    PYTHONPATH=. .venv/bin/python bench/scheduler.py --quick    # 100 Groups, 1,000 WorkItems (~5 s)
    PYTHONPATH=. .venv/bin/python bench/scheduler.py --load 0.9 --slots 16 --seed 7

One Worker with ``--slots`` isolated slots on a simulated clock. Arrivals are Poisson at ``--load``
times the slots' capacity; each WorkItem's Group is drawn from a Zipf law (``--zipf``) over the
Groups, whose weights (1, 2, 4, 8) and priority classes (the Mission's) are drawn at random,
independently of their rank. Some items carry deadlines, a few are escalated to URGENT by their
MissionOwner, a few wait behind a closed risk gate that opens later; service times are uniform
within [``--service-min``, ``--service-max``] (T_max = the maximum). Every Group has the slot quota
``--quota``. The caller is work-conserving: every free slot is offered to the scheduler at once.

Each scheduler gets the same arrivals (same seed). Measured by this harness, independently of the
policy's own state:
* share: over a window of the run (``--window``, fractions of the arrival span), the flows (Group x
  class) that were *servable* throughout it (an eligible queued item and their Group's quota to
  spare) are *backlogged*; each flow's service is the slot time it received inside the window
  (the overlap of its items' run intervals with the window), the S_i(t1, t2) of GPS, the fluid
  ideal whose property is S_i / S_j = w_i / w_j for flows backlogged throughout. Jain's index over
  each weight's flows within a class; each weight's share of the backlogged flows' slot time in the
  class against its share of their weight. A flow held back by its own Group's quota is rate-capped
  by the operator, not owed its weight's share, so it is not backlogged while capped.
* what each class had to share, to read the shares by: its placements in the window (and how many
  went to flows that had waited H or more), the time-average weight W of its servable flows, and
  the GPS gap: with the class's slot time in the window split by weight over W, how long a
  weight-1 flow takes to receive one mean service. Where that gap exceeds the flows' wait bound,
  weight-proportional shares and the bound cannot both hold: the report says so beside the goals.
* waits: a flow's wait, from when it began waiting (or was last served) to its next placement,
  against the documented bound H + ceil(F / S) * T_max (F: flows waiting as it began); and each
  WorkItem's wait from enqueue to start.
* deadline misses: items with a deadline completed after it.
* decision latency: ``time.perf_counter_ns`` around every placing ``pick`` call.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from missionweave_server.services.scheduling.ordering import Params, PriorityClass, Source  # noqa: E402
from missionweave_server.services.scheduling.policy import Scheduler  # noqa: E402

P = PriorityClass
WEIGHTS = ((1, 0.5), (2, 0.25), (4, 0.15), (8, 0.10))
CLASSES = ((P.BACKGROUND, 0.15), (P.STANDARD, 0.60), (P.ELEVATED, 0.20), (P.URGENT, 0.05))
GOAL_JAIN, GOAL_SHARE, GOAL_P99_US = 0.99, 0.05, 100.0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Item:
    id: str
    group: str
    cls: P
    arrival: float
    service: float
    deadline: float | None
    gate_opens: float | None  # None: eligible on arrival


@dataclass(frozen=True)
class Workload:
    weights: dict[str, int]
    items: list[Item]


def workload(a: argparse.Namespace) -> Workload:
    rng = random.Random(a.seed)
    groups = [f"grp_{i:04d}" for i in range(a.groups)]
    weights = {g: rng.choices([w for w, _ in WEIGHTS], [p for _, p in WEIGHTS])[0] for g in groups}
    classes = {g: rng.choices([c for c, _ in CLASSES], [p for _, p in CLASSES])[0] for g in groups}
    ranked = groups[:]
    rng.shuffle(ranked)  # Zipf rank independent of weight and class
    zipf = [1 / (r + 1) ** a.zipf for r in range(a.groups)]
    mean_service = (a.service_min + a.service_max) / 2
    rate = a.load * a.slots / mean_service
    t, items = 0.0, []
    for n in range(a.items):
        t += rng.expovariate(rate)
        g = rng.choices(ranked, zipf)[0]
        cls = P.URGENT if rng.random() < 0.02 else classes[g]  # escalated by the MissionOwner
        deadline = t + rng.uniform(1_800, 4 * 3_600) if rng.random() < 0.6 else None
        gate = t + rng.uniform(0, 600) if rng.random() < 0.05 else None
        items.append(
            Item(f"wi_{n:05d}", g, cls, t, rng.uniform(a.service_min, a.service_max), deadline, gate)
        )
    return Workload(weights, items)


# ---------------------------------------------------------------------- the schedulers


class Policy(Protocol):
    name: str

    def enqueue(self, now: float, it: Item, eligible: bool) -> None: ...
    def open_gate(self, now: float, item_id: str) -> None: ...
    def pick(self, now: float) -> tuple[str, str] | None: ...  # (slot, item id)
    def release(self, now: float, slot: str) -> None: ...


class Ours:
    name = "ours"

    def __init__(self, params: Params, weights: dict[str, int], quota: int) -> None:
        self.s = Scheduler(params)
        for g, w in weights.items():
            self.s.set_group(0.0, g, Source.WORKER_OPERATOR, weight=w, quota=quota)

    def enqueue(self, now: float, it: Item, eligible: bool) -> None:
        self.s.enqueue(
            now, it.group, it.id, priority_class=it.cls, deadline=it.deadline, risk_gate_open=eligible
        )

    def open_gate(self, now: float, item_id: str) -> None:
        self.s.set_eligibility(now, item_id, risk_gate_open=True)

    def pick(self, now: float) -> tuple[str, str] | None:
        a = self.s.pick(now)
        return None if a is None else (a.slot_id, a.work_item_id)

    def release(self, now: float, slot: str) -> None:
        self.s.release(now, slot)


class KeyedAnchor:
    """The best eligible item by one global key, under the same quotas and slots (per-Group heaps
    and a heap of Group heads, so that its decision cost is comparable to ours)."""

    def __init__(self, name: str, slots: int, quota: int, strict: bool) -> None:
        self.name, self.quota, self.strict = name, quota, strict
        self.slots: dict[str, str | None] = {f"slot-{i}": None for i in range(slots)}
        self.items: dict[str, tuple[tuple[float, ...], str]] = {}
        self.per_group: dict[str, list[tuple[tuple[float, ...], str]]] = defaultdict(list)
        self.running: dict[str, int] = defaultdict(int)
        self.heads: list[tuple[tuple[float, ...], str, int]] = []
        self.ver: dict[str, int] = defaultdict(int)
        self.eligible: set[str] = set()
        self.seq = 0

    def _key(self, it: Item) -> tuple[float, ...]:
        self.seq += 1
        if self.strict:  # highest class first, then earliest deadline, then arrival
            return (-int(it.cls), math.inf if it.deadline is None else it.deadline, self.seq)
        return (float(self.seq),)

    def enqueue(self, now: float, it: Item, eligible: bool) -> None:
        self.items[it.id] = (self._key(it), it.group)
        if eligible:
            self.open_gate(now, it.id)

    def open_gate(self, now: float, item_id: str) -> None:
        key, g = self.items[item_id]
        heapq.heappush(self.per_group[g], (key, item_id))
        self._reindex(g)

    def _reindex(self, g: str) -> None:
        self.ver[g] += 1
        if self.per_group[g] and self.running[g] < self.quota:
            heapq.heappush(self.heads, (self.per_group[g][0][0], g, self.ver[g]))

    def pick(self, now: float) -> tuple[str, str] | None:
        slot = next((s for s, w in self.slots.items() if w is None), None)
        if slot is None:
            return None
        while self.heads:
            _, g, ver = heapq.heappop(self.heads)
            if ver == self.ver[g]:
                break
        else:
            return None
        _, item_id = heapq.heappop(self.per_group[g])
        self.slots[slot] = item_id
        self.running[g] += 1
        self._reindex(g)
        return slot, item_id

    def release(self, now: float, slot: str) -> None:
        item_id = self.slots[slot]
        assert item_id is not None
        self.slots[slot] = None
        g = self.items.pop(item_id)[1]
        self.running[g] -= 1
        self._reindex(g)


# ---------------------------------------------------------------------- the simulation and its measures


@dataclass
class Flow:
    eligible: int = 0  # eligible queued items
    since: float | None = None  # waiting: eligible items and quota to spare
    peers: int = 0
    backlog_since: float | None = None  # servable: eligible items and quota to spare
    spans: list[tuple[float, float]] = field(default_factory=list)
    got: float = 0.0  # slot time received inside the window
    placed: int = 0  # placements inside the window
    aged: int = 0  # of which after the flow had waited at least H
    bound: float = 0.0  # the largest bound a placement inside the window was held to


@dataclass
class Result:
    name: str
    flow_waits: list[float] = field(default_factory=list)
    bound_ratio: float = 0.0
    over_bound: int = 0
    item_waits: list[float] = field(default_factory=list)
    misses: int = 0
    with_deadline: int = 0
    decide_ns: list[int] = field(default_factory=list)
    flows: dict[tuple[str, int], Flow] = field(default_factory=dict)
    makespan: float = 0.0


def simulate(policy: Policy, wl: Workload, params: Params, quota: int, window: tuple[float, float]) -> Result:
    res = Result(policy.name)
    items = {it.id: it for it in wl.items}
    flows: dict[tuple[str, int], Flow] = defaultdict(Flow)
    group_classes: dict[str, set[int]] = defaultdict(set)
    running: dict[str, int] = defaultdict(int)
    started: dict[str, float] = {}
    on_slot: dict[str, str] = {}
    waiting = 0
    events: list[tuple[float, int, str, str]] = []  # (time, order, kind, id)
    for n, it in enumerate(wl.items):
        heapq.heappush(events, (it.arrival, n, "arrive", it.id))
        if it.gate_opens is not None:
            heapq.heappush(events, (it.gate_opens, n, "gate", it.id))
    order = len(wl.items)

    def refresh(g: str, now: float) -> None:
        nonlocal waiting
        for c in group_classes[g]:
            f = flows[(g, c)]
            ok = f.eligible > 0 and running[g] < quota
            if ok and f.backlog_since is None:
                f.backlog_since = now
            elif not ok and f.backlog_since is not None:
                f.spans.append((f.backlog_since, now))
                f.backlog_since = None
            if ok and f.since is None:
                f.since = now
                waiting += 1
                f.peers = waiting
            elif not ok and f.since is not None:
                f.since = None
                waiting -= 1

    now, placed, next_log = 0.0, 0, time.monotonic() + 5
    while events:
        now, _, kind, item_id = heapq.heappop(events)
        it = items[item_id]
        key = (it.group, int(it.cls))
        if kind == "arrive":
            group_classes[it.group].add(int(it.cls))
            policy.enqueue(now, it, it.gate_opens is None)
            if it.gate_opens is None:
                flows[key].eligible += 1
        elif kind == "gate":
            policy.open_gate(now, item_id)
            flows[key].eligible += 1
        else:  # done
            policy.release(now, on_slot.pop(item_id))
            running[it.group] -= 1
            if it.deadline is not None:
                res.with_deadline += 1
                res.misses += now > it.deadline
        refresh(it.group, now)
        while True:
            t0 = time.perf_counter_ns()
            got = policy.pick(now)
            t1 = time.perf_counter_ns()
            if got is None:
                break
            res.decide_ns.append(t1 - t0)
            slot, pid = got
            p = items[pid]
            f = flows[(p.group, int(p.cls))]
            assert f.since is not None and f.eligible > 0 and running[p.group] < quota, (
                f"{policy.name} broke a rule"
            )
            wait, bound = now - f.since, params.wait_bound(f.peers)
            res.flow_waits.append(wait)
            res.bound_ratio = max(res.bound_ratio, wait / bound)
            res.over_bound += wait > bound
            res.item_waits.append(now - max(p.arrival, p.gate_opens or 0.0))
            f.got += max(0.0, min(now + p.service, window[1]) - max(now, window[0]))
            if window[0] <= now <= window[1]:
                f.placed += 1
                f.aged += wait >= params.aging_horizon
                f.bound = max(f.bound, bound)
            f.eligible -= 1
            running[p.group] += 1
            on_slot[pid] = slot
            started[pid] = now
            order += 1
            heapq.heappush(events, (now + p.service, order, "done", pid))
            f.since = None  # served: the flow waits afresh from now (if it still waits)
            waiting -= 1
            refresh(p.group, now)
            placed += 1
        if time.monotonic() > next_log:
            log(f"{policy.name}: {placed:,}/{len(wl.items):,} placed, simulated t={now:,.0f} s")
            next_log = time.monotonic() + 5
    res.flows, res.makespan = dict(flows), now
    return res


# ---------------------------------------------------------------------- report


def pct(xs: list[float] | list[int], q: float) -> float:
    s = sorted(xs)
    return float(s[min(len(s) - 1, int(q * len(s)))]) if s else 0.0


def jain(xs: list[float]) -> float:
    sq = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * sq) if sq else float("nan")  # nan: none got anything


def fairness(
    res: Result, weights: dict[str, int], window: tuple[float, float]
) -> dict[tuple[int, int], tuple[int, float, float]]:
    """(class, weight) -> (backlogged flows, Jain of their slot time, the weight's share of the
    class's slot time / its share of the class's weight)."""
    backlogged = [
        (g, c, f)
        for (g, c), f in res.flows.items()
        if any(a <= window[0] and b >= window[1] for a, b in f.spans)
    ]
    got_c: dict[int, float] = defaultdict(float)
    weight_c: dict[int, int] = defaultdict(int)
    buckets: dict[tuple[int, int], list[Flow]] = defaultdict(list)
    for g, c, f in backlogged:
        got_c[c] += f.got
        weight_c[c] += weights[g]
        buckets[(c, weights[g])].append(f)
    out = {}
    for (c, w), fs in sorted(buckets.items()):
        share = sum(f.got for f in fs) / got_c[c] if got_c[c] else float("nan")
        out[(c, w)] = (len(fs), jain([f.got for f in fs]), share / (w * len(fs) / weight_c[c]))
    return out


@dataclass(frozen=True)
class ClassLoad:
    placed: int  # placements inside the window
    aged: int  # of which of flows that had waited at least H
    weight: float  # time-average weight of the class's servable flows over the window
    gps_gap: float  # GPS: seconds between two mean services of a weight-1 flow at that weight
    bound: float  # the largest wait bound of its placements inside the window


def class_load(
    res: Result, weights: dict[str, int], window: tuple[float, float], mean: float
) -> dict[int, ClassLoad]:
    """What the class had to share: GPS (the fluid ideal of weighted fairness) gives every
    servable flow of weight w the rate w / W of the class's slot time; at the window's average W,
    `gps_gap` is how long a weight-1 flow then takes to receive one mean service. Where it exceeds
    the bound, no policy can keep both the bound and weight-proportional shares."""
    length = window[1] - window[0]
    per: dict[int, list[tuple[str, Flow]]] = defaultdict(list)
    for (g, c), f in res.flows.items():
        per[c].append((g, f))
    out = {}
    for c, fs in sorted(per.items()):
        got = sum(f.got for _, f in fs)
        w = (
            sum(
                weights[g] * sum(max(0.0, min(b, window[1]) - max(a, window[0])) for a, b in f.spans)
                for g, f in fs
            )
            / length
        )
        gap = mean * w * length / got if got else math.inf
        out[c] = ClassLoad(
            sum(f.placed for _, f in fs), sum(f.aged for _, f in fs), w, gap, max(f.bound for _, f in fs)
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100 Groups, 1,000 WorkItems")
    ap.add_argument("--groups", type=int, default=1_000)
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--quota", type=int, default=8, help="slot quota of every Group")
    ap.add_argument("--load", type=float, default=1.05, help="offered load / slot capacity")
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--service-min", type=float, default=10.0)
    ap.add_argument("--service-max", type=float, default=110.0)
    ap.add_argument("--aging", type=float, default=1_800.0, help="aging horizon H, seconds")
    ap.add_argument(
        "--window", default="0.4,0.95", help="fractions of the arrival span where shares are measured"
    )
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.quick:
        a.groups, a.items = min(a.groups, 100), min(a.items, 1_000)
    mean = (a.service_min + a.service_max) / 2
    params = Params(
        slots=a.slots, aging_horizon=a.aging, service_time_bound=a.service_max, service_estimate=mean
    )
    log(
        f"workload: {a.groups:,} Groups, {a.items:,} WorkItems, {a.slots} slots, load {a.load}, Zipf {a.zipf}, seed {a.seed}"
    )
    wl = workload(a)
    lo, hi = (float(x) for x in a.window.split(","))
    span = wl.items[-1].arrival
    window = (lo * span, hi * span)
    results = []
    for pol in (
        Ours(params, wl.weights, a.quota),
        KeyedAnchor("strict-priority", a.slots, a.quota, strict=True),
        KeyedAnchor("fifo", a.slots, a.quota, strict=False),
    ):
        t0 = time.monotonic()
        results.append(simulate(pol, wl, params, a.quota, window))
        log(f"{pol.name}: done in {time.monotonic() - t0:.1f} s")

    print(
        f"\nscheduler benchmark {time.strftime('%Y-%m-%d')}: {a.groups:,} Groups, {a.items:,} WorkItems, "
        f"{a.slots} slots, quota {a.quota}, load {a.load}, Zipf s={a.zipf}, service U[{a.service_min:g}, "
        f"{a.service_max:g}] s, H={a.aging:g} s, seed {a.seed}"
    )
    print(
        f"documented bound on a flow's wait: H + ceil(F/S) * T_max = {a.aging:g} + ceil(F/{a.slots}) * {a.service_max:g} s"
        f" (worst, F = every flow: {params.wait_bound(len(results[0].flows)):,.0f} s)\n"
    )
    head = f"{'':34}" + "".join(f"{r.name:>17}" for r in results)
    print(head)

    def row(label: str, vals: list[str]) -> None:
        print(f"{label:34}" + "".join(f"{v:>17}" for v in vals))

    row(
        "flow wait max / p99 (s)",
        [f"{max(r.flow_waits):,.0f} / {pct(r.flow_waits, 0.99):,.0f}" for r in results],
    )
    row("flow wait / its bound, max", [f"{r.bound_ratio:.3f}" for r in results])
    row("flow waits beyond the bound", [f"{r.over_bound:,}" for r in results])
    row(
        "item wait max / p99 (s)",
        [f"{max(r.item_waits):,.0f} / {pct(r.item_waits, 0.99):,.0f}" for r in results],
    )
    row("deadline misses", [f"{r.misses:,} / {r.with_deadline:,}" for r in results])
    row(
        "decision p50 / p99 (us)",
        [f"{pct(r.decide_ns, 0.5) / 1e3:.1f} / {pct(r.decide_ns, 0.99) / 1e3:.1f}" for r in results],
    )
    row("simulated makespan (s)", [f"{r.makespan:,.0f}" for r in results])
    fair = [fairness(r, wl.weights, window) for r in results]
    print(
        f"\nflows backlogged throughout [{window[0]:,.0f}, {window[1]:,.0f}] s, per (class, weight): how many,"
        " Jain's index of their slot time (J), their share of the class's slot time / their share of its weight (s)"
    )
    row("class, weight: flows", [r.name for r in results])
    keys = sorted(set().union(*fair))
    for k in keys:
        cells = []
        for fr in fair:
            n, j, s = fr.get(k, (0, float("nan"), float("nan")))
            cells.append(f"{n:>3} J{j:.3f} s{s:.3f}")
        row(f"{P(k[0]).name}, w={k[1]}", cells)

    print(
        f"\nper class inside the window: placements (of flows that had waited >= H), the time-average weight"
        f" of its servable flows (W), and under GPS the gap between two mean services ({mean:g} s) of a weight-1"
        " flow at that W, against the largest bound its placements had"
    )
    row("class", [r.name for r in results])
    loads = [class_load(r, wl.weights, window, mean) for r in results]
    for c in sorted(set().union(*loads)):
        cells = []
        for ld in loads:
            x = ld.get(c)
            cells.append("" if x is None else f"{x.placed}({x.aged}) W{x.weight:.0f}")
        row(f"{P(c).name}", cells)
        row(
            "  GPS gap / bound (s)",
            [f"{ld[c].gps_gap:,.0f} / {ld[c].bound:,.0f}" if c in ld else "" for ld in loads],
        )

    ours = fair[0]
    jains = [j for (n, j, s) in ours.values() if n >= 2 and not math.isnan(j)] or [float("nan")]
    shares = [s for (n, j, s) in ours.values() if not math.isnan(s)] or [float("nan")]
    p99 = pct(results[0].decide_ns, 0.99) / 1e3
    print("\ngoals (ours):")
    print(
        f"  Jain >= {GOAL_JAIN} for equal weights: min over (class, weight) = {min(jains):.3f}"
        f" -> {'met' if min(jains) >= GOAL_JAIN else 'NOT met'}"
    )
    worst = max(abs(s - 1) for s in shares)
    print(
        f"  every weight class within {GOAL_SHARE:.0%} of its share: worst |s - 1| = {worst:.3f}"
        f" -> {'met' if worst <= GOAL_SHARE else 'NOT met'}"
    )
    conflict = sorted(c for c, x in loads[0].items() if x.gps_gap > x.bound and any(k[0] == c for k in ours))
    if conflict:
        rest = [v for k, v in ours.items() if k[0] not in conflict]
        rj = [j for (n, j, _) in rest if n >= 2 and not math.isnan(j)]
        rs = [abs(s - 1) for (_, _, s) in rest if not math.isnan(s)]
        print(
            f"  reason: in {', '.join(P(c).name for c in conflict)} GPS would leave a weight-1 flow longer between"
            " two services than its bound, so the bound, kept by aging, serves such flows by turn, not by weight"
        )
        print(
            f"  the other classes: min Jain {min(rj):.3f}, worst |s - 1| {max(rs):.3f}"
            if rj and rs
            else "  no other class had backlogged flows to compare"
        )
    print(
        f"  no wait beyond the bound: {results[0].over_bound} beyond, max wait/bound {results[0].bound_ratio:.3f}"
        f" -> {'met' if results[0].over_bound == 0 else 'NOT met'}"
    )
    print(
        f"  decision p99 <= {GOAL_P99_US:g} us: {p99:.1f} us -> {'met' if p99 <= GOAL_P99_US else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
