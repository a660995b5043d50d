"""Structured logging: one JSON object per line on stderr (or plain text with MWP_LOG_FORMAT=text).

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


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``, and the trace it belongs to, if any."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        trace_id = getattr(record, "trace_id", None)
        return (
            line
            if trace_id is None
            else f"{line} trace_id={trace_id} span_id={getattr(record, 'span_id', '')}"
        )


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
