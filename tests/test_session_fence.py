"""MW-11.3-09: a replacement session's older leases are revoked by the Authority itself.

The rule on the pure core (which leases a new session fences, and the new runtime's own start when
the Authority's revocation has not landed yet), the live-lease index the Authority keeps beside
the log, and the sweep that catches a session whose notification this process never heard (it was
down, or its directory stream resynchronised). The gRPC path in both topologies is
tests/test_work_items.py::test_a_replacement_session_returns_the_work_to_queued_before_the_new_runtime_starts.
"""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.session_fence import SessionFence
from tests import offline_core as core
from tests.conftest import World
from tests.test_work_items import WS, G, setup, started

QUEUED, ACTIVE = WS.WORK_ITEM_STATE_QUEUED, WS.WORK_ITEM_STATE_ACTIVE
REPLACED = wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED


def _running() -> object:
    return core.started(core.with_mission())  # "worker" runs "wi" under lease-1 of its session 1


@pytest.mark.req("MW-11.3-09")
def test_a_new_session_fences_exactly_the_older_sessions_running_leases() -> None:
    state = _running()
    assert decider.decide_session_replaced(state, "worker", 1, core.NOW) == []  # the same session
    assert decider.decide_session_replaced(state, "lead", 2, core.NOW) == []  # another agent
    assert decider.decide_session_replaced(None, "worker", 2, core.NOW) == []  # no such Group
    [event] = decider.decide_session_replaced(state, "worker", 2, core.NOW)
    revoked = event.lease_revoked
    assert event.actor_id == "authority"
    assert (revoked.work_item_id, revoked.lease_id, revoked.session_epoch) == ("wi", core.LEASE_ID, 1)
    assert revoked.cause == REPLACED and revoked.resulting_state == QUEUED
    after = decider.evolve(state, event)
    item = after.work_items["wi"]
    assert item.state == QUEUED and item.lease is None
    assert item.owner is not None and item.owner.agent_id == "worker"  # the ownership stays
    assert decider.decide_session_replaced(after, "worker", 2, core.NOW) == []  # nothing left to do


@pytest.mark.req("MW-11.3-09")
def test_the_new_runtimes_start_revokes_the_old_lease_itself_when_the_authority_has_not_yet() -> None:
    """The fence in the start: whichever comes first, the old lease ends before the new begins."""
    state = _running()
    start = wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-2")
    events = core.decide(state, core.command(state, "work_start", start, "worker", session=2))
    assert not isinstance(events, Exception)
    assert [e.type for e in events] == ["work.lease_revoked", "work.started"]
    assert events[0].lease_revoked.cause == REPLACED and events[0].lease_revoked.resulting_state == QUEUED
    assert events[1].work_started.lease.session_epoch == 2


async def test_the_live_lease_index_follows_the_leases_the_log_records(world: World) -> None:
    """A row while the lease runs, written by the append that started it; gone with the submission."""
    w = world
    store = getattr(w.mesh, "store", None)
    if store is None:
        pytest.skip("reads the Authority's store: single-process topology")
    f = await setup(w)
    epoch = await started(f, w)
    [row] = await store.running_leases("worker-bot")
    assert (row.group_id, row.work_item_id, row.session_epoch) == (G, "wi-1", w.worker.session_epoch)
    assert await store.running_leases("coord-bot") == []
    await f.as_(w.worker, "work_submit", await f.submission(w.worker, "wi-1", epoch, "lease-1"))
    assert await store.running_leases() == []


@pytest.mark.req("MW-11.3-09")
async def test_a_session_opened_while_the_fence_was_not_listening_is_caught_by_the_sweep(
    world: World,
) -> None:
    w = world
    mesh = w.mesh
    if getattr(mesh, "fence", None) is None:
        pytest.skip("drives the Authority's fence: single-process topology")
    await mesh.fence.close()  # as if this process were down when the session opened
    f = await setup(w)
    await started(f, w)
    restarted = await w.client.open_session("worker-bot", w.worker.key)
    assert (await w.client.work_item(G, "wi-1")).state == ACTIVE
    fence = SessionFence(mesh.authority, mesh.identities)  # what a restarted process starts with
    counted = REGISTRY.get_sample_value("mwp_session_lease_revocations_total") or 0.0
    assert await fence.drain() == 1
    assert (REGISTRY.get_sample_value("mwp_session_lease_revocations_total") or 0.0) - counted == 1
    assert (await w.client.work_item(G, "wi-1")).state == QUEUED
    assert await mesh.store.running_leases() == []
    assert await fence.drain() == 0  # swept again: nothing left
    log = [e async for e in w.client.read_events(G)]
    [revoked] = [e.lease_revoked for e in log if e.WhichOneof("payload") == "lease_revoked"]
    assert revoked.cause == REPLACED and restarted.session_epoch > revoked.session_epoch
