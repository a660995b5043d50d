"""WorkContracts (MW-10.1-01/07) and dependencies (MW-10.4-03/04): validation, cycles, eligibility."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from missionweave.kernel import ids
from missionweave.kernel.clock import from_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import DecisionContext, R, invalid, mission_of
from missionweave_server.services.authority.rules.scope import check_child_contract
from missionweave_server.services.authority.rules.work.common import (
    CANCELLED,
    FAILED,
    VERIFIED,
    policy_duration,
)
from missionweave_server.services.authority.state import GroupState, WorkItemState

MAX_IMPACT_NOTE = 256


def validate_contract(contract: wp.WorkContract, state: GroupState, ctx: DecisionContext, field: str) -> None:
    """MW-10.1-01 / MW-10.1-07: every item is a machine-readable field; prose never replaces one."""
    if not 1 <= len(contract.goal) <= 4096:
        raise invalid(f"{field}.goal", "a goal of 1..4096 characters is required")
    if not contract.deliverables:
        raise invalid(f"{field}.deliverables", "at least one deliverable is required")
    for i, d in enumerate(contract.deliverables):
        if not ids.is_valid(d.deliverable_id) or not d.description:
            raise invalid(f"{field}.deliverables[{i}]", "deliverable_id and description are required")
    if not contract.acceptance_criteria:
        raise invalid(f"{field}.acceptance_criteria", "at least one acceptance criterion is required")
    for i, c in enumerate(contract.acceptance_criteria):
        if not ids.is_valid(c.criterion_id) or not c.description or not c.required_evidence_methods:
            raise invalid(
                f"{field}.acceptance_criteria[{i}]",
                "criterion_id, description and the required Evidence methods",
            )
    for i, dep in enumerate(contract.depends_on_work_item_ids):
        if dep not in state.work_items:
            raise Rejected(
                R.REJECTION_REASON_NOT_FOUND, f"{field}.depends_on_work_item_ids[{i}]: no WorkItem {dep}"
            )
    for i, cap in enumerate(contract.required_capabilities):
        if not cap.capability_id or not cap.version:
            raise invalid(f"{field}.required_capabilities[{i}]", "capability id and version are required")
    if not contract.HasField("deadline") or from_timestamp(contract.deadline) <= ctx.now:
        raise invalid(f"{field}.deadline", "a deadline in the future is required")
    if not contract.urgency or not contract.business_impact:
        raise invalid(f"{field}.urgency", "urgency and business impact are required")
    if len(contract.business_impact_note) > MAX_IMPACT_NOTE:
        raise invalid(f"{field}.business_impact_note", f"at most {MAX_IMPACT_NOTE} characters")
    if not contract.HasField("budget"):
        raise invalid(f"{field}.budget", "a budget is required (omitted dimensions permit no use, OP-02)")
    if contract.budget.financial_micros and len(contract.budget.currency) != 3:
        raise invalid(f"{field}.budget.currency", "an ISO 4217 code is required for a financial budget")
    if (
        contract.budget.financial_micros
        and contract.budget.currency != mission_of(state).definition.budget.currency
    ):
        raise invalid(f"{field}.budget.currency", "must be the Mission budget's currency")
    if not contract.HasField("retry_policy") or contract.retry_policy.max_attempts < 1:
        raise invalid(
            f"{field}.retry_policy.max_attempts", "a retry policy with at least one attempt is required"
        )
    if not contract.HasField("time_policy"):
        raise invalid(f"{field}.time_policy", "a time policy (start deadline, lease durations) is required")
    for name in (
        "start_deadline",
        "execution_lease_duration",
        "checkpoint_ownership_duration",
        "blocked_lease_duration",
    ):
        # Checked here, not first when the lease is granted: the default only stands in for an unset one.
        policy_duration(getattr(contract.time_policy, name), timedelta(0), f"{field}.time_policy.{name}")
    if not contract.HasField("cost_policy"):
        raise invalid(f"{field}.cost_policy", "a cost policy is required")
    if not contract.risk_class:
        raise invalid(f"{field}.risk_class", "a risk classification is required")
    if len(contract.notes) > 16 * 1024:
        raise invalid(f"{field}.notes", "at most 16 KiB of prose")
    check_child_contract(state, contract, field)  # a child Mission's work stays in its scope (MW-14-04)


def would_cycle(state: GroupState, work_item_id: str, depends_on: Iterable[str]) -> bool:
    """MW-10.4-04: does making ``work_item_id`` depend on ``depends_on`` close a cycle?"""
    stack, seen = list(depends_on), set()
    while stack:
        current = stack.pop()
        if current == work_item_id:
            return True
        if current in seen:
            continue
        seen.add(current)
        other = state.work_items.get(current)
        if other is not None:
            stack.extend(other.depends_on)
    return False


def dependencies_satisfied(state: GroupState, item: WorkItemState) -> bool:
    """MW-10.4-03: eligible only when the declared dependencies satisfy the contract's policy."""
    if not item.depends_on:
        return True
    deps = [state.work_items[d] for d in item.depends_on]
    verified = sum(d.state == VERIFIED for d in deps)
    policy = item.contract.dependency_policy
    kind = policy.kind or wp.DEPENDENCY_POLICY_KIND_ALL_VERIFIED
    if kind == wp.DEPENDENCY_POLICY_KIND_ALL_TERMINAL:
        return all(d.state in (VERIFIED, CANCELLED, FAILED) for d in deps)
    if kind == wp.DEPENDENCY_POLICY_KIND_ANY_VERIFIED:
        return verified >= 1
    if kind == wp.DEPENDENCY_POLICY_KIND_MIN_VERIFIED:
        return verified >= max(1, policy.min_verified)
    return verified == len(deps)


def require_dependencies(state: GroupState, item: WorkItemState, name: str) -> None:
    if not dependencies_satisfied(state, item):
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"{name}: the dependencies of {item.work_item_id} do not satisfy its dependency policy yet (MW-10.4-03)",
        )
