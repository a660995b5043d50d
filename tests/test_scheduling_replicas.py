"""Two SchedulingService replicas behind one front door: every call about a Worker reaches the
replica that holds its scheduler, and a replica that goes away hands its Workers to the other,
which rebuilds their queues from the stored projections (D89, D95)."""

from __future__ import annotations

from typing import Any

import pytest

from missionweave.sdk.client import MeshClient
from missionweave.v1 import scheduling_service_pb2 as pb
from missionweave.v1 import scheduling_service_pb2_grpc as pb_grpc
from missionweave_server.edge.affinity import worker_of
from tests.conftest import World
from tests.test_missions import G
from tests.test_work_items import Flow, setup

pytestmark = pytest.mark.topologies("split-replicated")


def holders(w: World, worker_id: str) -> list[str]:
    """The replicas (parts) holding a scheduler for ``worker_id``."""
    mesh: Any = w.mesh
    return [
        name for name in ("scheduling", "scheduling-1") if worker_id in mesh.parts[name].schedulers._workers
    ]


@pytest.mark.req("MW-11.1-03")
async def test_a_workers_calls_stay_on_one_replica_and_fail_over_with_its_queue(world: World) -> None:
    w = world
    flow: Flow = await setup(w)
    await flow.authorize("wi-1")
    await flow.accept(w.worker, "wi-1", await flow.offer("wi-1", "worker-bot"))
    worker = MeshClient(w.target, reader=w.worker)
    owner = MeshClient(w.target, reader=w.owner)
    try:
        mine = pb_grpc.SchedulingServiceStub(worker.channel)
        for _ in range(5):  # each a separate call, each to the Worker's replica
            queue = (await mine.GetQueue(pb.GetQueueRequest(group_id=G))).queue
        assert [e.work_item_id for e in queue.entries] == ["wi-1"]
        [held] = holders(w, "worker-bot")
        # The MissionOwner's escalation names the Worker: it reaches the same scheduler.
        escalated = await pb_grpc.SchedulingServiceStub(owner.channel).SetPriority(
            pb.SetPriorityRequest(
                group_id=G,
                work_item_id="wi-1",
                priority_class=pb.PRIORITY_CLASS_URGENT,
                source=pb.PRIORITY_SOURCE_MISSION_OWNER,
                worker_id="worker-bot",
            )
        )
        assert [e.work_item_id for e in escalated.queue.entries] == ["wi-1"]
        assert holders(w, "worker-bot") == [held] and "alice" not in holders(w, "alice")
        # The replica goes away: the Worker's next call is served by the other, from the projection.
        mesh: Any = w.mesh
        await mesh.parts[held].stop(grace=0)
        queue = (await mine.GetQueue(pb.GetQueueRequest(group_id=G))).queue
        assert [e.work_item_id for e in queue.entries] == ["wi-1"]
        assert queue.projected_sequence == (await w.client.group_state(G)).head_sequence
        placed = await mine.NextSlot(pb.NextSlotRequest())
        assert placed.assignment.work_item_id == "wi-1"
    finally:
        await worker.channel.close()
        await owner.channel.close()


def test_the_worker_of_a_call_is_its_named_worker_or_the_caller() -> None:
    request = pb.SetPriorityRequest(group_id=G, worker_id="worker-7")
    assert (
        worker_of("/missionweave.v1.SchedulingService/SetPriority", request.SerializeToString(), ())
        == "worker-7"
    )
    assert worker_of("/missionweave.v1.SchedulingService/GetQueue", b"", ()) == ""
    assert (
        worker_of("/missionweave.v1.SchedulingService/GetQueue", b"", (("mwp-call-proof-bin", b"\xff\xff"),))
        == ""
    )
