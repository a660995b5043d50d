"""The recent end of each owned Group's log, in memory, for followers (the gateway).

Live subscribers of a Group all ask for the events just appended; serving them from the envelopes
the Authority has just made durable saves a database read per subscriber and batch. Only exact,
contiguous copies of stored rows are kept; anything unusual (an erasure rewriting envelopes, a
compaction, completions out of order, losing the Group) drops the Group's tail and readers fall
back to the database.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from missionweave_server.services.authority.store import StoredEvent

TAIL_EVENTS = 512
TAIL_GROUPS = 1_000


class LogTails:
    def __init__(self, events: int = TAIL_EVENTS, groups: int = TAIL_GROUPS) -> None:
        self._events = events
        self._groups = groups
        self._tails: OrderedDict[str, deque[StoredEvent]] = OrderedDict()

    def appended(self, group_id: str, after: int, stored: list[StoredEvent]) -> None:
        """``stored`` were made durable right after sequence ``after`` (in append order)."""
        tail = self._tails.get(group_id)
        if tail is None or (tail and tail[-1].sequence != after):
            tail = self._tails[group_id] = deque(maxlen=self._events)
        tail.extend(stored)
        self._tails.move_to_end(group_id)
        while len(self._tails) > self._groups:
            self._tails.popitem(last=False)

    def drop(self, group_id: str) -> None:
        self._tails.pop(group_id, None)

    def read(self, group_id: str, after: int, limit: int) -> list[StoredEvent] | None:
        """The events after ``after`` when the tail holds the next one; None = ask the database."""
        tail = self._tails.get(group_id)
        if not tail or not tail[0].sequence <= after + 1 <= tail[-1].sequence:
            return None
        start = after + 1 - tail[0].sequence
        return [tail[i] for i in range(start, min(len(tail), start + limit))]
