"""Refusals explain themselves: the exact message of WorkItem refusals whose text names the rule that
was broken. Clients switch on the reason and metadata, never on the text (docs/errors.md); these
pin the text so an operator reading it gets the rule the spec states."""

from __future__ import annotations

from datetime import timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.offline_core import LEASE_ID, LEASE_S, NOW, binding, buffered, decide, started, with_mission
from tests.work_execution_fixtures import at, refused, report, run, with_reviewer

BASE = started(with_mission())
IN_GRACE = NOW + timedelta(seconds=LEASE_S + 30)
LATER = NOW + timedelta(minutes=4)


@pytest.mark.req("MW-10.2-T09", "MW-11.4-01", "MW-13.2-03")
def test_the_messages_of_malformed_work_commands_name_the_rule() -> None:
    no_checkpoint = wp.WorkBlock(
        work_item_id="wi",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        blockers=[wp.Blocker(blocker_id="b", kind=wp.BLOCKER_KIND_DEPENDENCY, required_resolution="r")],
    )
    assert refused(BASE, "work_block", no_checkpoint, at=at(5)).message == (
        "body.checkpoint: a block is a checkpoint plus a blocked lease (MW-10.2-T09)"
    )
    bare = wp.WorkReportProgress(
        work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1, report=report(phase="")
    )
    assert refused(BASE, "work_report_progress", bare, at=at(5)).message == (
        "body.report: phase, next_checkpoint and revised_estimate are required (MW-11.4-01)"
    )
    submit = wp.WorkSubmit(
        work_item_id="wi",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        contract_revision=1,
        artifacts=[builders.artifact()],
        evidence=[builders.evidence()],
    )
    submitted = run(with_reviewer(BASE), "work_submit", submit, at=at(5))
    again = wp.WorkRecordEvidence(work_item_id="wi", evidence=builders.evidence())
    assert refused(submitted, "work_record_evidence", again, "rev", at=at(6)).message == (
        "body.evidence.evidence_id: already recorded for this WorkItem"
    )
    active = with_reviewer(BASE)
    assert refused(active, "work_record_evidence", again, "rev", at=at(6)).message == (
        "work.record_evidence is not allowed from active (MW-10.2-05)"
    )


@pytest.mark.req("MW-11.5-08", "OP-23")
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ownership_epoch", 7, "binding.ownership_epoch: differs from the command's ownership_epoch"),
        ("usage_delta", None, "binding.usage_delta: differs from the command's usage_delta"),
        (
            "grace_deadline",
            None,
            "binding.grace_deadline: the grace deadline is at or after the lease expiry (OP-23)",
        ),
    ],
)
def test_the_messages_of_a_binding_at_odds_with_its_command_name_the_rule(
    field: str, value: object, message: str
) -> None:
    b = binding(BASE, IN_GRACE)
    c = buffered(BASE, "work_report_progress", b)
    if field == "ownership_epoch":
        c.work_report_progress.ownership_epoch = 7
        b.ownership_epoch = 7
        c.extensions[0].data = b.SerializeToString()
        c.work_report_progress.ownership_epoch = 1  # the body says 1, the binding 7
    elif field == "usage_delta":
        c.work_report_progress.usage_delta.tokens += 1
    else:
        b.grace_deadline.CopyFrom(to_timestamp(NOW + timedelta(seconds=LEASE_S - 1)))
        c.extensions[0].data = b.SerializeToString()
    rejection = decide(BASE, c, LATER)
    assert rejection.message == message  # type: ignore[union-attr]


@pytest.mark.req("MW-10.2-T08", "MW-10.2-T12")
def test_the_messages_of_a_checkpoint_for_no_preemption_and_an_early_acceptance_name_them() -> None:
    body = wp.WorkCheckpoint(
        work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1, preemption_request_id="pre-2"
    )
    assert refused(BASE, "work_checkpoint", body, at=at(5)).message == "no open preemption request pre-2"
    accept = wp.WorkAcceptResult(work_item_id="wi", coordinator_epoch=1)
    assert refused(BASE, "work_accept_result", accept, "coord", at=at(5)).message == (
        "work.accept_result is not allowed from active (MW-10.2-05)"
    )


@pytest.mark.req("MW-11.3-04", "MW-13.2-04", "MW-11.5-07")
def test_the_messages_of_renewals_evidence_and_bindings_name_the_rule() -> None:
    renew = wp.WorkRenewLease(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1)
    queued = run(
        BASE,
        "work_checkpoint",
        wp.WorkCheckpoint(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1),
        at=at(5),
    )
    assert (
        refused(queued, "work_renew_lease", renew, at=at(6)).message
        == "work.renew_lease is not allowed from queued (MW-10.2-05)"
    )
    bad_id = wp.WorkCheckpoint(
        work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1, checkpoint=wp.Checkpoint(checkpoint_id="a b")
    )
    assert (
        refused(BASE, "work_checkpoint", bad_id, at=at(5)).message
        == "body.checkpoint.checkpoint_id: not a valid id"
    )
    submit = wp.WorkSubmit(
        work_item_id="wi",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        contract_revision=1,
        artifacts=[builders.artifact()],
    )
    assert refused(BASE, "work_submit", submit, at=at(5)).message == "body.evidence: Evidence is required"
    submit.evidence.append(builders.with_overrides(builders.evidence(), {"method": 0}))
    assert refused(BASE, "work_submit", submit, at=at(5)).message == (
        "body.evidence[0]: evidence_id, method and result are required (MW-13.2-04)"
    )
    c = buffered(BASE, "work_report_progress", binding(BASE, IN_GRACE))
    c.extensions.add().CopyFrom(c.extensions[0])
    rejection = decide(BASE, c, LATER)
    assert (rejection.message, rejection.metadata["field"]) == (  # type: ignore[union-attr]
        "binding: a command carries one bounded-offline-execution binding",
        "binding",
    )
    del c.extensions[1]
    c.extensions[0].data = b"\xff\xff"
    rejection = decide(BASE, c, LATER)
    assert (rejection.message, rejection.metadata["field"]) == (  # type: ignore[union-attr]
        "binding: data is not a BoundedOfflineExecutionBinding",
        "binding",
    )
