"""``mwp plan apply|export``: a Mission's WorkItem DAG kept in a file (the format: plan_file.py).

``apply`` compares each item of the plan with the WorkItem of that id: a new one is authorized, a
changed one revised (a new ``work.offer`` carrying the amended contract, the protocol's only way to
revise a contract, MW-10.1-04/05), an unchanged one left alone, so re-applying an unchanged plan
writes nothing. The changes are shown first and applied on ``--yes`` or a confirmation. Each
command's id is derived from the item and what it writes, so an apply retried after a crash is
answered by the Authority's idempotency instead of doing anything twice. ``export`` writes the
Group's DAG in the same format; applying the export writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import blake3
import tomli_w
from google.protobuf.message import Message

from missionweave.cli.common import (
    Actor,
    CliError,
    GroupState,
    UsageError,
    acting,
    acting_command,
    add_coordinator_epoch_flag,
    duration,
    emit,
    enum_label,
    mission_of,
    reading,
    reading_command,
    result_events,
    to_dict,
    when,
)
from missionweave.cli.plan_file import (
    MISSING,
    MissionFacts,
    PlanError,
    PlanItem,
    compact,
    describe,
    diff,
    items_of,
    read,
)
from missionweave.cli.work.offer import DEFAULT_OFFER_TTL, offer_body, steering
from missionweave.cli.workdag import find_cycle, topological
from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import command_pb2
from missionweave.v1 import work_pb2 as wp

# A revision is a new offer, which the protocol allows only from these states, with no live owner (T03).
REVISABLE = {
    wp.WORK_ITEM_STATE_OPEN,
    wp.WORK_ITEM_STATE_OFFERED,
    wp.WORK_ITEM_STATE_QUEUED,
    wp.WORK_ITEM_STATE_ACTIVE,
    wp.WORK_ITEM_STATE_BLOCKED,
    wp.WORK_ITEM_STATE_FAILED,
}
# The contract fields a plan describes; a revision keeps every other one as the running contract has it.
PLANNED_FIELDS = (
    "goal",
    "deliverables",
    "acceptance_criteria",
    "inputs",
    "depends_on_work_item_ids",
    "dependency_policy",
    "required_capabilities",
    "deadline",
    "urgency",
    "business_impact",
    "business_impact_note",
    "budget",
    "risk_class",
    "requires_execution_approval",
    "execution_approver_ids",
    "notes",
)


@dataclass
class Change:
    """What applying the plan does to one WorkItem."""

    work_item_id: str
    action: str  # authorize, revise, unchanged, not in the plan
    differences: list[tuple[str, Any, Any]] = field(default_factory=list)
    kind: str = ""
    body: Message | None = None
    command_id: str = ""
    note: str = ""


def command_id(
    group_id: str, work_item_id: str, action: str, base_revision: int, *content: Message | str
) -> str:
    """Fixed by the item, the revision it starts from and what it writes: the same apply, retried,
    sends the same id and gets the stored result back (D6); a different plan never reuses one."""
    digest = blake3.blake3()
    for part in content:
        digest.update(
            part.SerializeToString(deterministic=True) if isinstance(part, Message) else part.encode()
        )
        digest.update(b"\0")
    return ids.derived_id(
        "cmd", group_id, "plan", work_item_id, action, str(base_revision), digest.hexdigest()
    )


def revised(running: wp.WorkContract, planned: wp.WorkContract) -> wp.WorkContract:
    """The running contract with the fields the plan describes replaced by the plan's."""
    out = wp.WorkContract()
    out.CopyFrom(running)
    for name in PLANNED_FIELDS:
        out.ClearField(name)  # type: ignore[arg-type]
    for name in PLANNED_FIELDS:
        value = getattr(planned, name)
        if hasattr(value, "extend"):
            getattr(out, name).extend(value)
        elif isinstance(value, Message):
            if planned.HasField(name):  # type: ignore[arg-type]
                getattr(out, name).CopyFrom(value)
        else:
            setattr(out, name, value)
    out.retry_policy.max_attempts = planned.retry_policy.max_attempts
    schemas = {
        d.deliverable_id: d.schema.artifact for d in running.deliverables if d.schema.HasField("artifact")
    }
    for d in out.deliverables:  # a schema stored as an Artifact, which a plan does not name, is kept too
        if d.deliverable_id in schemas:
            d.schema.artifact.CopyFrom(schemas[d.deliverable_id])
    out.revision = 0  # the Authority sets it
    return out


