"""``mwp mission create-child | approve-depth | tree``: child Missions (spec 14) from the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any

from missionweave.cli.common import (
    acting,
    acting_command,
    add_actor_flags,
    add_coordinator_epoch_flag,
    add_json_flag,
    add_reader_flags,
    coordinator_epoch,
    emit,
    enum_label,
    first_event,
    reading,
    report,
)
from missionweave.cli.mission_definition import add_definition_flags, definition_from_args, renewal_policy
from missionweave.kernel import ids
from missionweave.v1 import mission_pb2, subtask_pb2
from missionweave.v1 import work_pb2 as wp

DIMENSIONS = ("financial_micros", "tokens", "tool_calls", "compute_ms", "wall_clock_ms", "side_effects")

# ------------------------------------------------------------------ the tree (MW-14-19)


def node_view(node: subtask_pb2.MissionTreeNode) -> dict[str, Any]:
    """One Mission of the tree as a JSON-ready dict (the --json document holds a list of them)."""
    return {
        "mission_id": node.mission_id,
        "group_id": node.group_id,
        "title": node.title,
        "kind": enum_label(mission_pb2.MissionKind, node.kind, "MISSION_KIND_"),
        "state": enum_label(mission_pb2.MissionState, node.state, "MISSION_STATE_"),
        "depth": node.depth,
        "parent_group_id": node.parent_group_id,
        "parent_work_item_id": node.parent_work_item_id,
        "owner_id": node.owner_id,
        "coordinator_id": node.coordinator_id,
        "mandatory": node.mandatory,
        "budget": {
            dim: {"used": getattr(node.budget.used, dim), "limit": getattr(node.budget.limit, dim)}
            for dim in DIMENSIONS
        },
        "reserved": {dim: getattr(node.reserved, dim) for dim in DIMENSIONS if getattr(node.reserved, dim)},
        "work_items": dict(
            sorted(
                (k.removeprefix("WORK_ITEM_STATE_").lower(), v) for k, v in node.work_items_by_state.items()
            )
        ),
        "blockers": [
            {
                "work_item_id": b.work_item_id,
                "kind": enum_label(wp.BlockerKind, b.kind, "BLOCKER_KIND_"),
                "resolution": b.required_resolution,
            }
            for b in node.blockers
        ],
    }


def _usage(view: dict[str, Any]) -> str:
    """``tokens 1,234/10,000  tool_calls 3/50`` for the dimensions with a limit."""
    parts = []
    for dim, amounts in view["budget"].items():
        if amounts["limit"] or amounts["used"]:
            held = view["reserved"].get(dim)
            extra = f" (+{held:,} reserved)" if held else ""
            parts.append(f"{dim} {amounts['used']:,}/{amounts['limit']:,}{extra}")
    return "  ".join(parts) or "no budget"


def render_tree(views: list[dict[str, Any]]) -> list[str]:
    lines = []
    for v in views:
        indent = "    " * v["depth"]
        branch = "└─ " if v["depth"] else ""
        via = (
            f"  (for {v['parent_work_item_id']}{', mandatory' if v['mandatory'] else ''})"
            if v["parent_work_item_id"]
            else ""
        )
        lines.append(f"{indent}{branch}{v['mission_id']}  {v['title']!r}  {v['state']}{via}")
        pad = indent + ("   " if v["depth"] else "") + "  "
        work = ", ".join(f"{n} {state}" for state, n in v["work_items"].items()) or "no WorkItems"
        lines.append(f"{pad}group {v['group_id']}  coordinator {v['coordinator_id']}  owner {v['owner_id']}")
        lines.append(f"{pad}budget {_usage(v)}")
        lines.append(f"{pad}work {work}")
        lines += [f"{pad}blocked {b['work_item_id']}: {b['resolution']}" for b in v["blockers"]]
    return lines


def render_dot(views: list[dict[str, Any]]) -> list[str]:
    """Graphviz: one box per Mission, an edge from each parent to its child labelled by the WorkItem."""
    lines = ["digraph missions {", "  rankdir=TB;", "  node [shape=box, fontname=Helvetica];"]
    for v in views:
        label = f"{v['title']}\\n{v['mission_id']}\\n{v['state']}\\n{_usage(v)}"
        style = ', style=filled, fillcolor="#f4cccc"' if v["blockers"] else ""
        lines.append(f"  {json.dumps(v['group_id'])} [label={json.dumps(label)}{style}];")
    for v in views:
        if v["parent_group_id"]:
            lines.append(
                f"  {json.dumps(v['parent_group_id'])} -> {json.dumps(v['group_id'])} [label={json.dumps(v['parent_work_item_id'])}];"
            )
    lines.append("}")
    return lines


async def cmd_tree(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        nodes = await mesh.mission_tree(args.group)
    views = [node_view(n) for n in nodes]
    emit(args, render_dot(views) if args.format == "dot" else render_tree(views), {"missions": views})
    return 0


# ------------------------------------------------------------------ creating a child (T03) and approving depth (14-06)


async def cmd_create_child(args: argparse.Namespace) -> int:
    group_id = args.group or ids.new_id("grp")
    definition = definition_from_args(args, args.actor)
    definition.budget.wall_clock_ms = args.wall_clock_ms  # carved from the parent's, not from the deadline
    definition.risk_policy.CopyFrom(
        mission_pb2.RiskPolicy(
            risk_class=mission_pb2.RISK_CLASS_LOW,
            execution_approver_ids=args.approver,
            require_root_owner_approval=args.root_approval,
        )
    )
    async with acting(args) as actor:
        parent = await actor.state(args.parent_group)
        body = subtask_pb2.MissionCreateChild(
            parent_group_id=args.parent_group,
            parent_mission_id=parent.mission.mission_id,
            parent_work_item_id=args.work_item,
            definition=definition,
            coordinator_id=args.coordinator,
            coordinator_renewal=renewal_policy(args.lease_seconds),
            mandatory=args.mandatory,
            parent_coordinator_epoch=coordinator_epoch(args, parent),
            depth_approval_event_id=args.depth_approval or "",
        )
        result = await actor.execute(group_id, "mission_create_child", body, creating=True)
    headline = f"child Mission created in group {group_id} for {args.work_item}; the parent WorkItem blocks once the link lands"
    return report(args, result, headline, last_line=group_id, extra={"new_group_id": group_id})


async def cmd_approve_depth(args: argparse.Namespace) -> int:
    body = subtask_pb2.MissionApproveChildDepth(
        parent_work_item_id=args.work_item, max_depth=args.max_depth, reason=args.reason
    )
    async with acting(args) as actor:
        result = await actor.execute(args.group, "mission_approve_child_depth", body)
    approved = first_event(result, "child_depth_approved")
    approval = approved.event_id if approved else ""
    return report(
        args,
        result,
        f"children of {args.work_item} may sit at depth {args.max_depth}: approval {approval}",
        last_line=approval,
        extra={"approval_event_id": approval},
    )


def add_parsers(mis: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    t = mis.add_parser(
        "tree", help="the Mission tree: states, budgets used against caps, blockers (MW-14-19)"
    )
    t.add_argument(
        "--group", required=True, help="any Group of the tree (the root MissionOwner sees all of it)"
    )
    t.add_argument("--format", choices=("text", "dot"), default="text", help="text (default) or Graphviz dot")
    add_json_flag(t)
    add_reader_flags(t)
    t.set_defaults(func=cmd_tree)

    c = mis.add_parser(
        "create-child", help="promote a WorkItem to a child Mission (the parent's Coordinator)"
    )
    add_actor_flags(c)
    c.add_argument("--parent-group", required=True, help="the parent Mission's Group")
    c.add_argument("--work-item", required=True, help="the parent WorkItem")
    add_definition_flags(c)
    c.add_argument(
        "--wall-clock-ms", type=int, default=0, help="the child's wall-clock budget (default 0: none)"
    )
    c.add_argument(
        "--approver",
        action="append",
        default=[],
        help="an execution approver of the child (repeatable; the parent's)",
    )
    c.add_argument(
        "--root-approval",
        action="store_true",
        help="the root MissionOwner approves the child's result too (MW-14-10)",
    )
    c.add_argument(
        "--mandatory", action="store_true", help="the parent WorkItem cannot complete without it (MW-14-15)"
    )
    c.add_argument(
        "--depth-approval",
        help="the parent's mission.child_depth.approved event id, beyond the default depth",
    )
    add_coordinator_epoch_flag(c, "yours in the parent Mission; default: the current lease's epoch")
    c.add_argument("--group", help="the child's Group id (default: a new one)")
    add_json_flag(c)
    c.set_defaults(func=cmd_create_child)

    d = acting_command(
        mis.add_parser("approve-depth", help="allow a deeper child of one WorkItem (MissionOwner, MW-14-06)")
    )
    d.add_argument("--work-item", required=True, help="the parent WorkItem")
    d.add_argument(
        "--max-depth", type=int, required=True, help="the deepest the child may sit (the root is 0)"
    )
    d.add_argument("--reason", required=True)
    d.set_defaults(func=cmd_approve_depth)


__all__ = ["add_parsers"]
