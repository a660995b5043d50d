"""Mission lifecycle rules (spec 7.1, 7.2, 7.3, 13.3) through decide/evolve: the exact events each
command appends (types and payloads), the exact refusal (reason and metadata), and the state the
later rules read."""

from __future__ import annotations

from datetime import timedelta

import pytest

from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import common_pb2, conversation_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState, TransferGrant
from tests import builders
from tests.core_group import CoreGroup
from tests.mission_fixtures import (
    CTX,
    IDS,
    LATE,
    MS,
    NOW,
    G,
    R,
    accepted,
    active,
    approved,
    authorized,
    awaiting,
    ctx,
    fold_onto,
    payloads,
    submit_body,
)

Role = membership_pb2.MemberRole


def grant(member: str, role: int, epoch: int, group: str = "grp_a") -> membership_pb2.MembershipGranted:
    return membership_pb2.MembershipGranted(
        membership=membership_pb2.Membership(
            member_id=member,
            group_id=group,
            membership_epoch=epoch,
            role=role,
            visibility_start_sequence=1,
            active=True,  # type: ignore[arg-type]
        )
    )


def lease_granted(
    agent: str,
    epoch: int,
    session: int,
    expires: timedelta,
    *,
    reconciled: bool,
    by: str,
    replaced: int = 0,
    duration: timedelta = timedelta(minutes=5),
    renew_before: timedelta = timedelta(minutes=1),
    now=NOW,
) -> mission_pb2.CoordinatorLeaseGranted:
    lease = mission_pb2.CoordinatorLease(
        agent_id=agent,
        coordinator_epoch=epoch,
        session_epoch=session,
        expires_at=to_timestamp(now + expires),
        renewal_policy=mission_pb2.RenewalPolicy(),
        reconciled=reconciled,
    )
    lease.renewal_policy.lease_duration.FromTimedelta(duration)
    lease.renewal_policy.renew_before.FromTimedelta(renew_before)
    return mission_pb2.CoordinatorLeaseGranted(
        lease=lease, appointed_by=by, replaced_coordinator_epoch=replaced
    )


def created_events(
    group: str, definition: mission_pb2.MissionDefinition, coordinator: str, kind: int, **links: str
):
    planning = ids.derived_id("conv", group, "planning")
    return [
        (
            "mission.created",
            mission_pb2.MissionCreated(
                mission_id=f"mis_{ids.suffix(group)}",
                kind=kind,
                definition=definition,  # type: ignore[arg-type]
                planning_conversation_id=planning,
                **links,
            ),
        ),
        (
            "conversation.opened",
            conversation_pb2.ConversationOpened(
                conversation_id=planning,
                kind=conversation_pb2.CONVERSATION_KIND_PLANNING,
                title=definition.title,
            ),
        ),
        ("membership.granted", grant(definition.owner_id, Role.MEMBER_ROLE_MISSION_OWNER, 1, group)),
        ("membership.granted", grant(coordinator, Role.MEMBER_ROLE_COORDINATOR, 2, group)),
    ]


# ---------------------------------------------------------------- creation


@pytest.mark.req("MW-7.1-T01", "MW-7.1-03", "MW-7.2-02", "MW-8-05")
def test_mission_create_appends_the_mission_its_planning_conversation_memberships_and_lease() -> None:
    body = builders.mission_create("alice", "coord", NOW)
    events = accepted(G.decide(None, "mission_create", body, "alice"))
    assert payloads(events) == [
        *created_events("grp_a", body.definition, "coord", mission_pb2.MISSION_KIND_ROOT),
        (
            "mission.coordinator_lease.granted",
            lease_granted("coord", 1, 1, timedelta(minutes=5), reconciled=True, by="alice"),
        ),
    ]
    state = fold_onto(None, events)
    m = state.mission
    assert m is not None
    assert (m.mission_id, m.kind, m.state, m.revision, m.created_at) == (
        "mis_a",
        mission_pb2.MISSION_KIND_ROOT,
        MS.MISSION_STATE_ACTIVE,
        1,
        NOW,
    )
    assert (m.root_owner_id, m.follows_up_mission_id, m.parent_mission_id, m.parent_work_item_id) == (
        "alice",
        "",
        "",
        "",
    )
    assert m.planning_conversation_id == ids.derived_id("conv", "grp_a", "planning")
    assert m.definition == body.definition
    lease = m.coordinator
    assert lease is not None
    assert (lease.agent_id, lease.coordinator_epoch, lease.session_epoch, lease.expires_at) == (
        "coord",
        1,
        1,
        NOW + timedelta(minutes=5),
    )
    assert (lease.lease_duration_s, lease.renew_before_s, lease.reconciled, lease.granted_at_sequence) == (
        300,
        60,
        True,
        5,
    )
    assert m.coordinator_agents == {1: "coord"}
    assert {k: (v.role, v.membership_epoch, v.active) for k, v in state.members.items()} == {
        "alice": (Role.MEMBER_ROLE_MISSION_OWNER, 1, True),
        "coord": (Role.MEMBER_ROLE_COORDINATOR, 2, True),
    }


@pytest.mark.req("MW-7.2-02")
def test_the_lease_follows_the_requested_renewal_policy_and_the_coordinators_session() -> None:
    body = builders.mission_create("alice", "coord3", NOW)
    body.coordinator_renewal.lease_duration.FromSeconds(600)
    body.coordinator_renewal.renew_before.FromSeconds(120)
    events = accepted(G.decide(None, "mission_create", body, "alice"))
    assert payloads(events)[-1] == (
        "mission.coordinator_lease.granted",
        lease_granted(
            "coord3",
            1,
            3,
            timedelta(minutes=10),
            reconciled=True,
            by="alice",
            duration=timedelta(minutes=10),
            renew_before=timedelta(minutes=2),
        ),
    )
    # A human Coordinator is allowed (the table names the agent or human that holds the lease).
    accepted(G.decide(None, "mission_create", builders.mission_create("alice", "bob", NOW), "alice"))