# ------------------------------------------------------------------ planning


def check_graph(plan: dict[str, PlanItem], existing: dict[str, wp.WorkItem]) -> None:
    """Every dependency is an item of the plan or a WorkItem of the Group, and the DAG they make
    with the Group's other WorkItems has no cycle (MW-10.4-04)."""
    for wid, item in plan.items():
        for i, dep in enumerate(item.contract.depends_on_work_item_ids):
            if dep not in plan and dep not in existing:
                raise PlanError(
                    f"items.{wid}.depends_on[{i}]",
                    f"no item {dep!r} in the plan and no WorkItem {dep!r} in the Group",
                )
        if item.parent and item.parent not in plan and item.parent not in existing:
            raise PlanError(f"items.{wid}.parent", f"no item {item.parent!r} in the plan or the Group")
    edges = {w: list(i.contract.depends_on_work_item_ids) for w, i in existing.items()}
    edges |= {w: list(i.contract.depends_on_work_item_ids) for w, i in plan.items()}
    cycle = find_cycle(edges)
    if cycle:
        first = next(w for w in cycle if w in plan)
        raise PlanError(f"items.{first}.depends_on", f"a dependency cycle: {' -> '.join(cycle)}")


def _candidates(item: PlanItem, running: wp.WorkItem) -> list[str]:
    """Who a revision is offered to: the plan's offer_to, else the candidates of the open offer."""
    candidates = item.offer_to or next((list(o.candidate_ids) for o in running.offers), [])
    if not candidates:
        raise PlanError(
            f"items.{item.work_item_id}.offer_to",
            "a contract revision is a new offer (work.offer with the amended contract): name its candidates",
        )
    return candidates


def _check_revisable(
    item: PlanItem, running: wp.WorkItem, differences: list[tuple[str, Any, Any]], now: datetime
) -> None:
    where = f"items.{item.work_item_id}"
    for name in ("title", "parent"):
        if any(f == name for f, _, _ in differences):
            raise PlanError(
                f"{where}.{name}",
                f"a WorkItem's {name} is not part of its contract and cannot change once authorized",
            )
    state = enum_label(wp.WorkItemState, running.state, "WORK_ITEM_STATE_")
    if running.state not in REVISABLE:
        raise PlanError(
            where,
            f"{item.work_item_id} is {state}: its contract can no longer be revised (authorize a new WorkItem instead)",
        )
    if running.HasField("ownership") and running.ownership.expires_at.ToDatetime(tzinfo=UTC) > now:
        raise PlanError(
            where,
            f"{item.work_item_id} is {state}, owned by {running.ownership.agent_id} until {when(running.ownership.expires_at)}: "
            "a revision is a new offer, which needs no live owner (let the work finish, or fail or cancel it first)",
        )


