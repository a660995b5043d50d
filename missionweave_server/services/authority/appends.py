"""Appending: how a decision's events become the rows of one append to the group commit.

Each event carries the Group's writer epoch and names the digest of the one before it (the chain,
docs/integrity.md); it is signed here, or by the store's writer beside the commit (D56). An erasure
re-signs the events its tombstones list with their content cleared (``erasures``), and an append
changes the live-lease index rows of the WorkItems it touches (``lease_changes``). The command path
(authority.py) builds the AppendRequest from these.
"""

from __future__ import annotations

from missionweave.kernel import codec
from missionweave.kernel.clock import timestamp_micros
from missionweave.kernel.eventlog import event_digest
from missionweave.kernel.signing import EVENT_TYPE
from missionweave.v1 import common_pb2, event_pb2
from missionweave_server.services.authority.aggregates import named_work_item
from missionweave_server.services.authority.integrity import LogIntegrity
from missionweave_server.services.authority.loading import Sign
from missionweave_server.services.authority.reads import EventReads
from missionweave_server.services.authority.rules.conversations import erased, erasure_targets
from missionweave_server.services.authority.state import GroupState
from missionweave_server.services.authority.store import StoredEvent


def chain(decision: list[event_pb2.Event], writer_epoch: int, link: bytes) -> tuple[list[bytes], bytes]:
    """The events' payloads, each naming the digest of the one before it (``link``: the digest at
    the Group's head, which this instance knows without reading the store again), and the digest
    of the last one."""
    payloads = []
    for event in decision:
        event.writer_epoch = writer_epoch
        if event.sequence > 1:
            event.previous_digest = link
        payload = event.SerializeToString(deterministic=True)
        link = event_digest(payload)
        payloads.append(payload)
    return payloads, link


def rows(
    decision: list[event_pb2.Event], payloads: list[bytes], sign: Sign | None
) -> tuple[list[common_pb2.SignedEnvelope] | None, list[StoredEvent]]:
    """The events' envelopes and store rows; ``sign`` None: the store's writer signs them (D56), and
    the rows carry no envelope yet."""
    if sign is None:
        return None, [_stored(event, b"") for event in decision]
    envelopes = [sign(p, EVENT_TYPE) for p in payloads]
    return envelopes, [
        _stored(event, env.SerializeToString()) for event, env in zip(decision, envelopes, strict=True)
    ]


async def erasures(
    group_id: str, decision: list[event_pb2.Event], reads: EventReads, integrity: LogIntegrity, sign: Sign
) -> list[tuple[int, bytes]]:
    """MW-7.4-04/05: each event a tombstone lists, re-signed with its content cleared and a
    marker naming the tombstone (the core's ``erased``)."""
    rewrites: list[tuple[int, bytes]] = []
    for tombstone, sequence in erasure_targets(decision):
        # Verified first: re-signing a tampered event would launder it.
        (stored,) = await reads.range(group_id, sequence, sequence)
        event = erased(codec.decode_event(stored.envelope), tombstone, stored.envelope)
        envelope = sign(event.SerializeToString(deterministic=True), EVENT_TYPE)
        rewrites.append((sequence, envelope.SerializeToString()))
        integrity.verified.forget(stored.envelope)  # the original may never be served again
    return rewrites


def running_leases(state: GroupState | None, events: list[event_pb2.Event]) -> dict[str, tuple[str, int]]:
    """(agent, session epoch) of the running lease of each WorkItem the events name."""
    running: dict[str, tuple[str, int]] = {}
    if state is None:
        return running
    for event in events:
        work_item_id = named_work_item(event)
        item = state.work_items.get(work_item_id) if work_item_id else None
        if item is not None and item.lease is not None:
            running[work_item_id] = (item.lease.agent_id, item.lease.session_epoch)
        elif work_item_id:
            running[work_item_id] = ("", 0)
    return running


def lease_changes(
    before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]
) -> list[tuple[str, str, int]]:
    """The live-lease index rows an append changes: (WorkItem, agent, session epoch), agent "" = none."""
    return [
        (work_item_id, *now)
        for work_item_id, now in after.items()
        if before.get(work_item_id, ("", 0)) != now
    ]


def _stored(event: event_pb2.Event, envelope: bytes) -> StoredEvent:
    return StoredEvent(
        sequence=event.sequence,
        event_id=event.event_id,
        type=event.type,
        recorded_us=timestamp_micros(event.recorded_at),
        envelope=envelope,
    )