@pytest.mark.req("MW-7.1-T01", "MW-8-04")
@pytest.mark.parametrize("actor", ["ops", "admin"])
def test_organization_policy_creates_a_mission_for_its_human_owner(actor: str) -> None:
    body = builders.mission_create("alice", "coord", NOW)
    events = accepted(G.decide(None, "mission_create", body, actor))
    assert payloads(events)[-1][1].appointed_by == actor  # type: ignore[attr-defined]
    assert fold_onto(None, events).mission.definition.owner_id == "alice"  # type: ignore[union-attr]


@pytest.mark.req("MW-7.1-T01", "MW-7.1-02", "MW-7.2-11")
@pytest.mark.parametrize(
    "owner, coordinator, actor, reason, metadata",
    [
        ("alice", "coord", "bob", R.REJECTION_REASON_PERMISSION_DENIED, {}),
        ("alice", "coord", "worker", R.REJECTION_REASON_PERMISSION_DENIED, {}),
        ("alice", "coord", "ghost", R.REJECTION_REASON_UNKNOWN_IDENTITY, {"field": "actor_id"}),
        (
            "worker",
            "coord",
            "worker",
            R.REJECTION_REASON_INVALID_ARGUMENT,
            {"field": "body.definition.owner_id"},
        ),
        (
            "ghost",
            "coord",
            "ghost",
            R.REJECTION_REASON_UNKNOWN_IDENTITY,
            {"field": "body.definition.owner_id"},
        ),
        ("alice", "ghost", "alice", R.REJECTION_REASON_UNKNOWN_IDENTITY, {"field": "body.coordinator_id"}),
        ("alice", "", "alice", R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.coordinator_id"}),
        ("alice", "ops", "alice", R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.coordinator_id"}),
        ("alice", "alice", "alice", R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.coordinator_id"}),
    ],
)
def test_mission_create_refusals(
    owner: str, coordinator: str, actor: str, reason: int, metadata: dict[str, str]
) -> None:
    r = G.refused(None, "mission_create", builders.mission_create(owner, coordinator, NOW), actor)  # type: ignore[arg-type]
    assert (r.reason, r.metadata) == (reason, metadata)


@pytest.mark.req("MW-7.1-02")
def test_a_root_missions_owner_is_human_even_when_organization_policy_creates_it() -> None:
    r = G.refused(None, "mission_create", builders.mission_create("worker", "coord", NOW), "ops")  # type: ignore[arg-type]
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.definition.owner_id"},
    )
    assert r.message == "the MissionOwner of a root Mission must be a human identity (MW-7.1-02)"


@pytest.mark.req("MW-7.1-T01")
def test_mission_create_refusal_messages_name_the_rule() -> None:
    r = G.refused(None, "mission_create", builders.mission_create("alice", "coord", NOW), "bob")  # type: ignore[arg-type]
    assert (
        r.message
        == "mission.create is issued by the human MissionOwner or the Organization control plane (MW-7.1-T01)"
    )
    r = G.refused(None, "mission_create", builders.mission_create("alice", "ops", NOW), "alice")  # type: ignore[arg-type]
    assert r.message == "body.coordinator_id: the Coordinator must be an agent or a human"
    r = G.refused(None, "mission_create", builders.mission_create("alice", "alice", NOW), "alice")  # type: ignore[arg-type]
    assert (
        r.message
        == "body.coordinator_id: the MissionOwner cannot also be the Coordinator (separation of review)"
    )


# ---------------------------------------------------------------- follow-up (T02)

F = CoreGroup("grp_follow", CTX, NOW)


def follow_up_body(
    approved_state: GroupState, owner: str = "alice", **kw: object
) -> mission_pb2.MissionCreateFollowUp:
    assert approved_state.mission is not None
    fields: dict[str, object] = {
        "approved_group_id": approved_state.group_id,
        "approved_mission_id": approved_state.mission.mission_id,
        "definition": builders.definition(owner, NOW),
        "coordinator_id": "coord2",
    }
    return mission_pb2.MissionCreateFollowUp(**{**fields, **kw})  # type: ignore[arg-type]


@pytest.mark.req("MW-7.1-T02", "MW-7.1-08")
def test_a_follow_up_is_a_new_mission_linked_to_the_approved_one() -> None:
    done = approved()
    body = follow_up_body(done)
    body.coordinator_renewal.lease_duration.FromSeconds(60)
    events = accepted(F.decide(None, "mission_create_follow_up", body, "alice", ctx(NOW, done)))
    assert payloads(events) == [
        *created_events(
            "grp_follow",
            body.definition,
            "coord2",
            mission_pb2.MISSION_KIND_FOLLOW_UP,
            follows_up_mission_id="mis_a",
        ),
        (
            "mission.coordinator_lease.granted",
            lease_granted(
                "coord2",
                1,
                1,
                timedelta(seconds=60),
                reconciled=True,
                by="alice",
                duration=timedelta(seconds=60),
                renew_before=timedelta(seconds=12),
            ),
        ),
    ]
    m = fold_onto(None, events).mission
    assert m is not None and (m.kind, m.follows_up_mission_id, m.state) == (
        mission_pb2.MISSION_KIND_FOLLOW_UP,
        "mis_a",
        MS.MISSION_STATE_ACTIVE,
    )
    # Without the approved Mission's id the Group alone names it.
    body.approved_mission_id = ""
    accepted(F.decide(None, "mission_create_follow_up", body, "alice", ctx(NOW, done)))


@pytest.mark.req("MW-7.1-T02", "MW-7.1-08")
def test_follow_up_refusals() -> None:
    done, live = approved(), active()

    def refused(
        body: mission_pb2.MissionCreateFollowUp, actor: str = "alice", *linked: GroupState
    ) -> tuple[int, dict[str, str], str]:
        r = F.refused(None, "mission_create_follow_up", body, actor, ctx(NOW, *(linked or (done,))))  # type: ignore[arg-type]
        return r.reason, r.metadata, r.message

    not_found = (R.REJECTION_REASON_NOT_FOUND, {"field": "body.approved_group_id"})
    assert refused(follow_up_body(done, approved_group_id="grp_zzz"))[:2] == not_found
    assert refused(follow_up_body(done, approved_group_id=""))[:2] == not_found
    wrong_id = refused(follow_up_body(done, approved_mission_id="mis_other"))
    assert wrong_id == (
        R.REJECTION_REASON_NOT_FOUND,
        {},
        "body.approved_group_id: Group grp_a holds mis_a, not mis_other",
    )
    assert refused(follow_up_body(live), "alice", live) == (
        R.REJECTION_REASON_PRECONDITION_FAILED,
        {},
        "a follow-up links to an approved Mission; mis_a is MISSION_STATE_ACTIVE",
    )
    assert refused(follow_up_body(done, owner="bob"), "bob") == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.definition.owner_id"},
        "body.definition.owner_id: a follow-up keeps the MissionOwner alice (MW-7.1-T02)",
    )
    assert refused(follow_up_body(done), "ops") == (
        R.REJECTION_REASON_PERMISSION_DENIED,
        {},
        "mission.create_follow_up is issued by the same human MissionOwner alice (MW-7.1-T02)",
    )
    bad = follow_up_body(done)
    bad.definition.title = ""
    assert refused(bad)[:2] == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.definition.title"})
    bad = follow_up_body(done)
    bad.coordinator_id = "alice"
    assert refused(bad)[:2] == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.coordinator_id"})


@pytest.mark.req("MW-7.1-T02", "MW-7.1-02")
def test_a_follow_up_needs_a_human_owner_even_of_an_agent_owned_mission() -> None:
    done = approved()
    assert done.mission is not None
    done.mission.definition.owner_id = (
        "worker"  # as an approved child Mission's (its parent Coordinator) would be
    )
    r = F.refused(
        None, "mission_create_follow_up", follow_up_body(done, owner="worker"), "worker", ctx(NOW, done)
    )
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.definition.owner_id"},
    )
    assert "human" in r.message


