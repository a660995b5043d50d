"""Organization tables: identities, their sessions, and idempotency records of org requests."""

from sqlalchemy import BigInteger, Boolean, Column, Integer, LargeBinary, MetaData, String, Table
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.db import create_tables

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
)

org_requests = Table(
    "org_requests",
    METADATA,
    Column("request_id", String(128), primary_key=True),
    Column("fingerprint", LargeBinary, nullable=False),
    Column("identity_id", String(128), nullable=False),
)


async def create_schema(engine: AsyncEngine) -> None:
    await create_tables(engine, METADATA)
