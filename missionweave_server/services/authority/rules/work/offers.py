"""MW-10.2-T03..T05 / MW-10.3: offers to bounded candidate sets, acceptance into ownership, declines."""

from __future__ import annotations

import re
from collections.abc import Iterable

from missionweave.kernel import ids
from missionweave.kernel.capabilities import missing_capability
from missionweave.kernel.clock import from_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave.v1.membership_pb2 import Capability
from missionweave_server.services.authority.rules.authorization import may_issue, role_label
from missionweave_server.services.authority.rules.common import (
    CardInfo,
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    invalid,
)
from missionweave_server.services.authority.rules.delegation import charge, check_delegated_offer
from missionweave_server.services.authority.rules.memberships import activate
from missionweave_server.services.authority.rules.work.common import (
    DEFAULT_START_DEADLINE,
    OFFERABLE,
    OFFERED,
    QUEUED,
    end_lease,
    live_owner,
    own,
    ownership_grant,
    policy_duration,
    require_state,
    require_steering,
    touch,
    work_item,
)
from missionweave_server.services.authority.rules.work.contract import (
    require_dependencies,
    validate_contract,
    would_cycle,
)
from missionweave_server.services.authority.rules.work.leases import revoke_lease
from missionweave_server.services.authority.rules.work.usage import check_fits_mission
from missionweave_server.services.authority.state import GroupState, OfferState, WorkItemState

MAX_CANDIDATES = 8  # MW-10.3-04: a bounded candidate set for urgent placement


