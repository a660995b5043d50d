"""A MissionOwner's answers to a submission: approve it, or request changes (``mwp mission approve``,
``mwp mission request-changes``, and ``mwp mission review`` once it has shown what it answers)."""

from __future__ import annotations

import argparse

from missionweave.cli.common import GroupState, acting, mission_of, report, require
from missionweave.v1 import mission_pb2


def _submission(args: argparse.Namespace, state: GroupState) -> str:
    """--submission, else the Mission's latest submission."""
    return (
        str(args.submission)
        if args.submission
        else require(
            mission_of(state).latest_submission_event_id,
            f"mission in {state.group_id} has no submission yet",
            "--submission",
        )
    )


async def cmd_approve(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        submission = _submission(args, await actor.state(args.group))
        body = mission_pb2.MissionApprove(submission_event_id=submission, comment=args.comment or "")
        result = await actor.execute(args.group, "mission_approve", body)
    return report(args, result, f"approved submission {submission}")


async def cmd_request_changes(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        submission = _submission(args, await actor.state(args.group))
        body = mission_pb2.MissionRequestChanges(
            submission_event_id=submission, requested_changes=args.changes
        )
        result = await actor.execute(args.group, "mission_request_changes", body)
    return report(args, result, f"requested changes to submission {submission}; the Mission is active again")
