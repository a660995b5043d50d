"""``mwp verify``: the whole store checked offline (docs/integrity.md, issue 13 item 5).

For every Group: each event's signature by a key of the recorded key history, its place (Group,
sequence, id, type), sequence continuity across the online log and the archive tier, the event
chain, erasures, the Group row's head against the log, the command records, outbox rows, snapshots and
checkpoint against the head (a shortened log), each event against the command record naming its
sequence (a sequence re-used),
each stored snapshot (signature, digest, the event digest it names, and the state it holds
against the state folded from the log at its sequence), and the Group's signed chain checkpoint. Before the Groups: the key history itself
(each rotation signed by the key before it) and whether the configured key file is its current key.

Read-only as far as the log goes; it never stops at the first finding (each Group is checked up to
its first failure, and every Group is checked).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import distinct, func, select, union
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.kernel.clock import SystemClock
from missionweave.kernel.eventlog import Chain, Corruption, inspect, verified_checkpoint, verified_snapshot
from missionweave.kernel.signing import authority_key_id
from missionweave.v1 import authority_service_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.keys import KeyContinuityError, KeyHistory, load_history
from missionweave_server.services.authority.ownership_seal import OwnershipSeal
from missionweave_server.services.authority.schema import (
    chain_checkpoints,
    commands,
    cross_group_outbox,
    events,
    events_archive,
    groups,
    snapshots,
)
from missionweave_server.services.authority.state import GroupState
from missionweave_server.services.authority.store import EventStore, RecordedSequences
from missionweave_server.services.authority.truncation import past_head
from missionweave_server.services.authority.views import group_state_proto
from missionweave_server.verification.verify_worker import check as check_signature

READ_BATCH = 1024


@dataclass
class Finding:
    group_id: str  # "" for the store itself (the key history)
    sequence: int
    detail: str

    def as_dict(self) -> dict[str, object]:
        return {"group_id": self.group_id, "sequence": self.sequence, "detail": self.detail}


@dataclass
class Report:
    groups: int = 0
    events: int = 0
    unlinked_events: int = 0  # appended before the chain existed (D72): signature and sequence only
    snapshots: int = 0
    # Ownership rows without a seal (from before authority_0002): they hold no lease (D171), so not a finding.
    unsealed_ownership: int = 0
    keys: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.findings

    @property
    def corrupted_groups(self) -> list[str]:
        return sorted({f.group_id for f in self.findings if f.group_id})

    def as_dict(self) -> dict[str, object]:
        return {
            "clean": self.clean,
            "groups": self.groups,
            "events": self.events,
            "unlinked_events": self.unlinked_events,
            "snapshots": self.snapshots,
            "unsealed_ownership": self.unsealed_ownership,
            "keys": self.keys,
            "corrupted_groups": self.corrupted_groups,
            "findings": [f.as_dict() for f in self.findings],
            "seconds": round(self.seconds, 3),
        }


Progress = Callable[[int, int, int], None]  # (groups done, groups in all, events so far)


async def verify_store(
    engine: AsyncEngine, key_file: tuple[Path, bytes] | None = None, progress: Progress | None = None
) -> Report:
    """``key_file``: where the Authority's key file is and its public key, when there is one."""
    started = time.monotonic()
    report = Report()
    try:
        history = await load_history(engine)
    except KeyContinuityError as broken:
        report.findings.append(Finding("", 0, f"key history: {broken}"))
        history = KeyHistory(())
    keys = history.keys
    if key_file is not None:
        path, public_key = key_file
        configured = authority_key_id(public_key)
        if not history.records:
            keys = {configured: public_key}  # a store not started since key continuity existed
        elif configured != history.current.key_id:
            report.findings.append(
                Finding(
                    "",
                    0,
                    f"the key file {path} holds {configured}, not the store's current key "
                    f"{history.current.key_id}: the Authority would refuse to start",
                )
            )
    report.keys = list(keys)
    if not keys:
        report.findings.append(
            Finding("", 0, "no key history is recorded and no Authority key file was found")
        )
    store = EventStore(engine, SystemClock())
    group_ids = await _all_groups(engine)
    for done, group_id in enumerate(group_ids):
        await _verify_group(engine, store, group_id, keys, report)
        report.groups += 1
        if progress is not None:
            progress(done + 1, len(group_ids), report.events)
    await _verify_ownership(engine, OwnershipSeal(None, keys.values()), report)
    report.seconds = time.monotonic() - started
    return report


