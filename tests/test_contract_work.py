"""Contract truth (issue 17 item 7) for work.proto and mission.proto: what their comments promise,
through the public gRPC API. Each test's docstring names the comments it checks; promises already
covered elsewhere (test_work_items.py, test_read_models.py, test_missions.py, test_core_*.py) are
not repeated here."""

from __future__ import annotations

from datetime import timedelta

import pytest

from missionweave.kernel.clock import from_timestamp, to_timestamp
from missionweave.sdk.client import MeshClient, blob_digest, decode_events
from missionweave.v1 import common_pb2, membership_pb2, mission_pb2, subtask_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.conftest import World, register
from tests.test_artifact_service import manifest_for
from tests.test_core_children import PARENT, parent_state
from tests.test_missions import G, as_member, create, refused
from tests.test_work_items import Flow, setup, started

R = common_pb2.RejectionReason
WS = wp.WorkItemState


async def mission_with(w: World, **definition: object) -> Flow:
    """A live Mission whose definition differs from the builders' by ``definition``, with the Worker."""
    body = builders.mission_create("alice", "coord-bot", w.clock.now(), **definition)
    body.coordinator_renewal.lease_duration.FromSeconds(3600)
    await w.run(w.owner, G, "mission_create", body)
    await as_member(w, G, w.worker)
    return Flow(w)


async def accepted(f: Flow, w: World, work_item_id: str, **contract: object) -> int:
    """Authorize ``work_item_id`` and let the Worker accept it: its ownership epoch."""
    await f.authorize(work_item_id, **contract)
    return await f.accept(w.worker, work_item_id, await f.offer(work_item_id, "worker-bot"))


@pytest.mark.req("MW-10.2-T06")
async def test_execution_approval_follows_the_mission_risk_policy(world: World) -> None:
    """mission.proto RiskPolicy.execution_approval_threshold and .execution_approver_ids; work.proto
    WorkContract.requires_execution_approval ("also when risk_class is at or above the threshold"),
    WorkContract.execution_approver_ids (empty = the risk policy's approvers),
    ApprovalGrantExecution.ownership_epoch (0 = any owner) and .expires_at, WorkItem.execution_approved."""
    w = world
    policy = mission_pb2.RiskPolicy(
        risk_class=mission_pb2.RISK_CLASS_HIGH,
        execution_approval_threshold=mission_pb2.RISK_CLASS_HIGH,
        execution_approver_ids=["carol"],
    )
    f = await mission_with(w, risk_policy=policy)
    carol = await register(w.client, w.keys["admin"], "carol", common_pb2.IDENTITY_KIND_HUMAN)
    await as_member(w, G, carol, membership_pb2.MEMBER_ROLE_REVIEWER)
    # Below the threshold nothing is gated.
    low = await accepted(f, w, "wi-low")
    await f.start(w.worker, "wi-low", low, "lease-low")
    epoch = await accepted(f, w, "wi-1", risk_class=mission_pb2.RISK_CLASS_HIGH)
    start = wp.WorkStart(work_item_id="wi-1", ownership_epoch=epoch, lease_id="lease-1")
    await refused(
        w, w.worker, G, "work_start", start, R.REJECTION_REASON_PRECONDITION_FAILED, membership_epoch=3
    )
    grant = wp.ApprovalGrantExecution(work_item_id="wi-1", contract_revision=1, ownership_epoch=0)
    grant.expires_at.CopyFrom(to_timestamp(w.clock.now() + timedelta(seconds=30)))
    # The risk policy names the approvers, so the MissionOwner is not one of them.
    await refused(
        w,
        w.owner,
        G,
        "approval_grant_execution",
        grant,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=1,
    )
    stale = wp.ApprovalGrantExecution(work_item_id="wi-1", contract_revision=1, ownership_epoch=epoch + 1)
    await refused(
        w,
        carol,
        G,
        "approval_grant_execution",
        stale,
        R.REJECTION_REASON_REVISION_MISMATCH,
        membership_epoch=4,
    )
    await f.as_(carol, "approval_grant_execution", grant)
    assert (await w.client.work_item(G, "wi-1")).execution_approved
    w.clock.advance(seconds=31)
    assert not (await w.client.work_item(G, "wi-1")).execution_approved  # expired
    await refused(
        w, w.worker, G, "work_start", start, R.REJECTION_REASON_PRECONDITION_FAILED, membership_epoch=3
    )
    grant.ClearField("expires_at")
    await f.as_(carol, "approval_grant_execution", grant)
    await f.as_(w.worker, "work_start", start)


@pytest.mark.req("MW-10.3-09", "MW-10.3-08")
async def test_a_decline_is_one_of_the_six_or_a_namespaced_extension(world: World) -> None:
    """work.proto DeclineReason (the six standard codes, anything else OTHER plus a namespaced code),
    StructuredDecline.extension_code (required for OTHER, empty otherwise) and .detail (bounded)."""
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    offer_id = await f.offer("wi-1", "worker-bot")

    def decline(**fields: object) -> wp.WorkDeclineOffer:
        return wp.WorkDeclineOffer(
            work_item_id="wi-1", offer_id=offer_id, decline=wp.StructuredDecline(**fields)
        )  # type: ignore[arg-type]

    bad = [
        decline(reason=wp.DECLINE_REASON_OTHER),
        decline(reason=wp.DECLINE_REASON_OTHER, extension_code="maintenance"),
        decline(reason=wp.DECLINE_REASON_CAPACITY, extension_code="com.example/maintenance"),
        decline(reason=42),
        decline(reason=wp.DECLINE_REASON_CAPACITY, detail="x" * 1025),
    ]
    for body in bad:
        await refused(
            w,
            w.worker,
            G,
            "work_decline_offer",
            body,
            R.REJECTION_REASON_INVALID_ARGUMENT,
            membership_epoch=3,
        )
    for code in ("urn:missionweaveprotocol:decline:ambiguity", "com.example/maintenance"):
        result = await f.as_(
            w.worker, "work_decline_offer", decline(reason=wp.DECLINE_REASON_OTHER, extension_code=code)
        )
        assert decode_events(result.events)[0].work_offer_declined.decline.extension_code == code


