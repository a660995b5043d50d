"""MW-10.2-T13, T14, T18: failure (with retries, MW-11.4-08/10), cancellation, and the Mission's end."""

from __future__ import annotations

from datetime import datetime, timedelta

from missionweave.kernel import ids
from missionweave.kernel.clock import from_timestamp
from missionweave.v1 import command_pb2, event_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import (
    Applier,
    CommandKind,
    DecisionContext,
    Emitter,
    invalid,
    named_digests,
    require_reason,
)
from missionweave_server.services.authority.rules.deliverables import evidence_refs, require_evidence_held
from missionweave_server.services.authority.rules.work.common import (
    CANCELLED,
    FAILED,
    QUEUED,
    UNFINISHED,
    coordination,
    end_lease,
    policy_duration,
    require_state,
    touch,
    work_item,
)
from missionweave_server.services.authority.rules.work.leases import require_lease, revoke_lease
from missionweave_server.services.authority.rules.work.offers import withdraw_offers
from missionweave_server.services.authority.rules.work.review import require_evidence
from missionweave_server.services.authority.rules.work.usage import check_usage, record_usage
from missionweave_server.services.authority.state import GroupState, WorkItemState


def _retry_at(item: WorkItemState, now: datetime, command_id: str) -> datetime | None:
    """When the next attempt may start, or None once the retry budgets are spent (MW-11.4-08)."""
    policy = item.contract.retry_policy
    if item.attempts >= policy.max_attempts:
        return None
    initial = policy_duration(policy.initial_backoff, timedelta(seconds=1), "retry_policy.initial_backoff")
    ceiling = policy_duration(policy.max_backoff, timedelta(minutes=5), "retry_policy.max_backoff")
    factor = (policy.backoff_multiplier_milli or 2000) / 1000
    backoff = min(ceiling, initial * factor ** max(0, item.attempts - 1))
    if policy.jitter:  # full jitter, drawn from the command id: the decision stays pure and replayable
        backoff *= int(ids.derived_id("jit", command_id).split("_", 1)[1], 16) / 2**104
    retry_at = now + backoff
    deadlines = [from_timestamp(item.contract.deadline)]
    if policy.HasField("retry_deadline"):
        deadlines.append(from_timestamp(policy.retry_deadline))
    return retry_at if retry_at < min(deadlines) else None


def work_fail(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T13: failure with Evidence, reported by the owner (under its lease) or the Coordinator."""
    assert state is not None
    body = command.work_fail
    item = work_item(state, body.work_item_id)
    require_state(item, UNFINISHED, "work.fail")
    role: int
    if body.lease_id:
        require_lease(item, command, ctx, body.lease_id, body.ownership_epoch)
        role = wp.WORK_ACTOR_ROLE_WORKER
    else:
        role = coordination(state, command, ctx, body.coordinator_epoch, "work.fail")
    evidence = require_evidence(body.evidence, "body.evidence", item, command, ctx.now)
    require_evidence_held(state, command, ctx, evidence, "body.evidence", item)
    require_reason(body.reason, "body.reason")
    if not body.kind:
        raise invalid("body.kind", "a failure kind is required")
    usage = check_usage(state, item, body.usage_delta, "body.usage_delta")
    record_usage(out, state, command, item, body.usage_delta, usage)
    kind = body.kind
    if role == wp.WORK_ACTOR_ROLE_WORKER and kind == wp.WORK_FAILURE_KIND_TRANSIENT:
        retry_at = _retry_at(item, ctx.now, command.command_id)
        if retry_at is not None:
            # MW-11.4-08: an automatic retry within the contract's attempt, backoff and deadline budgets.
            # The failed attempt's Evidence stays in the log beside the revocation.
            for e in evidence:
                out.emit(
                    "work.evidence_recorded",
                    "evidence_recorded",
                    wp.EvidenceRecorded(work_item_id=item.work_item_id, evidence=e),
                )
            revoke_lease(out, item, wp.LEASE_REVOCATION_CAUSE_FAILED, QUEUED, retry_not_before=retry_at)
            return
        kind = wp.WORK_FAILURE_KIND_RETRIES_EXHAUSTED  # MW-11.4-10
    _withdraw_open_offers(out, item)
    out.emit(
        "work.failed",
        "work_failed",
        wp.WorkFailed(
            work_item_id=item.work_item_id,
            reported_by=role,  # type: ignore[arg-type]
            kind=kind,
            evidence=evidence,
            reason=body.reason,  # type: ignore[arg-type]
            lease_id=item.lease.lease_id if item.lease else "",  # a Coordinator's failure revokes it too
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
    item = work_item(state, body.work_item_id)
    role = coordination(state, command, ctx, body.coordinator_epoch, "work.cancel")
    require_state(item, UNFINISHED, "work.cancel")
    require_reason(body.reason, "body.reason")
    _cancelled(out, item, role, body.reason)


def _withdraw_open_offers(out: Emitter, item: WorkItemState) -> None:
    """A WorkItem that is cancelled or fails leaves `offered`: its open offers are withdrawn with it (OP-13)."""
    open_offers = [o.offer_id for o in item.offers.values() if o.open]
    if open_offers:
        withdraw_offers(out, item, open_offers, wp.OFFER_WITHDRAWAL_REASON_WORK_ITEM_CLOSED)


def _cancelled(out: Emitter, item: WorkItemState, role: int, reason: str) -> None:
    _withdraw_open_offers(out, item)
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
            _withdraw_open_offers(out, item)
            out.emit(
                "work.failed",
                "work_failed",
                wp.WorkFailed(
                    work_item_id=item.work_item_id,
                    reported_by=wp.WORK_ACTOR_ROLE_AUTHORITY,
                    kind=wp.WORK_FAILURE_KIND_MISSION_FAILED,
                    reason=f"Mission failed: {reason}",
                    ownership_epoch=item.owner.ownership_epoch if item.owner else 0,
                    attempts=item.attempts,
                    previous_state=item.state,  # type: ignore[arg-type]
                ),
            )


# ---------------------------------------------------------------- evolve rules


def _ended(new_state: int, payload: str) -> Applier:
    def apply(state: GroupState, event: event_pb2.Event) -> None:
        item = touch(state, event, getattr(event, payload).work_item_id)
        item.state = new_state
        item.owner = None
        end_lease(item, event, wp.LEASE_END_KIND_REVOKED)  # a failure or a cancellation

    return apply


# ---------------------------------------------------------------- the declarations

KINDS = (
    # Failures and cancellations: also of every unfinished WorkItem when the Mission ends (T18).
    CommandKind(
        "work_fail",
        work_fail,
        {"work_failed": _ended(FAILED, "work_failed")},
        named_artifacts=lambda c: named_digests(evidence_refs(c.work_fail.evidence)),
    ),
    CommandKind("work_cancel", work_cancel, {"work_cancelled": _ended(CANCELLED, "work_cancelled")}),
)
