"""A tiny A2A v1.0 agent, built only with a2a-sdk, for `mwp bridge a2a` (docs/bridge-a2a-worker.md).

It summarises what it is sent: the goal, and for each text input its first line and its size. With
no input at all it asks what to summarise (input-required) and summarises the answer. It knows
nothing of MissionWeave: the bridge turns each WorkItem into one of its tasks.

    python examples/a2a/summarizer_agent.py --port 9999 --grpc-port 9998

serves JSON-RPC at http://127.0.0.1:9999/a2a, gRPC at 127.0.0.1:9998, and its Agent Card at
http://127.0.0.1:9999/.well-known/agent-card.json, until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

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
from starlette.applications import Starlette


class Summarizer(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        task = context.current_task
        first_message = task is None
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work(new_text_message("reading", context_id=task.context_id, task_id=task.id))
        texts = [p for p in context.message.parts if p.WhichOneof("content") == "text"]
        inputs = [p for p in texts if p.filename]  # the bridge names each input Artifact's part
        if first_message and not inputs:
            question = "There is nothing to summarise: paste the text, please."
            await updater.requires_input(
                new_text_message(question, context_id=task.context_id, task_id=task.id)
            )
            return
        lines = [f"# Summary\n\nGoal: {goal(task if not first_message else None, context.message)}\n"]
        for part in inputs or texts:
            body = part.text.strip()
            first = body.splitlines()[0] if body else ""
            lines.append(f"- {part.filename or 'answer'}: {len(body.split())} words; starts {first[:80]!r}")
        summary = "\n".join(lines) + "\n"
        await updater.add_artifact(
            [a2a.Part(text=summary, media_type="text/markdown", filename="summary.md")], name="summary.md"
        )
        await updater.complete(new_text_message("summarised", context_id=task.context_id, task_id=task.id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def goal(task: a2a.Task | None, message: a2a.Message) -> str:
    """The goal: the bridge's work message (the task's first) says it in its data part."""
    first = task.history[0] if task is not None and task.history else message
    for part in first.parts:
        if part.WhichOneof("content") == "data" and "goal" in part.data.struct_value.fields:
            return part.data.struct_value.fields["goal"].string_value
    return "(none given)"


def card(port: int, grpc_port: int) -> a2a.AgentCard:
    return a2a.AgentCard(
        name="summarizer",
        description="Summarises the text it is sent.",
        version="1.0.0",
        supported_interfaces=[
            a2a.AgentInterface(
                url=f"http://127.0.0.1:{port}/a2a", protocol_binding="JSONRPC", protocol_version="1.0"
            ),
            a2a.AgentInterface(url=f"127.0.0.1:{grpc_port}", protocol_binding="GRPC", protocol_version="1.0"),
        ],
        capabilities=a2a.AgentCapabilities(streaming=True),
        default_input_modes=["text/plain", "text/markdown"],
        default_output_modes=["text/markdown"],
        skills=[
            a2a.AgentSkill(id="summarize", name="Summarize", description="summarise text", tags=["text"])
        ],
    )


async def main(port: int, grpc_port: int) -> None:
    agent_card = card(port, grpc_port)
    handler = DefaultRequestHandler(
        agent_executor=Summarizer(), task_store=InMemoryTaskStore(), agent_card=agent_card
    )
    app = Starlette(routes=[*create_agent_card_routes(agent_card), *create_jsonrpc_routes(handler, "/a2a")])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    rpc = grpc.aio.server()
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), rpc)
    rpc.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await rpc.start()
    try:
        await server.serve()  # until SIGINT/SIGTERM (uvicorn's own handlers)
    finally:
        await rpc.stop(1.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--grpc-port", type=int, default=9998)
    options = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the parent ignored
    asyncio.run(main(options.port, options.grpc_port))
