"""Delegated work authority (spec 9.1): scoped grants from the current Coordinator to a
work_delegate, and the checks every use of a grant passes.

A grant is a persisted, bounded slice of the Coordinator's authority over one subtree of the work
(its scope root, the target WorkItem): which capabilities (at minimum versions), how much budget in
all six dimensions, how deep below the root, until when. Its use is checked against the state
*now* (MW-9.1-13/14), so a replaced Coordinator, a changed Membership, a finished target or the
expiry end it at once (MW-9.1-15) without any event having to say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from missionweave.kernel import ids
from missionweave.kernel.capabilities import version_key
from missionweave.kernel.clock import from_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import (
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    Role,
    budget_dims,
    invalid,
    mission_of,
    require_reason,
)
from missionweave_server.services.authority.rules.memberships import require_steward
from missionweave_server.services.authority.rules.missions.common import require_coordinator, require_live
from missionweave_server.services.authority.state import SIX, GrantState, GroupState

WS = wp.WorkItemState
# MW-9.1-15: a target in one of these ends the grant.
ENDS_A_GRANT = frozenset(
    {WS.WORK_ITEM_STATE_FAILED, WS.WORK_ITEM_STATE_CANCELLED, WS.WORK_ITEM_STATE_VERIFIED}
)
MAX_ALLOWED_CAPABILITIES = 64


def _grant_invalid(grant: GrantState, check: str, message: str) -> Rejected:
    return Rejected(R.REJECTION_REASON_GRANT_INVALID, message, grant_id=grant.grant_id, check=check)


def _outside(grant: GrantState, check: str, message: str, **metadata: object) -> Rejected:
    return Rejected(
        R.REJECTION_REASON_OUTSIDE_GRANT, message, grant_id=grant.grant_id, check=check, **metadata
    )


# ---------------------------------------------------------------- membership.grant_delegation


def membership_grant_delegation(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-9.1-04/05/06: the current Coordinator grants a work_delegate a bounded subtree of work."""
    assert state is not None
    body = command.membership_grant_delegation
    mission = mission_of(state)
    require_live(mission, "membership.grant_delegation")
    require_coordinator(state, command, ctx, body.coordinator_epoch, "membership.grant_delegation")
    grantee = state.members.get(body.grantee_id)
    if not body.grantee_id:
        raise invalid("body.membership_grant_delegation.grantee_id", "is required")
    if grantee is None or not grantee.active or grantee.role != Role.MEMBER_ROLE_WORK_DELEGATE:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"{body.grantee_id} holds no active work_delegate Membership here (MW-9.1-02)",
            field="body.membership_grant_delegation.grantee_id",
        )
    if grantee.provisional:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"{body.grantee_id}'s Membership is provisional: it receives an offer, not authority (MW-8-06)",
            field="body.membership_grant_delegation.grantee_id",
        )
    target = state.work_items.get(body.target_work_item_id)
    if target is None:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"no WorkItem {body.target_work_item_id!r} to root the grant at",
            field="body.membership_grant_delegation.target_work_item_id",
        )
    if target.state in ENDS_A_GRANT:
        raise Rejected(
            R.REJECTION_REASON_TERMINAL_STATE,
            f"{target.work_item_id} is finished; a grant rooted there could never be used (MW-9.1-15)",
            field="body.membership_grant_delegation.target_work_item_id",
        )
    allowed = _allowed_capabilities(body.allowed_capabilities)
    caps = _caps(body, mission.definition.budget)
    limit = ctx.policy.max_delegation_depth
    if body.max_descendant_depth > limit:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"max_descendant_depth {body.max_descendant_depth} exceeds the Organization's limit of {limit} (MW-9.1-12)",
            field="body.membership_grant_delegation.max_descendant_depth",
            policy_limit=limit,
        )
    if not body.HasField("expires_at") or from_timestamp(body.expires_at) <= ctx.now:
        raise invalid("body.membership_grant_delegation.expires_at", "an expiry in the future is required")
    if from_timestamp(body.expires_at) > from_timestamp(mission.definition.deadline):
        raise invalid(
            "body.membership_grant_delegation.expires_at",
            "a grant expires no later than the Mission's deadline",
        )
    lease = mission.coordinator
    assert lease is not None  # require_coordinator
    grant = membership_pb2.DelegationGrant(
        grant_id=ids.derived_id("grant", command.group_id, command.command_id),
        grantee_id=body.grantee_id,
        mission_id=mission.mission_id,
        group_id=command.group_id,
        target_work_item_id=target.work_item_id,
        allowed_capabilities=[
            membership_pb2.Capability(capability_id=c, version=v) for c, v in allowed.items()
        ],
        caps=caps,
        max_descendant_depth=body.max_descendant_depth,
        grantee_membership_epoch=grantee.membership_epoch,
        coordinator_epoch=lease.coordinator_epoch,
        issuer_id=command.actor_id,
        granted_at=out.recorded_at,
        expires_at=body.expires_at,
    )
    out.emit(
        "membership.delegation.granted", "delegation_granted", membership_pb2.DelegationGranted(grant=grant)
    )


