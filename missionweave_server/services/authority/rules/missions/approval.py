"""The approval cycle (MW-7.1-T04..T06, 7.3; MW-7.1-08/09): the Coordinator submits, the MissionOwner
requests changes or approves, and an Approval is revoked beside a linked follow-up Mission."""

from __future__ import annotations

from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2, mission_pb2, work_pb2
from missionweave_server.services.authority.rules.common import (
    MS,
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    check_artifact_refs,
    mission_of,
    named_digests,
    require_reason,
    state_name,
)
from missionweave_server.services.authority.rules.deliverables import require_held
from missionweave_server.services.authority.rules.missions.common import (
    linked_mission,
    require_coordinator,
    require_live,
    transition,
)
from missionweave_server.services.authority.state import GroupState, MissionRecord


def _require_state(mission: MissionRecord, wanted: int, command_name: str) -> None:
    require_live(mission, command_name)
    if mission.state != wanted:
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION,
            f"{command_name} needs a Mission in {state_name(wanted)}, it is {state_name(mission.state)}",
            state=state_name(mission.state),
        )


def _unverified_required_work(state: GroupState) -> list[str]:
    """MW-7.3-04: required WorkItems whose results and acceptance Evidence are not verified.

    Until the WorkItem rules land no command creates WorkItems, so a Group's graph is empty and this
    finds none; the check itself runs on every submission.
    """
    return [
        wid
        for wid, item in state.work_items.items()
        if item.required
        and item.state not in (work_pb2.WORK_ITEM_STATE_VERIFIED, work_pb2.WORK_ITEM_STATE_CANCELLED)
    ]


def mission_submit_for_approval(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-T04 / MW-7.3-04/05: the current Coordinator submits a specific revision and Artifact set."""
    assert state is not None
    body = command.mission_submit_for_approval
    mission = mission_of(state)
    require_coordinator(state, command, ctx, body.coordinator_epoch, "mission.submit_for_approval")
    _require_state(mission, MS.MISSION_STATE_ACTIVE, "mission.submit_for_approval")
    if body.mission_revision != mission.revision:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"submission names Mission revision {body.mission_revision}; the current one is {mission.revision}",
            current_revision=mission.revision,
        )
    check_artifact_refs(body.artifacts, "body.artifacts")
    unverified = _unverified_required_work(state)
    if unverified:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"required WorkItems are not verified: {', '.join(sorted(unverified)[:10])} (MW-7.3-04)",
        )
    require_held(state, command, ctx, body.artifacts, "body.artifacts")
    out.emit(
        "mission.submitted",
        "mission_submitted",
        mission_pb2.MissionSubmitted(
            mission_revision=body.mission_revision,
            artifacts=body.artifacts,
            summary=body.summary,
            coordinator_epoch=body.coordinator_epoch,
        ),
    )


def _answer_submission(state: GroupState, submission_event_id: str, name: str) -> None:
    """The owner's answer (only the MissionOwner's role may issue it: rules/authorization.py)."""
    mission = mission_of(state)
    _require_state(mission, MS.MISSION_STATE_AWAITING_APPROVAL, name)
    if submission_event_id != mission.latest_submission_event_id:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"{name} answers the latest submission {mission.latest_submission_event_id}, not {submission_event_id!r}",
            latest_submission_event_id=mission.latest_submission_event_id,
        )


def mission_request_changes(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-T05 / MW-7.3-06/07: the owner's signed change request reopens the same Mission."""
    assert state is not None
    body = command.mission_request_changes
    _answer_submission(state, body.submission_event_id, "mission.request_changes")
    require_reason(body.requested_changes, "body.requested_changes")
    out.emit(
        "mission.changes_requested",
        "mission_changes_requested",
        mission_pb2.MissionChangesRequested(
            submission_event_id=body.submission_event_id,
            requested_changes=body.requested_changes,
            owner_signed_command=ctx.envelope,
        ),
    )