def plan_changes(
    args: argparse.Namespace, state: GroupState, plan: dict[str, PlanItem], existing: dict[str, wp.WorkItem]
) -> list[Change]:
    """One Change per item in dependency order (what it depends on first), then the Group's
    WorkItems the plan does not name; every refusal is raised before anything is sent."""
    now = datetime.now(UTC)
    order = topological(
        {w: [d for d in i.contract.depends_on_work_item_ids if d in plan] for w, i in plan.items()}
    )
    expires = to_timestamp(
        now + DEFAULT_OFFER_TTL if args.offer_expires_in is None else now + args.offer_expires_in
    )
    changes = []
    for wid in order:
        item = plan[wid]
        running = existing.get(wid)
        body: Message
        if running is None:
            body = wp.WorkAuthorize(
                work_item_id=wid,
                title=item.title,
                contract=item.contract,
                parent_work_item_id=item.parent,
                **steering(args, state),
            )
            cid = command_id(args.group, wid, "authorize", 0, body)
            changes.append(
                Change(
                    wid, "authorize", kind="work_authorize", body=body, command_id=cid, note=repr(item.title)
                )
            )
            continue
        differences = diff(
            describe(running.title, running.parent_work_item_id, running.contract),
            describe(item.title, item.parent, item.contract),
        )
        if not differences:
            changes.append(Change(wid, "unchanged"))
            continue
        _check_revisable(item, running, differences, now)
        candidates = _candidates(item, running)
        amended = revised(running.contract, item.contract)
        body = offer_body(args, state, running, candidates, expires, amended_contract=amended)
        base = running.contract.revision
        change = Change(
            wid,
            "revise",
            differences,
            "work_offer",
            body,
            command_id(args.group, wid, "revise", base, amended, *candidates),
            f"contract revision {base} -> {base + 1}, offered to {', '.join(candidates)}",
        )
        changes.append(change)
    changes += [Change(w, "not in the plan", note="left as it is") for w in existing if w not in plan]
    return changes


# ------------------------------------------------------------------ output


def _value(v: Any) -> str:
    return "(none)" if v is MISSING else json.dumps(v, sort_keys=True)


def change_lines(changes: list[Change]) -> list[str]:
    marks = {"authorize": "+", "revise": "~", "unchanged": "=", "not in the plan": "?"}
    lines = []
    for c in changes:
        note = f" ({c.note})" if c.note else ""
        lines.append(f"  {marks[c.action]} {c.work_item_id}  {c.action}{note}")
        lines += [
            f"      {name}: {_value(before)} -> {_value(after)}" for name, before, after in c.differences
        ]
    return lines


def change_document(c: Change) -> dict[str, Any]:
    return {
        "work_item_id": c.work_item_id,
        "action": c.action,
        "command_id": c.command_id,
        "note": c.note,
        "diff": [
            {"field": n, "before": None if b is MISSING else b, "after": None if a is MISSING else a}
            for n, b, a in c.differences
        ],
    }


