"""``mwp mission progress``: the Mission's derived progress as text, JSON or a Graphviz DAG.

Everything shown comes from ``AuthorityService.GetMissionProgress``, which derives it from the log
(MW-7.3-01); there is deliberately no percentage (MW-7.3-03).
"""

from __future__ import annotations

import argparse
import json
from itertools import pairwise

from missionweave.cli.common import add_reader_flags, enum_label, reading, to_dict, when
from missionweave.v1 import authority_service_pb2 as pb
from missionweave.v1 import mission_pb2, work_pb2

_COLOURS = {
    "VERIFIED": "palegreen",
    "ACTIVE": "lightskyblue",
    "QUEUED": "lightyellow",
    "OFFERED": "khaki",
    "BLOCKED": "orange",
    "SUBMITTED": "plum",
    "FAILED": "salmon",
    "CANCELLED": "lightgrey",
    "OPEN": "white",
}


def _state(value: int) -> str:
    return enum_label(work_pb2.WorkItemState, value, "WORK_ITEM_STATE_")


def render_text(progress: pb.GetMissionProgressResponse) -> list[str]:
    mission_state = enum_label(mission_pb2.MissionState, progress.mission_state, "MISSION_STATE_")
    lines = [
        f"Mission {progress.mission_id}: {mission_state} (derived at Group revision {progress.group_revision})",
        f"required WorkItems verified: {progress.required_verified} of {progress.required_total}",
        f"critical path: {' -> '.join(progress.critical_path) or '(nothing left)'}",
    ]
    if progress.approval_event_id:
        lines.append(f"approved by {progress.approval_event_id}")
    elif progress.latest_submission_event_id:
        lines.append(f"submitted for approval: {progress.latest_submission_event_id}")
    lines.append("")
    for item in progress.work_items:
        marks = [
            m
            for m, on in (
                ("critical", item.on_critical_path),
                ("overdue", item.overdue),
                ("waiting on deps", not item.eligible),
            )
            if on
        ]
        after = f" after {', '.join(item.depends_on)}" if item.depends_on else ""
        owner = f" owner {item.owner_id}" if item.owner_id else ""
        lines.append(
            f"  {_state(item.state):<10} {item.work_item_id}  {item.title}{after}{owner}  [{', '.join(marks)}]".rstrip(
                " []"
            )
        )
        for blocker in item.blockers:
            lines.append(f"             blocked: needs {blocker}")
        if item.accepted_evidence_ids:
            lines.append(f"             evidence: {', '.join(item.accepted_evidence_ids)}")
        lines.append(f"             deadline {when(item.deadline)}, attempts {item.attempts}")
    used, budget = progress.used, progress.budget
    lines.append("")
    lines.append(
        f"usage: tokens {used.tokens}/{budget.tokens}, tool calls {used.tool_calls}/{budget.tool_calls}, "
        f"financial {used.financial_micros / 1e6:.2f}/{budget.financial_micros / 1e6:.2f} {budget.currency}"
    )
    return lines


def render_dot(progress: pb.GetMissionProgressResponse) -> list[str]:
    """The WorkItem DAG for Graphviz: nodes coloured by state, the critical path in bold red."""
    path = list(progress.critical_path)
    critical_edges = set(pairwise(path))
    lines = [
        f'digraph "{progress.mission_id}" {{',
        "  rankdir=LR;",
        '  node [shape=box, style="rounded,filled"];',
    ]
    for item in progress.work_items:
        state = _state(item.state)
        pen = ", penwidth=3, color=red" if item.on_critical_path else ""
        label = f"{item.work_item_id}\\n{item.title}\\n{state}".replace('"', "'")
        lines.append(
            f'  "{item.work_item_id}" [label="{label}", fillcolor={_COLOURS.get(state, "white")}{pen}];'
        )
    for item in progress.work_items:
        for dep in item.depends_on:
            style = " [color=red, penwidth=3]" if (dep, item.work_item_id) in critical_edges else ""
            lines.append(f'  "{dep}" -> "{item.work_item_id}"{style};')
    lines.append("}")
    return lines


async def cmd_progress(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        progress = await mesh.authority.GetMissionProgress(pb.GetMissionProgressRequest(group_id=args.group))
    if args.format == "json" or getattr(args, "json", False):
        print(json.dumps(to_dict(progress), indent=2, sort_keys=True))
    else:
        print("\n".join(render_dot(progress) if args.format == "dot" else render_text(progress)))
    return 0


def add_progress_parser(mis: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = mis.add_parser(
        "progress", help="derived progress: the WorkItem DAG, critical path, blockers (no percentages)"
    )
    p.add_argument("--group", required=True)
    p.add_argument("--format", choices=["text", "json", "dot"], default="text", help="dot: Graphviz DAG")
    p.add_argument("--json", action="store_true", help="same as --format json")
    add_reader_flags(p)
    p.set_defaults(func=cmd_progress)
