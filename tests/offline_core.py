"""A Group on the pure core whose Worker runs a WorkItem under a lease, and the buffered offline
commands it sends when it reconnects (bounded-offline-execution, MW-11.5-07..13)."""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime, timedelta

from google.protobuf.message import Message

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.kernel.extensions import BOUNDED_OFFLINE_EXECUTION
from missionweave.v1 import command_pb2, common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState, IdentityInfo
from tests import builders
from tests.core_group import evolved

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LEASE_S, GRACE_S = 60, 120
LEASE_ID = "lease-1"
AGENT = common_pb2.IDENTITY_KIND_AGENT
IDS = {
    "alice": IdentityInfo("alice", common_pb2.IDENTITY_KIND_HUMAN, session_epoch=1),
    "coord": IdentityInfo("coord", AGENT, session_epoch=1),
    "worker": IdentityInfo("worker", AGENT, session_epoch=2),
    "lead": IdentityInfo("lead", AGENT, session_epoch=1),
}
_n = itertools.count(1)


def ctx(now: datetime = NOW) -> decider.DecisionContext:
    return decider.DecisionContext(now, IDS)


def command(
    state: GroupState | None,
    kind: str,
    body: Message,
    actor: str,
    *,
    session: int = 1,
    at: datetime = NOW,
    binding: wp.BoundedOfflineExecutionBinding | None = None,
) -> command_pb2.Command:
    member = state.members.get(actor) if state else None
    c = command_pb2.Command(
        command_id=f"c{next(_n)}",
        group_id="grp_o",
        actor_id=actor,
        session_epoch=session,
        membership_epoch=member.membership_epoch if member else 0,
        issued_at=to_timestamp(at),
    )
    getattr(c, kind).CopyFrom(body)
    if binding is not None:
        c.extensions.add(urn=BOUNDED_OFFLINE_EXECUTION, critical=True, data=binding.SerializeToString())
    return c


def decide(state: GroupState | None, c: command_pb2.Command, now: datetime = NOW) -> decider.Decision:
    return decider.decide(state, c, ctx(now))


def apply(state: GroupState | None, c: command_pb2.Command, now: datetime = NOW) -> GroupState:
    events = decide(state, c, now)
    assert not isinstance(events, Rejected), f"{c.WhichOneof('body')}: {events!r}"
    return evolved(state, events)


def work_contract(grace_s: int = GRACE_S, **budget: int) -> wp.WorkContract:
    c = builders.contract(NOW)
    c.time_policy.execution_lease_duration.FromSeconds(LEASE_S)
    c.retry_policy.max_attempts = 20
    if grace_s:
        c.time_policy.offline_grace_period.FromSeconds(grace_s)
    for dim, value in budget.items():
        setattr(c.budget, dim, value)
    return c


def with_mission(**mission_budget: int) -> GroupState:
    create = builders.mission_create("alice", "coord", NOW)
    for dim, value in mission_budget.items():
        setattr(create.definition.budget, dim, value)
    state = apply(None, command(None, "mission_create", create, "alice"))
    for member, role in (
        ("worker", membership_pb2.MEMBER_ROLE_WORKER),
        ("lead", membership_pb2.MEMBER_ROLE_WORK_DELEGATE),
    ):
        grant = membership_pb2.MembershipGrant(member_id=member, role=role)
        state = apply(state, command(state, "membership_grant", grant, "alice"))
    return state


def over_committed(state: GroupState, **mission_caps: int) -> GroupState:
    """``state`` with the Mission's caps lowered below what its WorkItems hold: D162 refuses such
    budgets at authorize and offer, but a log from before it can hold them, and the Mission's cap
    still binds each usage report."""
    after = copy.deepcopy(state)
    assert after.mission is not None
    for dim, value in mission_caps.items():
        setattr(after.mission.definition.budget, dim, value)
    return after


