"""WorkItems (spec 10, 11.3, 11.4): contracts, the state machine MW-10.2-T01..T14/T18, offers and
ownership, fenced execution leases, dependencies and six-dimension budgets."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from google.protobuf.duration_pb2 import Duration

from missionweave import ids
from missionweave.clock import from_timestamp, to_timestamp
from missionweave.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, conversation_pb2, event_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from services.authority.rules.common import (
    Applier,
    DecisionContext,
    Emitter,
    Handler,
    R,
    Role,
    check_artifact_refs,
    invalid,
    mission_of,
    require_reason,
)
from services.authority.rules.missions import require_coordinator, require_live
from services.authority.state import (
    SIX,
    ExecutionLeaseState,
    GroupState,
    OfferState,
    OwnershipState,
    ProposalState,
    WorkItemState,
)

WS = wp.WorkItemState
OPEN, OFFERED, QUEUED, ACTIVE = (
    WS.WORK_ITEM_STATE_OPEN,
    WS.WORK_ITEM_STATE_OFFERED,
    WS.WORK_ITEM_STATE_QUEUED,
    WS.WORK_ITEM_STATE_ACTIVE,
)
BLOCKED, SUBMITTED, VERIFIED = (
    WS.WORK_ITEM_STATE_BLOCKED,
    WS.WORK_ITEM_STATE_SUBMITTED,
    WS.WORK_ITEM_STATE_VERIFIED,
)
FAILED, CANCELLED = WS.WORK_ITEM_STATE_FAILED, WS.WORK_ITEM_STATE_CANCELLED
TERMINAL = frozenset({VERIFIED, CANCELLED})  # MW-10.2-02
UNFINISHED = frozenset({OPEN, OFFERED, QUEUED, ACTIVE, BLOCKED, SUBMITTED})  # rows T13, T14, T18
OFFERABLE = frozenset({OPEN, OFFERED, QUEUED, ACTIVE, BLOCKED, FAILED})  # row T03

DEFAULT_START_DEADLINE = timedelta(minutes=10)
DEFAULT_EXECUTION_LEASE = timedelta(minutes=5)
DEFAULT_CHECKPOINT_OWNERSHIP = timedelta(minutes=30)
DEFAULT_BLOCKED_LEASE = timedelta(hours=1)
MAX_LEASE = timedelta(hours=24)
MAX_CANDIDATES = 8  # MW-10.3-04: a bounded candidate set for urgent placement


def state_name(value: int) -> str:
    return WS.Name(WS.ValueType(value)).removeprefix("WORK_ITEM_STATE_").lower()


# ---------------------------------------------------------------- checks


def _item(state: GroupState, work_item_id: str) -> WorkItemState:
    item = state.work_items.get(work_item_id)
    if item is None:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND, f"no WorkItem {work_item_id!r} in this Group", field="work_item_id"
        )
    return item


def _require_state(item: WorkItemState, allowed: Iterable[int], name: str) -> None:
    """MW-10.2-05: only the table's transitions; terminal states are never left (MW-10.2-02)."""
    if item.state in TERMINAL:
        raise Rejected(
            R.REJECTION_REASON_TERMINAL_STATE,
            f"{name}: WorkItem {item.work_item_id} is {state_name(item.state)}, terminal for its revision",
        )
    if item.state not in allowed:
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION,
            f"{name} is not allowed from {state_name(item.state)} (MW-10.2-05)",
            state=state_name(item.state),
        )


def _coordination(
    state: GroupState,
    command: command_pb2.Command,
    ctx: DecisionContext,
    epoch: int,
    name: str,
    *,
    emergency: bool = False,
    override_reason: str = "",
) -> int:
    """The current Coordinator epoch, or the MissionOwner's audited emergency override (MW-7.1-13)."""
    if emergency:
        if command.actor_id != mission_of(state).owner_id:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED, "only the MissionOwner uses the emergency override"
            )
        require_reason(override_reason, "body.override_reason")
        return wp.WORK_ACTOR_ROLE_MISSION_OWNER
    require_coordinator(state, command, ctx, epoch, name)
    return wp.WORK_ACTOR_ROLE_COORDINATOR


def _require_lease(
    item: WorkItemState, command: command_pb2.Command, ctx: DecisionContext, lease_id: str, epoch: int
) -> None:
    """MW-11.3-04/05: the owner, its ownership epoch and the *current* execution lease id."""
    owner = item.owner
    if owner is None or command.actor_id != owner.agent_id:
        raise Rejected(
            R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE if epoch else R.REJECTION_REASON_PERMISSION_DENIED,
            f"{command.actor_id} does not own WorkItem {item.work_item_id}",
        )
    if epoch != owner.ownership_epoch:
        raise Rejected(
            R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE,
            f"ownership epoch {epoch} is not the current {owner.ownership_epoch}",
            current_epoch=owner.ownership_epoch,
        )
    lease = item.lease
    if lease is None or lease_id != lease.lease_id:
        raise Rejected(
            R.REJECTION_REASON_LEASE_STALE,
            f"lease {lease_id!r} is not the current execution lease of {item.work_item_id} (MW-11.3-05)",
        )
    if lease.expires_at <= ctx.now:
        raise Rejected(
            R.REJECTION_REASON_LEASE_EXPIRED, f"lease {lease_id} expired at {lease.expires_at.isoformat()}"
        )
    if command.session_epoch != lease.session_epoch:
        raise Rejected(
            R.REJECTION_REASON_LEASE_STALE, f"lease {lease_id} belongs to session {lease.session_epoch}"
        )


def _replaced_session_lease(item: WorkItemState, command: command_pb2.Command) -> bool:
    """The owner restarted: its ACTIVE lease belongs to an older session of the same agent."""
    lease = item.lease
    return (
        item.state == ACTIVE
        and lease is not None
        and lease.agent_id == command.actor_id
        and lease.session_epoch < command.session_epoch
    )


def _retry_at(item: WorkItemState, now: datetime) -> datetime | None:
    """When the next attempt may start, or None once the retry budgets are spent (MW-11.4-08)."""
    policy = item.contract.retry_policy
    if item.attempts >= policy.max_attempts:
        return None
    initial = _duration(policy.initial_backoff, timedelta(seconds=1), "retry_policy.initial_backoff")
    ceiling = _duration(policy.max_backoff, timedelta(minutes=5), "retry_policy.max_backoff")
    factor = (policy.backoff_multiplier_milli or 2000) / 1000
    retry_at = now + min(ceiling, initial * factor ** max(0, item.attempts - 1))
    deadlines = [from_timestamp(item.contract.deadline)]
    if policy.HasField("retry_deadline"):
        deadlines.append(from_timestamp(policy.retry_deadline))
    return retry_at if retry_at < min(deadlines) else None


_SCOPE_FIELDS = ("allowed_tools", "allowed_data", "allowed_operations", "allowed_egress_hosts")


def _narrow(
    requested: wp.ExecutionPermissions, allowed: wp.ExecutionPermissions, field: str
) -> wp.ExecutionPermissions:
    """MW-11.3-06: a token's scope is the allowed one, or a subset of it; never wider."""
    if not any(getattr(requested, f) for f in _SCOPE_FIELDS):
        scope = wp.ExecutionPermissions()
        scope.CopyFrom(allowed)
        return scope
    for f in _SCOPE_FIELDS:
        extra = set(getattr(requested, f)) - set(getattr(allowed, f))
        if extra:
            raise invalid(
                f"{field}.{f}", f"{', '.join(sorted(extra))} exceed the permitted scope; a token only narrows"
            )
    return requested