def work_offer(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T03 / MW-10.3-02/04/10/11: a durable offer to a bounded candidate set, never to a live owner."""
    assert state is not None
    body = command.work_offer
    grant = require_steering(state, command, ctx, body, "work.offer")
    item = work_item(state, body.work_item_id)
    require_state(item, OFFERABLE, "work.offer")
    if live_owner(item, ctx.now):
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION,
            f"{item.work_item_id} has a live owner ({item.owner.agent_id if item.owner else ''}); offers need none (OP-11)",
        )
    if not 1 <= len(body.candidate_ids) <= MAX_CANDIDATES or len(set(body.candidate_ids)) != len(
        body.candidate_ids
    ):
        raise invalid("body.candidate_ids", f"1..{MAX_CANDIDATES} distinct candidates")
    for i, cid in enumerate(body.candidate_ids):
        member = state.members.get(cid)
        if member is None or not member.active or member.lapsed(ctx.now):
            raise invalid(f"body.candidate_ids[{i}]", f"{cid} holds no active Membership in this Group")
        if not may_issue("work_accept_offer", member.role):  # an offer its candidate could never accept
            raise invalid(
                f"body.candidate_ids[{i}]",
                f"{cid} is a {role_label(member.role)}; work is offered to roles that may accept it (docs/authorization.md)",
            )
        if (
            member.provisional
            and member.expires_at is not None
            and from_timestamp(body.expires_at) > member.expires_at
        ):
            raise invalid(
                "body.expires_at",
                f"an offer to {cid} expires no later than its provisional Membership (MW-8-06)",
            )
    contract = body.amended_contract if body.HasField("amended_contract") else item.contract
    for i, cid in enumerate(body.candidate_ids):
        check_card(ctx.cards.get(cid), cid, contract.required_capabilities, f"body.candidate_ids[{i}]")
    _check_selection_criteria(body)
    if not body.HasField("expires_at") or from_timestamp(body.expires_at) <= ctx.now:
        raise invalid("body.expires_at", "an offer expiry in the future is required")
    revision = item.contract_revision
    budget_field = "body.amended_contract.budget" if body.HasField("amended_contract") else "contract.budget"
    check_fits_mission(state, item.work_item_id, contract.budget, budget_field)
    if body.HasField("amended_contract"):
        validate_contract(body.amended_contract, state, ctx, "body.amended_contract")
        if would_cycle(state, item.work_item_id, body.amended_contract.depends_on_work_item_ids):
            raise Rejected(
                R.REJECTION_REASON_DEPENDENCY_CYCLE,
                f"the amended dependencies of {item.work_item_id} form a cycle",
            )
        revision += 1  # MW-10.1-05: a material revision needs a fresh acceptance
    offer_id = body.offer_id or ids.derived_id("offer", command.group_id, command.command_id)
    candidates = list(body.candidate_ids)
    if body.extends_offer_id:
        extended = item.offers.get(body.extends_offer_id)
        if extended is None or not extended.open:
            raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no open offer {body.extends_offer_id} to extend")
        offer_id = body.extends_offer_id
        # An extension adds candidates: those already offered keep their offer.
        candidates = [*extended.candidate_ids, *(c for c in candidates if c not in extended.candidate_ids)]
        if len(candidates) > MAX_CANDIDATES:
            raise invalid(
                "body.candidate_ids", f"the extended offer would have more than {MAX_CANDIDATES} candidates"
            )
    elif not ids.is_valid(offer_id) or offer_id in item.offers:
        raise invalid("body.offer_id", "a valid id not yet used for this WorkItem")
    if grant is not None:
        check_delegated_offer(state, ctx, grant, body, contract)
    if revision == item.contract_revision:
        require_dependencies(state, item, "work.offer")
    if item.owner is not None:  # an expired owner is fenced before the offer takes effect (T03, OP-11)
        revoke_lease(out, item, wp.LEASE_REVOCATION_CAUSE_EXPIRY_FENCED, item.state)
    superseded = [o.offer_id for o in item.offers.values() if o.open and o.offer_id != offer_id]
    if superseded:
        reason = (
            wp.OFFER_WITHDRAWAL_REASON_CONTRACT_REVISED
            if revision != item.contract_revision
            else wp.OFFER_WITHDRAWAL_REASON_SUPERSEDED
        )
        withdraw_offers(out, item, superseded, reason)
    amended = wp.WorkContract()
    if body.HasField("amended_contract"):
        amended.CopyFrom(body.amended_contract)
        amended.revision = revision
    out.emit(
        "work.offered",
        "work_offered",
        wp.WorkOffered(
            work_item_id=item.work_item_id,
            offer_id=offer_id,
            candidate_ids=candidates,
            expires_at=body.expires_at,
            contract_revision=revision,
            amended_contract=amended if body.HasField("amended_contract") else None,
            selection_criteria=body.selection_criteria,
            context_package=body.context_package if body.HasField("context_package") else None,
            extends_offer_id=body.extends_offer_id,
            coordinator_epoch=body.coordinator_epoch,
            grant_id=body.grant_id,
            emergency_override=body.emergency_override,
            override_reason=body.override_reason,
            previous_state=item.state,  # type: ignore[arg-type]
        ),
    )


def _check_selection_criteria(body: wp.WorkOffer) -> None:
    """MW-10.3-10/11: one structured record per candidate; rule ids, never free-form reasoning."""
    by_candidate = {c.candidate_id: c for c in body.selection_criteria}
    for i, cid in enumerate(body.candidate_ids):
        if cid not in by_candidate:
            raise invalid(
                f"body.selection_criteria[{i}]",
                f"structured selection criteria for {cid} are required (MW-10.3-10)",
            )
    for i, c in enumerate(body.selection_criteria):
        if c.candidate_id not in body.candidate_ids:
            raise invalid(f"body.selection_criteria[{i}].candidate_id", "not a candidate of this offer")
        if not c.applied_policy_rules:
            raise invalid(
                f"body.selection_criteria[{i}].applied_policy_rules", "name the policy rules applied"
            )
        for j, text in enumerate([*c.applied_policy_rules, *c.authorization_basis]):
            if not ids.is_valid(text):
                raise invalid(
                    f"body.selection_criteria[{i}]",
                    f"entry {j} is not a rule/basis id; selection records hold no free-form reasoning (MW-10.3-11)",
                )


def check_card(card: CardInfo | None, agent_id: str, required: Iterable[Capability], field: str) -> None:
    """MW-11.1-13: an agent with an Agent Card in force declares every required capability in it, at
    the required version or later (an agent without a card is judged by its Membership alone)."""
    if card is None:
        return
    lacking = missing_capability(card.capabilities, required)
    if lacking is not None:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"{agent_id}'s Agent Card {card.card_version} does not declare {lacking.capability_id} >= {lacking.version}",
            field=field,
            capability=lacking.capability_id,
            card_version=card.card_version,
        )


def withdraw_offers(
    out: Emitter, item: WorkItemState, offer_ids: list[str], reason: int, winner: str = ""
) -> None:
    candidates = sorted({c for oid in offer_ids for c in item.offers[oid].candidate_ids})
    out.emit(
        "work.offers_withdrawn",
        "work_offers_withdrawn",
        wp.WorkOffersWithdrawn(
            work_item_id=item.work_item_id,
            offer_ids=offer_ids,
            candidate_ids=candidates,
            reason=reason,  # type: ignore[arg-type]
            winning_offer_id=winner,  # type: ignore[arg-type]
        ),
    )


def work_accept_offer(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T04/T05 / MW-10.3-05: the first valid acceptance wins a new ownership epoch atomically."""
    assert state is not None
    body = command.work_accept_offer
    item = work_item(state, body.work_item_id)
    offer = item.offers.get(body.offer_id)
    if offer is None:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no offer {body.offer_id} for {item.work_item_id}")
    if command.actor_id not in offer.candidate_ids:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED, f"{command.actor_id} is not a candidate of {body.offer_id}"
        )
    if not offer.open:
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION,
            f"offer {body.offer_id} was withdrawn (another acceptance won or it was superseded)",
        )
    require_state(item, (OFFERED,), "work.accept_offer")
    if offer.expires_at <= ctx.now:  # T05: expiry changes nothing and appends nothing, but acceptance fails
        raise Rejected(
            R.REJECTION_REASON_OFFER_EXPIRED,
            f"offer {body.offer_id} expired at {offer.expires_at.isoformat()}",
        )
    if body.contract_revision != item.contract_revision:
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            f"accept contract revision {item.contract_revision}, not {body.contract_revision} (MW-10.1-05)",
            current_revision=item.contract_revision,
        )
    if item.open_ambiguities:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"material ambiguities are unresolved ({', '.join(sorted(item.open_ambiguities))}); the Coordinator "
            "amends the contract or replaces the WorkItem first (MW-10.1-03/04)",
        )
    # MW-10.3-07, the part the Authority can check for the Worker: capability, deadline, dependencies.
    if from_timestamp(item.contract.deadline) <= ctx.now:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED, f"the deadline of {item.work_item_id} has passed"
        )
    require_dependencies(state, item, "work.accept_offer")
    member = state.members[command.actor_id]
    lacking = missing_capability(dict(member.capabilities), item.contract.required_capabilities)
    if lacking is not None:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"{command.actor_id} lacks capability {lacking.capability_id} >= {lacking.version} in its Membership",
            capability=lacking.capability_id,
        )
    card = ctx.cards.get(command.actor_id)
    check_card(card, command.actor_id, item.contract.required_capabilities, "actor_id")
    epoch = item.last_ownership_epoch + 1
    lease = policy_duration(
        item.contract.time_policy.start_deadline, DEFAULT_START_DEADLINE, "time_policy.start_deadline"
    )
    criteria = next(
        (c for c in item.offer_criteria.get(body.offer_id, ()) if c.candidate_id == command.actor_id), None
    )
    out.emit(
        "work.offer_accepted",
        "work_offer_accepted",
        wp.WorkOfferAccepted(
            work_item_id=item.work_item_id,
            offer_id=body.offer_id,
            agent_id=command.actor_id,
            ownership=ownership_grant(
                item, command.actor_id, epoch, ctx.now, lease, wp.WORK_LEASE_KIND_OWNERSHIP, body.offer_id
            ),
            selection_criteria=criteria,
            schedule=body.schedule if body.HasField("schedule") else None,
            agent_card_version=card.card_version if card else "",
        ),
    )
    if member.provisional:
        activate(out, member, item.work_item_id, body.offer_id)
    losers = [o.offer_id for o in item.offers.values() if o.open and o.offer_id != body.offer_id]
    if losers or len(offer.candidate_ids) > 1:
        withdraw_offers(
            out,
            item,
            [*losers, body.offer_id],
            wp.OFFER_WITHDRAWAL_REASON_ACCEPTED_ELSEWHERE,
            winner=body.offer_id,
        )


