"""The Python SDK's conformance driver (docs/sdk-behaviour.md "The driver protocol"): one agent of the
public SDK (``Agent``, ``WorkerRuntime``) steered by JSON lines on stdin, reporting on stdout.

Run as ``python -m tests.conformance.python_driver`` with MWP_TARGET, MWP_AGENT_ID, MWP_KEY_FILE,
MWP_STATE_DIR and optionally MWP_AUDIENCE. Logs go to stderr; stdout carries only protocol lines.

``MWP_CONFORMANCE_BREAK`` (never set by the suite) breaks one promise on purpose, to show that the
scenario naming it fails: ``verification`` (events are not checked against the Authority key).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

from google.protobuf import json_format

from missionweave.sdk.agent import Agent, Backoff, CommandRejected, CursorStore, NotVerified, Subscription
from missionweave.sdk.slot import Paused, Slot, WorkResult
from missionweave.sdk.worker import WorkerRuntime
from missionweave.v1 import command_pb2, event_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import work_pb2 as wp

log = logging.getLogger("conformance.python_driver")
NEVER = 2**62  # a sequence no subscription reaches: reached() returns only by failing
# Short waits: a scenario's faults must heal within its bound, and the SDK's defaults (a 10 s gap
# timeout, backoff up to 30 s) are tuned for production, not for a test run.
GAP_TIMEOUT_S = 0.5
BACKOFF = Backoff(initial=0.05, cap=0.5)


def emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def failure_name(error: BaseException) -> str:
    """The protocol's name of why a subscription stopped: NOT_VERIFIED, or the gateway's code."""
    if isinstance(error, NotVerified):
        return "NOT_VERIFIED"
    text = str(error)
    codes = [name.removeprefix("GATEWAY_ERROR_CODE_") for name in pb.GatewayErrorCode.keys()]
    return next((code for code in codes if code in text), type(error).__name__)


def evidence_for(slot: Slot) -> list[wp.Evidence]:
    """One passing Evidence per acceptance criterion, by each criterion's first required method."""
    return [
        wp.Evidence(
            evidence_id=f"ev-{criterion.criterion_id}",
            criterion_id=criterion.criterion_id,
            method=(criterion.required_evidence_methods or [wp.EVIDENCE_METHOD_TEST])[0],
            result=wp.EVIDENCE_RESULT_PASS,
            summary="checked by the conformance driver",
        )
        for criterion in slot.contract.acceptance_criteria
    ]