@pytest.mark.req("MW-11.3-03", "MW-11.3-05", "MW-11.3-12")
async def test_ids_left_empty_are_derived_and_a_lease_id_is_never_reused(world: World) -> None:
    """work.proto WorkPropose.proposal_id, WorkAuthorize.work_item_id, WorkOffer.offer_id,
    WorkStart.lease_id ("must not be one of the WorkItem's recent leases"),
    WorkRequestPreemption.preemption_request_id, Checkpoint.checkpoint_id and Evidence.evidence_id:
    empty = a prefixed id derived from the command."""
    w = world
    f = await setup(w)
    proposed = await f.as_(
        w.worker, "work_propose", wp.WorkPropose(title="more", contract=builders.contract(w.clock.now()))
    )
    assert decode_events(proposed.events)[0].work_proposed.proposal_id.startswith("prop_")
    authorized = await f.coord(
        "work_authorize",
        wp.WorkAuthorize(title="ledger", contract=builders.contract(w.clock.now()), coordinator_epoch=1),
    )
    wid = decode_events(authorized.events)[0].work_authorized.work_item_id
    offer = f.offer_body(wid, "worker-bot")
    offer.offer_id = ""
    offered = await f.coord("work_offer", offer)
    offer_id = decode_events(offered.events)[0].work_offered.offer_id
    assert wid.startswith("wi_") and offer_id.startswith("offer_")
    epoch = await f.accept(w.worker, wid, offer_id)

    async def start() -> str:
        result = await f.as_(w.worker, "work_start", wp.WorkStart(work_item_id=wid, ownership_epoch=epoch))
        return str(decode_events(result.events)[0].work_started.lease.lease_id)

    first = await start()
    preempt = wp.WorkRequestPreemption(
        work_item_id=wid,
        lease_id=first,
        ownership_epoch=epoch,
        reason=wp.PREEMPTION_REASON_PRIORITY,
        coordinator_epoch=1,
    )
    request_id = decode_events((await f.coord("work_request_preemption", preempt)).events)[
        0
    ].work_preemption_requested.preemption_request_id
    checkpoint = wp.WorkCheckpoint(
        work_item_id=wid,
        lease_id=first,
        ownership_epoch=epoch,
        checkpoint=wp.Checkpoint(),
        preemption_request_id=request_id,
    )
    checkpointed = decode_events((await f.as_(w.worker, "work_checkpoint", checkpoint)).events)[
        0
    ].work_checkpointed
    assert (
        first.startswith("lease_")
        and request_id.startswith("pre_")
        and checkpointed.checkpoint.checkpoint_id.startswith("ckpt_")
    )
    reuse = wp.WorkStart(work_item_id=wid, ownership_epoch=epoch, lease_id=first)
    await refused(
        w, w.worker, G, "work_start", reuse, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )
    second = await start()
    assert second.startswith("lease_") and second != first
    body = await f.submission(w.worker, wid, epoch, second)
    body.evidence[0].evidence_id = ""
    submitted = decode_events((await f.as_(w.worker, "work_submit", body)).events)[0].work_submitted
    (evidence_id,) = [e.evidence_id for e in submitted.evidence]
    assert evidence_id.startswith("evd_") and list((await w.client.work_item(G, wid)).evidence_ids) == [
        evidence_id
    ]


@pytest.mark.req("MW-10.3-02", "MW-10.3-04")
async def test_extending_an_offer_adds_candidates_and_moves_its_expiry(world: World) -> None:
    """work.proto WorkOffer.extends_offer_id: `expires_at` becomes the offer's expiry, `candidate_ids`
    are added, its candidates keep their offer (and their selection criteria, WorkOfferAccepted)."""
    w = world
    second = await register(w.client, w.keys["admin"], "second-bot", common_pb2.IDENTITY_KIND_AGENT)
    f = await setup(w, w.worker, second)
    await f.authorize("wi-1")
    offer_id = await f.offer("wi-1", "worker-bot", seconds=60)
    extension = f.offer_body("wi-1", "second-bot", seconds=120)
    extension.extends_offer_id = offer_id
    extended = await f.coord("work_offer", extension)
    assert [e.type for e in decode_events(extended.events)] == ["work.offered"]  # nothing withdrawn
    (record,) = (await w.client.work_item(G, "wi-1")).offers
    assert record.offer_id == offer_id and list(record.candidate_ids) == ["worker-bot", "second-bot"]
    assert from_timestamp(record.expires_at) == from_timestamp(extension.expires_at)
    w.clock.advance(seconds=90)  # past the first expiry, within the extended one
    result = await f.as_(
        w.worker,
        "work_accept_offer",
        wp.WorkAcceptOffer(work_item_id="wi-1", offer_id=offer_id, contract_revision=1),
    )
    assert decode_events(result.events)[0].work_offer_accepted.selection_criteria.candidate_id == "worker-bot"


