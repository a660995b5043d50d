"""The global scheduler sees scheduling metadata and never confidential Mission content
(MW-13.3-08, MW-13.3-09): it follows each Group in GroupLogService's SCHEDULING view, which the
Authority reduces by an allow-list (missionweave_server/services/authority/scheduling_view.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from sqlalchemy import select

from missionweave.internal.v1 import group_log_pb2 as glpb
from missionweave.kernel import codec
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.client import blob_digest
from missionweave.v1 import common_pb2, conversation_pb2, membership_pb2
from missionweave.v1 import scheduling_service_pb2 as pb
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.scheduling_view import KEPT, scheduling_event
from missionweave_server.services.scheduling import projection as scheduling_projection
from missionweave_server.services.scheduling.store import projections
from tests import builders
from tests.conftest import World
from tests.test_artifact_service import manifest_for
from tests.test_missions import G
from tests.test_scheduling_projection import Log, projected
from tests.test_scheduling_service import Schedulers, sched  # noqa: F401 (the fixture)
from tests.test_work_items import Flow

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)


class FollowSpy:
    """Stands in for the scheduling service's GroupLogService stub: relays every FollowGroup and
    keeps the requests and the bytes of every answer the scheduler received."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self.requests: list[glpb.FollowGroupRequest] = []
        self.received: list[bytes] = []

    def FollowGroup(
        self, request: glpb.FollowGroupRequest, **kw: Any
    ) -> AsyncIterator[glpb.FollowGroupResponse]:
        self.requests.append(request)
        return self._relay(self._stub.FollowGroup(request, **kw))

    async def _relay(self, call: Any) -> AsyncIterator[glpb.FollowGroupResponse]:
        try:
            async for answer in call:
                self.received.append(answer.SerializeToString())
                yield answer
        finally:
            call.cancel()


def scheduling_part(w: World) -> Any:
    """The mesh (or, split, the process) that serves the SchedulingService."""
    parts = getattr(w.mesh, "parts", None)
    return parts["scheduling"] if parts is not None else w.mesh


async def plant(w: World, marker: str) -> Flow:
    """A Group whose Mission, contracts, Conversations, Messages, submission, Artifacts and
    Evidence each carry ``marker`` (with a suffix naming the place); wi-1 ends submitted, wi-2
    sits queued for the Worker."""
    body = builders.mission_create(
        "alice", "coord-bot", w.clock.now(), objective=f"{marker}-objective", title=f"{marker}-mission"
    )
    body.definition.definition_of_done[0].description = f"{marker}-done"
    body.coordinator_renewal.lease_duration.FromSeconds(3600)
    await w.run(w.owner, G, "mission_create", body)
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    flow = Flow(w)
    planning = (await w.client.group_state(G)).mission.planning_conversation_id
    await w.run(
        w.owner, G, "message_post", builders.message(planning, f"{marker}-message"), membership_epoch=1
    )
    opened = conversation_pb2.ConversationOpen(
        conversation_id="conv_review",
        kind=conversation_pb2.CONVERSATION_KIND_REVIEW,
        title=f"{marker}-conversation",
    )
    await w.run(w.owner, G, "conversation_open", opened, membership_epoch=1)
    for wid in ("wi-1", "wi-2"):
        contract = builders.contract(
            w.clock.now(),
            goal=f"{marker}-goal-{wid}",
            notes=f"{marker}-instructions-{wid}",
            business_impact_note=f"{marker}-impact-{wid}",
        )
        contract.deliverables[0].description = f"{marker}-deliverable-{wid}"
        contract.acceptance_criteria[0].description = f"{marker}-criterion-{wid}"
        authorize = wp.WorkAuthorize(
            work_item_id=wid, title=f"{marker}-title-{wid}", contract=contract, coordinator_epoch=1
        )
        await flow.coord("work_authorize", authorize)
    epoch = await flow.accept(w.worker, "wi-1", await flow.offer("wi-1", "worker-bot"))
    await flow.start(w.worker, "wi-1", epoch, "lease-wi-1")
    data = f"{marker}-content".encode()
    manifest = manifest_for(w, w.worker, data)  # (the blob itself never enters the log, MW-13.1-02)
    await w.client.upload(data, manifest)
    artifact = common_pb2.ArtifactRef(digest=blob_digest(data), media_type="text/csv")
    publish = wp.WorkPublishArtifact(
        work_item_id="wi-1", lease_id="lease-wi-1", ownership_epoch=epoch, artifact=artifact
    )
    await flow.as_(w.worker, "work_publish_artifact", publish)
    evidence = builders.evidence()
    evidence.summary = f"{marker}-evidence"
    submit = flow.submit_body("wi-1", epoch, "lease-wi-1")
    for listed, planted in ((submit.artifacts, artifact), (submit.evidence, evidence)):
        del listed[:]
        listed.append(planted)
    submit.summary = f"{marker}-summary"
    await flow.as_(w.worker, "work_submit", submit)
    await flow.accept(w.worker, "wi-2", await flow.offer("wi-2", "worker-bot"))
    return flow