def _token(
    command: command_pb2.Command,
    item: WorkItemState,
    lease_id: str,
    epoch: int,
    scope: wp.ExecutionPermissions,
    now: datetime,
    expires: datetime,
    replaces: str = "",
    spending: dict[str, int] | None = None,
) -> wp.CapabilityToken:
    """A capability token bound to the execution lease, expiring with it (MW-11.3-06/07, OP-18)."""
    remaining = common_pb2.ResourceVector(currency=item.contract.budget.currency)
    for dim in SIX:
        spent = item.used[dim] + (spending or {}).get(dim, 0)  # including this command's own usage
        setattr(remaining, dim, max(0, int(getattr(item.contract.budget, dim)) - spent))
    return wp.CapabilityToken(
        token_id=ids.derived_id("tok", command.group_id, command.command_id),
        lease_id=lease_id,
        agent_id=command.actor_id,
        work_item_id=item.work_item_id,
        ownership_epoch=epoch,
        scope=scope,
        limit=remaining,
        issued_at=to_timestamp(now),
        expires_at=to_timestamp(expires),
        replaces_token_id=replaces,
        issuer_id="group-authority",
    )


def token_valid(state: GroupState, token_id: str, now: datetime) -> bool:
    """Whether a capability token is the current one of a live lease (released, expired, revoked or
    rotated tokens are not: OP-18)."""
    for item in state.work_items.values():
        lease = item.lease
        if lease is not None and lease.token_id == token_id:
            return lease.expires_at > now
    return False


def _live_owner(item: WorkItemState, now: datetime) -> bool:
    return item.owner is not None and item.owner.expires_at > now


def _duration(value: Duration, default: timedelta, field: str) -> timedelta:
    if not value.seconds and not value.nanos:
        return default
    d = value.ToTimedelta()
    if not timedelta(seconds=1) <= d <= MAX_LEASE:
        raise invalid(field, "must lie within 1 s .. 24 h")
    return d


def _budget_dims(vector: common_pb2.ResourceVector) -> dict[str, int]:
    return {dim: int(getattr(vector, dim)) for dim in SIX}


def _check_usage(
    state: GroupState, item: WorkItemState, delta: common_pb2.ResourceVector, field: str
) -> dict[str, int]:
    """Budgets: a command whose usage would exceed the WorkItem's or the Mission's cap is refused whole.

    OP-02: a dimension the contract leaves out permits zero consumption, not unlimited.
    """
    d = _budget_dims(delta)
    if any(v < 0 for v in d.values()):
        raise invalid(field, "usage is never negative")
    if not any(d.values()):
        return d
    if d["financial_micros"] and delta.currency and delta.currency != item.contract.budget.currency:
        raise invalid(f"{field}.currency", f"must be {item.contract.budget.currency}")
    caps = _budget_dims(item.contract.budget)
    mission_caps = _budget_dims(mission_of(state).definition.budget)
    for dim, amount in d.items():
        if item.used[dim] + amount > caps[dim]:
            raise Rejected(
                R.REJECTION_REASON_BUDGET_EXCEEDED,
                f"{dim}: {item.used[dim]} used + {amount} exceeds the WorkItem's budget {caps[dim]}",
                dimension=dim,
                limit=caps[dim],
            )
        if state.mission_used[dim] + amount > mission_caps[dim]:
            raise Rejected(
                R.REJECTION_REASON_BUDGET_EXCEEDED,
                f"{dim}: the Mission's budget {mission_caps[dim]} would be exceeded",
                dimension=dim,
                limit=mission_caps[dim],
            )
    return d


def _record_usage(
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
        "resource.usage_recorded",
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
    if not contract.HasField("cost_policy"):
        raise invalid(f"{field}.cost_policy", "a cost policy is required")
    if not contract.risk_class:
        raise invalid(f"{field}.risk_class", "a risk classification is required")
    if len(contract.notes) > 16 * 1024:
        raise invalid(f"{field}.notes", "at most 16 KiB of prose")


def _would_cycle(state: GroupState, work_item_id: str, depends_on: Iterable[str]) -> bool:
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


def _require_dependencies(state: GroupState, item: WorkItemState, name: str) -> None:
    if not dependencies_satisfied(state, item):
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"{name}: the dependencies of {item.work_item_id} do not satisfy its dependency policy yet (MW-10.4-03)",
        )


def _ownership(
    item: WorkItemState,
    agent_id: str,
    epoch: int,
    now: datetime,
    lease: timedelta,
    kind: int,
    offer_id: str = "",
) -> wp.OwnershipGrant:
    start_deadline = now + _duration(
        item.contract.time_policy.start_deadline, DEFAULT_START_DEADLINE, "time_policy.start_deadline"
    )
    return wp.OwnershipGrant(
        work_item_id=item.work_item_id,
        agent_id=agent_id,
        ownership_epoch=epoch,
        granted_at=to_timestamp(now),
        start_deadline=to_timestamp(start_deadline),
        lease_kind=kind,  # type: ignore[arg-type]
        expires_at=to_timestamp(now + lease),
        offer_id=offer_id,
        contract_revision=item.contract_revision,
    )


# ---------------------------------------------------------------- T01, T02: propose, authorize


