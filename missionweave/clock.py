"""Time as an injected dependency: the pure core never reads the wall clock itself (OP-05)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

from google.protobuf.timestamp_pb2 import Timestamp


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, **delta: float) -> datetime:
        self._now += timedelta(**delta)
        return self._now


class OffsetClock:
    """The system clock shifted by an offset tests move forward (lease expiry over a live server)."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, **delta: float) -> datetime:
        self.offset += timedelta(**delta)
        return self.now()


def to_timestamp(when: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(when)
    return ts


def from_timestamp(ts: Timestamp) -> datetime:
    return ts.ToDatetime(tzinfo=UTC)


def to_micros(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000)


def timestamp_micros(ts: Timestamp) -> int:
    """Microseconds since the epoch, without building a datetime (hot path: every event)."""
    return ts.seconds * 1_000_000 + ts.nanos // 1000
