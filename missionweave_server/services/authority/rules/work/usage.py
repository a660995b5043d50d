"""Six-dimension budgets: usage within the WorkItem's, the Mission's and its grants' caps, and its event."""

from __future__ import annotations

from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.aggregates import committed_by
from missionweave_server.services.authority.rules.common import Emitter, R, budget_dims, invalid, mission_of
from missionweave_server.services.authority.rules.work.common import touch
from missionweave_server.services.authority.state import SIX, GroupState, WorkItemState

# The usage event's type, as MW-11.5-12 names it (an extension-namespaced core event).
USAGE_RECORDED = "ext.missionweaveprotocol.core.resource_usage_recorded"


def usage_problem(item: WorkItemState, delta: common_pb2.ResourceVector) -> tuple[str, str] | None:
    """What is wrong with a reported delta in itself, as (check, field suffix), or None."""
    d = budget_dims(delta)
    if any(v < 0 for v in d.values()):
        return "negative", ""
    if d["financial_micros"] and delta.currency and delta.currency != item.contract.budget.currency:
        return "currency", ".currency"
    return None


def check_usage(
    state: GroupState, item: WorkItemState, delta: common_pb2.ResourceVector, field: str
) -> dict[str, int]:
    """Budgets: a command whose usage would exceed the WorkItem's, the Mission's or an enclosing
    grant's cap, or the contract's cap per attempt or on all retries (CostPolicy, MW-11.4-08), is
    refused whole (MW-10.1-01, MW-11.5-13, OP-21). Metadata `budget` names which ("work_item",
    "mission", "grant" with `grant_id`, "attempt", "retries"), `dimension` the dimension.

    OP-02: a dimension the contract leaves out permits zero consumption, not unlimited.
    """
    problem = usage_problem(item, delta)
    if problem == ("negative", ""):
        raise invalid(field, "usage is never negative")
    if problem is not None:
        raise invalid(f"{field}.currency", f"must be {item.contract.budget.currency}")
    d = budget_dims(delta)
    if not any(d.values()):
        return d
    caps = budget_dims(item.contract.budget)
    mission_caps = budget_dims(mission_of(state).definition.budget)
    grants = [state.grants[g] for g in state.item_grants.get(item.work_item_id, {})]
    # A running child Mission's budget is carved out of its WorkItem and the Mission (spec 14).
    child = item.running_child
    held = child.reserved if child else dict.fromkeys(SIX, 0)
    policy = item.contract.cost_policy
    per_attempt = budget_dims(policy.per_attempt_limit) if policy.HasField("per_attempt_limit") else None
    retries = (
        budget_dims(policy.retry_limit) if policy.HasField("retry_limit") and item.attempts > 1 else None
    )
    for dim, amount in d.items():
        if per_attempt is not None and item.attempt_used[dim] + amount > per_attempt[dim]:
            raise _exceeded(
                "attempt",
                dim,
                per_attempt[dim],
                f"{dim}: {item.attempt_used[dim]} used in this attempt + {amount} exceeds the contract's per-attempt cap {per_attempt[dim]}",
            )
        if retries is not None and item.retry_used[dim] + amount > retries[dim]:
            raise _exceeded(
                "retries",
                dim,
                retries[dim],
                f"{dim}: {item.retry_used[dim]} used by retries + {amount} exceeds the contract's retry cap {retries[dim]}",
            )
        if item.used[dim] + held[dim] + amount > caps[dim]:
            raise _exceeded(
                "work_item",
                dim,
                caps[dim],
                f"{dim}: {item.used[dim]} used + {amount} exceeds the WorkItem's budget {caps[dim]}"
                + (f" ({held[dim]} held for its child Mission)" if held[dim] else ""),
            )
        if state.mission_used[dim] + state.reserved[dim] + amount > mission_caps[dim]:
            raise _exceeded(
                "mission",
                dim,
                mission_caps[dim],
                f"{dim}: the Mission's budget {mission_caps[dim]} would be exceeded",
            )
        for grant in grants:
            if grant.used[dim] + amount > grant.caps[dim]:
                raise _exceeded(
                    "grant",
                    dim,
                    grant.caps[dim],
                    f"{dim}: the work under grant {grant.grant_id} would use more than its cap {grant.caps[dim]}",
                    grant_id=grant.grant_id,
                )
    return d


