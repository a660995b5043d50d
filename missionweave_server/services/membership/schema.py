"""Organization tables: identities, their sessions, idempotency records of org requests, the
identity directory's change log with its revision counter, Agent Cards and Presence."""

from functools import cache
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    TextClause,
    UniqueConstraint,
)
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave_server.storage import schema_versions
from missionweave_server.storage.db import compiled_once, dialect_insert

# This service's tables only: no other service reads or writes them.
METADATA = MetaData()


identities = Table(
    "identities",
    METADATA,
    Column("identity_id", String(128), primary_key=True),
    Column("kind", Integer, nullable=False),
    Column("display_name", String(256), nullable=False),
    Column("public_key", LargeBinary, nullable=False),
    Column("org_admin", Boolean, nullable=False),
    Column("registered_us", BigInteger, nullable=False),
    Column("session_epoch", BigInteger, nullable=False),
    # The serialised SignedEnvelope of the RegisterIdentity request that granted this row
    # (missionweave_server/services/membership/grants.py): the row is refused unless it matches. NULL only in a store
    # not yet upgraded to membership_0002.
    Column("grant_envelope", LargeBinary, nullable=True),
)

sessions = Table(
    "sessions",
    METADATA,
    Column("identity_id", String(128), primary_key=True),
    Column("session_epoch", BigInteger, primary_key=True),
    Column("public_key", LargeBinary, nullable=False),
    Column("opened_us", BigInteger, nullable=False),
    # The signed OpenSession request, kept so a replayed request can be recognised.
    Column("request_fingerprint", LargeBinary, nullable=False, unique=True),
    # The serialised SignedEnvelope of the OpenSession request, as for ``identities``.
    Column("grant_envelope", LargeBinary, nullable=True),
)

org_requests = Table(
    "org_requests",
    METADATA,
    Column("request_id", String(128), primary_key=True),
    Column("fingerprint", LargeBinary, nullable=False),
    Column("identity_id", String(128), nullable=False),
)


# The directory's revision (protos/missionweave/internal/v1/identities.proto): one row, raised in
# the transaction of every change. Its row lock orders concurrent changes, so revisions commit in
# increasing order without gaps, whichever Membership instance makes them.
identity_revision = Table(
    "identity_revision",
    METADATA,
    Column("singleton", Integer, primary_key=True),  # always 1
    Column("revision", BigInteger, nullable=False),
)

# One row per change of the directory (an identity registered, a session opened), written in the
# change's own transaction; WatchIdentities streams follow it. Kept, like the sessions table.
identity_changes = Table(
    "identity_changes",
    METADATA,
    Column("revision", BigInteger, primary_key=True, autoincrement=False),
    Column("identity_id", String(128), nullable=False),
    # missionweave.internal.v1.IdentityChangeKind
    Column("kind", Integer, nullable=False),
    # The identity's session epoch after the change (0 for a registration).
    Column("session_epoch", BigInteger, nullable=False),
    Column("recorded_us", BigInteger, nullable=False),
)

# One row per open WatchIdentities stream of any Membership instance: how far it has been written
# the change log, and until when it counts as alive (refreshed with every heartbeat). OpenSession
# waits for every live stream, of every instance, to have been written the new session.
directory_streams = Table(
    "directory_streams",
    METADATA,
    Column("stream_id", String(64), primary_key=True),
    Column("instance_id", String(64), nullable=False),
    Column("delivered_revision", BigInteger, nullable=False),
    # Wall-clock µs; a row not refreshed by then belongs to a stream (or instance) that is gone.
    Column("alive_until_us", BigInteger, nullable=False),
)

# Every published version of every Agent Card, append only (docs/agent-cards.md). ``ordinal``
# numbers an agent's versions 1, 2, ... in publication order, which is also version order (each
# new version must be greater than the latest): two concurrent publications of one agent cannot
# both take the next ordinal, so the loser is refused rather than interleaved.
agent_cards = Table(
    "agent_cards",
    METADATA,
    Column("agent_id", String(128), primary_key=True),
    Column("ordinal", BigInteger, primary_key=True, autoincrement=False),
    Column("card_version", String(64), nullable=False),
    # The serialised SignedEnvelope exactly as the agent sent it (its payload is the AgentCard).
    Column("envelope", LargeBinary, nullable=False),
    Column("session_epoch", BigInteger, nullable=False),
    # That session's public key (the sessions table's, kept with the card it verifies).
    Column("session_public_key", LargeBinary, nullable=False),
    Column("published_us", BigInteger, nullable=False),
    UniqueConstraint("agent_id", "card_version", name="agent_cards_version"),
)

# Each agent's last Presence report, replaced by the next (D79): operational data, never history.
presence = Table(
    "agent_presence",
    METADATA,
    Column("agent_id", String(128), primary_key=True),
    Column("availability", Integer, nullable=False),
    Column("free_slots", BigInteger, nullable=False),
    Column("in_use_slots", BigInteger, nullable=False),
    Column("max_concurrency", BigInteger, nullable=False),
    Column("card_version", String(64), nullable=False),
    Column("note", String(512), nullable=False),
    Column("reported_us", BigInteger, nullable=False),
    Column("ttl_ms", BigInteger, nullable=False),
)

_PRESENCE_COLUMNS = (
    "availability",
    "free_slots",
    "in_use_slots",
    "max_concurrency",
    "card_version",
    "note",
    "reported_us",
    "ttl_ms",
)


@cache
def presence_upsert(dialect: str) -> TextClause:
    """Record an agent's report, replacing its previous one. SQLite (3.24+) and PostgreSQL share the
    syntax."""
    ins = dialect_insert(dialect, presence)
    return compiled_once(
        ins.on_conflict_do_update(
            index_elements=[presence.c.agent_id],
            set_={name: ins.excluded[name] for name in _PRESENCE_COLUMNS},
        ),
        dialect,
    )


# Every change to these tables ships with its migration in missionweave_server/services/membership/migrations/ (docs/upgrades.md).
LINE = schema_versions.SchemaLine("membership", METADATA, Path(__file__).resolve().parent / "migrations")


async def create_schema(engine: AsyncEngine) -> None:
    """Install this schema into an empty store, or check the store is at it (``SchemaMismatch``)."""
    await schema_versions.prepare(engine, [LINE])