# ---------------------------------------------------------------- submission (T04, 7.3)


@pytest.mark.req("MW-7.1-T04", "MW-7.3-05")
def test_submission_names_its_revision_and_artifacts_and_awaits_approval() -> None:
    state = active()
    body = submit_body(state, artifacts=[builders.artifact("c")], summary="all done")
    events = accepted(G.decide(state, "mission_submit_for_approval", body, "coord"))
    assert payloads(events) == [
        (
            "mission.submitted",
            mission_pb2.MissionSubmitted(
                mission_revision=1,
                artifacts=[builders.artifact("c")],
                summary="all done",
                coordinator_epoch=1,
            ),
        )
    ]
    state.mission.root_owner_approval_event_id = "evt_stale"  # type: ignore[union-attr]
    m = fold_onto(state, events).mission
    assert m is not None
    assert (m.state, m.revision, m.latest_submission_event_id) == (
        MS.MISSION_STATE_AWAITING_APPROVAL,
        2,
        events[0].event_id,
    )
    assert m.latest_submission_artifacts == (builders.artifact("c"),)
    assert m.root_owner_approval_event_id == ""  # a new submission needs its own root approval (MW-14-10)


@pytest.mark.req("MW-7.1-T04", "MW-7.3-04")
def test_submission_waits_for_required_work_verified_or_cancelled() -> None:
    state = authorized(active(), G, "wi")
    r = G.refused(state, "mission_submit_for_approval", submit_body(state), "coord")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_PRECONDITION_FAILED, {})
    assert r.message == "required WorkItems are not verified: wi (MW-7.3-04)"
    for end in (wp.WORK_ITEM_STATE_VERIFIED, wp.WORK_ITEM_STATE_CANCELLED):
        state.work_items["wi"].state = end
        accepted(G.decide(state, "mission_submit_for_approval", submit_body(state), "coord"))
    state.work_items["wi"].state = wp.WORK_ITEM_STATE_FAILED
    assert (
        G.refused(state, "mission_submit_for_approval", submit_body(state), "coord").reason
        == R.REJECTION_REASON_PRECONDITION_FAILED
    )
    state.work_items["wi"].required = False  # optional work does not hold the submission back
    accepted(G.decide(state, "mission_submit_for_approval", submit_body(state), "coord"))


@pytest.mark.req("MW-7.1-T04", "MW-7.2-03", "MW-7.2-06")
def test_submission_refusals() -> None:
    state = active()
    r = G.refused(state, "mission_submit_for_approval", submit_body(state, mission_revision=7), "coord")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_REVISION_MISMATCH, {"current_revision": "1"})
    r = G.refused(state, "mission_submit_for_approval", submit_body(state, coordinator_epoch=2), "coord")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_COORDINATOR_EPOCH_STALE, {"current_epoch": "1"})
    r = G.refused(state, "mission_submit_for_approval", submit_body(state), "coord", ctx(LATE))
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_LEASE_EXPIRED, {})
    r = G.refused(
        state, "mission_submit_for_approval", submit_body(state), "coord", ctx(NOW + timedelta(minutes=5))
    )
    assert r.reason == R.REJECTION_REASON_LEASE_EXPIRED  # the lease ends at its expiry
    accepted(
        G.decide(
            state,
            "mission_submit_for_approval",
            submit_body(state),
            "coord",
            ctx(NOW + timedelta(seconds=299)),
        )
    )
    command = G.command("mission_submit_for_approval", submit_body(state), "coord", state)
    command.session_epoch = 2
    r = decider.decide(state, command, CTX)
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_LEASE_STALE, {"lease_session_epoch": "1"})  # type: ignore[union-attr]
    waiting = awaiting()
    r = G.refused(waiting, "mission_submit_for_approval", submit_body(waiting), "coord")
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_INVALID_TRANSITION,
        {"state": "MISSION_STATE_AWAITING_APPROVAL"},
    )
    assert (
        r.message
        == "mission.submit_for_approval needs a Mission in MISSION_STATE_ACTIVE, it is MISSION_STATE_AWAITING_APPROVAL"
    )
    bad = submit_body(state)
    bad.artifacts.add()  # an ArtifactRef without a digest
    assert (
        G.refused(state, "mission_submit_for_approval", bad, "coord").reason
        == R.REJECTION_REASON_INVALID_ARGUMENT
    )


# ---------------------------------------------------------------- the owner's answer (T05, T06)


