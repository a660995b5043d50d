"""Every service's schema line, and the operator's ``mwp db status`` / ``mwp db upgrade`` on a store.

The CLI reaches the services' tables only through here (like ``mwp verify`` through maintenance.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from missionweave_server.services.artifacts import schema as artifacts_schema
from missionweave_server.services.authority import schema as authority_schema
from missionweave_server.services.gateway import schema as gateway_schema
from missionweave_server.services.membership import schema as membership_schema
from missionweave_server.services.scheduling import store as scheduling_store
from missionweave_server.storage import replay, schema_versions
from missionweave_server.storage.db import make_engine
from missionweave_server.storage.schema_versions import LineStatus, Progress, SchemaLine, Step

# Each service's tables, in the order they are installed; and "nonces", no service's: accepted
# proofs' nonces, kept across restarts and shared by replicas (MWP_NONCE_STORE=database, D118, D168).
LINES: dict[str, SchemaLine] = {
    line.name: line
    for line in (
        membership_schema.LINE,
        authority_schema.LINE,
        artifacts_schema.LINE,
        gateway_schema.LINE,
        scheduling_store.LINE,
        replay.LINE,
    )
}


def lines_for(names: Iterable[str]) -> list[SchemaLine]:
    """The lines of ``names`` (services, or "nonces") in installation order; unknown names are
    ValueError."""
    wanted = set(names)
    unknown = wanted - set(LINES)
    if unknown:
        raise ValueError(f"no schema line {', '.join(sorted(unknown))} (there are: {', '.join(LINES)})")
    return [line for name, line in LINES.items() if name in wanted]


def status(url: str, names: Iterable[str] = LINES) -> list[LineStatus]:
    async def run() -> list[LineStatus]:
        engine = make_engine(url)
        try:
            return await schema_versions.statuses(engine, lines_for(names))
        finally:
            await engine.dispose()

    return asyncio.run(run())


def upgrade(
    url: str,
    names: Iterable[str] = LINES,
    *,
    offline_ok: bool = False,
    progress: Progress | None = None,
    secrets: Mapping[str, Any] | None = None,
) -> list[tuple[LineStatus, tuple[Step, ...]]]:
    async def run() -> list[tuple[LineStatus, tuple[Step, ...]]]:
        engine = make_engine(url)
        try:
            return await schema_versions.upgrade(
                engine, lines_for(names), offline_ok=offline_ok, progress=progress, secrets=secrets
            )
        finally:
            await engine.dispose()

    return asyncio.run(run())


def revisions(url: str) -> dict[str, str | None]:
    """Each line's revision in the store at ``url`` (None: not installed), for a backup's manifest."""
    return {s.line: s.revision for s in status(url)}
