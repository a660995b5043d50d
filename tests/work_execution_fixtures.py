"""Shared steps of the WorkItem rule tests (test_core_execution_rules.py, test_core_review_rules.py,
test_core_ending_rules.py): one Group whose Worker runs ``wi`` under ``lease-1`` (tests.offline_core),
commands decided at a given time, and the exact events they append."""

from __future__ import annotations

from datetime import datetime, timedelta

from google.protobuf.message import Message

from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.common import StoredArtifact
from missionweave_server.services.authority.state import GroupState, IdentityInfo
from tests import offline_core
from tests.core_group import evolved
from tests.offline_core import NOW, command
from tests.store_double import as_if_uploaded

R = common_pb2.RejectionReason
USAGE = "ext.missionweaveprotocol.core.resource_usage_recorded"  # MW-11.5-12 names it


def events(decision: decider.Decision) -> list[tuple[str, Message]]:
    """(type, payload) of each event, in order: the contract a consumer reads."""
    assert not isinstance(decision, Rejected), decision
    return [(e.type, getattr(e, e.WhichOneof("payload"))) for e in decision]  # type: ignore[arg-type]


# The Group's identities plus a reviewer agent (granted the reviewer role by ``with_reviewer``).
IDS = {**offline_core.IDS, "rev": IdentityInfo("rev", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1)}


def decide(
    state: GroupState,
    kind: str,
    body: Message,
    actor: str = "worker",
    at: datetime = NOW,
    artifacts: dict[str, StoredArtifact] | None = None,
    **kw: object,
) -> tuple[command_pb2.Command, decider.Decision]:
    """The command and its decision; ``artifacts``: what the shell found stored for it."""
    c = command(state, kind, body, actor, at=at, **kw)  # type: ignore[arg-type]
    return c, decider.decide(
        state, c, as_if_uploaded(state, c, decider.DecisionContext(at, IDS, artifacts=artifacts or {}))
    )


def with_reviewer(state: GroupState) -> GroupState:
    grant = membership_pb2.MembershipGrant(member_id="rev", role=membership_pb2.MEMBER_ROLE_REVIEWER)
    return run(state, "membership_grant", grant, "alice")


def run(
    state: GroupState, kind: str, body: Message, actor: str = "worker", at: datetime = NOW, **kw: object
) -> GroupState:
    _c, decision = decide(state, kind, body, actor, at, **kw)
    return evolved(state, decision)


def evolve_all(state: GroupState, decision: decider.Decision) -> GroupState:
    return evolved(state, decision)


def refused(
    state: GroupState, kind: str, body: Message, actor: str = "worker", at: datetime = NOW, **kw: object
) -> Rejected:
    _, decision = decide(state, kind, body, actor, at, **kw)
    assert isinstance(decision, Rejected), f"{kind} was accepted: {decision}"
    return decision


def invalid_field(rejection: Rejected) -> str:
    assert rejection.reason == R.REJECTION_REASON_INVALID_ARGUMENT, rejection
    return str(rejection.metadata["field"])


def vector(**dims: int) -> common_pb2.ResourceVector:
    return common_pb2.ResourceVector(currency="EUR", **dims)  # type: ignore[arg-type]


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def report(**overrides: object) -> wp.ProgressReport:
    r = wp.ProgressReport(
        phase="reconciling",
        next_checkpoint=wp.PlannedCheckpoint(description="ledger B"),
        revised_estimate=wp.RevisedEstimate(reason="on track"),
    )
    for k, v in overrides.items():
        if v is None:
            r.ClearField(k)
        elif isinstance(v, list):
            getattr(r, k).extend(v)
        else:
            getattr(r, k).CopyFrom(v) if isinstance(v, Message) else setattr(r, k, v)
    return r


def usage_event(
    c: command_pb2.Command,
    delta: common_pb2.ResourceVector,
    item_used: dict[str, int],
    mission_used: dict[str, int],
    *,
    lease_id: str = "lease-1",
    session: int = 1,
) -> wp.ResourceUsageRecorded:
    """The usage event of an online command by the Worker under ``lease_id`` at ownership epoch 1."""
    return wp.ResourceUsageRecorded(
        work_item_id="wi",
        delta=delta,
        agent_id="worker",
        lease_id=lease_id,
        ownership_epoch=1,
        execution_session_epoch=session,
        reporting_session_epoch=c.session_epoch,
        source=wp.USAGE_SOURCE_ONLINE,
        command_id=c.command_id,
        work_item_used=vector(**item_used),
        mission_used=vector(**mission_used),
    )


__all__ = ["NOW", "USAGE", "R", "event_pb2"]
