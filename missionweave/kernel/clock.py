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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_timestamp(when: datetime) -> Timestamp:
    # Integer arithmetic on an aware datetime: exact, and several times cheaper than
    # Timestamp.FromDatetime (every event is stamped on the Authority's hot path).
    seconds, micros = divmod(to_micros(when), 1_000_000)
    return Timestamp(seconds=seconds, nanos=micros * 1000)


def from_timestamp(ts: Timestamp) -> datetime:
    return ts.ToDatetime(tzinfo=UTC)


def to_micros(when: datetime) -> int:
    """Microseconds since the epoch, exactly (``timestamp()`` goes through a float)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // _MICROSECOND


def timestamp_micros(ts: Timestamp) -> int:
    """Microseconds since the epoch, without building a datetime (hot path: every event)."""
    return ts.seconds * 1_000_000 + ts.nanos // 1000
