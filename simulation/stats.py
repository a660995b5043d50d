"""Counters of what a run injected (faults), saw (notable events) and checked, for the summary."""

from __future__ import annotations

from collections import Counter


class Stats:
    def __init__(self) -> None:
        self.faults: Counter[str] = Counter()
        self.events: Counter[str] = Counter()  # notable non-faults: takeovers, refusals by reason, ...
        self.invariant_checks = 0
        self.steps = 0

    def fault(self, kind: str) -> None:
        self.faults[kind] += 1

    def note(self, kind: str) -> None:
        self.events[kind] += 1

    def merge(self, other: Stats) -> None:
        self.faults.update(other.faults)
        self.events.update(other.events)
        self.invariant_checks += other.invariant_checks
        self.steps += other.steps
