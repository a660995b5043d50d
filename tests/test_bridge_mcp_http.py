"""`mwp mcp --http`: streamable HTTP, reached with the mcp SDK's own ClientSession, where every
request must carry the bearer token (a request without it, or with another, is refused 401 before
the MCP layer sees it), and a task started over one connection is listed again over the next."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2

from missionweave_bridges.mcp_server.tasks import TaskHandle
from tests import default_signals
from tests.conftest import World
from tests.mcp_fixtures import (
    ROOT,
    Party,
    authorized,
    data,
    environment,
    http_session,
    mission,
    mwp_mcp_args,
    offered,
    party,
    task_finished,
    tasks_list,
)
from tests.test_missions import G

TOKEN = "s3cret-token-for-the-mcp-tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def http_server(w: World, who: Party, tmp: Path, *extra: str) -> AsyncIterator[str]:
    """A `mwp mcp --http` subprocess; its URL once it answers (polled, with a deadline)."""
    port = free_port()
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    args = mwp_mcp_args(
        w, who, tmp / "state", "--http", f"127.0.0.1:{port}", "--token-file", str(token_file), *extra
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        default_signals.PATH,  # a child of a background job would ignore SIGINT and SIGTERM
        *args,
        env=environment(),
        cwd=ROOT,
        start_new_session=True,  # its own process group: a Ctrl-C to pytest is not delivered to it
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        async with asyncio.timeout(30):
            while True:
                assert process.returncode is None, "mwp mcp --http exited"
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                await asyncio.sleep(0.1)
        yield url
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


async def test_http_refuses_a_missing_or_wrong_token_and_serves_the_right_one(
    world: World, tmp_path: Path
) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1")
    async with http_server(w, party(tmp_path, w.worker), tmp_path) as url:
        request = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}
        async with httpx2.AsyncClient() as raw:
            missing = await raw.post(url, json=request)
            wrong = await raw.post(url, json=request, headers={"Authorization": "Bearer not-the-token"})
        for refused in (missing, wrong):
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"].startswith("Bearer")
        async with http_session(url, TOKEN) as mcp:
            assert (await data(mcp, "list_work"))["agent_id"] == "worker-bot"
            handle = await mcp.call_tool(
                "wait_for_offer", {"group_id": G, "timeout_seconds": 60}, allow_claimed=True
            )
            assert isinstance(handle, TaskHandle)
        offer_id = await offered(w, "wi-1")
        async with http_session(url, TOKEN) as again:  # a new connection lists the task again
            assert [t["taskId"] for t in await tasks_list(again)] == [handle.task_id]
            task = await task_finished(again, handle.task_id)
            assert task["result"]["structuredContent"]["offers"][0]["offer_ids"] == [offer_id]


async def test_http_without_a_token_does_not_start(world: World, tmp_path: Path) -> None:
    w = world
    who = party(tmp_path, w.worker)
    args = mwp_mcp_args(w, who, tmp_path / "state", "--http", f"127.0.0.1:{free_port()}")
    env = {k: v for k, v in environment().items() if k != "MWP_MCP_TOKEN"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, default_signals.PATH, *args, env=env, cwd=ROOT, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(30):
        _, err = await process.communicate()
    assert process.returncode == 2 and b"bearer token" in err
