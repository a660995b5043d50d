"""The SDK's Worker runtime end to end through the gateway, in both topologies: one Worker serving
two Missions at once, admitting offers through its scheduler, running them in its slots and
submitting; each handler sees only its own slot (MW-11.1-05, MW-11.1-15, MW-10.3-07)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from missionweave.sdk.worker import Slot, WorkerRuntime, WorkResult
from missionweave.v1 import membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave.v1.authority_service_pb2 import GetMissionProgressRequest
from tests import builders
from tests.conftest import World
from tests.test_agent_sdk import connect
from tests.test_missions import G
from tests.test_work_items import Flow, setup

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

G2 = "grp_second"


@pytest.mark.req("MW-11.1-05", "MW-11.1-15", "MW-10.3-07")
async def test_a_worker_serves_two_missions_through_its_scheduler(world: World, tmp_path: Path) -> None:
    w = world
    flow: Flow = await setup(w)
    await w.run(w.owner, G2, "mission_create", builders.mission_create("alice", "coord-bot", w.clock.now()))
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G2, "membership_grant", grant, membership_epoch=1)
    seen: list[Slot] = []

    async def handle(slot: Slot) -> WorkResult:
        seen.append(slot)
        assert not hasattr(slot, "runtime") and not hasattr(slot, "agent")  # nothing beyond its own work
        return WorkResult(artifacts=[builders.artifact()], evidence=[builders.evidence()], summary=f"did {slot.work_item_id}")

    async with connect(w, "worker-bot", w.worker.key, tmp_path) as agent:
        runtime = WorkerRuntime(agent, handle)
        await runtime.serve([G, G2])
        try:
            await flow.authorize("wi-1")
            await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))
            body = wp.WorkAuthorize(work_item_id="wi-9", title="t", contract=builders.contract(w.clock.now()), coordinator_epoch=1)
            await w.run(w.coordinator, G2, "work_authorize", body, membership_epoch=2)
            await w.run(w.coordinator, G2, "work_offer", flow.offer_body("wi-9", "worker-bot"), membership_epoch=2)
            async with asyncio.timeout(30):
                done = await runtime.submitted(2)
        finally:
            await runtime.close()
    assert sorted(done) == sorted([(G, "wi-1"), (G2, "wi-9")])
    for group, wid in done:
        progress = await w.client.authority.GetMissionProgress(GetMissionProgressRequest(group_id=group))
        assert {p.work_item_id: p.state for p in progress.work_items}[wid] == wp.WORK_ITEM_STATE_SUBMITTED
    tokens = {s.token.token_id for s in seen if s.token is not None}
    assert len(tokens) == len(seen) == 2  # each slot its own capability token
    keys = {s.idempotency_key("send") for s in seen}
    assert len(keys) == 2  # and its own side-effect keys