async def _verify_ownership(engine: AsyncEngine, seal: OwnershipSeal, report: Report) -> None:
    """Every ownership row is sealed by a key of the history, or unsealed (D171)."""
    query = select(groups.c.group_id, groups.c.owner_instance, groups.c.writer_epoch, groups.c.owner_seal)
    async with engine.connect() as conn:
        rows = (await conn.execute(query.order_by(groups.c.group_id))).all()
    for row in rows:
        if row.owner_seal is None:
            report.unsealed_ownership += 1
        elif not seal.holds(row.group_id, row.owner_instance, int(row.writer_epoch), row.owner_seal):
            report.findings.append(
                Finding(
                    row.group_id,
                    0,
                    f"the Group's ownership row (owner {row.owner_instance}, writer epoch {row.writer_epoch}) "
                    "is not sealed by the Authority key",
                )
            )


async def _all_groups(engine: AsyncEngine) -> list[str]:
    """Every Group with a row, or with events stored under its id (a row deleted is a finding)."""
    query = union(
        select(groups.c.group_id),
        select(distinct(events.c.group_id)),
        select(distinct(events_archive.c.group_id)),
    )
    async with engine.connect() as conn:
        return sorted(r[0] for r in await conn.execute(query))


async def _verify_group(
    engine: AsyncEngine, store: EventStore, group_id: str, keys: dict[str, bytes], report: Report
) -> None:
    async with engine.connect() as conn:
        head = (
            await conn.execute(select(groups.c.head_seq).where(groups.c.group_id == group_id))
        ).scalar_one_or_none()
        # Every command record, in log order: each event must be one its record's command caused.
        records = [
            (int(r[0]), int(r[1]), str(r[2]))
            for r in await conn.execute(
                select(commands.c.first_seq, commands.c.last_seq, commands.c.command_id)
                .where(commands.c.group_id == group_id)
                .order_by(commands.c.first_seq, commands.c.last_seq)
            )
        ]
        last_outbox = (
            await conn.execute(
                select(func.max(cross_group_outbox.c.source_seq)).where(
                    cross_group_outbox.c.source_group_id == group_id
                )
            )
        ).scalar_one_or_none()
        checkpoint = (
            await conn.execute(
                select(chain_checkpoints.c.seq, chain_checkpoints.c.envelope).where(
                    chain_checkpoints.c.group_id == group_id
                )
            )
        ).first()
        stored_snapshots = {
            int(r[0]): (r[1], bytes(r[2]))
            for r in await conn.execute(
                select(snapshots.c.seq, snapshots.c.digest, snapshots.c.envelope).where(
                    snapshots.c.group_id == group_id
                )
            )
        }
    report.snapshots += len(stored_snapshots)
    chain = Chain(group_id)
    state: GroupState | None = None
    try:
        if head is None:
            raise Corruption(group_id, 0, "events are stored for a Group that has no Group row")
        if checkpoint is not None:  # every signature is checked here anyway; the chain must meet it
            chain.checkpoint = verified_checkpoint(group_id, int(checkpoint[0]), bytes(checkpoint[1]), keys)
        snapshot_at = {
            seq: verified_snapshot(group_id, seq, d, env, keys)[1]
            for seq, (d, env) in stored_snapshots.items()
        }
        owners = _CommandRecords(group_id, records)
        while True:
            batch = await store.read_history(group_id, chain.last, READ_BATCH)
            if not batch:
                break
            for row in batch:
                checked, signature, event = inspect(
                    group_id, row.sequence, row.event_id, row.type, row.envelope, keys
                )
                if not check_signature(signature.message, signature.signature, signature.public_key):
                    raise Corruption(group_id, row.sequence, "the Authority's signature does not verify")
                chain.advance(checked)
                owners.check(row.sequence, event.causing_command_id)
                report.events += 1
                if row.sequence > 1 and not checked.previous:
                    report.unlinked_events += 1
                state = decider.evolve(state, event)
                snapshot = snapshot_at.get(row.sequence)
                if snapshot is not None:
                    _check_snapshot_state(group_id, row.sequence, snapshot, checked.link, state)
        if chain.checkpoint is not None and chain.last < chain.checkpoint[0]:
            raise Corruption(group_id, chain.last + 1, "the log ends before its signed chain checkpoint")
        if chain.last != head:
            raise Corruption(
                group_id, chain.last + 1, f"the log ends at {chain.last} but the Group's head is {head}"
            )
        shortened = past_head(
            group_id,
            RecordedSequences(
                head,
                max((last for _, last, _ in records), default=None),
                max(snapshot_at, default=None),
                None if checkpoint is None else int(checkpoint[0]),
                None if last_outbox is None else int(last_outbox),
            ),
        )
        if shortened is not None:
            raise shortened
        if (
            owners.reused is not None
        ):  # reported once the events themselves verified (their own failures first)
            raise owners.reused
    except Corruption as corruption:
        report.findings.append(Finding(group_id, corruption.sequence, corruption.detail))