def work_propose(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T01 / MW-9-13 / MW-9.1-17: any Group member proposes; no WorkItem exists yet."""
    assert state is not None
    body = command.work_propose
    require_live(mission_of(state), "work.propose")
    proposal_id = body.proposal_id or ids.derived_id("prop", command.group_id, command.command_id)
    if not ids.is_valid(proposal_id) or proposal_id in state.proposals:
        raise invalid("body.proposal_id", "a valid id not yet used in this Group")
    if not 1 <= len(body.title) <= 200:
        raise invalid("body.title", "1..200 characters required")
    if body.parent_work_item_id:
        _item(state, body.parent_work_item_id)
    out.emit(
        "work.proposed",
        "work_proposed",
        wp.WorkProposed(
            proposal_id=proposal_id,
            title=body.title,
            contract=body.contract,
            parent_work_item_id=body.parent_work_item_id,
            rationale=body.rationale,
        ),
    )


def work_authorize(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T02 / MW-9-02: the Coordinator (or the owner's override) creates the WorkItem and its Conversation."""
    assert state is not None
    body = command.work_authorize
    require_live(mission_of(state), "work.authorize")
    if body.grant_id:
        raise Rejected(
            R.REJECTION_REASON_COMMAND_NOT_IMPLEMENTED, "delegation grants arrive with the delegation rules"
        )
    _coordination(
        state,
        command,
        ctx,
        body.coordinator_epoch,
        "work.authorize",
        emergency=body.emergency_override,
        override_reason=body.override_reason,
    )
    work_item_id = body.work_item_id or ids.derived_id("wi", command.group_id, command.command_id)
    if not ids.is_valid(work_item_id) or work_item_id in state.work_items:
        raise invalid("body.work_item_id", "a valid id not yet used in this Group")
    if not 1 <= len(body.title) <= 200:
        raise invalid("body.title", "1..200 characters required")
    if body.proposal_id:
        proposal = state.proposals.get(body.proposal_id)
        if proposal is None or not proposal.open:
            raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no open proposal {body.proposal_id}")
    if body.parent_work_item_id:
        _item(state, body.parent_work_item_id)
    validate_contract(body.contract, state, ctx, "body.contract")
    conversation_id = ids.derived_id("conv", command.group_id, work_item_id)
    contract = wp.WorkContract()
    contract.CopyFrom(body.contract)
    contract.revision = 1
    out.emit(
        "work.authorized",
        "work_authorized",
        wp.WorkAuthorized(
            work_item_id=work_item_id,
            title=body.title,
            contract=contract,
            proposal_id=body.proposal_id,
            parent_work_item_id=body.parent_work_item_id,
            conversation_id=conversation_id,
            coordinator_epoch=body.coordinator_epoch,
            emergency_override=body.emergency_override,
            override_reason=body.override_reason,
        ),
    )
    out.emit(
        "conversation.opened",
        "conversation_opened",
        conversation_pb2.ConversationOpened(
            conversation_id=conversation_id,
            kind=conversation_pb2.CONVERSATION_KIND_WORK_ITEM,
            work_item_id=work_item_id,
            title=body.title,
        ),
    )


# ---------------------------------------------------------------- T03..T05: offers and ownership


def work_offer(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T03 / MW-10.3-02/04/10/11: a durable offer to a bounded candidate set, never to a live owner."""
    assert state is not None
    body = command.work_offer
    require_live(mission_of(state), "work.offer")
    if body.grant_id:
        raise Rejected(
            R.REJECTION_REASON_COMMAND_NOT_IMPLEMENTED, "delegation grants arrive with the delegation rules"
        )
    _coordination(
        state,
        command,
        ctx,
        body.coordinator_epoch,
        "work.offer",
        emergency=body.emergency_override,
        override_reason=body.override_reason,
    )
    item = _item(state, body.work_item_id)
    _require_state(item, OFFERABLE, "work.offer")
    if _live_owner(item, ctx.now):
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION,
            f"{item.work_item_id} has a live owner ({item.owner.agent_id if item.owner else ''}); offers need none (OP-11)",
        )
    if not 1 <= len(body.candidate_ids) <= MAX_CANDIDATES or len(set(body.candidate_ids)) != len(
        body.candidate_ids
    ):
        raise invalid("body.candidate_ids", f"1..{MAX_CANDIDATES} distinct candidates")
    for i, cid in enumerate(body.candidate_ids):
        member = state.members.get(cid)
        if member is None or not member.active:
            raise invalid(f"body.candidate_ids[{i}]", f"{cid} holds no active Membership in this Group")
    _check_selection_criteria(body)
    if not body.HasField("expires_at") or from_timestamp(body.expires_at) <= ctx.now:
        raise invalid("body.expires_at", "an offer expiry in the future is required")
    revision = item.contract_revision
    if body.HasField("amended_contract"):
        validate_contract(body.amended_contract, state, ctx, "body.amended_contract")
        if _would_cycle(state, item.work_item_id, body.amended_contract.depends_on_work_item_ids):
            raise Rejected(
                R.REJECTION_REASON_DEPENDENCY_CYCLE,
                f"the amended dependencies of {item.work_item_id} form a cycle",
            )
        revision += 1  # MW-10.1-05: a material revision needs a fresh acceptance
    offer_id = body.offer_id or ids.derived_id("offer", command.group_id, command.command_id)
    if body.extends_offer_id:
        extended = item.offers.get(body.extends_offer_id)
        if extended is None or not extended.open:
            raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no open offer {body.extends_offer_id} to extend")
        offer_id = body.extends_offer_id
    elif not ids.is_valid(offer_id) or offer_id in item.offers:
        raise invalid("body.offer_id", "a valid id not yet used for this WorkItem")
    if revision == item.contract_revision:
        _require_dependencies(state, item, "work.offer")
    if item.owner is not None:  # an expired owner is fenced before the offer takes effect (T03, OP-11)
        _revoke(out, item, wp.LEASE_REVOCATION_CAUSE_EXPIRY_FENCED, item.state)
    superseded = [o.offer_id for o in item.offers.values() if o.open and o.offer_id != offer_id]
    if superseded:
        reason = (
            wp.OFFER_WITHDRAWAL_REASON_CONTRACT_REVISED
            if revision != item.contract_revision
            else wp.OFFER_WITHDRAWAL_REASON_SUPERSEDED
        )
        _withdraw(out, item, superseded, reason)
    amended = wp.WorkContract()
    if body.HasField("amended_contract"):
        amended.CopyFrom(body.amended_contract)
        amended.revision = revision
    out.emit(
        "work.offered",
        "work_offered",
        wp.WorkOffered(
            work_item_id=item.work_item_id,
            offer_id=offer_id,
            candidate_ids=body.candidate_ids,
            expires_at=body.expires_at,
            contract_revision=revision,
            amended_contract=amended if body.HasField("amended_contract") else None,
            selection_criteria=body.selection_criteria,
            context_package=body.context_package if body.HasField("context_package") else None,
            extends_offer_id=body.extends_offer_id,
            coordinator_epoch=body.coordinator_epoch,
            emergency_override=body.emergency_override,
            override_reason=body.override_reason,
            previous_state=item.state,  # type: ignore[arg-type]
        ),
    )


def _check_selection_criteria(body: wp.WorkOffer) -> None:
    """MW-10.3-10/11: one structured record per candidate; rule ids, never free-form reasoning."""
    by_candidate = {c.candidate_id: c for c in body.selection_criteria}
    for i, cid in enumerate(body.candidate_ids):
        if cid not in by_candidate:
            raise invalid(
                f"body.selection_criteria[{i}]",
                f"structured selection criteria for {cid} are required (MW-10.3-10)",
            )
    for i, c in enumerate(body.selection_criteria):
        if c.candidate_id not in body.candidate_ids:
            raise invalid(f"body.selection_criteria[{i}].candidate_id", "not a candidate of this offer")
        if not c.applied_policy_rules:
            raise invalid(
                f"body.selection_criteria[{i}].applied_policy_rules", "name the policy rules applied"
            )
        for j, text in enumerate([*c.applied_policy_rules, *c.authorization_basis]):
            if not ids.is_valid(text):
                raise invalid(
                    f"body.selection_criteria[{i}]",
                    f"entry {j} is not a rule/basis id; selection records hold no free-form reasoning (MW-10.3-11)",
                )


def _withdraw(out: Emitter, item: WorkItemState, offer_ids: list[str], reason: int, winner: str = "") -> None:
    candidates = sorted({c for oid in offer_ids for c in item.offers[oid].candidate_ids})
    out.emit(
        "work.offers_withdrawn",
        "work_offers_withdrawn",
        wp.WorkOffersWithdrawn(
            work_item_id=item.work_item_id,
            offer_ids=offer_ids,
            candidate_ids=candidates,
            reason=reason,  # type: ignore[arg-type]
            winning_offer_id=winner,  # type: ignore[arg-type]
        ),
    )


def _revoke(
    out: Emitter,
    item: WorkItemState,
    cause: int,
    resulting_state: int,
    *,
    retry_not_before: datetime | None = None,
) -> None:
    """MW-11.3-08: revoke the owner's lease (ownership, and the execution lease if one is running)."""
    owner = item.owner
    assert owner is not None
    lease = item.lease
    out.emit(
        "work.lease_revoked",
        "lease_revoked",
        wp.LeaseRevoked(
            work_item_id=item.work_item_id,
            lease_kind=wp.WORK_LEASE_KIND_EXECUTION if lease else wp.WORK_LEASE_KIND_OWNERSHIP,
            lease_id=lease.lease_id if lease else "",
            ownership_epoch=owner.ownership_epoch,
            agent_id=owner.agent_id,
            session_epoch=lease.session_epoch if lease else 0,
            end_kind=wp.LEASE_END_KIND_REVOKED,
            cause=cause,  # type: ignore[arg-type]
            resulting_state=resulting_state,  # type: ignore[arg-type]
            retry_not_before=to_timestamp(retry_not_before) if retry_not_before else None,
            revoked_token_ids=[lease.token_id] if lease and lease.token_id else [],
        ),
    )


def work_accept_offer(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T04/T05 / MW-10.3-05: the first valid acceptance wins a new ownership epoch atomically."""
    assert state is not None
    body = command.work_accept_offer
    item = _item(state, body.work_item_id)
    offer = item.offers.get(body.offer_id)
    if offer is None:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no offer {body.offer_id} for {item.work_item_id}")
    if command.actor_id not in offer.candidate_ids:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED, f"{command.actor_id} is not a candidate of {body.offer_id}"
        )
    if not offer.open:
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION,
            f"offer {body.offer_id} was withdrawn (another acceptance won or it was superseded)",
        )
    _require_state(item, (OFFERED,), "work.accept_offer")
    if offer.expires_at <= ctx.now:  # T05: expiry changes nothing and appends nothing, but acceptance fails
        raise Rejected(
            R.REJECTION_REASON_OFFER_EXPIRED,
            f"offer {body.offer_id} expired at {offer.expires_at.isoformat()}",
        )
    if body.contract_revision != item.contract_revision:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"accept contract revision {item.contract_revision}, not {body.contract_revision} (MW-10.1-05)",
            current_revision=item.contract_revision,
        )
    if item.open_ambiguities:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"material ambiguities are unresolved ({', '.join(sorted(item.open_ambiguities))}); the Coordinator "
            "amends the contract or replaces the WorkItem first (MW-10.1-03/04)",
        )
    # MW-10.3-07, the part the Authority can check for the Worker: capability, deadline, dependencies.
    if from_timestamp(item.contract.deadline) <= ctx.now:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED, f"the deadline of {item.work_item_id} has passed"
        )
    _require_dependencies(state, item, "work.accept_offer")
    member = state.members[command.actor_id]
    have = dict(member.capabilities)
    for cap in item.contract.required_capabilities:
        if cap.capability_id not in have or _version(have[cap.capability_id]) < _version(cap.version):
            raise Rejected(
                R.REJECTION_REASON_PRECONDITION_FAILED,
                f"{command.actor_id} lacks capability {cap.capability_id} >= {cap.version}",
            )
    epoch = item.last_ownership_epoch + 1
    lease = _duration(
        item.contract.time_policy.start_deadline, DEFAULT_START_DEADLINE, "time_policy.start_deadline"
    )
    criteria = next(
        (c for c in item.offer_criteria.get(body.offer_id, ()) if c.candidate_id == command.actor_id), None
    )
    out.emit(
        "work.offer_accepted",
        "work_offer_accepted",
        wp.WorkOfferAccepted(
            work_item_id=item.work_item_id,
            offer_id=body.offer_id,
            agent_id=command.actor_id,
            ownership=_ownership(
                item, command.actor_id, epoch, ctx.now, lease, wp.WORK_LEASE_KIND_OWNERSHIP, body.offer_id
            ),
            selection_criteria=criteria,
            schedule=body.schedule if body.HasField("schedule") else None,
        ),
    )
    losers = [o.offer_id for o in item.offers.values() if o.open and o.offer_id != body.offer_id]
    if losers or len(offer.candidate_ids) > 1:
        _withdraw(
            out,
            item,
            [*losers, body.offer_id],
            wp.OFFER_WITHDRAWAL_REASON_ACCEPTED_ELSEWHERE,
            winner=body.offer_id,
        )


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def work_decline_offer(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.3-08/09: a candidate declines with a structured reason."""
    assert state is not None
    body = command.work_decline_offer
    item = _item(state, body.work_item_id)
    offer = item.offers.get(body.offer_id)
    if offer is None or not offer.open:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no open offer {body.offer_id}")
    if command.actor_id not in offer.candidate_ids:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED, f"{command.actor_id} is not a candidate of {body.offer_id}"
        )
    if not body.decline.reason:
        raise invalid("body.decline.reason", "a structured reason is required")
    out.emit(
        "work.offer_declined",
        "work_offer_declined",
        wp.WorkOfferDeclined(
            work_item_id=item.work_item_id,
            offer_id=body.offer_id,
            agent_id=command.actor_id,
            decline=body.decline,
        ),
    )


# ---------------------------------------------------------------- T06, T07: approval gate and start


def approval_grant_execution(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T06: satisfies the start gate of a queued WorkItem without executing anything."""
    assert state is not None
    body = command.approval_grant_execution
    item = _item(state, body.work_item_id)
    _require_state(item, (QUEUED,), "approval.grant_execution")
    approvers = list(item.contract.execution_approver_ids) or [mission_of(state).owner_id]
    if command.actor_id not in approvers:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED, f"execution approval is given by {', '.join(approvers)}"
        )
    if (
        body.contract_revision != item.contract_revision
        or item.owner is None
        or body.ownership_epoch != item.owner.ownership_epoch
    ):
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            "approval names the current contract revision and ownership epoch",
        )
    out.emit(
        "approval.execution_granted",
        "execution_approval_granted",
        wp.ExecutionApprovalGranted(
            work_item_id=item.work_item_id,
            contract_revision=body.contract_revision,
            ownership_epoch=body.ownership_epoch,
            approver_id=command.actor_id,
            expires_at=body.expires_at if body.HasField("expires_at") else None,
            comment=body.comment,
        ),
    )


def work_start(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T07 / MW-11.3-02/03: the owner starts under a new execution lease with a stable id."""
    assert state is not None
    body = command.work_start
    require_live(mission_of(state), "work.start")
    item = _item(state, body.work_item_id)
    replaced = _replaced_session_lease(item, command)
    if not replaced:
        _require_state(item, (QUEUED,), "work.start")
    owner = item.owner
    if owner is None or owner.agent_id != command.actor_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED, f"{command.actor_id} does not own {item.work_item_id}"
        )
    if body.ownership_epoch != owner.ownership_epoch:
        raise Rejected(
            R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE,
            f"ownership epoch {owner.ownership_epoch} is current",
            current_epoch=owner.ownership_epoch,
        )
    if owner.expires_at <= ctx.now or (
        item.lease is None and item.last_checkpoint_id == "" and owner.start_deadline <= ctx.now
    ):
        raise Rejected(
            R.REJECTION_REASON_LEASE_EXPIRED,
            "the ownership lease (start deadline) has passed; the Coordinator re-offers",
        )
    if item.contract.requires_execution_approval and item.execution_approved != (
        item.contract_revision,
        owner.ownership_epoch,
    ):
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            "this WorkItem needs approval.grant_execution before it starts",
        )
    _require_dependencies(state, item, "work.start")
    if item.retry_not_before is not None and ctx.now < item.retry_not_before:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"backing off after a transient failure until {item.retry_not_before.isoformat()} (MW-11.4-08)",
            retry_not_before=item.retry_not_before.isoformat(),
        )
    if item.attempts >= item.contract.retry_policy.max_attempts:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"{item.attempts} attempts used of {item.contract.retry_policy.max_attempts} (MW-11.4-08); fail the WorkItem",
        )
    if replaced:
        # MW-11.3-09: the old session's lease is revoked and the WorkItem is queued again, in the same
        # append and before the new runtime's lease begins.
        _revoke(out, item, wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED, QUEUED)
    lease_id = body.lease_id or ids.derived_id("lease", command.group_id, command.command_id)
    if not ids.is_valid(lease_id):
        raise invalid("body.lease_id", "not a valid id")
    policy = _duration(
        item.contract.time_policy.execution_lease_duration,
        DEFAULT_EXECUTION_LEASE,
        "time_policy.execution_lease_duration",
    )
    duration = min(policy, _duration(body.requested_duration, policy, "body.requested_duration"))
    scope = _narrow(body.requested_scope, item.contract.permissions, "body.requested_scope")
    token = _token(command, item, lease_id, owner.ownership_epoch, scope, ctx.now, ctx.now + duration)
    out.emit(
        "work.started",
        "work_started",
        wp.WorkStarted(
            work_item_id=item.work_item_id,
            lease=wp.ExecutionLease(
                lease_id=lease_id,
                agent_id=command.actor_id,
                session_epoch=command.session_epoch,
                work_item_id=item.work_item_id,
                ownership_epoch=owner.ownership_epoch,
                started_at=to_timestamp(ctx.now),
                expires_at=to_timestamp(ctx.now + duration),
                attempt=item.attempts + 1,
            ),
            resume_from_checkpoint_id=body.resume_from_checkpoint_id or item.last_checkpoint_id,
            token=token,
        ),
    )


