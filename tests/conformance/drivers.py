"""The SDKs under the conformance suite, and a driver process as the scenarios see it.

``SDKS`` is the one list of SDKs (name -> argv of its driver, run from the repository root); each
speaks the driver protocol of docs/sdk-behaviour.md. A driver that is not built fails its cases,
unless MWP_SKIP_NODE=1 (outside CI) skips them, as the Node.js tests do (tests/test_node_agent.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.client_processes import require_node

ROOT = Path(__file__).resolve().parents[2]
TS_DRIVER = "sdks/typescript/dist/conformance-driver.js"
SDKS: dict[str, list[str]] = {
    "python": [sys.executable, "-m", "tests.conformance.python_driver"],
    "typescript": ["node", TS_DRIVER],
}
READY_S = 30.0  # a driver's start: its HELLO through the proxy, a new session
ANSWER_S = 30.0  # one request's answer (a command's RESULT may wait for a reconnect)


def require(sdk: str) -> list[str]:
    """The argv of ``sdk``'s driver; fails (or, with MWP_SKIP_NODE=1 outside CI, skips) if it is missing."""
    argv = SDKS[sdk]
    if argv[0] == "node":
        return [require_node(ROOT / argv[1], "build the TypeScript SDK (`make sdk-ts`)"), *argv[1:]]
    return argv


@dataclass
class Driver:
    """A running driver: requests in, answers and notifications out (each line one JSON object)."""

    sdk: str
    process: asyncio.subprocess.Process
    notes: list[dict[str, Any]] = field(default_factory=list)  # every notification, in order
    answers: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    ids: int = 0
    reader: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            message = json.loads(line)
            if "id" in message:
                answer = self.answers.pop(message["id"], None)
                if answer is not None and not answer.done():
                    answer.set_result(message)
            else:
                self.notes.append(message)
            self.changed.set()

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Sends one request and returns its answer (bounded by ANSWER_S)."""
        assert self.process.stdin is not None
        self.ids += 1
        number = self.ids
        answer = self.answers[number] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(ANSWER_S):  # a driver that stops reading must not hang the test
                self.process.stdin.write((json.dumps({"id": number, "op": op, **fields}) + "\n").encode())
                await self.process.stdin.drain()
                return await answer
        finally:
            self.answers.pop(number, None)  # answered, timed out, or cancelled: its late answer is dropped

    async def ok(self, op: str, **fields: Any) -> dict[str, Any]:
        answer = await self.request(op, **fields)
        assert answer["ok"] is True, f"{self.sdk} driver refused {op}: {answer}"
        return answer

    async def until(self, holds: Callable[[list[dict[str, Any]]], bool], seconds: float = 30.0) -> None:
        """Waits until ``holds(notes)`` (checked at every new line); fails with the notes otherwise."""
        try:
            async with asyncio.timeout(seconds):
                while not holds(self.notes):
                    if self.reader is not None and self.reader.done():
                        raise AssertionError(f"the {self.sdk} driver exited ({self.process.returncode})")
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"{self.sdk} driver: not within {seconds} s; notes: {self.notes[-20:]}"
            ) from None

    def events(self, group: str) -> list[tuple[int, str]]:
        """(sequence, event id) of every event the handler received in ``group``, in order."""
        return [
            (n["sequence"], n["event_id"]) for n in self.notes if n["type"] == "event" and n["group"] == group
        ]

    def kill(self) -> None:
        """SIGKILL: no final ACK, no cursor write, nothing graceful."""
        self.process.send_signal(signal.SIGKILL)


def tail(path: Path) -> str:
    return path.read_text()[-3000:]


@contextlib.asynccontextmanager
async def running(sdk: str, env: dict[str, str], stderr: Path) -> AsyncIterator[Driver]:
    """A driver of ``sdk`` started with ``env`` (MWP_TARGET, ...), ready; closed or killed on the way out."""
    argv = require(sdk)
    with stderr.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=ROOT,
            env={**os.environ, **env},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    driver = Driver(sdk, process)
    driver.reader = asyncio.create_task(driver._read())
    try:
        try:
            await driver.until(lambda notes: any(n["type"] == "ready" for n in notes), READY_S)
        except AssertionError as failed:
            raise AssertionError(f"{failed}; its stderr: {tail(stderr)}") from None
        ready = next(n for n in driver.notes if n["type"] == "ready")
        assert ready["sdk"] == sdk, ready
        yield driver
        if process.returncode is None:
            await driver.ok("close")
            assert await asyncio.wait_for(process.wait(), 15) == 0, tail(stderr)
    finally:
        if process.returncode is None:  # a failed scenario: no stray process, no open pipes
            process.kill()
        await process.wait()
        await asyncio.wait_for(driver.reader, 5)