def check_fits_mission(
    state: GroupState, work_item_id: str, budget: common_pb2.ResourceVector, field: str
) -> None:
    """D162, budgets that add up: a WorkItem's budget (at authorize, and at an offer, with an amended
    contract's) fits in what its Mission has left once every other WorkItem's hold is counted (an
    unfinished one its budget, a finished or failed one what it used). Refused BUDGET_EXCEEDED with
    ``budget`` "mission", the ``dimension`` and what is left (``limit``); nothing is written."""
    caps = budget_dims(mission_of(state).definition.budget)
    wanted = budget_dims(budget)
    item = state.work_items.get(work_item_id)
    own = committed_by(item) if item is not None else (0,) * len(SIX)
    for i, dim in enumerate(SIX):
        need = max(wanted[dim], item.used[dim] if item is not None else 0)
        left = caps[dim] - (state.committed[dim] - own[i])
        if need > left:
            raise _exceeded(
                "mission",
                dim,
                max(left, 0),
                f"{field}.{dim}: the WorkItem asks for {need}; its Mission has {max(left, 0)} left of {caps[dim]} "
                "(the other WorkItems hold the rest; a dimension the Mission leaves out permits nothing, OP-02)",
                field=f"{field}.{dim}",
            )


def _exceeded(budget: str, dim: str, limit: int, message: str, **metadata: object) -> Rejected:
    return Rejected(
        R.REJECTION_REASON_BUDGET_EXCEEDED, message, budget=budget, dimension=dim, limit=limit, **metadata
    )


def record_usage(
    out: Emitter,
    state: GroupState,
    command: command_pb2.Command,
    item: WorkItemState,
    delta: common_pb2.ResourceVector,
    d: dict[str, int],
    offline: wp.BoundedOfflineExecutionBinding | None = None,
) -> None:
    """The usage event of a nonzero delta, with the usage after it (MW-11.5-12 step 1). Offline, it
    names the historical session and lease of the binding beside the reconciling session."""
    if not any(d.values()):
        return
    lease = item.lease
    if offline is not None:
        lease_id, epoch, session = (
            offline.historical_lease_id,
            offline.ownership_epoch,
            offline.original_session_epoch,
        )
    else:
        lease_id = lease.lease_id if lease else ""
        epoch = item.owner.ownership_epoch if item.owner else 0
        session = lease.session_epoch if lease else 0
    currency = item.contract.budget.currency
    out.emit(
        USAGE_RECORDED,
        "resource_usage_recorded",
        wp.ResourceUsageRecorded(
            work_item_id=item.work_item_id,
            delta=delta,
            agent_id=command.actor_id,
            lease_id=lease_id,
            ownership_epoch=epoch,
            execution_session_epoch=session,
            reporting_session_epoch=command.session_epoch,
            source=wp.USAGE_SOURCE_OFFLINE_RECONCILIATION if offline is not None else wp.USAGE_SOURCE_ONLINE,
            command_id=command.command_id,
            work_item_used=_vector({dim: item.used[dim] + d[dim] for dim in SIX}, currency),
            mission_used=_vector({dim: state.mission_used[dim] + d[dim] for dim in SIX}, currency),
        ),
    )


def _vector(dims: dict[str, int], currency: str) -> common_pb2.ResourceVector:
    return common_pb2.ResourceVector(currency=currency, **dims)  # type: ignore[arg-type]


def apply_usage(state: GroupState, event: event_pb2.Event) -> None:
    p = event.resource_usage_recorded
    item = touch(state, event, p.work_item_id)
    for dim in SIX:
        amount = int(getattr(p.delta, dim))
        item.used[dim] += amount
        item.attempt_used[dim] += amount
        if item.attempts > 1:
            item.retry_used[dim] += amount
        state.mission_used[dim] += amount
        for grant_id in state.item_grants.get(item.work_item_id, {}):
            state.grants[grant_id].used[dim] += amount
