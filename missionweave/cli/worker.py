"""``mwp worker queue``: a Worker's own queue of one Group, as its scheduler holds it (spec 11.1).
``mwp worker run --config FILE``: a Worker runtime (missionweave.sdk.worker) serving Groups with a
handler named in a TOML file, until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import inspect
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from google.protobuf.message import Message

from missionweave.cli import serving_config
from missionweave.cli.common import (
    CliError,
    UsageError,
    add_json_flag,
    client_tls,
    columns,
    emit,
    enum_label,
    environment,
    reading,
    reading_command,
    save_session,
    to_dict,
    wants_json,
    when,
)
from missionweave.cli.serving_config import SERVING_KEYS, Serving
from missionweave.kernel import gc_policy, logs
from missionweave.sdk.agent import Agent, AgentError, CommandBody, CommandRejected, GatewayError, SessionFile
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.sdk.files import user_state_dir
from missionweave.sdk.worker import Blocked, Failed, Handler, Outcome, Paused, Slot, WorkerRuntime
from missionweave.v1 import command_pb2
from missionweave.v1 import scheduling_service_pb2 as pb
from missionweave.v1 import scheduling_service_pb2_grpc as pb_grpc
from missionweave.v1 import work_pb2 as wp

worker_log = logging.getLogger("missionweave.cli.worker")


async def cmd_queue(args: argparse.Namespace) -> int:
    """The caller's own scheduler only: a Worker sees its queue, nobody else's (MW-11.1-03)."""
    async with reading(args) as mesh:
        queue = (
            await pb_grpc.SchedulingServiceStub(mesh.channel).GetQueue(
                pb.GetQueueRequest(group_id=args.group)
            )
        ).queue
    rows = [["#", "work item", "state", "epoch", "eligible", "class", "deadline", "checkpoint"]]
    for e in queue.entries:
        rows.append(
            [
                str(e.group_position or "-"),
                e.work_item_id,
                enum_label(wp.WorkItemState, e.state, "WORK_ITEM_STATE_").lower(),
                str(e.ownership_epoch),
                "yes" if e.eligible else f"no ({e.ineligible_reason})" if e.ineligible_reason else "no",
                enum_label(pb.PriorityClass, e.ordering.priority_class, "PRIORITY_CLASS_").lower(),
                when(e.ordering.deadline) if e.ordering.HasField("deadline") else "-",
                e.latest_checkpoint_id or "-",
            ]
        )
    lines = [
        f"{args.actor}'s queue of {queue.group_id} at sequence {queue.projected_sequence}: weight {queue.weight}, "
        f"{queue.slots_in_use} of {queue.slot_quota} slots in use",
        *(columns(rows) if queue.entries else ["(empty)"]),
    ]
    emit(args, lines, to_dict(queue))
    return 0


# ------------------------------------------------------------------ mwp worker run

CONFIG_KEYS = {
    **SERVING_KEYS,
    "handler": "MODULE:FUNCTION: a .py file relative to the config file, or a dotted module",
}


class Unreachable(CliError):
    """The gateway could not be reached (the README's exit code 3)."""

    exit_code = 3


@dataclass(frozen=True)
class WorkerConfig(Serving):
    handler: str = ""


def load_config(path: Path, args: argparse.Namespace) -> WorkerConfig:
    """The config file, with --as/--key/--group and the environment filling what it leaves out."""
    serving, data = serving_config.read(
        path, args, CONFIG_KEYS, who="the Worker", default_state=user_state_dir() / "workers"
    )
    handler = serving_config.text(data, "handler", path)
    if handler is None:
        raise UsageError(f"{path}: missing key handler (MODULE:FUNCTION)")
    return WorkerConfig(**vars(serving), handler=handler)


def load_handler(config: WorkerConfig) -> Handler:
    """``FILE.py:function`` (relative to the config file) or ``package.module:function``."""
    module_name, sep, function = config.handler.rpartition(":")
    if not sep or not module_name or not function:
        raise UsageError(f"{config.path}: handler {config.handler!r} is not MODULE:FUNCTION")
    try:
        if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
            file = config.path.resolve().parent / module_name
            if not file.is_file():
                raise UsageError(f"{config.path}: handler module {file} does not exist")
            spec = importlib.util.spec_from_file_location(f"mwp_worker_handler_{file.stem}", file)
            if spec is None or spec.loader is None:
                raise UsageError(f"{config.path}: cannot load {file} as a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except UsageError:
        raise
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise UsageError(f"{config.path}: handler module {module_name!r} not found ({err})") from None
        raise UsageError(
            f"{config.path}: importing {module_name} failed: {type(err).__name__}: {err}"
        ) from None
    except Exception as err:  # the handler's own module failed while importing: say where, not how
        raise UsageError(
            f"{config.path}: importing {module_name} failed: {type(err).__name__}: {err}"
        ) from None
    found = getattr(module, function, None)
    if found is None:
        raise UsageError(f"{config.path}: {module_name} has no {function!r}")
    call = type(found).__call__ if callable(found) and not inspect.isfunction(found) else found
    if not inspect.iscoroutinefunction(call):
        raise UsageError(
            f"{config.path}: {config.handler} is not an async function (async def {function}(slot))"
        )
    return cast(Handler, found)


class ObservedAgent(Agent):
    """The runtime's Agent, logging every command the runtime sends and how the Authority answered:
    the accepted and declined offers, starts, checkpoints and submissions, per Group and WorkItem."""

    async def execute(
        self, group_id: str, command: str | CommandBody, body: Message | None = None, **options: Any
    ) -> command_pb2.CommandResult:
        kind, message = command if isinstance(command, CommandBody) else (command, body)
        facts: dict[str, Any] = {"group": group_id, "command": kind}
        for name, label in (("work_item_id", "work_item"), ("offer_id", "offer"), ("lease_id", "lease")):
            if message is not None and name in message.DESCRIPTOR.fields_by_name and getattr(message, name):
                facts[label] = getattr(message, name)
        try:
            result = await super().execute(group_id, command, body, **options)
        except CommandRejected as refused:
            refusal = {**facts, "outcome": "refused", "reason": refused.reason_name}
            worker_log.warning("%s %s refused: %s", kind, facts.get("work_item", ""), refused, extra=refusal)
            raise
        accepted = {**facts, "outcome": "accepted", "group_revision": result.group_revision}
        worker_log.info("%s %s", kind, facts.get("work_item", ""), extra=accepted)
        return result


def observed(handler: Handler) -> Handler:
    """``handler`` with a log line when a slot starts it and one for what it hands back."""

    async def run(slot: Slot) -> Outcome:
        facts = {
            "group": slot.group_id,
            "work_item": slot.work_item_id,
            "slot": slot.slot_id,
            "lease": slot.lease_id,
        }
        resumed = (
            f" from checkpoint {slot.resume_from_checkpoint_id}" if slot.resume_from_checkpoint_id else ""
        )
        worker_log.info(
            "handling %s%s",
            slot.work_item_id,
            resumed,
            extra={**facts, "resume_from": slot.resume_from_checkpoint_id},
        )
        outcome = await handler(slot)
        if isinstance(outcome, Paused):
            checkpoint_id = outcome.checkpoint.checkpoint_id
            worker_log.info(
                "%s paused at checkpoint %s",
                slot.work_item_id,
                checkpoint_id,
                extra={**facts, "checkpoint": checkpoint_id},
            )
        elif isinstance(outcome, Blocked):
            worker_log.info("%s blocked: %s", slot.work_item_id, outcome.question, extra=facts)
        elif isinstance(outcome, Failed):
            worker_log.info(
                "%s failed: %s", slot.work_item_id, outcome.reason, extra={**facts, "reason": outcome.reason}
            )
        else:
            # What the submission hands in: the deliverables stored through the slot, then those named.
            stored = slot.artifacts.outputs if slot.artifacts is not None else []
            handed_in = {a.digest.hex for a in [*stored, *outcome.artifacts]}
            worker_log.info(
                "%s done: %d artifact(s), %d evidence",
                slot.work_item_id,
                len(handed_in),
                len(outcome.evidence),
                extra={**facts, "artifacts": len(handed_in)},
            )
        return outcome

    return run


async def _report_submissions(runtime: WorkerRuntime) -> None:
    """One line per WorkItem the runtime submitted, as ``runtime.completed`` grows."""
    while True:
        done = await runtime.submitted(len(runtime.completed) + 1)
        group_id, work_item_id = done[-1]
        worker_log.info(
            "submitted %s",
            work_item_id,
            extra={
                "group": group_id,
                "work_item": work_item_id,
                "command": "work_submit",
                "submitted": len(done),
            },
        )


def _seed_session(agent: Agent, signer: SessionSigner) -> None:
    """Hands the session saved next to the key (its key is the identity key, as every mwp command
    signs) to the agent, so the Worker and the identity's mwp commands share one session."""
    agent_file = SessionFile(agent.directory / "session.json", agent.identity_id)
    try:
        current = agent_file.load()
    except AgentError:
        current = None
    if current is None or current.session_epoch < signer.session_epoch:
        agent_file.save(signer)


async def cmd_run(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config), args)
    handler = load_handler(config)
    key = serving_config.read_identity_key(config)
    env = environment(args)
    logs.configure(env.get("MWP_LOG_LEVEL") or "info", env.get("MWP_LOG_FORMAT") or "json")
    gc_policy.for_long_running_process()  # a long-running agent host: its tail latency (D155)
    tls = client_tls(args)
    # A new session at every start, saved next to the key for the identity's other mwp commands
    # (D94, D213): it fences a killed predecessor's leases at once, so its work is placed again now
    # rather than when those leases lapse.
    async with MeshClient(config.target, tls) as mesh:
        signer = await mesh.open_session(config.identity, key)
    save_session(config.key, signer)
    agent = ObservedAgent(
        config.target,
        config.identity,
        key,
        cursor_dir=config.state_dir,
        tls=tls,
        connect_timeout=config.connect_timeout,
    )
    _seed_session(agent, signer)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        try:
            await agent.start()
        except GatewayError as err:
            raise CliError(f"the gateway refused {config.identity}: {err}") from None
        except AgentError as err:
            raise Unreachable(f"cannot reach {config.target}: {err}") from None
        runtime = WorkerRuntime(agent, observed(handler))
        watcher: asyncio.Task[None] | None = None
        try:
            await runtime.serve(list(config.groups))
            watcher = asyncio.create_task(_report_submissions(runtime))
            lines = [
                f"mwp worker run: {config.identity} serves {len(config.groups)} Group(s) "
                f"({', '.join(config.groups)}) with {config.handler} at {config.target} "
                f"(session {agent.session.session_epoch}); Ctrl-C or SIGTERM stops it",
            ]
            start = {
                "event": "started",
                "identity": config.identity,
                "target": config.target,
                "groups": list(config.groups),
                "handler": config.handler,
                "session_epoch": agent.session.session_epoch,
                "state_dir": str(config.state_dir),
            }
            _print(args, lines, start)
            await stop.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            await runtime.close()
            await agent.close()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    done = list(runtime.completed)
    _print(
        args,
        [f"mwp worker run: stopped after {len(done)} submission(s)"],
        {"event": "stopped", "submitted": [{"group_id": g, "work_item_id": w} for g, w in done]},
    )
    return 0


def _print(args: argparse.Namespace, lines: list[str], document: dict[str, Any]) -> None:
    """Like ``emit``, but one JSON document per line: a running Worker prints two (start, stop)."""
    if wants_json(args):
        print(json.dumps(document, sort_keys=True), flush=True)
    else:
        print(*lines, sep="\n", flush=True)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    worker = sub.add_parser("worker", help="a Worker's own scheduler").add_subparsers(
        dest="sub", required=True
    )
    q = reading_command(
        worker.add_parser("queue", help="your queue of one Group: order, eligibility, slots (read as --as)")
    )
    q.set_defaults(func=cmd_queue)
    r = worker.add_parser(
        "run",
        help="serve Groups with a Worker runtime and the handler a config file names, until Ctrl-C/SIGTERM",
    )
    r.add_argument(
        "--config",
        required=True,
        help="the TOML config (docs/cli.md: target, identity, key, groups, handler)",
    )
    serving_config.add_arguments(r, "the Worker's")
    add_json_flag(r, "machine output: one JSON document per line (started, stopped)")
    r.set_defaults(func=cmd_run, runs_until_stopped=True)
