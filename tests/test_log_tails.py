"""The in-memory tail of recent events the gateway's followers read from (missionweave_server/services/authority/tail.py)."""

from __future__ import annotations

from missionweave_server.services.authority.store import StoredEvent
from missionweave_server.services.authority.tail import LogTails


def stored(*sequences: int) -> list[StoredEvent]:
    return [StoredEvent(s, f"evt_{s}", "message.posted", 0, b"env%d" % s) for s in sequences]


def seqs(events: list[StoredEvent] | None) -> list[int] | None:
    return None if events is None else [e.sequence for e in events]


def test_serves_contiguous_recent_events_and_defers_to_the_database_otherwise() -> None:
    tails = LogTails(events=4)
    tails.appended("g", 0, stored(1, 2, 3))
    assert seqs(tails.read("g", 0, 10)) == [1, 2, 3]
    assert seqs(tails.read("g", 1, 1)) == [2]
    assert tails.read("g", 3, 10) is None  # nothing newer in memory: ask the database
    tails.appended("g", 3, stored(4, 5))
    assert seqs(tails.read("g", 1, 10)) == [2, 3, 4, 5]  # bounded: 1 fell off
    assert tails.read("g", 0, 10) is None  # older than the tail
    tails.appended("g", 7, stored(8))  # not contiguous (8 after 5): start again
    assert tails.read("g", 4, 10) is None and seqs(tails.read("g", 7, 10)) == [8]
    tails.drop("g")
    assert tails.read("g", 7, 10) is None and tails.read("other", 0, 10) is None


def test_only_recent_groups_keep_a_tail() -> None:
    tails = LogTails(groups=2)
    for g in ("a", "b", "c"):
        tails.appended(g, 0, stored(1))
    assert tails.read("a", 0, 1) is None and seqs(tails.read("c", 0, 1)) == [1]
