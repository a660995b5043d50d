"""The Mission tree read model (MW-14-19): one node per Mission, from its Group's state. Pure."""

from __future__ import annotations

from collections import Counter

from missionweave.v1 import common_pb2, subtask_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import mission_of
from missionweave_server.services.authority.state import SIX, GroupState

# A tree answered by one GetMissionTree call holds at most this many Missions.
MAX_TREE_NODES = 1000


def root_group_id(state: GroupState) -> str:
    mission = mission_of(state)
    return mission.ancestor_group_ids[0] if mission.ancestor_group_ids else state.group_id


def child_group_ids(state: GroupState) -> list[str]:
    """Every child Mission ever promoted from the Group's WorkItems, oldest first per WorkItem."""
    return [link.child_group_id for item in state.work_items.values() for link in item.children]


def tree_node(state: GroupState) -> subtask_pb2.MissionTreeNode:
    mission = mission_of(state)
    definition = mission.definition
    node = subtask_pb2.MissionTreeNode(
        mission_id=mission.mission_id,
        group_id=state.group_id,
        title=definition.title,
        kind=mission.kind,  # type: ignore[arg-type]
        state=mission.state,  # type: ignore[arg-type]
        depth=mission.depth,
        parent_group_id=mission.parent_group_id,
        parent_work_item_id=mission.parent_work_item_id,
        coordinator_id=mission.coordinator.agent_id if mission.coordinator else "",
        owner_id=mission.owner_id,
        deadline=definition.deadline,
        mandatory=mission.mandatory,
        budget=common_pb2.Budget(
            limit=definition.budget,
            used=common_pb2.ResourceVector(currency=definition.budget.currency, **state.mission_used),
        ),
        reserved=common_pb2.ResourceVector(
            currency=definition.budget.currency, **{d: state.reserved[d] for d in SIX}
        ),
    )
    counts = Counter(wp.WorkItemState.Name(item.state) for item in state.work_items.values())  # type: ignore[arg-type]
    node.work_items_by_state.update(counts)
    for wid, item in state.work_items.items():
        running = item.running_child
        for text in item.blockers:
            node.blockers.append(
                wp.Blocker(
                    work_item_id=wid,
                    kind=wp.BLOCKER_KIND_SUBTASK if running else wp.BLOCKER_KIND_UNSPECIFIED,
                    required_resolution=text,
                    child_mission_id=running.child_mission_id if running else "",
                )
            )
    return node
