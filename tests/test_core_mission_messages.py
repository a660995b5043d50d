"""The text of the Mission lifecycle's refusals (spec 7.1, 7.2, 13.3) through decide: besides the
stable reason and metadata, each message names the rule and, where there is one, the way out
(docs/errors.md: the message is for the human reading the CLI)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from missionweave.kernel.errors import Rejected
from missionweave.v1 import mission_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState
from tests.mission_fixtures import (
    CTX,
    LATE,
    NOW,
    G,
    R,
    active,
    approved,
    authorized,
    awaiting,
    ctx,
    submit_body,
)
from tests.test_core_mission_rules import replace_body, replaced, revoke, target, transfer


def _session(state: GroupState) -> decider.Decision:
    command = G.command("mission_submit_for_approval", submit_body(state), "coord", state)
    command.session_epoch = 2
    return decider.decide(state, command, CTX)


def _acknowledged() -> GroupState:
    state = replaced()
    body = mission_pb2.MissionAcknowledgeReconciliation(
        coordinator_epoch=2, group_revision=state.head_sequence
    )
    return G.run(state, "mission_acknowledge_reconciliation", body, "coord2", ctx(LATE))


def _ack(state: GroupState, revision: int) -> decider.Decision:
    body = mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=2, group_revision=revision)
    return G.decide(state, "mission_acknowledge_reconciliation", body, "coord2", ctx(LATE))


def _renew(state: GroupState, epoch: int, at=NOW) -> decider.Decision:
    return G.decide(
        state,
        "mission_renew_coordinator_lease",
        mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=epoch),
        "coord",
        ctx(at),
    )


def _transfer(
    body: mission_pb2.MissionAuthorizeContextTransfer, linked: decider.DecisionContext
) -> decider.Decision:
    return G.decide(
        authorized(active(), G, "wi"), "mission_authorize_context_transfer", body, "alice", linked
    )


CASES: dict[str, tuple[Callable[[], decider.Decision], str]] = {
    "MW-7.2-04 expired lease": (
        lambda: G.decide(active(), "mission_submit_for_approval", submit_body(active()), "coord", ctx(LATE)),
        "the Coordinator lease expired at 2026-06-01T12:05:00+00:00: the MissionOwner appoints a Coordinator "
        "(`mwp coordinator replace`), which then reconciles (`mwp coordinator reconcile`) (MW-7.2-04/08)",
    ),
    "MW-7.2-02 session": (
        lambda: _session(active()),
        "the lease is bound to session 1; renew it from session 2 (`mwp coordinator renew`)",
    ),
    "MW-7.2-08 reconcile first": (
        lambda: G.decide(
            replaced(),
            "mission_submit_for_approval",
            submit_body(replaced(), coordinator_epoch=2),
            "coord2",
            ctx(LATE),
        ),
        "a replacement Coordinator acknowledges reconciliation of the current state first (MW-7.2-08)",
    ),
    "MW-7.2-06 replaced": (
        lambda: G.decide(
            replaced(), "mission_submit_for_approval", submit_body(replaced()), "coord", ctx(LATE)
        ),
        "coord was replaced as Coordinator; epoch 2 is current (MW-7.2-06)",
    ),
    "MW-7.2-06 epoch": (
        lambda: G.decide(
            active(), "mission_submit_for_approval", submit_body(active(), coordinator_epoch=3), "coord"
        ),
        "coordinator epoch 3 is not the current 1 (MW-7.2-06)",
    ),
    "MW-7.3-05 revision": (
        lambda: G.decide(
            active(), "mission_submit_for_approval", submit_body(active(), mission_revision=3), "coord"
        ),
        "submission names Mission revision 3; the current one is 1",
    ),
    "MW-7.1-09 not approved": (
        lambda: G.decide(
            awaiting(), "mission_revoke_approval", revoke(awaiting(), approval_event_id=""), "alice"
        ),
        "only an approved Mission's approval can be revoked",
    ),
    "MW-7.1-09 other approval": (
        lambda: G.decide(
            approved(), "mission_revoke_approval", revoke(approved(), approval_event_id="evt_x"), "alice"
        ),
        "'evt_x' is not this Mission's approval",
    ),
    "MW-7.1-T07 long reason": (
        lambda: G.decide(active(), "mission_cancel", mission_pb2.MissionCancel(reason="x" * 4097), "alice"),
        "body.reason: at most 4096 characters",
    ),
    "MW-7.2-04 renew lapsed": (
        lambda: _renew(active(), 1, LATE),
        "the lease has lapsed; the MissionOwner or the control plane appoints a Coordinator (`mwp coordinator replace`) (MW-7.2-04)",
    ),
    "MW-7.2-06 renew stale": (
        lambda: _renew(active(), 2),
        "only the current Coordinator epoch 1 renews its lease (MW-7.2-06)",
    ),
    "MW-7.2-04 live lease": (
        lambda: G.decide(active(), "mission_replace_coordinator", replace_body(), "alice"),
        "the Coordinator lease is live until 2026-06-01T12:05:00+00:00; it is replaced once it lapses",
    ),
    "MW-7.2-04 replaced epoch": (
        lambda: G.decide(
            active(),
            "mission_replace_coordinator",
            replace_body(replaced_coordinator_epoch=2),
            "alice",
            ctx(LATE),
        ),
        "replaced_coordinator_epoch 2 is not the current 1",
    ),
    "MW-7.2-02 coordinator kind": (
        lambda: G.decide(
            active(), "mission_replace_coordinator", replace_body(coordinator_id="ops"), "alice", ctx(LATE)
        ),
        "body.coordinator_id: the Coordinator must be an agent or a human",
    ),
    "MW-7.2-11 owner as coordinator": (
        lambda: G.decide(
            active(), "mission_replace_coordinator", replace_body(coordinator_id="alice"), "alice", ctx(LATE)
        ),
        "body.coordinator_id: the MissionOwner cannot also be the Coordinator (MW-7.2-11)",
    ),
    "MW-7.2-08 reconciled twice": (
        lambda: _ack(_acknowledged(), 7),
        "this Coordinator epoch is already reconciled",
    ),
    "MW-7.2-08 revision": (
        lambda: _ack(replaced(), 1),
        "reconcile against a revision in 7..7: the state since the appointment and every WorkItem change must have been read",
    ),
    "MW-13.3-07 own group": (
        lambda: _transfer(transfer(target_group_id="grp_a"), ctx(NOW, target())),
        "body.target_group_id: another Group (a Group's own context needs no transfer)",
    ),
    "MW-13.3-07 no target": (lambda: _transfer(transfer(), ctx()), "no Group grp_target"),
    "MW-13.3-05 other owner": (
        lambda: _transfer(transfer(), ctx(NOW, target("bob"))),
        "the target Mission is owned by bob; only a MissionOwner of both Missions authorizes a transfer between them",
    ),
    "MW-13.3-07 too many": (
        lambda: _transfer(transfer(work_item_ids=["wi"] * 33), ctx(NOW, target())),
        "body.work_item_ids: at most 32",
    ),
    "MW-13.3-07 unknown work": (
        lambda: _transfer(transfer(work_item_ids=["zz"]), ctx(NOW, target())),
        "no WorkItem zz in this Group",
    ),
    "MW-7.1-T06 not awaiting": (
        lambda: G.decide(
            active(), "mission_approve", mission_pb2.MissionApprove(submission_event_id="e"), "alice"
        ),
        "mission.approve needs a Mission in MISSION_STATE_AWAITING_APPROVAL, it is MISSION_STATE_ACTIVE",
    ),
}


@pytest.mark.req("MW-7.1-T04", "MW-7.2-04", "MW-7.2-06", "MW-7.2-08", "MW-7.1-09", "MW-13.3-05", "MW-13.3-07")
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_refusal_says_why(case: str) -> None:
    decide, message = CASES[case]
    r = decide()
    assert isinstance(r, Rejected), case
    assert r.message == message


@pytest.mark.req("MW-7.1-06", "MW-7.1-07", "MW-7.1-08")
@pytest.mark.parametrize(
    "kind, body, actor",
    [
        (
            "mission.submit_for_approval",
            mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=3),
            "coord",
        ),
        ("mission.request_changes", mission_pb2.MissionRequestChanges(requested_changes="x"), "alice"),
        ("mission.approve", mission_pb2.MissionApprove(), "alice"),
        ("mission.cancel", mission_pb2.MissionCancel(reason="x"), "alice"),
        ("mission.terminate", mission_pb2.MissionTerminate(reason="x"), "ops"),
        (
            "mission.renew_coordinator_lease",
            mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
            "coord",
        ),
        (
            "mission.replace_coordinator",
            mission_pb2.MissionReplaceCoordinator(replaced_coordinator_epoch=1, coordinator_id="coord2"),
            "alice",
        ),
        (
            "mission.acknowledge_reconciliation",
            mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=1),
            "coord",
        ),
        ("mission.issue_directive", mission_pb2.MissionIssueDirective(directive="x"), "alice"),
    ],
)
def test_an_approved_mission_is_never_reopened_or_rewritten(kind: str, body: object, actor: str) -> None:
    """Each command names itself in the refusal, with the way out: a linked follow-up Mission."""
    r = G.refused(approved(), kind.replace(".", "_"), body, actor)
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_TERMINAL_STATE, {"state": "MISSION_STATE_APPROVED"})
    assert r.message == (
        f"{kind}: the Mission is MISSION_STATE_APPROVED, a terminal state; corrections go through a linked follow-up Mission (MW-7.1-08)"
    )
