"""Parent Missions and subtasks (spec 14, MW-7.1-T03, MW-10.2-T15..T17).

A child Mission lives in its own Group, and no transaction spans two Groups (MW-10.4-05). So
everything here comes in two halves: the command in one Group (``mission.create_child`` in the new
child's) and the *linked effect* the Authority then appends to the other Group, decided by
``decide_linked`` from the durable source event. ``cross_group_effects`` names, for an append, the
Groups that must hear of it; the shell writes those names into an outbox in the same transaction and
delivers each once (docs/subtasks.md). A refused link is compensated in the source Group
(``compensate``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from missionweave.kernel import ids
from missionweave.kernel.clock import from_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2, mission_pb2, subtask_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import (
    MS,
    TERMINAL_MISSION_STATES,
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    Role,
    budget_dims,
    enum_name,
    invalid,
    is_org_policy,
    mission_of,
    require_reason,
    validate_definition,
)
from missionweave_server.services.authority.rules.missions.common import (
    grant_full_membership,
    require_coordinator,
    require_live,
    revoke_membership,
)
from missionweave_server.services.authority.rules.missions.creation import open_mission
from missionweave_server.services.authority.rules.scope import resolve_scope
from missionweave_server.services.authority.rules.work.common import (
    ACTIVE,
    BLOCKED,
    FAILED,
    OFFERED,
    OPEN,
    QUEUED,
    TERMINAL,
    VERIFIED,
    end_lease,
    touch,
)
from missionweave_server.services.authority.rules.work.common import state_name as work_state_name
from missionweave_server.services.authority.state import SIX, ChildLink, GroupState, WorkItemState

# The actor of events the Authority appends by itself (linked effects, compensations).
AUTHORITY_ACTOR = "authority"
# MW-10.2-T15: the states a WorkItem may be promoted to a child Mission from.
PROMOTABLE = frozenset({OPEN, OFFERED, QUEUED, ACTIVE, BLOCKED})
MAX_APPROVED_DEPTH = 64
Risk = mission_pb2.RiskClass


# ---------------------------------------------------------------- what a child may have (MW-14-04)


def promotable(
    parent: GroupState, work_item_id: str, budget: common_pb2.ResourceVector, now: datetime
) -> WorkItemState:
    """The parent WorkItem, if it may carry a new child of ``budget`` now; checked when the child is
    created (on the parent's durable state) and again when the link lands in the parent's Group."""
    mission = mission_of(parent)
    require_live(mission, "mission.create_child")
    item = parent.work_items.get(work_item_id)
    if item is None:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"no WorkItem {work_item_id!r} in {parent.group_id}",
            field="body.parent_work_item_id",
        )
    if item.state not in PROMOTABLE:
        raise Rejected(
            R.REJECTION_REASON_TERMINAL_STATE
            if item.state in TERMINAL
            else R.REJECTION_REASON_INVALID_TRANSITION,
            f"a WorkItem becomes a subtask from open, offered, queued, active or blocked; {work_item_id} is "
            f"{work_state_name(item.state)} (MW-10.2-T15)",
            state=work_state_name(item.state),
        )
    running = item.running_child
    if running is not None:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"{work_item_id} already has a running child Mission {running.child_mission_id}; a replacement "
            "follows its end (MW-14-14)",
            child_mission_id=running.child_mission_id,
        )
    check_carved_budget(parent, item, budget)
    return item


def check_carved_budget(parent: GroupState, item: WorkItemState, budget: common_pb2.ResourceVector) -> None:
    """All six dimensions within what the WorkItem and the Mission have left (used and reserved)."""
    wanted = budget_dims(budget)
    if wanted["financial_micros"] and budget.currency != item.contract.budget.currency:
        raise invalid(
            "body.definition.budget.currency", f"must be the parent's {item.contract.budget.currency}"
        )
    item_caps = budget_dims(item.contract.budget)
    mission_caps = budget_dims(mission_of(parent).definition.budget)
    for dim in SIX:
        for name, left in (
            ("work_item", item_caps[dim] - item.used[dim]),
            ("mission", mission_caps[dim] - parent.mission_used[dim] - parent.reserved[dim]),
        ):
            if wanted[dim] > left:
                raise Rejected(
                    R.REJECTION_REASON_CHILD_BUDGET_EXCEEDS_PARENT,
                    f"{dim}: the child asks for {wanted[dim]}, the parent {name.replace('_', ' ')} has {max(left, 0)} left (MW-14-04)",
                    dimension=dim,
                    limit=max(left, 0),
                    budget=name,
                )


def _check_deadline(
    parent: GroupState, item: WorkItemState, definition: mission_pb2.MissionDefinition
) -> None:
    limits = [from_timestamp(mission_of(parent).definition.deadline)]
    if item.contract.HasField("deadline"):
        limits.append(from_timestamp(item.contract.deadline))
    limit = min(limits)
    if from_timestamp(definition.deadline) > limit:
        raise Rejected(
            R.REJECTION_REASON_CHILD_DEADLINE_EXCEEDS_PARENT,
            f"the child's deadline is after its parent's {limit.isoformat()} (MW-14-04)",
            limit=limit.isoformat(),
        )


def effective_approvers(policy: mission_pb2.RiskPolicy, owner_id: str) -> set[str]:
    """Who grants execution approvals (OP-14): the named approvers, or the MissionOwner."""
    return set(policy.execution_approver_ids) or {owner_id}


def _check_authority(
    parent: GroupState, item: WorkItemState, definition: mission_pb2.MissionDefinition
) -> None:
    """No wider authority than the parent: risk class, approval threshold and approvers."""
    parent_mission = mission_of(parent)
    ours, theirs = definition.risk_policy, parent_mission.definition.risk_policy
    ceiling = (
        min(c for c in (theirs.risk_class, item.contract.risk_class) if c)
        if (theirs.risk_class or item.contract.risk_class)
        else 0
    )
    if ceiling and ours.risk_class > ceiling:
        raise _authority_exceeds(
            "risk_class",
            f"risk class {enum_name(Risk, ours.risk_class)} is above the parent's {enum_name(Risk, ceiling)}",
        )  # type: ignore[arg-type]
    if theirs.execution_approval_threshold and (
        not ours.execution_approval_threshold
        or ours.execution_approval_threshold > theirs.execution_approval_threshold
    ):
        raise _authority_exceeds(
            "execution_approval_threshold",
            f"the execution approval threshold must be at most the parent's {enum_name(Risk, theirs.execution_approval_threshold)}",
        )
    allowed = effective_approvers(theirs, parent_mission.owner_id)
    extra = effective_approvers(ours, definition.owner_id) - allowed
    if extra:
        raise _authority_exceeds(
            "execution_approver_ids",
            f"execution approvers {', '.join(sorted(extra))} are not the parent's ({', '.join(sorted(allowed))}); "
            "name the parent's approvers explicitly",
        )


def _authority_exceeds(check: str, message: str) -> Rejected:
    return Rejected(R.REJECTION_REASON_CHILD_AUTHORITY_EXCEEDS_PARENT, f"{message} (MW-14-04)", check=check)


def _check_depth(parent: GroupState, body: subtask_pb2.MissionCreateChild, ctx: DecisionContext) -> int:
    """MW-14-05..08: deeper than the default maximum only with a recorded approval."""
    depth = mission_of(parent).depth + 1
    limit = ctx.policy.max_mission_depth
    if depth <= limit:
        return depth
    approval = parent.depth_approvals.get(body.depth_approval_event_id)
    if approval is None or approval[0] != body.parent_work_item_id or approval[1] < depth:
        raise Rejected(
            R.REJECTION_REASON_DEPTH_APPROVAL_REQUIRED,
            f"the child would sit at depth {depth}, beyond the Organization's default maximum {limit}: cite a "
            f"mission.child_depth.approved event of {parent.group_id} for {body.parent_work_item_id} allowing it (MW-14-06)",
            depth=depth,
            max_depth=limit,
        )
    return depth


def cycle_rejection(command: command_pb2.Command, ctx: DecisionContext) -> Rejected | None:
    """MW-14-03: a child's Group is never one of its ancestors (reported before "the Group exists")."""
    if command.WhichOneof("body") != "mission_create_child":
        return None
    parent = ctx.linked.get(command.mission_create_child.parent_group_id)
    if command.group_id == command.mission_create_child.parent_group_id or (
        parent is not None
        and parent.mission is not None
        and command.group_id in parent.mission.ancestor_group_ids
    ):
        return Rejected(
            R.REJECTION_REASON_MISSION_CYCLE,
            f"{command.group_id} is an ancestor of the parent Mission: the parent-child graph stays acyclic (MW-14-03)",
        )
    return None


# ---------------------------------------------------------------- commands


def mission_create_child(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-T03 / MW-14-01..07: a child Mission in its own Group, carved from a parent WorkItem."""
    body = command.mission_create_child
    parent = ctx.linked.get(body.parent_group_id)
    if not body.parent_group_id or parent is None or parent.mission is None:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"no parent Group {body.parent_group_id!r} with a Mission",
            field="body.parent_group_id",
        )
    parent_mission = parent.mission
    cycle = cycle_rejection(command, ctx)
    if cycle is not None:
        raise cycle
    if body.parent_mission_id and body.parent_mission_id != parent_mission.mission_id:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"{body.parent_group_id} holds {parent_mission.mission_id}, not {body.parent_mission_id!r}",
            field="body.parent_mission_id",
        )
    require_live(parent_mission, "mission.create_child")
    # The parent's current Coordinator, from its lease's session, reconciled (MW-7.2-03/06/08).
    require_coordinator(parent, command, ctx, body.parent_coordinator_epoch, "mission.create_child")
    definition = body.definition
    validate_definition(definition, ctx)
    if definition.owner_id != command.actor_id:
        raise invalid(
            "body.definition.owner_id",
            "the parent Coordinator issuing the command is the child's MissionOwner (MW-14-09)",
        )
    item = promotable(parent, body.parent_work_item_id, definition.budget, ctx.now)
    _check_deadline(parent, item, definition)
    scope = resolve_scope(item.contract, body.scope if body.HasField("scope") else None)
    _check_authority(parent, item, definition)
    depth = _check_depth(parent, body, ctx)
    open_mission(
        command,
        ctx,
        out,
        definition,
        body.coordinator_id,
        body.coordinator_renewal,
        mission_pb2.MISSION_KIND_CHILD,
        parent_mission_id=parent_mission.mission_id,
        parent_work_item_id=item.work_item_id,
    )
    root_owner = parent_mission.root_owner_id or parent_mission.owner_id
    out.emit(
        "mission.parent.linked",
        "parent_linked",
        subtask_pb2.ParentLinked(
            parent_mission_id=parent_mission.mission_id,
            parent_group_id=parent.group_id,
            parent_work_item_id=item.work_item_id,
            root_owner_id=root_owner,
            depth=depth,
            ancestor_group_ids=[*parent_mission.ancestor_group_ids, parent.group_id],
            scope=scope,
            mandatory=body.mandatory,
        ),
    )
    if root_owner not in (definition.owner_id, body.coordinator_id):
        # MW-14-19 / MW-14-10: the root MissionOwner sees the whole tree and may have to approve.
        grant_full_membership(out, command.group_id, root_owner, Role.MEMBER_ROLE_REVIEWER, 3)


def mission_approve_child_depth(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-14-06/07: the parent's MissionOwner or Organization policy allows a deeper child."""
    assert state is not None
    body = command.mission_approve_child_depth
    mission = mission_of(state)
    require_live(mission, "mission.approve_child_depth")
    if command.actor_id != mission.owner_id and not is_org_policy(ctx, command.actor_id):
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "a deeper child is approved by the MissionOwner or Organization policy (MW-14-06)",
        )
    if body.parent_work_item_id not in state.work_items:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"no WorkItem {body.parent_work_item_id!r} in this Group",
            field="body.parent_work_item_id",
        )
    if not ctx.policy.max_mission_depth < body.max_depth <= MAX_APPROVED_DEPTH:
        raise invalid(
            "body.max_depth",
            f"beyond the default maximum {ctx.policy.max_mission_depth}, at most {MAX_APPROVED_DEPTH}",
        )
    require_reason(body.reason, "body.reason")
    out.emit(
        "mission.child_depth.approved",
        "child_depth_approved",
        subtask_pb2.ChildDepthApproved(
            parent_work_item_id=body.parent_work_item_id, max_depth=body.max_depth, reason=body.reason
        ),
    )


