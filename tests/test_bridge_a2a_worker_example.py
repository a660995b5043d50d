"""examples/a2a/summarizer_agent.py, started as its README says (a process of its own), works a
WorkItem through the bridge: it asks what to summarise, the Coordinator answers, it summarises."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from missionweave.v1 import work_pb2 as wp
from tests.a2a_agents import free_port
from tests.conftest import World, polled
from tests.test_bridge_a2a_worker import bridged, events, of, work_and_offer
from tests.test_missions import G
from tests.test_work_items import setup

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "a2a" / "summarizer_agent.py"


@pytest.mark.req("MW-11.4-04", "MW-13.2-02")
async def test_the_example_summarizer_agent_works_a_workitem_through_the_bridge(
    world: World, tmp_path: Path
) -> None:
    w = world
    flow = await setup(w)
    port, grpc_port = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        "--port",
        str(port),
        "--grpc-port",
        str(grpc_port),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        async def card_served() -> bool:
            async with httpx.AsyncClient() as http:
                try:
                    return (await http.get(url + "/.well-known/agent-card.json")).status_code == 200
                except httpx.TransportError:
                    return False

        await polled(card_served, 30, 0.2)
        async with bridged(w, url, tmp_path, transport="grpc") as runtime:
            await work_and_offer(flow, "wi-1", "Summarise the auditor's notes")

            async def blocked() -> bool:
                return bool(of(await events(w), "work_blocked"))

            await polled(blocked, 30)
            notes = "The Q3 ledger balances. Two invoices were booked twice and are reversed."
            await flow.coord(
                "work_unblock", wp.WorkUnblock(work_item_id="wi-1", resolution=notes, coordinator_epoch=1)
            )
            async with asyncio.timeout(30):
                assert await runtime.submitted(1) == [(G, "wi-1")]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    log = await events(w)
    question = [m.content.text for m in of(log, "message_posted")]
    assert question == ["summarizer asks: There is nothing to summarise: paste the text, please."]
    [submitted] = of(log, "work_submitted")
    [summary] = [await w.client.download(a.digest) for a in submitted.artifacts]
    assert summary.startswith(b"# Summary\n\nGoal: Summarise the auditor's notes\n")
    assert b"answer: 12 words" in summary and submitted.artifacts[0].media_type == "text/markdown"
    assert proc.returncode in (0, -signal.SIGTERM), err.decode()[-2000:]
