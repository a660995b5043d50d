"""Admission: whether a command may be decided now, under the per-Group ingress limits (MW-8-16).

The command path (authority.py) admits a command once, under the Group's lock and after the replay
check, so replays of accepted commands and retries after a store race never count against a limit.
"""

from __future__ import annotations

from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2
from missionweave_server.observability import metrics
from missionweave_server.services.authority.ingress import GroupIngressLimiter
from missionweave_server.services.authority.state import GroupState

R = common_pb2.RejectionReason


def admit(ingress: GroupIngressLimiter, command: command_pb2.Command, state: GroupState | None) -> None:
    """Per-Group token bucket (MW-8-16): replays of accepted commands never count against it. An
    identity without an active Membership in a Group whose state is loaded here (``state``) draws on
    an allowance of its own there (D158): an outsider's commands, refused or not, never spend the
    members' allowance."""
    group_id = command.group_id
    member = state.members.get(command.actor_id) if state is not None else None
    outsider = state is not None and (member is None or not member.active)
    wait_s = ingress.admit(f"{group_id}\n{command.actor_id}" if outsider else group_id)
    if wait_s > 0:
        metrics.INGRESS_REFUSALS.inc()
        over = (
            f"{command.actor_id}'s commands to Group {group_id} are" if outsider else f"Group {group_id} is"
        )
        raise Rejected(
            R.REJECTION_REASON_OVERLOADED,
            f"{over} over the command rate ({ingress.rate:g}/s); retry later",
            retry_after_ms=max(1, round(wait_s * 1000)),
        )
