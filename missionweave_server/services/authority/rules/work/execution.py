"""Under the execution lease: renewal, progress, checkpoint (T08), block (T09) and unblock (T10)."""

from __future__ import annotations

from datetime import datetime, timedelta

from missionweave.kernel import ids
from missionweave.kernel.clock import from_timestamp, to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import (
    Applier,
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    invalid,
    require_reason,
)
from missionweave_server.services.authority.rules.work.common import (
    ACTIVE,
    BLOCKED,
    DEFAULT_BLOCKED_LEASE,
    DEFAULT_CHECKPOINT_OWNERSHIP,
    DEFAULT_EXECUTION_LEASE,
    OPEN,
    QUEUED,
    attempt_end,
    coordination,
    end_lease,
    live_owner,
    own,
    ownership_grant,
    policy_duration,
    require_state,
    touch,
    work_item,
)
from missionweave_server.services.authority.rules.work.leases import (
    capability_token,
    narrow_scope,
    require_lease,
    require_owner,
)
from missionweave_server.services.authority.rules.work.offline import Reconciled, buffered, reconcile
from missionweave_server.services.authority.rules.work.usage import apply_usage, check_usage, record_usage
from missionweave_server.services.authority.state import GroupState, WorkItemState

MAX_ESTIMATE_REASON = 1024


def work_renew_lease(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-11.3-04: renewal cites the current lease id; usage is accounted against the budgets."""
    assert state is not None
    body = command.work_renew_lease
    item, usage = under_lease(state, command, ctx, body, "work.renew_lease")
    assert item.lease is not None
    policy = policy_duration(
        item.contract.time_policy.execution_lease_duration,
        DEFAULT_EXECUTION_LEASE,
        "time_policy.execution_lease_duration",
    )
    duration = min(policy, policy_duration(body.requested_duration, policy, "body.requested_duration"))
    end = attempt_end(item, item.lease.started_at)
    if (
        end is not None
    ):  # a renewal never extends the attempt beyond its time limit (the live lease ends by then)
        duration = min(duration, end - ctx.now)
    current_scope = item.lease.token_scope or item.contract.permissions
    scope = narrow_scope(body.requested_scope, current_scope, "body.requested_scope")
    token = capability_token(
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
    record_usage(out, state, command, item, body.usage_delta, usage)


def under_lease(
    state: GroupState,
    command: command_pb2.Command,
    ctx: DecisionContext,
    body: wp.WorkRenewLease | wp.WorkCheckpoint | wp.WorkBlock | wp.WorkSubmit | wp.WorkReportProgress,
    name: str,
) -> tuple[WorkItemState, dict[str, int]]:
    """Commands of an executing owner: ACTIVE, the current lease id (MW-11.3-04/05), usage within budget."""
    item = work_item(state, body.work_item_id)
    require_state(item, (ACTIVE,), name)
    require_lease(item, command, ctx, body.lease_id, body.ownership_epoch)
    return item, check_usage(state, item, body.usage_delta, "body.usage_delta")


def _buffered(
    state: GroupState,
    command: command_pb2.Command,
    ctx: DecisionContext,
    out: Emitter,
    body: wp.WorkCheckpoint | wp.WorkReportProgress,
    name: str,
    allowed: tuple[int, ...],
) -> Reconciled | None:
    """A buffered offline command (MW-11.5-10/12): under its historical lease, which may have expired
    since, with its usage event appended first; None for an online command. A newer execution
    lease means the Worker started again before reconciling: its buffer is stale (MW-11.5-06)."""
    binding = buffered(command)
    if binding is None:
        return None
    reconciled = reconcile(
        state,
        command,
        ctx,
        out,
        binding,
        work_item_id=body.work_item_id,
        lease_id=body.lease_id,
        ownership_epoch=body.ownership_epoch,
        usage_delta=body.usage_delta,
    )
    require_state(reconciled.item, allowed, name)
    lease = reconciled.item.lease
    if lease is not None and lease.lease_id != body.lease_id:
        raise Rejected(
            R.REJECTION_REASON_LEASE_STALE,
            f"{body.work_item_id} runs under a newer lease {lease.lease_id}; buffered commands come first",
        )
    return reconciled


def _checkpoint(command: command_pb2.Command, given: wp.Checkpoint) -> wp.Checkpoint:
    """The checkpoint as recorded: a copy with its id, derived from the command when not given."""
    checkpoint = wp.Checkpoint()
    checkpoint.CopyFrom(given)
    cid = given.checkpoint_id or ids.derived_id("ckpt", command.group_id, command.command_id)
    if not ids.is_valid(cid):
        raise invalid("body.checkpoint.checkpoint_id", "not a valid id")
    checkpoint.checkpoint_id = cid
    return checkpoint


def _kept_ownership(item: WorkItemState, now: datetime, keep: timedelta, kind: int) -> wp.OwnershipGrant:
    """The bounded ownership lease the owner keeps once it released execution (T08, T09)."""
    owner = item.owner
    assert owner is not None
    return ownership_grant(item, owner.agent_id, owner.ownership_epoch, now, keep, kind, owner.offer_id)


def work_checkpoint(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T08: durable progress; releases execution, keeps a bounded ownership lease."""
    assert state is not None
    body = command.work_checkpoint
    offline = _buffered(state, command, ctx, out, body, "work.checkpoint", (ACTIVE, QUEUED))
    item, usage = (
        (offline.item, offline.usage)
        if offline
        else under_lease(state, command, ctx, body, "work.checkpoint")
    )
    if body.preemption_request_id and body.preemption_request_id != item.preemption_request_id:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND, f"no open preemption request {body.preemption_request_id}"
        )
    checkpoint = _checkpoint(command, body.checkpoint)
    keep = policy_duration(
        item.contract.time_policy.checkpoint_ownership_duration, DEFAULT_CHECKPOINT_OWNERSHIP, "time_policy"
    )
    out.emit(
        "work.checkpointed",
        "work_checkpointed",
        wp.WorkCheckpointed(
            work_item_id=item.work_item_id,
            lease_id=body.lease_id,
            ownership_epoch=body.ownership_epoch,
            checkpoint=checkpoint,
            ownership=_kept_ownership(item, ctx.now, keep, wp.WORK_LEASE_KIND_OWNERSHIP),
            preemption_request_id=body.preemption_request_id,
        ),
    )
    if not offline:  # offline, the usage event came first (MW-11.5-12)
        record_usage(out, state, command, item, body.usage_delta, usage)


