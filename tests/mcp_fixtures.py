"""What the `mwp mcp` tests share: a Mission in the `world` mesh with a Worker and a Coordinator
whose keys and saved sessions are on disk (so `mwp mcp` subprocesses act under the very sessions
the test opened), MCP clients built with the mcp SDK's own ClientSession over stdio and streamable
HTTP, and a client side of the tasks extension."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from mcp.client.extension import ClaimContext, ResultClaim
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.signing import write_key
from missionweave.sdk.client import SessionSigner
from missionweave.v1 import membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.mcp_server.tasks import TASKS_EXTENSION, TaskHandle
from tests import builders
from tests.conftest import World
from tests.test_missions import G, create

ROOT = Path(__file__).resolve().parents[1]


class TaskIdParams(RequestParams):
    task_id: str


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams


class ListTasks(Request[RequestParams, Literal["tasks/list"]]):
    method: Literal["tasks/list"] = "tasks/list"
    params: RequestParams


class Detailed(Result):
    """Any tasks/get or tasks/list answer: its fields kept as sent."""

    model_config = ConfigDict(extra="allow")


async def _unresolved(handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
    raise AssertionError("the tests poll tasks themselves (call_tool(..., allow_claimed=True))")


TASK_CLAIM = ResultClaim(result_type="task", model=TaskHandle, resolve=_unresolved)


@dataclass
class Party:
    """An identity of the world with its key file and saved session (as `mwp session open` saves it)."""

    signer: SessionSigner
    key: Path

    @property
    def id(self) -> str:
        return self.signer.identity_id


def party(tmp: Path, signer: SessionSigner) -> Party:
    key = tmp / f"{signer.identity_id}.key"
    write_key(key, signer.key)
    key.with_name(key.name + ".session.json").write_text(
        json.dumps({"identity": signer.identity_id, "session_epoch": signer.session_epoch})
    )
    return Party(signer, key)


def mwp_mcp_args(w: World, who: Party, state: Path, *extra: str) -> list[str]:
    return [
        "-m",
        "missionweave.cli",
        "--target",
        w.target,
        "mcp",
        "--as",
        who.id,
        "--key",
        str(who.key),
        "--state-dir",
        str(state),
        *extra,
    ]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    return env


@asynccontextmanager
async def stdio_session(
    w: World, who: Party, state: Path, *extra: str, tasks: bool = True
) -> AsyncIterator[ClientSession]:
    """A ClientSession over stdio with a `mwp mcp` subprocess (modern protocol, server/discover)."""
    params = StdioServerParameters(
        command=sys.executable, args=mwp_mcp_args(w, who, state, *extra), env=environment(), cwd=ROOT
    )
    async with stdio_client(params) as (read, write):
        extensions = {TASKS_EXTENSION: {}} if tasks else None
        claims = {TASKS_EXTENSION: [TASK_CLAIM]} if tasks else None
        async with ClientSession(read, write, extensions=extensions, result_claims=claims) as session:
            await session.discover()
            yield session


@asynccontextmanager
async def http_session(url: str, token: str | None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            claims = {TASKS_EXTENSION: [TASK_CLAIM]}
            async with ClientSession(
                read, write, extensions={TASKS_EXTENSION: {}}, result_claims=claims
            ) as session:
                await session.discover()
                yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> CallToolResult:
    return await session.call_tool(tool, arguments)


async def data(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured content; the call must succeed."""
    result = await call(session, tool, **arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def refusal(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await call(session, tool, **arguments)
    assert result.is_error, result.structured_content
    assert result.structured_content is not None and result.structured_content["refused"] is True
    assert result.structured_content["written"] is False and result.structured_content["hint"]
    return result.structured_content


async def task_result(
    session: ClientSession, tool: str, *, limit_s: float = 30, **arguments: Any
) -> dict[str, Any]:
    """Calls a task tool, which answers with a task handle, and polls tasks/get until the task is
    completed; its tool result's structured content."""
    handle = await session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(handle, TaskHandle), handle
    task = await task_finished(session, handle.task_id, limit_s)
    assert task["status"] == "completed", task
    return dict(task["result"]["structuredContent"])


async def task_finished(session: ClientSession, task_id: str, limit_s: float = 30) -> dict[str, Any]:
    async with asyncio.timeout(limit_s):
        while (task := await task_get(session, task_id))["status"] == "working":  # noqa: ASYNC110 (tasks/get is polled: the extension's way)
            await asyncio.sleep(0.2)
    return task


async def task_get(session: ClientSession, task_id: str) -> dict[str, Any]:
    answer = await session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), Detailed)
    return dict(answer.model_extra or {})


async def task_cancel(session: ClientSession, task_id: str) -> None:
    await session.send_request(CancelTask(params=TaskIdParams(task_id=task_id)), Detailed)


async def tasks_list(session: ClientSession) -> list[dict[str, Any]]:
    answer = await session.send_request(ListTasks(params=RequestParams()), Detailed)
    return list((answer.model_extra or {})["tasks"])


async def mission(w: World, *, lease_seconds: int = 60) -> None:
    """The Mission of tests/test_missions.py (owner alice, Coordinator coord-bot) with worker-bot a Worker."""
    await create(w, lease_seconds=3600)
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)


async def authorized(
    w: World, work_item_id: str, *, lease_seconds: int = 60, ledger: bytes = b""
) -> wp.WorkItem:
    """A WorkItem authorized by coord-bot (through the SDK, not MCP), with ``ledger`` as its input."""
    contract = builders.contract(w.clock.now())
    contract.time_policy.execution_lease_duration.FromSeconds(lease_seconds)
    if ledger:
        ref = await w.deliverable(w.coordinator, G, work_item_id, ledger)
        contract.inputs.append(wp.WorkInput(name="ledger", artifact=ref))
    body = wp.WorkAuthorize(
        work_item_id=work_item_id, title=f"task {work_item_id}", contract=contract, coordinator_epoch=1
    )
    await w.run(w.coordinator, G, "work_authorize", body, membership_epoch=2)
    return await w.client.work_item(G, work_item_id)


async def offered(w: World, work_item_id: str, to: str = "worker-bot") -> str:
    offer = wp.WorkOffer(
        work_item_id=work_item_id,
        offer_id=f"offer-{work_item_id}",
        candidate_ids=[to],
        expires_at=to_timestamp(w.clock.now() + timedelta(minutes=10)),
        selection_criteria=[builders.selection(to)],
        coordinator_epoch=1,
    )
    await w.run(w.coordinator, G, "work_offer", offer, membership_epoch=2)
    return offer.offer_id
