"""A shortened log: the records kept beside a Group's events name sequences past its head
(docs/integrity.md "Truncation", issue 40).

Deleting a Group's last event rows and lowering ``groups.head_seq`` to match leaves a log that is
continuous, correctly chained and signed up to its (lowered) head: the event checks cannot see it.
Served, the Authority would accept the next command at a sequence an earlier, acknowledged command
already had, and a re-sent acknowledged command would be answered with the other's event. What
still remembers the longer log is everything written beside it: each append's command record
(``commands.first_seq..last_seq``) and cross-Group outbox rows in the very transaction that moves the
head, snapshots and the signed chain checkpoint at heads that were durable. None of them may name a
sequence past the head; one that does means the log was shortened, and the Group is refused
(DATA_CORRUPTED) as any other failed verification.

It costs one statement per load (``EventStore.recorded_sequences``). It does not see a truncation
whose records were removed with the events (command rows, snapshots, checkpoint, outbox rows), nor a
whole older copy of the store put back: nothing left in the store remembers the longer log then.
"""

from __future__ import annotations

from collections.abc import Sequence

from missionweave.kernel import codec
from missionweave.kernel.eventlog import Corruption
from missionweave_server.services.authority.group_commit import StoredEvent
from missionweave_server.services.authority.integrity import LogIntegrity
from missionweave_server.services.authority.store import EventStore, RecordedSequences

__all__ = ["check_replayed", "past_head", "refuse_if_shortened", "reused"]


def past_head(group_id: str, recorded: RecordedSequences) -> Corruption | None:
    """The first record naming a sequence past the head, as a Corruption at the first sequence the
    log lacks (head + 1); None when every record is within the head."""
    head = recorded.head
    for what, sequence in (
        ("a command record names events up to", recorded.last_command),
        ("a cross-Group outbox row names event", recorded.last_outbox),
        ("a snapshot is stored at", recorded.last_snapshot),
        ("the signed chain checkpoint is at", recorded.checkpoint),
    ):
        if sequence is not None and sequence > head:
            return Corruption(
                group_id,
                head + 1,
                f"{what} {sequence}, past the Group's head {head}: the log was shortened (its last events "
                "deleted, or its head moved back); serving it would give acknowledged sequences to new events",
            )
    return None


async def refuse_if_shortened(store: EventStore, integrity: LogIntegrity, group_id: str) -> None:
    """Marks the Group corrupted and raises DATA_CORRUPTED when its records name a sequence past its
    head (a Group without a row has nothing to check)."""
    recorded = await store.recorded_sequences(group_id)
    if recorded is None:
        return
    found = past_head(group_id, recorded)
    if found is not None:
        raise integrity.mark(found)


def reused(group_id: str, command_id: str, rows: Sequence[StoredEvent]) -> Corruption | None:
    """The first of ``rows`` (the events a command record of ``command_id`` names) that another
    command caused (its signed ``causing_command_id``): the sequence was given again after the log
    was shortened (by a release that did not check, or with the records removed too)."""
    for row in rows:
        caused_by = codec.decode_event(row.envelope).causing_command_id
        if caused_by and caused_by != command_id:
            return Corruption(
                group_id,
                row.sequence,
                f"the command record of {command_id} names event {row.sequence}, which command {caused_by} caused: "
                "the sequence was re-used after the log was shortened",
            )
    return None


def check_replayed(
    integrity: LogIntegrity, group_id: str, command_id: str, rows: Sequence[StoredEvent]
) -> None:
    """A replayed command's answer is its own events, never another command's: else the Group is
    marked and DATA_CORRUPTED raised."""
    found = reused(group_id, command_id, rows)
    if found is not None:
        raise integrity.mark(found)
