"""Structured logging: one JSON object per line on stderr, or with MWP_LOG_FORMAT=text one line of
text with the same fields as ``key=value`` after the message.

In a server, a record written while a trace span is current also carries its ``trace_id`` and
``span_id`` (``missionweave_server.observability.tracing.TraceIds``), and gRPC's C-core output joins
the JSON log (missionweave_server/observability/grpc_core.py).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def fields(record: logging.LogRecord) -> dict[str, object]:
    """A record's structured fields (its ``extra``, the trace ids), the same for either format: JSON
    values as they are, anything else as its text."""
    return {
        key: value if isinstance(value, str | int | float | bool | type(None)) else str(value)
        for key, value in record.__dict__.items()
        if key not in _STANDARD and not key.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **fields(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message key=value ...``: the fields of the JSON format after the message,
    a value quoted (JSON string syntax) when it is empty or holds a space, a quote, ``=`` or a line
    break, so that each line stays one record and splits back into its fields."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        line = self.formatMessage(record)
        pairs = " ".join(f"{key}={_text_value(value)}" for key, value in fields(record).items())
        if pairs:
            line = f"{line} {pairs}"
        if record.exc_info:  # the traceback after the fields: the record's first line is whole
            line = f"{line}\n{self.formatException(record.exc_info)}"
        if record.stack_info:
            line = f"{line}\n{self.formatStack(record.stack_info)}"
        return line


def _text_value(value: object) -> str:
    text = "" if value is None else str(value)
    if text == "" or any(c in text for c in ' "=\n\t\r'):
        return json.dumps(text, ensure_ascii=False)
    return text


def configure(level: str = "info", fmt: str = "json", *record_filters: logging.Filter) -> None:
    """Every record to stderr in ``fmt``, through ``record_filters`` (a server adds the trace ids)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    for record_filter in record_filters:
        handler.addFilter(record_filter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # gRPC's Python loggers ("grpc", "grpc._cython.cygrpc", "grpc.aio", ...) reach this handler
    # through the root logger; their own handlers, if any, are dropped so nothing bypasses it.
    grpc_logger = logging.getLogger("grpc")
    grpc_logger.handlers[:] = [h for h in grpc_logger.handlers if isinstance(h, logging.NullHandler)]
    grpc_logger.propagate = True
    # Alembic says which dialect it drives at every install or check of a schema: not news. Each
    # migration applied is logged by missionweave_server.storage.schema_versions.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))


def quiet_grpc_core() -> None:
    """gRPC's C core logs to stderr on its own, outside this format: only its errors, unless
    GRPC_VERBOSITY says otherwise. Read when the core starts, so set before grpc is imported."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


class RateLimitedLog:
    """One record per key per interval on ``logger``, carrying the count of those suppressed since
    the last one (a flood of alike events stays visible without a line each)."""

    def __init__(
        self, interval_s: float, logger: logging.Logger, now: Callable[[], float] = time.monotonic
    ) -> None:
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
