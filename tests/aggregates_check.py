"""The running aggregates of a GroupState (D134), recomputed from scratch from the entities alone:
what the property tests compare the ones ``evolve`` keeps with, after every step of a random history."""

from __future__ import annotations

from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.state import SIX, GroupState

_FINISHED = (wp.WORK_ITEM_STATE_VERIFIED, wp.WORK_ITEM_STATE_CANCELLED)


def assert_aggregates_recompute(state: GroupState | None) -> None:
    if state is None:
        return
    tokens: dict[str, str] = {}
    obligations: dict[str, set[str]] = {}
    for wid, item in state.work_items.items():
        if item.lease is not None and item.lease.token_id:
            tokens[item.lease.token_id] = wid
        if item.state in _FINISHED:
            continue
        members = {c for o in item.offers.values() if o.open for c in o.candidate_ids}
        members |= {item.owner.agent_id} if item.owner is not None else set()
        members |= {item.submitted_by} if item.state == wp.WORK_ITEM_STATE_SUBMITTED else set()
        for member in members:
            obligations.setdefault(member, set()).add(wid)
    assert state.tokens == tokens
    committed = dict.fromkeys(SIX, 0)
    for item in state.work_items.values():
        spent_only = item.state in (*_FINISHED, wp.WORK_ITEM_STATE_FAILED)
        for d in SIX:
            committed[d] += (
                item.used[d] if spent_only else max(getattr(item.contract.budget, d), item.used[d])
            )
    assert state.committed == committed
    assert state.obligations == obligations
    assert state.jit_members == {
        m.member_id for m in state.members.values() if m.active and (m.just_in_time or m.provisional)
    }
    for grant_id, grant in state.grants.items():
        counted = {
            wid: charges[grant_id] for wid, charges in state.item_grants.items() if grant_id in charges
        }
        assert grant.charged == {d: sum(b[d] for b in counted.values()) for d in SIX}, grant_id
        assert grant.used == {d: sum(state.work_items[w].used[d] for w in counted) for d in SIX}, grant_id
    assert all(charges and set(charges) <= set(state.grants) for charges in state.item_grants.values())
