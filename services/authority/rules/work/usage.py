"""Six-dimension budgets: usage within the WorkItem's and the Mission's caps, and its event."""

from __future__ import annotations

from missionweave.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from services.authority.rules.common import Emitter, R, budget_dims, invalid, mission_of
from services.authority.rules.work.common import touch
from services.authority.state import SIX, GroupState, WorkItemState

# The usage event's type, as MW-11.5-12 names it (an extension-namespaced core event).
USAGE_RECORDED = "ext.missionweaveprotocol.core.resource_usage_recorded"


def check_usage(
    state: GroupState, item: WorkItemState, delta: common_pb2.ResourceVector, field: str
) -> dict[str, int]:
    """Budgets: a command whose usage would exceed the WorkItem's or the Mission's cap is refused whole.

    OP-02: a dimension the contract leaves out permits zero consumption, not unlimited.
    """
    d = budget_dims(delta)
    if any(v < 0 for v in d.values()):
        raise invalid(field, "usage is never negative")
    if not any(d.values()):
        return d
    if d["financial_micros"] and delta.currency and delta.currency != item.contract.budget.currency:
        raise invalid(f"{field}.currency", f"must be {item.contract.budget.currency}")
    caps = budget_dims(item.contract.budget)
    mission_caps = budget_dims(mission_of(state).definition.budget)
    # A running child Mission's budget is carved out of its WorkItem and the Mission (spec 14).
    child = item.running_child
    held = child.reserved if child else dict.fromkeys(SIX, 0)
    for dim, amount in d.items():
        if item.used[dim] + held[dim] + amount > caps[dim]:
            raise Rejected(
                R.REJECTION_REASON_BUDGET_EXCEEDED,
                f"{dim}: {item.used[dim]} used + {amount} exceeds the WorkItem's budget {caps[dim]}",
                dimension=dim,
                limit=caps[dim],
            )
        if state.mission_used[dim] + state.reserved[dim] + amount > mission_caps[dim]:
            raise Rejected(
                R.REJECTION_REASON_BUDGET_EXCEEDED,
                f"{dim}: the Mission's budget {mission_caps[dim]} would be exceeded",
                dimension=dim,
                limit=mission_caps[dim],
            )
    return d


def record_usage(
    out: Emitter,
    command: command_pb2.Command,
    item: WorkItemState,
    delta: common_pb2.ResourceVector,
    d: dict[str, int],
) -> None:
    if not any(d.values()):
        return
    lease = item.lease
    out.emit(
        USAGE_RECORDED,
        "resource_usage_recorded",
        wp.ResourceUsageRecorded(
            work_item_id=item.work_item_id,
            delta=delta,
            agent_id=command.actor_id,
            lease_id=lease.lease_id if lease else "",
            ownership_epoch=item.owner.ownership_epoch if item.owner else 0,
            execution_session_epoch=lease.session_epoch if lease else 0,
            reporting_session_epoch=command.session_epoch,
            source=wp.USAGE_SOURCE_ONLINE,
            command_id=command.command_id,
        ),
    )


def apply_usage(state: GroupState, event: event_pb2.Event) -> None:
    p = event.resource_usage_recorded
    item = touch(state, event, p.work_item_id)
    for dim in SIX:
        amount = int(getattr(p.delta, dim))
        item.used[dim] += amount
        state.mission_used[dim] += amount
