"""Ending a live Mission (MW-7.1-T07, T08): cancelled by its MissionOwner or Organization policy,
terminated as failed by its current Coordinator or Organization policy."""

from __future__ import annotations

from missionweave.v1 import command_pb2, mission_pb2
from missionweave_server.services.authority.rules.common import (
    MS,
    CommandKind,
    DecisionContext,
    Emitter,
    invalid,
    is_org_policy,
    mission_of,
    require_reason,
)
from missionweave_server.services.authority.rules.missions.common import (
    require_coordinator,
    require_live,
    transition,
)
from missionweave_server.services.authority.state import GroupState


def mission_cancel(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-T07 / MW-7.1-11: the MissionOwner or Organization policy (the authorization table
    admits no other role); a Coordinator may recommend cancellation or terminate the Mission as failed."""
    assert state is not None
    mission = mission_of(state)
    require_live(mission, "mission.cancel")
    if len(command.mission_cancel.reason) > 4096:
        raise invalid("body.reason", "at most 4096 characters")
    out.emit(
        "mission.cancelled",
        "mission_cancelled",
        mission_pb2.MissionCancelled(reason=command.mission_cancel.reason),
    )


def mission_terminate(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-T08: the current Coordinator or Organization policy ends the Mission as failed."""
    assert state is not None
    body = command.mission_terminate
    mission = mission_of(state)
    require_live(mission, "mission.terminate")
    if not is_org_policy(ctx, command.actor_id):
        require_coordinator(
            state, command, ctx, body.coordinator_epoch, "mission.terminate", needs_reconciliation=False
        )
    require_reason(body.reason, "body.reason")
    out.emit("mission.failed", "mission_failed", mission_pb2.MissionFailed(reason=body.reason))


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "mission_cancel",
        mission_cancel,
        {"mission_cancelled": transition(MS.MISSION_STATE_CANCELLED)},
        ends_mission=MS.MISSION_STATE_CANCELLED,
    ),
    CommandKind(
        "mission_terminate",
        mission_terminate,
        {"mission_failed": transition(MS.MISSION_STATE_FAILED)},
        ends_mission=MS.MISSION_STATE_FAILED,
    ),
)