# ---------------------------------------------------------------- across Groups


def cross_group_effects(state: GroupState, events: Sequence[event_pb2.Event]) -> list[tuple[int, str]]:
    """(source sequence, target Group) of every event of an append that another Group must apply.

    ``state`` is the Group's state before the events (the children of a Mission are read there).
    """
    mission = state.mission
    effects: list[tuple[int, str]] = []
    seen: set[str] = set()
    for event in events:
        payload = event.WhichOneof("payload")
        if payload == "parent_linked":
            effects.append((event.sequence, event.parent_linked.parent_group_id))
            continue
        if mission is None:
            continue
        if payload in ("mission_approved", "mission_failed", "mission_cancelled") and mission.parent_group_id:
            effects.append((event.sequence, mission.parent_group_id))
        if payload in ("mission_failed", "mission_cancelled"):
            effects += [(event.sequence, child) for child in _running_children(state)]
        elif (
            payload == "coordinator_lease_granted"
            and event.coordinator_lease_granted.replaced_coordinator_epoch
        ):
            effects += [(event.sequence, child) for child in _running_children(state)]  # the owner succeeds
        elif payload == "work_cancelled":
            item = state.work_items.get(event.work_cancelled.work_item_id)
            child = item.running_child if item else None
            if child is not None:
                effects.append((event.sequence, child.child_group_id))
    unique = []
    for sequence, target in effects:  # one delivery per target and append: the first event decides
        if target not in seen:
            seen.add(target)
            unique.append((sequence, target))
    return unique