@pytest.mark.req("MW-10.2-T10", "MW-11.4-04", "MW-11.4-07")
async def test_only_the_coordinator_unblocks_and_every_blocker_ends(world: World) -> None:
    """work.proto WorkUnblock (by the current Coordinator; every blocker ends; `queued` while the
    blocked lease is live), WorkUnblocked.ownership (not set), and the read model while blocked:
    WorkItem.ownership.lease_kind BLOCKED, WorkItem.blockers (only required_resolution set),
    WorkItem.latest_checkpoint (only checkpoint_id set)."""
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    block = wp.WorkBlock(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        checkpoint=wp.Checkpoint(checkpoint_id="ck-1", completed_operation_ids=["op-1"]),
        blockers=[
            wp.Blocker(blocker_id="b1", kind=wp.BLOCKER_KIND_INFORMATION, required_resolution="which ledger"),
            wp.Blocker(blocker_id="b2", kind=wp.BLOCKER_KIND_EXTERNAL, required_resolution="ERP back up"),
        ],
    )
    await f.as_(w.worker, "work_block", block)
    blocked = await w.client.work_item(G, "wi-1")
    assert blocked.ownership.lease_kind == wp.WORK_LEASE_KIND_BLOCKED and not blocked.HasField("lease")
    assert list(blocked.blockers) == [
        wp.Blocker(required_resolution="which ledger"),
        wp.Blocker(required_resolution="ERP back up"),
    ]
    assert blocked.latest_checkpoint == wp.Checkpoint(checkpoint_id="ck-1")
    by_owner = wp.WorkUnblock(work_item_id="wi-1", resolution="I found it", ownership_epoch=epoch)
    await refused(
        w, w.worker, G, "work_unblock", by_owner, R.REJECTION_REASON_PERMISSION_DENIED, membership_epoch=3
    )
    unblock = wp.WorkUnblock(
        work_item_id="wi-1", resolution="EU ledger", resolved_blocker_ids=["b1"], coordinator_epoch=1
    )
    event = decode_events((await f.coord("work_unblock", unblock)).events)[0].work_unblocked
    assert event.next_state == WS.WORK_ITEM_STATE_QUEUED and list(event.resolved_blocker_ids) == ["b1"]
    assert not event.HasField("ownership")
    queued = await w.client.work_item(G, "wi-1")
    assert queued.state == WS.WORK_ITEM_STATE_QUEUED and not queued.blockers
    assert queued.ownership.lease_kind == wp.WORK_LEASE_KIND_OWNERSHIP
    assert queued.ownership.expires_at == blocked.ownership.expires_at  # the blocked lease, kept


@pytest.mark.req("MW-13.2-03", "MW-13.2-04")
async def test_review_evidence_is_recorded_by_the_coordinator_once_per_id(world: World) -> None:
    """work.proto WorkRecordEvidence (a reviewer member or the current Coordinator, not the owner;
    an id already recorded is refused; `producer_id` must equal the actor) and WorkItem.evidence_ids
    (the submission's, then its review's, each once, in that order)."""
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    submission = await f.run_to_submitted(w.worker, "wi-1")
    review = builders.evidence("rev-1")
    by_owner = wp.WorkRecordEvidence(work_item_id="wi-1", evidence=review)
    await refused(
        w,
        w.worker,
        G,
        "work_record_evidence",
        by_owner,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=3,
    )
    for evidence_id, producer in (("ev-1", ""), ("rev-1", "worker-bot")):  # already recorded; not the actor
        other = builders.evidence(evidence_id)
        other.producer_id = producer
        body = wp.WorkRecordEvidence(work_item_id="wi-1", evidence=other, coordinator_epoch=1)
        await refused(
            w,
            w.coordinator,
            G,
            "work_record_evidence",
            body,
            R.REJECTION_REASON_INVALID_ARGUMENT,
            membership_epoch=2,
        )
    recorded = await f.coord(
        "work_record_evidence",
        wp.WorkRecordEvidence(work_item_id="wi-1", evidence=review, coordinator_epoch=1),
    )
    assert decode_events(recorded.events)[0].evidence_recorded.evidence.producer_id == "coord-bot"
    assert list((await w.client.work_item(G, "wi-1")).evidence_ids) == ["ev-1", "rev-1"]
    accept = wp.WorkAcceptResult(
        work_item_id="wi-1",
        coordinator_epoch=1,
        submission_event_id=submission,
        review_evidence_ids=["rev-1"],
    )
    await f.coord("work_accept_result", accept)
    verified = await w.client.work_item(G, "wi-1")
    assert verified.state == WS.WORK_ITEM_STATE_VERIFIED and list(verified.evidence_ids) == ["ev-1", "rev-1"]


@pytest.mark.req("MW-10.2-T14", "MW-10.2-T18")
async def test_the_coordinator_cancels_and_a_failed_mission_fails_its_work_as_mission_failed(
    world: World,
) -> None:
    """work.proto WorkCancel (by the current Coordinator; open offers withdrawn WORK_ITEM_CLOSED),
    WorkOffersWithdrawn (with a failure too) and WorkFailureKind.WORK_FAILURE_KIND_MISSION_FAILED
    ("the parent Mission failed"), reported by the Authority (WorkActorRole)."""
    w = world
    f = await setup(w)
    for wid in ("wi-1", "wi-2"):
        await f.authorize(wid)
    offer_id = await f.offer("wi-1", "worker-bot")
    cancel = wp.WorkCancel(work_item_id="wi-1", reason="no longer needed")
    await refused(
        w, w.owner, G, "work_cancel", cancel, R.REJECTION_REASON_PERMISSION_DENIED, membership_epoch=1
    )
    cancel.coordinator_epoch = 1
    withdrawn, cancelled = decode_events((await f.coord("work_cancel", cancel)).events)
    assert withdrawn.work_offers_withdrawn.reason == wp.OFFER_WITHDRAWAL_REASON_WORK_ITEM_CLOSED
    assert list(withdrawn.work_offers_withdrawn.offer_ids) == [offer_id]
    assert cancelled.work_cancelled.cancelled_by == wp.WORK_ACTOR_ROLE_COORDINATOR
    await f.offer("wi-2", "worker-bot")
    terminated = decode_events(
        (
            await f.coord(
                "mission_terminate", mission_pb2.MissionTerminate(coordinator_epoch=1, reason="scope dropped")
            )
        ).events
    )
    assert [e.type for e in terminated] == ["mission.failed", "work.offers_withdrawn", "work.failed"]
    assert terminated[1].work_offers_withdrawn.reason == wp.OFFER_WITHDRAWAL_REASON_WORK_ITEM_CLOSED
    failed = terminated[2].work_failed
    assert failed.work_item_id == "wi-2" and failed.kind == wp.WORK_FAILURE_KIND_MISSION_FAILED
    assert (
        failed.reported_by == wp.WORK_ACTOR_ROLE_AUTHORITY
        and failed.previous_state == WS.WORK_ITEM_STATE_OFFERED
    )


