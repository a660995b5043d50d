"""A buffered offline checkpoint and progress report reconciled through decide/evolve, with the exact
events: the usage event first, naming the historical lease and both sessions, then the checkpoint
or report judged under the historical lease (MW-11.5-10..12); and the refusals' metadata."""

from __future__ import annotations

from datetime import timedelta

import pytest

from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.extensions import BOUNDED_OFFLINE_EXECUTION
from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp
from tests.offline_core import (
    LEASE_ID,
    LEASE_S,
    NOW,
    apply,
    binding,
    buffered,
    command,
    decide,
    started,
    with_mission,
)
from tests.work_execution_fixtures import USAGE, R, events, evolve_all

BASE = started(with_mission())
EXPIRY = NOW + timedelta(seconds=LEASE_S)
IN_GRACE = EXPIRY + timedelta(seconds=30)
LATER = NOW + timedelta(minutes=4)  # reconnected within the Coordinator's lease
USAGE_DELTA = common_pb2.ResourceVector(currency="EUR", tokens=300)


def offline_usage(c: object, b: wp.BoundedOfflineExecutionBinding) -> wp.ResourceUsageRecorded:
    return wp.ResourceUsageRecorded(
        work_item_id="wi",
        delta=USAGE_DELTA,
        agent_id="worker",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        execution_session_epoch=1,
        reporting_session_epoch=2,
        source=wp.USAGE_SOURCE_OFFLINE_RECONCILIATION,
        command_id=c.command_id,  # type: ignore[attr-defined]
        work_item_used=common_pb2.ResourceVector(currency="EUR", tokens=300),
        mission_used=common_pb2.ResourceVector(currency="EUR", tokens=300),
    )


@pytest.mark.req("MW-11.5-10", "MW-11.5-12", "MW-10.2-T08")
def test_a_buffered_checkpoint_is_charged_first_then_releases_the_historical_lease() -> None:
    b = binding(BASE, IN_GRACE, usage=USAGE_DELTA)
    c = buffered(BASE, "work_checkpoint", b)
    decision = decide(BASE, c, LATER)
    ownership = wp.OwnershipGrant(
        work_item_id="wi",
        agent_id="worker",
        ownership_epoch=1,
        granted_at=to_timestamp(LATER),
        start_deadline=to_timestamp(LATER + timedelta(seconds=120)),
        lease_kind=wp.WORK_LEASE_KIND_OWNERSHIP,
        expires_at=to_timestamp(LATER + timedelta(minutes=30)),
        offer_id="off-wi",
        contract_revision=1,
    )
    checkpointed = wp.WorkCheckpointed(
        work_item_id="wi",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        ownership=ownership,
        checkpoint=wp.Checkpoint(
            completed_operation_ids=["offline-step"],
            checkpoint_id=ids.derived_id("ckpt", c.group_id, c.command_id),
        ),
    )
    assert events(decision) == [
        (USAGE, offline_usage(c, b)),
        ("work.checkpointed", checkpointed),
    ]  # charged once
    item = evolve_all(BASE, decision).work_items["wi"]
    assert (item.state, item.lease, item.used["tokens"]) == (wp.WORK_ITEM_STATE_QUEUED, None, 300)


@pytest.mark.req("MW-11.5-10", "MW-11.5-12", "MW-11.4-01")
def test_a_buffered_progress_report_is_charged_first_and_recorded_once() -> None:
    b = binding(BASE, IN_GRACE, usage=USAGE_DELTA)
    c = buffered(BASE, "work_report_progress", b)
    got = events(decide(BASE, c, LATER))
    assert [t for t, _ in got] == [USAGE, "work.progress_reported"]
    assert got[0][1] == offline_usage(c, b)
    assert got[1][1] == wp.WorkProgressReported(
        work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1, report=c.work_report_progress.report
    )


@pytest.mark.req("MW-11.5-10")
def test_a_buffered_report_lacking_its_structure_is_refused_after_the_binding_checks() -> None:
    b = binding(BASE, IN_GRACE, usage=USAGE_DELTA)
    c = buffered(BASE, "work_report_progress", b)
    c.work_report_progress.report.phase = ""
    rejection = decide(BASE, c, LATER)
    assert isinstance(rejection, Exception)
    assert (rejection.reason, rejection.metadata["field"]) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        "body.report",
    )  # type: ignore[attr-defined]


@pytest.mark.req("MW-11.5-07")
def test_a_kind_never_buffered_is_refused_naming_the_extension() -> None:
    c = buffered(BASE, "work_report_progress", binding(BASE, IN_GRACE))
    body = wp.WorkRenewLease(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1)
    c.work_renew_lease.CopyFrom(body)
    rejection = decide(BASE, c, LATER)
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_KIND_NOT_BUFFERABLE  # type: ignore[union-attr]
    assert dict(rejection.metadata) == {"command_kind": "work.renew_lease", "urn": BOUNDED_OFFLINE_EXECUTION}  # type: ignore[union-attr]


@pytest.mark.req("MW-11.5-10")
def test_buffered_after_the_lease_was_released_names_how_and_when_it_ended() -> None:
    body = wp.WorkCheckpoint(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1)
    released_at = NOW + timedelta(seconds=40)
    state = apply(BASE, command(BASE, "work_checkpoint", body, "worker", at=released_at), released_at)
    rejection = decide(
        state, buffered(state, "work_report_progress", binding(state, NOW + timedelta(seconds=45))), LATER
    )
    assert rejection.reason == R.REJECTION_REASON_OFFLINE_AFTER_LEASE_END  # type: ignore[union-attr]
    assert dict(rejection.metadata) == {  # type: ignore[union-attr]
        "rule": "lease_ended",
        "end_kind": "LEASE_END_KIND_RELEASED",
        "ended_at": released_at.isoformat(),
    }