def envelope() -> common_pb2.SignedEnvelope:
    return common_pb2.SignedEnvelope(payload=b"signed command", payload_type="application/x-test")


@pytest.mark.req("MW-7.1-T05", "MW-7.3-06", "MW-7.3-07")
def test_requested_changes_reopen_the_same_mission_with_the_owners_signature() -> None:
    state = awaiting()
    sub = state.mission.latest_submission_event_id  # type: ignore[union-attr]
    body = mission_pb2.MissionRequestChanges(submission_event_id=sub, requested_changes="fix the totals")
    events = accepted(G.decide(state, "mission_request_changes", body, "alice", ctx(envelope=envelope())))
    assert payloads(events) == [
        (
            "mission.changes_requested",
            mission_pb2.MissionChangesRequested(
                submission_event_id=sub,
                requested_changes="fix the totals",
                owner_signed_command=envelope(),
            ),
        )
    ]
    m = fold_onto(state, events).mission
    assert m is not None and (m.state, m.revision, m.latest_submission_event_id) == (
        MS.MISSION_STATE_ACTIVE,
        3,
        sub,
    )
    r = G.refused(
        state,
        "mission_request_changes",
        mission_pb2.MissionRequestChanges(submission_event_id=sub, requested_changes=" "),
        "alice",
    )
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.requested_changes"},
    )


@pytest.mark.req("MW-7.1-T05", "MW-7.1-T06", "MW-7.3-06")
@pytest.mark.parametrize("kind", ["mission_request_changes", "mission_approve"])
def test_the_owner_answers_the_latest_submission_of_a_mission_awaiting_approval(kind: str) -> None:
    def body(sub: str) -> object:
        if kind == "mission_approve":
            return mission_pb2.MissionApprove(submission_event_id=sub)
        return mission_pb2.MissionRequestChanges(submission_event_id=sub, requested_changes="again")

    state = awaiting()
    latest = state.mission.latest_submission_event_id  # type: ignore[union-attr]
    r = G.refused(state, kind, body("evt_old"), "alice")
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_REVISION_MISMATCH,
        {"latest_submission_event_id": latest},
    )
    live = active()
    r = G.refused(live, kind, body(""), "alice")
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_INVALID_TRANSITION,
        {"state": "MISSION_STATE_ACTIVE"},
    )
    done = approved()
    r = G.refused(done, kind, body(latest), "alice")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_TERMINAL_STATE, {"state": "MISSION_STATE_APPROVED"})
    assert r.message.endswith(
        "a terminal state; corrections go through a linked follow-up Mission (MW-7.1-08)"
    )


@pytest.mark.req("MW-7.1-T06", "MW-7.3-06", "MW-7.1-06")
def test_approval_is_the_owners_signed_answer_and_terminal() -> None:
    state = awaiting()
    sub = state.mission.latest_submission_event_id  # type: ignore[union-attr]
    body = mission_pb2.MissionApprove(submission_event_id=sub, comment="good")
    events = accepted(G.decide(state, "mission_approve", body, "alice", ctx(envelope=envelope())))
    assert payloads(events) == [
        (
            "mission.approved",
            mission_pb2.MissionApproved(
                submission_event_id=sub,
                comment="good",
                owner_signed_command=envelope(),
            ),
        )
    ]
    m = fold_onto(state, events).mission
    assert m is not None and (m.state, m.revision, m.approval_event_id) == (
        MS.MISSION_STATE_APPROVED,
        3,
        events[0].event_id,
    )


def needing_root_approval(state: GroupState, *, required: bool = True) -> GroupState:
    """A child Mission whose risk policy asks the root MissionOwner (bob, a reviewer) too (MW-14-10)."""
    assert state.mission is not None
    state = G.run(
        state,
        "membership_grant",
        membership_pb2.MembershipGrant(member_id="bob", role=Role.MEMBER_ROLE_REVIEWER),
        "alice",
    )
    state.mission.kind = mission_pb2.MISSION_KIND_CHILD
    state.mission.root_owner_id = "bob"
    state.mission.definition.risk_policy.require_root_owner_approval = required
    return state


@pytest.mark.req("MW-14-10", "MW-7.1-T06")
def test_the_root_owner_approves_a_child_first_where_its_risk_policy_says_so() -> None:
    state = needing_root_approval(awaiting())
    sub = state.mission.latest_submission_event_id  # type: ignore[union-attr]
    body = mission_pb2.MissionApprove(submission_event_id=sub, comment="root ok")
    r = G.refused(state, "mission_approve", body, "alice")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_PRECONDITION_FAILED, {"root_owner_id": "bob"})
    events = accepted(G.decide(state, "mission_approve", body, "bob", ctx(envelope=envelope())))
    assert payloads(events) == [
        (
            "mission.root_owner_approved",
            mission_pb2.MissionApproved(
                submission_event_id=sub,
                comment="root ok",
                owner_signed_command=envelope(),
            ),
        )
    ]
    after = fold_onto(state, events)
    m = after.mission
    assert m is not None and (m.state, m.revision, m.root_owner_approval_event_id) == (
        MS.MISSION_STATE_AWAITING_APPROVAL,
        2,
        events[0].event_id,
    )
    r = G.refused(after, "mission_approve", body, "bob")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_TRANSITION, {})
    assert r.message == "the root MissionOwner already approved this submission"
    events = accepted(G.decide(after, "mission_approve", body, "alice"))
    assert [e.type for e in events] == ["mission.approved"]


@pytest.mark.req("MW-14-10", "MW-7.1-T06")
def test_a_reviewer_approves_only_as_the_root_owner_of_a_child_that_requires_it() -> None:
    sub_of = lambda s: mission_pb2.MissionApprove(submission_event_id=s.mission.latest_submission_event_id)  # noqa: E731
    no_policy = needing_root_approval(awaiting(), required=False)
    r = G.refused(no_policy, "mission_approve", sub_of(no_policy), "bob")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_PERMISSION_DENIED, {})
    accepted(
        G.decide(no_policy, "mission_approve", sub_of(no_policy), "alice")
    )  # the owner alone suffices then
    root_kind = needing_root_approval(awaiting())
    root_kind.mission.kind = mission_pb2.MISSION_KIND_ROOT  # type: ignore[union-attr]
    r = G.refused(root_kind, "mission_approve", sub_of(root_kind), "bob")
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED
    accepted(G.decide(root_kind, "mission_approve", sub_of(root_kind), "alice"))
    other = needing_root_approval(awaiting())
    other.mission.root_owner_id = "carol"  # type: ignore[union-attr]
    r = G.refused(other, "mission_approve", sub_of(other), "bob")
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED
    assert r.message == (
        "mission.approve is the MissionOwner's; a reviewer approves only as the root MissionOwner of a "
        "child whose risk policy requires it (MW-14-10)"
    )


