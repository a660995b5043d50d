"""Authority tables: one row per Group (head, writer epoch, owner lease), its events and commands."""

from functools import cache
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, LargeBinary, MetaData, String, Table, TextClause
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave_server.storage import schema_versions
from missionweave_server.storage.db import compiled_once, dialect_insert

# This service's tables only: no other service reads or writes them.
METADATA = MetaData()


groups = Table(
    "groups",
    METADATA,
    Column("group_id", String(128), primary_key=True),
    Column("head_seq", BigInteger, nullable=False),
    # Fencing (ARCHITECTURE "Scale-out"): every append matches writer_epoch; taking over a Group
    # raises it, so a second authority instance can never interleave appends.
    Column("writer_epoch", BigInteger, nullable=False),
    Column("owner_instance", String(128), nullable=False),
    Column("lease_expires_us", BigInteger, nullable=False),
    Column("created_us", BigInteger, nullable=False),
    # The Authority key's signature of (group, owner_instance, writer_epoch): an owner without it
    # holds no lease (missionweave_server/services/authority/ownership_seal.py). NULL in rows from before authority_0002.
    Column("owner_seal", LargeBinary, nullable=True),
)

# Where each Authority instance (shard) can be reached: a NOT_OWNER answer names the owner's address
# so that a router retries there (issue 12, shards). Each instance writes its own row at start.
authority_instances = Table(
    "authority_instances",
    METADATA,
    Column("instance_id", String(128), primary_key=True),
    Column("address", String(256), nullable=False),
    Column("updated_us", BigInteger, nullable=False),
)


def _event_columns() -> list[Column[Any]]:
    """The columns of an event row, shared by the online log and its archive tier."""
    return [
        Column("group_id", String(128), primary_key=True),
        Column("seq", BigInteger, primary_key=True),
        # No unique index (D159): an event id is derived from (group_id, command_id, index), and the
        # commands table's key admits each (group_id, command_id) once. The index was a third of the
        # pages every commit wrote, and its random inserts grew with the log.
        Column("event_id", String(128), nullable=False),
        Column("type", String(128), nullable=False),
        Column("command_id", String(128), nullable=False),
        Column("recorded_us", BigInteger, nullable=False),
        # The signed envelope exactly as served: events are never re-serialised (principle 5).
        Column("envelope", LargeBinary, nullable=False),
    ]


events = Table("events", METADATA, *_event_columns())

commands = Table(
    "commands",
    METADATA,
    Column("group_id", String(128), primary_key=True),
    Column("command_id", String(128), primary_key=True),
    Column("fingerprint", LargeBinary, nullable=False),
    Column("first_seq", BigInteger, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("event_count", Integer, nullable=False),
)

# No index by (group, type): nothing queries by type, and every append paid for one more B-tree
# insert in the hottest write (D55). Databases created before keep theirs, unused.

# The archive tier: events moved out of the online log by compaction. Never deleted (MW-7.4-01,
# MW-16-09); same columns as `events`.
events_archive = Table("events_archive", METADATA, *_event_columns())

# Signed snapshots by (Group, sequence); `digest` is BLAKE3 of the payload (MW-16-11/12).
snapshots = Table(
    "snapshots",
    METADATA,
    Column("group_id", String(128), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("digest", String(64), nullable=False, unique=True),
    Column("archival", Integer, nullable=False),
    Column("created_us", BigInteger, nullable=False),
    Column("envelope", LargeBinary, nullable=False),
)


# The cross-Group outbox (MW-10.4-05, docs/subtasks.md): an event that another Group must apply
# (a child's creation or end, a parent's cancellation), written in the same transaction as the
# event itself and deleted once the target Group has applied it (idempotently: the target's
# command id derives from the source event). Any Authority instance may deliver a row; the one
# that owns the target Group does.
cross_group_outbox = Table(
    "cross_group_outbox",
    METADATA,
    Column("source_group_id", String(128), primary_key=True),
    Column("source_seq", BigInteger, primary_key=True),
    Column("target_group_id", String(128), primary_key=True),
    Column("created_us", BigInteger, nullable=False),
)


# The live execution leases by agent (MW-11.3-09, docs/workitems.md "Replacement sessions"): one row
# per WorkItem whose execution lease is running, written in the same transaction as the event that
# began or ended it. When an agent opens a replacement session, the Authority finds here the Groups
# where its older session still holds leases and revokes them without waiting for the agent.
live_leases = Table(
    "live_leases",
    METADATA,
    Column("group_id", String(128), primary_key=True),
    Column("work_item_id", String(128), primary_key=True),
    Column("agent_id", String(128), nullable=False, index=True),
    Column("session_epoch", BigInteger, nullable=False),
)

# Key continuity (docs/integrity.md): every key the Authority has signed with, in order. The first
# row is recorded on the store's first use; each later one only with a rotation record (a serialised
# SignedEnvelope of an AuthorityKeyRotation) signed by the key before it. A process whose key is not
# the last row's refuses to start (missionweave_server/services/authority/keys.py).
authority_keys = Table(
    "authority_keys",
    METADATA,
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("key_id", String(128), nullable=False, unique=True),
    Column("public_key", LargeBinary, nullable=False),
    Column("recorded_us", BigInteger, nullable=False),
    Column("rotation", LargeBinary, nullable=False),
)


# A Group's chain head as this Authority verified it, signed (docs/integrity.md "Chain checkpoints"):
# a later load checks the hash chain up to it and Ed25519 signatures only after it. ``envelope`` is
# a SignedEnvelope over ``eventlog.checkpoint_payload``.
chain_checkpoints = Table(
    "chain_checkpoints",
    METADATA,
    Column("group_id", String(128), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("envelope", LargeBinary, nullable=False),
)


@cache
def checkpoint_upsert(dialect: str) -> TextClause:
    """Record a Group's checkpoint, never replacing a later one. Rows: group_id, seq, envelope."""
    ins = dialect_insert(dialect, chain_checkpoints)
    return compiled_once(
        ins.on_conflict_do_update(
            index_elements=[chain_checkpoints.c.group_id],
            set_={"seq": ins.excluded.seq, "envelope": ins.excluded.envelope},
            where=chain_checkpoints.c.seq < ins.excluded.seq,
        ),
        dialect,
    )


# Every change to these tables ships with its migration in missionweave_server/services/authority/migrations/ (docs/upgrades.md).
LINE = schema_versions.SchemaLine("authority", METADATA, Path(__file__).resolve().parent / "migrations")


async def create_schema(engine: AsyncEngine) -> None:
    """Install this schema into an empty store, or check the store is at it (``SchemaMismatch``)."""
    await schema_versions.prepare(engine, [LINE])


@cache
def instance_upsert(dialect: str) -> TextClause:
    """Record (or move) an instance's address. Rows: instance_id, address, updated_us."""
    ins = dialect_insert(dialect, authority_instances)
    return compiled_once(
        ins.on_conflict_do_update(
            index_elements=[authority_instances.c.instance_id],
            set_={"address": ins.excluded.address, "updated_us": ins.excluded.updated_us},
        ),
        dialect,
    )
