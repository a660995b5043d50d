"""``mwp work accept-result``, ``evidence``, ``request-changes`` and ``reject``: a Coordinator or a
reviewer reviews a WorkItem's submission (by default the latest), recording review Evidence per
criterion, each under an id derived from what it records so that a review run again is answered by
the Authority's idempotency; then the result is accepted (verified), or rejected with failing
Evidence, and with ``request-changes`` offered again.
"""

from __future__ import annotations

import argparse
from typing import Any

from missionweave.cli.common import (
    Actor,
    GroupState,
    UsageError,
    acting,
    coordinator_epoch,
    expiry,
    first_event,
    mission_of,
    report,
    report_all,
    require,
    result_events,
)
from missionweave.cli.work.items import evidence_records, looked_up
from missionweave.cli.work.offer import DEFAULT_OFFER_TTL, offer_body, selection
from missionweave.kernel import ids
from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.v1 import command_pb2
from missionweave.v1 import work_pb2 as wp


async def _record_review(
    actor: Actor, args: argparse.Namespace, state: GroupState, item: wp.WorkItem, records: list[wp.Evidence]
) -> list[command_pb2.CommandResult]:
    """``work.record_evidence`` once per record, citing the Coordinator epoch when the actor holds the lease."""
    is_coordinator = mission_of(state).coordinator.agent_id == actor.signer.identity_id
    results = []
    for e in records:
        body = wp.WorkRecordEvidence(
            work_item_id=item.work_item_id,
            evidence=e,
            coordinator_epoch=coordinator_epoch(args, state) if is_coordinator else 0,
        )
        # The id follows what is recorded: the same review run again after a crash is answered by the
        # Authority's idempotency instead of recording the Evidence twice.
        record = e.SerializeToString(deterministic=True).hex()
        command_id = ids.derived_id(
            "cmd", args.group, "review", item.work_item_id, record, actor.signer.identity_id
        )
        results.append(await actor.execute(args.group, "work_record_evidence", body, command_id=command_id))
    return results


def _recorded_ids(results: list[command_pb2.CommandResult]) -> list[str]:
    return [
        e.evidence_recorded.evidence.evidence_id for r in results for e in _events_of(r, "evidence_recorded")
    ]


def _events_of(result: command_pb2.CommandResult, payload: str) -> list[Any]:
    return [e for e in result_events(result) if e.WhichOneof("payload") == payload]


def _submission(args: argparse.Namespace, item: wp.WorkItem) -> str:
    return str(
        args.submission
        or require(item.submission_event_id, f"{item.work_item_id} has no submission", "--submission")
    )


async def cmd_accept_result(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await looked_up(actor, args)
        submission = _submission(args, item)
        records = evidence_records(
            item,
            args.evidence_pass or [],
            wp.EVIDENCE_RESULT_PASS,
            args.method,
            "--evidence-pass",
            submission,
        )
        results = await _record_review(actor, args, state, item, records)
        body = wp.WorkAcceptResult(
            work_item_id=item.work_item_id,
            submission_event_id=submission,
            review_evidence_ids=_recorded_ids(results),
            comment=args.comment or "",
            coordinator_epoch=coordinator_epoch(args, state),
        )
        results.append(await actor.execute(args.group, "work_accept_result", body))
    return report_all(args, results, f"accepted submission {submission}: {item.work_item_id} is verified")


async def cmd_evidence(args: argparse.Namespace) -> int:
    if not args.evidence_pass and not args.evidence_fail:
        raise UsageError("name at least one --evidence-pass or --evidence-fail CRITERION[=SUMMARY]")
    async with acting(args) as actor:
        state, item = await looked_up(actor, args)
        submission = _submission(args, item)
        records = evidence_records(
            item,
            args.evidence_pass or [],
            wp.EVIDENCE_RESULT_PASS,
            args.method,
            "--evidence-pass",
            submission,
        )
        records += evidence_records(
            item,
            args.evidence_fail or [],
            wp.EVIDENCE_RESULT_FAIL,
            args.method,
            "--evidence-fail",
            submission,
        )
        results = await _record_review(actor, args, state, item, records)
    recorded = _recorded_ids(results)
    return report_all(
        args,
        results,
        f"recorded {len(recorded)} Evidence record(s) on submission {submission} of {item.work_item_id}",
        last_line=" ".join(recorded),
        extra={"evidence_ids": recorded},
    )


async def _reject(
    actor: Actor, args: argparse.Namespace
) -> tuple[GroupState, wp.WorkItem, command_pb2.CommandResult]:
    """``work.fail`` REVIEW_REJECTED with failing review Evidence per --evidence-fail (MW-10.2-T13)."""
    state, item = await looked_up(actor, args)
    submission = _submission(args, item)
    records = evidence_records(
        item, args.evidence_fail, wp.EVIDENCE_RESULT_FAIL, args.method, "--evidence-fail", submission
    )
    body = wp.WorkFail(
        work_item_id=item.work_item_id,
        coordinator_epoch=coordinator_epoch(args, state),
        kind=wp.WORK_FAILURE_KIND_REVIEW_REJECTED,
        evidence=records,
        reason=args.reason or f"review rejected: {', '.join(c for c, _ in args.evidence_fail)} not met",
    )
    return state, item, await actor.execute(args.group, "work_fail", body)


async def cmd_reject(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        _, item, result = await _reject(actor, args)
    return report(
        args,
        result,
        f"rejected the submission of {item.work_item_id}: it is failed (re-offer it with mwp work offer)",
    )


async def cmd_request_changes(args: argparse.Namespace) -> int:
    expires = expiry(args) or to_timestamp(SystemClock().now() + DEFAULT_OFFER_TTL)
    async with acting(args) as actor:
        _, before = await looked_up(actor, args)
        to = args.to or [
            require(
                before.ownership.agent_id, f"{before.work_item_id} has no owner to send it back to", "--to"
            )
        ]
        selection(
            await actor.state(args.group), before.contract, to
        )  # candidates checked before the failure is sent
        state, item, failed = await _reject(actor, args)
        offered = await actor.execute(args.group, "work_offer", offer_body(args, state, item, to, expires))
    event = first_event(offered, "work_offered")
    offer_id = event.work_offered.offer_id if event else ""
    headline = f"requested changes to {item.work_item_id}: the submission is rejected and the work offered again to {', '.join(to)}"
    return report_all(args, [failed, offered], headline, last_line=offer_id, extra={"offer_id": offer_id})
