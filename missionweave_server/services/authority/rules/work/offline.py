"""Bounded offline execution at the Authority (MW-11.5-07..13, OP-05, OP-21..23).

A command carrying the critical bounded-offline-execution binding was buffered by a Worker that
had lost the Group service, and arrives (rebased and re-signed, MW-11.5-09) from the Worker's
current session. It is judged against the Authority's own record of the historical lease it names
(``WorkItemState.lease_history``), never against the Worker's times alone: the window, the lease's
end, the ownership and the Conversation (MW-11.5-10). Its usage is charged in the same append and
before the progress it carries (MW-11.5-11/12); any overflow refuses both (MW-11.5-13).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from google.protobuf.message import DecodeError

from missionweave.kernel.clock import from_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.kernel.extensions import BOUNDED_OFFLINE_EXECUTION, bindings
from missionweave.v1 import command_pb2, common_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import (
    DecisionContext,
    Emitter,
    R,
    check_well_formed_times,
    spec_name,
)
from missionweave_server.services.authority.rules.work.common import work_item
from missionweave_server.services.authority.rules.work.usage import check_usage, record_usage, usage_problem
from missionweave_server.services.authority.state import GroupState, LeaseRecord, WorkItemState

Binding = wp.BoundedOfflineExecutionBinding
# The eleven fields of MW-11.5-08, plus the bound Conversation (MW-11.5-10); all required.
REQUIRED = (
    "agent_id",
    "group_id",
    "work_item_id",
    "original_session_epoch",
    "ownership_epoch",
    "historical_lease_id",
    "disconnected_at",
    "buffered_at",
    "grace_deadline",
    "historical_lease_expires_at",
    "usage_delta",
    "conversation_id",
)


@dataclass(frozen=True)
class Reconciled:
    """A buffered command that passed MW-11.5-10, with its usage charged (its event appended)."""

    item: WorkItemState
    binding: Binding
    lease: LeaseRecord
    usage: dict[str, int]


def buffered(command: command_pb2.Command) -> Binding | None:
    """The binding of a buffered offline command (parsed, well formed), None for an online one."""
    found = bindings(command, BOUNDED_OFFLINE_EXECUTION)
    if not found:
        return None
    if len(found) > 1:
        raise _bad("binding", "duplicate", "a command carries one bounded-offline-execution binding")
    if not found[0].critical:
        raise _bad(
            "binding", "not_critical", "the bounded-offline-execution binding is critical (MW-11.5-07)"
        )
    binding = Binding()
    try:
        binding.ParseFromString(found[0].data)
    except DecodeError:
        raise _bad("binding", "malformed", "data is not a BoundedOfflineExecutionBinding") from None
    return binding


def check_bufferable(command: command_pb2.Command, body: str, bufferable: bool) -> None:
    """Only progress, checkpoints and WorkItem Messages are buffered (MW-11.5-04/05, OP-20).

    The first rule ``decider.decide`` applies to every command, so it also refuses, before any
    rule converts one, a Timestamp or Duration of the body outside its defined range (MALFORMED)."""
    check_well_formed_times(getattr(command, body), f"body.{body}.")
    if not bufferable and bindings(command, BOUNDED_OFFLINE_EXECUTION):
        raise Rejected(
            R.REJECTION_REASON_OFFLINE_KIND_NOT_BUFFERABLE,
            f"{spec_name(body)} is never buffered offline: only work.checkpoint, work.report_progress and "
            "message.post in the WorkItem Conversation are",
            command_kind=spec_name(body),
            urn=BOUNDED_OFFLINE_EXECUTION,
        )


def reconcile(
    state: GroupState,
    command: command_pb2.Command,
    ctx: DecisionContext,
    out: Emitter,
    binding: Binding,
    *,
    work_item_id: str | None = None,
    lease_id: str | None = None,
    ownership_epoch: int | None = None,
    usage_delta: common_pb2.ResourceVector | None = None,
    conversation_id: str = "",
) -> Reconciled:
    """MW-11.5-10, then MW-11.5-12 steps 1-2: checks the buffered command against the historical
    lease and appends its usage event (one per nonzero delta) before the caller applies it (step 3).
    The keyword arguments are what the command's body says (None: nothing), each matched against
    the binding."""
    _complete(binding, command)
    _matches(binding, "work_item_id", work_item_id)
    _matches(binding, "historical_lease_id", lease_id)
    if ownership_epoch is not None and ownership_epoch != binding.ownership_epoch:
        raise _bad("binding.ownership_epoch", "mismatch", "differs from the command's ownership_epoch")
    if usage_delta is not None and usage_delta != binding.usage_delta:
        raise _bad("binding.usage_delta", "mismatch", "differs from the command's usage_delta")
    item = work_item(state, binding.work_item_id)
    for bound in (binding.conversation_id, conversation_id or item.conversation_id):
        if bound != item.conversation_id:
            raise Rejected(
                R.REJECTION_REASON_OFFLINE_OUTSIDE_CONVERSATION,
                f"buffered progress lies outside the Conversation {item.conversation_id} of {item.work_item_id}",
                rule="conversation",
                conversation_id=item.conversation_id,
            )
    owner = item.owner
    if (
        owner is None
        or owner.agent_id != command.actor_id
        or owner.ownership_epoch != binding.ownership_epoch
    ):
        current = owner.ownership_epoch if owner else 0
        raise Rejected(
            R.REJECTION_REASON_OFFLINE_AFTER_OWNERSHIP_CHANGE,
            f"buffered under ownership epoch {binding.ownership_epoch}; the ownership of {item.work_item_id} has changed",
            rule="ownership_changed",
            current_epoch=current,
        )
    lease = _historical_lease(item, binding, command)
    _within_window(item, lease, binding, ctx.now)
    problem = usage_problem(item, binding.usage_delta)
    if problem is not None:
        raise _bad(
            f"binding.usage_delta{problem[1]}", problem[0], "not a usage delta of this WorkItem's budget"
        )
    usage = check_usage(state, item, binding.usage_delta, "binding.usage_delta")
    record_usage(out, state, command, item, binding.usage_delta, usage, offline=binding)
    return Reconciled(item, binding, lease, usage)


def _complete(binding: Binding, command: command_pb2.Command) -> None:
    for name in REQUIRED:
        present = binding.HasField(name) if name in _MESSAGES else bool(getattr(binding, name))  # type: ignore[arg-type]
        if not present:
            raise _bad(f"binding.{name}", "missing", "every field of the binding is required (MW-11.5-08)")
    _matches(binding, "agent_id", command.actor_id)
    _matches(binding, "group_id", command.group_id)


_MESSAGES = frozenset(
    {"disconnected_at", "buffered_at", "grace_deadline", "historical_lease_expires_at", "usage_delta"}
)


def _matches(binding: Binding, name: str, commanded: str | None) -> None:
    """``commanded`` is what the command says (None: it says nothing of it)."""
    if commanded is not None and getattr(binding, name) != commanded:
        raise _bad(f"binding.{name}", "mismatch", f"is not the command's {commanded!r}")


def _historical_lease(item: WorkItemState, binding: Binding, command: command_pb2.Command) -> LeaseRecord:
    """The lease as this Authority recorded it: this WorkItem's, this agent's, at that ownership
    epoch and original session epoch; the reconciling session is never an older one."""
    lease = item.lease_history.get(binding.historical_lease_id)
    claimed_expiry = from_timestamp(binding.historical_lease_expires_at)
    check = (
        "unknown"
        if lease is None
        else "agent"
        if lease.agent_id != command.actor_id
        else "ownership_epoch"
        if lease.ownership_epoch != binding.ownership_epoch
        else "session_epoch"
        if lease.session_epoch != binding.original_session_epoch
        or command.session_epoch < binding.original_session_epoch
        else "expiry"
        if claimed_expiry > lease.expires_at
        else ""
    )
    if lease is None or check:
        raise Rejected(
            R.REJECTION_REASON_OFFLINE_LEASE_UNKNOWN,
            f"{binding.historical_lease_id!r} is not a lease of {item.work_item_id} held by {command.actor_id} "
            f"at ownership epoch {binding.ownership_epoch} in session {binding.original_session_epoch} ({check})",
            rule="historical_lease",
            check=check,
        )
    return lease


def _within_window(item: WorkItemState, lease: LeaseRecord, binding: Binding, now: datetime) -> None:
    """OP-23: the window runs from the recorded lease start to the grace deadline, which is at most
    the recorded expiry plus the contract's grace period; the lease must not have ended before."""
    disconnected, at = from_timestamp(binding.disconnected_at), from_timestamp(binding.buffered_at)
    deadline = from_timestamp(binding.grace_deadline)
    if disconnected > at:
        raise _bad("binding.disconnected_at", "order", "the Worker buffers only after it lost the service")
    if deadline < from_timestamp(binding.historical_lease_expires_at):
        raise _bad(
            "binding.grace_deadline", "order", "the grace deadline is at or after the lease expiry (OP-23)"
        )
    period = item.contract.time_policy.offline_grace_period
    grace = period.ToTimedelta() if period.seconds or period.nanos else timedelta(0)
    check = (
        "no_grace_period"
        if grace <= timedelta(0)
        else "grace_deadline"
        if deadline > lease.expires_at + grace
        else "before_lease_start"
        if min(disconnected, at) < lease.started_at
        else "disconnected_after_expiry"
        if disconnected > lease.expires_at
        else "after_grace_deadline"
        if at > deadline
        else "in_future"
        if at > now
        else ""
    )
    if check:
        raise Rejected(
            R.REJECTION_REASON_OFFLINE_OUTSIDE_WINDOW,
            f"buffered at {at.isoformat()}, outside the lease/grace window of {lease.lease_id} "
            f"({lease.started_at.isoformat()} .. expiry {lease.expires_at.isoformat()} + grace {grace}): {check}",
            rule="window",
            check=check,
        )
    if lease.ended_at is not None and lease.ended_at <= at:
        raise Rejected(
            R.REJECTION_REASON_OFFLINE_AFTER_LEASE_END,
            f"buffered at {at.isoformat()}, after lease {lease.lease_id} ended at {lease.ended_at.isoformat()}",
            rule="lease_ended",
            end_kind=wp.LeaseEndKind.Name(wp.LeaseEndKind.ValueType(lease.end_kind)),
            ended_at=lease.ended_at.isoformat(),
        )


def _bad(field: str, check: str, message: str) -> Rejected:
    return Rejected(
        R.REJECTION_REASON_OFFLINE_BINDING_INVALID, f"{field}: {message}", field=field, check=check
    )
