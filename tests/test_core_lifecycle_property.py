"""Property: random command sequences never produce a Mission transition outside the table
(MW-7.1-T01..T08), terminal states are never left, and replaying the log equals the live state."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, mission_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState, IdentityInfo
from tests import builders

MS = mission_pb2.MissionState
START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
IDS = {
    "alice": IdentityInfo("alice", common_pb2.IDENTITY_KIND_HUMAN, session_epoch=1),
    "coord": IdentityInfo("coord", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
    "other": IdentityInfo("other", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
    "ops": IdentityInfo("ops", common_pb2.IDENTITY_KIND_CONTROL_PLANE, session_epoch=1),
}
# (state before, event type) -> state after: the table, as the events that realise its rows.
ALLOWED = {
    (MS.MISSION_STATE_ACTIVE, "mission.submitted"): MS.MISSION_STATE_AWAITING_APPROVAL,  # T04
    (MS.MISSION_STATE_AWAITING_APPROVAL, "mission.changes_requested"): MS.MISSION_STATE_ACTIVE,  # T05
    (MS.MISSION_STATE_AWAITING_APPROVAL, "mission.approved"): MS.MISSION_STATE_APPROVED,  # T06
    (MS.MISSION_STATE_ACTIVE, "mission.cancelled"): MS.MISSION_STATE_CANCELLED,  # T07
    (MS.MISSION_STATE_AWAITING_APPROVAL, "mission.cancelled"): MS.MISSION_STATE_CANCELLED,  # T07
    (MS.MISSION_STATE_ACTIVE, "mission.failed"): MS.MISSION_STATE_FAILED,  # T08
    (MS.MISSION_STATE_AWAITING_APPROVAL, "mission.failed"): MS.MISSION_STATE_FAILED,  # T08
}
TERMINAL = {MS.MISSION_STATE_APPROVED, MS.MISSION_STATE_CANCELLED, MS.MISSION_STATE_FAILED}
ACTORS = ["alice", "coord", "other", "ops"]
KINDS = [
    "mission_submit_for_approval",
    "mission_request_changes",
    "mission_approve",
    "mission_cancel",
    "mission_terminate",
    "mission_renew_coordinator_lease",
    "mission_replace_coordinator",
    "mission_acknowledge_reconciliation",
    "message_post",
    "mission_issue_directive",
]


def body_for(kind: str, state: GroupState, choice: int) -> object:
    m = state.mission
    assert m is not None
    epoch = m.coordinator.coordinator_epoch if m.coordinator else 0
    epoch = epoch if choice % 3 else epoch - 1  # sometimes a stale epoch
    if kind == "mission_submit_for_approval":
        return mission_pb2.MissionSubmitForApproval(
            coordinator_epoch=epoch, mission_revision=m.revision - (choice % 4 == 0)
        )
    if kind == "mission_request_changes":
        return mission_pb2.MissionRequestChanges(
            submission_event_id=m.latest_submission_event_id, requested_changes="more"
        )
    if kind == "mission_approve":
        return mission_pb2.MissionApprove(
            submission_event_id=m.latest_submission_event_id if choice % 5 else "evt_x"
        )
    if kind == "mission_cancel":
        return mission_pb2.MissionCancel(reason="r")
    if kind == "mission_terminate":
        return mission_pb2.MissionTerminate(coordinator_epoch=epoch, reason="r")
    if kind == "mission_renew_coordinator_lease":
        return mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=epoch)
    if kind == "mission_replace_coordinator":
        return mission_pb2.MissionReplaceCoordinator(
            coordinator_id=["coord", "other"][choice % 2], replaced_coordinator_epoch=epoch
        )
    if kind == "mission_acknowledge_reconciliation":
        return mission_pb2.MissionAcknowledgeReconciliation(
            coordinator_epoch=epoch, group_revision=state.head_sequence
        )
    if kind == "mission_issue_directive":
        return mission_pb2.MissionIssueDirective(directive="d")
    return builders.message(m.planning_conversation_id, "hi")


# Weighted so that long lives (submit, answer, resubmit) are common and endings rarer.
WEIGHTED_KINDS = KINDS[:3] * 4 + KINDS[3:]
WEIGHTED_ACTORS = ["alice", "coord"] * 3 + ["other", "ops"]
step = st.tuples(
    st.sampled_from(WEIGHTED_KINDS),
    st.sampled_from(WEIGHTED_ACTORS),
    st.integers(0, 59),
    st.sampled_from([0, 1, 5, 10, 20, 70]),  # seconds; 70 lets the 60 s lease lapse now and then
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=40))
@pytest.mark.req(
    "MW-7.1-05",
    "MW-7.1-06",
    "MW-7.1-07",
    "MW-7.1-T04",
    "MW-7.1-T05",
    "MW-7.1-T06",
    "MW-7.1-T07",
    "MW-7.1-T08",
)
def test_random_sequences_stay_inside_the_lifecycle_table_and_replay_equals_live(
    steps: list[tuple[str, str, int, int]],
) -> None:
    now = START
    create = command_pb2.Command(
        command_id="c0", group_id="grp_p", actor_id="alice", session_epoch=1, issued_at=to_timestamp(now)
    )
    create.mission_create.CopyFrom(builders.mission_create("alice", "coord", now))
    create.mission_create.coordinator_renewal.lease_duration.FromSeconds(60)
    log = decider.decide(None, create, decider.DecisionContext(now, IDS))
    assert not isinstance(log, Rejected)
    live = decider.fold(list(log))
    assert live is not None
    for i, (kind, actor, choice, advance) in enumerate(steps, start=1):
        now += timedelta(seconds=advance)
        member = live.members.get(actor)
        command = command_pb2.Command(
            command_id=f"c{i}",
            group_id="grp_p",
            actor_id=actor,
            session_epoch=1,
            membership_epoch=member.membership_epoch if member and member.active else 0,
            issued_at=to_timestamp(now),
        )
        getattr(command, kind).CopyFrom(body_for(kind, live, choice))
        before_state = live.mission.state  # type: ignore[union-attr]
        snapshot = copy.deepcopy(live)
        decision = decider.decide(live, command, decider.DecisionContext(now, IDS))
        assert live == snapshot  # decide never mutates
        if isinstance(decision, Rejected):
            continue
        for event in decision:
            hypothesis_event(event.type)
            if event.type in {t for _, t in ALLOWED} or event.type == "mission.approval_revoked":
                assert (before_state, event.type) in ALLOWED, (MS.Name(before_state), event.type)
            live = decider.evolve(live, event)
            log.append(event)
        after = live.mission.state  # type: ignore[union-attr]
        if before_state in TERMINAL:
            assert after == before_state, "a terminal Mission changed state"
        elif after != before_state:
            assert ALLOWED[(before_state, decision[-1].type)] == after
    assert decider.fold(list(log)) == live  # replay equals live state