# ---------------------------------------------------------------- revocation (7.1-08/09)


def with_follow_up(done: GroupState, follows: str = "mis_a") -> GroupState:
    state = F.run(None, "mission_create", builders.mission_create("alice", "coord2", NOW), "alice")
    state.mission.follows_up_mission_id = follows  # type: ignore[union-attr]
    return state


def revoke(done: GroupState, **kw: object) -> mission_pb2.MissionRevokeApproval:
    fields: dict[str, object] = {
        "approval_event_id": done.mission.approval_event_id,  # type: ignore[union-attr]
        "reason": "wrong figures",
        "follow_up_group_id": "grp_follow",
        "follow_up_mission_id": "mis_follow",
    }
    return mission_pb2.MissionRevokeApproval(**{**fields, **kw})  # type: ignore[arg-type]


@pytest.mark.req("MW-7.1-08", "MW-7.1-09", "MW-7.1-07")
def test_revocation_is_a_new_event_beside_the_approval_citing_the_follow_up() -> None:
    done = approved()
    follow = with_follow_up(done)
    events = accepted(G.decide(done, "mission_revoke_approval", revoke(done), "alice", ctx(NOW, follow)))
    assert payloads(events) == [
        (
            "mission.approval_revoked",
            mission_pb2.MissionApprovalRevoked(
                approval_event_id=done.mission.approval_event_id,
                reason="wrong figures",  # type: ignore[union-attr]
                follow_up_mission_id="mis_follow",
                follow_up_group_id="grp_follow",
            ),
        )
    ]
    after = fold_onto(done, events)
    m = after.mission
    assert m is not None
    # The approval stands: state, revision and approval unchanged; the revocation sits beside it.
    assert (m.state, m.revision, m.approval_event_id) == (
        MS.MISSION_STATE_APPROVED,
        3,
        done.mission.approval_event_id,
    )  # type: ignore[union-attr]
    assert (m.approval_revoked_event_id, m.follow_up_mission_ids) == (events[0].event_id, ["mis_follow"])
    r = G.refused(after, "mission_revoke_approval", revoke(done), "alice", ctx(NOW, follow))
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_TRANSITION, {})
    assert r.message == f"the approval was already revoked by {events[0].event_id}"
    # The follow-up's Mission id may be left out: its Group names it.
    accepted(
        G.decide(
            done, "mission_revoke_approval", revoke(done, follow_up_mission_id=""), "alice", ctx(NOW, follow)
        )
    )


@pytest.mark.req("MW-7.1-08", "MW-7.1-09")
def test_revocation_refusals() -> None:
    done = approved()
    follow = with_follow_up(done)
    linked = ctx(NOW, follow)

    def refused(
        state: GroupState, body: mission_pb2.MissionRevokeApproval, c=linked
    ) -> tuple[int, dict[str, str]]:
        r = G.refused(state, "mission_revoke_approval", body, "alice", c)
        return r.reason, r.metadata

    waiting = awaiting()
    assert refused(waiting, revoke(waiting, approval_event_id="")) == (
        R.REJECTION_REASON_INVALID_TRANSITION,
        {},
    )
    assert refused(done, revoke(done, approval_event_id="evt_x")) == (R.REJECTION_REASON_NOT_FOUND, {})
    assert refused(done, revoke(done, reason="")) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.reason"},
    )
    assert refused(done, revoke(done, follow_up_group_id="grp_none")) == (
        R.REJECTION_REASON_NOT_FOUND,
        {"field": "body.follow_up_group_id"},
    )
    assert refused(done, revoke(done), ctx()) == (
        R.REJECTION_REASON_NOT_FOUND,
        {"field": "body.follow_up_group_id"},
    )
    assert refused(done, revoke(done, follow_up_mission_id="mis_z")) == (R.REJECTION_REASON_NOT_FOUND, {})
    r = G.refused(
        done, "mission_revoke_approval", revoke(done), "alice", ctx(NOW, with_follow_up(done, "mis_other"))
    )
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_PRECONDITION_FAILED, {})
    assert (
        r.message
        == "mis_follow is not a follow-up of mis_a; create it with mission.create_follow_up first (MW-7.1-08)"
    )


# ---------------------------------------------------------------- ending (T07, T08)


@pytest.mark.req("MW-7.1-T07", "MW-8-04")
@pytest.mark.parametrize("actor", ["alice", "ops"])
def test_cancel_by_the_owner_or_organization_policy_ends_the_mission(actor: str) -> None:
    state = active()
    reason = "x" * 4096  # the longest reason
    events = accepted(G.decide(state, "mission_cancel", mission_pb2.MissionCancel(reason=reason), actor))
    assert payloads(events) == [("mission.cancelled", mission_pb2.MissionCancelled(reason=reason))]
    m = fold_onto(state, events).mission
    assert m is not None and (m.state, m.revision) == (MS.MISSION_STATE_CANCELLED, 2)
    r = G.refused(state, "mission_cancel", mission_pb2.MissionCancel(reason=reason + "x"), actor)
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.reason"})
    r = G.refused(
        fold_onto(state, events), "mission_cancel", mission_pb2.MissionCancel(reason="again"), actor
    )
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_TERMINAL_STATE, {"state": "MISSION_STATE_CANCELLED"})
    assert r.message.startswith("mission.cancel: the Mission is MISSION_STATE_CANCELLED, a terminal state")


