"""``mwp work accept``, ``decline``, ``start``, ``renew``, ``submit`` and ``block``: a Worker's
commands, by hand. It accepts or declines the offer naming it (by default the open one), starts
the WorkItem it owns under an execution lease, renews the lease reporting its usage, and submits
Artifacts with passing Evidence for every required criterion, or checkpoints and blocks on what the
work needs; each command under the actor's own current lease.
"""

from __future__ import annotations

import argparse

from missionweave.cli.common import (
    Actor,
    CliError,
    UsageError,
    acting,
    first_event,
    mission_of,
    report,
    require,
)
from missionweave.cli.work.arguments import vector
from missionweave.cli.work.items import evidence_records, looked_up
from missionweave.kernel import ids
from missionweave.sdk.contracts import enum_names
from missionweave.v1 import work_pb2 as wp

DECLINE_REASONS = enum_names(wp.DeclineReason, "DECLINE_REASON_")
BLOCKER_KINDS = enum_names(wp.BlockerKind, "BLOCKER_KIND_")


def _mine(item: wp.WorkItem, actor: Actor, what: str) -> wp.ExecutionLease:
    """The WorkItem's current execution lease, held by the actor; a CliError otherwise."""
    if not item.HasField("lease") or item.lease.agent_id != actor.signer.identity_id:
        raise CliError(
            f"{actor.signer.identity_id} holds no execution lease on {item.work_item_id} to {what} under (mwp work start first)"
        )
    return item.lease


async def cmd_accept(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        _, item = await looked_up(actor, args)
        me = actor.signer.identity_id
        offer = args.offer or require(
            next((o.offer_id for o in item.offers if me in o.candidate_ids), ""),
            f"{item.work_item_id} has no open offer to {me}",
            "--offer",
        )
        body = wp.WorkAcceptOffer(
            work_item_id=item.work_item_id, offer_id=offer, contract_revision=item.contract.revision
        )
        result = await actor.execute(args.group, "work_accept_offer", body)
    accepted = first_event(result, "work_offer_accepted")
    epoch = accepted.work_offer_accepted.ownership.ownership_epoch if accepted else 0
    headline = f"accepted offer {offer}: {me} owns {item.work_item_id} (contract revision {item.contract.revision}) at ownership epoch {epoch}"
    return report(args, result, headline)


async def cmd_decline(args: argparse.Namespace) -> int:
    if (args.reason == "other") != bool(args.code):
        raise UsageError(
            "--code names the namespaced reason of --reason other (and only of it), e.g. com.example/maintenance"
        )
    async with acting(args) as actor:
        _, item = await looked_up(actor, args)
        me = actor.signer.identity_id
        offer = args.offer or require(
            next((o.offer_id for o in item.offers if me in o.candidate_ids), ""),
            f"{item.work_item_id} has no open offer to {me}",
            "--offer",
        )
        decline = wp.StructuredDecline(
            reason=DECLINE_REASONS[args.reason],  # type: ignore[arg-type]
            extension_code=args.code or "",
            detail=args.detail or "",
        )
        result = await actor.execute(
            args.group,
            "work_decline_offer",
            wp.WorkDeclineOffer(work_item_id=item.work_item_id, offer_id=offer, decline=decline),
        )
    return report(args, result, f"declined offer {offer} of {item.work_item_id} ({args.reason})")


async def cmd_start(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        _, item = await looked_up(actor, args)
        me = actor.signer.identity_id
        if item.ownership.agent_id != me:
            raise CliError(f"{me} does not own {item.work_item_id} (accept an offer first: mwp work accept)")
        body = wp.WorkStart(
            work_item_id=item.work_item_id,
            ownership_epoch=item.ownership.ownership_epoch,
            lease_id=args.lease_id or "",
        )
        if args.lease_seconds:
            body.requested_duration.FromSeconds(args.lease_seconds)
        result = await actor.execute(args.group, "work_start", body)
    started = first_event(result, "work_started")
    lease = started.work_started.lease.lease_id if started else ""
    headline = (
        f"started {item.work_item_id} under execution lease {lease} (ownership epoch {body.ownership_epoch})"
    )
    return report(args, result, headline, last_line=lease, extra={"lease_id": lease})


async def cmd_renew(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await looked_up(actor, args)
        lease = _mine(item, actor, "renew")
        body = wp.WorkRenewLease(
            work_item_id=item.work_item_id,
            lease_id=lease.lease_id,
            ownership_epoch=lease.ownership_epoch,
            usage_delta=vector(args.usage, "--usage", mission_of(state).definition.budget.currency),
        )
        if args.lease_seconds:
            body.requested_duration.FromSeconds(args.lease_seconds)
        result = await actor.execute(args.group, "work_renew_lease", body)
    return report(args, result, f"renewed execution lease {lease.lease_id} of {item.work_item_id}")


async def cmd_submit(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await looked_up(actor, args)
        lease = _mine(item, actor, "submit")
        records = evidence_records(
            item, args.evidence_pass or [], wp.EVIDENCE_RESULT_PASS, args.method, "--evidence-pass"
        )
        covered = {e.criterion_id for e in records}
        missing = [
            c.criterion_id
            for c in item.contract.acceptance_criteria
            if c.required and c.criterion_id not in covered
        ]
        if missing:  # the Authority would refuse it (MW-13.2-02): say so before sending
            raise UsageError(
                f"--evidence-pass: no Evidence for the required acceptance criteria {', '.join(missing)}"
            )
        body = wp.WorkSubmit(
            work_item_id=item.work_item_id,
            lease_id=lease.lease_id,
            ownership_epoch=lease.ownership_epoch,
            contract_revision=item.contract.revision,
            artifacts=args.artifact,
            evidence=records,
            summary=args.summary or "",
            usage_delta=vector(args.usage, "--usage", mission_of(state).definition.budget.currency),
        )
        result = await actor.execute(args.group, "work_submit", body)
    submitted = first_event(result, "work_submitted")
    submission = submitted.event_id if submitted else ""
    headline = f"submitted {item.work_item_id} (contract revision {item.contract.revision}) for review: submission {submission}"
    return report(args, result, headline, last_line=submission, extra={"submission_event_id": submission})


async def cmd_block(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await looked_up(actor, args)
        lease = _mine(item, actor, "block")
        blocker = wp.Blocker(
            blocker_id=args.blocker_id or ids.new_id("blk"),
            kind=BLOCKER_KINDS[args.kind],  # type: ignore[arg-type]
            description=args.description or args.needs,
            required_resolution=args.needs,
        )
        body = wp.WorkBlock(
            work_item_id=item.work_item_id,
            lease_id=lease.lease_id,
            ownership_epoch=lease.ownership_epoch,
            checkpoint=wp.Checkpoint(),
            blockers=[blocker],
            usage_delta=vector(args.usage, "--usage", mission_of(state).definition.budget.currency),
        )
        result = await actor.execute(args.group, "work_block", body)
    return report(
        args, result, f"blocked {item.work_item_id}: needs {args.needs} (blocker {blocker.blocker_id})"
    )
