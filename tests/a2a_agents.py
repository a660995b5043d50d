"""A real A2A v1.0 agent for the bridge tests, built only with a2a-sdk's own server: an
AgentExecutor behind its DefaultRequestHandler, served over JSON-RPC (Starlette + uvicorn) and gRPC
on free ports of this process, with its Agent Card at /.well-known/agent-card.json.

What it does is chosen by the first word of the goal it is sent:
  ``complete``  works, hands over a text artifact and a binary one, completes;
  ``fail``      fails with a reason;  ``reject``  rejects the task;
  ``ask``       asks a question (input-required); given an answer, completes with it as its artifact;
  ``ask2``      asks, and once answered asks a second question;
  ``auth``      needs authentication (auth-required);
  ``reply``     answers with a message, no task;
  ``gate``      works until the test opens ``agent.gate`` (or the task is canceled), then completes;
  ``late``      creates its task only once the test opens ``agent.late``, then works like ``gate``.
Every task it creates, message it receives and cancel it is asked is recorded, for the tests' "the
agent saw exactly one task per WorkItem"."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass, field
from typing import Any

import grpc
import uvicorn
from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler, GrpcHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types import a2a_pb2 as a2a
from a2a.types import a2a_pb2_grpc
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from sse_starlette.sse import AppStatus, _get_shutdown_state
from starlette.applications import Starlette

from missionweave_bridges.http_bearer import BearerGate

BINARY = bytes(range(256)) * 8  # the `complete` behaviour's binary artifact


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Seen:
    tasks: list[a2a.Message] = field(default_factory=list)  # the message that created each task
    task_ids: list[str] = field(default_factory=list)
    messages: list[a2a.Message] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)


class ScriptedExecutor(AgentExecutor):
    def __init__(self, seen: Seen, gate: asyncio.Event, late: asyncio.Event) -> None:
        self.seen = seen
        self.gate = gate
        self.late = late
        self.turns: dict[str, int] = {}  # executions per task

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        received = a2a.Message()
        received.CopyFrom(context.message)  # the SDK keeps using its own
        self.seen.messages.append(received)
        task = context.current_task
        if task is None and _verb(context.message) == "reply":
            await event_queue.enqueue_event(
                new_text_message("done in one reply", context_id=context.context_id)
            )
            return
        if task is None and _verb(context.message) == "late":
            await self.late.wait()
        if task is None:
            task = new_task_from_user_message(context.message)
            self.seen.tasks.append(context.message)
            self.seen.task_ids.append(task.id)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        goal = _goal(task)
        verb = goal.split()[0] if goal.split() else ""
        await updater.start_work(
            new_text_message(f"working on: {goal}", context_id=task.context_id, task_id=task.id)
        )
        if verb == "complete":
            await updater.add_artifact(
                [a2a.Part(text=f"report for: {goal}", media_type="text/plain")], name="report"
            )
            await updater.add_artifact(
                [a2a.Part(raw=BINARY, media_type="application/octet-stream", filename="blob.bin")],
                name="blob",
            )
            await updater.complete(
                new_text_message("all criteria met", context_id=task.context_id, task_id=task.id)
            )
        elif verb == "fail":
            await updater.failed(
                new_text_message("the ledger is corrupt", context_id=task.context_id, task_id=task.id)
            )
        elif verb == "reject":
            await updater.reject(
                new_text_message("not my kind of work", context_id=task.context_id, task_id=task.id)
            )
        elif verb == "ask":
            if context.current_task is None:
                question = new_text_message("Which currency?", context_id=task.context_id, task_id=task.id)
                await updater.requires_input(question)
                return
            answer = context.get_user_input()
            await updater.add_artifact(
                [a2a.Part(text=f"converted to {answer}", media_type="text/plain")], name="answer"
            )
            await updater.complete()
        elif verb == "ask2":
            self.turns[task.id] = turn = self.turns.get(task.id, 0) + 1
            if turn < 3:
                text = "Which currency?" if turn == 1 else "Which year?"
                await updater.requires_input(
                    new_text_message(text, context_id=task.context_id, task_id=task.id)
                )
                return
            await updater.complete()
        elif verb == "auth":
            sign_in = new_text_message(
                "Sign in at https://ledger.example/auth", context_id=task.context_id, task_id=task.id
            )
            await updater.requires_auth(sign_in)
        elif verb in ("gate", "late"):
            await self.gate.wait()  # a cancel cancels this wait (the SDK cancels execute())
            await updater.add_artifact(
                [a2a.Part(text="through the gate", media_type="text/plain")], name="gate"
            )
            await updater.complete()
        else:
            await updater.failed(
                new_text_message(f"unknown behaviour {verb!r}", context_id=task.context_id, task_id=task.id)
            )

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        self.seen.cancels.append(context.task_id)
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def _goal(task: a2a.Task) -> str:
    """The goal line of the bridge's work message: the task's first message, its data part."""
    return _goal_of(task.history[0]) if task.history else ""


def _verb(message: a2a.Message) -> str:
    words = _goal_of(message).split()
    return words[0] if words else ""


def _goal_of(message: a2a.Message) -> str:
    for part in message.parts:
        if part.WhichOneof("content") == "data":
            return str(part.data.struct_value.fields["goal"].string_value)
    return ""


@dataclass
class RunningAgent:
    url: str  # the base URL: its card is at url + /.well-known/agent-card.json
    grpc_address: str
    seen: Seen
    gate: asyncio.Event
    late: asyncio.Event
    card: a2a.AgentCard


def agent_card(
    http_url: str, grpc_address: str, bindings: tuple[str, ...], streaming: bool = True, bearer: bool = False
) -> a2a.AgentCard:
    interfaces = {
        "JSONRPC": a2a.AgentInterface(
            url=http_url + "/a2a", protocol_binding="JSONRPC", protocol_version="1.0"
        ),
        "GRPC": a2a.AgentInterface(url=grpc_address, protocol_binding="GRPC", protocol_version="1.0"),
    }
    card = a2a.AgentCard(
        name="ledger-agent",
        description="Reconciles ledgers (a scripted A2A agent for the bridge tests).",
        version="1.2.0",
        supported_interfaces=[interfaces[b] for b in bindings],
        capabilities=a2a.AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain", "application/json", "application/octet-stream"],
        default_output_modes=["text/plain", "application/octet-stream"],
        skills=[
            a2a.AgentSkill(
                id="reconcile", name="Reconcile", description="reconcile a ledger", tags=["finance"]
            ),
            a2a.AgentSkill(id="convert", name="Convert", description="convert currencies", tags=["finance"]),
        ],
    )
    if bearer:  # the card says so, as an agent requiring a token does (A2A's security schemes)
        card.security_schemes["agent-token"].http_auth_security_scheme.CopyFrom(
            a2a.HTTPAuthSecurityScheme(scheme="Bearer")
        )
        card.security_requirements.add().schemes["agent-token"].SetInParent()
    return card


@asynccontextmanager
async def running_agent(
    bindings: tuple[str, ...] = ("JSONRPC", "GRPC"), streaming: bool = True, token: str = ""
) -> AsyncIterator[RunningAgent]:
    """The agent served on free ports until the block exits; with ``token``, its JSON-RPC calls need
    ``Authorization: Bearer <token>`` (401 otherwise) and its card declares that scheme."""
    http_port, grpc_port = free_port(), free_port()
    url = f"http://127.0.0.1:{http_port}"
    grpc_address = f"127.0.0.1:{grpc_port}"
    card = agent_card(url, grpc_address, bindings, streaming, bearer=bool(token))
    seen, gate, late = Seen(), asyncio.Event(), asyncio.Event()
    handler = DefaultRequestHandler(
        agent_executor=ScriptedExecutor(seen, gate, late), task_store=InMemoryTaskStore(), agent_card=card
    )
    app: Any = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/a2a")])
    if token:
        app = BearerGate(
            app,
            lambda given: given == f"Bearer {token}",
            realm="ledger-agent",
            error={"error": "unauthorized"},
            public_paths=(AGENT_CARD_WELL_KNOWN_PATH,),
        )
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=http_port, log_level="warning", lifespan="off")
    )
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # the test's signals stay its own
    serving = asyncio.create_task(server.serve())
    rpc = grpc.aio.server()
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), rpc)
    rpc.add_insecure_port(grpc_address)
    await rpc.start()
    try:
        async with asyncio.timeout(20):
            while not server.started:  # noqa: ASYNC110 (uvicorn sets a flag, not an event)
                await asyncio.sleep(0.02)
        yield RunningAgent(url, grpc_address, seen, gate, late, card)
    finally:
        gate.set()  # a task still waiting ends
        late.set()
        server.should_exit = True
        await rpc.stop(0.5)
        async with asyncio.timeout(10):
            await serving
            await _stop_sse_watcher()


async def _stop_sse_watcher() -> None:
    """sse-starlette starts one shutdown watcher per event loop (the JSON-RPC streams use it) and
    keeps it for the loop's life; the test's loop must end with no task of ours left."""
    AppStatus.should_exit = True
    try:
        while _get_shutdown_state().watcher_started:  # noqa: ASYNC110 (it polls a flag every 0.5 s)
            await asyncio.sleep(0.05)
    finally:
        AppStatus.should_exit = False  # process-global: the next agent's streams must not stop
