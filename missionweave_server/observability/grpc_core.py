"""gRPC's C-core output in a server's log: it writes to file descriptor 2 on its own, bypassing
Python, so descriptor 2 becomes a pipe to a relay process (stderr_relay.py) that rewrites each line."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path

from missionweave.kernel import logs

# The relay of route_grpc_core and the descriptor of the stderr it writes to, once started.
_relay: subprocess.Popen[bytes] | None = None
_original_stderr = -1


def route_grpc_core(log_format: str = "json") -> None:
    """Server processes: gRPC's C core writes its lines (absl format) to file descriptor 2 itself,
    bypassing Python. From now on descriptor 2 is a pipe to a small relay process that writes each
    line to the real stderr as a record (logger ``grpc.core``) in ``log_format``, JSON or text (JSON
    lines, such as the child processes' own records, pass unchanged; in text, every other line).
    Python's own output (this log, ``print`` to stderr, tracebacks) goes straight to the real stderr through a duplicate of it. The relay is a process,
    not a thread, so a crash's last lines still come out: it drains the pipe until every writer has
    gone. Call before gRPC starts (its first server or channel) and before ``configure``."""
    global _relay, _original_stderr
    if _relay is not None:
        return
    sys.stderr.flush()
    _original_stderr = os.dup(2)
    read_end, write_end = os.pipe()
    text = [] if log_format == "json" else ["--text", str(Path(logs.__file__))]
    _relay = subprocess.Popen(
        [sys.executable, "-I", "-S", str(Path(__file__).with_name("stderr_relay.py")), *text],
        stdin=read_end,
        stdout=_original_stderr,
        stderr=_original_stderr,
        close_fds=True,
    )
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    sys.stderr = open(os.dup(_original_stderr), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    atexit.register(end_grpc_core_route)


def original_stderr() -> int:
    """The descriptor of the real stderr (2 unless ``route_grpc_core`` took descriptor 2 over): for
    child processes that route their own output."""
    return _original_stderr if _relay is not None else 2


def end_grpc_core_route(timeout_s: float = 2.0) -> None:
    """Give descriptor 2 back to the real stderr and wait (bounded) until the relay has written all
    it was sent: so that a last line printed after it is the last line of the output."""
    global _relay
    relay, _relay = _relay, None
    if relay is None:
        return
    os.dup2(_original_stderr, 2)  # the pipe's last writer here closes: the relay reads to its end
    try:
        relay.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass  # a child process still holds the pipe: the relay ends with it
