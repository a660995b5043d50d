"""The relay behind ``grpc_core.route_grpc_core``: a server's file descriptor 2 in, log lines out.

It reads its standard input (the read end of the pipe that is the server's descriptor 2) line by
line and writes each to its standard output (the server's real stderr): a JSON object as it is
(the records of the server's child processes), an absl line of gRPC's C core
(``E1202 01:13:19.316968   26595 add_port.cc:83] message``) as a record of logger ``grpc.core`` at
its level, anything else (a crash's last words) as a record of logger ``stderr`` at level error.
With ``--text LOGS_PY`` (``MWP_LOG_FORMAT=text``) the records it makes are written as the server's
text log writes them (the ``TextFormatter`` of that file, loaded by path), and any line that is not
the core's passes as it is.

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
import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, TextIO

ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+(\d+) ([^\]\s]+)\] ?(.*)$")
LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "critical"}
# The core's level asked for, when the handshake trace is on (CORE_LEVEL_VAR of handshake_trace.py).
CORE_LEVEL_VAR = "MWP_GRPC_CORE_LEVEL"
FLOORS = {"DEBUG": 0, "INFO": 0, "WARNING": 1, "ERROR": 2, "NONE": 4}
# What continues a core record on the next lines: its source-location trace, indented arguments.
CONTINUATION = re.compile(r"^(=== Source Location Trace: ===|src/\S+:\d+$|\s)")


def _by_path(name: str, path: Path) -> ModuleType:
    """A module of the server's by its file: the relay runs as a script, outside the package."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass in it looks itself up there
    spec.loader.exec_module(module)
    return module


def _handshakes() -> ModuleType:
    return _by_path("mwp_handshakes", Path(__file__).with_name("handshakes.py"))


Render = Callable[[dict[str, Any]], str]


def as_json(entry: dict[str, Any]) -> str:
    return json.dumps(entry, ensure_ascii=False)


def as_text(logs_py: Path) -> Render:
    """Entries written by the text log's own formatter (``missionweave/kernel/logs.py``)."""
    formatter = _by_path("mwp_logs", logs_py).TextFormatter()

    def render(entry: dict[str, Any]) -> str:
        fields = dict(entry)
        fields.pop("ts", None)
        level = str(fields.pop("level", "error")).upper()
        record = logging.LogRecord(
            str(fields.pop("logger", "stderr")),
            logging.getLevelName(level),
            "",
            0,
            fields.pop("msg", ""),
            (),
            None,
        )
        # A field named like a record's own attribute (the core's ``thread``) keeps a name of its own.
        record.__dict__.update({f"core_{k}" if k in record.__dict__ else k: v for k, v in fields.items()})
        return str(formatter.format(record))

    return render


def record(line: str, now: datetime | None = None, render: Render = as_json) -> str:
    """The log line for one line of output (without its newline): a JSON object as it is (in text
    mode, any line but the core's as it is)."""
    match = ABSL_LINE.match(line)
    if match is None and render is not as_json:
        return line
    if line.startswith("{"):
        try:
            json.loads(line)
            return line
        except ValueError:
            pass
    ts = (now or datetime.now(UTC)).isoformat(timespec="milliseconds")
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
    return render(entry)


def relay(source: BinaryIO, sink: TextIO, core_level: str = "", render: Render = as_json) -> None:
    """Every line of ``source`` as a record on ``sink``; with ``core_level`` (the handshake trace is
    on), refused handshakes as their own records and the core's lines below that level left out."""

    def write(entry: dict[str, object]) -> None:
        sink.write(render({"ts": datetime.now(UTC).isoformat(timespec="milliseconds"), **entry}) + "\n")
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
            sink.write(record(line, render=render) + "\n")
            sink.flush()
    if failures is not None:
        failures.close()


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    render = as_text(Path(sys.argv[2])) if sys.argv[1:2] == ["--text"] else as_json
    try:
        relay(sys.stdin.buffer, sys.stdout, os.environ.get(CORE_LEVEL_VAR, ""), render)
    except BrokenPipeError:  # nobody reads the server's stderr any more
        pass


if __name__ == "__main__":
    main()