# OP-15: an extension code is namespaced, as a URN or as "<reverse-dns>/<code>".
_EXTENSION_CODE = re.compile(r"urn:[a-z0-9][a-z0-9-]*:\S+|[a-z0-9-]+(\.[a-z0-9-]+)+/[A-Za-z0-9._:-]+")
MAX_DECLINE_DETAIL = 1024


def _check_decline(decline: wp.StructuredDecline) -> None:
    """MW-10.3-09 / OP-15: one of the six standard codes, or OTHER with a namespaced extension code,
    so that every client can interpret the standard six."""
    if decline.reason not in wp.DeclineReason.values() or not decline.reason:
        raise invalid("body.decline.reason", "a structured reason is required (a DeclineReason value)")
    if decline.reason == wp.DECLINE_REASON_OTHER:
        if not _EXTENSION_CODE.fullmatch(decline.extension_code):
            raise invalid(
                "body.decline.extension_code",
                'DECLINE_REASON_OTHER names a namespaced code: "urn:<nid>:<code>" or "<reverse-dns>/<code>" (OP-15)',
            )
    elif decline.extension_code:
        raise invalid("body.decline.extension_code", "only DECLINE_REASON_OTHER carries an extension code")
    if len(decline.detail) > MAX_DECLINE_DETAIL:
        raise invalid("body.decline.detail", f"at most {MAX_DECLINE_DETAIL} characters")


