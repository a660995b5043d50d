"""Gateway tables: the acknowledged cursor per (agent, Group), durable across reconnects (MW-16-06)."""

from sqlalchemy import BigInteger, Column, String, Table

from missionweave.db import METADATA

cursors = Table(
    "gateway_cursors",
    METADATA,
    Column("agent_id", String(128), primary_key=True),
    Column("group_id", String(128), primary_key=True),
    Column("cursor", BigInteger, nullable=False),
    Column("updated_us", BigInteger, nullable=False),
)
