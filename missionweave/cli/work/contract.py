"""The work contract of ``mwp work authorize`` (MW-10.1-01): its flags (``add_contract_flags``) and
the contract they describe (``contract_from_args``), checked once before connecting, with a
stand-in deadline and currency, and built again from the Group's Mission; a ContractError is
reported as a usage error naming the flag that gave the field.
"""

from __future__ import annotations

import argparse
from datetime import UTC
from typing import Any

from missionweave.cli.common import GroupState, UsageError, capability, duration, instant, mission_of
from missionweave.cli.delegation import cap
from missionweave.cli.work.arguments import id_text, id_value, methods, vector, work_input
from missionweave.kernel.clock import SystemClock
from missionweave.sdk.contracts import (
    DEPENDENCY_POLICIES,
    EVIDENCE_METHODS,
    IMPACTS,
    RISKS,
    STAND_IN_CURRENCY,
    URGENCIES,
    ContractError,
    work_contract,
)
from missionweave.v1 import work_pb2 as wp

# Which flag gives which field of the contract, to name it in an error.
FLAGS = {
    "goal": "--goal",
    "deliverables": "--deliverable",
    "criteria": "--criterion",
    "evidence": "--evidence",
    "inputs": "--input",
    "depends_on": "--depends-on",
    "capabilities": "--capability",
    "deadline": "--deadline",
    "urgency": "--urgency",
    "impact": "--impact",
    "budget": "--budget",
    "max_attempts": "--max-attempts",
    "risk": "--risk",
    "notes": "--notes",
}


def contract_usage(err: ContractError) -> UsageError:
    flag = FLAGS.get(err.field.split(".")[0].split("[")[0])
    return UsageError(f"{flag}: {err}" if flag else str(err))


def add_contract_flags(sp: argparse.ArgumentParser) -> None:
    c = sp.add_argument_group("the work contract (MW-10.1-01; defaults in brackets)")
    c.add_argument("--goal", help="what the work achieves [the title]")
    c.add_argument(
        "--deliverable",
        action="append",
        type=id_text,
        metavar="ID[=DESCRIPTION]",
        help="a required deliverable (repeatable) [result=the goal]",
    )
    c.add_argument(
        "--criterion",
        action="append",
        type=id_text,
        required=True,
        metavar="ID=DESCRIPTION",
        help="an acceptance criterion (repeatable, at least one)",
    )
    c.add_argument(
        "--evidence",
        action="append",
        type=methods,
        metavar="CRITERION=METHOD[,METHOD]",
        help=f"the Evidence a criterion requires: {', '.join(EVIDENCE_METHODS)} [review]",
    )
    c.add_argument(
        "--depends-on", action="append", type=id_value, metavar="WORK_ITEM", help="a dependency (repeatable)"
    )
    c.add_argument("--dependency-policy", choices=list(DEPENDENCY_POLICIES), default="all-verified")
    c.add_argument(
        "--input",
        action="append",
        type=work_input,
        metavar="NAME=SOURCE",
        help="an input: NAME=blake3:HEX[:SIZE] or NAME=WORK_ITEM[/DELIVERABLE] (repeatable)",
    )
    c.add_argument(
        "--capability", action="append", type=capability, metavar="ID=VERSION", help="a required capability"
    )
    d = c.add_mutually_exclusive_group()
    d.add_argument(
        "--deadline", type=instant, metavar="ISO", help="e.g. 2026-12-01T18:00:00Z [the Mission's deadline]"
    )
    d.add_argument("--deadline-in", type=duration, metavar="DURATION", help="e.g. 36h, 2d, from now")
    c.add_argument("--urgency", choices=list(URGENCIES), default="normal")
    c.add_argument("--impact", choices=list(IMPACTS), default="medium", help="business impact")
    c.add_argument("--impact-note", default="", help="a machine-readable qualifier, e.g. customer-facing")
    c.add_argument(
        "--budget",
        action="append",
        type=cap,
        required=True,
        metavar="DIMENSION=VALUE",
        help="financial=1.50, tokens=N, tool_calls=N, compute_ms=N, wall_clock_ms=N, side_effects=N "
        "(repeatable; a dimension not named is 0 and allows nothing; it must fit in what the Mission has left)",
    )
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
