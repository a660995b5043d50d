"""`mwp mcp`'s long operations as MCP tasks (the io.modelcontextprotocol/tasks extension), kept in
the identity's state directory: a client that lost its task ids (it disconnected, the server
restarted) lists them again with tasks/list or the list_tasks tool and gets the result."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from missionweave.sdk.client import blob_digest
from missionweave.sdk.files import read_json
from missionweave_bridges.mcp_server.tasks import TaskHandle
from tests.conftest import World
from tests.mcp_fixtures import (
    authorized,
    data,
    mission,
    offered,
    party,
    refusal,
    stdio_session,
    task_cancel,
    task_finished,
    task_get,
    task_result,
    tasks_list,
)
from tests.test_missions import G


async def test_a_task_is_listed_again_after_the_client_and_the_server_restart(
    world: World, tmp_path: Path
) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1")
    worker, state = party(tmp_path, w.worker), tmp_path / "state"
    async with stdio_session(w, worker, state) as first:
        handle = await first.call_tool(
            "wait_for_offer", {"group_id": G, "timeout_seconds": 120}, allow_claimed=True
        )
        assert isinstance(handle, TaskHandle) and handle.status == "working"
        assert [t["taskId"] for t in await tasks_list(first)] == [handle.task_id]
    # The client went away with the server it started; the task is on disk, still working.
    stored = (read_json(state / "tasks.json") or {})["tasks"]
    assert (
        stored[handle.task_id]["status"] == "working" and stored[handle.task_id]["tool"] == "wait_for_offer"
    )
    offer_id = await offered(w, "wi-1")
    async with stdio_session(w, worker, state) as second:
        # A client that lost the id finds it: with tasks/list, and with the list_tasks tool (for a model).
        assert [t["taskId"] for t in await tasks_list(second)] == [handle.task_id]
        listed = await data(second, "list_tasks")
        assert [(t["taskId"], t["tool"]) for t in listed["tasks"]] == [(handle.task_id, "wait_for_offer")]
        # The restarted server ran it again: it completes with the offer made meanwhile.
        task = await task_finished(second, handle.task_id)
        assert task["status"] == "completed", task
        offers = task["result"]["structuredContent"]["offers"]
        assert [(o["work_item_id"], o["offer_ids"]) for o in offers] == [("wi-1", [offer_id])]
    async with stdio_session(w, worker, state) as third:  # finished tasks are kept with their result
        again = await task_get(third, handle.task_id)
        assert again["status"] == "completed" and again["result"] == task["result"]


async def test_cancel_stops_a_task_and_clients_without_tasks_get_the_result_inline(
    world: World, tmp_path: Path
) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1")
    worker = party(tmp_path, w.worker)
    async with stdio_session(w, worker, tmp_path / "state") as mcp:
        handle = await mcp.call_tool(
            "follow_work_item",
            {"group_id": G, "work_item_id": "wi-1", "timeout_seconds": 600},
            allow_claimed=True,
        )
        assert isinstance(handle, TaskHandle)
        await task_cancel(mcp, handle.task_id)
        assert (await task_get(mcp, handle.task_id))["status"] == "cancelled"
        with pytest.raises(MCPError) as unknown:
            await task_get(mcp, "task_nope")
        assert unknown.value.error.code == -32602
    async with stdio_session(w, worker, tmp_path / "state", tasks=False) as plain:
        waited = await data(plain, "wait_for_offer", group_id=G, timeout_seconds=1)
        assert waited == {"offers": [], "timed_out": True}


async def test_a_file_upload_runs_as_a_task_and_only_from_an_allowed_directory(
    world: World, tmp_path: Path
) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1")
    await offered(w, "wi-1")
    allowed, elsewhere = tmp_path / "outputs", tmp_path / "private"
    allowed.mkdir()
    elsewhere.mkdir()
    big = allowed / "report.bin"
    big.write_bytes(bytes(range(256)) * 8192)  # 2 MiB: more than one upload chunk
    (elsewhere / "secret.txt").write_text("not for the mesh")
    worker = party(tmp_path, w.worker)
    async with stdio_session(w, worker, tmp_path / "state", "--files", str(allowed)) as mcp:
        await data(mcp, "accept_offer", group_id=G, work_item_id="wi-1")
        await data(mcp, "start_work", group_id=G, work_item_id="wi-1")
        stored = await task_result(
            mcp,
            "store_output",
            group_id=G,
            work_item_id="wi-1",
            path=str(big),
            media_type="application/octet-stream",
        )
        digest = blob_digest(big.read_bytes())
        assert stored["artifact"] == f"blake3:{digest.hex}:{digest.size_bytes}"
        assert await w.client.download(digest) == big.read_bytes()
        outside = await refusal(
            mcp, "store_output", group_id=G, work_item_id="wi-1", path=str(elsewhere / "secret.txt")
        )
        assert outside["reason"] == "PATH_NOT_ALLOWED"
        sneaky = await refusal(
            mcp,
            "store_output",
            group_id=G,
            work_item_id="wi-1",
            path=str(allowed / ".." / "private" / "secret.txt"),
        )
        assert sneaky["reason"] == "PATH_NOT_ALLOWED"


async def test_a_host_polling_a_task_is_not_gone_its_lease_is_kept(world: World, tmp_path: Path) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1", lease_seconds=2)
    await offered(w, "wi-1")
    worker = party(tmp_path, w.worker)
    async with stdio_session(w, worker, tmp_path / "state", "--idle-release", "3") as mcp:
        await data(mcp, "accept_offer", group_id=G, work_item_id="wi-1")
        await data(mcp, "start_work", group_id=G, work_item_id="wi-1")
        handle = await mcp.call_tool(
            "follow_work_item",
            {"group_id": G, "work_item_id": "wi-1", "timeout_seconds": 7},
            allow_claimed=True,
        )
        assert isinstance(handle, TaskHandle)
        # Only tasks/get for 7 s (over twice --idle-release): the host is there, the lease is renewed.
        task = await task_finished(mcp, handle.task_id, limit_s=20)
        assert task["result"]["structuredContent"]["changed"] is False
        item = await w.client.work_item(G, "wi-1")
        assert item.lease.expires_at.ToDatetime(tzinfo=UTC) > datetime.now(UTC)
        await data(mcp, "report_progress", group_id=G, work_item_id="wi-1", phase="still holding")
