"""Pure core: decide/evolve with an injected clock and no I/O."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, membership_pb2, mission_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState, IdentityInfo
from tests import builders

R = common_pb2.RejectionReason
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
IDS = {
    "alice": IdentityInfo("alice", common_pb2.IDENTITY_KIND_HUMAN, session_epoch=1),
    "coord": IdentityInfo("coord", common_pb2.IDENTITY_KIND_AGENT, session_epoch=4),
    "worker": IdentityInfo("worker", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
    "bot": IdentityInfo("bot", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
    "ops": IdentityInfo("ops", common_pb2.IDENTITY_KIND_CONTROL_PLANE, session_epoch=1),
}
CTX = decider.DecisionContext(NOW, IDS)
_counter = iter(range(1, 1_000_000))


def cmd(
    kind: str, body: object, actor: str = "alice", group: str = "grp_test", epoch: int = 0, **kw: object
) -> command_pb2.Command:
    c = command_pb2.Command(
        command_id=f"cmd_{next(_counter)}",
        group_id=group,
        actor_id=actor,
        session_epoch=1,
        membership_epoch=epoch,
        issued_at=to_timestamp(NOW),
        **kw,  # type: ignore[arg-type]
    )
    getattr(c, kind).CopyFrom(body)
    return c


def run(
    state: GroupState | None, command: command_pb2.Command, ctx: decider.DecisionContext = CTX
) -> GroupState:
    decision = decider.decide(state, command, ctx)
    assert not isinstance(decision, Rejected), decision
    for event in decision:
        state = decider.evolve(state, event)
    assert state is not None
    return state


def rejected(
    state: GroupState | None, command: command_pb2.Command, ctx: decider.DecisionContext = CTX
) -> Rejected:
    decision = decider.decide(state, command, ctx)
    assert isinstance(decision, Rejected), f"expected a rejection, got {[e.type for e in decision]}"
    return decision


def created(**overrides: object) -> GroupState:
    return run(None, cmd("mission_create", builders.mission_create("alice", "coord", NOW, **overrides)))


@pytest.mark.req("MW-7.1-T01", "MW-7.1-03", "MW-9-01", "MW-8-05", "MW-7.2-02")
def test_mission_create_allocates_one_group_one_planning_conversation_and_coordinator_lease() -> None:
    """MW-7.1-T01 / MW-7.1-03 / MW-9-01 / MW-8-05 / MW-7.2-02."""
    decision = decider.decide(
        None, cmd("mission_create", builders.mission_create("alice", "coord", NOW)), CTX
    )
    assert not isinstance(decision, Rejected)
    assert [e.type for e in decision] == [
        "mission.created",
        "conversation.opened",
        "membership.granted",
        "membership.granted",
        "mission.coordinator_lease.granted",
    ]
    assert [e.sequence for e in decision] == [1, 2, 3, 4, 5]
    state = decider.fold(decision)
    assert state is not None and state.mission is not None
    assert state.mission.state == mission_pb2.MISSION_STATE_ACTIVE
    assert len(state.conversations) == 1
    (conv,) = state.conversations.values()
    assert conv.conversation_id == state.mission.planning_conversation_id
    # MW-8-05: owner and Coordinator have full visibility.
    assert {m.member_id: m.visibility_start_sequence for m in state.members.values()} == {
        "alice": 1,
        "coord": 1,
    }
    lease = state.mission.coordinator
    assert lease is not None
    assert (lease.agent_id, lease.coordinator_epoch, lease.session_epoch) == ("coord", 1, 4)
    assert lease.expires_at == NOW + timedelta(minutes=5)


@pytest.mark.req("MW-7.1-04")
def test_mission_and_group_ids_are_stable_and_derived_deterministically() -> None:
    """MW-7.1-04: ids never change; the same command always names the same events."""
    c = cmd("mission_create", builders.mission_create("alice", "coord", NOW), group="grp_abc")
    first, second = decider.decide(None, c, CTX), decider.decide(None, c, CTX)
    assert first == second
    state = decider.fold(first)  # type: ignore[arg-type]
    assert state and state.mission and state.mission.mission_id == "mis_abc" and state.group_id == "grp_abc"
    state = run(
        state,
        cmd(
            "message_post", builders.message(state.mission.planning_conversation_id), epoch=1, group="grp_abc"
        ),
    )
    assert state.mission and state.mission.mission_id == "mis_abc"


@pytest.mark.req("MW-7.1-02")
def test_root_mission_owner_must_be_human() -> None:
    """MW-7.1-02: an agent cannot own a root Mission, even when it issues the command itself."""
    r = rejected(None, cmd("mission_create", builders.mission_create("bot", "coord", NOW), actor="bot"))
    assert r.reason == R.REJECTION_REASON_INVALID_ARGUMENT
    assert "human" in r.message


@pytest.mark.req("MW-7.1-01")
@pytest.mark.parametrize(
    "field, value",
    [
        ("title", ""),
        ("objective", ""),
        ("deadline", None),
        ("budget", None),
        ("risk_policy", None),
        ("owner_id", ""),
    ],
)
def test_mission_definition_requires_every_machine_readable_item(field: str, value: object) -> None:
    """MW-7.1-01: objective, definition of done, deadline, budget, risk policy and owner are required."""
    r = rejected(
        None, cmd("mission_create", builders.mission_create("alice", "coord", NOW, **{field: value}))
    )
    assert r.reason == R.REJECTION_REASON_INVALID_ARGUMENT
    assert field in r.metadata["field"]


@pytest.mark.req("MW-7.1-01")
def test_definition_of_done_deadline_and_currency_are_checked() -> None:
    """MW-7.1-01: at least one criterion, a future deadline, an ISO currency for money."""
    body = builders.mission_create("alice", "coord", NOW)
    del body.definition.definition_of_done[:]
    assert rejected(None, cmd("mission_create", body)).metadata["field"].endswith("definition_of_done")
    past = builders.mission_create("alice", "coord", NOW, deadline=to_timestamp(NOW - timedelta(seconds=1)))
    assert rejected(None, cmd("mission_create", past)).metadata["field"].endswith("deadline")
    money = builders.mission_create("alice", "coord", NOW)
    money.definition.budget.currency = "euro"
    assert rejected(None, cmd("mission_create", money)).metadata["field"].endswith("currency")


@pytest.mark.req("MW-7.1-T01", "MW-8-04")
def test_mission_create_is_issued_by_the_owner_or_the_control_plane() -> None:
    """MW-7.1-T01: the human owner, possibly via the control plane; nobody else."""
    r = rejected(None, cmd("mission_create", builders.mission_create("alice", "coord", NOW), actor="worker"))
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED
    state = run(None, cmd("mission_create", builders.mission_create("alice", "coord", NOW), actor="ops"))
    assert state.mission and state.mission.definition.owner_id == "alice"


def test_unknown_identities_and_existing_groups_are_rejected() -> None:
    r = rejected(None, cmd("mission_create", builders.mission_create("alice", "nobody", NOW)))
    assert r.reason == R.REJECTION_REASON_UNKNOWN_IDENTITY
    state = created()
    r = rejected(state, cmd("mission_create", builders.mission_create("alice", "coord", NOW)))
    assert r.reason == R.REJECTION_REASON_GROUP_EXISTS
    r = rejected(None, cmd("message_post", builders.message("conv_x"), epoch=1))
    assert r.reason == R.REJECTION_REASON_GROUP_NOT_FOUND


@pytest.mark.req("MW-9-10", "MW-9-13", "MW-8-10")
def test_message_post_commits_a_message_without_authority() -> None:
    """MW-9-10: every Message has authority false; MW-9-13: any member may post."""
    state = created()
    grant = membership_pb2.MembershipGrant(member_id="worker", role=membership_pb2.MEMBER_ROLE_WORKER)
    state = run(state, cmd("membership_grant", grant, actor="coord", epoch=2))
    conv = state.mission.planning_conversation_id  # type: ignore[union-attr]
    post = cmd("message_post", builders.message(conv, "deploy now"), actor="worker", epoch=3)
    decision = decider.decide(state, post, CTX)
    assert not isinstance(decision, Rejected)
    (event,) = decision
    assert event.type == "message.posted" and event.message_posted.authority is False
    state = decider.evolve(state, event)
    assert state.conversations[conv].message_count == 1
    # MW-9-11: a Message is only conversation: nothing but the Message changed.
    assert state.mission and state.mission.state == mission_pb2.MISSION_STATE_ACTIVE


@pytest.mark.req("MW-9-09", "MW-9-08")
def test_large_content_must_travel_as_an_artifact_reference() -> None:
    """MW-9-09: large data is not embedded in a Message."""
    state = created()
    conv = state.mission.planning_conversation_id  # type: ignore[union-attr]
    r = rejected(
        state, cmd("message_post", builders.message(conv, "x" * (decider.MAX_TEXT_BYTES + 1)), epoch=1)
    )
    assert r.reason == R.REJECTION_REASON_TOO_LARGE
    ref = common_pb2.ArtifactRef(
        digest=common_pb2.Digest(algorithm="blake3", hex="ab" * 32, size_bytes=10_000_000)
    )
    run(state, cmd("message_post", builders.message(conv, "see artifact", artifacts=[ref]), epoch=1))
    bad = common_pb2.ArtifactRef(digest=common_pb2.Digest(algorithm="md5", hex="ab" * 16))
    assert (
        rejected(state, cmd("message_post", builders.message(conv, "x", artifacts=[bad]), epoch=1)).reason
        == R.REJECTION_REASON_INVALID_ARGUMENT
    )
    assert (
        rejected(state, cmd("message_post", builders.message(conv, "x", data_json="[1]"), epoch=1)).reason
        == R.REJECTION_REASON_INVALID_ARGUMENT
    )


@pytest.mark.req("MW-8-02", "MW-8-03")
def test_group_commands_must_carry_the_current_membership_epoch() -> None:
    """MW-8-02: the current epoch is required; MW-8-03: stale or revoked epochs are rejected."""
    state = created()
    conv = state.mission.planning_conversation_id  # type: ignore[union-attr]
    assert (
        rejected(state, cmd("message_post", builders.message(conv), epoch=0)).reason
        == R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE
    )
    assert (
        rejected(state, cmd("message_post", builders.message(conv), epoch=2)).reason
        == R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE
    )
    assert (
        rejected(state, cmd("message_post", builders.message(conv), actor="worker", epoch=1)).reason
        == R.REJECTION_REASON_NOT_A_MEMBER
    )
    grant = membership_pb2.MembershipGrant(member_id="worker", role=membership_pb2.MEMBER_ROLE_WORKER)
    state = run(state, cmd("membership_grant", grant, actor="coord", epoch=2))
    run(state, cmd("message_post", builders.message(conv), actor="worker", epoch=3))
    state = run(
        state,
        cmd("membership_revoke", membership_pb2.MembershipRevoke(member_id="worker"), actor="coord", epoch=2),
    )
    r = rejected(state, cmd("message_post", builders.message(conv), actor="worker", epoch=3))
    assert r.reason == R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE
    # A new grant gets a new, never reused epoch; the old one stays stale.
    state = run(state, cmd("membership_grant", grant, actor="coord", epoch=2))
    assert state.members["worker"].membership_epoch == 4
    assert (
        rejected(state, cmd("message_post", builders.message(conv), actor="worker", epoch=3)).reason
        == R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE
    )


@pytest.mark.req("MW-8-01", "MW-8-07", "MW-8-05")
def test_coordinator_grants_worker_membership_with_role_epoch_and_capabilities() -> None:
    """MW-8-01: member, Group, epoch, role, visibility start, capabilities; MW-8-07: no unbounded history."""
    state = created()
    conv = state.mission.planning_conversation_id  # type: ignore[union-attr]
    state = run(state, cmd("message_post", builders.message(conv), epoch=1))
    grant = membership_pb2.MembershipGrant(
        member_id="worker",
        role=membership_pb2.MEMBER_ROLE_WORKER,
        capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.11.0")],
    )
    state = run(state, cmd("membership_grant", grant, actor="coord", epoch=2))
    member = state.members["worker"]
    assert member.role == membership_pb2.MEMBER_ROLE_WORKER
    assert member.membership_epoch == 3
    assert member.capabilities == (("code.python", "3.11.0"),)
    assert member.visibility_start_sequence == state.head_sequence == 7


def test_only_owner_or_live_coordinator_manage_memberships() -> None:
    state = created()
    grant = membership_pb2.MembershipGrant(member_id="worker", role=membership_pb2.MEMBER_ROLE_WORKER)
    state = run(state, cmd("membership_grant", grant, actor="coord", epoch=2))
    other = membership_pb2.MembershipGrant(member_id="bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    assert (
        rejected(state, cmd("membership_grant", other, actor="worker", epoch=3)).reason
        == R.REJECTION_REASON_PERMISSION_DENIED
    )
    later = decider.DecisionContext(NOW + timedelta(minutes=6), IDS)
    assert (
        rejected(state, cmd("membership_grant", other, actor="coord", epoch=2), later).reason
        == R.REJECTION_REASON_LEASE_EXPIRED
    )
    run(state, cmd("membership_grant", other, actor="alice", epoch=1), later)
    owner_role = membership_pb2.MembershipGrant(
        member_id="bot", role=membership_pb2.MEMBER_ROLE_MISSION_OWNER
    )
    assert (
        rejected(state, cmd("membership_grant", owner_role, actor="alice", epoch=1)).reason
        == R.REJECTION_REASON_INVALID_ARGUMENT
    )


def test_expected_revision_is_optimistic_concurrency() -> None:
    """OP-10: a command naming a revision applies only at that revision."""
    state = created()
    conv = state.mission.planning_conversation_id  # type: ignore[union-attr]
    good = common_pb2.ExpectedRevision(kind=common_pb2.REVISION_KIND_GROUP, revision=5)
    assert not isinstance(
        decider.decide(
            state, cmd("message_post", builders.message(conv), epoch=1, expected_revision=good), CTX
        ),
        Rejected,
    )
    stale = common_pb2.ExpectedRevision(kind=common_pb2.REVISION_KIND_GROUP, revision=4)
    r = rejected(state, cmd("message_post", builders.message(conv), epoch=1, expected_revision=stale))
    assert r.reason == R.REJECTION_REASON_REVISION_MISMATCH and r.metadata["current_revision"] == "5"
    mission_rev = common_pb2.ExpectedRevision(kind=common_pb2.REVISION_KIND_MISSION, revision=2)
    assert (
        rejected(
            state, cmd("message_post", builders.message(conv), epoch=1, expected_revision=mission_rev)
        ).reason
        == R.REJECTION_REASON_REVISION_MISMATCH
    )


def test_unknown_command_kinds_are_rejected() -> None:
    empty = command_pb2.Command(command_id="c1", group_id="grp_test", actor_id="alice")
    assert rejected(None, empty).reason == R.REJECTION_REASON_UNKNOWN_COMMAND_KIND


def test_decide_does_not_mutate_state() -> None:
    state = created()
    before = copy.deepcopy(state)
    conv = state.mission.planning_conversation_id  # type: ignore[union-attr]
    decider.decide(state, cmd("message_post", builders.message(conv), epoch=1), CTX)
    decider.decide(state, cmd("message_post", builders.message(conv, "x" * 20_000), epoch=1), CTX)
    assert state == before


def test_evolve_refuses_gaps() -> None:
    decision = decider.decide(
        None, cmd("mission_create", builders.mission_create("alice", "coord", NOW)), CTX
    )
    assert not isinstance(decision, Rejected)
    with pytest.raises(ValueError, match="does not follow"):
        decider.evolve(None, decision[1])


@pytest.mark.req("MW-7.3-04")
def test_submission_is_refused_while_required_work_is_unverified() -> None:
    """The check runs on every submission against the Group's WorkItem graph."""
    from missionweave.v1 import work_pb2
    from missionweave_server.services.authority.state import WorkItemState

    state = created()
    submit = mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=1)
    state.work_items["wi_a"] = WorkItemState("wi_a", work_pb2.WORK_ITEM_STATE_SUBMITTED)
    state.work_items["wi_opt"] = WorkItemState("wi_opt", work_pb2.WORK_ITEM_STATE_OPEN, required=False)
    by_coord = cmd("mission_submit_for_approval", submit, actor="coord", epoch=2)
    by_coord.session_epoch = 4  # the session the lease is bound to
    r = rejected(state, by_coord)
    assert r.reason == R.REJECTION_REASON_PRECONDITION_FAILED and "wi_a" in r.message
    state.work_items["wi_a"].state = work_pb2.WORK_ITEM_STATE_VERIFIED
    after = run(state, by_coord)
    assert after.mission is not None and after.mission.state == mission_pb2.MISSION_STATE_AWAITING_APPROVAL
