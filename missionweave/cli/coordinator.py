"""``mwp coordinator ...``: the Coordinator lease (MW-7.2-02..08): renew, replace, signed summary, reconcile."""

from __future__ import annotations

import argparse
from typing import Any

from missionweave.cli.common import (
    Actor,
    CliError,
    acting,
    acting_command,
    add_coordinator_epoch_flag,
    coordinator_epoch,
    emit,
    first_event,
    reading,
    reading_command,
    relative,
    report,
    when,
)
from missionweave.cli.mission import mission_view, render_mission, renewal_policy
from missionweave.sdk.client import MeshClient, SummaryNotVerified, VerifiedSummary
from missionweave.v1 import mission_pb2


async def verified_summary(mesh: MeshClient, group_id: str) -> VerifiedSummary:
    """The Authority-signed summary of the Group; a CliError (exit 1) when it does not verify."""
    try:
        return await mesh.verified_group_summary(group_id)
    except SummaryNotVerified as err:
        raise CliError(f"the signed summary of {group_id} does NOT verify: {err}") from err


def _summary_document(summary: VerifiedSummary) -> dict[str, Any]:
    return {
        "verified": True,
        "key_id": summary.key_id,
        "head_sequence": summary.state.head_sequence,
        "last_work_change_sequence": summary.state.last_work_change_sequence,
        "summary": mission_view(summary.state),
    }


def _summary_lines(summary: VerifiedSummary) -> list[str]:
    state = summary.state
    return [
        f"Signed Group summary of {state.group_id}: signature verified ({summary.key_id})",
        f"  head sequence {state.head_sequence}, last WorkItem change at {state.last_work_change_sequence or 'none'}",
        *render_mission(state),
    ]


async def cmd_summary(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        summary = await verified_summary(mesh, args.group)
    emit(args, _summary_lines(summary), _summary_document(summary))
    return 0


async def cmd_renew(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        epoch = coordinator_epoch(args, await actor.state(args.group))
        body = mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=epoch)
        result = await actor.execute(args.group, "mission_renew_coordinator_lease", body)
    renewed = first_event(result, "coordinator_lease_renewed")
    expiry = renewed.coordinator_lease_renewed.expires_at if renewed else None
    until = f"; expires {when(expiry)} ({relative(expiry)})" if expiry is not None else ""
    return report(args, result, f"Coordinator lease epoch {epoch} renewed{until}")


async def cmd_replace(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        body = mission_pb2.MissionReplaceCoordinator(
            coordinator_id=args.coordinator,
            replaced_coordinator_epoch=coordinator_epoch(args, await actor.state(args.group)),
            coordinator_renewal=renewal_policy(args.lease_seconds),
        )
        result = await actor.execute(args.group, "mission_replace_coordinator", body)
    granted = first_event(result, "coordinator_lease_granted")
    epoch = granted.coordinator_lease_granted.lease.coordinator_epoch if granted else "?"
    headline = (
        f"Coordinator epoch {body.replaced_coordinator_epoch} replaced: {args.coordinator} holds epoch {epoch}; "
        "it must reconcile (mwp coordinator reconcile) before assigning work"
    )
    return report(args, result, headline)


async def _reconcile(
    actor: Actor, args: argparse.Namespace
) -> tuple[VerifiedSummary, mission_pb2.MissionAcknowledgeReconciliation]:
    summary = await verified_summary(actor.mesh, args.group)
    actor.states[args.group] = summary.state  # the membership epoch comes from the verified summary too
    return summary, mission_pb2.MissionAcknowledgeReconciliation(
        coordinator_epoch=coordinator_epoch(args, summary.state), group_revision=summary.state.head_sequence
    )


async def cmd_reconcile(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        summary, body = await _reconcile(actor, args)
        result = await actor.execute(args.group, "mission_acknowledge_reconciliation", body)
    headline = (
        f"reconciliation acknowledged for Coordinator epoch {body.coordinator_epoch} at group revision "
        f"{body.group_revision} (summary signed by {summary.key_id})"
    )
    return report(args, result, headline)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    co = sub.add_parser(
        "coordinator", help="the Coordinator lease: renew, replace, summary, reconcile"
    ).add_subparsers(dest="sub", required=True)

    r = acting_command(
        co.add_parser("renew", help="renew your Coordinator lease before it expires (Coordinator)")
    )
    add_coordinator_epoch_flag(r)
    r.set_defaults(func=cmd_renew)

    rp = acting_command(
        co.add_parser("replace", help="appoint a new Coordinator after the lease lapsed (MissionOwner)")
    )
    rp.add_argument("--coordinator", required=True, help="the new Coordinator's identity id")
    rp.add_argument(
        "--lease-seconds", type=float, help="the new lease's length (default: the server's, 5 minutes)"
    )
    add_coordinator_epoch_flag(rp, "the epoch replaced; default: the current lease's epoch")
    rp.set_defaults(func=cmd_replace)

    s = reading_command(
        co.add_parser("summary", help="the Authority-signed Group summary, signature verified")
    )
    s.set_defaults(func=cmd_summary)

    rc = acting_command(
        co.add_parser(
            "reconcile", help="verify the signed summary and acknowledge reconciliation (Coordinator)"
        )
    )
    add_coordinator_epoch_flag(rc, "default: the epoch in the signed summary")
    rc.set_defaults(func=cmd_reconcile)