def _running_children(state: GroupState) -> list[str]:
    return [c.child_group_id for item in state.work_items.values() for c in item.children if c.running]


def linked_command(target_group_id: str, source: event_pb2.Event) -> command_pb2.Command:
    """The Authority's own command that applies ``source`` to ``target_group_id``: its id derives
    from the source event, so that applying it twice appends once."""
    return command_pb2.Command(
        command_id=ids.derived_id("xg", source.group_id, str(source.sequence)),
        group_id=target_group_id,
        actor_id=AUTHORITY_ACTOR,
        correlation_id=source.correlation_id or source.event_id,
    )


def decide_linked(
    target: GroupState, source: event_pb2.Event, source_state: GroupState, now: datetime, out: Emitter
) -> None:
    """The events ``target`` appends for ``source`` (an event of ``source_state``'s Group). Raises
    Rejected when the target refuses it; emits nothing when there is nothing (left) to do."""
    payload = source.WhichOneof("payload")
    if payload == "parent_linked":
        _link_subtask(target, source, source_state, now, out)
    elif source_state.mission is not None and source_state.mission.parent_group_id == target.group_id:
        _end_subtask(target, source, source_state, out)
    else:
        _propagate_down(target, source, out)


def _link_subtask(
    parent: GroupState, source: event_pb2.Event, child: GroupState, now: datetime, out: Emitter
) -> None:
    """MW-10.2-T15: the parent WorkItem blocks on the child, its ownership protected (OP-33)."""
    link = source.parent_linked
    child_mission = mission_of(child)
    item = parent.work_items.get(link.parent_work_item_id)
    if item is not None and any(c.child_group_id == child.group_id for c in item.children):
        return  # already linked
    item = promotable(parent, link.parent_work_item_id, child_mission.definition.budget, now)
    blocker = wp.Blocker(
        blocker_id=f"subtask:{child_mission.mission_id}",
        kind=wp.BLOCKER_KIND_SUBTASK,
        description=f"child Mission {child_mission.mission_id} ({child_mission.definition.title}) is running",
        required_resolution=f"the child Mission {child_mission.mission_id} ends",
        child_mission_id=child_mission.mission_id,
    )
    open_offers = [o.offer_id for o in item.offers.values() if o.open]
    if open_offers:
        out.emit(
            "work.offers.withdrawn",
            "work_offers_withdrawn",
            wp.WorkOffersWithdrawn(
                work_item_id=item.work_item_id,
                offer_ids=open_offers,
                reason=wp.OFFER_WITHDRAWAL_REASON_WORK_ITEM_CLOSED,
            ),
        )
    out.emit(
        "work.subtask.linked",
        "subtask_linked",
        subtask_pb2.SubtaskLinked(
            work_item_id=item.work_item_id,
            child_mission_id=child_mission.mission_id,
            child_group_id=child.group_id,
            source_event_id=source.event_id,
            reserved=child_mission.definition.budget,
            mandatory=link.mandatory,
            blocker=blocker,
            previous_state=item.state,  # type: ignore[arg-type]
            ended_lease_id=item.lease.lease_id if item.lease else "",
            ownership_protected_until=child_mission.definition.deadline if item.owner else None,
        ),
    )


