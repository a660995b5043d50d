"""Context transfer between Groups (MW-13.3-05/07): the MissionOwner's recorded authorization and the
check a Context Package for another Group passes against it (``check_transfer``, used by reads.py)."""

from __future__ import annotations

from collections.abc import Sequence

from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2, mission_pb2
from missionweave_server.services.authority.rules.common import (
    MAX_REFS,
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    invalid,
    require_reason,
)
from missionweave_server.services.authority.state import GroupState, TransferGrant


def mission_authorize_context_transfer(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-13.3-05/07: content enters another Mission's context only by the MissionOwner's recorded
    authorization, and only into a Mission the same owner is accountable for."""
    assert state is not None
    body = command.mission_authorize_context_transfer
    require_reason(body.reason, "body.reason")
    if body.target_group_id == command.group_id:
        raise invalid("body.target_group_id", "another Group (a Group's own context needs no transfer)")
    target = ctx.linked.get(body.target_group_id)
    if target is None or target.mission is None:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND, f"no Group {body.target_group_id}", field="body.target_group_id"
        )
    if target.mission.owner_id != command.actor_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"the target Mission is owned by {target.mission.owner_id}; only a MissionOwner of both Missions "
            "authorizes a transfer between them",
        )
    if len(body.work_item_ids) > MAX_REFS:
        raise invalid("body.work_item_ids", f"at most {MAX_REFS}")
    for i, wid in enumerate(body.work_item_ids):
        if wid not in state.work_items:
            raise Rejected(
                R.REJECTION_REASON_NOT_FOUND,
                f"no WorkItem {wid} in this Group",
                field=f"body.work_item_ids[{i}]",
            )
    out.emit(
        "mission.context_transfer.authorized",
        "mission_context_transfer_authorized",
        mission_pb2.MissionContextTransferAuthorized(
            target_group_id=body.target_group_id,
            work_item_ids=sorted(set(body.work_item_ids)),
            reason=body.reason,
        ),
    )


def check_transfer(
    state: GroupState, target_group_id: str, authorization_id: str, work_item_ids: Sequence[str]
) -> None:
    """MW-13.3-05/07: another Group receives this Group's context only under a recorded authorization
    for that Group that covers the requested scope."""
    if not target_group_id:
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT,
            "an authorization is given with target_group_id",
            field="target_group_id",
        )
    if not authorization_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "Group content does not enter another Mission's context by default: cite the "
            "mission.context_transfer.authorized event (transfer_authorization_event_id)",
        )
    grant = state.transfers.get(authorization_id)
    if grant is None or grant.target_group_id != target_group_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"{authorization_id} is not an authorization of this Group for {target_group_id}",
            field="transfer_authorization_event_id",
        )
    if grant.work_item_ids and not (work_item_ids and set(work_item_ids) <= set(grant.work_item_ids)):
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"the authorization covers WorkItems {', '.join(grant.work_item_ids)} only",
            field="work_item_ids",
        )


# ---------------------------------------------------------------- evolve rules


def _transfer_authorized(state: GroupState, event: event_pb2.Event) -> None:
    grant = event.mission_context_transfer_authorized
    state.transfers[event.event_id] = TransferGrant(grant.target_group_id, tuple(grant.work_item_ids))


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "mission_authorize_context_transfer",
        mission_authorize_context_transfer,
        {"mission_context_transfer_authorized": _transfer_authorized},
        linked_groups=lambda c: (c.mission_authorize_context_transfer.target_group_id,),
    ),
)
