"""The artifact index: which blobs are stored, who holds them, their signed manifests and the
provenance edges."""

from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    LargeBinary,
    MetaData,
    String,
    Table,
)
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave_server.storage import schema_versions

# This service's tables only: no other service reads or writes them.
METADATA = MetaData()


blobs = Table(
    "blobs",
    METADATA,
    Column("digest", String(64), primary_key=True),  # BLAKE3 hex
    Column("size_bytes", BigInteger, nullable=False),
    Column("stored_us", BigInteger, nullable=False),
    Column("verified_us", BigInteger, nullable=False),
)

# Who uploaded (proved possession of) each blob: the blobs an identity may always read, and what
# counts against its quota (issue 13 item 3, docs/artifacts-storage.md "Authorization and quota").
holders = Table(
    "holders",
    METADATA,
    Column("digest", String(64), primary_key=True),
    Column("identity_id", String(128), primary_key=True),
    Column("size_bytes", BigInteger, nullable=False),
    Column("stored_us", BigInteger, nullable=False),
    # Keyed BLAKE3 of (digest, identity, size) under the mesh token's derived key
    # (missionweave_server/services/artifacts/holder_seal.py): a row without a valid seal grants nothing.
    Column("holder_seal", LargeBinary, nullable=True),
)
Index("holders_identity", holders.c.identity_id)

# What each identity holds in all: the sum of its ``holders`` sizes, raised in the transaction that
# adds its holders, so that the quota's check reads one row instead of summing them (it grew with
# every blob the identity held, inside the database's write lock). Holders are never removed.
holdings = Table(
    "holdings",
    METADATA,
    Column("identity_id", String(128), primary_key=True),
    Column("held_bytes", BigInteger, nullable=False),
)

# Uploads being received, by any artifact replica: each counts against its identity's quota with
# what it holds (D119). A row goes when its upload ends (in the transaction that records the holder,
# if it succeeded); one whose replica died lapses at ``expires_us`` (a live upload renews it).
upload_reservations = Table(
    "upload_reservations",
    METADATA,
    Column("reservation_id", String(32), primary_key=True),
    Column("identity_id", String(128), nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("expires_us", BigInteger, nullable=False),
)
Index("upload_reservations_identity", upload_reservations.c.identity_id)

manifests = Table(
    "manifests",
    METADATA,
    Column("manifest_digest", String(64), primary_key=True),  # BLAKE3 of the serialized envelope
    Column("content_digest", String(64), nullable=False, index=True),
    Column("producer_agent_id", String(128), nullable=False),
    Column("group_id", String(128), nullable=False),
    Column("work_item_id", String(128), nullable=False),
    Column("media_type", String(255), nullable=False),
    Column("envelope", LargeBinary, nullable=False),
)

# source -> derived, one row per source artifact named in a derived artifact's manifest.
provenance = Table(
    "provenance",
    METADATA,
    Column("source_digest", String(64), primary_key=True),
    Column("derived_digest", String(64), primary_key=True),
    Column("manifest_digest", String(64), primary_key=True),
)
Index("provenance_derived", provenance.c.derived_digest)


# Every change to these tables ships with its migration in missionweave_server/services/artifacts/migrations/ (docs/upgrades.md).
LINE = schema_versions.SchemaLine("artifacts", METADATA, Path(__file__).resolve().parent / "migrations")


async def create_schema(engine: AsyncEngine) -> None:
    """Install this schema into an empty store, or check the store is at it (``SchemaMismatch``)."""
    await schema_versions.prepare(engine, [LINE])