@pytest.mark.req("MW-10.1-01", "MW-13.2-05")
async def test_free_text_is_bounded_where_work_proto_says(world: World) -> None:
    """work.proto WorkPropose.rationale (4,096), WorkContract.business_impact_note (256),
    RetryPolicy.max_attempts (at least 1), RevisedEstimate.reason (1,024), Evidence.summary (2,048)
    and WorkSubmit.summary (4,096 characters): one character more is refused INVALID_ARGUMENT."""
    w = world
    f = await setup(w)
    now = w.clock.now()
    propose = wp.WorkPropose(title="more", contract=builders.contract(now), rationale="r" * 4097)
    await refused(
        w, w.worker, G, "work_propose", propose, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )
    for contract in (
        builders.contract(now, business_impact_note="n" * 257),
        builders.contract(now, retry_policy=wp.RetryPolicy(max_attempts=0)),
    ):
        body = wp.WorkAuthorize(work_item_id="wi-x", title="x", contract=contract, coordinator_epoch=1)
        await refused(
            w,
            w.coordinator,
            G,
            "work_authorize",
            body,
            R.REJECTION_REASON_INVALID_ARGUMENT,
            membership_epoch=2,
        )
    await f.authorize("wi-ok", business_impact_note="n" * 256)
    epoch = await started(f, w)
    estimate = wp.RevisedEstimate(reason="e" * 1025)
    report = wp.ProgressReport(phase="p", next_checkpoint=wp.PlannedCheckpoint(), revised_estimate=estimate)
    progress = wp.WorkReportProgress(
        work_item_id="wi-1", lease_id="lease-1", ownership_epoch=epoch, report=report
    )
    await refused(
        w,
        w.worker,
        G,
        "work_report_progress",
        progress,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=3,
    )
    long_evidence = await f.submission(w.worker, "wi-1", epoch, "lease-1")
    long_evidence.evidence[0].summary = "s" * 2049
    long_summary = await f.submission(w.worker, "wi-1", epoch, "lease-1")
    long_summary.summary = "s" * 4097
    for body in (long_evidence, long_summary):
        await refused(
            w, w.worker, G, "work_submit", body, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
        )
    long_summary.summary = "s" * 4096
    await f.as_(w.worker, "work_submit", long_summary)


@pytest.mark.req("MW-10.4-03", "MW-10.1-02", "MW-11.3-03")
async def test_the_work_item_read_model_sets_what_work_proto_says_and_nothing_else(world: World) -> None:
    """work.proto WorkItem: proposal_id, latest_progress, schedule, created_at and updated_at (not
    kept: unset), offers (declined_by, offered_by, grant_id empty), ownership (granted_at and
    contract_revision unset), lease (expires_at the current expiry, renewals empty), usage
    (budget.used as recorded, retry_used unset), dependencies_satisfied and
    unresolved_ambiguity_message_ids."""
    w = world
    f = await setup(w)
    await f.as_(
        w.worker,
        "work_propose",
        wp.WorkPropose(proposal_id="p-1", title="ledger", contract=builders.contract(w.clock.now())),
    )
    authorize = wp.WorkAuthorize(
        work_item_id="wi-1",
        title="ledger",
        contract=builders.contract(w.clock.now()),
        proposal_id="p-1",
        coordinator_epoch=1,
    )
    await f.coord("work_authorize", authorize)
    await f.authorize("wi-2", depends_on=("wi-1",))
    item = await w.client.work_item(G, "wi-2")
    assert not item.dependencies_satisfied and (await w.client.work_item(G, "wi-1")).dependencies_satisfied
    question = builders.message(item.conversation_id, "EU or global ledger?")
    question.topic = "ambiguity"
    posted = decode_events((await f.coord("message_post", question)).events)[0].message_posted.message_id
    assert list((await w.client.work_item(G, "wi-2")).unresolved_ambiguity_message_ids) == [posted]
    offer_id = await f.offer("wi-1", "worker-bot")
    decline = wp.WorkDeclineOffer(
        work_item_id="wi-1",
        offer_id=offer_id,
        decline=wp.StructuredDecline(reason=wp.DECLINE_REASON_CAPACITY),
    )
    await f.as_(w.worker, "work_decline_offer", decline)
    (offer,) = (await w.client.work_item(G, "wi-1")).offers
    assert (
        offer.offer_id == offer_id
        and list(offer.candidate_ids) == ["worker-bot"]
        and offer.contract_revision == 1
    )
    assert not offer.declined_by and not offer.offered_by and not offer.grant_id
    epoch = await f.accept(w.worker, "wi-1", await f.offer("wi-1", "worker-bot"))
    await f.start(w.worker, "wi-1", epoch, "lease-1")
    renew = wp.WorkRenewLease(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        usage_delta=common_pb2.ResourceVector(currency="EUR", tokens=100),
    )
    w.clock.advance(seconds=10)
    renewal = decode_events((await f.as_(w.worker, "work_renew_lease", renew)).events)[
        0
    ].work_lease_renewed.renewal
    estimate = wp.RevisedEstimate(confidence=wp.ESTIMATE_CONFIDENCE_LOW)
    report = wp.ProgressReport(
        phase="reconciling", next_checkpoint=wp.PlannedCheckpoint(), revised_estimate=estimate
    )
    schedule = wp.ScheduleDisclosure(work_item_id="wi-1", capacity_status=wp.CAPACITY_STATUS_AVAILABLE)
    progress = wp.WorkReportProgress(
        work_item_id="wi-1", lease_id="lease-1", ownership_epoch=epoch, report=report, schedule=schedule
    )
    await f.as_(w.worker, "work_report_progress", progress)
    active = await w.client.work_item(G, "wi-1")
    assert active.lease.expires_at == renewal.expires_at and not active.lease.renewals
    assert active.ownership.offer_id and active.ownership.HasField("start_deadline")
    assert not active.ownership.HasField("granted_at") and not active.ownership.contract_revision
    assert active.usage.budget.used.tokens == 100 and active.usage.budget.used.currency == "EUR"
    assert not active.usage.HasField("retry_used")
    assert not active.proposal_id
    for unset in ("latest_progress", "schedule", "created_at", "updated_at"):
        assert not active.HasField(unset), unset
    submitted = await f.as_(w.worker, "work_submit", await f.submission(w.worker, "wi-1", epoch, "lease-1"))
    accept = wp.WorkAcceptResult(
        work_item_id="wi-1",
        coordinator_epoch=1,
        submission_event_id=decode_events(submitted.events)[0].event_id,
    )
    await f.coord("work_accept_result", accept)
    assert (await w.client.work_item(G, "wi-2")).dependencies_satisfied


