"""One group-commit batch as one transaction: fenced head advances, event and command rows.

Written once against ``BatchOps``: on PostgreSQL it runs over a SQLAlchemy connection (asyncpg,
inside ``run_sync``), on SQLite in the writer process over the ``sqlite3`` module
(``writer_process.py``, D53). Pure and synchronous: no event loop, no futures; an append is an
``AppendRecord`` (``store.AppendRequest`` is one, with its future).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2
from missionweave_server.services.authority.batch_sql import BatchOps, Collision

R = common_pb2.RejectionReason


@dataclass(frozen=True)
class StoredEvent:
    sequence: int
    event_id: str
    type: str
    recorded_us: int
    envelope: bytes


@dataclass
class AppendRecord:
    """An append: what the batch writer stores (``store.AppendRequest`` adds its caller's future)."""

    group_id: str
    writer_epoch: int
    expected_head: int
    command_id: str
    fingerprint: bytes
    events: list[StoredEvent]
    creates_group: bool
    # (sequence, new envelope) of earlier events to replace in the same transaction (erasures).
    rewrites: list[tuple[int, bytes]] = field(default_factory=list)
    # The events' payloads when the writer is to sign them (D56): their envelopes are empty until
    # it has (``writer_process.EventSigner``).
    payloads: list[bytes] = field(default_factory=list)
    # (event sequence, target Group) of its events that another Group must apply: the cross-Group
    # outbox rows written in the same transaction (MW-10.4-05).
    links: list[tuple[int, str]] = field(default_factory=list)
    # (WorkItem, agent, session epoch) of each WorkItem whose execution lease began or ended (agent
    # "": ended): the live-lease index rows written in the same transaction (MW-11.3-09).
    leases: list[tuple[str, str, int]] = field(default_factory=list)
    # The W3C traceparent of the decision that made it ("" untraced): the commit spans link to it.
    traceparent: str = ""
    # A creating append: the Authority key's seal of (group, this instance, writer epoch) for the
    # new ownership row (missionweave_server/services/authority/ownership_seal.py).
    owner_seal: bytes = b""


class BatchWriter:
    def __init__(self, instance_id: str, ttl_us: int) -> None:
        self.instance_id = instance_id
        self.ttl_us = ttl_us

    def write(self, ops: BatchOps, batch: Sequence[AppendRecord], now: int) -> list[Rejected | None]:
        """One transaction for the whole batch; returns each request's outcome (None = appended).

        Synchronous on purpose: it runs in the SQLite writer process, or in SQLAlchemy's greenlet for
        asyncpg, so the batch costs the event loop a single hop either way.
        """
        expires = now + self.ttl_us
        try:
            with ops.transaction():
                updates = [req for req in batch if not req.creates_group]
                heads = _chained_heads(updates, expires) if len(updates) >= 2 else None
                # Fast path: every head of the batch at once (all matched, or nothing changed).
                if heads is not None and ops.advance_heads(heads):
                    for req in batch:
                        if req.creates_group:
                            self._create(ops, req, now)
                    outcomes: list[Rejected | None] = [None] * len(batch)
                else:  # one statement per request, so that each loser learns why
                    outcomes = [self._apply(ops, req, now, expires) for req in batch]
                accepted = [req for req, ok in zip(batch, outcomes, strict=True) if ok is None]
                if accepted:
                    ops.insert_rows(
                        [
                            (
                                r.group_id,
                                e.sequence,
                                e.event_id,
                                e.type,
                                r.command_id,
                                e.recorded_us,
                                e.envelope,
                            )
                            for r in accepted
                            for e in r.events
                        ],
                        [
                            (
                                r.group_id,
                                r.command_id,
                                r.fingerprint,
                                r.expected_head + 1,
                                r.expected_head + len(r.events),
                                len(r.events),
                            )
                            for r in accepted
                        ],
                    )
                    rewrites = [(env, r.group_id, seq) for r in accepted for seq, env in r.rewrites]
                    if rewrites:
                        ops.rewrite_envelopes(rewrites)
                    links = [(r.group_id, seq, target, now) for r in accepted for seq, target in r.links]
                    if links:
                        ops.insert_links(links)
                    leases = [(r.group_id, *lease) for r in accepted for lease in r.leases]
                    if leases:
                        ops.record_leases(leases)
                return outcomes
        except Collision:
            # One request collided (a Group created twice, a command raced on another instance):
            # retry each on its own so the others still land.
            if len(batch) == 1:
                return [self._integrity_rejection(batch[0])]
            return [self.write(ops, [req], now)[0] for req in batch]

    def _create(self, ops: BatchOps, req: AppendRecord, now: int) -> None:
        ops.insert_group(
            (
                req.group_id,
                req.expected_head + len(req.events),
                req.writer_epoch,
                self.instance_id,
                now + self.ttl_us,
                now,
                req.owner_seal or None,
            )
        )

    def _apply(self, ops: BatchOps, req: AppendRecord, now: int, expires: int) -> Rejected | None:
        if req.creates_group:
            self._create(ops, req, now)
            return None
        if ops.advance_head(_head_row(req, expires)):
            return None
        found = ops.head_of(req.group_id)
        if found is None:
            return Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {req.group_id} does not exist")
        writer_epoch, head = found
        if writer_epoch != req.writer_epoch:
            return Rejected(
                R.REJECTION_REASON_WRITER_FENCED,
                f"writer epoch {req.writer_epoch} of group {req.group_id} was superseded by {writer_epoch}",
                current_writer_epoch=writer_epoch,
            )
        return Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"group {req.group_id} head moved to {head} (expected {req.expected_head})",
            current_revision=head,
        )

    @staticmethod
    def _integrity_rejection(req: AppendRecord) -> Rejected:
        if req.creates_group:
            return Rejected(R.REJECTION_REASON_GROUP_EXISTS, f"group {req.group_id} already exists")
        return Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"a concurrent append to group {req.group_id} (or the same command id) won",
        )


def _head_row(req: AppendRecord, expires: int) -> tuple[int | str, ...]:
    return (req.group_id, req.writer_epoch, req.expected_head, req.expected_head + len(req.events), expires)


def _chained_heads(updates: Sequence[AppendRecord], expires: int) -> list[tuple[int | str, ...]] | None:
    """One head advance per Group: a Group's pipelined appends in a batch form a chain (each expects
    the head its predecessor leaves), so together they move the head from the first expected to the
    last new one. None when some Group's appends do not chain: the per-request path sorts them out."""
    heads: dict[str, tuple[int | str, ...]] = {}
    for req in updates:
        row = _head_row(req, expires)
        prior = heads.get(req.group_id)
        if prior is not None:
            if prior[1] != req.writer_epoch or prior[3] != req.expected_head:
                return None
            row = (req.group_id, req.writer_epoch, prior[2], row[3], expires)
        heads[req.group_id] = row
    return list(heads.values())