@pytest.mark.req("MW-7.1-T08")
def test_the_coordinator_terminates_the_mission_as_failed() -> None:
    state = active()
    body = mission_pb2.MissionTerminate(coordinator_epoch=1, reason="the ledger is gone")
    events = accepted(G.decide(state, "mission_terminate", body, "coord"))
    assert payloads(events) == [("mission.failed", mission_pb2.MissionFailed(reason="the ledger is gone"))]
    m = fold_onto(state, events).mission
    assert m is not None and (m.state, m.revision) == (MS.MISSION_STATE_FAILED, 2)
    r = G.refused(fold_onto(state, events), "mission_terminate", body, "coord")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_TERMINAL_STATE, {"state": "MISSION_STATE_FAILED"})
    assert r.message.startswith("mission.terminate: ")
    r = G.refused(
        state, "mission_terminate", mission_pb2.MissionTerminate(coordinator_epoch=1, reason=""), "coord"
    )
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.reason"})
    r = G.refused(
        state, "mission_terminate", mission_pb2.MissionTerminate(coordinator_epoch=2, reason="r"), "coord"
    )
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_COORDINATOR_EPOCH_STALE, {"current_epoch": "1"})
    r = G.refused(state, "mission_terminate", body, "coord", ctx(LATE))
    assert r.reason == R.REJECTION_REASON_LEASE_EXPIRED


@pytest.mark.req("MW-7.1-T08", "MW-8-04")
def test_organization_policy_terminates_without_a_coordinator_epoch() -> None:
    state = active()
    body = mission_pb2.MissionTerminate(reason="policy")
    events = accepted(G.decide(state, "mission_terminate", body, "ops", ctx(LATE)))
    assert payloads(events) == [("mission.failed", mission_pb2.MissionFailed(reason="policy"))]
    r = G.refused(state, "mission_terminate", mission_pb2.MissionTerminate(), "ops")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.reason"})


@pytest.mark.req("MW-7.1-T08", "MW-7.2-08")
def test_an_unreconciled_replacement_coordinator_may_still_terminate() -> None:
    state = replaced()
    events = accepted(
        G.decide(
            state,
            "mission_terminate",
            mission_pb2.MissionTerminate(coordinator_epoch=2, reason="r"),
            "coord2",
            ctx(LATE),
        )
    )
    assert [e.type for e in events] == ["mission.failed"]


# ---------------------------------------------------------------- the Coordinator lease (7.2)


def replace_body(**kw: object) -> mission_pb2.MissionReplaceCoordinator:
    return mission_pb2.MissionReplaceCoordinator(
        **{"coordinator_id": "coord2", "replaced_coordinator_epoch": 1, **kw}
    )  # type: ignore[arg-type]


def replaced(state: GroupState | None = None) -> GroupState:
    return G.run(state or active(), "mission_replace_coordinator", replace_body(), "alice", ctx(LATE))


@pytest.mark.req("MW-7.2-02", "MW-7.2-06")
def test_the_current_coordinator_renews_its_live_lease_bound_to_its_session() -> None:
    state = active()
    soon = NOW + timedelta(minutes=4)
    command = G.command(
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        "coord",
        state,
    )
    command.session_epoch = 2
    events = accepted(decider.decide(state, command, ctx(soon)))
    assert payloads(events) == [
        (
            "mission.coordinator_lease.renewed",
            mission_pb2.CoordinatorLeaseRenewed(
                coordinator_epoch=1,
                expires_at=to_timestamp(soon + timedelta(minutes=5)),
                session_epoch=2,
            ),
        )
    ]
    lease = fold_onto(state, events).mission.coordinator  # type: ignore[union-attr]
    assert lease is not None and (lease.expires_at, lease.session_epoch) == (soon + timedelta(minutes=5), 2)
    renew = mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1)
    for at in (NOW + timedelta(minutes=5), LATE):
        r = G.refused(state, "mission_renew_coordinator_lease", renew, "coord", ctx(at))
        assert (r.reason, r.metadata) == (R.REJECTION_REASON_LEASE_EXPIRED, {})
    r = G.refused(
        state,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=2),
        "coord",
    )
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_COORDINATOR_EPOCH_STALE, {"current_epoch": "1"})
    after = replaced()
    r = G.refused(
        after,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=2),
        "coord",
        ctx(LATE),
    )
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_COORDINATOR_EPOCH_STALE, {"current_epoch": "2"})
    ended = G.run(state, "mission_cancel", mission_pb2.MissionCancel(reason="stop"), "alice")
    r = G.refused(ended, "mission_renew_coordinator_lease", renew, "coord")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_TERMINAL_STATE, {"state": "MISSION_STATE_CANCELLED"})


@pytest.mark.req("MW-7.2-04", "MW-7.2-05", "MW-7.2-08")
@pytest.mark.parametrize("actor", ["alice", "ops"])
def test_a_lapsed_coordinator_is_replaced_with_a_higher_unreconciled_epoch(actor: str) -> None:
    state = active()
    body = replace_body()
    body.coordinator_renewal.lease_duration.FromSeconds(120)
    events = accepted(G.decide(state, "mission_replace_coordinator", body, actor, ctx(LATE)))
    assert payloads(events) == [
        ("membership.granted", grant("coord2", Role.MEMBER_ROLE_COORDINATOR, 3)),
        (
            "mission.coordinator_lease.granted",
            lease_granted(
                "coord2",
                2,
                1,
                timedelta(seconds=120),
                reconciled=False,
                by=actor,
                replaced=1,
                duration=timedelta(seconds=120),
                renew_before=timedelta(seconds=24),
                now=LATE,
            ),
        ),
    ]
    m = fold_onto(state, events).mission
    assert m is not None and m.coordinator is not None
    assert (m.coordinator.agent_id, m.coordinator.coordinator_epoch, m.coordinator.reconciled) == (
        "coord2",
        2,
        False,
    )
    assert m.coordinator.granted_at_sequence == 7
    assert m.coordinator_agents == {1: "coord", 2: "coord2"}


