"""`mwp mission progress` rendering: readable text and a Graphviz DAG with the critical path."""

from __future__ import annotations

from missionweave.cli.progress import render_dot, render_text
from missionweave.v1 import authority_service_pb2 as pb
from missionweave.v1 import work_pb2 as wp


def sample() -> pb.GetMissionProgressResponse:
    return pb.GetMissionProgressResponse(
        mission_id="mis_x",
        mission_state=1,
        group_revision=42,
        critical_path=["wi-b", "wi-c"],
        required_total=3,
        required_verified=1,
        work_items=[
            pb.WorkItemProgress(
                work_item_id="wi-a",
                title="extract",
                state=wp.WORK_ITEM_STATE_VERIFIED,
                required=True,
                eligible=True,
                accepted_evidence_ids=["ev-1"],
            ),
            pb.WorkItemProgress(
                work_item_id="wi-b",
                title="reconcile",
                state=wp.WORK_ITEM_STATE_BLOCKED,
                depends_on=["wi-a"],
                required=True,
                eligible=True,
                on_critical_path=True,
                blockers=["finance export"],
            ),
            pb.WorkItemProgress(
                work_item_id="wi-c",
                title="report",
                state=wp.WORK_ITEM_STATE_OPEN,
                depends_on=["wi-b"],
                required=True,
                on_critical_path=True,
            ),
        ],
    )


def test_text_shows_counts_critical_path_blockers_and_no_percentage() -> None:
    text = "\n".join(render_text(sample()))
    assert "required WorkItems verified: 1 of 3" in text
    assert "critical path: wi-b -> wi-c" in text
    assert "blocked: needs finance export" in text and "evidence: ev-1" in text
    assert "%" not in text


def test_dot_export_is_a_dag_with_the_critical_path_highlighted() -> None:
    dot = "\n".join(render_dot(sample()))
    assert dot.startswith('digraph "mis_x" {') and dot.rstrip().endswith("}")
    assert '"wi-a" -> "wi-b";' in dot
    assert '"wi-b" -> "wi-c" [color=red, penwidth=3];' in dot
    assert dot.count("->") == 2
