"""`mwp serve` as a real process in its own session, for the tests that start one and read its
stderr: its environment, start, lines, stop, and whether anything of it is left running."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import mesh_process_env

ROOT = Path(__file__).resolve().parent.parent


def serve_env(**extra: str) -> dict[str, str]:
    return {
        **mesh_process_env(),
        "MWP_VERIFY_WORKERS": "0",
        "PYTHONPATH": str(ROOT),
        **extra,
    }


async def serve(
    *args: str, env: dict[str, str], module: str = "missionweave.cli"
) -> asyncio.subprocess.Process:
    """`mwp serve *args`; ``module`` another runner of the CLI (tests/port_race.py)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        "serve",
        *args,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )


async def read_until(process: asyncio.subprocess.Process, *wanted: Callable[[str], bool]) -> list[str]:
    """stderr's lines until each of ``wanted`` has matched one (in any order)."""
    assert process.stderr is not None
    lines: list[str] = []
    missing = list(wanted)
    async with asyncio.timeout(60):
        while missing:
            line = (await process.stderr.readline()).decode()
            assert line, f"mwp serve ended: {''.join(lines)}"
            lines.append(line)
            missing = [w for w in missing if not w(line)]
    return lines


async def stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        assert process.stderr is not None
        async with asyncio.timeout(60):
            while await process.stderr.read(65536):  # drain, so it never blocks on the pipe
                pass
            # 0, or ended by SIGTERM itself when it came before serve_forever set its handlers (the
            # lines these tests wait for are written during start()).
            assert await process.wait() in (0, -signal.SIGTERM)


def group_running(pid: int) -> list[int]:
    """The processes of the session ``pid`` led that still run (zombies left to init do not)."""
    return _running(pid, field=2)


def children_running(pid: int) -> list[int]:
    """The processes ``pid`` started that still run."""
    return _running(pid, field=1)


def _running(pid: int, *, field: int) -> list[int]:
    running = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
            if int(fields[field]) == pid and fields[0] != "Z":
                running.append(int(stat.parent.name))
    return running


def wait_group_gone(pid: int, limit_s: float = 10.0) -> None:
    """Its helpers (the stderr relay, the SQLite writer) end when their pipes close: soon after it."""
    deadline = time.monotonic() + limit_s
    while group_running(pid):
        assert time.monotonic() < deadline, f"still running: {group_running(pid)}"
        time.sleep(0.05)


def refuses(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def logged(message: str) -> Callable[[str], bool]:
    def match(line: str) -> bool:
        with contextlib.suppress(ValueError):
            return bool(json.loads(line).get("msg") == message)
        return False

    return match