@pytest.mark.req("MW-7.2-02", "MW-7.1-03")
async def test_a_new_mission_reads_as_mission_proto_says(world: World) -> None:
    """mission.proto MissionCreate.coordinator_renewal (default: 5-minute leases renewed 1 minute
    before expiry), MissionCreate (the Mission id is "mis_" + the Group id's suffix) and the Mission
    read model: root_owner_id (a root's is owner_id), depth 0, latest_submission_event_id empty
    before the first submission, budget.limit the definition's."""
    w = world
    await w.run(w.owner, G, "mission_create", builders.mission_create("alice", "coord-bot", w.clock.now()))
    m = (await w.client.group_state(G)).mission
    policy = m.coordinator.renewal_policy
    assert (policy.lease_duration.seconds, policy.renew_before.seconds) == (300, 60)
    assert from_timestamp(m.coordinator.expires_at) == from_timestamp(m.created_at) + timedelta(minutes=5)
    assert m.mission_id == "mis_" + G.removeprefix("grp_") and m.kind == mission_pb2.MISSION_KIND_ROOT
    assert m.root_owner_id == "alice" and m.depth == 0 and not m.latest_submission_event_id
    assert m.budget.limit == m.definition.budget and m.coordinator.reconciled


@pytest.mark.req("MW-7.2-08")
async def test_a_replacement_reconciles_against_any_revision_since_the_last_work_change(world: World) -> None:
    """mission.proto MissionAcknowledgeReconciliation.group_revision: at least the lease grant's and
    the latest WorkItem change's, at most the head (REVISION_MISMATCH otherwise); later Messages need
    no re-read."""
    w = world
    await setup(w)
    w.clock.advance(seconds=3601)
    replace = mission_pb2.MissionReplaceCoordinator(coordinator_id="worker-bot", replaced_coordinator_epoch=1)
    await w.run(w.owner, G, "mission_replace_coordinator", replace, membership_epoch=1)
    read = (await w.client.group_state(G)).head_sequence
    planning = (await w.client.group_state(G)).mission.planning_conversation_id
    await w.run(w.owner, G, "message_post", builders.message(planning, "welcome"), membership_epoch=1)
    epoch = await w.epoch_of(G, "worker-bot")
    ahead = mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=2, group_revision=read + 2)
    await refused(
        w,
        w.worker,
        G,
        "mission_acknowledge_reconciliation",
        ahead,
        R.REJECTION_REASON_REVISION_MISMATCH,
        membership_epoch=epoch,
    )
    before_grant = mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=2, group_revision=read - 1)
    await refused(
        w,
        w.worker,
        G,
        "mission_acknowledge_reconciliation",
        before_grant,
        R.REJECTION_REASON_REVISION_MISMATCH,
        membership_epoch=epoch,
    )
    ack = mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=2, group_revision=read)
    await w.run(w.worker, G, "mission_acknowledge_reconciliation", ack, membership_epoch=epoch)
    assert (await w.client.group_state(G)).mission.coordinator.reconciled


@pytest.mark.req("MW-14-19")
async def test_a_tree_node_counts_work_items_by_state_name_and_names_each_blockers_work_item(
    world: World,
) -> None:
    """subtask.proto MissionTreeNode.work_items_by_state (keyed by state name), .blockers
    (work_item_id and required_resolution; kind unset without a running child) and .budget (the
    Mission's cap and what its WorkItems used)."""
    w = world
    f = await setup(w)
    await f.authorize("wi-2")
    await f.offer("wi-2", "worker-bot")
    epoch = await started(f, w)
    block = wp.WorkBlock(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        checkpoint=wp.Checkpoint(checkpoint_id="ck-1"),
        blockers=[
            wp.Blocker(blocker_id="b1", kind=wp.BLOCKER_KIND_EXTERNAL, required_resolution="ERP back up")
        ],
        usage_delta=common_pb2.ResourceVector(currency="EUR", tool_calls=3),
    )
    await f.as_(w.worker, "work_block", block)
    owner = MeshClient(w.target, reader=w.owner)
    try:
        (node,) = await owner.mission_tree(G)
    finally:
        await owner.channel.close()
    assert dict(node.work_items_by_state) == {"WORK_ITEM_STATE_BLOCKED": 1, "WORK_ITEM_STATE_OFFERED": 1}
    assert list(node.blockers) == [wp.Blocker(work_item_id="wi-1", required_resolution="ERP back up")]
    assert node.budget.used.tool_calls == 3 and node.budget.limit.tool_calls == 500 and node.depth == 0


@pytest.mark.req("MW-14-06")
def test_an_approved_depth_lies_beyond_the_default_and_at_most_64() -> None:
    """subtask.proto MissionApproveChildDepth.max_depth ("at least the default maximum + 1, at most
    64") and .reason (1..4096 characters)."""
    parent = parent_state()

    def approve(
        max_depth: int, reason: str = "the audit needs more levels"
    ) -> subtask_pb2.MissionApproveChildDepth:
        return subtask_pb2.MissionApproveChildDepth(
            parent_work_item_id="wi", max_depth=max_depth, reason=reason
        )

    for body in (approve(65), approve(64, ""), approve(64, "r" * 4097)):
        assert (
            PARENT.refused(parent, "mission_approve_child_depth", body, "alice").reason
            == R.REJECTION_REASON_INVALID_ARGUMENT
        )
    PARENT.run(parent, "mission_approve_child_depth", approve(64), "alice")  # accepted


