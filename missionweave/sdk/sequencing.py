"""Ordering and flow control of one Group's event stream, pure (no I/O, no asyncio): ``GroupSequencer``
releases a Group's events in sequence order, once each, buffering what arrives early and never moving
the cursor across a gap (MW-16-02..06), and ``CreditWindow`` keeps the credit accounting of one
subscription attempt, mirroring the gateway's window (MW-8-17). A ``Subscription`` drives both; they
live apart from it so that their rules can be read and tested on their own.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

__all__ = ["CreditWindow", "GroupSequencer", "Slot"]

T = TypeVar("T")


@dataclass(frozen=True)
class Slot(Generic[T]):
    """One step of a Group's log: an event (``first == last``) or a skipped range (``item is None``)."""

    first: int
    last: int
    item: T | None = None
    event_id: str = ""


class GroupSequencer(Generic[T]):
    """In-order, deduplicated release of one Group's events; the cursor never crosses a gap.

    Pure (no I/O): feed it what arrives, take :meth:`next_ready` slots, and call :meth:`done` once a slot
    has been processed. ``cursor`` is the highest contiguous sequence processed (MW-16-06).

    >>> seq = GroupSequencer[str]()
    >>> seq.add_event(2, "evt_b", "b"), seq.add_event(1, "evt_a", "a"), seq.add_event(1, "evt_a", "a")
    (True, True, False)
    >>> while (slot := seq.next_ready()) is not None:
    ...     seq.done(slot)
    >>> seq.cursor
    2
    """

    def __init__(self, cursor: int = 0, *, remember: int = 65_536) -> None:
        self._cursor = cursor
        self._slots: dict[int, Slot[T]] = {}
        self._firsts: list[int] = []  # heap over the keys of _slots
        self._buffered_ids: set[str] = set()
        self._done_ids: OrderedDict[str, None] = OrderedDict()  # bounded memory of processed event ids
        self._remember = remember

    @property
    def cursor(self) -> int:
        return self._cursor

    @property
    def buffered(self) -> int:
        """Slots held back, waiting for their turn."""
        return len(self._slots)

    @property
    def has_gap(self) -> bool:
        """Something is buffered but the next sequence is missing."""
        return bool(self._slots) and self.next_ready() is None

    def add_event(self, sequence: int, event_id: str, item: T) -> bool:
        """Buffers an event; False for a duplicate (same event id or sequence, or at or below the cursor)."""
        known = event_id in self._buffered_ids or event_id in self._done_ids
        if sequence <= self._cursor or sequence in self._slots or known:
            return False
        self._put(Slot(sequence, sequence, item, event_id))
        self._buffered_ids.add(event_id)
        return True

    def add_skipped(self, first: int, last: int) -> bool:
        """Buffers a range the gateway did not deliver (attention filter, OP-26): it advances the cursor too."""
        first = max(first, self._cursor + 1)
        if first > last or first in self._slots:
            return False
        self._put(Slot(first, last))
        return True

    def next_ready(self) -> Slot[T] | None:
        """The slot that continues the cursor, or None (nothing buffered, or a gap)."""
        self._prune()
        if not self._firsts:
            return None
        slot = self._slots[self._firsts[0]]
        if slot.first > self._cursor + 1:
            return None
        return slot if slot.first == self._cursor + 1 else replace(slot, first=self._cursor + 1)

    def done(self, slot: Slot[T]) -> None:
        """Marks ``slot`` (from :meth:`next_ready`) processed: the cursor moves to its last sequence."""
        if slot.first > self._cursor + 1:
            raise ValueError(f"slot {slot.first}..{slot.last} does not continue cursor {self._cursor}")
        self._cursor = max(self._cursor, slot.last)
        if slot.event_id:
            self._done_ids[slot.event_id] = None
            if len(self._done_ids) > self._remember:
                self._done_ids.popitem(last=False)
        self._prune()

    def jump(self, sequence: int) -> None:
        """Raises the cursor to a position the server declared (visibility start, restored snapshot)."""
        self._cursor = max(self._cursor, sequence)

    def clear(self) -> None:
        """Forgets everything buffered (before a resubscription replays it from the cursor)."""
        self._slots.clear()
        self._firsts.clear()
        self._buffered_ids.clear()

    def _put(self, slot: Slot[T]) -> None:
        self._slots[slot.first] = slot
        heapq.heappush(self._firsts, slot.first)

    def _prune(self) -> None:
        """Drops buffered slots the cursor has already passed."""
        while self._firsts and self._slots[self._firsts[0]].last <= self._cursor:
            slot = self._slots.pop(heapq.heappop(self._firsts))
            self._buffered_ids.discard(slot.event_id)


class CreditWindow:
    """Credit accounting of one subscription attempt (MW-8-17), mirroring the gateway's window.

    The gateway spends one credit per sequence an EVENT frame covers. A frame's credits are granted back
    once the cursor has passed its last sequence, in ACKs sent when half of the window is free again (or
    when the subscription is idle). The acknowledged cursor never exceeds what this attempt delivered.

    >>> window = CreditWindow(credits=8, after=0)
    >>> window.received(1, 4)
    >>> window.processed(cursor=4)
    >>> window.due(cursor=4, idle=False), window.take(cursor=4)
    (True, (4, 4))
    """

    def __init__(self, credits: int, after: int) -> None:
        self.credits = credits
        self.delivered = after  # highest sequence the gateway covered on this attempt
        self.acked = after
        self._frames: list[tuple[int, int]] = []  # (last sequence, sequences covered), not yet processed
        self._released = 0

    def received(self, first: int, last: int) -> None:
        self.delivered = max(self.delivered, last)
        self._frames.append((last, last - first + 1))

    def start_at(self, sequence: int) -> None:
        """The gateway raised the start (visibility, MW-8-07): everything up to ``sequence`` is delivered."""
        self.delivered = max(self.delivered, sequence)

    def processed(self, cursor: int) -> None:
        pending = []
        for last, size in self._frames:
            if last <= cursor:
                self._released += size
            else:
                pending.append((last, size))
        self._frames = pending

    def due(self, cursor: int, *, idle: bool) -> bool:
        if self._released >= max(1, self.credits // 2):
            return True
        return idle and (self._released > 0 or min(cursor, self.delivered) > self.acked)

    def take(self, cursor: int) -> tuple[int, int]:
        """The (cursor, credits) to put in the next ACK; resets the released credits."""
        self.acked = max(self.acked, min(cursor, self.delivered))
        credits, self._released = self._released, 0
        return self.acked, credits
