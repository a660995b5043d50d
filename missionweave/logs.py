"""Structured logging: one JSON object per line on stderr (or plain text with MWP_LOG_FORMAT=text).

A record written while a trace span is current carries its ``trace_id`` and ``span_id`` (both
formats; ``TraceIds``). Server processes also route gRPC's C-core output, which it writes to file
descriptor 2 on its own, into the JSON log (``route_grpc_core``, missionweave/stderr_relay.py).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from opentelemetry import trace

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool | type(None)) else str(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class TraceIds(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` (W3C hex) to a record made while a span is current, so that
    a log line leads to its trace and back. Without tracing no span is ever current."""

    def filter(self, record: logging.LogRecord) -> bool:
        span = trace.get_current_span().get_span_context()
        if span.is_valid and not hasattr(record, "trace_id"):
            record.trace_id = trace.format_trace_id(span.trace_id)
            record.span_id = trace.format_span_id(span.span_id)
        return True


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``, and the trace it belongs to, if any."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        trace_id = getattr(record, "trace_id", None)
        return line if trace_id is None else f"{line} trace_id={trace_id} span_id={getattr(record, 'span_id', '')}"


def configure(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(TraceIds())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # gRPC's Python loggers ("grpc", "grpc._cython.cygrpc", "grpc.aio", ...) reach this handler
    # through the root logger; their own handlers, if any, are dropped so nothing bypasses it.
    grpc_logger = logging.getLogger("grpc")
    grpc_logger.handlers[:] = [h for h in grpc_logger.handlers if isinstance(h, logging.NullHandler)]
    grpc_logger.propagate = True
    # Alembic says which dialect it drives at every install or check of a schema: not news. Each
    # migration applied is logged by missionweave.schema_versions.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))


def quiet_grpc_core() -> None:
    """gRPC's C core logs to stderr on its own, outside this format: only its errors, unless
    GRPC_VERBOSITY says otherwise. Read when the core starts, so set before grpc is imported."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


# The relay of route_grpc_core and the descriptor of the stderr it writes to, once started.
_relay: subprocess.Popen[bytes] | None = None
_original_stderr = -1


def route_grpc_core() -> None:
    """Server processes: gRPC's C core writes its lines (absl format) to file descriptor 2 itself,
    bypassing Python. From now on descriptor 2 is a pipe to a small relay process that writes each
    line to the real stderr as a JSON record (logger ``grpc.core``; JSON lines, such as the child
    processes' own records, pass unchanged). Python's own output (this log, ``print`` to stderr,
    tracebacks) goes straight to the real stderr through a duplicate of it. The relay is a process,
    not a thread, so a crash's last lines still come out: it drains the pipe until every writer has
    gone. Call before gRPC starts (its first server or channel) and before ``configure``."""
    global _relay, _original_stderr
    if _relay is not None:
        return
    sys.stderr.flush()
    _original_stderr = os.dup(2)
    read_end, write_end = os.pipe()
    _relay = subprocess.Popen(
        [sys.executable, "-I", "-S", str(Path(__file__).with_name("stderr_relay.py"))],
        stdin=read_end, stdout=_original_stderr, stderr=_original_stderr, close_fds=True,
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


class RateLimitedLog:
    """One record per key per interval on ``logger``, carrying the count of those suppressed since
    the last one (a flood of alike events stays visible without a line each)."""

    def __init__(self, interval_s: float, logger: logging.Logger, now: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.logger = logger
        self._now = now
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def reset(self) -> None:
        """Forget what was logged (a test that counts the records starts from none)."""
        self._last.clear()
        self._suppressed.clear()

    def warning(self, key: str, message: str, **extra: object) -> None:
        self.log(logging.WARNING, key, message, **extra)

    def log(self, level: int, key: str, message: str, **extra: object) -> None:
        if not self.logger.isEnabledFor(level):
            return
        now = self._now()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        if len(self._last) > 10_000:  # keys are RPC paths, Groups and the like, bounded in practice; a guard
            self._last.clear()
            self._suppressed.clear()
        self._last[key] = now
        self.logger.log(level, message, extra={**extra, "suppressed": self._suppressed.pop(key, 0)})