# ---------------------------------------------------------------- under the lease: renew, T08, T09, T11


def work_renew_lease(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-11.3-04: renewal cites the current lease id; usage is accounted against the budgets."""
    assert state is not None
    body = command.work_renew_lease
    item, usage = _under_lease(state, command, ctx, body, "work.renew_lease")
    assert item.lease is not None
    policy = _duration(
        item.contract.time_policy.execution_lease_duration,
        DEFAULT_EXECUTION_LEASE,
        "time_policy.execution_lease_duration",
    )
    duration = min(policy, _duration(body.requested_duration, policy, "body.requested_duration"))
    current_scope = item.lease.token_scope or item.contract.permissions
    scope = _narrow(body.requested_scope, current_scope, "body.requested_scope")
    token = _token(
        command,
        item,
        body.lease_id,
        body.ownership_epoch,
        scope,
        ctx.now,
        ctx.now + duration,
        replaces=item.lease.token_id,
        spending=usage,
    )
    out.emit(
        "work.lease_renewed",
        "work_lease_renewed",
        wp.WorkLeaseRenewed(
            work_item_id=item.work_item_id,
            lease_id=body.lease_id,
            ownership_epoch=body.ownership_epoch,
            renewal=wp.LeaseRenewal(
                renewed_at=to_timestamp(ctx.now),
                previous_expires_at=to_timestamp(item.lease.expires_at),
                expires_at=to_timestamp(ctx.now + duration),
                session_epoch=command.session_epoch,
                command_id=command.command_id,
            ),
            token=token,
        ),
    )
    _record_usage(out, command, item, body.usage_delta, usage)


def _under_lease(
    state: GroupState,
    command: command_pb2.Command,
    ctx: DecisionContext,
    body: wp.WorkRenewLease | wp.WorkCheckpoint | wp.WorkBlock | wp.WorkSubmit | wp.WorkReportProgress,
    name: str,
) -> tuple[WorkItemState, dict[str, int]]:
    """Commands of an executing owner: ACTIVE, the current lease id (MW-11.3-04/05), usage within budget."""
    item = _item(state, body.work_item_id)
    _require_state(item, (ACTIVE,), name)
    _require_lease(item, command, ctx, body.lease_id, body.ownership_epoch)
    return item, _check_usage(state, item, body.usage_delta, "body.usage_delta")


def _checkpoint_id(command: command_pb2.Command, checkpoint: wp.Checkpoint, field: str) -> str:
    cid = checkpoint.checkpoint_id or ids.derived_id("ckpt", command.group_id, command.command_id)
    if not ids.is_valid(cid):
        raise invalid(f"{field}.checkpoint_id", "not a valid id")
    return cid


def work_checkpoint(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T08: durable progress; releases execution, keeps a bounded ownership lease."""
    assert state is not None
    body = command.work_checkpoint
    item, usage = _under_lease(state, command, ctx, body, "work.checkpoint")
    if body.preemption_request_id and body.preemption_request_id != item.preemption_request_id:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND, f"no open preemption request {body.preemption_request_id}"
        )
    checkpoint = wp.Checkpoint()
    checkpoint.CopyFrom(body.checkpoint)
    checkpoint.checkpoint_id = _checkpoint_id(command, body.checkpoint, "body.checkpoint")
    keep = _duration(
        item.contract.time_policy.checkpoint_ownership_duration, DEFAULT_CHECKPOINT_OWNERSHIP, "time_policy"
    )
    assert item.owner is not None
    out.emit(
        "work.checkpointed",
        "work_checkpointed",
        wp.WorkCheckpointed(
            work_item_id=item.work_item_id,
            lease_id=body.lease_id,
            ownership_epoch=body.ownership_epoch,
            checkpoint=checkpoint,
            ownership=_ownership(
                item,
                item.owner.agent_id,
                item.owner.ownership_epoch,
                ctx.now,
                keep,
                wp.WORK_LEASE_KIND_OWNERSHIP,
                item.owner.offer_id,
            ),
            preemption_request_id=body.preemption_request_id,
        ),
    )
    _record_usage(out, command, item, body.usage_delta, usage)


