"""What each identity holds in all (``holdings``, missionweave_server/services/artifacts/schema.py): kept with its holders, so
that an upload's quota check reads one row instead of summing every blob the identity holds (D151)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select, text

from missionweave_server.services.artifacts.index import ArtifactIndex
from missionweave_server.services.artifacts.schema import LINE, create_schema, holders, holdings
from missionweave_server.storage import schema_versions
from missionweave_server.storage.db import make_engine
from missionweave_server.storage.schema_versions import SchemaMismatch, State

QUOTA = 1_000


async def _sums(index: ArtifactIndex) -> tuple[dict[str, int], dict[str, int]]:
    """(holdings rows, sums of the holders) per identity."""
    async with index.engine.connect() as conn:
        kept = {
            i: int(n) for i, n in await conn.execute(select(holdings.c.identity_id, holdings.c.held_bytes))
        }
        summed = {
            i: int(n)
            for i, n in await conn.execute(
                select(holders.c.identity_id, func.sum(holders.c.size_bytes)).group_by(holders.c.identity_id)
            )
        }
    return kept, summed


@pytest.fixture
async def index(db_url: str) -> ArtifactIndex:
    engine = make_engine(db_url)
    await create_schema(engine)
    made = ArtifactIndex(engine)
    yield made  # type: ignore[misc]
    await made.close()
    await engine.dispose()


async def test_holdings_grow_by_the_holders_an_identity_did_not_have(index: ArtifactIndex) -> None:
    await index.record_stored(
        [("a" * 64, 100), ("b" * 64, 200)], [("a" * 64, 100), ("b" * 64, 200)], "alice", 1
    )
    # The same bytes again (a repeated upload), one of them in a batch with a new blob.
    await index.record_stored([], [("a" * 64, 100)], "alice", 2)
    await index.record_stored([("c" * 64, 50)], [("b" * 64, 200), ("c" * 64, 50)], "alice", 3)
    # Bytes another identity stored first: bob holds them too, and they count for him as well.
    await index.record_stored([], [("a" * 64, 100)], "bob", 4)
    # A mesh service's upload stores the blob and holds nothing.
    await index.record_stored([("d" * 64, 7)], [("d" * 64, 7)], "", 5)
    kept, summed = await _sums(index)
    assert kept == summed == {"alice": 350, "bob": 100}


async def test_the_quota_check_counts_the_holdings_and_the_uploads_in_progress(index: ArtifactIndex) -> None:
    await index.record_stored([("a" * 64, 600)], [("a" * 64, 600)], "alice", 1)
    first, used = await index.reserve("alice", 300, QUOTA, 1, 10**12)
    assert first and used == 0
    refused, used = await index.reserve("alice", 101, QUOTA, 1, 10**12)
    assert refused == "" and used == 900  # 600 held + 300 being received
    # The upload ends: its reservation becomes the holding; 100 bytes remain.
    await index.record_stored([("b" * 64, 300)], [("b" * 64, 300)], "alice", 2, [first])
    refused, used = await index.reserve("alice", 101, QUOTA, 3, 10**12)
    assert refused == "" and used == 900
    fits, _ = await index.reserve("alice", 100, QUOTA, 3, 10**12)
    assert fits


async def test_one_holder_recorded_at_once_by_many_uploads_counts_once(db_url: str) -> None:
    """Two replicas (engines) recording the same holder at the same moment, many times over."""
    engines = [make_engine(db_url), make_engine(db_url)]
    await create_schema(engines[0])
    replicas = [ArtifactIndex(e) for e in engines]
    try:
        await asyncio.gather(
            *(
                replicas[k % 2].record_stored([("a" * 64, 10)], [("a" * 64, 10)], "alice", k)
                for k in range(12)
            )
        )
        kept, summed = await _sums(replicas[0])
        assert kept == summed == {"alice": 10}
    finally:
        for replica, engine in zip(replicas, engines, strict=True):
            await replica.close()
            await engine.dispose()


async def test_a_store_made_before_holdings_is_filled_from_its_holders(db_url: str) -> None:
    engine = make_engine(db_url)
    index = ArtifactIndex(engine)
    try:
        await create_schema(engine)
        await index.record_stored(
            [("a" * 64, 100), ("b" * 64, 5)], [("a" * 64, 100), ("b" * 64, 5)], "alice", 1
        )
        await index.record_stored([], [("a" * 64, 100)], "bob", 1)
        async with engine.begin() as conn:  # as a store of a release before 0.1.0 has it: unversioned
            await conn.execute(text("DROP TABLE holdings"))
            await conn.execute(text(f"DROP TABLE {LINE.version_table}"))
        with pytest.raises(SchemaMismatch, match="mwp db upgrade"):
            await create_schema(engine)  # a service does not start on it
        # artifacts_0002 (holder seals, D172) runs offline and needs the mesh token.
        [(before, steps)] = await schema_versions.upgrade(
            engine, [LINE], offline_ok=True, secrets={"mesh_token": b"t" * 64}
        )
        assert before.state is State.UNVERSIONED and [s.revision for s in steps] == [
            "artifacts_0001",
            "artifacts_0002",
        ]
        kept, summed = await _sums(index)
        assert kept == summed == {"alice": 105, "bob": 100}
        [(before, steps)] = await schema_versions.upgrade(engine, [LINE])  # and only when the table is new
        assert before.state is State.CURRENT and steps == ()
        kept, _ = await _sums(index)
        assert kept == {"alice": 105, "bob": 100}
    finally:
        await index.close()
        await engine.dispose()
