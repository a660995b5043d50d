"""The relay behind ``grpc_core.route_grpc_core``: a server's file descriptor 2 in, JSON log lines out.

It reads its standard input (the read end of the pipe that is the server's descriptor 2) line by
line and writes each to its standard output (the server's real stderr): a JSON object as it is
(the records of the server's child processes), an absl line of gRPC's C core
(``E1202 01:13:19.316968   26595 add_port.cc:83] message``) as a record of logger ``grpc.core`` at
its level, anything else (a crash's last words) as a record of logger ``stderr`` at level error.

It ends when the pipe does, that is once every process holding it has exited, and ignores SIGINT
and SIGTERM meanwhile: a Ctrl-C reaches the whole process group, and the relay must outlive the
server to write its last lines. Standard library only, started with ``python -I -S`` by path.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from datetime import UTC, datetime
from typing import BinaryIO, TextIO

ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+(\d+) ([^\]\s]+)\] ?(.*)$")
LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "critical"}


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


def relay(source: BinaryIO, sink: TextIO) -> None:
    for raw in source:
        line = raw.decode("utf-8", errors="backslashreplace").rstrip("\r\n")
        if line:
            sink.write(record(line) + "\n")
            sink.flush()


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        relay(sys.stdin.buffer, sys.stdout)
    except BrokenPipeError:  # nobody reads the server's stderr any more
        pass


if __name__ == "__main__":
    main()
