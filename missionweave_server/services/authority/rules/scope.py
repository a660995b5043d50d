"""A child Mission's scope (MW-14-04): what it may use, carved from its parent WorkItem's contract,
and the check that keeps every WorkItem of the child within it. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable

from missionweave.kernel.capabilities import version_key
from missionweave.kernel.errors import Rejected
from missionweave.v1 import membership_pb2, subtask_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import R, mission_of
from missionweave_server.services.authority.state import GroupState

PERMISSION_LISTS = ("allowed_tools", "allowed_data", "allowed_operations", "allowed_egress_hosts")


def _scope_exceeds(check: str, value: str, message: str) -> Rejected:
    return Rejected(
        R.REJECTION_REASON_CHILD_SCOPE_EXCEEDS_PARENT, f"{message} (MW-14-04)", check=check, value=value
    )


def resolve_scope(
    contract: wp.WorkContract, given: subtask_pb2.MissionScope | None
) -> subtask_pb2.MissionScope:
    """The child's scope: ``given`` checked against the parent contract, or the contract's own."""
    if given is None:
        return subtask_pb2.MissionScope(
            permissions=contract.permissions, capabilities=contract.required_capabilities
        )
    check_within_scope(
        subtask_pb2.MissionScope(
            permissions=contract.permissions, capabilities=contract.required_capabilities
        ),
        given.permissions,
        given.capabilities,
        "the parent WorkItem's contract",
    )
    return given


def check_within_scope(
    scope: subtask_pb2.MissionScope,
    permissions: wp.ExecutionPermissions,
    capabilities: Iterable[membership_pb2.Capability],
    whose: str,
) -> None:
    """Each permission list a subset, each capability allowed at no higher minimum version."""
    for name in PERMISSION_LISTS:
        allowed = set(getattr(scope.permissions, name))
        for value in getattr(permissions, name):
            if value not in allowed:
                raise _scope_exceeds(name, value, f"{name}: {value!r} is not allowed by {whose}")
    allowed_caps = {c.capability_id: c.version for c in scope.capabilities}
    for cap in capabilities:
        ceiling = allowed_caps.get(cap.capability_id)
        if ceiling is None:
            raise _scope_exceeds(
                "capability", cap.capability_id, f"capability {cap.capability_id} is not within {whose}"
            )
        if version_key(cap.version) > version_key(ceiling):
            raise _scope_exceeds(
                "capability",
                cap.capability_id,
                f"{cap.capability_id} {cap.version} is above {whose}'s {ceiling}",
            )


def check_child_contract(state: GroupState, contract: wp.WorkContract, field: str) -> None:
    """MW-14-04 downstream: every WorkItem of a child Mission stays within the Mission's scope."""
    mission = mission_of(state)
    if mission.scope is None:
        return
    check_within_scope(
        mission.scope, contract.permissions, contract.required_capabilities, "the child Mission's scope"
    )
