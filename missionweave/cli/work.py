"""``mwp work ...``: the WorkItem commands a Coordinator, a reviewer or a Worker issues by hand
(spec 10, 11.3, 11.4, 13.2). ``list`` and ``show`` are in readmodels.py, the DAG view in workdag.py.

Everything the Group already knows is looked up rather than asked for: the Membership and
Coordinator epochs, the Mission's deadline and currency, the open offer, the ownership epoch and the
current lease, the latest submission, the method a criterion requires. A flag that is malformed or
names what the contract lacks (a criterion, a dependency) is refused before anything is sent (exit 2).
"""

from __future__ import annotations

import argparse
from datetime import UTC, timedelta
from typing import Any

from missionweave import ids
from missionweave.capabilities import missing_capability
from missionweave.cli.common import (
    Actor,
    CliError,
    GroupState,
    UsageError,
    acting,
    acting_command,
    add_coordinator_epoch_flag,
    add_expiry_flags,
    capability,
    coordinator_epoch,
    duration,
    emit,
    enum_label,
    expiry,
    first_event,
    instant,
    mission_of,
    natural,
    reading,
    reading_command,
    report,
    report_all,
    require,
    result_events,
)
from missionweave.cli.delegation import Cap, cap
from missionweave.cli.mission import artifact_ref
from missionweave.cli.workdag import tree_document, tree_lines
from missionweave.clock import SystemClock, to_timestamp
from missionweave.sdk.contracts import (
    DEPENDENCY_POLICIES,
    EVIDENCE_METHODS,
    IMPACTS,
    RISKS,
    STAND_IN_CURRENCY,
    URGENCIES,
    ContractError,
    Input,
    budget_vector,
    enum_names,
    work_contract,
)
from missionweave.v1 import command_pb2, common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp

DEFAULT_OFFER_TTL = timedelta(hours=1)
FAILURE_KINDS = {
    k: v for k, v in enum_names(wp.WorkFailureKind, "WORK_FAILURE_KIND_").items() if k not in ("subtask-failed", "mission-failed")
}
DECLINE_REASONS = enum_names(wp.DeclineReason, "DECLINE_REASON_")
BLOCKER_KINDS = enum_names(wp.BlockerKind, "BLOCKER_KIND_")
# The rule recorded in an offer's selection criteria: a person named the candidates (MW-10.3-10/11).
RULE_NAMED = "policy:named-by-coordinator"


# ------------------------------------------------------------------ argument types (bad input exits 2)