@pytest.mark.req("MW-10.2-T03", "MW-11.3-08", "OP-11", "OP-13")
async def test_a_lapsed_holder_is_fenced_as_expired_and_a_failure_closes_open_offers(world: World) -> None:
    """work.proto LeaseRevoked (appended when a new offer fences an expired holder: end_kind EXPIRED,
    LEASE_REVOCATION_CAUSE_EXPIRY_FENCED, lease_kind EXECUTION or BLOCKED), WorkOffersWithdrawn
    (appended with a failure, WORK_ITEM_CLOSED) and WorkFailed.lease_id (the lease revoked, also
    when the Coordinator reports the failure)."""
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    w.clock.advance(seconds=121)  # past the execution lease and the ownership start deadline
    fenced, offered = decode_events((await f.coord("work_offer", f.offer_body("wi-1", "worker-bot"))).events)
    revoked = fenced.lease_revoked
    assert (revoked.cause, revoked.end_kind, revoked.lease_kind) == (
        wp.LEASE_REVOCATION_CAUSE_EXPIRY_FENCED,
        wp.LEASE_END_KIND_EXPIRED,
        wp.WORK_LEASE_KIND_EXECUTION,
    )
    assert (revoked.lease_id, revoked.ownership_epoch, offered.type) == ("lease-1", epoch, "work.offered")
    second = await f.accept(w.worker, "wi-1", offered.work_offered.offer_id)
    await f.start(w.worker, "wi-1", second, "lease-2")
    block = wp.WorkBlock(
        work_item_id="wi-1",
        lease_id="lease-2",
        ownership_epoch=second,
        checkpoint=wp.Checkpoint(checkpoint_id="ck"),
        blockers=[wp.Blocker(kind=wp.BLOCKER_KIND_EXTERNAL, required_resolution="ERP back up")],
    )
    block.requested_blocked_duration.FromSeconds(30)
    await f.as_(w.worker, "work_block", block)
    w.clock.advance(seconds=31)
    fenced_blocked = decode_events((await f.coord("work_offer", f.offer_body("wi-1", "worker-bot"))).events)[
        0
    ].lease_revoked
    assert (fenced_blocked.lease_kind, fenced_blocked.end_kind, fenced_blocked.lease_id) == (
        wp.WORK_LEASE_KIND_BLOCKED,
        wp.LEASE_END_KIND_EXPIRED,
        "",
    )
    failure = wp.WorkFail(
        work_item_id="wi-1",
        coordinator_epoch=1,
        kind=wp.WORK_FAILURE_KIND_PERMANENT,
        evidence=[builders.evidence("ev-f")],
        reason="the ERP was retired",
    )
    withdrawn, failed = decode_events((await f.coord("work_fail", failure)).events)
    assert withdrawn.work_offers_withdrawn.reason == wp.OFFER_WITHDRAWAL_REASON_WORK_ITEM_CLOSED
    assert (
        failed.work_failed.previous_state == WS.WORK_ITEM_STATE_OFFERED
        and not (await w.client.work_item(G, "wi-1")).offers
    )
    # A Coordinator's failure of running work names the lease it revokes.
    third = await f.accept(w.worker, "wi-1", await f.offer("wi-1", "worker-bot"))
    await f.start(w.worker, "wi-1", third, "lease-3")
    (failed_active,) = decode_events((await f.coord("work_fail", failure)).events)
    assert (
        failed_active.work_failed.lease_id == "lease-3"
        and failed_active.work_failed.reported_by == wp.WORK_ACTOR_ROLE_COORDINATOR
    )


def usage(epoch: int, lease_id: str, tokens: int, seconds: int = 0) -> wp.WorkRenewLease:
    """A renewal of wi-1's lease reporting ``tokens``."""
    body = wp.WorkRenewLease(
        work_item_id="wi-1",
        lease_id=lease_id,
        ownership_epoch=epoch,
        usage_delta=common_pb2.ResourceVector(currency="EUR", tokens=tokens),
    )
    if seconds:
        body.requested_duration.FromSeconds(seconds)
    return body


@pytest.mark.req("MW-11.4-08", "MW-11.5-13")
async def test_the_cost_policy_caps_each_attempt_and_all_retries(world: World) -> None:
    """work.proto CostPolicy.per_attempt_limit (a cap per attempt, from its work.start) and
    .retry_limit (on attempts after the first, in total), refused BUDGET_EXCEEDED with `budget`
    "attempt" / "retries"; WorkItem.usage.retry_used (set with a retry_limit)."""
    w = world
    f = await setup(w)
    cost = wp.CostPolicy(
        per_attempt_limit=common_pb2.ResourceVector(currency="EUR", tokens=100),
        retry_limit=common_pb2.ResourceVector(currency="EUR", tokens=60),
    )
    epoch = await accepted(f, w, "wi-1", cost_policy=cost)
    await f.start(w.worker, "wi-1", epoch, "lease-1")
    over = await refused(
        w,
        w.worker,
        G,
        "work_renew_lease",
        usage(epoch, "lease-1", 101),
        R.REJECTION_REASON_BUDGET_EXCEEDED,
        membership_epoch=3,
    )
    assert (over.metadata["budget"], over.metadata["dimension"]) == ("attempt", "tokens")
    await f.as_(w.worker, "work_renew_lease", usage(epoch, "lease-1", 100))
    assert not (await w.client.work_item(G, "wi-1")).usage.retry_used.tokens  # the first attempt is no retry
    flaky = wp.WorkFail(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        kind=wp.WORK_FAILURE_KIND_TRANSIENT,
        evidence=[builders.evidence("ev-timeout")],
        reason="upstream timed out",
    )
    await f.as_(w.worker, "work_fail", flaky)
    w.clock.advance(seconds=2)  # the default initial backoff
    await f.start(w.worker, "wi-1", epoch, "lease-2")  # the retry: a fresh per-attempt allowance
    over = await refused(
        w,
        w.worker,
        G,
        "work_renew_lease",
        usage(epoch, "lease-2", 61),
        R.REJECTION_REASON_BUDGET_EXCEEDED,
        membership_epoch=3,
    )
    assert (over.metadata["budget"], over.metadata["dimension"]) == ("retries", "tokens")
    await f.as_(w.worker, "work_renew_lease", usage(epoch, "lease-2", 60))
    item = await w.client.work_item(G, "wi-1")
    assert (item.usage.retry_used.tokens, item.usage.budget.used.tokens, item.attempts) == (60, 160, 2)