def _allowed_capabilities(capabilities: Iterable[membership_pb2.Capability]) -> dict[str, str]:
    field = "body.membership_grant_delegation.allowed_capabilities"
    allowed: dict[str, str] = {}
    for i, cap in enumerate(capabilities):
        if not cap.capability_id or not cap.version:
            raise invalid(f"{field}[{i}]", "a capability id and its minimum version are required")
        if cap.capability_id in allowed:
            raise invalid(f"{field}[{i}]", f"{cap.capability_id} is listed twice")
        allowed[cap.capability_id] = cap.version
    if not allowed:
        raise invalid(
            field, "name the capabilities the grant allows, each with a minimum version (MW-9.1-05)"
        )
    if len(allowed) > MAX_ALLOWED_CAPABILITIES:
        raise invalid(field, f"at most {MAX_ALLOWED_CAPABILITIES}")
    return allowed


def _caps(
    body: membership_pb2.MembershipGrantDelegation, budget: common_pb2.ResourceVector
) -> common_pb2.ResourceVector:
    """MW-9.1-05: a currency and an explicit cap in each of the six dimensions. Zero is explicit
    (it permits nothing, OP-02); a cap beyond the Mission's own budget would be unbounded in effect."""
    field = "body.membership_grant_delegation.caps"
    if not body.HasField("caps"):
        raise invalid(field, "caps in all six budget dimensions, with a currency, are required (MW-9.1-05)")
    caps = body.caps
    if not caps.currency:
        raise invalid(f"{field}.currency", "a currency is required (MW-9.1-05)")
    if budget.currency and caps.currency != budget.currency:
        raise invalid(f"{field}.currency", f"the Mission budgets in {budget.currency}")
    if caps.financial_micros < 0:
        raise invalid(f"{field}.financial_micros", "must not be negative")
    over = [dim for dim in SIX if getattr(caps, dim) > getattr(budget, dim)]
    if over:
        raise Rejected(
            R.REJECTION_REASON_BUDGET_EXCEEDED,
            f"caps exceed the Mission's budget in {', '.join(over)}: a grant is a bounded share of it",
            field=f"{field}.{over[0]}",
            dimension=over[0],
        )
    return caps


# ---------------------------------------------------------------- membership.revoke_delegation


def membership_revoke_delegation(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """Explicit revocation: the current Coordinator (or the MissionOwner) ends a grant early."""
    assert state is not None
    body = command.membership_revoke_delegation
    require_steward(state, command, ctx)  # as every Membership change: a lapsed Coordinator renews first
    grant = state.grants.get(body.grant_id)
    if grant is None:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"no grant {body.grant_id!r} in this Group",
            field="body.membership_revoke_delegation.grant_id",
        )
    if grant.revoked:
        raise Rejected(R.REJECTION_REASON_INVALID_TRANSITION, f"grant {grant.grant_id} is already revoked")
    require_reason(body.reason, "body.membership_revoke_delegation.reason")
    out.emit(
        "membership.delegation.revoked",
        "delegation_revoked",
        membership_pb2.DelegationRevoked(grant_id=grant.grant_id, reason=body.reason),
    )


# ---------------------------------------------------------------- using a grant


def usable_grant(
    state: GroupState, command: command_pb2.Command, ctx: DecisionContext, grant_id: str
) -> GrantState:
    """MW-9.1-03/13/14/15/16: the persisted grant, used by its grantee, still valid now."""
    grant = state.grants.get(grant_id)
    if grant is None:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND, f"no grant {grant_id!r} in this Group (MW-9.1-03)", field="grant_id"
        )
    if command.actor_id != grant.grantee_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"grant {grant_id} is {grant.grantee_id}'s; grants are not transferable (MW-9.1-16)",
            grant_id=grant_id,
            check="not_grantee",
        )
    invalid_now = invalidity(state, grant, ctx.now)
    if invalid_now is not None:
        raise _grant_invalid(grant, *invalid_now)
    return grant