def work_block(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T09 / MW-11.4-04/05: checkpoint, state the required resolution, release the slot."""
    assert state is not None
    body = command.work_block
    item, usage = under_lease(state, command, ctx, body, "work.block")
    if not body.blockers:
        raise invalid("body.blockers", "at least one blocker with its required resolution")
    for i, b in enumerate(body.blockers):
        if not b.kind or not b.required_resolution:
            raise invalid(f"body.blockers[{i}]", "kind and required_resolution are required (MW-11.4-04)")
    if not body.HasField("checkpoint"):
        raise invalid("body.checkpoint", "a block is a checkpoint plus a blocked lease (MW-10.2-T09)")
    checkpoint = _checkpoint(command, body.checkpoint)
    policy = policy_duration(
        item.contract.time_policy.blocked_lease_duration,
        DEFAULT_BLOCKED_LEASE,
        "time_policy.blocked_lease_duration",
    )
    keep = min(
        policy, policy_duration(body.requested_blocked_duration, policy, "body.requested_blocked_duration")
    )
    out.emit(
        "work.blocked",
        "work_blocked",
        wp.WorkBlocked(
            work_item_id=item.work_item_id,
            lease_id=body.lease_id,
            ownership_epoch=body.ownership_epoch,
            checkpoint=checkpoint,
            blockers=body.blockers,
            ownership=_kept_ownership(item, ctx.now, keep, wp.WORK_LEASE_KIND_BLOCKED),
        ),
    )
    record_usage(out, state, command, item, body.usage_delta, usage)


def work_unblock(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T10 / MW-11.4-07: back to the ready queue, or to `open` once ownership has expired."""
    assert state is not None
    body = command.work_unblock
    item = work_item(state, body.work_item_id)
    coordination(state, command, ctx, body.coordinator_epoch, "work.unblock")
    require_state(item, (BLOCKED,), "work.unblock")
    child = item.running_child
    if child is not None:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"the child Mission {child.child_mission_id} is running; the WorkItem unblocks when it ends (MW-10.2-T16/T17), "
            "or cancel the WorkItem to cancel the child",
            child_mission_id=child.child_mission_id,
        )
    require_reason(body.resolution, "body.resolution")
    live = live_owner(item, ctx.now)
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