@pytest.mark.req("MW-10.1-01", "OP-04")
async def test_the_time_policy_bounds_an_attempt_and_its_lease_durations(world: World) -> None:
    """work.proto TimePolicy (set lease durations within 1 s .. 24 h, refused at authorization) and
    TimePolicy.attempt_time_limit (no execution lease, granted or renewed, outlives its start plus
    the limit)."""
    w = world
    f = await setup(w)
    long = builders.contract(w.clock.now())
    long.time_policy.blocked_lease_duration.FromSeconds(25 * 3600)
    body = wp.WorkAuthorize(work_item_id="wi-x", title="x", contract=long, coordinator_epoch=1)
    rejection = await refused(
        w, w.coordinator, G, "work_authorize", body, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=2
    )
    assert rejection.metadata["field"] == "body.contract.time_policy.blocked_lease_duration"
    limited = builders.contract(w.clock.now())
    limited.time_policy.attempt_time_limit.FromSeconds(90)  # the execution lease is 60 s
    await f.coord(
        "work_authorize",
        wp.WorkAuthorize(work_item_id="wi-1", title="t", contract=limited, coordinator_epoch=1),
    )
    epoch = await f.accept(w.worker, "wi-1", await f.offer("wi-1", "worker-bot"))
    started_event = await f.as_(
        w.worker, "work_start", wp.WorkStart(work_item_id="wi-1", ownership_epoch=epoch, lease_id="lease-1")
    )
    began = from_timestamp(decode_events(started_event.events)[0].work_started.lease.started_at)
    w.clock.advance(seconds=50)
    renewed = await f.as_(w.worker, "work_renew_lease", usage(epoch, "lease-1", 0, seconds=60))
    assert from_timestamp(
        decode_events(renewed.events)[0].work_lease_renewed.renewal.expires_at
    ) == began + timedelta(seconds=90)
    assert from_timestamp((await w.client.work_item(G, "wi-1")).lease.expires_at) == began + timedelta(
        seconds=90
    )


@pytest.mark.req("MW-7.1-12", "MW-13.3-05")
async def test_directive_parameters_and_transfer_reasons_are_bounded_as_mission_proto_says(
    world: World,
) -> None:
    """mission.proto MissionIssueDirective.parameters_json (a JSON object, else INVALID_ARGUMENT; over
    16 KiB TOO_LARGE) and
    MissionAuthorizeContextTransfer.reason (1..4096 characters)."""
    w = world
    await create(w)
    await create(w, "grp_other")
    for parameters, reason in (
        ("[1, 2]", R.REJECTION_REASON_INVALID_ARGUMENT),
        ('"EU"', R.REJECTION_REASON_INVALID_ARGUMENT),
        ('{"pad": "' + "x" * (16 * 1024) + '"}', R.REJECTION_REASON_TOO_LARGE),
    ):
        directive = mission_pb2.MissionIssueDirective(directive="prioritise", parameters_json=parameters)
        await refused(w, w.owner, G, "mission_issue_directive", directive, reason, membership_epoch=1)
    for reason in ("", "r" * 4097):
        transfer = mission_pb2.MissionAuthorizeContextTransfer(target_group_id="grp_other", reason=reason)
        await refused(
            w,
            w.owner,
            G,
            "mission_authorize_context_transfer",
            transfer,
            R.REJECTION_REASON_INVALID_ARGUMENT,
            membership_epoch=1,
        )
    transfer = mission_pb2.MissionAuthorizeContextTransfer(target_group_id="grp_other", reason="r" * 4096)
    await w.run(w.owner, G, "mission_authorize_context_transfer", transfer, membership_epoch=1)


@pytest.mark.req("MW-10.4-03")
async def test_each_dependency_policy_kind_decides_eligibility_as_documented(world: World) -> None:
    """work.proto DependencyPolicyKind (ALL_VERIFIED, also for an unset kind; ALL_TERMINAL;
    ANY_VERIFIED; MIN_VERIFIED) and DependencyPolicy.min_verified (0 = 1), as
    WorkItem.dependencies_satisfied reports them."""
    w = world
    f = await setup(w)
    for wid in ("dep-ok", "dep-failed", "dep-open"):
        await f.authorize(wid)
    submission = await f.run_to_submitted(w.worker, "dep-ok")
    await f.coord(
        "work_accept_result",
        wp.WorkAcceptResult(work_item_id="dep-ok", coordinator_epoch=1, submission_event_id=submission),
    )
    failure = wp.WorkFail(
        work_item_id="dep-failed",
        coordinator_epoch=1,
        kind=wp.WORK_FAILURE_KIND_PERMANENT,
        evidence=[builders.evidence("ev-f")],
        reason="source retired",
    )
    await f.coord("work_fail", failure)
    deps = ("dep-ok", "dep-failed", "dep-open")
    K = wp.DependencyPolicyKind
    policies = {
        "unset": (None, False),
        "all-verified": (wp.DependencyPolicy(kind=K.DEPENDENCY_POLICY_KIND_ALL_VERIFIED), False),
        "all-terminal": (wp.DependencyPolicy(kind=K.DEPENDENCY_POLICY_KIND_ALL_TERMINAL), False),
        "any-verified": (wp.DependencyPolicy(kind=K.DEPENDENCY_POLICY_KIND_ANY_VERIFIED), True),
        "min-2": (wp.DependencyPolicy(kind=K.DEPENDENCY_POLICY_KIND_MIN_VERIFIED, min_verified=2), False),
        "min-0": (wp.DependencyPolicy(kind=K.DEPENDENCY_POLICY_KIND_MIN_VERIFIED), True),
    }
    for name, (policy, _) in policies.items():
        await f.authorize(name, depends_on=deps, dependency_policy=policy)

    async def satisfied() -> dict[str, bool]:
        return {name: (await w.client.work_item(G, name)).dependencies_satisfied for name in policies}

    assert await satisfied() == {name: expected for name, (_, expected) in policies.items()}
    await f.authorize("min-0-of-open", depends_on=("dep-open",), dependency_policy=policies["min-0"][0])
    assert not (await w.client.work_item(G, "min-0-of-open")).dependencies_satisfied  # 0 means 1
    await f.coord(
        "work_cancel", wp.WorkCancel(work_item_id="dep-open", coordinator_epoch=1, reason="not needed")
    )
    assert (await satisfied())["all-terminal"] and not (await satisfied())["all-verified"]


