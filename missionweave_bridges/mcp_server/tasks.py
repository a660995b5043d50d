"""Long operations as MCP tasks (the ``io.modelcontextprotocol/tasks`` extension, 2026-07-28), kept
in a durable store so a client that lost its task ids finds them again.

The extension (SEP-2663) lets a server answer ``tools/call`` with a task handle
(``resultType: "task"``) that the client polls with ``tasks/get``; it defines no way to list tasks.
This server adds ``tasks/list`` (the 2025-11-25 shape: ``{tasks, nextCursor}``) and the
``list_tasks`` tool, both read from ``<state dir>/tasks.json``: every task of this identity, the
finished ones with their results (the last ``KEEP_FINISHED``), kept across reconnects and restarts.
A task still working when the server stopped is run again when it starts: every task tool is a read
of the mesh or a content-addressed upload, so running it twice changes nothing.

Task creation is the server's choice, per request: only the tools in ``TASK_TOOLS`` (a wait, a file
upload), and only for a
client that declared the extension on that request; any other client gets the tool's ordinary
result (it waits, within the tool's own deadline). ``tasks/cancel`` stops the work at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    RequestParams,
    Result,
    TextContent,
)
from pydantic import ConfigDict

from missionweave.kernel import ids
from missionweave.sdk.files import read_json, write_json_atomic
from missionweave_bridges.mcp_server.refusals import Refused

log = logging.getLogger(__name__)

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# The tools that run as tasks, and when: waits always, an upload when it reads a file (inline
# content is small by construction: it came in the request).
TASK_TOOLS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "wait_for_offer": lambda arguments: True,
    "follow_work_item": lambda arguments: True,
    "store_output": lambda arguments: bool(arguments.get("path")),
}
KEEP_FINISHED = 200
POLL_INTERVAL_MS = 1000
TERMINAL = frozenset({"completed", "failed", "cancelled"})

RunTool = Callable[[str, dict[str, Any]], Awaitable[CallToolResult]]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TaskHandle(Result):
    """``CreateTaskResult``: what a task-augmented ``tools/call`` answers (a client's claim model)."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class TaskIdParams(RequestParams):
    task_id: str


class UpdateTaskParams(RequestParams):
    task_id: str
    input_responses: dict[str, Any] = {}


class ListTasksParams(RequestParams):
    cursor: str | None = None


class TaskStore:
    """Every task of this identity, in ``<state dir>/tasks.json`` (written atomically on each change)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tasks: dict[str, dict[str, Any]] = dict((read_json(path) or {}).get("tasks", {}))
        self.running: dict[str, asyncio.Task[None]] = {}

    def save(self) -> None:
        finished = sorted(
            (t for t in self.tasks.values() if t["status"] in TERMINAL), key=lambda t: str(t["lastUpdatedAt"])
        )
        for old in finished[:-KEEP_FINISHED]:
            del self.tasks[old["taskId"]]
        write_json_atomic(self.path, {"tasks": self.tasks})

    def create(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        now = _now()
        task: dict[str, Any] = {
            "taskId": ids.new_id("task"),
            "status": "working",
            "statusMessage": f"{tool} is running",
            "createdAt": now,
            "lastUpdatedAt": now,
            "ttlMs": None,  # kept until KEEP_FINISHED newer ones have finished, not for a TTL
            "pollIntervalMs": POLL_INTERVAL_MS,
            "tool": tool,
            "arguments": arguments,
        }
        self.tasks[task["taskId"]] = task
        self.save()
        return task

    def finish(self, task_id: str, status: str, message: str, **payload: Any) -> None:
        task = self.tasks[task_id]
        task.update(status=status, statusMessage=message, lastUpdatedAt=_now(), **payload)
        self.save()

    def get(self, task_id: str) -> dict[str, Any]:
        task = self.tasks.get(task_id)
        if task is None:
            raise MCPError(code=INVALID_PARAMS, message=f"Failed to retrieve task: no task {task_id}")
        return task

    @staticmethod
    def public(task: dict[str, Any]) -> dict[str, Any]:
        """The wire ``DetailedTask`` (plus which tool and arguments it runs: a model needs both)."""
        return dict(task)

    def listing(self) -> list[dict[str, Any]]:
        return [self.public(t) for t in sorted(self.tasks.values(), key=lambda t: str(t["createdAt"]))]

    def start(self, task: dict[str, Any], run: RunTool) -> None:
        task_id = task["taskId"]

        async def work() -> None:
            try:
                result = await run(task["tool"], dict(task["arguments"]))
            except asyncio.CancelledError:
                # tasks/cancel marked it cancelled first; a shutdown leaves it working, to run again
                # at the next start.
                if self.tasks[task_id]["status"] == "working":
                    raise
                return
            except Exception as exc:  # the task fails with a JSON-RPC error, as the extension says
                log.exception("task %s (%s) failed", task_id, task["tool"])
                self.finish(task_id, "failed", str(exc), error={"code": -32603, "message": str(exc)})
                return
            summary = next((c.text for c in result.content if isinstance(c, TextContent)), "done")
            self.finish(
                task_id,
                "completed",
                summary.splitlines()[0] if summary else "done",
                result=result.model_dump(mode="json", by_alias=True, exclude_none=True),
            )

        self.running[task_id] = asyncio.create_task(work(), name=f"mcp task {task_id}")

    def cancel(self, task_id: str) -> None:
        task = self.get(task_id)
        if task["status"] in TERMINAL:
            return
        self.finish(task_id, "cancelled", "cancelled by the client")
        running = self.running.pop(task_id, None)
        if running is not None:
            running.cancel()

    def resume(self, run: RunTool) -> None:
        """Run again every task a stopped server left working (each task tool is safe to repeat)."""
        for task in list(self.tasks.values()):
            if task["status"] == "working" and task["taskId"] not in self.running:
                self.start(task, run)

    async def close(self) -> None:
        tasks = list(self.running.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the client declared the tasks extension on this request."""
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS_EXTENSION in capabilities.extensions)


class TasksExtension(Extension):
    """The server side of the tasks extension, with ``tasks/list`` added."""

    identifier = TASKS_EXTENSION

    def __init__(self, store: TaskStore, run: RunTool, check: Callable[[str, dict[str, Any]], None]) -> None:
        self.store = store
        self.run = run
        # Refuses what would only fail inside the task (a path not allowed): answered at once, no task made.
        self.check = check

    def methods(self) -> Sequence[MethodBinding]:
        async def get(ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
            return self.store.public(self.store.get(params.task_id))

        async def update(ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> HandlerResult:
            self.store.get(params.task_id)  # no task of this server asks for input: nothing to apply
            return {}

        async def cancel(ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
            self.store.cancel(params.task_id)
            return {}

        async def listing(ctx: ServerRequestContext[Any, Any], params: ListTasksParams) -> HandlerResult:
            return {"tasks": self.store.listing()}

        return [
            MethodBinding("tasks/get", TaskIdParams, get),
            MethodBinding("tasks/update", UpdateTaskParams, update),
            MethodBinding("tasks/cancel", TaskIdParams, cancel),
            MethodBinding("tasks/list", ListTasksParams, listing),
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        arguments = dict(params.arguments or {})
        if params.name not in TASK_TOOLS or not TASK_TOOLS[params.name](arguments) or not declared(ctx):
            return await call_next(ctx)
        try:
            self.check(params.name, arguments)
        except Refused as refused:
            return refused.result()
        # Durable before the handle is returned: a tasks/get (or tasks/list) finds it from now on.
        task = self.store.create(params.name, arguments)
        self.store.start(task, self.run)
        return {"resultType": "task", **self.store.public(task)}
