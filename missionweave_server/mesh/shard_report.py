"""Where the Groups are: each Authority instance's announcement and the Groups it owns, read from the
store (``mwp db shards``), for an operator changing the number of shards (docs/operations.md)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sqlalchemy import case, func, select

from missionweave.kernel.clock import SystemClock, to_micros
from missionweave_server.services.authority import schema as authority_schema
from missionweave_server.storage.db import make_engine


@dataclass(frozen=True)
class ShardRow:
    instance_id: str
    address: str  # "" for an owner that never announced itself (a single instance without shards)
    announced_s_ago: float | None  # None: retired (stopped gracefully) or never announced
    groups: int
    lapsed: int  # of those, Groups whose ownership lease has lapsed


def shard_report(url: str) -> list[ShardRow]:
    """One row per instance that announced itself or owns a Group (read only: nothing is written)."""

    async def run() -> list[ShardRow]:
        engine = make_engine(url)
        try:
            now = to_micros(SystemClock().now())
            groups, instances = authority_schema.groups, authority_schema.authority_instances
            async with engine.connect() as conn:
                owned = {
                    str(owner): (int(count), int(lapsed or 0))
                    for owner, count, lapsed in await conn.execute(
                        select(
                            groups.c.owner_instance,
                            func.count(),
                            func.sum(case((groups.c.lease_expires_us < now, 1), else_=0)),
                        ).group_by(groups.c.owner_instance)
                    )
                }
                announced = {
                    str(i): (str(a), int(u))
                    for i, a, u in await conn.execute(
                        select(instances.c.instance_id, instances.c.address, instances.c.updated_us)
                    )
                }
        finally:
            await engine.dispose()
        rows = []
        for instance in sorted(set(owned) | set(announced)):
            address, updated_us = announced.get(instance, ("", 0))
            count, lapsed = owned.get(instance, (0, 0))
            ago = (now - updated_us) / 1_000_000 if updated_us else None
            rows.append(ShardRow(instance, address, ago, count, lapsed))
        return rows

    return asyncio.run(run())