def invalidity(state: GroupState, grant: GrantState, now: datetime | None) -> tuple[str, str] | None:
    """Why ``grant`` cannot be used now (its check name and a message), or None (MW-9.1-13..15).
    Without ``now``, as far as the state alone tells (read models stay a pure fold of the log)."""
    gid = grant.grant_id
    if grant.revoked:
        return "revoked", f"grant {gid} was revoked"
    if now is not None and grant.expires_at <= now:
        return "expired", f"grant {gid} expired at {grant.expires_at.isoformat()}"
    member = state.members.get(grant.grantee_id)
    if (
        member is None
        or not member.active
        or member.role != Role.MEMBER_ROLE_WORK_DELEGATE
        or member.membership_epoch != grant.grantee_membership_epoch
    ):
        return "membership_changed", (
            f"grant {gid} was made for Membership epoch {grant.grantee_membership_epoch} as work_delegate, "
            "which has changed or ended (MW-9.1-13)"
        )
    mission = mission_of(state)
    lease = mission.coordinator
    if (
        mission.mission_id != grant.mission_id
        or state.group_id != grant.group_id
        or lease is None
        or lease.coordinator_epoch != grant.coordinator_epoch
        or lease.agent_id != grant.issuer_id
    ):
        return "coordinator_replaced", (
            f"grant {gid} was issued by {grant.issuer_id} at Coordinator epoch {grant.coordinator_epoch}, "
            "which is no longer current (MW-9.1-14)"
        )
    target = state.work_items.get(grant.target_work_item_id)
    if target is None:
        return "target_missing", f"the grant's target {grant.target_work_item_id} is missing"
    if target.state in ENDS_A_GRANT:
        return "target_finished", f"the grant's target {target.work_item_id} is finished (MW-9.1-15)"
    return None


def depth_below(state: GroupState, root: str, work_item_id: str) -> int | None:
    """How many parent links lead from ``work_item_id`` up to ``root`` (0: it is the root); None
    when it is not in the root's subtree. Parent links are acyclic (each parent existed first)."""
    depth = 0
    current = state.work_items.get(work_item_id)
    while current is not None:
        if current.work_item_id == root:
            return depth
        current = state.work_items.get(current.parent_work_item_id) if current.parent_work_item_id else None
        depth += 1
    return None


def check_capabilities(grant: GrantState, contract: wp.WorkContract) -> None:
    """MW-9.1-10: every capability the contract requires, allowed by the grant at its minimum version."""
    for cap in contract.required_capabilities:
        minimum = grant.allowed.get(cap.capability_id)
        if minimum is None:
            raise _outside(
                grant,
                "capability",
                f"grant {grant.grant_id} does not allow {cap.capability_id}",
                capability=cap.capability_id,
            )
        if version_key(cap.version) < version_key(minimum):
            raise _outside(
                grant,
                "capability",
                f"{cap.capability_id} {cap.version} is below the grant's minimum version {minimum} (MW-9.1-10)",
                capability=cap.capability_id,
            )


def charged_with(
    state: GroupState, grant: GrantState, work_item_id: str, budget: dict[str, int]
) -> dict[str, int]:
    """The grant's total charge, with ``work_item_id`` counted at ``budget``."""
    before = state.item_grants.get(work_item_id, {}).get(grant.grant_id, {})
    return {dim: grant.charged[dim] - before.get(dim, 0) + budget.get(dim, 0) for dim in SIX}


def check_charge(
    state: GroupState, grant: GrantState, work_item_id: str, budget: common_pb2.ResourceVector
) -> None:
    """MW-9.1-11: what the grant has been charged, with this WorkItem's budget counted (once, at its
    latest size), fits every cap."""
    charged = charged_with(state, grant, work_item_id, budget_dims(budget))
    for dim in SIX:
        if charged[dim] > grant.caps[dim]:
            raise Rejected(
                R.REJECTION_REASON_BUDGET_EXCEEDED,
                f"grant {grant.grant_id} would be charged {charged[dim]} {dim}, over its cap of {grant.caps[dim]} (MW-9.1-11)",
                grant_id=grant.grant_id,
                dimension=dim,
                cap=grant.caps[dim],
                charged=charged[dim],
            )