def _end_subtask(parent: GroupState, source: event_pb2.Event, child: GroupState, out: Emitter) -> None:
    """MW-10.2-T16/T17, MW-14-11..15: the child's end reaches its parent WorkItem."""
    child_mission = mission_of(child)
    item = parent.work_items.get(child_mission.parent_work_item_id)
    link = item.running_child if item else None
    if item is None or link is None or link.child_group_id != child.group_id:
        return  # already ended (a redelivery)
    payload = source.WhichOneof("payload")
    used = common_pb2.ResourceVector(currency=child_mission.definition.budget.currency, **child.mission_used)
    evidence = wp.Evidence(
        evidence_id=ids.derived_id("evd", child.group_id, source.event_id),
        subject=wp.EvidenceSubject(work_item_id=item.work_item_id),
        producer_id=source.actor_id,
        produced_at=source.recorded_at,
    )
    artifacts: Sequence[common_pb2.ArtifactRef] = ()
    outcome: int
    resulting: int
    if payload == "mission_approved":
        outcome, resulting, reason = MS.MISSION_STATE_APPROVED, VERIFIED, ""
        evidence.method, evidence.result = wp.EVIDENCE_METHOD_APPROVAL, wp.EVIDENCE_RESULT_PASS
        evidence.criterion = f"child Mission {child_mission.mission_id} approved by its MissionOwner"
        evidence.summary = source.mission_approved.comment[:4096]
        artifacts = child_mission.latest_submission_artifacts
    else:
        failed = payload == "mission_failed"
        outcome = MS.MISSION_STATE_FAILED if failed else MS.MISSION_STATE_CANCELLED
        reason = source.mission_failed.reason if failed else source.mission_cancelled.reason
        evidence.method, evidence.result = wp.EVIDENCE_METHOD_FAILURE_OBSERVATION, wp.EVIDENCE_RESULT_FAIL
        evidence.criterion = (
            f"child Mission {child_mission.mission_id} ended {'failed' if failed else 'cancelled'}"
        )
        evidence.summary = reason[:4096]
        # MW-14-12/15: the parent fails only for a mandatory child whose policy says so.
        fails_parent = (
            link.mandatory and item.contract.subtask_failure_policy == wp.SUBTASK_FAILURE_POLICY_FAIL_PARENT
        )
        resulting = FAILED if fails_parent else BLOCKED
    if item.state in TERMINAL or item.state == FAILED:
        resulting = item.state  # the parent WorkItem ended first: only the reservation and the charge
    out.emit(
        "work.subtask.ended",
        "subtask_ended",
        subtask_pb2.SubtaskEnded(
            work_item_id=item.work_item_id,
            child_mission_id=child_mission.mission_id,
            child_group_id=child.group_id,
            source_event_id=source.event_id,
            outcome=outcome,  # type: ignore[arg-type]
            evidence=evidence,
            artifacts=artifacts,
            child_used=used,
            resulting_state=resulting,  # type: ignore[arg-type]
            reason=reason,
        ),
    )


