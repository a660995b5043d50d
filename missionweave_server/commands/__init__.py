"""The server's ``mwp`` commands (serve, db, backup and restore, verify, authority), added to the client
CLI through the ``missionweave.cli`` entry point (missionweave/cli/extensions.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from missionweave_server.commands import backup, db, integrity, serve
from missionweave_server.observability import tracing


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    serve.register(sub)
    integrity.register(sub)
    backup.register(sub)
    db.register(sub)


def around(command: str, run: Callable[[], int]) -> int:
    """With OTEL_TRACES_EXPORTER set, one trace per client command: its calls are spans under it.
    ``mwp serve`` sets up its own tracing, per server process."""
    if command == "serve":
        return run()
    traced = tracing.setup("mwp")
    with tracing.tracer().start_as_current_span(f"mwp {command}"):
        code = run()
    if traced:
        tracing.flush()
    return code
