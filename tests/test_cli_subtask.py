"""``mwp mission create-child | approve-depth | tree``: the CLI as a subprocess against a live mesh
(the ``bench`` of tests/test_cli_mission.py)."""

from __future__ import annotations

import pytest

from missionweave.v1 import authority_service_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.conftest import polled
from tests.test_cli_member import mission_group
from tests.test_cli_mission import Bench, execute
from tests.test_cli_mission import bench as bench  # the fixture

CHILD = [
    "--title",
    "EU ledger",
    "--objective",
    "Reconcile the EU ledger",
    "--done",
    "balances match",
    "--coordinator",
    "relief-bot",
    "--tokens",
    "1000",
    "--tool-calls",
    "5",
    "--deadline-hours",
    "12",
    "--approver",
    "alice",
]


async def parent_item(bench: Bench, group: str) -> authority_service_pb2.WorkItemProgress:
    progress = await bench.client.authority.GetMissionProgress(
        authority_service_pb2.GetMissionProgressRequest(group_id=group)
    )
    return progress.work_items[0]


@pytest.mark.req("MW-14-19", "MW-7.1-T03")
async def test_create_a_child_and_print_the_tree_as_text_dot_and_json(bench: Bench) -> None:
    group = await mission_group(bench)
    authorize = wp.WorkAuthorize(
        work_item_id="wi-1",
        title="ledgers",
        contract=builders.contract(bench.clock.now()),
        coordinator_epoch=1,
    )
    await execute(bench, "coord-bot", group, "work_authorize", authorize)
    # More than the WorkItem has: refused with the structured reason, exit 1, nothing created.
    too_big = await bench.mwp(
        "mission",
        "create-child",
        *bench.as_("coord-bot"),
        "--parent-group",
        group,
        "--work-item",
        "wi-1",
        *CHILD,
        "--tokens",
        "20000",
        expect=1,
    )  # the last --tokens counts
    assert "CHILD_BUDGET_EXCEEDS_PARENT" in too_big.stderr + too_big.stdout
    created = await bench.mwp(
        "mission",
        "create-child",
        *bench.as_("coord-bot"),
        "--parent-group",
        group,
        "--work-item",
        "wi-1",
        *CHILD,
    )
    child = created.last_line
    assert child.startswith("grp_") and "child Mission created" in created.stdout

    async def blocked() -> bool:
        return (await parent_item(bench, group)).state == wp.WORK_ITEM_STATE_BLOCKED

    await polled(blocked)
    text = (
        await bench.mwp("mission", "tree", "--group", child)
    ).stdout.splitlines()  # the root owner reads it
    assert text[0].startswith(f"mis_{group.removeprefix('grp_')}") and "ACTIVE" in text[0]
    assert any(line.startswith("    └─ mis_") and "(for wi-1)" in line for line in text)
    assert any("blocked wi-1: the child Mission" in line for line in text)
    assert any("tokens 0/1,000" in line for line in text) and any(
        "(+1,000 reserved)" in line for line in text
    )
    dot = (await bench.mwp("mission", "tree", "--group", group, "--format", "dot")).stdout
    assert dot.startswith("digraph missions {") and f'"{group}" -> "{child}" [label="wi-1"];' in dot
    document = (await bench.mwp("mission", "tree", "--group", group, "--json")).json()
    root, leaf = document["missions"]
    assert (root["depth"], leaf["depth"], leaf["parent_work_item_id"]) == (0, 1, "wi-1")
    assert root["reserved"] == {"tokens": 1000, "tool_calls": 5} and root["work_items"] == {"blocked": 1}
    assert leaf["budget"]["tokens"] == {"limit": 1000, "used": 0} and leaf["owner_id"] == "coord-bot"
    shown = (await bench.mwp("mission", "show", "--group", child)).stdout
    assert f"child of     wi-1 in {group} (depth 1, root owner alice)" in shown
    # A Worker of the parent is shown nothing.
    denied = await bench.mwp("mission", "tree", "--group", group, *bench.as_("worker-bot"), expect=1)
    assert "NOT_A_MEMBER" in denied.stderr + denied.stdout


@pytest.mark.req("MW-14-06")
async def test_approve_depth_prints_the_approval_event(bench: Bench) -> None:
    group = await mission_group(bench)
    authorize = wp.WorkAuthorize(
        work_item_id="wi-1",
        title="ledgers",
        contract=builders.contract(bench.clock.now()),
        coordinator_epoch=1,
    )
    await execute(bench, "coord-bot", group, "work_authorize", authorize)
    approved = await bench.mwp(
        "mission",
        "approve-depth",
        "--group",
        group,
        "--work-item",
        "wi-1",
        "--max-depth",
        "4",
        "--reason",
        "the audit needs it",
        *bench.as_("alice"),
    )
    assert approved.last_line.startswith("evt_") and "may sit at depth 4" in approved.stdout
    refused = await bench.mwp(
        "mission",
        "approve-depth",
        "--group",
        group,
        "--work-item",
        "wi-1",
        "--max-depth",
        "4",
        "--reason",
        "x",
        *bench.as_("coord-bot"),
        expect=1,
    )
    assert "PERMISSION_DENIED" in refused.stderr + refused.stdout