def mission_approve(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-T06 / MW-7.3-06: the owner's signed Approval; `approved` is terminal. MW-14-10: a
    child whose risk policy requires it is approved by the root MissionOwner first."""
    assert state is not None
    body = command.mission_approve
    _answer_submission(state, body.submission_event_id, "mission.approve")
    mission = mission_of(state)
    needs_root = (
        mission.kind == mission_pb2.MISSION_KIND_CHILD
        and mission.definition.risk_policy.require_root_owner_approval
    )
    if command.actor_id != mission.owner_id:  # the table admits a reviewer for this one case
        if not needs_root or command.actor_id != mission.root_owner_id:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED,
                "mission.approve is the MissionOwner's; a reviewer approves only as the root MissionOwner of a "
                "child whose risk policy requires it (MW-14-10)",
            )
        if mission.root_owner_approval_event_id:
            raise Rejected(
                R.REJECTION_REASON_INVALID_TRANSITION,
                "the root MissionOwner already approved this submission",
            )
        out.emit(
            "mission.root_owner_approved",
            "root_owner_approved",
            mission_pb2.MissionApproved(
                submission_event_id=body.submission_event_id,
                comment=body.comment,
                owner_signed_command=ctx.envelope,
            ),
        )
        return
    if needs_root and not mission.root_owner_approval_event_id:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"the risk policy requires the root MissionOwner {mission.root_owner_id} to approve this submission first (MW-14-10)",
            root_owner_id=mission.root_owner_id,
        )
    out.emit(
        "mission.approved",
        "mission_approved",
        mission_pb2.MissionApproved(
            submission_event_id=body.submission_event_id,
            comment=body.comment,
            owner_signed_command=ctx.envelope,
        ),
    )


def mission_revoke_approval(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-08/09, OP-29: a new event beside the Approval, citing the linked follow-up Mission."""
    assert state is not None
    body = command.mission_revoke_approval
    mission = mission_of(state)
    if mission.state != MS.MISSION_STATE_APPROVED:
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION, "only an approved Mission's approval can be revoked"
        )
    if body.approval_event_id != mission.approval_event_id:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND, f"{body.approval_event_id!r} is not this Mission's approval"
        )
    if mission.approval_revoked_event_id:
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION,
            f"the approval was already revoked by {mission.approval_revoked_event_id}",
        )
    require_reason(body.reason, "body.reason")
    follow_up = linked_mission(
        ctx, body.follow_up_group_id, body.follow_up_mission_id, "body.follow_up_group_id"
    )
    if follow_up.follows_up_mission_id != mission.mission_id:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"{follow_up.mission_id} is not a follow-up of {mission.mission_id}; create it with "
            "mission.create_follow_up first (MW-7.1-08)",
        )
    out.emit(
        "mission.approval_revoked",
        "mission_approval_revoked",
        mission_pb2.MissionApprovalRevoked(
            approval_event_id=body.approval_event_id,
            reason=body.reason,
            follow_up_mission_id=follow_up.mission_id,
            follow_up_group_id=body.follow_up_group_id,
        ),
    )


# ---------------------------------------------------------------- evolve rules


def _submitted(state: GroupState, event: event_pb2.Event) -> None:
    transition(MS.MISSION_STATE_AWAITING_APPROVAL)(state, event)
    mission = mission_of(state)
    mission.latest_submission_event_id = event.event_id
    mission.latest_submission_artifacts = tuple(event.mission_submitted.artifacts)
    mission.root_owner_approval_event_id = ""


def _root_owner_approved(state: GroupState, event: event_pb2.Event) -> None:
    mission_of(state).root_owner_approval_event_id = event.event_id


def _approved(state: GroupState, event: event_pb2.Event) -> None:
    transition(MS.MISSION_STATE_APPROVED)(state, event)
    mission_of(state).approval_event_id = event.event_id


def _approval_revoked(state: GroupState, event: event_pb2.Event) -> None:
    # OP-29: the Mission stays approved and its revision unchanged; the revocation sits beside it.
    mission = mission_of(state)
    mission.approval_revoked_event_id = event.event_id
    mission.follow_up_mission_ids.append(event.mission_approval_revoked.follow_up_mission_id)


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "mission_submit_for_approval",
        mission_submit_for_approval,
        {"mission_submitted": _submitted},
        named_artifacts=lambda c: named_digests(c.mission_submit_for_approval.artifacts),
    ),
    CommandKind(
        "mission_request_changes",
        mission_request_changes,
        {"mission_changes_requested": transition(MS.MISSION_STATE_ACTIVE)},
    ),
    CommandKind(
        "mission_approve",
        mission_approve,
        {"mission_approved": _approved, "root_owner_approved": _root_owner_approved},
    ),
    CommandKind(
        "mission_revoke_approval",
        mission_revoke_approval,
        {"mission_approval_revoked": _approval_revoked},
        linked_groups=lambda c: (c.mission_revoke_approval.follow_up_group_id,),
    ),
)