def id_text(text: str) -> tuple[str, str]:
    """``ID=TEXT`` (or ``ID`` alone: no text) -> (id, text); the id must be a valid id."""
    key, _, value = text.partition("=")
    if not ids.is_valid(key.strip()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected ID[=TEXT], the id being 1..128 of A-Z a-z 0-9 . _ : -")
    return key.strip(), value.strip()


def id_value(text: str) -> str:
    if not ids.is_valid(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (1..128 of A-Z a-z 0-9 . _ : -)")
    return text


def methods(text: str) -> tuple[str, list[str]]:
    """``CRITERION=METHOD[,METHOD]`` -> (criterion, methods), each a known Evidence method."""
    key, sep, value = text.partition("=")
    names = [m.strip().lower().replace("_", "-") for m in value.split(",") if m.strip()]
    if not sep or not ids.is_valid(key) or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected CRITERION=METHOD[,METHOD], e.g. balances=test,review")
    for name in names:
        if name not in EVIDENCE_METHODS:
            raise argparse.ArgumentTypeError(f"{text!r}: unknown method {name!r}; one of {', '.join(EVIDENCE_METHODS)}")
    return key, names


def work_input(text: str) -> Input:
    """``NAME=blake3:HEX[:SIZE]`` (an Artifact) or ``NAME=WORK_ITEM[/DELIVERABLE]`` (its output)."""
    name, sep, source = text.partition("=")
    if not sep or not ids.is_valid(name) or not source:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=blake3:HEX[:SIZE] or NAME=WORK_ITEM[/DELIVERABLE]")
    if source.startswith("blake3:"):
        return Input(name, artifact=artifact_ref(source))
    item, _, deliverable = source.partition("/")
    if not ids.is_valid(item) or (deliverable and not ids.is_valid(deliverable)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=WORK_ITEM[/DELIVERABLE]")
    return Input(name, from_work_item=item, from_deliverable=deliverable)


def vector(caps: list[Cap] | None, flag: str, currency: str) -> common_pb2.ResourceVector:
    """``--budget``/``--usage`` values as a ResourceVector: a dimension given twice is refused;
    the currency is the one named, else the Mission's."""
    values: dict[str, Any] = {}
    named = {c.currency for c in caps or [] if c.currency}
    for c in caps or []:
        if c.dimension in values:
            raise UsageError(f"{flag} {c.dimension} is given twice")
        values[c.dimension] = c.value
    if len(named) > 1:
        raise UsageError(f"{flag} names more than one currency: {', '.join(sorted(named))}")
    try:
        return budget_vector({**values, "currency": next(iter(named), currency)}, flag.lstrip("-"))
    except ContractError as err:
        raise UsageError(f"{flag}: {err}") from None


# ------------------------------------------------------------------ the contract flags

# Which flag gives which field of the contract, to name it in an error.
FLAGS = {
    "goal": "--goal", "deliverables": "--deliverable", "criteria": "--criterion", "evidence": "--evidence",
    "inputs": "--input", "depends_on": "--depends-on", "capabilities": "--capability", "deadline": "--deadline",
    "urgency": "--urgency", "impact": "--impact", "budget": "--budget", "max_attempts": "--max-attempts",
    "risk": "--risk", "notes": "--notes",
}


def contract_usage(err: ContractError) -> UsageError:
    flag = FLAGS.get(err.field.split(".")[0].split("[")[0])
    return UsageError(f"{flag}: {err}" if flag else str(err))


def add_contract_flags(sp: argparse.ArgumentParser) -> None:
    c = sp.add_argument_group("the work contract (MW-10.1-01; defaults in brackets)")
    c.add_argument("--goal", help="what the work achieves [the title]")
    c.add_argument("--deliverable", action="append", type=id_text, metavar="ID[=DESCRIPTION]",
                   help="a required deliverable (repeatable) [result=the goal]")
    c.add_argument("--criterion", action="append", type=id_text, required=True, metavar="ID=DESCRIPTION",
                   help="an acceptance criterion (repeatable, at least one)")
    c.add_argument("--evidence", action="append", type=methods, metavar="CRITERION=METHOD[,METHOD]",
                   help=f"the Evidence a criterion requires: {', '.join(EVIDENCE_METHODS)} [review]")
    c.add_argument("--depends-on", action="append", type=id_value, metavar="WORK_ITEM", help="a dependency (repeatable)")
    c.add_argument("--dependency-policy", choices=list(DEPENDENCY_POLICIES), default="all-verified")
    c.add_argument("--input", action="append", type=work_input, metavar="NAME=SOURCE",
                   help="an input: NAME=blake3:HEX[:SIZE] or NAME=WORK_ITEM[/DELIVERABLE] (repeatable)")
    c.add_argument("--capability", action="append", type=capability, metavar="ID=VERSION", help="a required capability")
    d = c.add_mutually_exclusive_group()
    d.add_argument("--deadline", type=instant, metavar="ISO", help="e.g. 2026-12-01T18:00:00Z [the Mission's deadline]")
    d.add_argument("--deadline-in", type=duration, metavar="DURATION", help="e.g. 36h, 2d, from now")
    c.add_argument("--urgency", choices=list(URGENCIES), default="normal")
    c.add_argument("--impact", choices=list(IMPACTS), default="medium", help="business impact")
    c.add_argument("--impact-note", default="", help="a machine-readable qualifier, e.g. customer-facing")
    c.add_argument("--budget", action="append", type=cap, required=True, metavar="DIMENSION=VALUE",
                   help="financial=1.50, tokens=N, tool_calls=N, compute_ms=N, wall_clock_ms=N, side_effects=N "
                   "(repeatable; a dimension not named is 0 and allows nothing; it must fit in what the Mission has left)")
    c.add_argument("--max-attempts", type=int, default=3, help="attempts including the first [3]")
    c.add_argument("--risk", choices=list(RISKS), default="low")
    c.add_argument("--notes", default="", help="supplementary prose (never replaces a field)")


def contract_from_args(args: argparse.Namespace, state: GroupState | None) -> wp.WorkContract:
    """The contract the flags describe. Without ``state`` (before connecting) a stand-in deadline and
    currency are used, so every error but those two is found before anything is sent."""
    mission = mission_of(state) if state is not None else None
    now = SystemClock().now()
    if args.deadline is not None:
        deadline: Any = args.deadline
    elif args.deadline_in is not None:
        deadline = now + args.deadline_in
    else:
        deadline = mission.definition.deadline.ToDatetime(tzinfo=UTC) if mission else None
    currency = mission.definition.budget.currency if mission else STAND_IN_CURRENCY
    goal = args.goal or args.title
    deliverables = {d: text or goal for d, text in args.deliverable or [("result", goal)]}
    try:
        return work_contract(
            goal,
            deliverables=deliverables,
            criteria=dict(args.criterion),
            evidence=dict(args.evidence or []),
            budget=vector(args.budget, "--budget", currency),
            inputs=args.input or [],
            depends_on=args.depends_on or [],
            dependency_policy=args.dependency_policy,
            capabilities=args.capability or [],
            deadline=deadline,
            urgency=args.urgency,
            impact=args.impact,
            impact_note=args.impact_note,
            max_attempts=args.max_attempts,
            risk=args.risk,
            notes=args.notes,
            currency=currency if mission else None,
            now=now,
        )
    except ContractError as err:
        raise contract_usage(err) from None


# ------------------------------------------------------------------ shared look-ups


async def _looked_up(actor: Actor, args: argparse.Namespace) -> tuple[GroupState, wp.WorkItem]:
    """The Group state and the WorkItem (NOT_FOUND from the server when the Group holds none)."""
    return await actor.state(args.group), await actor.mesh.work_item(args.group, args.work_item)


def steering(args: argparse.Namespace, state: GroupState) -> dict[str, Any]:
    """How an authorize or offer cites its authority: the Coordinator epoch, or the MissionOwner's
    audited emergency override (``--override-reason``)."""
    if getattr(args, "override_reason", None):
        return {"emergency_override": True, "override_reason": args.override_reason}
    return {"coordinator_epoch": coordinator_epoch(args, state)}


def selection(state: GroupState, contract: wp.WorkContract, candidates: list[str], flag: str = "--to") -> list[wp.SelectionCriteria]:
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
                candidate_id=candidate, matched_capabilities=matched, missing_capabilities=missing,
                authorization_eligible=True, authorization_basis=[f"membership-epoch:{member.membership_epoch}"],
                expected_cost=contract.budget, applied_policy_rules=[RULE_NAMED], rank=rank,
            )
        )
    return out


def offer_body(
    args: argparse.Namespace, state: GroupState, item: wp.WorkItem, candidates: list[str], expires_at: Any, **fields: Any
) -> wp.WorkOffer:
    contract = fields.get("amended_contract", item.contract)
    body = wp.WorkOffer(
        work_item_id=item.work_item_id, candidate_ids=candidates,
        selection_criteria=selection(state, contract, candidates), **steering(args, state), **fields,
    )
    body.expires_at.CopyFrom(expires_at)
    return body


def _evidence(
    item: wp.WorkItem, given: list[tuple[str, str]], result: int, method: str | None, flag: str, submission: str = ""
) -> list[wp.Evidence]:
    """One Evidence record per ``CRITERION[=SUMMARY]`` about the WorkItem (and its submission), by
    default in the first method the criterion requires."""
    criteria = {c.criterion_id: c for c in item.contract.acceptance_criteria}
    out = []
    for criterion_id, summary in given:
        criterion = criteria.get(criterion_id)
        if criterion is None:
            raise UsageError(
                f"{flag} {criterion_id}: the contract of {item.work_item_id} has no acceptance criterion "
                f"{criterion_id!r} (it has {', '.join(criteria) or 'none'})"
            )
        how = EVIDENCE_METHODS[method] if method else (list(criterion.required_evidence_methods) or [wp.EVIDENCE_METHOD_REVIEW])[0]
        out.append(
            wp.Evidence(
                subject=wp.EvidenceSubject(work_item_id=item.work_item_id, submission_event_id=submission),
                criterion_id=criterion_id, criterion=criterion.description, method=how,  # type: ignore[arg-type]
                result=result, summary=summary,  # type: ignore[arg-type]
            )
        )
    return out


async def _record_review(
    actor: Actor, args: argparse.Namespace, state: GroupState, item: wp.WorkItem, records: list[wp.Evidence]
) -> list[command_pb2.CommandResult]:
    """``work.record_evidence`` once per record, citing the Coordinator epoch when the actor holds the lease."""
    is_coordinator = mission_of(state).coordinator.agent_id == actor.signer.identity_id
    results = []
    for e in records:
        body = wp.WorkRecordEvidence(
            work_item_id=item.work_item_id, evidence=e,
            coordinator_epoch=coordinator_epoch(args, state) if is_coordinator else 0,
        )
        # The id follows what is recorded: the same review run again after a crash is answered by the
        # Authority's idempotency instead of recording the Evidence twice.
        record = e.SerializeToString(deterministic=True).hex()
        command_id = ids.derived_id("cmd", args.group, "review", item.work_item_id, record, actor.signer.identity_id)
        results.append(await actor.execute(args.group, "work_record_evidence", body, command_id=command_id))
    return results


def _recorded_ids(results: list[command_pb2.CommandResult]) -> list[str]:
    return [e.evidence_recorded.evidence.evidence_id for r in results for e in _events_of(r, "evidence_recorded")]


def _events_of(result: command_pb2.CommandResult, payload: str) -> list[Any]:
    return [e for e in result_events(result) if e.WhichOneof("payload") == payload]


def _submission(args: argparse.Namespace, item: wp.WorkItem) -> str:
    return str(args.submission or require(item.submission_event_id, f"{item.work_item_id} has no submission", "--submission"))


# ------------------------------------------------------------------ the Coordinator's commands


async def cmd_authorize(args: argparse.Namespace) -> int:
    contract_from_args(args, None)  # every flag checked before connecting
    work_item_id = args.work_item or ids.new_id("wi")
    async with acting(args) as actor:
        state = await actor.state(args.group)
        body = wp.WorkAuthorize(
            work_item_id=work_item_id, title=args.title, contract=contract_from_args(args, state),
            parent_work_item_id=args.parent or "", **steering(args, state),
        )
        result = await actor.execute(args.group, "work_authorize", body)
    headline = f"authorized {work_item_id}: {args.title!r} (contract revision 1); offer it with mwp work offer"
    return report(args, result, headline, last_line=work_item_id, extra={"work_item_id": work_item_id})


async def cmd_offer(args: argparse.Namespace) -> int:
    expires = expiry(args) or to_timestamp(SystemClock().now() + DEFAULT_OFFER_TTL)
    async with acting(args) as actor:
        state, item = await _looked_up(actor, args)
        body = offer_body(args, state, item, args.to, expires, offer_id=args.offer_id or "")
        result = await actor.execute(args.group, "work_offer", body)
    offered = first_event(result, "work_offered")
    offer_id = offered.work_offered.offer_id if offered else ""
    headline = f"offered {item.work_item_id} (contract revision {item.contract.revision}) to {', '.join(args.to)}: offer {offer_id}"
    return report(args, result, headline, last_line=offer_id, extra={"offer_id": offer_id})


async def cmd_extend(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await _looked_up(actor, args)
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


async def cmd_accept_result(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await _looked_up(actor, args)
        submission = _submission(args, item)
        records = _evidence(item, args.evidence_pass or [], wp.EVIDENCE_RESULT_PASS, args.method, "--evidence-pass", submission)
        results = await _record_review(actor, args, state, item, records)
        body = wp.WorkAcceptResult(
            work_item_id=item.work_item_id, submission_event_id=submission, review_evidence_ids=_recorded_ids(results),
            comment=args.comment or "", coordinator_epoch=coordinator_epoch(args, state),
        )
        results.append(await actor.execute(args.group, "work_accept_result", body))
    return report_all(args, results, f"accepted submission {submission}: {item.work_item_id} is verified")


async def cmd_evidence(args: argparse.Namespace) -> int:
    if not args.evidence_pass and not args.evidence_fail:
        raise UsageError("name at least one --evidence-pass or --evidence-fail CRITERION[=SUMMARY]")
    async with acting(args) as actor:
        state, item = await _looked_up(actor, args)
        submission = _submission(args, item)
        records = _evidence(item, args.evidence_pass or [], wp.EVIDENCE_RESULT_PASS, args.method, "--evidence-pass", submission)
        records += _evidence(item, args.evidence_fail or [], wp.EVIDENCE_RESULT_FAIL, args.method, "--evidence-fail", submission)
        results = await _record_review(actor, args, state, item, records)
    recorded = _recorded_ids(results)
    return report_all(
        args, results, f"recorded {len(recorded)} Evidence record(s) on submission {submission} of {item.work_item_id}",
        last_line=" ".join(recorded), extra={"evidence_ids": recorded},
    )


async def _reject(actor: Actor, args: argparse.Namespace) -> tuple[GroupState, wp.WorkItem, command_pb2.CommandResult]:
    """``work.fail`` REVIEW_REJECTED with failing review Evidence per --evidence-fail (MW-10.2-T13)."""
    state, item = await _looked_up(actor, args)
    submission = _submission(args, item)
    records = _evidence(item, args.evidence_fail, wp.EVIDENCE_RESULT_FAIL, args.method, "--evidence-fail", submission)
    body = wp.WorkFail(
        work_item_id=item.work_item_id, coordinator_epoch=coordinator_epoch(args, state),
        kind=wp.WORK_FAILURE_KIND_REVIEW_REJECTED, evidence=records,
        reason=args.reason or f"review rejected: {', '.join(c for c, _ in args.evidence_fail)} not met",
    )
    return state, item, await actor.execute(args.group, "work_fail", body)


async def cmd_reject(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        _, item, result = await _reject(actor, args)
    return report(args, result, f"rejected the submission of {item.work_item_id}: it is failed (re-offer it with mwp work offer)")


async def cmd_request_changes(args: argparse.Namespace) -> int:
    expires = expiry(args) or to_timestamp(SystemClock().now() + DEFAULT_OFFER_TTL)
    async with acting(args) as actor:
        _, before = await _looked_up(actor, args)
        to = args.to or [require(before.ownership.agent_id, f"{before.work_item_id} has no owner to send it back to", "--to")]
        selection(await actor.state(args.group), before.contract, to)  # candidates checked before the failure is sent
        state, item, failed = await _reject(actor, args)
        offered = await actor.execute(args.group, "work_offer", offer_body(args, state, item, to, expires))
    event = first_event(offered, "work_offered")
    offer_id = event.work_offered.offer_id if event else ""
    headline = f"requested changes to {item.work_item_id}: the submission is rejected and the work offered again to {', '.join(to)}"
    return report_all(args, [failed, offered], headline, last_line=offer_id, extra={"offer_id": offer_id})


async def cmd_fail(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await _looked_up(actor, args)
        records = _evidence(item, args.evidence_fail or [], wp.EVIDENCE_RESULT_FAIL, args.method, "--evidence-fail")
        if not records:  # failure Evidence is required (MW-10.2-T13): the observation itself
            records = [wp.Evidence(method=wp.EVIDENCE_METHOD_FAILURE_OBSERVATION, result=wp.EVIDENCE_RESULT_FAIL, summary=args.reason)]
        body = wp.WorkFail(work_item_id=item.work_item_id, kind=FAILURE_KINDS[args.kind], evidence=records, reason=args.reason)  # type: ignore[arg-type]
        by_owner = item.HasField("lease") and item.lease.agent_id == actor.signer.identity_id
        if by_owner:  # the Worker reports its own failure under its lease (MW-11.3-04)
            body.lease_id, body.ownership_epoch = item.lease.lease_id, item.lease.ownership_epoch
            body.usage_delta.CopyFrom(vector(args.usage, "--usage", mission_of(state).definition.budget.currency))
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
        body = wp.WorkCancel(work_item_id=args.work_item, coordinator_epoch=coordinator_epoch(args, state), reason=args.reason)
        result = await actor.execute(args.group, "work_cancel", body)
    return report(args, result, f"cancelled {args.work_item}")


async def cmd_unblock(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state = await actor.state(args.group)
        body = wp.WorkUnblock(
            work_item_id=args.work_item, resolution=args.resolution, resolved_blocker_ids=args.blocker or [],
            coordinator_epoch=coordinator_epoch(args, state),
        )
        result = await actor.execute(args.group, "work_unblock", body)
    event = first_event(result, "work_unblocked")
    now = enum_label(wp.WorkItemState, event.work_unblocked.next_state, "WORK_ITEM_STATE_") if event else "?"
    return report(args, result, f"unblocked {args.work_item}: it is {now}")


# ------------------------------------------------------------------ a Worker's commands, by hand


def _mine(item: wp.WorkItem, actor: Actor, what: str) -> wp.ExecutionLease:
    """The WorkItem's current execution lease, held by the actor; a CliError otherwise."""
    if not item.HasField("lease") or item.lease.agent_id != actor.signer.identity_id:
        raise CliError(f"{actor.signer.identity_id} holds no execution lease on {item.work_item_id} to {what} under (mwp work start first)")
    return item.lease


async def cmd_accept(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        _, item = await _looked_up(actor, args)
        me = actor.signer.identity_id
        offer = args.offer or require(
            next((o.offer_id for o in item.offers if me in o.candidate_ids), ""), f"{item.work_item_id} has no open offer to {me}", "--offer"
        )
        body = wp.WorkAcceptOffer(work_item_id=item.work_item_id, offer_id=offer, contract_revision=item.contract.revision)
        result = await actor.execute(args.group, "work_accept_offer", body)
    accepted = first_event(result, "work_offer_accepted")
    epoch = accepted.work_offer_accepted.ownership.ownership_epoch if accepted else 0
    headline = f"accepted offer {offer}: {me} owns {item.work_item_id} (contract revision {item.contract.revision}) at ownership epoch {epoch}"
    return report(args, result, headline)


async def cmd_decline(args: argparse.Namespace) -> int:
    if (args.reason == "other") != bool(args.code):
        raise UsageError("--code names the namespaced reason of --reason other (and only of it), e.g. com.example/maintenance")
    async with acting(args) as actor:
        _, item = await _looked_up(actor, args)
        me = actor.signer.identity_id
        offer = args.offer or require(
            next((o.offer_id for o in item.offers if me in o.candidate_ids), ""), f"{item.work_item_id} has no open offer to {me}", "--offer"
        )
        decline = wp.StructuredDecline(reason=DECLINE_REASONS[args.reason], extension_code=args.code or "", detail=args.detail or "")  # type: ignore[arg-type]
        result = await actor.execute(args.group, "work_decline_offer", wp.WorkDeclineOffer(work_item_id=item.work_item_id, offer_id=offer, decline=decline))
    return report(args, result, f"declined offer {offer} of {item.work_item_id} ({args.reason})")


async def cmd_start(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        _, item = await _looked_up(actor, args)
        me = actor.signer.identity_id
        if item.ownership.agent_id != me:
            raise CliError(f"{me} does not own {item.work_item_id} (accept an offer first: mwp work accept)")
        body = wp.WorkStart(work_item_id=item.work_item_id, ownership_epoch=item.ownership.ownership_epoch, lease_id=args.lease_id or "")
        if args.lease_seconds:
            body.requested_duration.FromSeconds(args.lease_seconds)
        result = await actor.execute(args.group, "work_start", body)
    started = first_event(result, "work_started")
    lease = started.work_started.lease.lease_id if started else ""
    headline = f"started {item.work_item_id} under execution lease {lease} (ownership epoch {body.ownership_epoch})"
    return report(args, result, headline, last_line=lease, extra={"lease_id": lease})


async def cmd_renew(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await _looked_up(actor, args)
        lease = _mine(item, actor, "renew")
        body = wp.WorkRenewLease(
            work_item_id=item.work_item_id, lease_id=lease.lease_id, ownership_epoch=lease.ownership_epoch,
            usage_delta=vector(args.usage, "--usage", mission_of(state).definition.budget.currency),
        )
        if args.lease_seconds:
            body.requested_duration.FromSeconds(args.lease_seconds)
        result = await actor.execute(args.group, "work_renew_lease", body)
    return report(args, result, f"renewed execution lease {lease.lease_id} of {item.work_item_id}")


async def cmd_submit(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await _looked_up(actor, args)
        lease = _mine(item, actor, "submit")
        records = _evidence(item, args.evidence_pass or [], wp.EVIDENCE_RESULT_PASS, args.method, "--evidence-pass")
        covered = {e.criterion_id for e in records}
        missing = [c.criterion_id for c in item.contract.acceptance_criteria if c.required and c.criterion_id not in covered]
        if missing:  # the Authority would refuse it (MW-13.2-02): say so before sending
            raise UsageError(f"--evidence-pass: no Evidence for the required acceptance criteria {', '.join(missing)}")
        body = wp.WorkSubmit(
            work_item_id=item.work_item_id, lease_id=lease.lease_id, ownership_epoch=lease.ownership_epoch,
            contract_revision=item.contract.revision, artifacts=args.artifact, evidence=records, summary=args.summary or "",
            usage_delta=vector(args.usage, "--usage", mission_of(state).definition.budget.currency),
        )
        result = await actor.execute(args.group, "work_submit", body)
    submitted = first_event(result, "work_submitted")
    submission = submitted.event_id if submitted else ""
    headline = f"submitted {item.work_item_id} (contract revision {item.contract.revision}) for review: submission {submission}"
    return report(args, result, headline, last_line=submission, extra={"submission_event_id": submission})


async def cmd_block(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state, item = await _looked_up(actor, args)
        lease = _mine(item, actor, "block")
        blocker = wp.Blocker(
            blocker_id=args.blocker_id or ids.new_id("blk"), kind=BLOCKER_KINDS[args.kind],  # type: ignore[arg-type]
            description=args.description or args.needs, required_resolution=args.needs,
        )
        body = wp.WorkBlock(
            work_item_id=item.work_item_id, lease_id=lease.lease_id, ownership_epoch=lease.ownership_epoch,
            checkpoint=wp.Checkpoint(), blockers=[blocker],
            usage_delta=vector(args.usage, "--usage", mission_of(state).definition.budget.currency),
        )
        result = await actor.execute(args.group, "work_block", body)
    return report(args, result, f"blocked {item.work_item_id}: needs {args.needs} (blocker {blocker.blocker_id})")


# ------------------------------------------------------------------ the DAG


async def cmd_tree(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        items = await mesh.work_items(args.group)
    document = tree_document(args.group, items)
    emit(args, tree_lines(document), document)
    return 0


# ------------------------------------------------------------------ parsers


def _work_item(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
    sp.add_argument("work_item", metavar="WORK_ITEM", type=id_value)
    return sp


def _evidence_flags(sp: argparse.ArgumentParser, *, passing: bool = False, failing: bool = False, required: bool = False) -> None:
    if passing:
        sp.add_argument("--evidence-pass", action="append", type=id_text, metavar="CRITERION[=SUMMARY]",
                        help="Evidence that the criterion is met (repeatable)")
    if failing:
        sp.add_argument("--evidence-fail", action="append", type=id_text, metavar="CRITERION[=SUMMARY]", required=required,
                        help="Evidence that the criterion is not met (repeatable)")
    sp.add_argument("--method", choices=list(EVIDENCE_METHODS), help="the Evidence method [the first one the criterion requires]")


def _offer_flags(sp: argparse.ArgumentParser, *, required: bool = True) -> None:
    sp.add_argument("--to", action="append", type=id_value, required=required, metavar="AGENT",
                    help="a candidate (repeatable, at most 8); an active member in a role that may accept")


def register(work: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The acting commands and ``tree``, added to ``mwp work`` (whose list and show readmodels.py adds)."""
    a = acting_command(work.add_parser("authorize", help="create a WorkItem with its contract (Coordinator)"))
    a.add_argument("work_item", metavar="WORK_ITEM", nargs="?", type=id_value, help="its id (default: a new one)")
    a.add_argument("--title", required=True, help="a short title (1..200 characters)")
    a.add_argument("--parent", type=id_value, help="the parent WorkItem in the plan tree")
    add_contract_flags(a)
    a.add_argument("--override-reason", help="MissionOwner: authorize as an audited emergency override (MW-7.1-13)")
    add_coordinator_epoch_flag(a)
    a.set_defaults(func=cmd_authorize)

    o = _work_item(acting_command(work.add_parser("offer", help="offer a WorkItem to candidates (Coordinator)")))
    _offer_flags(o)
    add_expiry_flags(o, "the offer", required=False)
    o.add_argument("--offer-id", type=id_value, help="the offer's id (default: derived by the Authority)")
    o.add_argument("--override-reason", help="MissionOwner: offer as an audited emergency override")
    add_coordinator_epoch_flag(o)
    o.set_defaults(func=cmd_offer)

    x = _work_item(acting_command(work.add_parser("extend", help="add candidates to an open offer (Coordinator)")))
    _offer_flags(x)
    x.add_argument("--offer", type=id_value, help="the offer extended (default: the WorkItem's only open offer)")
    add_expiry_flags(x, "the offer", required=False)
    add_coordinator_epoch_flag(x)
    x.set_defaults(func=cmd_extend)

    ar = _work_item(acting_command(work.add_parser("accept-result", help="accept the submitted result: verified (Coordinator)")))
    _evidence_flags(ar, passing=True)
    ar.add_argument("--submission", help="the submission accepted (default: the latest)")
    ar.add_argument("--comment")
    add_coordinator_epoch_flag(ar)
    ar.set_defaults(func=cmd_accept_result)

    ev = _work_item(acting_command(work.add_parser("evidence", help="record review Evidence on a submission (reviewer, Coordinator)")))
    _evidence_flags(ev, passing=True, failing=True)
    ev.add_argument("--submission", help="the submission reviewed (default: the latest)")
    add_coordinator_epoch_flag(ev)
    ev.set_defaults(func=cmd_evidence)

    for name, func, text in (
        ("request-changes", cmd_request_changes, "reject the submission with Evidence and offer the work again (Coordinator)"),
        ("reject", cmd_reject, "reject the submission with Evidence: the WorkItem fails (Coordinator)"),
    ):
        r = _work_item(acting_command(work.add_parser(name, help=text)))
        _evidence_flags(r, failing=True, required=True)
        r.add_argument("--reason", help="a short factual reason (default: the criteria not met)")
        r.add_argument("--submission", help="the submission rejected (default: the latest)")
        if func is cmd_request_changes:
            _offer_flags(r, required=False)
            add_expiry_flags(r, "the new offer", required=False)
        add_coordinator_epoch_flag(r)
        r.set_defaults(func=func)

    f = _work_item(acting_command(work.add_parser("fail", help="report a failure with Evidence (Coordinator, or the owner under its lease)")))
    f.add_argument("--reason", required=True, help="a short factual reason")
    f.add_argument("--kind", choices=list(FAILURE_KINDS), default="permanent")
    _evidence_flags(f, failing=True)
    f.add_argument("--usage", action="append", type=cap, metavar="DIMENSION=VALUE", help="the owner: usage since its last report")
    add_coordinator_epoch_flag(f)
    f.set_defaults(func=cmd_fail)

    c = _work_item(acting_command(work.add_parser("cancel", help="cancel an unfinished WorkItem (Coordinator)")))
    c.add_argument("--reason", required=True)
    add_coordinator_epoch_flag(c)
    c.set_defaults(func=cmd_cancel)

    u = _work_item(acting_command(work.add_parser("unblock", help="resolve a blocked WorkItem's blockers (Coordinator)")))
    u.add_argument("--resolution", required=True, help="how the blockers were resolved")
    u.add_argument("--blocker", action="append", help="a blocker id resolved (repeatable; every blocker ends either way)")
    add_coordinator_epoch_flag(u)
    u.set_defaults(func=cmd_unblock)

    ac = _work_item(acting_command(work.add_parser("accept", help="accept an offer made to you (Worker)")))
    ac.add_argument("--offer", type=id_value, help="the offer (default: the open offer naming you)")
    ac.set_defaults(func=cmd_accept)

    de = _work_item(acting_command(work.add_parser("decline", help="decline an offer made to you (Worker)")))
    de.add_argument("--offer", type=id_value, help="the offer (default: the open offer naming you)")
    de.add_argument("--reason", choices=list(DECLINE_REASONS), required=True)
    de.add_argument("--code", help="with --reason other: a namespaced code, e.g. com.example/maintenance")
    de.add_argument("--detail", help="a short factual detail")
    de.set_defaults(func=cmd_decline)

    st = _work_item(acting_command(work.add_parser("start", help="start a WorkItem you own: an execution lease (Worker)")))
    st.add_argument("--lease-id", type=id_value, help="the lease's id (default: derived by the Authority)")
    st.add_argument("--lease-seconds", type=natural, help="requested lease length (capped by the contract)")
    st.set_defaults(func=cmd_start)

    rn = _work_item(acting_command(work.add_parser("renew", help="renew your execution lease, reporting usage (Worker)")))
    rn.add_argument("--lease-seconds", type=natural, help="requested extension (capped by the contract)")
    rn.add_argument("--usage", action="append", type=cap, metavar="DIMENSION=VALUE", help="usage since the last report")
    rn.set_defaults(func=cmd_renew)

    sb = _work_item(acting_command(work.add_parser("submit", help="submit Artifacts with Evidence per criterion (Worker)")))
    sb.add_argument("--artifact", action="append", type=artifact_ref, required=True, metavar="blake3:HEX:SIZE",
                    help="a result Artifact, stored with its manifest first (mwp artifact put --manifest-for ...)")
    _evidence_flags(sb, passing=True)
    sb.add_argument("--summary", help="a short factual summary for the reviewer")
    sb.add_argument("--usage", action="append", type=cap, metavar="DIMENSION=VALUE", help="usage since the last report")
    sb.set_defaults(func=cmd_submit)

    bl = _work_item(acting_command(work.add_parser("block", help="checkpoint and block on what the work needs (Worker)")))
    bl.add_argument("--needs", required=True, help="the resolution required to continue")
    bl.add_argument("--kind", choices=list(BLOCKER_KINDS), default="information")
    bl.add_argument("--description", help="what blocks the work (default: what it needs)")
    bl.add_argument("--blocker-id", type=id_value, help="the blocker's id (default: a new one)")
    bl.add_argument("--usage", action="append", type=cap, metavar="DIMENSION=VALUE", help="usage since the last report")
    bl.set_defaults(func=cmd_block)

    t = reading_command(work.add_parser("tree", help="the WorkItem DAG: states, dependencies, owners"))
    t.set_defaults(func=cmd_tree)