def _propagate_down(child: GroupState, source: event_pb2.Event, out: Emitter) -> None:
    """MW-7.1-T07/T08: a parent's cancellation or failure ends its unfinished children the same
    way; a cancelled parent WorkItem cancels its running child. Mission-end propagation to the
    child's own WorkItems follows in the same append (the decider's T18 step)."""
    mission = mission_of(child)
    if mission.state in TERMINAL_MISSION_STATES:
        return
    payload = source.WhichOneof("payload")
    if payload == "mission_failed":
        reason = f"parent Mission failed: {source.mission_failed.reason}"
        out.emit("mission.failed", "mission_failed", mission_pb2.MissionFailed(reason=reason[:4096]))
        return
    if payload == "mission_cancelled":
        reason = f"parent Mission cancelled: {source.mission_cancelled.reason}"
    elif payload == "work_cancelled":
        reason = (
            f"parent WorkItem {source.work_cancelled.work_item_id} cancelled: {source.work_cancelled.reason}"
        )
    elif payload == "coordinator_lease_granted":
        _succeed_owner(child, source.coordinator_lease_granted.lease, out)
        return
    else:
        return
    out.emit("mission.cancelled", "mission_cancelled", mission_pb2.MissionCancelled(reason=reason[:4096]))


def _succeed_owner(child: GroupState, lease: mission_pb2.CoordinatorLease, out: Emitter) -> None:
    """MW-14-09/18: the parent's new Coordinator becomes the child's MissionOwner."""
    mission = mission_of(child)
    previous, successor = mission.owner_id, lease.agent_id
    coordinator = mission.coordinator.agent_id if mission.coordinator else ""
    if successor in (previous, coordinator):
        return  # already the owner, or the child's own Coordinator (it cannot review itself, MW-7.2-11)
    grant_full_membership(
        out, child.group_id, successor, Role.MEMBER_ROLE_MISSION_OWNER, child.last_membership_epoch + 1
    )
    old = child.members.get(previous)
    if old is not None and old.active:
        revoke_membership(out, previous, old.membership_epoch, "replaced as the parent Mission's Coordinator")
    out.emit(
        "mission.owner.replaced",
        "mission_owner_replaced",
        subtask_pb2.MissionOwnerReplaced(
            previous_owner_id=previous, owner_id=successor, parent_coordinator_epoch=lease.coordinator_epoch
        ),
    )


