"""The WorkItem DAG of a Group (MW-10.4-01): dependency order, cycles, and ``mwp work tree``'s view.

Edges point from a WorkItem to those it depends on (``depends_on``); a dependency outside the
mapping given (a WorkItem the Group holds but a plan does not name) is a leaf.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from missionweave.cli.common import enum_label
from missionweave.v1 import work_pb2


def find_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle as the path of dependencies that returns to its start (``[a, b, a]``: a depends on
    b, which depends on a), or None (MW-10.4-04)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node not in edges or node in done:
            return None
        if node in path:
            return [*path[path.index(node) :], node]
        path.append(node)
        for dep in edges[node]:
            found = visit(dep)
            if found:
                return found
        path.pop()
        done.add(node)
        return None

    for node in edges:
        found = visit(node)
        if found:
            return found
    return None


def topological(edges: Mapping[str, Sequence[str]]) -> list[str]:
    """Every node of ``edges`` after the nodes it depends on, otherwise in the mapping's order.
    The caller has ruled out cycles (``find_cycle``)."""
    order: list[str] = []
    placed: set[str] = set()

    def place(node: str) -> None:
        if node in placed or node not in edges:
            return
        placed.add(node)
        for dep in edges[node]:
            place(dep)
        order.append(node)

    for node in edges:
        place(node)
    return order


# ------------------------------------------------------------------ mwp work tree


def _state(item: work_pb2.WorkItem) -> str:
    return enum_label(work_pb2.WorkItemState, item.state, "WORK_ITEM_STATE_")


def tree_document(group_id: str, items: Sequence[work_pb2.WorkItem]) -> dict[str, Any]:
    """The DAG as a JSON-ready dict: each WorkItem with its state, owner, dependencies and
    dependents, the roots (no dependency) and a dependency order."""
    edges = {i.work_item_id: list(i.contract.depends_on_work_item_ids) for i in items}
    dependents: dict[str, list[str]] = {wid: [] for wid in edges}
    for wid, deps in edges.items():
        for dep in deps:
            dependents.setdefault(dep, []).append(wid)
    return {
        "group_id": group_id,
        "roots": [wid for wid, deps in edges.items() if not any(d in edges for d in deps)],
        "order": topological(edges),
        "work_items": [
            {
                "work_item_id": i.work_item_id,
                "title": i.title,
                "state": _state(i),
                "owner_id": i.ownership.agent_id,
                "ownership_epoch": i.ownership_epoch,
                "contract_revision": i.contract.revision,
                "depends_on": edges[i.work_item_id],
                "dependents": dependents[i.work_item_id],
                "dependencies_satisfied": i.dependencies_satisfied,
            }
            for i in items
        ],
    }


def tree_lines(document: dict[str, Any]) -> list[str]:
    """The DAG indented under its roots: each WorkItem below the first of its dependencies, and
    named again (``shown above``) below the others, so a diamond reads top to bottom."""
    nodes = {n["work_item_id"]: n for n in document["work_items"]}
    lines = [
        f"WorkItem DAG of {document['group_id']} ({len(nodes)} WorkItem{'' if len(nodes) == 1 else 's'})"
    ]
    shown: set[str] = set()

    def line(node: dict[str, Any]) -> str:
        deps = node["depends_on"]
        after = f"  (after {', '.join(deps)})" if len(deps) > 1 else ""
        waiting = "" if node["dependencies_satisfied"] or not deps else "  [waiting on dependencies]"
        return f"{node['work_item_id']}  {node['state']}  {node['owner_id'] or '-'}  {node['title']!r}{after}{waiting}"

    def walk(wid: str, prefix: str, branch: str) -> None:
        node = nodes[wid]
        if wid in shown:
            lines.append(f"{prefix}{branch}{wid}  (shown above)")
            return
        shown.add(wid)
        lines.append(f"{prefix}{branch}{line(node)}")
        below = prefix + ("    " if branch else "")
        for child in node["dependents"]:
            walk(child, below, "+-- ")

    for root in document["roots"]:
        walk(root, "", "")
    for wid in nodes:  # only a cycle (which the Authority refuses) would leave one out
        if wid not in shown:
            walk(wid, "", "")
    return lines