class Driver:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.subscriptions: dict[str, Subscription] = {}
        self.watchers: set[asyncio.Task[None]] = set()
        self.runtime: WorkerRuntime | None = None
        self.outputs: dict[tuple[str, str], list[str]] = {}  # artifacts stored per (Group, WorkItem)

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "subscribe":
            await self.subscribe(request["group"], int(request.get("credits", 256)))
            return {}
        if op == "cursor":
            group = request["group"]
            subscription = self.subscriptions.get(group)
            if subscription is not None:
                return {"cursor": subscription.cursor}
            return {"cursor": CursorStore(self.agent.directory, self.agent.identity_id).load(group)}
        if op == "execute":
            return await self.execute(request)
        if op == "work":
            await self.work(request["groups"], request["mode"], request.get("content", ""))
            return {}
        raise ValueError(f"unknown op {op!r}")

    async def subscribe(self, group: str, credits: int) -> None:
        async def on_event(event: event_pb2.Event) -> None:
            emit(
                {
                    "type": "event",
                    "group": event.group_id,
                    "sequence": event.sequence,
                    "event_id": event.event_id,
                    "event_type": event.type,
                }
            )

        subscription = await self.agent.subscribe(group, on_event, credits=credits, gap_timeout=GAP_TIMEOUT_S)
        self.subscriptions[group] = subscription

        async def watch() -> None:
            try:
                await subscription.reached(NEVER)
            except Exception as error:  # the subscription stopped for good
                emit({"type": "subscription_failed", "group": group, "error": failure_name(error)})

        self._spawn(watch())

    async def execute(self, request: dict[str, Any]) -> dict[str, Any]:
        kind = request["kind"]
        body = type(getattr(command_pb2.Command(), kind))()  # the message type of that oneof field
        json_format.ParseDict(request.get("body", {}), body)
        try:
            result = await self.agent.execute(
                request["group"], kind, body, command_id=request.get("command_id") or None
            )
        except CommandRejected as refused:
            return {"ok": False, "reason": refused.reason_name, "error": str(refused)}
        return {"sequence": result.group_revision, "replayed": result.replayed}

    async def work(self, groups: list[str], mode: str, content: str) -> None:
        if mode not in ("submit", "pause_on_preemption"):
            raise ValueError(f"unknown mode {mode!r}")

        async def handler(slot: Slot) -> WorkResult | Paused:
            emit(
                {
                    "type": "work_started",
                    "work_item_id": slot.work_item_id,
                    "lease_id": slot.lease_id,
                    "ownership_epoch": slot.ownership_epoch,
                    "resume_from_checkpoint_id": slot.resume_from_checkpoint_id,
                }
            )
            if mode == "pause_on_preemption" and not slot.resume_from_checkpoint_id:
                await slot.preemption_requested.wait()  # works until asked to stop at a safe point
                emit({"type": "work_finished", "work_item_id": slot.work_item_id, "outcome": "paused"})
                checkpoint = wp.Checkpoint(
                    checkpoint_id=f"ck-{slot.lease_id}", completed_operation_ids=["op-1"]
                )
                return Paused(checkpoint)
            log.info("%s: storing the output", slot.work_item_id)
            ref = await slot.put(content.encode(), media_type="text/plain")
            log.info("%s: stored %s", slot.work_item_id, ref.digest.hex)
            self.outputs[(slot.group_id, slot.work_item_id)] = [ref.digest.hex]
            return WorkResult(evidence=evidence_for(slot), summary="done by the conformance driver")

        self.runtime = runtime = WorkerRuntime(self.agent, handler)
        await runtime.serve(groups)

        async def report_submissions() -> None:
            # "submitted" once the runtime's submission was accepted, not when the handler returned.
            reported = 0
            while True:
                done = await runtime.submitted(reported + 1)
                for group, work_item_id in done[reported:]:
                    artifacts = self.outputs.get((group, work_item_id), [])
                    emit(
                        {
                            "type": "work_finished",
                            "work_item_id": work_item_id,
                            "outcome": "submitted",
                            "artifacts": artifacts,
                        }
                    )
                reported = len(done)

        self._spawn(report_submissions())

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self.watchers.add(task)
        task.add_done_callback(self.watchers.discard)

    async def close(self) -> None:
        for task in list(self.watchers):
            task.cancel()
        if self.runtime is not None:
            await self.runtime.close()
        await self.agent.close()  # final ACKs, half-close


def break_on_purpose() -> None:
    """What MWP_CONFORMANCE_BREAK asks for: a broken SDK, to show the scenarios catch it."""
    broken = os.environ.get("MWP_CONFORMANCE_BREAK", "")
    if broken == "verification":
        from missionweave.sdk import event_verification

        def unchecked(self: Any, envelope: Any, payload_type: str) -> bytes:
            return bytes(envelope.payload)

        event_verification.AuthorityVerifier._payload = unchecked  # type: ignore[method-assign]
    elif broken:
        raise SystemExit(f"unknown MWP_CONFORMANCE_BREAK {broken!r}")


async def main() -> int:
    break_on_purpose()
    target = os.environ["MWP_TARGET"]
    agent = await Agent.connect(
        target,
        os.environ["MWP_AGENT_ID"],
        os.environ["MWP_KEY_FILE"],
        cursor_dir=os.environ["MWP_STATE_DIR"],
        audience=os.environ.get("MWP_AUDIENCE") or None,
        backoff=BACKOFF,
        grace=2.0,
    )
    driver = Driver(agent)
    emit({"type": "ready", "sdk": "python"})
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    requests: set[asyncio.Task[None]] = set()

    async def answer(request: dict[str, Any]) -> None:
        try:
            reply = {"ok": True, **await driver.handle(request)}
        except Exception as error:
            log.exception("request %s failed", request.get("id"))
            reply = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        emit({"id": request.get("id"), **reply})

    while line := await reader.readline():
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("op") == "close":
            break
        task = asyncio.create_task(answer(request))  # one slow command does not hold up the others
        requests.add(task)
        task.add_done_callback(requests.discard)
    else:
        request = {}  # stdin closed: close as if asked
    for task in list(requests):
        task.cancel()
    await driver.close()
    if request:
        emit({"id": request.get("id"), "ok": True})
    return 0


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.exit(asyncio.run(main()))