def started(
    state: GroupState,
    work_item_id: str = "wi",
    contract: wp.WorkContract | None = None,
    *,
    grant_id: str = "",
    parent: str = "",
    lease_id: str = LEASE_ID,
    at: datetime = NOW,
) -> GroupState:
    """``work_item_id`` authorized (under ``grant_id`` by the delegate, if given), offered to the
    Worker, accepted and started at ``at`` under ``lease_id`` in session 1."""
    by = "lead" if grant_id else "coord"
    epoch = 0 if grant_id else 1
    authorize = wp.WorkAuthorize(
        work_item_id=work_item_id,
        title=work_item_id,
        contract=contract or work_contract(),
        coordinator_epoch=epoch,
        grant_id=grant_id,
        parent_work_item_id=parent,
    )
    state = apply(state, command(state, "work_authorize", authorize, by, at=at), at)
    offer = wp.WorkOffer(
        work_item_id=work_item_id,
        offer_id=f"off-{work_item_id}",
        candidate_ids=["worker"],
        expires_at=to_timestamp(at + timedelta(minutes=5)),
        selection_criteria=[builders.selection("worker")],
        coordinator_epoch=1,
    )
    state = apply(state, command(state, "work_offer", offer, "coord", at=at), at)
    accept = wp.WorkAcceptOffer(
        work_item_id=work_item_id, offer_id=f"off-{work_item_id}", contract_revision=1
    )
    state = apply(state, command(state, "work_accept_offer", accept, "worker", at=at), at)
    start = wp.WorkStart(work_item_id=work_item_id, ownership_epoch=1, lease_id=lease_id)
    return apply(state, command(state, "work_start", start, "worker", at=at), at)


def binding(
    state: GroupState,
    buffered_at: datetime,
    *,
    item_id: str = "wi",
    lease_id: str = LEASE_ID,
    usage: common_pb2.ResourceVector | None = None,
    **overrides: object,
) -> wp.BoundedOfflineExecutionBinding:
    """The binding the Worker records for a command it buffers at ``buffered_at`` (disconnected
    half-way through the lease, grace deadline = last known expiry + the contract's grace)."""
    item = state.work_items[item_id]
    lease = item.lease_history[lease_id]
    b = wp.BoundedOfflineExecutionBinding(
        agent_id="worker",
        group_id="grp_o",
        work_item_id=item_id,
        original_session_epoch=lease.session_epoch,
        ownership_epoch=lease.ownership_epoch,
        historical_lease_id=lease.lease_id,
        disconnected_at=to_timestamp(lease.started_at + (lease.expires_at - lease.started_at) / 2),
        buffered_at=to_timestamp(buffered_at),
        grace_deadline=to_timestamp(
            lease.expires_at + item.contract.time_policy.offline_grace_period.ToTimedelta()
        ),
        historical_lease_expires_at=to_timestamp(lease.expires_at),
        usage_delta=usage if usage is not None else common_pb2.ResourceVector(currency="EUR", tokens=100),
        conversation_id=item.conversation_id,
    )
    return builders.with_overrides(b, overrides)


def progress(binding: wp.BoundedOfflineExecutionBinding) -> wp.WorkReportProgress:
    return wp.WorkReportProgress(
        work_item_id=binding.work_item_id,
        lease_id=binding.historical_lease_id,
        ownership_epoch=binding.ownership_epoch,
        report=wp.ProgressReport(
            phase="offline",
            next_checkpoint=wp.PlannedCheckpoint(description="next"),
            revised_estimate=wp.RevisedEstimate(reason="unchanged"),
        ),
        usage_delta=binding.usage_delta,
    )


def checkpoint(binding: wp.BoundedOfflineExecutionBinding) -> wp.WorkCheckpoint:
    return wp.WorkCheckpoint(
        work_item_id=binding.work_item_id,
        lease_id=binding.historical_lease_id,
        ownership_epoch=binding.ownership_epoch,
        checkpoint=wp.Checkpoint(completed_operation_ids=["offline-step"]),
        usage_delta=binding.usage_delta,
    )


def buffered(
    state: GroupState, kind: str, b: wp.BoundedOfflineExecutionBinding, body: Message | None = None
) -> command_pb2.Command:
    """The buffered command as the reconnected Worker sends it: session 2, the binding unchanged."""
    if body is None:
        body = progress(b) if kind == "work_report_progress" else checkpoint(b)
    return command(state, kind, body, "worker", session=2, binding=b)
