"""Structured logging: one JSON object per line on stderr (or plain text with MWP_LOG_FORMAT=text)."""

from __future__ import annotations

import json
import logging
import os
import sys
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


def configure(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # gRPC's Python loggers ("grpc", "grpc._cython.cygrpc", "grpc.aio", ...) reach this handler
    # through the root logger; their own handlers, if any, are dropped so nothing bypasses it.
    grpc_logger = logging.getLogger("grpc")
    grpc_logger.handlers[:] = [h for h in grpc_logger.handlers if isinstance(h, logging.NullHandler)]
    grpc_logger.propagate = True


def quiet_grpc_core() -> None:
    """gRPC's C core logs to stderr on its own, outside this format: only its errors, unless
    GRPC_VERBOSITY says otherwise. Read when the core starts, so set before grpc is imported."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