def _confirmed(args: argparse.Namespace, count: int) -> bool:
    """--yes, or a "y" typed at the terminal; without a terminal, a usage error (nothing sent)."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError(
            f"the plan makes {count} change(s) to {args.group}: pass --yes to apply them (--dry-run only shows them)"
        )
    sys.stderr.write(f"apply these {count} change(s) to {args.group}? [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


# ------------------------------------------------------------------ commands


async def _apply(actor: Actor, args: argparse.Namespace, document: dict[str, Any]) -> int:
    state = await actor.state(args.group)
    existing = {w.work_item_id: w for w in await actor.mesh.work_items(args.group)}
    plan = items_of(document, MissionFacts.of(state))
    check_graph(plan, existing)
    changes = plan_changes(args, state, plan, existing)
    writes = [c for c in changes if c.body is not None]
    header = f"plan {args.file} against {args.group} (head sequence {state.head_sequence}):"
    summary = (
        f"{sum(c.action == 'authorize' for c in writes)} to authorize, {sum(c.action == 'revise' for c in writes)} to revise"
        if writes
        else f"nothing to change: {args.group} matches the plan"
    )
    report: dict[str, Any] = {
        "group_id": args.group,
        "plan": str(args.file),
        "head_sequence": state.head_sequence,
        "changed": bool(writes),
        "dry_run": args.dry_run,
        "applied": False,
        "changes": [change_document(c) for c in changes],
        "results": [],
    }
    if not args.json:
        print("\n".join([header, *change_lines(changes), summary]), flush=True)
    if not writes or args.dry_run:
        emit(args, [], report)  # the human lines are out already
        return 0
    if not _confirmed(args, len(writes)):
        raise CliError("nothing applied")
    results: list[command_pb2.CommandResult] = []
    for c in writes:
        assert c.body is not None
        result = await actor.execute(args.group, c.kind, c.body, command_id=c.command_id)
        results.append(result)
        if not args.json:
            replayed = " (idempotent retry: nothing new was written)" if result.replayed else ""
            print(f"  {c.action} {c.work_item_id}: done{replayed}")
            for e in result_events(result):
                print(f"    #{e.sequence} {e.type} {e.event_id}")
    report |= {
        "applied": True,
        "results": [
            {
                "command_id": r.command_id,
                "group_revision": r.group_revision,
                "replayed": r.replayed,
                "events": [to_dict(e) for e in result_events(r)],
            }
            for r in results
        ],
    }
    emit(args, [f"group {args.group} is at revision {results[-1].group_revision}"], report)
    return 0


async def cmd_apply(args: argparse.Namespace) -> int:
    document = read(args.file)
    # Everything the file alone can be wrong about is found before connecting (the Mission's
    # deadline and currency stand in), the rest once the Group is read; nothing is sent before both.
    standing_in = items_of(document, MissionFacts.stand_in())
    cycle = find_cycle({w: list(i.contract.depends_on_work_item_ids) for w, i in standing_in.items()})
    if cycle:
        raise PlanError(f"items.{cycle[0]}.depends_on", f"a dependency cycle: {' -> '.join(cycle)}")
    async with acting(args) as actor:
        return await _apply(actor, args, document)


async def cmd_export(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        state = await mesh.group_state(args.group)
        items = {w.work_item_id: w for w in await mesh.work_items(args.group)}
    if not items:
        raise CliError(f"{args.group} holds no WorkItem to export")
    facts = MissionFacts.of(state)
    order = topological({w: list(i.contract.depends_on_work_item_ids) for w, i in items.items()})
    described = {
        w: compact(describe(items[w].title, items[w].parent_work_item_id, items[w].contract), facts)
        for w in order
    }
    if args.json:
        emit(
            args,
            [],
            {"group_id": args.group, "head_sequence": state.head_sequence, "version": 1, "items": described},
        )
        return 0
    text = (
        f"# The WorkItem DAG of {args.group} (Mission {mission_of(state).mission_id}) at head sequence {state.head_sequence},\n"
        f"# written by mwp plan export. `mwp plan apply FILE --group {args.group}` writes nothing while it is unchanged.\n"
        "# Contract fields a plan does not carry (time and cost policies, permissions) stay as each WorkItem has them.\n\n"
        + tomli_w.dumps({"version": 1, "items": described})
    )
    if args.output:
        await asyncio.to_thread(Path(args.output).write_text, text)
        print(f"wrote {len(items)} item(s) of {args.group} to {args.output}")
    else:
        sys.stdout.write(text)
    return 0


# ------------------------------------------------------------------ parsers


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    plan = sub.add_parser(
        "plan", help="a Mission's WorkItem DAG kept in a file: apply, export"
    ).add_subparsers(dest="sub", required=True)
    a = acting_command(
        plan.add_parser(
            "apply",
            help="create or revise the DAG as the plan says; unchanged: nothing written (Coordinator)",
        )
    )
    a.add_argument("file", type=Path, metavar="FILE", help='the plan (TOML; docs/cli.md "Plans")')
    g = a.add_mutually_exclusive_group()
    g.add_argument("--yes", action="store_true", help="apply the changes without asking")
    g.add_argument("--dry-run", action="store_true", help="only show the changes")
    a.add_argument(
        "--offer-expires-in",
        type=duration,
        metavar="DURATION",
        help="how long a revision's offer stands [1h]",
    )
    add_coordinator_epoch_flag(a)
    a.set_defaults(func=cmd_apply)

    e = reading_command(plan.add_parser("export", help="write the Group's WorkItem DAG as a plan"))
    e.add_argument("-o", "--output", metavar="FILE", help="write it here (default: stdout)")
    e.set_defaults(func=cmd_export)
