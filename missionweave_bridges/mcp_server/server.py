"""``mwp mcp``'s MCP server: the tools of work_finding_tools, worker_tools, coordinator_tools and conversation_tools
under one identity, the tasks extension of tasks.py, and lease renewal (leases.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.context import Context
from mcp_types import CallToolResult, InputRequiredResult

from missionweave import __version__
from missionweave_bridges.mcp_server import (
    conversation_tools,
    coordinator_tools,
    work_finding_tools,
    worker_tools,
)
from missionweave_bridges.mcp_server.content import OutputLog, content_of, ok
from missionweave_bridges.mcp_server.desk import Desk
from missionweave_bridges.mcp_server.leases import LeaseKeeper
from missionweave_bridges.mcp_server.refusals import Refused
from missionweave_bridges.mcp_server.tasks import TasksExtension, TaskStore

INSTRUCTIONS = """\
MissionWeave: you act as {me} in Missions (Groups of WorkItems) owned by people. Every tool is a
signed command or an authorized read under that identity; a refused call returns a tool error with
a stable `reason` and a `hint` (what to call next), and writes nothing.
As a Worker: list_work (or wait_for_offer) -> accept_offer -> start_work -> show_work_item and
read_input -> report_progress / checkpoint / store_output -> submit_work with Evidence for every
acceptance criterion. Blocked? block_with_question, then follow_work_item. Cannot do it? fail_work.
As a Coordinator: plan_work -> offer_work -> follow_work_item -> review_submission; answer_block
for a blocked WorkItem. Long waits run as MCP tasks; list_tasks finds them again after a reconnect.
"""


def refusal_in(exc: BaseException) -> Refused | None:
    """The Refused a tool raised, through the SDK's ToolError wrapping."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, Refused):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class MissionWeaveMCP(MCPServer[Any]):
    """MCPServer whose tools' refusals become tool errors with structured content."""

    desk: Desk

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except Exception as exc:
            refused = refusal_in(exc)
            if refused is None:
                raise
            return refused.result()


class Assembly:
    """The server and what runs beside it; ``start`` in the serving loop, ``close`` when it ends."""

    def __init__(self, desk: Desk, *, files: list[Path], idle_release_s: float) -> None:
        self.desk = desk
        self.keeper = LeaseKeeper(desk, idle_release_s)
        self.tasks = TaskStore(desk.state_dir / "tasks.json")
        self.files = files
        outputs = OutputLog(desk.state_dir / "outputs.json")
        self.server = MissionWeaveMCP(
            "missionweave",
            title="MissionWeave",
            version=__version__,
            instructions=INSTRUCTIONS.format(me=desk.me),
            extensions=[TasksExtension(self.tasks, self.run_tool, self.check_task)],
        )
        self.server.desk = desk

        async def host_seen(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
            # Any request from the host (a tool call, a tasks/get poll) shows it is still there: how
            # the lease keeper tells a slow host from a gone one (--idle-release).
            desk.touched = time.monotonic()
            return await call_next(ctx)

        self.server.middleware.append(host_seen)
        work_finding_tools.register(self.server, desk, outputs)
        worker_tools.register(self.server, desk, self.keeper, outputs, files)
        coordinator_tools.register(self.server, desk)
        conversation_tools.register(self.server, desk)

        @self.server.tool(
            description="Every MCP task of this identity (waits, uploads), newest last, with its status and, when "
            "finished, its result: the way to find a task again after a reconnect or a restart."
        )
        async def list_tasks() -> CallToolResult:
            listing = self.tasks.listing()
            lines = [
                f"{t['taskId']} {t['tool']} {t['status']}: {t.get('statusMessage', '')}" for t in listing
            ]
            return ok("\n".join([f"{len(listing)} task(s)", *lines]), {"tasks": listing})

    def check_task(self, name: str, arguments: dict[str, Any]) -> None:
        if name == "store_output":
            content_of(
                str(arguments.get("text", "")),
                str(arguments.get("base64", "")),
                str(arguments.get("path", "")),
                self.files,
            )

    async def run_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        result = await self.server.call_tool(name, arguments)
        assert isinstance(result, CallToolResult)  # no tool of this server asks for input
        return result

    async def start(self) -> None:
        self.tasks.resume(self.run_tool)
        await self.keeper.adopt()

    async def close(self) -> None:
        await self.tasks.close()
        await self.keeper.close()