class _CommandRecords:
    """The Group's command records in log order, walked beside its events: the event at each
    sequence a record names must be one that record's command caused (``Event.causing_command_id``,
    signed), and no two records may name the same sequence. A sequence given again after the log was
    shortened (and the head restored by later appends) shows here: the earlier command's record
    still names it, and the event there is another command's."""

    def __init__(self, group_id: str, records: list[tuple[int, int, str]]) -> None:
        self.group_id = group_id
        self.records = [r for r in records if r[1] >= r[0]]  # a record of no events names no sequence
        self.next = 0
        self.reused: Corruption | None = None  # the first sequence found re-used

    def check(self, sequence: int, caused_by: str) -> None:
        if self.reused is None:
            try:
                self._check(sequence, caused_by)
            except Corruption as found:
                self.reused = found

    def _check(self, sequence: int, caused_by: str) -> None:
        records = self.records
        while self.next < len(records) and records[self.next][1] < sequence:
            self.next += 1
        if self.next == len(records) or records[self.next][0] > sequence:
            return  # no record names it (records removed: nothing to compare with)
        command_id = records[self.next][2]
        if self.next + 1 < len(records) and records[self.next + 1][0] <= sequence:
            raise Corruption(
                self.group_id,
                sequence,
                f"two command records ({command_id}, {records[self.next + 1][2]}) name event {sequence}: "
                "the sequence was re-used after the log was shortened",
            )
        if caused_by and caused_by != command_id:
            raise Corruption(
                self.group_id,
                sequence,
                f"the command record of {command_id} names event {sequence}, which command {caused_by} caused: "
                "the sequence was re-used after the log was shortened",
            )


def _check_snapshot_state(
    group_id: str,
    sequence: int,
    snapshot: authority_service_pb2.GroupSnapshot,
    link: bytes,
    state: GroupState | None,
) -> None:
    if snapshot.last_event_digest and snapshot.last_event_digest != link:
        raise Corruption(
            group_id, sequence, "snapshot: it names another event digest than the log's at its sequence"
        )
    if state is not None and snapshot.state.SerializeToString(deterministic=True) != group_state_proto(
        state
    ).SerializeToString(deterministic=True):
        raise Corruption(group_id, sequence, "snapshot: its state differs from the state folded from the log")