def check_delegated_authorize(
    state: GroupState, ctx: DecisionContext, grant: GrantState, body: wp.WorkAuthorize, work_item_id: str
) -> None:
    """MW-9.1-09/10/11/12: a new descendant linked into the subtree, within depth, capabilities, caps."""
    if not body.parent_work_item_id:
        raise _outside(
            grant, "scope", "a delegated WorkItem names its parent in the granted subtree (MW-9.1-09)"
        )
    parent_depth = depth_below(state, grant.target_work_item_id, body.parent_work_item_id)
    if parent_depth is None:
        raise _outside(
            grant,
            "scope",
            f"{body.parent_work_item_id} is outside the subtree of {grant.target_work_item_id} (MW-9.1-09)",
        )
    check_depth(grant, ctx, parent_depth + 1)
    check_capabilities(grant, body.contract)
    check_charge(state, grant, work_item_id, body.contract.budget)


def check_depth(grant: GrantState, ctx: DecisionContext, depth: int) -> None:
    """MW-9.1-12: a WorkItem used under the grant sits within the grant's maximum depth below its
    scope root and within the Organization's limit in force now."""
    if depth > grant.max_descendant_depth:
        raise _outside(
            grant,
            "depth",
            f"depth {depth} below the scope root exceeds the grant's {grant.max_descendant_depth}",
            depth=depth,
        )
    if depth > ctx.policy.max_delegation_depth:
        raise _outside(
            grant,
            "depth_policy",
            f"depth {depth} exceeds the Organization's limit of {ctx.policy.max_delegation_depth} (MW-9.1-12)",
            depth=depth,
        )


def check_delegated_offer(
    state: GroupState, ctx: DecisionContext, grant: GrantState, body: wp.WorkOffer, contract: wp.WorkContract
) -> None:
    """MW-9.1-08/10/11/12: the scope root or an existing descendant within the grant's depth (D122),
    within capabilities and caps."""
    depth = depth_below(state, grant.target_work_item_id, body.work_item_id)
    if depth is None:
        raise _outside(
            grant,
            "scope",
            f"{body.work_item_id} is outside the subtree of {grant.target_work_item_id} (MW-9.1-08)",
        )
    # A descendant the Coordinator created deeper than the grant reaches exists, but is not the grantee's.
    check_depth(grant, ctx, depth)
    check_capabilities(grant, contract)
    check_charge(state, grant, body.work_item_id, contract.budget)


def charge(state: GroupState, grant_id: str, work_item_id: str, budget: common_pb2.ResourceVector) -> None:
    """Evolve: a WorkItem created or offered under the grant counts against it (at its latest budget),
    and from then on what it uses too (the grant's running totals, D134)."""
    grant = state.grants.get(grant_id)
    if grant is None:
        return
    size = budget_dims(budget)
    charges = state.item_grants.setdefault(work_item_id, {})
    before = charges.get(grant_id)
    if before is None:
        item = state.work_items.get(work_item_id)
        for dim in SIX:
            grant.used[dim] += item.used[dim] if item is not None else 0
    for dim in SIX:
        grant.charged[dim] += size[dim] - (before or {}).get(dim, 0)
    charges[grant_id] = size


# ---------------------------------------------------------------- evolve rules


def _granted(state: GroupState, event: event_pb2.Event) -> None:
    g = event.delegation_granted.grant
    state.grants[g.grant_id] = GrantState(
        grant_id=g.grant_id,
        grantee_id=g.grantee_id,
        mission_id=g.mission_id,
        group_id=g.group_id,
        target_work_item_id=g.target_work_item_id,
        allowed={c.capability_id: c.version for c in g.allowed_capabilities},
        caps=budget_dims(g.caps),
        currency=g.caps.currency,
        max_descendant_depth=g.max_descendant_depth,
        grantee_membership_epoch=g.grantee_membership_epoch,
        coordinator_epoch=g.coordinator_epoch,
        issuer_id=g.issuer_id,
        granted_at=from_timestamp(g.granted_at),
        expires_at=from_timestamp(g.expires_at),
        record=g,
    )


def _revoked(state: GroupState, event: event_pb2.Event) -> None:
    state.grants[event.delegation_revoked.grant_id].revoked = True


def remaining(grant: GrantState) -> Mapping[str, int]:
    """What the grant still allows in each dimension (for read models and the CLI)."""
    return {dim: grant.caps[dim] - grant.charged[dim] for dim in SIX}


KINDS = (
    CommandKind(
        "membership_grant_delegation",
        membership_grant_delegation,
        {"delegation_granted": _granted},
        references=lambda c: (c.membership_grant_delegation.grantee_id,),
    ),
    CommandKind(
        "membership_revoke_delegation", membership_revoke_delegation, {"delegation_revoked": _revoked}
    ),
)