@pytest.mark.req("MW-10.2-T03", "MW-10.3-02", "MW-10.3-04", "MW-10.1-05")
async def test_an_offer_names_a_bounded_set_of_members_expires_later_and_supersedes_earlier_ones(
    world: World,
) -> None:
    """work.proto WorkOffer (never with a live owner: INVALID_TRANSITION; earlier offers withdrawn
    SUPERSEDED, or CONTRACT_REVISED with an amended contract), WorkOffer.candidate_ids (1..8 distinct,
    each with an active Membership), .expires_at (in the future), .extends_offer_id (an open offer,
    else NOT_FOUND) and .amended_contract (increments the contract revision)."""
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    many = [f"bot-{n}" for n in range(9)]
    for candidates in ([], many, ["worker-bot", "worker-bot"], ["alice-never-joined"]):
        body = f.offer_body("wi-1", *candidates)
        await refused(
            w, w.coordinator, G, "work_offer", body, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=2
        )
    late = f.offer_body("wi-1", "worker-bot", seconds=-1)
    await refused(
        w, w.coordinator, G, "work_offer", late, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=2
    )
    unknown = f.offer_body("wi-1", "worker-bot")
    unknown.extends_offer_id = "offer-nope"
    await refused(
        w, w.coordinator, G, "work_offer", unknown, R.REJECTION_REASON_NOT_FOUND, membership_epoch=2
    )
    first = await f.offer("wi-1", "worker-bot")
    second = f.offer_body("wi-1", "worker-bot")
    withdrawn = decode_events((await f.coord("work_offer", second)).events)[0].work_offers_withdrawn
    assert (list(withdrawn.offer_ids), withdrawn.reason) == ([first], wp.OFFER_WITHDRAWAL_REASON_SUPERSEDED)
    amended = f.offer_body("wi-1", "worker-bot")
    amended.amended_contract.CopyFrom(builders.contract(w.clock.now(), goal="Reconcile the EU ledger"))
    revised, offered = decode_events((await f.coord("work_offer", amended)).events)
    assert (list(revised.work_offers_withdrawn.offer_ids), revised.work_offers_withdrawn.reason) == (
        [second.offer_id],
        wp.OFFER_WITHDRAWAL_REASON_CONTRACT_REVISED,
    )
    assert offered.work_offered.contract_revision == 2 and offered.work_offered.amended_contract.revision == 2
    assert (await w.client.work_item(G, "wi-1")).contract.revision == 2
    await f.accept(w.worker, "wi-1", amended.offer_id, revision=2)
    await refused(
        w,
        w.coordinator,
        G,
        "work_offer",
        f.offer_body("wi-1", "worker-bot"),
        R.REJECTION_REASON_INVALID_TRANSITION,
        membership_epoch=2,
    )


@pytest.mark.req("MW-13.1-02", "MW-11.3-04")
async def test_a_published_artifact_enters_the_read_model_by_digest_only(world: World) -> None:
    """work.proto WorkPublishArtifact.deliverable_id (a deliverable of the contract), ArtifactPublished
    (`artifact.published`; manifest not set, manifest_digest names it) and WorkItem.artifacts (by
    digest: algorithm "blake3", hex, size; media_type not kept)."""
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    data = b"reconciled ledger " * 100
    await w.client.upload(data, manifest_for(w, w.worker, data))
    ref = common_pb2.ArtifactRef(digest=blob_digest(data), media_type="text/csv")
    publish = wp.WorkPublishArtifact(
        work_item_id="wi-1", lease_id="lease-1", ownership_epoch=epoch, artifact=ref, deliverable_id="nope"
    )
    await refused(
        w,
        w.worker,
        G,
        "work_publish_artifact",
        publish,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=3,
    )
    publish.deliverable_id = "report"
    event = decode_events((await f.as_(w.worker, "work_publish_artifact", publish)).events)[0]
    assert event.type == "artifact.published" and not event.artifact_published.HasField("manifest")
    assert (
        event.artifact_published.manifest_digest.hex and event.artifact_published.deliverable_id == "report"
    )
    digest = blob_digest(data)
    expected = common_pb2.ArtifactRef(
        digest=common_pb2.Digest(algorithm="blake3", hex=digest.hex, size_bytes=len(data))
    )
    assert list((await w.client.work_item(G, "wi-1")).artifacts) == [expected]


@pytest.mark.req("MW-11.4-08")
async def test_a_jittered_backoff_retries_sooner_than_the_full_backoff(world: World) -> None:
    """work.proto RetryPolicy.jitter (full jitter: the delay lies in [0, backoff)) and .initial_backoff
    (the backoff before the second attempt, under the default 5-minute max_backoff), as
    LeaseRevoked.retry_not_before shows them."""
    w = world
    f = await setup(w)
    delays = []
    for wid, jitter in (("wi-steady", False), ("wi-jitter", True)):
        policy = wp.RetryPolicy(max_attempts=2, jitter=jitter)
        policy.initial_backoff.FromSeconds(120)
        epoch = await accepted(f, w, wid, retry_policy=policy)
        await f.start(w.worker, wid, epoch, f"lease-{wid}")
        flaky = wp.WorkFail(
            work_item_id=wid,
            lease_id=f"lease-{wid}",
            ownership_epoch=epoch,
            kind=wp.WORK_FAILURE_KIND_TRANSIENT,
            evidence=[builders.evidence("ev-timeout")],
            reason="upstream timed out",
        )
        result = await f.as_(w.worker, "work_fail", flaky)
        revoked = decode_events(result.events)[-1]
        delays.append(
            from_timestamp(revoked.lease_revoked.retry_not_before) - from_timestamp(revoked.recorded_at)
        )
    assert delays[0] == timedelta(seconds=120) and timedelta(0) <= delays[1] < timedelta(seconds=120)