def work_block(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T09 / MW-11.4-04/05: checkpoint, state the required resolution, release the slot."""
    assert state is not None
    body = command.work_block
    item, usage = _under_lease(state, command, ctx, body, "work.block")
    if not body.blockers:
        raise invalid("body.blockers", "at least one blocker with its required resolution")
    for i, b in enumerate(body.blockers):
        if not b.kind or not b.required_resolution:
            raise invalid(f"body.blockers[{i}]", "kind and required_resolution are required (MW-11.4-04)")
    if not body.HasField("checkpoint"):
        raise invalid("body.checkpoint", "a block is a checkpoint plus a blocked lease (MW-10.2-T09)")
    checkpoint = wp.Checkpoint()
    checkpoint.CopyFrom(body.checkpoint)
    checkpoint.checkpoint_id = _checkpoint_id(command, body.checkpoint, "body.checkpoint")
    policy = _duration(
        item.contract.time_policy.blocked_lease_duration,
        DEFAULT_BLOCKED_LEASE,
        "time_policy.blocked_lease_duration",
    )
    keep = min(policy, _duration(body.requested_blocked_duration, policy, "body.requested_blocked_duration"))
    assert item.owner is not None
    out.emit(
        "work.blocked",
        "work_blocked",
        wp.WorkBlocked(
            work_item_id=item.work_item_id,
            lease_id=body.lease_id,
            ownership_epoch=body.ownership_epoch,
            checkpoint=checkpoint,
            blockers=body.blockers,
            ownership=_ownership(
                item,
                item.owner.agent_id,
                item.owner.ownership_epoch,
                ctx.now,
                keep,
                wp.WORK_LEASE_KIND_BLOCKED,
                item.owner.offer_id,
            ),
        ),
    )
    _record_usage(out, command, item, body.usage_delta, usage)


def work_unblock(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T10 / MW-11.4-07: back to the ready queue, or to `open` once ownership has expired."""
    assert state is not None
    body = command.work_unblock
    item = _item(state, body.work_item_id)
    _coordination(state, command, ctx, body.coordinator_epoch, "work.unblock")
    _require_state(item, (BLOCKED,), "work.unblock")
    require_reason(body.resolution, "body.resolution")
    live = _live_owner(item, ctx.now)
    out.emit(
        "work.unblocked",
        "work_unblocked",
        wp.WorkUnblocked(
            work_item_id=item.work_item_id,
            next_state=QUEUED if live else OPEN,
            resolution=body.resolution,
            resolved_blocker_ids=body.resolved_blocker_ids,
        ),
    )


MAX_EVIDENCE_SUMMARY = 2048


def _require_evidence(
    evidence: Iterable[wp.Evidence],
    field: str,
    item: WorkItemState,
    command: command_pb2.Command,
    now: datetime,
) -> list[wp.Evidence]:
    """MW-13.2-04: each record carries subject, criterion, method, result, producer, timestamp and
    referenced Artifacts. The Authority completes what it knows for certain (the WorkItem as subject,
    the authenticated actor as producer, its clock as the recording time) and refuses the rest.

    MW-13.2-05: Evidence is a result, not a thought process: the only free text is a bounded summary
    of what was observed; there is no field for reasoning, and none is accepted.
    """
    records = []
    for i, given in enumerate(evidence):
        e = wp.Evidence()
        e.CopyFrom(given)
        if not ids.is_valid(e.evidence_id) or not e.method or not e.result:
            raise invalid(f"{field}[{i}]", "evidence_id, method and result are required (MW-13.2-04)")
        if e.subject.work_item_id and e.subject.work_item_id != item.work_item_id:
            raise invalid(f"{field}[{i}].subject", f"Evidence here is about {item.work_item_id}")
        if e.producer_id and e.producer_id != command.actor_id:
            raise invalid(f"{field}[{i}].producer_id", "the producer is the agent submitting it")
        if len(e.summary) > MAX_EVIDENCE_SUMMARY:
            raise invalid(
                f"{field}[{i}].summary", f"a result summary of at most {MAX_EVIDENCE_SUMMARY} characters"
            )
        check_artifact_refs(e.artifacts, f"{field}[{i}].artifacts")
        e.subject.work_item_id = item.work_item_id
        e.producer_id = command.actor_id
        e.recorded_at.CopyFrom(to_timestamp(now))
        if not e.HasField("produced_at"):
            e.produced_at.CopyFrom(e.recorded_at)
        records.append(e)
    if not records:
        raise invalid(field, "Evidence is required")
    return records


def work_submit(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T11: the owner submits Artifacts and Evidence under its current lease."""
    assert state is not None
    body = command.work_submit
    item, usage = _under_lease(state, command, ctx, body, "work.submit")
    if body.contract_revision != item.contract_revision:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH, f"the contract is at revision {item.contract_revision}"
        )
    if not body.artifacts:
        raise invalid("body.artifacts", "a submission carries its Artifacts (MW-10.2-T11)")
    evidence = _require_evidence(body.evidence, "body.evidence", item, command, ctx.now)
    covered = {e.criterion_id for e in evidence}
    missing = [
        c.criterion_id
        for c in item.contract.acceptance_criteria
        if c.required and c.criterion_id not in covered
    ]
    if missing:
        raise invalid("body.evidence", f"no Evidence for required acceptance criteria {', '.join(missing)}")
    out.emit(
        "work.submitted",
        "work_submitted",
        wp.WorkSubmitted(
            work_item_id=item.work_item_id,
            lease_id=body.lease_id,
            ownership_epoch=body.ownership_epoch,
            contract_revision=body.contract_revision,
            artifacts=body.artifacts,
            evidence=evidence,
            summary=body.summary,
        ),
    )
    _record_usage(out, command, item, body.usage_delta, usage)


# ---------------------------------------------------------------- T12..T14: review, failure, cancellation


def work_accept_result(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T12 / MW-7.2-11: the Coordinator's review succeeds; never the sole reviewer of its own work."""
    assert state is not None
    body = command.work_accept_result
    item = _item(state, body.work_item_id)
    mission = mission_of(state)
    if command.actor_id == mission.owner_id and item.submitted_by == (
        mission.coordinator.agent_id if mission.coordinator else ""
    ):
        pass  # the MissionOwner reviews work the Coordinator did itself
    else:
        _coordination(state, command, ctx, body.coordinator_epoch, "work.accept_result")
        if item.submitted_by == command.actor_id:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED,
                "a Coordinator is never the sole reviewer of its own output; the MissionOwner accepts it (MW-7.2-11)",
            )
    _require_state(item, (SUBMITTED,), "work.accept_result")
    _combined_evaluation(item, body.review_evidence_ids)
    if body.submission_event_id != item.latest_submission_event_id:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"the latest submission is {item.latest_submission_event_id}",
        )
    out.emit(
        "work.result_accepted",
        "work_result_accepted",
        wp.WorkResultAccepted(
            work_item_id=item.work_item_id,
            submission_event_id=body.submission_event_id,
            review_evidence_ids=body.review_evidence_ids,
            coordinator_epoch=body.coordinator_epoch,
            comment=body.comment,
        ),
    )


