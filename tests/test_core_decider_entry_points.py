"""Pure core: the decider's own entry points and checks (missionweave_server/services/authority/decider.py): the
refusals every command may meet before its rules (unknown kind, missing or existing Group), the
Authority's revocation of a replaced session's leases (MW-11.3-09), and evolve's guards."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import command_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState
from tests import builders
from tests.steward_fixtures import BASE, CTX, GROUP, GROUP_ID, NOW, PLANNING, rejection

LATER = NOW + timedelta(seconds=30)


def started() -> GroupState:
    """wi owned by worker, started under its session 1 (tests.core_group sends session epoch 1)."""
    state = GROUP.run(
        BASE,
        "work_authorize",
        wp.WorkAuthorize(work_item_id="wi", title="wi", contract=builders.contract(NOW), coordinator_epoch=1),
        "coord",
    )
    offer = wp.WorkOffer(
        work_item_id="wi",
        offer_id="off-1",
        candidate_ids=["worker"],
        expires_at=to_timestamp(NOW + timedelta(minutes=5)),
        selection_criteria=[builders.selection("worker")],
        coordinator_epoch=1,
    )
    state = GROUP.run(state, "work_offer", offer, "coord")
    state = GROUP.run(
        state,
        "work_accept_offer",
        wp.WorkAcceptOffer(work_item_id="wi", offer_id="off-1", contract_revision=1),
        "worker",
    )
    return GROUP.run(
        state, "work_start", wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-1"), "worker"
    )


STARTED = started()


@pytest.mark.req("MW-11.3-09")
def test_a_replacement_session_revokes_the_older_sessions_leases_under_the_authoritys_own_command() -> None:
    before = copy.deepcopy(STARTED)
    (event,) = decider.decide_session_replaced(STARTED, "worker", 2, LATER)
    command_id = ids.derived_id("session-replaced", GROUP_ID, "worker", "2")
    assert (
        event.event_id,
        event.sequence,
        event.recorded_at,
        event.causing_command_id,
        event.actor_id,
        event.type,
    ) == (
        ids.derived_id("evt", GROUP_ID, command_id, "0"),
        STARTED.head_sequence + 1,
        to_timestamp(LATER),
        command_id,
        "authority",
        "work.lease_revoked",
    )
    payload = event.lease_revoked
    assert (
        payload.work_item_id,
        payload.lease_id,
        payload.agent_id,
        payload.session_epoch,
        payload.cause,
        payload.resulting_state,
    ) == (
        "wi",
        "lease-1",
        "worker",
        1,
        wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED,
        wp.WORK_ITEM_STATE_QUEUED,
    )
    assert STARTED == before  # decide never changes its input
    after = decider.evolve(copy.deepcopy(STARTED), event)
    assert (
        after.work_items["wi"].state,
        after.work_items["wi"].lease,
        after.work_items["wi"].owner.agent_id,
    ) == (  # type: ignore[union-attr]
        wp.WORK_ITEM_STATE_QUEUED,
        None,
        "worker",
    )
    # The same replacement again appends the same event (its id derives from the new session).
    assert decider.decide_session_replaced(STARTED, "worker", 2, LATER) == [event]


@pytest.mark.req("MW-11.3-09")
def test_a_session_that_replaces_nothing_here_appends_nothing() -> None:
    assert decider.decide_session_replaced(STARTED, "worker", 1, LATER) == []  # the lease's own session
    assert decider.decide_session_replaced(STARTED, "rev", 2, LATER) == []
    assert decider.decide_session_replaced(None, "worker", 2, LATER) == []


def test_a_command_without_a_known_body_is_refused() -> None:
    command = command_pb2.Command(command_id="c-none", group_id=GROUP_ID, actor_id="alice", session_epoch=1)
    assert rejection(decider.decide(BASE, command, CTX)) == ("UNKNOWN_COMMAND_KIND", {})


@pytest.mark.req("MW-7.1-T01")
def test_a_group_is_created_once_with_membership_epoch_0_and_other_commands_need_it() -> None:
    create = builders.mission_create("alice", "coord", NOW)
    assert rejection(GROUP.decide(BASE, "mission_create", create, "alice")) == ("GROUP_EXISTS", {})
    command = GROUP.command("mission_create", create, "alice", None)
    command.membership_epoch = 1
    assert rejection(decider.decide(None, command, CTX)) == (
        "INVALID_ARGUMENT",
        {"field": "membership_epoch"},
    )
    assert rejection(GROUP.decide(None, "message_post", builders.message(PLANNING), "alice")) == (
        "GROUP_NOT_FOUND",
        {},
    )


def test_evolve_applies_events_in_sequence_and_knows_every_payload() -> None:
    decision = GROUP.decide(BASE, "message_post", builders.message(PLANNING), "alice")
    assert isinstance(decision, list)
    (event,) = decision
    skipped = copy.deepcopy(event)
    skipped.sequence += 1
    with pytest.raises(ValueError, match="does not follow head"):
        decider.evolve(copy.deepcopy(BASE), skipped)
    with pytest.raises(ValueError, match="no evolve rule"):
        decider.evolve(
            copy.deepcopy(BASE), event_pb2.Event(group_id=GROUP_ID, sequence=BASE.head_sequence + 1, type="x")
        )
    after = decider.evolve(copy.deepcopy(BASE), event)
    assert after.head_sequence == event.sequence and after.conversations[PLANNING].message_count == 1


def test_fold_replays_a_log_into_the_state_the_decisions_built() -> None:
    log: list[event_pb2.Event] = []
    state = None
    for kind, body, actor in (
        ("mission_create", builders.mission_create("alice", "coord", NOW), "alice"),
        ("message_post", builders.message(PLANNING), "coord"),
    ):
        decision = GROUP.decide(state, kind, body, actor)
        assert isinstance(decision, list)
        log += decision
        state = decider.fold(log)
    assert state is not None and state.head_sequence == len(log) and decider.fold([]) is None