def compensate(source_state: GroupState, source: event_pb2.Event, refusal: Rejected, out: Emitter) -> None:
    """A link the parent refused: the child it created is cancelled with the refusal as its reason
    (MW-10.4-05: a cross-Group step completes or is compensated)."""
    if source.WhichOneof("payload") != "parent_linked":
        return  # the other effects have nothing to undo: the target has moved on by itself
    mission = mission_of(source_state)
    if mission.state in TERMINAL_MISSION_STATES:
        return
    reason = f"compensation: the parent Group {source.parent_linked.parent_group_id} refused the link: {refusal.message}"
    out.emit("mission.cancelled", "mission_cancelled", mission_pb2.MissionCancelled(reason=reason[:4096]))


def ended_mission_state(events: Sequence[event_pb2.Event]) -> int:
    """The MissionState a linked append ends its Group's Mission in (0 if none): its WorkItems follow (T18)."""
    for event in events:
        if event.WhichOneof("payload") == "mission_cancelled":
            return MS.MISSION_STATE_CANCELLED
        if event.WhichOneof("payload") == "mission_failed":
            return MS.MISSION_STATE_FAILED
    return 0


# ---------------------------------------------------------------- evolve rules


def _parent_linked(state: GroupState, event: event_pb2.Event) -> None:
    p = event.parent_linked
    mission = mission_of(state)
    mission.parent_group_id = p.parent_group_id
    mission.ancestor_group_ids = tuple(p.ancestor_group_ids)
    mission.root_owner_id = p.root_owner_id
    mission.depth = p.depth
    mission.scope = p.scope
    mission.mandatory = p.mandatory


