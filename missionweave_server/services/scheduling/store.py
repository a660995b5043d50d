"""The scheduling service's tables: each Worker's per-Group projections, kept durable so that a
restart resumes from the Worker's cursor instead of replaying every Group log."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import BigInteger, Column, MetaData, String, Table, Text, delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave_server.services.scheduling.projection import GroupProjection
from missionweave_server.storage import schema_versions
from missionweave_server.storage.db import upsert

# This service's tables only: no other service reads or writes them.
METADATA = MetaData()

projections = Table(
    "scheduler_projections",
    METADATA,
    Column("worker_id", String(128), primary_key=True),
    Column("group_id", String(128), primary_key=True),
    Column("sequence", BigInteger, nullable=False),
    Column("body", Text, nullable=False),  # GroupProjection.to_json()
)


# Every change to these tables ships with its migration in missionweave_server/services/scheduling/migrations/ (docs/upgrades.md).
LINE = schema_versions.SchemaLine("scheduling", METADATA, Path(__file__).resolve().parent / "migrations")


async def create_schema(engine: AsyncEngine) -> None:
    """Install this schema into an empty store, or check the store is at it (``SchemaMismatch``)."""
    await schema_versions.prepare(engine, [LINE])


class ProjectionStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._save = upsert(engine.dialect.name, projections, ("worker_id", "group_id"))

    async def load(self, worker_id: str) -> dict[str, GroupProjection]:
        """Every Group projection of the Worker, by Group."""
        query = select(projections.c.group_id, projections.c.body).where(projections.c.worker_id == worker_id)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return {group_id: GroupProjection.from_json(body) for group_id, body in rows}

    async def save(self, projection: GroupProjection) -> None:
        values = {
            "worker_id": projection.worker_id,
            "group_id": projection.group_id,
            "sequence": projection.sequence,
            "body": projection.to_json(),
        }
        async with self.engine.begin() as conn:
            await conn.execute(self._save, values)

    async def forget(self, worker_id: str, group_id: str) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                delete(projections).where(
                    projections.c.worker_id == worker_id, projections.c.group_id == group_id
                )
            )
