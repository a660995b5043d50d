"""The simulated clock: milliseconds since a fixed start, advanced only by the simulation loop."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


class SimClock:
    """Stands in for missionweave.kernel.clock's wall clock: every process reads this one clock (no skew)."""

    def __init__(self) -> None:
        self.ms = 0

    def now(self) -> datetime:
        return START + timedelta(milliseconds=self.ms)

    def advance(self, ms: int) -> None:
        self.ms += ms
