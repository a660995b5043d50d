"""A model of the Authority's event store (missionweave_server/services/authority/store.py, schema.py) in memory.

One row per Group: its events, the command records that make commands idempotent
(missionweave_server/services/authority/idempotency.py), and the ownership columns (``owner_instance``,
``lease_expires_us``, ``writer_epoch``). What is modeled, and how:

* ``acquire`` follows ``EventStore.acquire``: an instance takes a Group when it already owns it or
  the ownership lease expired, and each take raises the writer epoch (fencing the previous owner).
* ``append`` follows the group commit's fence ``WHERE writer_epoch = :e AND head_seq = :expected``:
  an append by a fenced writer or from a stale head changes nothing.
* Durability: an append lands in the unsynced tail; ``sync`` makes the whole log durable (fsync);
  ``power_loss`` keeps only the synced prefix. The real store commits and syncs in one transaction;
  the model separates the two so that an acknowledgement sent before the sync can be caught.

Each row also keeps the fold of its events (``state``, for the invariants and the owner's load) and
of its synced prefix (``synced_state``: what readers and the gateway see).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from missionweave.v1 import command_pb2, event_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.idempotency import fingerprint
from missionweave_server.services.authority.state import GroupState


@dataclass(frozen=True)
class CommandRecord:
    command_id: str
    fingerprint: bytes
    first_seq: int
    last_seq: int


@dataclass
class GroupRow:
    group_id: str
    writer_epoch: int = 0
    owner: str = ""
    lease_expires_ms: int = 0
    events: list[event_pb2.Event] = field(default_factory=list)
    records: dict[str, CommandRecord] = field(default_factory=dict)
    synced: int = 0  # events[:synced] survive a power loss
    state: GroupState | None = None
    synced_state: GroupState | None = None

    @property
    def head(self) -> int:
        return len(self.events)


class NotOwner(Exception):
    def __init__(self, owner: str) -> None:
        super().__init__(owner)
        self.owner = owner


class Store:
    def __init__(self, ownership_ttl_ms: int) -> None:
        self.ttl = ownership_ttl_ms
        self.rows: dict[str, GroupRow] = {}
        self.power_losses = 0  # what was stored changes only by appends and by these

    def row(self, group_id: str) -> GroupRow | None:
        return self.rows.get(group_id)

    def acquire(self, group_id: str, instance: str, now_ms: int) -> GroupRow:
        """Take (or take again) ownership: a new writer epoch. A missing Group's row is created
        (the model's stand-in for the creating append's insert)."""
        row = self.rows.setdefault(group_id, GroupRow(group_id))
        if row.owner and row.owner != instance and row.lease_expires_ms > now_ms:
            raise NotOwner(row.owner)
        row.writer_epoch += 1
        row.owner, row.lease_expires_ms = instance, now_ms + self.ttl
        return row

    def renew(self, group_id: str, instance: str, writer_epoch: int, now_ms: int) -> bool:
        row = self.rows.get(group_id)
        if row is None or row.owner != instance or row.writer_epoch != writer_epoch:
            return False
        row.lease_expires_ms = now_ms + self.ttl
        return True

    def append(
        self,
        group_id: str,
        writer_epoch: int,
        expected_head: int,
        batch: list[tuple[command_pb2.Command, list[event_pb2.Event]]],
    ) -> bool:
        """One fenced group-commit append of several commands' events; False when fenced."""
        row = self.rows[group_id]
        if row.writer_epoch != writer_epoch or row.head != expected_head:
            return False
        for command, events in batch:
            first = row.head + 1
            for event in events:
                stored = copy.deepcopy(event)
                stored.writer_epoch = writer_epoch
                row.events.append(stored)
                row.state = decider.evolve(row.state, stored)
            row.records[command.command_id] = CommandRecord(
                command.command_id, fingerprint(command), first, row.head
            )
        return True

    def sync(self) -> None:
        for group_id in sorted(self.rows):
            row = self.rows[group_id]
            for event in row.events[row.synced :]:
                row.synced_state = decider.evolve(row.synced_state, event)
            row.synced = row.head

    def unsynced(self) -> int:
        return sum(row.head - row.synced for row in self.rows.values())

    def power_loss(self) -> int:
        """Only the synced prefix survives (and the ownership columns, written synchronously)."""
        lost = 0
        self.power_losses += 1
        for row in self.rows.values():
            lost += row.head - row.synced
            del row.events[row.synced :]
            row.records = {cid: r for cid, r in row.records.items() if r.last_seq <= row.synced}
            row.state = copy.deepcopy(row.synced_state)
        return lost
