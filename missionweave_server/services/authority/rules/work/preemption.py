"""MW-11.3-10..12: cooperative preemption requests (answered by a checkpoint citing them)."""

from __future__ import annotations

from missionweave.kernel import ids
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import (
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    invalid,
)
from missionweave_server.services.authority.rules.work.common import (
    ACTIVE,
    coordination,
    require_state,
    touch,
    work_item,
)
from missionweave_server.services.authority.rules.work.leases import require_lease
from missionweave_server.services.authority.state import GroupState


def work_request_preemption(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-11.3-10..12: cooperative preemption. The request interrupts nothing; the Worker checkpoints at
    a safe point (citing the request), which releases the slot and re-queues the WorkItem. Issued by
    the Coordinator, or by the owner under its lease for its own scheduler's request (the audit trail)."""
    assert state is not None
    body = command.work_request_preemption
    item = work_item(state, body.work_item_id)
    by_owner = (
        not body.coordinator_epoch and item.owner is not None and command.actor_id == item.owner.agent_id
    )
    if by_owner:  # the owning Worker records its own scheduler's request, under its current lease
        require_state(item, (ACTIVE,), "work.request_preemption")
        require_lease(item, command, ctx, body.lease_id, body.ownership_epoch)
    else:
        coordination(state, command, ctx, body.coordinator_epoch, "work.request_preemption")
        require_state(item, (ACTIVE,), "work.request_preemption")
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


# ---------------------------------------------------------------- evolve rules


def _preemption_requested(state: GroupState, event: event_pb2.Event) -> None:
    item = touch(state, event, event.work_preemption_requested.work_item_id)
    item.preemption_request_id = event.work_preemption_requested.preemption_request_id


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "work_request_preemption",
        work_request_preemption,
        {"work_preemption_requested": _preemption_requested},
    ),
)
