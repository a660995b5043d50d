"""examples/mcp/scripted_host.py, as docs/mcp.md runs it: the mcp SDK's client starts `mwp mcp`
and works one offered WorkItem through its tools, against a live mesh."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from missionweave.v1 import work_pb2 as wp
from tests.conftest import World
from tests.mcp_fixtures import ROOT, authorized, environment, mission, offered, party
from tests.test_missions import G

LEDGER = b"cash 100\nbank 250\n"


async def test_the_scripted_host_works_an_offered_work_item_through_mwp_mcp(
    world: World, tmp_path: Path
) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1", ledger=LEDGER)
    await offered(w, "wi-1")
    worker = party(tmp_path, w.worker)
    host = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "examples" / "mcp" / "scripted_host.py"),
        "--target",
        w.target,
        "--as",
        worker.id,
        "--key",
        str(worker.key),
        "--group",
        G,
        "--wait",
        "30",
        cwd=ROOT,
        env=environment(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(host.communicate(), 120)
    assert host.returncode == 0, (out + err).decode()[-3000:]
    printed = out.decode()
    for tool in ("wait_for_offer", "accept_offer", "start_work", "read_input", "store_output", "submit_work"):
        assert f"{tool}: " in printed
    item = await w.client.work_item(G, "wi-1")
    assert item.state == wp.WORK_ITEM_STATE_SUBMITTED
    [report] = item.artifacts
    text = (await w.client.download(report.digest)).decode()
    assert "Goal: Reconcile the Q3 ledger" in text and "ledger: 18 characters" in text
