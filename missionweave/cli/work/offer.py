"""``mwp work authorize``, ``offer`` and ``extend``: a Coordinator (or the MissionOwner, as an audited
emergency override) creates a WorkItem with its contract and offers it to named candidates, each
offer recording structured selection criteria per candidate (``selection``: its Membership, the
capabilities it covers, the expected cost, the rule applied); ``mwp plan`` builds its offers here too.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from missionweave.cli.common import (
    CliError,
    GroupState,
    UsageError,
    acting,
    coordinator_epoch,
    expiry,
    first_event,
    report,
)
from missionweave.cli.work.contract import contract_from_args
from missionweave.cli.work.items import looked_up
from missionweave.kernel import ids
from missionweave.kernel.capabilities import missing_capability
from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.v1 import membership_pb2
from missionweave.v1 import work_pb2 as wp

DEFAULT_OFFER_TTL = timedelta(hours=1)
# The rule recorded in an offer's selection criteria: a person named the candidates (MW-10.3-10/11).
RULE_NAMED = "policy:named-by-coordinator"


def steering(args: argparse.Namespace, state: GroupState) -> dict[str, Any]:
    """How an authorize or offer cites its authority: the Coordinator epoch, or the MissionOwner's
    audited emergency override (``--override-reason``)."""
    if getattr(args, "override_reason", None):
        return {"emergency_override": True, "override_reason": args.override_reason}
    return {"coordinator_epoch": coordinator_epoch(args, state)}


def selection(
    state: GroupState, contract: wp.WorkContract, candidates: list[str], flag: str = "--to"
) -> list[wp.SelectionCriteria]:
    """The structured selection criteria an offer records per candidate (MW-10.3-10): its Membership
    (the authorization basis), the capabilities it covers, the expected cost (the contract budget)
    and the rule applied (the Coordinator named it); rule and fact ids only (MW-10.3-11)."""
    out = []
    for rank, candidate in enumerate(candidates, start=1):
        member = next((m for m in state.memberships if m.member_id == candidate and m.active), None)
        if member is None:
            raise UsageError(f"{flag} {candidate}: holds no active Membership in {state.group_id}")
        have = {c.capability_id: c.version for c in member.capabilities}
        missing = [c for c in contract.required_capabilities if missing_capability(have, [c]) is not None]
        matched = [
            membership_pb2.Capability(capability_id=c.capability_id, version=have[c.capability_id])
            for c in contract.required_capabilities
            if c not in missing
        ]
        out.append(
            wp.SelectionCriteria(
                candidate_id=candidate,
                matched_capabilities=matched,
                missing_capabilities=missing,
                authorization_eligible=True,
                authorization_basis=[f"membership-epoch:{member.membership_epoch}"],
                expected_cost=contract.budget,
                applied_policy_rules=[RULE_NAMED],
                rank=rank,
            )
        )
    return out


def offer_body(
    args: argparse.Namespace,
    state: GroupState,
    item: wp.WorkItem,
    candidates: list[str],
    expires_at: Any,
    **fields: Any,
) -> wp.WorkOffer:
    contract = fields.get("amended_contract", item.contract)
    body = wp.WorkOffer(
        work_item_id=item.work_item_id,
        candidate_ids=candidates,
        selection_criteria=selection(state, contract, candidates),
        **steering(args, state),
        **fields,
    )
    body.expires_at.CopyFrom(expires_at)
    return body


async def cmd_authorize(args: argparse.Namespace) -> int:
    contract_from_args(args, None)  # every flag checked before connecting
    work_item_id = args.work_item or ids.new_id("wi")
    async with acting(args) as actor:
        state = await actor.state(args.group)
        body = wp.WorkAuthorize(
            work_item_id=work_item_id,
            title=args.title,
            contract=contract_from_args(args, state),
            parent_work_item_id=args.parent or "",
            **steering(args, state),
        )
        result = await actor.execute(args.group, "work_authorize", body)
    headline = (
        f"authorized {work_item_id}: {args.title!r} (contract revision 1); offer it with mwp work offer"
    )
    return report(args, result, headline, last_line=work_item_id, extra={"work_item_id": work_item_id})


async def cmd_offer(args: argparse.Namespace) -> int:
    expires = expiry(args) or to_timestamp(SystemClock().now() + DEFAULT_OFFER_TTL)
    async with acting(args) as actor:
        state, item = await looked_up(actor, args)
        body = offer_body(args, state, item, args.to, expires, offer_id=args.offer_id or "")
        result = await actor.execute(args.group, "work_offer", body)
    offered = first_event(result, "work_offered")
    offer_id = offered.work_offered.offer_id if offered else ""
    headline = f"offered {item.work_item_id} (contract revision {item.contract.revision}) to {', '.join(args.to)}: offer {offer_id}"
    return report(args, result, headline, last_line=offer_id, extra={"offer_id": offer_id})


async def cmd_extend(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await looked_up(actor, args)
        open_offers = list(item.offers)
        if args.offer:
            offer = next((o for o in open_offers if o.offer_id == args.offer), None)
            if offer is None:
                raise CliError(f"{item.work_item_id} has no open offer {args.offer}")
        elif len(open_offers) == 1:
            offer = open_offers[0]
        else:
            raise CliError(f"{item.work_item_id} has {len(open_offers)} open offers: name one with --offer")
        expires = expiry(args) or offer.expires_at  # an extension keeps the offer's expiry unless told
        body = offer_body(args, state, item, args.to, expires, extends_offer_id=offer.offer_id)
        result = await actor.execute(args.group, "work_offer", body)
    headline = f"extended offer {offer.offer_id} of {item.work_item_id} to {', '.join(args.to)}"
    return report(args, result, headline, last_line=offer.offer_id, extra={"offer_id": offer.offer_id})
