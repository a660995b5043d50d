"""Mission lifecycle (7.1), Coordinator lease (7.2) and completion (7.3) through the public gRPC API.

Each test names the table rows and MUSTs it proves; every rejection is checked to write nothing.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import GROUP_SUMMARY_TYPE, session_key_id, verify_signature
from missionweave.sdk.client import SessionSigner, decode_events
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import command_pb2, common_pb2, membership_pb2, mission_pb2
from tests import builders
from tests.conftest import World
from tests.test_grpc_authority import db_image

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

R = common_pb2.RejectionReason
MS = mission_pb2.MissionState
G = "grp_lifecycle"


async def create(w: World, group: str = G, lease_seconds: int = 60) -> apb.GroupState:
    body = builders.mission_create("alice", "coord-bot", w.clock.now())
    body.coordinator_renewal.lease_duration.FromSeconds(lease_seconds)
    await w.run(w.owner, group, "mission_create", body)
    return await w.client.group_state(group)


async def refused(
    w: World, signer: SessionSigner, group: str, kind: str, body: Any, reason: int, **kw: Any
) -> common_pb2.Rejection:
    """Executes and expects ``reason``; the database is byte-identical afterwards."""
    before = await db_image(w)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await w.run(signer, group, kind, body, **kw)
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None, info.value
    assert R.Name(rejection.reason) == R.Name(reason), rejection.message
    assert await db_image(w) == before
    return rejection


async def mission(w: World, group: str = G) -> mission_pb2.Mission:
    return (await w.client.group_state(group)).mission


async def submit(
    w: World, group: str = G, signer: SessionSigner | None = None, **overrides: Any
) -> command_pb2.CommandResult:
    m = await mission(w, group)
    body = mission_pb2.MissionSubmitForApproval(
        coordinator_epoch=m.coordinator.coordinator_epoch, mission_revision=m.revision, summary="done"
    )
    for key, value in overrides.items():
        setattr(body, key, value)
    signer = signer or w.coordinator
    return await w.run(
        signer,
        group,
        "mission_submit_for_approval",
        body,
        membership_epoch=await w.epoch_of(group, signer.identity_id),
    )


async def as_member(
    w: World, group: str, signer: SessionSigner, role: int = membership_pb2.MEMBER_ROLE_WORKER
) -> None:
    grant = membership_pb2.MembershipGrant(member_id=signer.identity_id, role=role)  # type: ignore[arg-type]
    await w.run(w.owner, group, "membership_grant", grant, membership_epoch=1)


def approve_body(m: mission_pb2.Mission) -> mission_pb2.MissionApprove:
    return mission_pb2.MissionApprove(submission_event_id=m.latest_submission_event_id, comment="ship it")


@pytest.mark.req("MW-7.1-T04", "MW-7.1-T05", "MW-7.1-T06", "MW-7.3-05", "MW-7.3-06", "MW-7.3-07", "MW-7.1-06")
async def test_submit_request_changes_resubmit_and_approve(world: World) -> None:
    w = world
    await create(w)
    first = await submit(w)
    m = await mission(w)
    assert m.state == MS.MISSION_STATE_AWAITING_APPROVAL and m.revision == 2
    assert m.latest_submission_event_id == decode_events(first.events)[0].event_id
    changes = mission_pb2.MissionRequestChanges(
        submission_event_id=m.latest_submission_event_id, requested_changes="add Q2"
    )
    result = await w.run(w.owner, G, "mission_request_changes", changes, membership_epoch=1)
    m = await mission(w)
    assert m.state == MS.MISSION_STATE_ACTIVE and m.revision == 3  # T05 reopens the same Mission
    # MW-7.3-06: the change request carries the owner's own signature, verifiable without the Authority.
    signed = decode_events(result.events)[0].mission_changes_requested.owner_signed_command
    assert verify_signature(signed, bytes(w.owner.key.verify_key))
    assert signed.signatures[0].key_id == session_key_id("alice", w.owner.session_epoch)

    await submit(w)
    m = await mission(w)
    approved = await w.run(w.owner, G, "mission_approve", approve_body(m), membership_epoch=1)
    m = await mission(w)
    assert m.state == MS.MISSION_STATE_APPROVED and m.approval_event_id
    assert verify_signature(
        decode_events(approved.events)[0].mission_approved.owner_signed_command, bytes(w.owner.key.verify_key)
    )
    # MW-7.3-07: both submissions remain in the history.
    types = [e.type async for e in w.client.read_events(G)]
    assert types.count("mission.submitted") == 2 and "mission.changes_requested" in types


@pytest.mark.req("MW-7.1-T04", "MW-7.2-03")
async def test_only_the_current_coordinator_submits_a_named_revision(world: World) -> None:
    w = world
    await create(w)
    await as_member(w, G, w.worker)
    m = await mission(w)
    body = mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=m.revision)
    await refused(
        w,
        w.worker,
        G,
        "mission_submit_for_approval",
        body,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=3,
    )
    await refused(
        w,
        w.owner,
        G,
        "mission_submit_for_approval",
        body,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=1,
    )
    stale = mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=m.revision + 5)
    await refused(
        w,
        w.coordinator,
        G,
        "mission_submit_for_approval",
        stale,
        R.REJECTION_REASON_REVISION_MISMATCH,
        membership_epoch=2,
    )
    wrong_epoch = mission_pb2.MissionSubmitForApproval(coordinator_epoch=7, mission_revision=m.revision)
    await refused(
        w,
        w.coordinator,
        G,
        "mission_submit_for_approval",
        wrong_epoch,
        R.REJECTION_REASON_COORDINATOR_EPOCH_STALE,
        membership_epoch=2,
    )
    bad_ref = mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=m.revision)
    bad_ref.artifacts.add().digest.CopyFrom(common_pb2.Digest(algorithm="sha1", hex="ab"))
    await refused(
        w,
        w.coordinator,
        G,
        "mission_submit_for_approval",
        bad_ref,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=2,
    )


@pytest.mark.req("MW-7.1-T05", "MW-7.1-T06")
async def test_only_the_owner_answers_and_only_the_latest_submission(world: World) -> None:
    w = world
    await create(w)
    await submit(w)
    m = await mission(w)
    await refused(
        w,
        w.coordinator,
        G,
        "mission_approve",
        approve_body(m),
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=2,
    )
    old = mission_pb2.MissionApprove(submission_event_id="evt_not_the_latest")
    await refused(
        w, w.owner, G, "mission_approve", old, R.REJECTION_REASON_REVISION_MISMATCH, membership_epoch=1
    )
    no_reason = mission_pb2.MissionRequestChanges(submission_event_id=m.latest_submission_event_id)
    await refused(
        w,
        w.owner,
        G,
        "mission_request_changes",
        no_reason,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=1,
    )


@pytest.mark.req("MW-7.1-06", "MW-7.1-07")
async def test_terminal_states_are_never_left(world: World) -> None:
    """approved, cancelled and failed are terminal: every lifecycle command is refused, nothing written."""
    w = world
    await create(w, "grp_a")
    await submit(w, "grp_a")
    await w.run(
        w.owner, "grp_a", "mission_approve", approve_body(await mission(w, "grp_a")), membership_epoch=1
    )
    await create(w, "grp_c")
    await w.run(
        w.owner, "grp_c", "mission_cancel", mission_pb2.MissionCancel(reason="not needed"), membership_epoch=1
    )
    await create(w, "grp_f")
    await w.run(
        w.coordinator,
        "grp_f",
        "mission_terminate",
        mission_pb2.MissionTerminate(coordinator_epoch=1, reason="blocked"),
        membership_epoch=2,
    )
    for group, final in (
        ("grp_a", MS.MISSION_STATE_APPROVED),
        ("grp_c", MS.MISSION_STATE_CANCELLED),
        ("grp_f", MS.MISSION_STATE_FAILED),
    ):
        m = await mission(w, group)
        assert m.state == final
        T = R.REJECTION_REASON_TERMINAL_STATE
        await refused(
            w,
            w.owner,
            group,
            "mission_cancel",
            mission_pb2.MissionCancel(reason="again"),
            T,
            membership_epoch=1,
        )
        terminate = mission_pb2.MissionTerminate(coordinator_epoch=1, reason="again")
        await refused(w, w.coordinator, group, "mission_terminate", terminate, T, membership_epoch=2)
        resubmit = mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=m.revision)
        await refused(w, w.coordinator, group, "mission_submit_for_approval", resubmit, T, membership_epoch=2)
        await refused(w, w.owner, group, "mission_approve", approve_body(m), T, membership_epoch=1)
        renew = mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1)
        await refused(
            w, w.coordinator, group, "mission_renew_coordinator_lease", renew, T, membership_epoch=2
        )
        grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
        await refused(w, w.owner, group, "membership_grant", grant, T, membership_epoch=1)


@pytest.mark.req("MW-7.1-T07", "MW-7.1-11")
async def test_cancel_by_owner_or_organization_never_by_the_coordinator(world: World) -> None:
    w = world
    await create(w)
    cancel = mission_pb2.MissionCancel(reason="priorities changed")
    await refused(
        w,
        w.coordinator,
        G,
        "mission_cancel",
        cancel,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=2,
    )
    # Organization policy: the administrator holds no Membership and sends membership epoch 0.
    result = await w.run(w.admin, G, "mission_cancel", cancel)
    assert decode_events(result.events)[0].type == "mission.cancelled"
    assert (await mission(w)).state == MS.MISSION_STATE_CANCELLED


@pytest.mark.req("MW-7.1-T07")
async def test_owner_cancels(world: World) -> None:
    w = world
    await create(w)
    await w.run(
        w.owner, G, "mission_cancel", mission_pb2.MissionCancel(reason="done elsewhere"), membership_epoch=1
    )
    assert (await mission(w)).state == MS.MISSION_STATE_CANCELLED


@pytest.mark.req("MW-7.1-T08")
async def test_terminate_by_the_coordinator_or_organization(world: World) -> None:
    w = world
    await create(w)
    body = mission_pb2.MissionTerminate(coordinator_epoch=1, reason="unrecoverable")
    await refused(
        w, w.owner, G, "mission_terminate", body, R.REJECTION_REASON_PERMISSION_DENIED, membership_epoch=1
    )
    await refused(
        w,
        w.coordinator,
        G,
        "mission_terminate",
        mission_pb2.MissionTerminate(coordinator_epoch=1),
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=2,
    )
    await w.run(w.coordinator, G, "mission_terminate", body, membership_epoch=2)
    assert (await mission(w)).state == MS.MISSION_STATE_FAILED
    await create(w, "grp_org")
    await w.run(w.admin, "grp_org", "mission_terminate", mission_pb2.MissionTerminate(reason="policy"))
    assert (await mission(w, "grp_org")).state == MS.MISSION_STATE_FAILED


async def approved_mission(w: World, group: str) -> mission_pb2.Mission:
    await create(w, group)
    await submit(w, group)
    await w.run(w.owner, group, "mission_approve", approve_body(await mission(w, group)), membership_epoch=1)
    return await mission(w, group)


def follow_up_body(
    w: World, approved: mission_pb2.Mission, owner: str = "alice"
) -> mission_pb2.MissionCreateFollowUp:
    return mission_pb2.MissionCreateFollowUp(
        approved_mission_id=approved.mission_id,
        approved_group_id=approved.group_id,
        definition=builders.definition(owner, w.clock.now(), title="Fix the Q3 figures"),
        coordinator_id="coord-bot",
        reason="a figure was wrong",
    )


@pytest.mark.req("MW-7.1-T02", "MW-7.1-08")
async def test_follow_up_links_to_an_approved_mission_by_the_same_human_owner(world: World) -> None:
    w = world
    approved = await approved_mission(w, "grp_done")
    await w.run(w.owner, "grp_fix", "mission_create_follow_up", follow_up_body(w, approved))
    fix = await mission(w, "grp_fix")
    assert fix.state == MS.MISSION_STATE_ACTIVE and fix.kind == mission_pb2.MISSION_KIND_FOLLOW_UP
    assert fix.follows_up_mission_id == approved.mission_id and fix.planning_conversation_id
    assert (await mission(w, "grp_done")).state == MS.MISSION_STATE_APPROVED  # never reopened (MW-7.1-07)


@pytest.mark.req("MW-7.1-T02")
async def test_follow_up_refusals(world: World) -> None:
    w = world
    active = await create(w, "grp_active")
    body = follow_up_body(w, active.mission)
    await refused(
        w, w.owner, "grp_fu1", "mission_create_follow_up", body, R.REJECTION_REASON_PRECONDITION_FAILED
    )
    approved = await approved_mission(w, "grp_ok")
    await refused(
        w,
        w.coordinator,
        "grp_fu2",
        "mission_create_follow_up",
        follow_up_body(w, approved),
        R.REJECTION_REASON_PERMISSION_DENIED,
    )
    other_owner = follow_up_body(w, approved)
    other_owner.definition.owner_id = "bob"
    await w.client.register_identity(
        "admin", w.keys["admin"], "bob", common_pb2.IDENTITY_KIND_HUMAN, bytes(32)
    )
    await refused(
        w, w.owner, "grp_fu3", "mission_create_follow_up", other_owner, R.REJECTION_REASON_INVALID_ARGUMENT
    )
    missing = follow_up_body(w, approved)
    missing.approved_group_id = "grp_nowhere"
    await refused(w, w.owner, "grp_fu4", "mission_create_follow_up", missing, R.REJECTION_REASON_NOT_FOUND)


@pytest.mark.req("MW-7.1-09", "MW-7.1-08", "MW-7.1-07")
async def test_revoking_an_approval_appends_an_event_cites_the_follow_up_and_keeps_the_approval(
    world: World,
) -> None:
    w = world
    approved = await approved_mission(w, "grp_rev")
    revoke = mission_pb2.MissionRevokeApproval(
        approval_event_id=approved.approval_event_id, reason="figures wrong", follow_up_group_id="grp_rev_fix"
    )
    # Without the linked follow-up Mission the revocation is refused (MW-7.1-08).
    await refused(
        w,
        w.owner,
        "grp_rev",
        "mission_revoke_approval",
        revoke,
        R.REJECTION_REASON_NOT_FOUND,
        membership_epoch=1,
    )
    await w.run(w.owner, "grp_rev_fix", "mission_create_follow_up", follow_up_body(w, approved))
    no_reason = mission_pb2.MissionRevokeApproval(
        approval_event_id=approved.approval_event_id, follow_up_group_id="grp_rev_fix"
    )
    await refused(
        w,
        w.owner,
        "grp_rev",
        "mission_revoke_approval",
        no_reason,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=1,
    )
    await refused(
        w,
        w.coordinator,
        "grp_rev",
        "mission_revoke_approval",
        revoke,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=2,
    )
    await w.run(w.owner, "grp_rev", "mission_revoke_approval", revoke, membership_epoch=1)
    m = await mission(w, "grp_rev")
    assert m.state == MS.MISSION_STATE_APPROVED and m.approval_revoked_event_id
    assert m.approval_event_id == approved.approval_event_id and list(m.follow_up_mission_ids) == [
        "mis_rev_fix"
    ]
    events = [e async for e in w.client.read_events("grp_rev")]
    assert [e.event_id for e in events if e.type == "mission.approved"] == [approved.approval_event_id]
    await refused(
        w,
        w.owner,
        "grp_rev",
        "mission_revoke_approval",
        revoke,
        R.REJECTION_REASON_INVALID_TRANSITION,
        membership_epoch=1,
    )


@pytest.mark.req("MW-7.2-02", "MW-7.2-01")
async def test_the_coordinator_renews_its_live_lease(world: World) -> None:
    w = world
    await create(w, lease_seconds=60)
    before = (await mission(w)).coordinator.expires_at.ToDatetime()
    w.clock.advance(seconds=30)
    await w.run(
        w.coordinator,
        G,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        membership_epoch=2,
    )
    lease = (await mission(w)).coordinator
    assert lease.coordinator_epoch == 1 and lease.expires_at.ToDatetime() > before
    await as_member(w, G, w.worker)
    renew = mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1)
    # A Worker's role never renews the lease (docs/authorization.md), before any epoch is compared.
    stranger = await refused(
        w,
        w.worker,
        G,
        "mission_renew_coordinator_lease",
        renew,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=3,
    )
    assert (stranger.metadata["check"], stranger.metadata["role"]) == ("role", "worker")
    w.clock.advance(seconds=61)
    await refused(
        w,
        w.coordinator,
        G,
        "mission_renew_coordinator_lease",
        renew,
        R.REJECTION_REASON_LEASE_EXPIRED,
        membership_epoch=2,
    )
    late = mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=1)
    await refused(
        w,
        w.coordinator,
        G,
        "mission_submit_for_approval",
        late,
        R.REJECTION_REASON_LEASE_EXPIRED,
        membership_epoch=2,
    )


@pytest.mark.req("MW-7.2-04", "MW-7.2-05", "MW-7.2-06", "MW-7.2-07", "MW-7.2-08", "MW-7.2-01", "MW-7.2-11")
async def test_replacement_after_lapse_fences_the_old_epoch_and_must_reconcile(world: World) -> None:
    w = world
    await create(w, lease_seconds=30)
    await w.run(
        w.coordinator,
        G,
        "message_post",
        builders.message((await mission(w)).planning_conversation_id, "plan v1"),
        membership_epoch=2,
    )
    replace = mission_pb2.MissionReplaceCoordinator(coordinator_id="worker-bot", replaced_coordinator_epoch=1)
    # While the lease is live there is nothing to replace.
    await refused(
        w,
        w.owner,
        G,
        "mission_replace_coordinator",
        replace,
        R.REJECTION_REASON_PRECONDITION_FAILED,
        membership_epoch=1,
    )
    w.clock.advance(seconds=31)
    await refused(
        w,
        w.coordinator,
        G,
        "mission_replace_coordinator",
        replace,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=2,
    )
    as_owner = mission_pb2.MissionReplaceCoordinator(coordinator_id="alice", replaced_coordinator_epoch=1)
    await refused(
        w,
        w.owner,
        G,
        "mission_replace_coordinator",
        as_owner,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=1,
    )
    await w.run(w.owner, G, "mission_replace_coordinator", replace, membership_epoch=1)
    state = await w.client.group_state(G)
    lease = state.mission.coordinator
    assert (lease.agent_id, lease.coordinator_epoch, lease.reconciled) == ("worker-bot", 2, False)
    # MW-7.2-01: one current epoch; a second replacement citing the old epoch is stale.
    await refused(
        w,
        w.owner,
        G,
        "mission_replace_coordinator",
        replace,
        R.REJECTION_REASON_COORDINATOR_EPOCH_STALE,
        membership_epoch=1,
    )
    # MW-7.2-06: the previous Coordinator's coordination commands are stale from now on.
    old = mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=state.mission.revision)
    await refused(
        w,
        w.coordinator,
        G,
        "mission_submit_for_approval",
        old,
        R.REJECTION_REASON_COORDINATOR_EPOCH_STALE,
        membership_epoch=2,
    )
    new_epoch = await w.epoch_of(G, "worker-bot")
    # MW-7.2-08: nothing is submitted (or assigned) before reconciliation.
    fresh = mission_pb2.MissionSubmitForApproval(coordinator_epoch=2, mission_revision=state.mission.revision)
    await refused(
        w,
        w.worker,
        G,
        "mission_submit_for_approval",
        fresh,
        R.REJECTION_REASON_RECONCILIATION_REQUIRED,
        membership_epoch=new_epoch,
    )
    # MW-7.2-07: the replacement receives a summary signed by the Authority and verifies it.
    summary = (
        await w.client.authority.GetSignedGroupSummary(apb.GetSignedGroupSummaryRequest(group_id=G))
    ).summary
    key = await w.client.authority.GetAuthorityKey(apb.GetAuthorityKeyRequest())
    assert summary.payload_type == GROUP_SUMMARY_TYPE and verify_signature(summary, key.public_key)
    read = apb.GroupState.FromString(summary.payload)
    assert read.mission.coordinator.coordinator_epoch == 2
    too_early = mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=2, group_revision=1)
    await refused(
        w,
        w.worker,
        G,
        "mission_acknowledge_reconciliation",
        too_early,
        R.REJECTION_REASON_REVISION_MISMATCH,
        membership_epoch=new_epoch,
    )
    ack = mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=2, group_revision=read.head_sequence)
    await w.run(w.worker, G, "mission_acknowledge_reconciliation", ack, membership_epoch=new_epoch)
    await w.run(w.worker, G, "mission_submit_for_approval", fresh, membership_epoch=new_epoch)
    # MW-7.2-05: the previous Coordinator's events stay valid history.
    events = [e async for e in w.client.read_events(G)]
    assert any(e.actor_id == "coord-bot" and e.type == "message.posted" for e in events)


@pytest.mark.req("MW-7.1-12")
async def test_owner_directives_are_recorded_and_only_the_owner_issues_them(world: World) -> None:
    w = world
    await create(w)
    directive = mission_pb2.MissionIssueDirective(
        directive="prioritise the EU figures", parameters_json='{"region": "EU"}'
    )
    result = await w.run(w.owner, G, "mission_issue_directive", directive, membership_epoch=1)
    assert decode_events(result.events)[0].mission_directive_issued.directive == "prioritise the EU figures"
    await refused(
        w,
        w.coordinator,
        G,
        "mission_issue_directive",
        directive,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=2,
    )
    bad = mission_pb2.MissionIssueDirective(directive="x", parameters_json="[1]")
    await refused(
        w, w.owner, G, "mission_issue_directive", bad, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=1
    )


@pytest.mark.req("MW-7.1-02", "MW-7.1-01")
async def test_root_owner_must_be_human_and_definition_complete(world: World) -> None:
    w = world
    body = builders.mission_create("worker-bot", "coord-bot", w.clock.now())
    await refused(w, w.owner, "grp_agent_owned", "mission_create", body, R.REJECTION_REASON_INVALID_ARGUMENT)
    no_deadline = builders.mission_create("alice", "coord-bot", w.clock.now(), deadline=None)
    await refused(
        w, w.owner, "grp_no_deadline", "mission_create", no_deadline, R.REJECTION_REASON_INVALID_ARGUMENT
    )