@pytest.mark.req("MW-7.2-04", "MW-8-05")
def test_a_replacement_gets_a_coordinator_membership_unless_it_holds_one() -> None:
    state = active()
    again = accepted(
        G.decide(
            state, "mission_replace_coordinator", replace_body(coordinator_id="coord"), "alice", ctx(LATE)
        )
    )
    assert [e.type for e in again] == [
        "mission.coordinator_lease.granted"
    ]  # coord is the Coordinator already
    state = G.run(
        state,
        "membership_grant",
        membership_pb2.MembershipGrant(member_id="coord2", role=Role.MEMBER_ROLE_WORKER),
        "alice",
    )
    events = accepted(G.decide(state, "mission_replace_coordinator", replace_body(), "alice", ctx(LATE)))
    assert payloads(events)[0] == ("membership.granted", grant("coord2", Role.MEMBER_ROLE_COORDINATOR, 4))
    state.members["coord2"].role = Role.MEMBER_ROLE_COORDINATOR
    state.members["coord2"].active = False
    events = accepted(G.decide(state, "mission_replace_coordinator", replace_body(), "alice", ctx(LATE)))
    assert [e.type for e in events] == ["membership.granted", "mission.coordinator_lease.granted"]


@pytest.mark.req("MW-7.2-04", "MW-7.2-11")
def test_replacement_refusals() -> None:
    state = active()

    def refused(
        body: mission_pb2.MissionReplaceCoordinator, at=LATE, s: GroupState = state
    ) -> tuple[int, dict[str, str]]:
        r = G.refused(s, "mission_replace_coordinator", body, "alice", ctx(at))
        return r.reason, r.metadata

    assert refused(replace_body(), NOW + timedelta(minutes=5) - timedelta(microseconds=1)) == (
        R.REJECTION_REASON_PRECONDITION_FAILED,
        {"expires_at": (NOW + timedelta(minutes=5)).isoformat()},
    )
    accepted(
        G.decide(
            state, "mission_replace_coordinator", replace_body(), "alice", ctx(NOW + timedelta(minutes=5))
        )
    )
    assert refused(replace_body(replaced_coordinator_epoch=2)) == (
        R.REJECTION_REASON_COORDINATOR_EPOCH_STALE,
        {"current_epoch": "1"},
    )
    assert refused(replace_body(coordinator_id="ghost")) == (
        R.REJECTION_REASON_UNKNOWN_IDENTITY,
        {"field": "body.coordinator_id"},
    )
    assert refused(replace_body(coordinator_id="ops")) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.coordinator_id"},
    )
    assert refused(replace_body(coordinator_id="alice")) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.coordinator_id"},
    )
    accepted(
        G.decide(state, "mission_replace_coordinator", replace_body(coordinator_id="bob"), "alice", ctx(LATE))
    )  # a human
    short = replace_body()
    short.coordinator_renewal.lease_duration.FromSeconds(1)
    assert refused(short) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.coordinator_renewal.lease_duration"},
    )
    ended = G.run(state, "mission_cancel", mission_pb2.MissionCancel(reason="stop"), "alice")
    assert refused(replace_body(), s=ended) == (
        R.REJECTION_REASON_TERMINAL_STATE,
        {"state": "MISSION_STATE_CANCELLED"},
    )


@pytest.mark.req("MW-7.2-08")
def test_the_replacement_acknowledges_reconciliation_of_a_revision_it_has_read() -> None:
    state = replaced()
    head = state.head_sequence
    body = mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=2, group_revision=head)
    r = G.refused(
        state, "mission_submit_for_approval", submit_body(state, coordinator_epoch=2), "coord2", ctx(LATE)
    )
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_RECONCILIATION_REQUIRED, {})
    events = accepted(G.decide(state, "mission_acknowledge_reconciliation", body, "coord2", ctx(LATE)))
    assert payloads(events) == [
        (
            "mission.reconciliation.acknowledged",
            mission_pb2.ReconciliationAcknowledged(coordinator_epoch=2, group_revision=head),
        )
    ]
    after = fold_onto(state, events)
    assert after.mission.coordinator.reconciled is True  # type: ignore[union-attr]
    accepted(
        G.decide(
            after, "mission_submit_for_approval", submit_body(after, coordinator_epoch=2), "coord2", ctx(LATE)
        )
    )
    r = G.refused(after, "mission_acknowledge_reconciliation", body, "coord2", ctx(LATE))
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_TRANSITION, {})
    # The old Coordinator is stale (MW-7.2-06).
    stale = mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=1, group_revision=head)
    r = G.refused(state, "mission_acknowledge_reconciliation", stale, "coord", ctx(LATE))
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_COORDINATOR_EPOCH_STALE, {"current_epoch": "2"})


@pytest.mark.req("MW-7.2-08")
def test_reconciliation_covers_the_appointment_and_every_work_item_change() -> None:
    state = replaced()
    granted = state.mission.coordinator.granted_at_sequence  # type: ignore[union-attr]
    head = state.head_sequence

    def ack(revision: int, s: GroupState = state) -> object:
        body = mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=2, group_revision=revision)
        return G.decide(s, "mission_acknowledge_reconciliation", body, "coord2", ctx(LATE))

    for revision in (granted, head):
        accepted(ack(revision))  # type: ignore[arg-type]
    for revision in (granted - 1, head + 1):
        r = ack(revision)
        assert (r.reason, r.metadata) == (
            R.REJECTION_REASON_REVISION_MISMATCH,
            {"current_revision": str(head)},
        )  # type: ignore[union-attr]
    # A WorkItem changed after the appointment raises the floor.
    state.last_work_change_sequence = head
    state.head_sequence = head + 1
    assert ack(head - 1).reason == R.REJECTION_REASON_REVISION_MISMATCH  # type: ignore[union-attr]
    accepted(ack(head))  # type: ignore[arg-type]
    ended = G.run(state, "mission_terminate", mission_pb2.MissionTerminate(reason="r"), "ops", ctx(LATE))
    r = ack(head, ended)
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_TERMINAL_STATE, {"state": "MISSION_STATE_FAILED"})  # type: ignore[union-attr]


# ---------------------------------------------------------------- directives (7.1-12)


