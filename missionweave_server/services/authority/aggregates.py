"""The WorkItem indexes of a GroupState (D134): kept by ``evolve`` beside each WorkItem it changes.

A command's checks read them instead of scanning every WorkItem: which WorkItem a capability token
is current on, and on which WorkItems a member holds an obligation. ``evolve`` takes a WorkItem's
keys before an event and re-files it after (the event's payload names the WorkItem it changes); the
property tests check the result against a recomputation from scratch. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from missionweave.v1 import event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.state import SIX, GroupState, WorkItemState

FINISHED = frozenset({wp.WORK_ITEM_STATE_VERIFIED, wp.WORK_ITEM_STATE_CANCELLED})
# A failed WorkItem holds no budget until it is offered again (MW-10.2-03): what it used stays spent.
HOLDS_ONLY_USAGE = FINISHED | {wp.WORK_ITEM_STATE_FAILED}
_ZERO = (0,) * len(SIX)


@dataclass(frozen=True)
class ItemKeys:
    """Where a WorkItem is filed in the indexes."""

    token_id: str = ""
    obligated: frozenset[str] = frozenset()
    committed: tuple[int, ...] = _ZERO  # what it holds of the Mission's budget, per dimension of SIX


NONE = ItemKeys()


# The Event payloads that have a work_item_id field (asking the others for it would raise inside
# getattr, once per event of every fold).
_NAMING_PAYLOADS = frozenset(
    f.name
    for f in event_pb2.Event.DESCRIPTOR.oneofs_by_name["payload"].fields
    if f.message_type is not None and "work_item_id" in f.message_type.fields_by_name
)


def named_work_item(event: event_pb2.Event, payload: str | None = None) -> str:
    """The WorkItem an event names (its payload's work_item_id), "" when none: every evolve rule that
    changes a WorkItem names it so. ``payload``: the event's payload name, when the caller has it."""
    if payload is None:
        payload = event.WhichOneof("payload")
    return str(getattr(event, payload).work_item_id) if payload in _NAMING_PAYLOADS else ""


def keys_of(item: WorkItemState | None) -> ItemKeys:
    if item is None:
        return NONE
    lease = item.lease
    return ItemKeys(lease.token_id if lease is not None else "", obligated_members(item), committed_by(item))


def committed_by(item: WorkItemState) -> tuple[int, ...]:
    """What ``item`` holds of its Mission's budget (D162), per dimension of SIX."""
    used = item.used
    if item.state in HOLDS_ONLY_USAGE or item.contract is None:
        return tuple(used[d] for d in SIX)
    budget = item.contract.budget
    return tuple(max(getattr(budget, d), used[d]) for d in SIX)


def obligated_members(item: WorkItemState) -> frozenset[str]:
    """Who holds an obligation on ``item`` (MW-8-06): its owner, the submitter of a submission
    awaiting review, the candidates of its open offers; nobody once it is finished."""
    if item.state in FINISHED:
        return frozenset()
    members = {c for offer in item.offers.values() if offer.open for c in offer.candidate_ids}
    if item.owner is not None:
        members.add(item.owner.agent_id)
    if item.state == wp.WORK_ITEM_STATE_SUBMITTED and item.submitted_by:
        members.add(item.submitted_by)
    return frozenset(members)


def refile(state: GroupState, work_item_id: str, before: ItemKeys) -> None:
    """Evolve: ``work_item_id`` was filed under ``before``; file it under what it is now. An entry
    already gone is no error: tests build states by setting WorkItem fields outside evolve."""
    after = keys_of(state.work_items.get(work_item_id))
    if before.token_id != after.token_id:
        if before.token_id:
            state.tokens.pop(before.token_id, None)
        if after.token_id:
            state.tokens[after.token_id] = work_item_id
    for member in before.obligated - after.obligated:
        items = state.obligations.get(member, set())
        items.discard(work_item_id)
        if not items:
            state.obligations.pop(member, None)
    for member in after.obligated - before.obligated:
        state.obligations.setdefault(member, set()).add(work_item_id)
    if before.committed != after.committed:
        for d, was, now in zip(SIX, before.committed, after.committed, strict=True):
            state.committed[d] += now - was
