"""The MissionOwner's directives to the Coordinator (MW-7.1-12): recorded history that assigns nothing
by itself."""

from __future__ import annotations

from missionweave.kernel import codec
from missionweave.v1 import command_pb2, event_pb2, mission_pb2
from missionweave_server.services.authority.rules.common import (
    CommandKind,
    DecisionContext,
    Emitter,
    mission_of,
    require_reason,
)
from missionweave_server.services.authority.rules.missions.common import require_live
from missionweave_server.services.authority.state import GroupState

# A directive's parameters: one JSON object of at most this many bytes (UTF-8).
MAX_PARAMETERS_JSON_BYTES = 16 * 1024


def mission_issue_directive(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-12: the MissionOwner directs the Coordinator (recorded; it assigns nothing by itself)."""
    assert state is not None
    body = command.mission_issue_directive
    mission = mission_of(state)
    require_live(mission, "mission.issue_directive")
    require_reason(body.directive, "body.directive")
    if body.parameters_json:  # an object of at most 16 KiB, nested at most codec.MAX_JSON_DEPTH deep
        codec.json_object(body.parameters_json, "body.parameters_json", max_bytes=MAX_PARAMETERS_JSON_BYTES)
    out.emit(
        "mission.directive.issued",
        "mission_directive_issued",
        mission_pb2.MissionDirectiveIssued(directive=body.directive, parameters_json=body.parameters_json),
    )


# ---------------------------------------------------------------- evolve rules


def _nothing(state: GroupState, event: event_pb2.Event) -> None:
    """Recorded history that changes no decision state (directives)."""


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind("mission_issue_directive", mission_issue_directive, {"mission_directive_issued": _nothing}),
)