@pytest.mark.req("MW-7.1-12")
def test_the_owner_issues_a_recorded_directive() -> None:
    state = active()
    body = mission_pb2.MissionIssueDirective(
        directive="prioritize the ledger", parameters_json='{"focus": "ledger"}'
    )
    events = accepted(G.decide(state, "mission_issue_directive", body, "alice"))
    assert payloads(events) == [
        (
            "mission.directive.issued",
            mission_pb2.MissionDirectiveIssued(
                directive="prioritize the ledger",
                parameters_json='{"focus": "ledger"}',
            ),
        )
    ]
    after = fold_onto(state, events)
    assert after.mission.revision == 1 and after.mission.state == MS.MISSION_STATE_ACTIVE  # type: ignore[union-attr]
    accepted(
        G.decide(state, "mission_issue_directive", mission_pb2.MissionIssueDirective(directive="go"), "alice")
    )


@pytest.mark.req("MW-7.1-12")
def test_directive_refusals() -> None:
    state = active()

    def refused(body: mission_pb2.MissionIssueDirective, s: GroupState = state) -> tuple[int, dict[str, str]]:
        r = G.refused(s, "mission_issue_directive", body, "alice")
        return r.reason, r.metadata

    assert refused(mission_pb2.MissionIssueDirective()) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.directive"},
    )
    assert refused(mission_pb2.MissionIssueDirective(directive="d", parameters_json="[1]")) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.parameters_json"},
    )
    limit = 16 * 1024
    fits = '{"k": "' + "x" * (limit - 9) + '"}'
    assert len(fits) == limit
    accepted(
        G.decide(
            state,
            "mission_issue_directive",
            mission_pb2.MissionIssueDirective(directive="d", parameters_json=fits),
            "alice",
        )
    )
    too_big = fits[:-2] + 'x"}'
    assert refused(mission_pb2.MissionIssueDirective(directive="d", parameters_json=too_big)) == (
        R.REJECTION_REASON_TOO_LARGE,
        {"field": "body.parameters_json", "limit": str(limit)},
    )
    ended = G.run(state, "mission_cancel", mission_pb2.MissionCancel(reason="stop"), "alice")
    assert refused(mission_pb2.MissionIssueDirective(directive="d"), ended) == (
        R.REJECTION_REASON_TERMINAL_STATE,
        {"state": "MISSION_STATE_CANCELLED"},
    )


# ---------------------------------------------------------------- context transfer (13.3-05/07)


T = CoreGroup("grp_target", CTX, NOW)


def target(owner: str = "alice") -> GroupState:
    return T.run(None, "mission_create", builders.mission_create(owner, "coord", NOW), owner)


def transfer(**kw: object) -> mission_pb2.MissionAuthorizeContextTransfer:
    return mission_pb2.MissionAuthorizeContextTransfer(
        **{"target_group_id": "grp_target", "reason": "reuse the ledger", **kw}
    )  # type: ignore[arg-type]


@pytest.mark.req("MW-13.3-05", "MW-13.3-07")
def test_the_owner_of_both_missions_authorizes_a_transfer_recorded_as_an_event() -> None:
    state = authorized(active(), G, "wi_b", "wi_a")
    body = transfer(work_item_ids=["wi_b", "wi_a", "wi_b"])
    events = accepted(
        G.decide(state, "mission_authorize_context_transfer", body, "alice", ctx(NOW, target()))
    )
    assert payloads(events) == [
        (
            "mission.context_transfer.authorized",
            mission_pb2.MissionContextTransferAuthorized(
                target_group_id="grp_target",
                work_item_ids=["wi_a", "wi_b"],
                reason="reuse the ledger",
            ),
        )
    ]
    after = fold_onto(state, events)
    assert after.transfers == {events[0].event_id: TransferGrant("grp_target", ("wi_a", "wi_b"))}
    whole = accepted(
        G.decide(state, "mission_authorize_context_transfer", transfer(), "alice", ctx(NOW, target()))
    )
    assert fold_onto(state, whole).transfers == {whole[0].event_id: TransferGrant("grp_target", ())}


@pytest.mark.req("MW-13.3-05", "MW-13.3-07")
def test_transfer_refusals() -> None:
    names = [f"wi_{i:02}" for i in range(32)]
    state = authorized(active(), G, *names)
    linked = ctx(NOW, target())

    def refused(body: mission_pb2.MissionAuthorizeContextTransfer, c=linked) -> tuple[int, dict[str, str]]:
        r = G.refused(state, "mission_authorize_context_transfer", body, "alice", c)
        return r.reason, r.metadata

    assert refused(transfer(reason="")) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.reason"})
    assert refused(transfer(target_group_id="grp_a")) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.target_group_id"},
    )
    assert refused(transfer(), ctx()) == (R.REJECTION_REASON_NOT_FOUND, {"field": "body.target_group_id"})
    assert refused(transfer(), ctx(NOW, target("bob"))) == (R.REJECTION_REASON_PERMISSION_DENIED, {})
    no_mission = GroupState(group_id="grp_target")
    assert refused(transfer(), ctx(NOW, no_mission)) == (
        R.REJECTION_REASON_NOT_FOUND,
        {"field": "body.target_group_id"},
    )
    accepted(
        G.decide(state, "mission_authorize_context_transfer", transfer(work_item_ids=names), "alice", linked)
    )
    assert refused(transfer(work_item_ids=[*names, "wi_00"])) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.work_item_ids"},
    )
    assert refused(transfer(work_item_ids=["wi_00", "wi_zz"])) == (
        R.REJECTION_REASON_NOT_FOUND,
        {"field": "body.work_item_ids[1]"},
    )


def test_identities_used_here_are_registered() -> None:
    assert {"alice", "bob", "coord", "coord2", "ops", "admin"} <= set(IDS)


@pytest.mark.req("MW-7.3-04")
def test_the_refusal_lists_at_most_ten_unverified_required_work_items_sorted() -> None:
    state = authorized(active(), G, *(f"wi_{i:02}" for i in range(11, -1, -1)))
    r = G.refused(state, "mission_submit_for_approval", submit_body(state), "coord")
    listed = ", ".join(f"wi_{i:02}" for i in range(10))
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_PRECONDITION_FAILED,
        f"required WorkItems are not verified: {listed} (MW-7.3-04)",
    )
