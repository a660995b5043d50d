"""Derived Mission progress (MW-7.3-01/03): a pure function of the folded Group state.

Nothing here is reported by an agent: states, the dependency graph, accepted Evidence, blockers,
deadlines and the approval come from the log, so the answer is the same on every replica.
"""

from __future__ import annotations

from datetime import datetime

from missionweave.kernel.clock import from_timestamp
from missionweave.v1 import authority_service_pb2 as pb
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.work.contract import dependencies_satisfied
from missionweave_server.services.authority.state import SIX, GroupState, WorkItemState
from missionweave_server.services.authority.visibility import sees_work_item

DONE = frozenset({wp.WORK_ITEM_STATE_VERIFIED, wp.WORK_ITEM_STATE_CANCELLED})


def critical_path(state: GroupState) -> list[str]:
    """The longest chain of unfinished WorkItems along dependency edges (ties: earliest deadline)."""
    unfinished = {wid: item for wid, item in state.work_items.items() if item.state not in DONE}
    length: dict[str, int] = {}
    previous: dict[str, str] = {}

    def chain(wid: str) -> int:  # the graph is acyclic (MW-10.4-04), so this terminates
        if wid not in length:
            best, via = 0, ""
            for dep in unfinished[wid].depends_on:
                if dep in unfinished and chain(dep) > best:
                    best, via = length[dep], dep
            length[wid], previous[wid] = best + 1, via
        return length[wid]

    if not unfinished:
        return []
    end = max(unfinished, key=lambda wid: (chain(wid), -_deadline_key(unfinished[wid])))
    path = [end]
    while previous[path[-1]]:
        path.append(previous[path[-1]])
    return path[::-1]


def _deadline_key(item: WorkItemState) -> float:
    return (
        from_timestamp(item.contract.deadline).timestamp()
        if item.contract.HasField("deadline")
        else float("inf")
    )


def mission_progress(
    state: GroupState, now: datetime, viewer: str | None = None
) -> pb.GetMissionProgressResponse:
    """The Mission's progress; for member ``viewer``, only the WorkItems it sees (D124) are listed
    and on the critical path, while the counts, budget and usage stay the whole Mission's."""
    mission = state.mission
    assert mission is not None
    path = [wid for wid in critical_path(state) if sees_work_item(state, viewer, state.work_items[wid])]
    on_path = set(path)
    out = pb.GetMissionProgressResponse(
        mission_id=mission.mission_id,
        mission_state=mission.state,  # type: ignore[arg-type]
        group_revision=state.head_sequence,
        critical_path=path,
        latest_submission_event_id=mission.latest_submission_event_id,
        approval_event_id=mission.approval_event_id,
    )
    for item in state.work_items.values():
        if not sees_work_item(state, viewer, item):
            continue
        deadline = item.contract.deadline
        out.work_items.append(
            pb.WorkItemProgress(
                work_item_id=item.work_item_id,
                title=item.title,
                state=item.state,  # type: ignore[arg-type]
                depends_on=item.depends_on,
                required=item.required,
                eligible=dependencies_satisfied(state, item),
                on_critical_path=item.work_item_id in on_path,
                deadline=deadline,
                overdue=item.state != wp.WORK_ITEM_STATE_VERIFIED and from_timestamp(deadline) < now,
                owner_id=item.owner.agent_id if item.owner else "",
                attempts=item.attempts,
                blockers=item.blockers,
                accepted_evidence_ids=item.accepted_evidence_ids,
                child_group_id=item.children[-1].child_group_id if item.children else "",
                child_running=item.running_child is not None,
            )
        )
    required = [
        i for i in state.work_items.values() if i.required and i.state != wp.WORK_ITEM_STATE_CANCELLED
    ]
    out.required_total = len(required)
    out.required_verified = sum(i.state == wp.WORK_ITEM_STATE_VERIFIED for i in required)
    out.budget.CopyFrom(mission.definition.budget)
    out.used.currency = mission.definition.budget.currency
    for dim in SIX:
        setattr(out.used, dim, state.mission_used[dim])
    return out