def _owner_replaced(state: GroupState, event: event_pb2.Event) -> None:
    mission_of(state).definition.owner_id = event.mission_owner_replaced.owner_id


def _depth_approved(state: GroupState, event: event_pb2.Event) -> None:
    p = event.child_depth_approved
    state.depth_approvals[event.event_id] = (p.parent_work_item_id, p.max_depth)


def _subtask_linked(state: GroupState, event: event_pb2.Event) -> None:
    p = event.subtask_linked
    item = touch(state, event, p.work_item_id)
    reserved = budget_dims(p.reserved)
    item.children.append(ChildLink(p.child_mission_id, p.child_group_id, reserved, p.mandatory))
    for dim in SIX:
        state.reserved[dim] += reserved[dim]
    for offer in item.offers.values():
        offer.open = False
    end_lease(
        item, event, wp.LEASE_END_KIND_RELEASED
    )  # the running attempt ends; the owner keeps ownership (OP-33)
    if item.owner is not None and p.HasField("ownership_protected_until"):
        item.owner.expires_at = max(item.owner.expires_at, from_timestamp(p.ownership_protected_until))
    item.state = BLOCKED
    item.blockers = (p.blocker.required_resolution,)


def _subtask_ended(state: GroupState, event: event_pb2.Event) -> None:
    p = event.subtask_ended
    item = touch(state, event, p.work_item_id)
    for link in item.children:
        if link.child_group_id == p.child_group_id and link.running:
            link.running = False
            for dim in SIX:
                state.reserved[dim] -= link.reserved[dim]
    used = budget_dims(p.child_used)
    for dim in SIX:
        item.used[dim] += used[dim]
        state.mission_used[dim] += used[dim]
    evidence = p.evidence
    item.evidence[evidence.evidence_id] = (evidence.criterion_id, evidence.result, evidence.producer_id)
    if p.resulting_state == VERIFIED:
        item.accepted_evidence_ids = (*item.accepted_evidence_ids, evidence.evidence_id)
        item.published_artifacts = (
            *item.published_artifacts,
            *((a.digest.hex, a.digest.size_bytes) for a in p.artifacts),
        )
        item.blockers = ()
        item.owner = None
    elif p.resulting_state == BLOCKED:
        item.blockers = (
            f"the child Mission {p.child_mission_id} ended; replan, correct the scope, create a replacement child or cancel (MW-14-14)",
        )
    elif p.resulting_state == FAILED:
        item.owner = None
    item.state = p.resulting_state


KINDS = (
    CommandKind(
        "mission_create_child",
        mission_create_child,
        {
            "parent_linked": _parent_linked,
            "subtask_linked": _subtask_linked,
            "subtask_ended": _subtask_ended,
            "mission_owner_replaced": _owner_replaced,
        },
        creates_group=True,
        references=lambda c: (
            c.mission_create_child.definition.owner_id,
            c.mission_create_child.coordinator_id,
        ),
        linked_groups=lambda c: (c.mission_create_child.parent_group_id,),
    ),
    CommandKind(
        "mission_approve_child_depth", mission_approve_child_depth, {"child_depth_approved": _depth_approved}
    ),
)

__all__ = [
    "AUTHORITY_ACTOR",
    "KINDS",
    "compensate",
    "cross_group_effects",
    "cycle_rejection",
    "decide_linked",
    "linked_command",
]