@pytest.mark.req("MW-13.3-08", "MW-13.3-09")
async def test_the_scheduler_receives_and_stores_no_mission_content_yet_schedules(
    world: World,
    sched: Schedulers,  # noqa: F811 (the fixture)
) -> None:
    w = world
    part = scheduling_part(w)
    workers = part.schedulers
    spy = FollowSpy(workers._group_log)
    workers._group_log = spy  # before the Worker's first call: its scheduler follows through the spy
    marker = f"SECRET-{uuid.uuid4().hex}"
    await plant(w, marker)
    head = (await w.client.group_state(G)).head_sequence
    # The markers are in the Group log, each where it was planted: the check below is not vacuous.
    stored = b"".join(s.envelope for s in await w.mesh.authority.read_history(G, 0, head))  # type: ignore[attr-defined]
    places = (
        "objective",
        "mission",
        "done",
        "message",
        "conversation",
        "goal-wi-2",
        "instructions-wi-2",
        "impact-wi-2",
        "deliverable-wi-2",
        "criterion-wi-2",
        "title-wi-2",
        "evidence",
        "summary",
    )
    assert [place for place in places if f"{marker}-{place}".encode() not in stored] == []

    # Scheduling still works from the metadata view: wi-2 is queued and placed.
    queue = (await sched["worker"].GetQueue(pb.GetQueueRequest(group_id=G))).queue
    assert [(e.work_item_id, e.state) for e in queue.entries] == [("wi-2", wp.WORK_ITEM_STATE_QUEUED)]
    assert queue.projected_sequence == head
    placed = await sched["worker"].NextSlot(pb.NextSlotRequest())
    assert placed.assignment.work_item_id == "wi-2"

    # What the scheduler received: the metadata view only, no marker, no signed event.
    received = b"".join(spy.received)
    assert received and marker.encode() not in received
    assert spy.requests and all(r.view == glpb.FOLLOW_VIEW_SCHEDULING for r in spy.requests)
    answers = [glpb.FollowGroupResponse.FromString(raw) for raw in spy.received]
    entries = [e for a in answers if a.HasField("batch") for e in a.batch.entries]
    assert entries and not any(e.HasField("envelope") for e in entries)
    # What it keeps: its projection in memory and in its table.
    scheduler = await workers.of("worker-bot")
    held = scheduler.followers[G].projection
    assert (
        marker not in repr(held)
        and marker not in held.to_json()
        and marker not in repr(vars(scheduler.policy))
    )
    async with part.engine.connect() as conn:
        rows = (await conn.execute(select(projections))).all()
    assert rows and marker not in repr(rows)

    # The MissionOwner is known without the Mission (MW-11.1-09).
    raised = pb.SetPriorityRequest(
        group_id=G,
        work_item_id="wi-2",
        source=pb.PRIORITY_SOURCE_MISSION_OWNER,
        worker_id="worker-bot",
        priority_class=pb.PRIORITY_CLASS_ELEVATED,
    )
    await sched["owner"].SetPriority(raised)

    # Nothing scheduling needs was lost: the full events fold to the same projection.
    events = [codec.decode(s.envelope)[1] for s in await w.mesh.authority.read_history(G, 0, head)]  # type: ignore[attr-defined]
    assert held == projected(events, "worker-bot", G) and held.mission_owner_id == "alice"


async def test_an_unknown_view_is_refused_not_answered_in_full(world: World) -> None:
    w = world
    await plant(w, "unused")
    stub = scheduling_part(w).schedulers._group_log
    request = glpb.FollowGroupRequest(group_id=G, member_id="worker-bot", view=7)  # type: ignore[arg-type]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.FollowGroup(request):
            pass
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == common_pb2.REJECTION_REASON_INVALID_ARGUMENT
    assert rejection.metadata.get("field") == "view"


@pytest.mark.req("MW-13.3-08", "MW-13.3-09")
def test_the_allow_list_covers_what_the_projection_folds_and_nothing_of_the_content() -> None:
    # Every payload the projection folds is served, and only those.
    assert set(KEPT) == set(scheduling_projection._HANDLERS)
    log = Log()
    log.authorize("a", goal="SECRET-goal", notes="SECRET-notes")
    log.authorize("b")
    log.offer_and_accept("a")
    log.offer_and_accept("b", worker="lead")
    a = log.item("a").owner.ownership_epoch  # type: ignore[attr-defined]
    log.run("work_start", wp.WorkStart(work_item_id="a", ownership_epoch=a, lease_id="lease-a"), "worker")
    log.run(
        "work_cancel", wp.WorkCancel(work_item_id="b", coordinator_epoch=1, reason="SECRET-reason"), "coord"
    )
    reduced = [r for r in map(scheduling_event, log.events) if r is not None]
    assert projected(reduced) == projected(log.events)
    assert all(b"SECRET" not in r.SerializeToString() for r in reduced)
    # A reduced event keeps its header for the fold, never the command's ids or the signature chain.
    started = next(r for r in reduced if r.HasField("work_started"))
    assert (
        started.sequence
        and started.group_id
        and started.actor_id == "worker"
        and started.HasField("recorded_at")
    )
    assert not (
        started.event_id or started.causing_command_id or started.correlation_id or started.previous_digest
    )
    assert not scheduling_event(next(e for e in log.events if e.HasField("membership_granted")))