def work_decline_offer(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.3-08/09: a candidate declines with a structured reason."""
    assert state is not None
    body = command.work_decline_offer
    item = work_item(state, body.work_item_id)
    offer = item.offers.get(body.offer_id)
    if offer is None or not offer.open:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no open offer {body.offer_id}")
    if command.actor_id not in offer.candidate_ids:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED, f"{command.actor_id} is not a candidate of {body.offer_id}"
        )
    _check_decline(body.decline)
    out.emit(
        "work.offer_declined",
        "work_offer_declined",
        wp.WorkOfferDeclined(
            work_item_id=item.work_item_id,
            offer_id=body.offer_id,
            agent_id=command.actor_id,
            decline=body.decline,
        ),
    )


# ---------------------------------------------------------------- evolve rules


def _offered(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_offered
    item = touch(state, event, p.work_item_id)
    item.offers[p.offer_id] = OfferState(
        p.offer_id, tuple(p.candidate_ids), from_timestamp(p.expires_at), p.contract_revision
    )
    kept = item.offer_criteria.get(p.offer_id, []) if p.extends_offer_id else []
    covered = {c.candidate_id for c in p.selection_criteria}
    item.offer_criteria[p.offer_id] = [
        *(c for c in kept if c.candidate_id not in covered),
        *p.selection_criteria,
    ]
    if p.HasField("amended_contract"):
        item.contract = wp.WorkContract()
        item.contract.CopyFrom(p.amended_contract)
        item.contract_revision = p.contract_revision
        item.depends_on = tuple(p.amended_contract.depends_on_work_item_ids)
        item.open_ambiguities.clear()  # MW-10.1-04: resolved by the amended contract
    if p.grant_id:
        charge(state, p.grant_id, item.work_item_id, item.contract.budget)
    item.state = OFFERED
    item.owner = None
    end_lease(item, event, wp.LEASE_END_KIND_REVOKED)  # a re-offer reassigns


def _withdrawn(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_offers_withdrawn
    item = touch(state, event, p.work_item_id)
    for oid in p.offer_ids:
        item.offers[oid].open = False


def _accepted(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_offer_accepted
    item = touch(state, event, p.work_item_id)
    own(item, p.ownership)
    item.offers[p.offer_id].open = False
    item.state = QUEUED


def _declined(state: GroupState, event: event_pb2.Event) -> None:
    touch(state, event, event.work_offer_declined.work_item_id)


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "work_offer",
        work_offer,
        {"work_offered": _offered, "work_offers_withdrawn": _withdrawn},
        card_holders=lambda c: c.work_offer.candidate_ids,
    ),
    CommandKind(
        "work_accept_offer",
        work_accept_offer,
        {"work_offer_accepted": _accepted},
        card_holders=lambda c: (c.actor_id,),
    ),
    CommandKind("work_decline_offer", work_decline_offer, {"work_offer_declined": _declined}),
)
