"""``mwp worker queue``: the CLI as a subprocess against a live mesh (the ``bench`` of
tests/test_cli_mission.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from missionweave.clock import to_timestamp
from missionweave.v1 import membership_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.test_cli_member import mission_group
from tests.test_cli_mission import Bench, execute
from tests.test_cli_mission import bench as bench  # the fixture


@pytest.mark.req("MW-11.1-01", "MW-11.1-03")
async def test_a_worker_lists_its_own_queue_and_nobody_elses(bench: Bench) -> None:
    group = await mission_group(bench)
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await execute(bench, "alice", group, "membership_grant", grant)
    body = wp.WorkAuthorize(work_item_id="wi-1", title="t", contract=builders.contract(bench.clock.now()), coordinator_epoch=1)
    await execute(bench, "coord-bot", group, "work_authorize", body)
    offer = wp.WorkOffer(
        work_item_id="wi-1", offer_id="off-1", candidate_ids=["worker-bot"], coordinator_epoch=1,
        expires_at=to_timestamp(bench.clock.now() + timedelta(minutes=5)), selection_criteria=[builders.selection("worker-bot")],
    )
    await execute(bench, "coord-bot", group, "work_offer", offer)
    await execute(bench, "worker-bot", group, "work_accept_offer", wp.WorkAcceptOffer(work_item_id="wi-1", offer_id="off-1", contract_revision=1))
    shown = (await bench.mwp("worker", "queue", "--group", group, *bench.as_("worker-bot"))).stdout
    assert f"worker-bot's queue of {group}" in shown and "wi-1" in shown and "queued" in shown
    document = (await bench.mwp("worker", "queue", "--group", group, "--json", *bench.as_("worker-bot"))).json()
    assert [e["work_item_id"] for e in document["entries"]] == ["wi-1"]
    # The Coordinator's own queue holds none of the Worker's work.
    theirs = (await bench.mwp("worker", "queue", "--group", group, *bench.as_("coord-bot"))).stdout
    assert "wi-1" not in theirs and "(empty)" in theirs
    # Not a member: refused, exit 1.
    await bench.mwp("worker", "queue", "--group", "grp_never", *bench.as_("worker-bot"), expect=1)