def work_report_progress(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-11.4-01/02: structured progress (phase, milestones, next checkpoint, blockers, estimate,
    Evidence references) from the executing owner under its lease, or from the owner of a queued or
    blocked WorkItem without one (a changed schedule, MW-11.2-01); no percentage carries authority."""
    assert state is not None
    body = command.work_report_progress
    item = work_item(state, body.work_item_id)
    offline = _buffered(state, command, ctx, out, body, "work.report_progress", (ACTIVE, QUEUED, BLOCKED))
    if offline:
        usage = offline.usage
    elif item.state in (
        QUEUED,
        BLOCKED,
    ):  # not executing: the owner reports (a schedule, a blocker) with no lease
        if body.lease_id:
            raise invalid(
                "body.lease_id", f"{item.work_item_id} is not active: a progress report cites no lease"
            )
        require_owner(item, command, body.ownership_epoch)
        if not live_owner(item, ctx.now):
            raise Rejected(
                R.REJECTION_REASON_LEASE_EXPIRED, f"the ownership lease of {item.work_item_id} has lapsed"
            )
        usage = check_usage(state, item, body.usage_delta, "body.usage_delta")
    else:
        item, usage = under_lease(state, command, ctx, body, "work.report_progress")
    report = body.report
    if not report.phase or not report.HasField("next_checkpoint") or not report.HasField("revised_estimate"):
        raise invalid("body.report", "phase, next_checkpoint and revised_estimate are required (MW-11.4-01)")
    for i, b in enumerate(report.blockers):
        if not b.kind or not b.required_resolution:
            raise invalid(f"body.report.blockers[{i}]", "kind and required_resolution are required")
    if len(report.revised_estimate.reason) > MAX_ESTIMATE_REASON:
        raise invalid("body.report.revised_estimate.reason", f"at most {MAX_ESTIMATE_REASON} characters")
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
    if not offline:
        record_usage(out, state, command, item, body.usage_delta, usage)


# ---------------------------------------------------------------- evolve rules


def _renewed(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_lease_renewed
    item = touch(state, event, p.work_item_id)
    assert item.lease is not None
    item.lease.expires_at = from_timestamp(p.renewal.expires_at)
    record = item.lease_history.get(item.lease.lease_id)
    if record is not None:
        record.expires_at = item.lease.expires_at
    item.lease.renewals += 1
    if p.HasField("token"):  # rotation: the previous token is no longer current
        item.lease.token_id = p.token.token_id
        item.lease.token_scope = p.token.scope
    if item.owner is not None:
        item.owner.expires_at = max(item.owner.expires_at, item.lease.expires_at)


def _released_to(new_state: int, payload: str) -> Applier:
    def apply(state: GroupState, event: event_pb2.Event) -> None:
        p = getattr(event, payload)
        item = touch(state, event, p.work_item_id)
        own(item, p.ownership)
        end_lease(item, event, wp.LEASE_END_KIND_RELEASED)
        item.last_checkpoint_id = p.checkpoint.checkpoint_id
        item.preemption_request_id = ""  # a checkpoint answers any open preemption request
        item.blockers = tuple(b.required_resolution for b in getattr(p, "blockers", ()))
        item.state = new_state

    return apply


def _unblocked(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_unblocked
    item = touch(state, event, p.work_item_id)
    item.state = p.next_state
    item.blockers = ()
    if p.next_state == OPEN:
        item.owner = None


def _progress_reported(state: GroupState, event: event_pb2.Event) -> None:
    touch(state, event, event.work_progress_reported.work_item_id)


# ---------------------------------------------------------------- the declarations

KINDS = (
    # Usage: also recorded by checkpoints, blocks, progress reports, submissions and failures.
    CommandKind(
        "work_renew_lease",
        work_renew_lease,
        {"work_lease_renewed": _renewed, "resource_usage_recorded": apply_usage},
    ),
    CommandKind(
        "work_checkpoint",
        work_checkpoint,
        {"work_checkpointed": _released_to(QUEUED, "work_checkpointed")},
        bufferable_offline=True,
    ),
    CommandKind("work_block", work_block, {"work_blocked": _released_to(BLOCKED, "work_blocked")}),
    CommandKind("work_unblock", work_unblock, {"work_unblocked": _unblocked}),
    CommandKind(
        "work_report_progress",
        work_report_progress,
        {"work_progress_reported": _progress_reported},
        bufferable_offline=True,
    ),
)
