"""The relay behind ``grpc_core.route_grpc_core``: a server's file descriptor 2 in, JSON log lines out.

It reads its standard input (the read end of the pipe that is the server's descriptor 2) line by
line and writes each to its standard output (the server's real stderr): a JSON object as it is
(the records of the server's child processes), an absl line of gRPC's C core
(``E1202 01:13:19.316968   26595 add_port.cc:83] message``) as a record of logger ``grpc.core`` at
its level, anything else (a crash's last words) as a record of logger ``stderr`` at level error.

With gRPC's handshake trace on (missionweave/kernel/handshake_trace.py: the core then writes at
INFO), refused TLS handshakes are read out of it (handshakes.py) and the core's lines below the
level asked for are left out, with the lines continuing them.

It ends when the pipe does, that is once every process holding it has exited, and ignores SIGINT
and SIGTERM meanwhile: a Ctrl-C reaches the whole process group, and the relay must outlive the
server to write its last lines. Standard library only, started with ``python -I -S`` by path.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import BinaryIO, TextIO

ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+(\d+) ([^\]\s]+)\] ?(.*)$")
LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "critical"}
# The core's level asked for, when the handshake trace is on (CORE_LEVEL_VAR of handshake_trace.py).
CORE_LEVEL_VAR = "MWP_GRPC_CORE_LEVEL"
FLOORS = {"DEBUG": 0, "INFO": 0, "WARNING": 1, "ERROR": 2, "NONE": 4}
# What continues a core record on the next lines: its source-location trace, indented arguments.
CONTINUATION = re.compile(r"^(=== Source Location Trace: ===|src/\S+:\d+$|\s)")


def _handshakes() -> ModuleType:
    """handshakes.py beside this file, by path: the relay runs as a script, outside the package."""
    spec = importlib.util.spec_from_file_location("mwp_handshakes", Path(__file__).with_name("handshakes.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def record(line: str, now: datetime | None = None) -> str:
    """The JSON log line for one line of output (without its newline)."""
    if line.startswith("{"):
        try:
            json.loads(line)
            return line
        except ValueError:
            pass
    ts = (now or datetime.now(UTC)).isoformat(timespec="milliseconds")
    match = ABSL_LINE.match(line)
    entry: dict[str, object]
    if match is None:
        entry = {"ts": ts, "level": "error", "logger": "stderr", "msg": line}
    else:
        level, thread, source, message = match.groups()
        entry = {
            "ts": ts,
            "level": LEVELS[level],
            "logger": "grpc.core",
            "msg": message,
            "source": source,
            "thread": int(thread),
        }
    return json.dumps(entry, ensure_ascii=False)


def relay(source: BinaryIO, sink: TextIO, core_level: str = "") -> None:
    """Every line of ``source`` as a record on ``sink``; with ``core_level`` (the handshake trace is
    on), refused handshakes as their own records and the core's lines below that level left out."""

    def write(entry: dict[str, object]) -> None:
        sink.write(json.dumps({"ts": datetime.now(UTC).isoformat(timespec="milliseconds"), **entry}) + "\n")
        sink.flush()

    floor = FLOORS.get(core_level.upper(), 2) if core_level else 0
    handshakes = _handshakes() if core_level else None
    failures = handshakes.Failures(write) if handshakes is not None else None
    dropping = False  # the current core record is left out, and the lines continuing it
    for raw in source:
        line = raw.decode("utf-8", errors="backslashreplace").rstrip("\r\n")
        if not line:
            continue
        match = ABSL_LINE.match(line)
        if handshakes is not None and failures is not None and match is not None:
            level, _, where, message = match.groups()
            if handshakes.is_trace(where, message):
                failures.trace_line(message)
                dropping = True
                continue
            failures.end()
            dropping = "IWEF".index(level) < floor
        elif failures is not None and dropping and CONTINUATION.match(line):
            failures.more(line)
            continue
        else:
            dropping = False
        if not dropping:
            sink.write(record(line) + "\n")
            sink.flush()
    if failures is not None:
        failures.close()


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        relay(sys.stdin.buffer, sys.stdout, os.environ.get(CORE_LEVEL_VAR, ""))
    except BrokenPipeError:  # nobody reads the server's stderr any more
        pass


if __name__ == "__main__":
    main()
