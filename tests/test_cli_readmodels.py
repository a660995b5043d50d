"""``mwp work list|show``, ``mwp mission list``, ``mwp identity list|show`` as a subprocess against
a live mesh: readable tables, --json documents, and the exit codes of README (1 refused)."""

from __future__ import annotations

from datetime import timedelta

from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import membership_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.test_cli_mission import Bench, execute
from tests.test_cli_mission import bench as bench  # the fixture

G = "grp_cli_reads"


async def planned(bench: Bench) -> None:
    """G with two WorkItems: wi-a active under lease-a (worker-bot), wi-b open."""
    now = bench.clock.now()
    await execute(bench, "alice", G, "mission_create", builders.mission_create("alice", "coord-bot", now))
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await execute(bench, "alice", G, "membership_grant", grant)
    for wid in ("wi-a", "wi-b"):
        body = wp.WorkAuthorize(
            work_item_id=wid, title=f"task {wid}", contract=builders.contract(now), coordinator_epoch=1
        )
        await execute(bench, "coord-bot", G, "work_authorize", body)
    offer = wp.WorkOffer(
        work_item_id="wi-a",
        offer_id="offer-a",
        candidate_ids=["worker-bot"],
        expires_at=to_timestamp(now + timedelta(minutes=5)),
        selection_criteria=[builders.selection("worker-bot")],
        coordinator_epoch=1,
    )
    await execute(bench, "coord-bot", G, "work_offer", offer)
    accept = wp.WorkAcceptOffer(work_item_id="wi-a", offer_id="offer-a", contract_revision=1)
    await execute(bench, "worker-bot", G, "work_accept_offer", accept)
    await execute(
        bench,
        "worker-bot",
        G,
        "work_start",
        wp.WorkStart(work_item_id="wi-a", ownership_epoch=1, lease_id="lease-a"),
    )


async def test_work_list_and_show_give_the_lease_and_epoch(bench: Bench) -> None:
    await planned(bench)
    table = (await bench.mwp("work", "list", "--group", G)).stdout
    assert "2 WorkItems of grp_cli_reads" in table
    row_a = next(line for line in table.splitlines() if "wi-a" in line).split()
    assert row_a[:5] == ["wi-a", "ACTIVE", "worker-bot", "1", "lease-a"]
    only = (await bench.mwp("work", "list", "--group", G, "--state", "open", "--json")).json()
    assert [i["work_item_id"] for i in only["work_items"]] == ["wi-b"]
    assert only["work_items"][0]["state"] == "WORK_ITEM_STATE_OPEN"
    shown = (await bench.mwp("work", "show", "--group", G, "wi-a", *bench.as_("worker-bot"))).stdout
    assert "WorkItem wi-a: 'task wi-a'" in shown and "lease-a (session" in shown
    assert "worker-bot, epoch 1" in shown
    doc = (await bench.mwp("work", "show", "--group", G, "wi-a", "--json")).json()
    assert doc["lease"]["lease_id"] == "lease-a" and doc["ownership_epoch"] == "1"  # uint64: a JSON string
    missing = await bench.mwp("work", "show", "--group", G, "wi-nope", expect=1)
    assert "refused: NOT_FOUND" in missing.stderr
    await bench.mwp("work", "list", "--group", G, "--state", "bogus", expect=2)
    outsider = await bench.mwp("work", "list", "--group", G, *bench.as_("relief-bot"), expect=1)
    assert "NOT_A_MEMBER" in outsider.stderr


async def test_mission_list_shows_the_callers_missions(bench: Bench) -> None:
    await planned(bench)
    other = builders.mission_create("alice", "relief-bot", bench.clock.now())
    await execute(bench, "alice", "grp_cli_other", "mission_create", other)
    mine = (await bench.mwp("mission", "list", *bench.as_("worker-bot"))).stdout
    assert "1 Mission visible to worker-bot" in mine and G in mine and "grp_cli_other" not in mine
    everything = (await bench.mwp("mission", "list", "--json", *bench.as_("admin"))).json()
    assert [m["group_id"] for m in everything["missions"]] == ["grp_cli_other", G]
    assert (
        everything["missions"][1]["state"] == "ACTIVE"
        and everything["missions"][1]["coordinator_id"] == "coord-bot"
    )


async def test_identity_list_is_for_operators_and_show_for_anyone(bench: Bench) -> None:
    table = (await bench.mwp("identity", "list", *bench.as_("admin"))).stdout
    assert "5 identities" in table and "alice" in table and "worker-bot" in table
    doc = (await bench.mwp("identity", "list", "--json", *bench.as_("admin"))).json()
    kinds = {i["identity_id"]: i["kind"] for i in doc["identities"]}
    assert kinds["alice"] == "human" and kinds["worker-bot"] == "agent"
    refused = await bench.mwp("identity", "list", *bench.as_("worker-bot"), expect=1)
    assert "refused: PERMISSION_DENIED" in refused.stderr
    shown = (await bench.mwp("identity", "show", "coord-bot", "--json")).json()
    assert shown["kind"] == "agent" and len(shown["public_key"]) == 64 and shown["session_epoch"] == 1