def work_fail(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T13: failure with Evidence, reported by the owner (under its lease) or the Coordinator."""
    assert state is not None
    body = command.work_fail
    item = _item(state, body.work_item_id)
    _require_state(item, UNFINISHED, "work.fail")
    role: int
    if body.lease_id:
        _require_lease(item, command, ctx, body.lease_id, body.ownership_epoch)
        role = wp.WORK_ACTOR_ROLE_WORKER
    else:
        role = _coordination(state, command, ctx, body.coordinator_epoch, "work.fail")
    evidence = _require_evidence(body.evidence, "body.evidence", item, command, ctx.now)
    require_reason(body.reason, "body.reason")
    if not body.kind:
        raise invalid("body.kind", "a failure kind is required")
    usage = _check_usage(state, item, body.usage_delta, "body.usage_delta")
    _record_usage(out, command, item, body.usage_delta, usage)
    kind = body.kind
    if role == wp.WORK_ACTOR_ROLE_WORKER and kind == wp.WORK_FAILURE_KIND_TRANSIENT:
        retry_at = _retry_at(item, ctx.now)
        if retry_at is not None:
            # MW-11.4-08: an automatic retry within the contract's attempt, backoff and deadline budgets.
            # The failed attempt's Evidence stays in the log beside the revocation.
            for e in evidence:
                out.emit(
                    "work.evidence_recorded",
                    "evidence_recorded",
                    wp.EvidenceRecorded(work_item_id=item.work_item_id, evidence=e),
                )
            _revoke(out, item, wp.LEASE_REVOCATION_CAUSE_FAILED, QUEUED, retry_not_before=retry_at)
            return
        kind = wp.WORK_FAILURE_KIND_RETRIES_EXHAUSTED  # MW-11.4-10
    out.emit(
        "work.failed",
        "work_failed",
        wp.WorkFailed(
            work_item_id=item.work_item_id,
            reported_by=role,  # type: ignore[arg-type]
            kind=kind,
            evidence=evidence,
            reason=body.reason,  # type: ignore[arg-type]
            lease_id=body.lease_id,
            ownership_epoch=item.owner.ownership_epoch if item.owner else 0,
            attempts=item.attempts,
            previous_state=item.state,  # type: ignore[arg-type]
        ),
    )


def work_cancel(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T14: the Coordinator cancels an unfinished WorkItem; its leases are revoked."""
    assert state is not None
    body = command.work_cancel
    item = _item(state, body.work_item_id)
    role = _coordination(state, command, ctx, body.coordinator_epoch, "work.cancel")
    _require_state(item, UNFINISHED, "work.cancel")
    require_reason(body.reason, "body.reason")
    _cancelled(out, item, role, body.reason)


def _cancelled(out: Emitter, item: WorkItemState, role: int, reason: str) -> None:
    open_offers = [o.offer_id for o in item.offers.values() if o.open]
    if open_offers:
        _withdraw(out, item, open_offers, wp.OFFER_WITHDRAWAL_REASON_WORK_ITEM_CLOSED)
    out.emit(
        "work.cancelled",
        "work_cancelled",
        wp.WorkCancelled(
            work_item_id=item.work_item_id,
            cancelled_by=role,  # type: ignore[arg-type]
            reason=reason,  # type: ignore[arg-type]
            lease_id=item.lease.lease_id if item.lease else "",
            previous_state=item.state,  # type: ignore[arg-type]
        ),
    )


def propagate_mission_end(state: GroupState, out: Emitter, mission_state: int, reason: str) -> None:
    """MW-10.2-T18: a cancelled or failed Mission ends every unfinished WorkItem the same way."""
    for item in state.work_items.values():
        if item.state not in UNFINISHED:
            continue
        if mission_state == mission_pb2.MISSION_STATE_CANCELLED:
            _cancelled(out, item, wp.WORK_ACTOR_ROLE_AUTHORITY, f"Mission cancelled: {reason}")
        else:
            out.emit(
                "work.failed",
                "work_failed",
                wp.WorkFailed(
                    work_item_id=item.work_item_id,
                    reported_by=wp.WORK_ACTOR_ROLE_AUTHORITY,
                    kind=wp.WORK_FAILURE_KIND_PERMANENT,
                    reason=f"Mission failed: {reason}",
                    ownership_epoch=item.owner.ownership_epoch if item.owner else 0,
                    attempts=item.attempts,
                    previous_state=item.state,  # type: ignore[arg-type]
                ),
            )


def work_report_progress(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-11.4-01/02: structured progress (phase, milestones, next checkpoint, blockers, estimate,
    Evidence references) from the executing owner; there is no percentage field to carry authority."""
    assert state is not None
    body = command.work_report_progress
    item, usage = _under_lease(state, command, ctx, body, "work.report_progress")
    report = body.report
    if not report.phase or not report.HasField("next_checkpoint") or not report.HasField("revised_estimate"):
        raise invalid("body.report", "phase, next_checkpoint and revised_estimate are required (MW-11.4-01)")
    for i, b in enumerate(report.blockers):
        if not b.kind or not b.required_resolution:
            raise invalid(f"body.report.blockers[{i}]", "kind and required_resolution are required")
    out.emit(
        "work.progress_reported",
        "work_progress_reported",
        wp.WorkProgressReported(
            work_item_id=item.work_item_id,
            lease_id=body.lease_id,
            ownership_epoch=body.ownership_epoch,
            report=report,
            schedule=body.schedule if body.HasField("schedule") else None,
        ),
    )
    _record_usage(out, command, item, body.usage_delta, usage)


def work_request_preemption(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-11.3-10..12: cooperative preemption. The request interrupts nothing; the Worker checkpoints at
    a safe point (citing the request), which releases the slot and re-queues the WorkItem."""
    assert state is not None
    body = command.work_request_preemption
    item = _item(state, body.work_item_id)
    _coordination(state, command, ctx, body.coordinator_epoch, "work.request_preemption")
    _require_state(item, (ACTIVE,), "work.request_preemption")
    lease = item.lease
    assert lease is not None and item.owner is not None
    if body.lease_id != lease.lease_id or body.ownership_epoch != item.owner.ownership_epoch:
        raise Rejected(
            R.REJECTION_REASON_LEASE_STALE, f"the current lease of {item.work_item_id} is {lease.lease_id}"
        )
    if not body.reason:
        raise invalid("body.reason", "a preemption reason is required")
    request_id = body.preemption_request_id or ids.derived_id("pre", command.group_id, command.command_id)
    out.emit(
        "work.preemption_requested",
        "work_preemption_requested",
        wp.WorkPreemptionRequested(
            work_item_id=item.work_item_id,
            preemption_request_id=request_id,
            lease_id=lease.lease_id,
            reason=body.reason,
            checkpoint_by=body.checkpoint_by if body.HasField("checkpoint_by") else None,
            requested_by=command.actor_id,
        ),
    )


def work_publish_artifact(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-11.3-04 / MW-13.1-02/03: publication cites the current lease; the log gets the reference and
    the manifest digest, never the bytes."""
    assert state is not None
    body = command.work_publish_artifact
    item = _item(state, body.work_item_id)
    _require_state(item, (ACTIVE,), "work.publish_artifact")
    _require_lease(item, command, ctx, body.lease_id, body.ownership_epoch)
    digest = body.artifact.digest
    stored = ctx.artifacts.get(digest.hex)
    if stored is None or stored.size_bytes != digest.size_bytes:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"blake3:{digest.hex} ({digest.size_bytes} bytes) is not stored with a manifest signed by "
            f"{command.actor_id}; upload it with its manifest first",
        )
    if body.deliverable_id and body.deliverable_id not in {
        d.deliverable_id for d in item.contract.deliverables
    }:
        raise invalid("body.deliverable_id", f"not a deliverable of {item.work_item_id}")
    out.emit(
        "artifact.published",
        "artifact_published",
        wp.ArtifactPublished(
            work_item_id=item.work_item_id,
            lease_id=body.lease_id,
            ownership_epoch=body.ownership_epoch,
            artifact=body.artifact,
            manifest_digest=common_pb2.Digest(algorithm="blake3", hex=stored.manifest_digest),
            source_artifacts=[common_pb2.Digest(algorithm="blake3", hex=h) for h in stored.source_digests],
            deliverable_id=body.deliverable_id,
        ),
    )


def work_record_evidence(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-13.2-03: review Evidence on a submitted WorkItem (integrity, schema, tests, business rules by
    the Coordinator; qualitative review by a reviewer member), retained for the human approval."""
    assert state is not None
    body = command.work_record_evidence
    item = _item(state, body.work_item_id)
    _require_state(item, (SUBMITTED,), "work.record_evidence")
    member = state.members.get(command.actor_id)
    lease = mission_of(state).coordinator
    if lease is not None and command.actor_id == lease.agent_id:
        _coordination(state, command, ctx, body.coordinator_epoch, "work.record_evidence")
    elif member is None or member.role != Role.MEMBER_ROLE_REVIEWER:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "review Evidence is recorded by the Coordinator or a reviewer member",
        )
    (record,) = _require_evidence([body.evidence], "body.evidence", item, command, ctx.now)
    if record.evidence_id in item.evidence:
        raise invalid("body.evidence.evidence_id", "already recorded for this WorkItem")
    out.emit(
        "work.evidence_recorded",
        "evidence_recorded",
        wp.EvidenceRecorded(work_item_id=item.work_item_id, evidence=record),
    )


def _combined_evaluation(item: WorkItemState, review_ids: Iterable[str]) -> None:
    """MW-13.2-03 step 4: every required criterion's latest Evidence passes; criteria that demand an
    independent review have a passing record from someone other than the submitter (MW-7.2-11)."""
    for i, eid in enumerate(review_ids):
        if eid not in item.evidence:
            raise invalid(
                f"body.review_evidence_ids[{i}]", f"no Evidence {eid} recorded for {item.work_item_id}"
            )
    latest: dict[str, int] = {}
    independent: set[str] = set()
    for criterion, result, producer in item.evidence.values():
        latest[criterion] = result
        if result == wp.EVIDENCE_RESULT_PASS and producer != item.submitted_by:
            independent.add(criterion)
    for c in item.contract.acceptance_criteria:
        if not c.required:
            continue
        if latest.get(c.criterion_id) != wp.EVIDENCE_RESULT_PASS:
            raise Rejected(
                R.REJECTION_REASON_PRECONDITION_FAILED,
                f"criterion {c.criterion_id} has no passing Evidence as its latest result; request changes or fail the WorkItem",
            )
        if c.independent_review_required and c.criterion_id not in independent:
            raise Rejected(
                R.REJECTION_REASON_PRECONDITION_FAILED,
                f"criterion {c.criterion_id} needs passing Evidence from a reviewer other than the submitter",
            )


HANDLERS: dict[str, Handler] = {
    "work_record_evidence": work_record_evidence,
    "work_publish_artifact": work_publish_artifact,
    "work_report_progress": work_report_progress,
    "work_request_preemption": work_request_preemption,
    "work_propose": work_propose,
    "work_authorize": work_authorize,
    "work_offer": work_offer,
    "work_accept_offer": work_accept_offer,
    "work_decline_offer": work_decline_offer,
    "approval_grant_execution": approval_grant_execution,
    "work_start": work_start,
    "work_renew_lease": work_renew_lease,
    "work_checkpoint": work_checkpoint,
    "work_block": work_block,
    "work_unblock": work_unblock,
    "work_submit": work_submit,
    "work_accept_result": work_accept_result,
    "work_fail": work_fail,
    "work_cancel": work_cancel,
}


# ---------------------------------------------------------------- evolve rules


def _touch(state: GroupState, event: event_pb2.Event, work_item_id: str) -> WorkItemState:
    item = state.work_items[work_item_id]
    item.revision += 1
    state.last_work_change_sequence = event.sequence
    return item


def _own(item: WorkItemState, grant: wp.OwnershipGrant) -> None:
    item.owner = OwnershipState(
        agent_id=grant.agent_id,
        ownership_epoch=grant.ownership_epoch,
        start_deadline=from_timestamp(grant.start_deadline),
        expires_at=from_timestamp(grant.expires_at),
        offer_id=grant.offer_id,
    )
    item.last_ownership_epoch = max(item.last_ownership_epoch, grant.ownership_epoch)


def _proposed(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_proposed
    state.proposals[p.proposal_id] = ProposalState(p.proposal_id, event.actor_id)


def _authorized(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_authorized
    contract = wp.WorkContract()
    contract.CopyFrom(p.contract)
    state.work_items[p.work_item_id] = WorkItemState(
        work_item_id=p.work_item_id,
        state=OPEN,
        title=p.title,
        contract=contract,
        contract_revision=contract.revision or 1,
        conversation_id=p.conversation_id,
        parent_work_item_id=p.parent_work_item_id,
        depends_on=tuple(contract.depends_on_work_item_ids),
    )
    state.last_work_change_sequence = event.sequence
    if p.proposal_id in state.proposals:
        state.proposals[p.proposal_id].open = False


def _offered(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_offered
    item = _touch(state, event, p.work_item_id)
    item.offers[p.offer_id] = OfferState(
        p.offer_id, tuple(p.candidate_ids), from_timestamp(p.expires_at), p.contract_revision
    )
    item.offer_criteria[p.offer_id] = list(p.selection_criteria)
    if p.HasField("amended_contract"):
        item.contract = wp.WorkContract()
        item.contract.CopyFrom(p.amended_contract)
        item.contract_revision = p.contract_revision
        item.depends_on = tuple(p.amended_contract.depends_on_work_item_ids)
        item.open_ambiguities.clear()  # MW-10.1-04: resolved by the amended contract
    item.state = OFFERED
    item.owner = None
    item.lease = None


def _withdrawn(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_offers_withdrawn
    item = _touch(state, event, p.work_item_id)
    for oid in p.offer_ids:
        item.offers[oid].open = False


def _accepted(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_offer_accepted
    item = _touch(state, event, p.work_item_id)
    _own(item, p.ownership)
    item.offers[p.offer_id].open = False
    item.state = QUEUED


def _declined(state: GroupState, event: event_pb2.Event) -> None:
    _touch(state, event, event.work_offer_declined.work_item_id)


def _approved(state: GroupState, event: event_pb2.Event) -> None:
    p = event.execution_approval_granted
    item = _touch(state, event, p.work_item_id)
    item.execution_approved = (p.contract_revision, p.ownership_epoch)


def _started(state: GroupState, event: event_pb2.Event) -> None:
    lease = event.work_started.lease
    item = _touch(state, event, event.work_started.work_item_id)
    item.lease = ExecutionLeaseState(
        lease_id=lease.lease_id,
        agent_id=lease.agent_id,
        session_epoch=lease.session_epoch,
        ownership_epoch=lease.ownership_epoch,
        started_at=from_timestamp(lease.started_at),
        expires_at=from_timestamp(lease.expires_at),
        token_id=event.work_started.token.token_id,
        token_scope=event.work_started.token.scope,
    )
    item.attempts = lease.attempt
    if item.owner is not None:  # while executing, ownership lives as long as the execution lease
        item.owner.expires_at = max(item.owner.expires_at, item.lease.expires_at)
    item.state = ACTIVE


def _renewed(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_lease_renewed
    item = _touch(state, event, p.work_item_id)
    assert item.lease is not None
    item.lease.expires_at = from_timestamp(p.renewal.expires_at)
    item.lease.renewals += 1
    if p.HasField("token"):  # rotation: the previous token is no longer current
        item.lease.token_id = p.token.token_id
        item.lease.token_scope = p.token.scope
    if item.owner is not None:
        item.owner.expires_at = max(item.owner.expires_at, item.lease.expires_at)


def _released_to(new_state: int, payload: str) -> Applier:
    def apply(state: GroupState, event: event_pb2.Event) -> None:
        p = getattr(event, payload)
        item = _touch(state, event, p.work_item_id)
        _own(item, p.ownership)
        item.lease = None
        item.last_checkpoint_id = p.checkpoint.checkpoint_id
        item.preemption_request_id = ""  # a checkpoint answers any open preemption request
        item.blockers = tuple(b.required_resolution for b in getattr(p, "blockers", ()))
        item.state = new_state

    return apply


def _unblocked(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_unblocked
    item = _touch(state, event, p.work_item_id)
    item.state = p.next_state
    item.blockers = ()
    if p.next_state == OPEN:
        item.owner = None


def _submitted(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_submitted
    item = _touch(state, event, p.work_item_id)
    item.latest_submission_event_id = event.event_id
    item.submitted_by = event.actor_id
    item.submitted_evidence_ids = tuple(e.evidence_id for e in p.evidence)
    item.evidence = {e.evidence_id: (e.criterion_id, e.result, e.producer_id) for e in p.evidence}
    item.lease = None
    item.state = SUBMITTED


def _result_accepted(state: GroupState, event: event_pb2.Event) -> None:
    item = _touch(state, event, event.work_result_accepted.work_item_id)
    item.accepted_evidence_ids = item.submitted_evidence_ids + tuple(
        event.work_result_accepted.review_evidence_ids
    )
    item.state = VERIFIED
    item.owner = None


def _ended(new_state: int, payload: str) -> Applier:
    def apply(state: GroupState, event: event_pb2.Event) -> None:
        item = _touch(state, event, getattr(event, payload).work_item_id)
        item.state = new_state
        item.owner = None
        item.lease = None

    return apply


def _lease_revoked(state: GroupState, event: event_pb2.Event) -> None:
    p = event.lease_revoked
    item = _touch(state, event, p.work_item_id)
    item.lease = None
    keeps_ownership = p.cause in (
        wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED,
        wp.LEASE_REVOCATION_CAUSE_FAILED,
    )
    if not keeps_ownership or p.resulting_state != QUEUED:
        item.owner = None
        return
    # Session replaced, or a transient failure retried: the owner keeps its ownership, only the
    # execution lease ends; a retry waits out its backoff and then has a start window again.
    item.state = QUEUED
    if p.HasField("retry_not_before"):
        item.retry_not_before = from_timestamp(p.retry_not_before)
        window = _duration(
            item.contract.time_policy.start_deadline, DEFAULT_START_DEADLINE, "time_policy.start_deadline"
        )
        if item.owner is not None:
            item.owner.expires_at = max(item.owner.expires_at, item.retry_not_before + window)


def _usage(state: GroupState, event: event_pb2.Event) -> None:
    p = event.resource_usage_recorded
    item = _touch(state, event, p.work_item_id)
    for dim in SIX:
        amount = int(getattr(p.delta, dim))
        item.used[dim] += amount
        state.mission_used[dim] += amount


def _progress_reported(state: GroupState, event: event_pb2.Event) -> None:
    _touch(state, event, event.work_progress_reported.work_item_id)


def _artifact_published(state: GroupState, event: event_pb2.Event) -> None:
    item = _touch(state, event, event.artifact_published.work_item_id)
    digest = event.artifact_published.artifact.digest
    item.published_artifacts += ((digest.hex, int(digest.size_bytes)),)


def _evidence_recorded(state: GroupState, event: event_pb2.Event) -> None:
    item = _touch(state, event, event.evidence_recorded.work_item_id)
    e = event.evidence_recorded.evidence
    if (
        item.state == SUBMITTED
    ):  # review Evidence of the current submission (failure Evidence is history only)
        item.evidence[e.evidence_id] = (e.criterion_id, e.result, e.producer_id)


def _preemption_requested(state: GroupState, event: event_pb2.Event) -> None:
    item = _touch(state, event, event.work_preemption_requested.work_item_id)
    item.preemption_request_id = event.work_preemption_requested.preemption_request_id


APPLIERS: dict[str, Applier] = {
    "work_progress_reported": _progress_reported,
    "evidence_recorded": _evidence_recorded,
    "artifact_published": _artifact_published,
    "work_preemption_requested": _preemption_requested,
    "work_proposed": _proposed,
    "work_authorized": _authorized,
    "work_offered": _offered,
    "work_offers_withdrawn": _withdrawn,
    "work_offer_accepted": _accepted,
    "work_offer_declined": _declined,
    "execution_approval_granted": _approved,
    "work_started": _started,
    "work_lease_renewed": _renewed,
    "work_checkpointed": _released_to(QUEUED, "work_checkpointed"),
    "work_blocked": _released_to(BLOCKED, "work_blocked"),
    "work_unblocked": _unblocked,
    "work_submitted": _submitted,
    "work_result_accepted": _result_accepted,
    "work_failed": _ended(FAILED, "work_failed"),
    "work_cancelled": _ended(CANCELLED, "work_cancelled"),
    "lease_revoked": _lease_revoked,
    "resource_usage_recorded": _usage,
}
