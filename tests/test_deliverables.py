"""D161 through the public API, in both topologies: a submission or an Evidence record names only
Artifacts the store holds with the actor's manifest for this Mission and WorkItem (or that the
Group already recorded within its scope); anything else is refused with a stable reason and writes
nothing, and a store that cannot be asked refuses rather than accepts unchecked."""

from __future__ import annotations

import time

import pytest

from missionweave.internal.v1.publications_pb2_grpc import PublicationServiceStub
from missionweave.kernel.transport import open_channel
from missionweave.sdk.client import blob_digest, decode_events
from missionweave.v1 import common_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.artifacts.publications import MAX_MANIFESTS_ANSWERED
from tests import builders
from tests.conftest import World
from tests.test_missions import G, refused
from tests.test_work_items import Flow, setup, started

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)
R = common_pb2.RejectionReason


async def head(w: World) -> int:
    return int((await w.client.group_state(G)).head_sequence)


async def refused_whole(w: World, body: wp.WorkSubmit, check: str, field: str = "body.artifacts[0]") -> None:
    before = await head(w)
    rejection = await refused(
        w, w.worker, G, "work_submit", body, R.REJECTION_REASON_NOT_FOUND, membership_epoch=3
    )
    assert (rejection.metadata["check"], rejection.metadata["field"]) == (check, field)
    assert await head(w) == before  # nothing written


@pytest.mark.req("MW-13.1-03", "MW-10.2-T11")
async def test_a_submission_names_only_artifacts_stored_with_the_workers_manifest(world: World) -> None:
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    never = common_pb2.ArtifactRef(digest=blob_digest(b"never uploaded"))
    await refused_whole(w, Flow.submit_body("wi-1", epoch, "lease-1", [never]), "not_stored")
    # Stored, but with no manifest at all, or with someone else's, or for another WorkItem.
    bare = b"bytes without a manifest"
    await w.client.upload(bare)
    await refused_whole(
        w,
        Flow.submit_body("wi-1", epoch, "lease-1", [common_pb2.ArtifactRef(digest=blob_digest(bare))]),
        "no_manifest",
    )
    theirs = await w.deliverable(w.coordinator, G, "wi-1", b"signed by the Coordinator")
    await refused_whole(w, Flow.submit_body("wi-1", epoch, "lease-1", [theirs]), "no_manifest")
    elsewhere = await w.deliverable(w.worker, G, "wi-2", b"made for another WorkItem")
    await refused_whole(w, Flow.submit_body("wi-1", epoch, "lease-1", [elsewhere]), "no_manifest")
    # The right manifest, but a size that is not the stored one.
    report = await w.deliverable(w.worker, G, "wi-1", b"the Q3 report")
    wrong_size = common_pb2.ArtifactRef()
    wrong_size.CopyFrom(report)
    wrong_size.digest.size_bytes += 1
    await refused(
        w,
        w.worker,
        G,
        "work_submit",
        Flow.submit_body("wi-1", epoch, "lease-1", [wrong_size]),
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=3,
    )
    # Evidence citing a log nobody stored refuses the submission too.
    cites_missing = Flow.submit_body("wi-1", epoch, "lease-1", [report])
    cites_missing.evidence[0].artifacts.append(never)
    await refused_whole(w, cites_missing, "not_stored", "body.evidence[0].artifacts[0]")
    log = await w.deliverable(w.worker, G, "wi-1", b"12 tests passed")
    good = Flow.submit_body("wi-1", epoch, "lease-1", [report])
    good.evidence[0].artifacts.append(log)
    submitted = decode_events((await f.as_(w.worker, "work_submit", good)).events)[0].work_submitted
    assert list(submitted.artifacts) == [report]
    assert report.digest in [a.digest for a in (await w.client.work_item(G, "wi-1")).artifacts]


@pytest.mark.req("MW-13.1-03")
async def test_bytes_many_work_items_hand_in_are_found_with_each_ones_own_manifest(world: World) -> None:
    """One Worker hands in the same bytes (a common file) for more WorkItems than the store answers
    manifests of one blob for: each submission still finds the manifest naming its own WorkItem
    (found by bench/bridges.py: the 17th of a Group was refused no_manifest)."""
    w = world
    f = await setup(w)
    common = b"the same licence text in every deliverable\n"
    many = MAX_MANIFESTS_ANSWERED + 4
    for i in range(many):  # a manifest each, all for the same blob, before any submission
        await w.deliverable(w.worker, G, f"wi-{i}", common)
    budget = common_pb2.ResourceVector(currency="EUR", financial_micros=1_000, tokens=10, tool_calls=1)
    for i in range(many):
        await f.authorize(f"wi-{i}", budget=budget)
        epoch = await f.accept(w.worker, f"wi-{i}", await f.offer(f"wi-{i}", "worker-bot"))
        await f.start(w.worker, f"wi-{i}", epoch, f"lease-{i}")
        ref = common_pb2.ArtifactRef(digest=blob_digest(common), media_type="text/plain")
        await f.as_(w.worker, "work_submit", Flow.submit_body(f"wi-{i}", epoch, f"lease-{i}", [ref]))
    assert [(await w.client.work_item(G, f"wi-{i}")).state for i in range(many)] == [
        wp.WORK_ITEM_STATE_SUBMITTED
    ] * many


@pytest.mark.req("MW-7.3-04")
async def test_the_missions_submission_names_what_its_work_items_handed_in(world: World) -> None:
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    report = await w.deliverable(w.worker, G, "wi-1", b"the Q3 report")
    submitted = await f.as_(w.worker, "work_submit", Flow.submit_body("wi-1", epoch, "lease-1", [report]))
    accept = wp.WorkAcceptResult(
        work_item_id="wi-1",
        coordinator_epoch=1,
        submission_event_id=decode_events(submitted.events)[0].event_id,
    )
    await f.coord("work_accept_result", accept)
    revision = (await w.client.group_state(G)).mission.revision
    forged = mission_pb2.MissionSubmitForApproval(
        coordinator_epoch=1, mission_revision=revision, artifacts=[builders.artifact()], summary="done"
    )
    before = await head(w)
    await refused(
        w,
        w.coordinator,
        G,
        "mission_submit_for_approval",
        forged,
        R.REJECTION_REASON_NOT_FOUND,
        membership_epoch=2,
    )
    assert await head(w) == before
    real = mission_pb2.MissionSubmitForApproval(
        coordinator_epoch=1, mission_revision=revision, artifacts=[report], summary="done"
    )
    await w.run(w.coordinator, G, "mission_submit_for_approval", real, membership_epoch=2)
    assert (await w.client.group_state(G)).mission.state == mission_pb2.MISSION_STATE_AWAITING_APPROVAL


async def test_a_submission_while_the_artifact_store_is_down_is_refused_not_accepted_unchecked(
    world: World,
) -> None:
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    report = await w.deliverable(w.worker, G, "wi-1", b"the Q3 report")
    dead = open_channel("127.0.0.1:9")  # the Authority's artifact peer now points where nobody listens
    w.mesh.authority.publications = PublicationServiceStub(dead)  # type: ignore[attr-defined]
    began = time.monotonic()
    rejection = await refused(
        w,
        w.worker,
        G,
        "work_submit",
        Flow.submit_body("wi-1", epoch, "lease-1", [report]),
        R.REJECTION_REASON_PEER_UNAVAILABLE,
        membership_epoch=3,
    )
    assert time.monotonic() - began < 6 and rejection.metadata["peer"] == "artifacts"
    await dead.close()
