"""``mwp work fail``, ``cancel`` and ``unblock``: a Coordinator's control of work under way. ``fail``
reports a failure with Evidence (the observation itself when none is named), as the Coordinator or
as the owner under its execution lease, reporting its usage; ``cancel`` ends an unfinished WorkItem;
``unblock`` resolves a blocked WorkItem's blockers.
"""

from __future__ import annotations

import argparse

from missionweave.cli.common import (
    UsageError,
    acting,
    coordinator_epoch,
    enum_label,
    first_event,
    mission_of,
    report,
)
from missionweave.cli.work.arguments import vector
from missionweave.cli.work.items import evidence_records, looked_up
from missionweave.sdk.contracts import enum_names
from missionweave.v1 import work_pb2 as wp

FAILURE_KINDS = {
    k: v
    for k, v in enum_names(wp.WorkFailureKind, "WORK_FAILURE_KIND_").items()
    if k not in ("subtask-failed", "mission-failed")
}


async def cmd_fail(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await looked_up(actor, args)
        records = evidence_records(
            item, args.evidence_fail or [], wp.EVIDENCE_RESULT_FAIL, args.method, "--evidence-fail"
        )
        if not records:  # failure Evidence is required (MW-10.2-T13): the observation itself
            records = [
                wp.Evidence(
                    method=wp.EVIDENCE_METHOD_FAILURE_OBSERVATION,
                    result=wp.EVIDENCE_RESULT_FAIL,
                    summary=args.reason,
                )
            ]
        body = wp.WorkFail(
            work_item_id=item.work_item_id,
            kind=FAILURE_KINDS[args.kind],  # type: ignore[arg-type]
            evidence=records,
            reason=args.reason,
        )
        by_owner = item.HasField("lease") and item.lease.agent_id == actor.signer.identity_id
        if by_owner:  # the Worker reports its own failure under its lease (MW-11.3-04)
            body.lease_id, body.ownership_epoch = item.lease.lease_id, item.lease.ownership_epoch
            body.usage_delta.CopyFrom(
                vector(args.usage, "--usage", mission_of(state).definition.budget.currency)
            )
        elif args.usage:
            raise UsageError("--usage: only the owner, under its lease, reports usage")
        else:
            body.coordinator_epoch = coordinator_epoch(args, state)
        result = await actor.execute(args.group, "work_fail", body)
    who = "the owner" if by_owner else "the Coordinator"
    return report(args, result, f"{item.work_item_id} reported failed ({args.kind}) by {who}")


async def cmd_cancel(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state = await actor.state(args.group)
        body = wp.WorkCancel(
            work_item_id=args.work_item, coordinator_epoch=coordinator_epoch(args, state), reason=args.reason
        )
        result = await actor.execute(args.group, "work_cancel", body)
    return report(args, result, f"cancelled {args.work_item}")


async def cmd_unblock(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state = await actor.state(args.group)
        body = wp.WorkUnblock(
            work_item_id=args.work_item,
            resolution=args.resolution,
            resolved_blocker_ids=args.blocker or [],
            coordinator_epoch=coordinator_epoch(args, state),
        )
        result = await actor.execute(args.group, "work_unblock", body)
    event = first_event(result, "work_unblocked")
    now = enum_label(wp.WorkItemState, event.work_unblocked.next_state, "WORK_ITEM_STATE_") if event else "?"
    return report(args, result, f"unblocked {args.work_item}: it is {now}")
