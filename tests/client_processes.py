"""What the tests of clients in other languages share (the Node.js agent, the TypeScript SDK, the
conformance drivers, the Go agent): the toolchain they need, and a client process run to its end
without ever outliving its test."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def require_node(built: Path, how: str) -> str:
    """`node`, with ``built`` (a build output) present. A missing toolchain or build fails the test,
    CI must run it, unless MWP_SKIP_NODE=1 outside CI skips it (as `make test` then skips the builds)."""
    if os.environ.get("MWP_SKIP_NODE") == "1" and os.environ.get("CI") != "true":
        pytest.skip("MWP_SKIP_NODE=1: the Node.js tests are skipped")
    executable = shutil.which("node")
    missing = ""
    if executable is None:
        missing = "`node` (Node.js 20+) is not on PATH"
    elif not built.exists():
        missing = f"{built.relative_to(ROOT)} is missing: {how}"
    if executable is None or missing:
        pytest.fail(f"{missing} (or set MWP_SKIP_NODE=1 to skip the Node.js tests)")
    return executable


async def run_to_end(argv: list[str], seconds: float) -> tuple[int, str, str]:
    """Runs ``argv`` to its end within ``seconds``: exit code, stdout, stderr. A process
    that times out, or whose test is cancelled, is killed: no stray process, no open pipes."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), seconds)
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()
