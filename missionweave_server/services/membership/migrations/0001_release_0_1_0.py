"""The membership tables of release 0.1.0, the first versioned schema.

Creates each table that is missing, so that it also adopts a store made by 0.1.0 or earlier (made
then by ``create_all``, with no version table): tables that exist are left as they are.
"""

import sqlalchemy as sa
from alembic import op

revision = "membership_0001"
down_revision = None
branch_labels = None
depends_on = None

online = True  # creates only what is missing; the rows of existing tables are not touched


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    if "agent_cards" not in existing:
        op.create_table(
            "agent_cards",
            sa.Column("agent_id", sa.String(length=128), nullable=False),
            sa.Column("ordinal", sa.BigInteger(), autoincrement=False, nullable=False),
            sa.Column("card_version", sa.String(length=64), nullable=False),
            sa.Column("envelope", sa.LargeBinary(), nullable=False),
            sa.Column("session_epoch", sa.BigInteger(), nullable=False),
            sa.Column("session_public_key", sa.LargeBinary(), nullable=False),
            sa.Column("published_us", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("agent_id", "ordinal"),
            sa.UniqueConstraint("agent_id", "card_version", name="agent_cards_version"),
        )
    if "agent_presence" not in existing:
        op.create_table(
            "agent_presence",
            sa.Column("agent_id", sa.String(length=128), nullable=False),
            sa.Column("availability", sa.Integer(), nullable=False),
            sa.Column("free_slots", sa.BigInteger(), nullable=False),
            sa.Column("in_use_slots", sa.BigInteger(), nullable=False),
            sa.Column("max_concurrency", sa.BigInteger(), nullable=False),
            sa.Column("card_version", sa.String(length=64), nullable=False),
            sa.Column("note", sa.String(length=512), nullable=False),
            sa.Column("reported_us", sa.BigInteger(), nullable=False),
            sa.Column("ttl_ms", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("agent_id"),
        )
    if "directory_streams" not in existing:
        op.create_table(
            "directory_streams",
            sa.Column("stream_id", sa.String(length=64), nullable=False),
            sa.Column("instance_id", sa.String(length=64), nullable=False),
            sa.Column("delivered_revision", sa.BigInteger(), nullable=False),
            sa.Column("alive_until_us", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("stream_id"),
        )
    if "identities" not in existing:
        op.create_table(
            "identities",
            sa.Column("identity_id", sa.String(length=128), nullable=False),
            sa.Column("kind", sa.Integer(), nullable=False),
            sa.Column("display_name", sa.String(length=256), nullable=False),
            sa.Column("public_key", sa.LargeBinary(), nullable=False),
            sa.Column("org_admin", sa.Boolean(), nullable=False),
            sa.Column("registered_us", sa.BigInteger(), nullable=False),
            sa.Column("session_epoch", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("identity_id"),
        )
    if "identity_changes" not in existing:
        op.create_table(
            "identity_changes",
            sa.Column("revision", sa.BigInteger(), autoincrement=False, nullable=False),
            sa.Column("identity_id", sa.String(length=128), nullable=False),
            sa.Column("kind", sa.Integer(), nullable=False),
            sa.Column("session_epoch", sa.BigInteger(), nullable=False),
            sa.Column("recorded_us", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("revision"),
        )
    if "identity_revision" not in existing:
        op.create_table(
            "identity_revision",
            sa.Column("singleton", sa.Integer(), nullable=False),
            sa.Column("revision", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("singleton"),
        )
    if "org_requests" not in existing:
        op.create_table(
            "org_requests",
            sa.Column("request_id", sa.String(length=128), nullable=False),
            sa.Column("fingerprint", sa.LargeBinary(), nullable=False),
            sa.Column("identity_id", sa.String(length=128), nullable=False),
            sa.PrimaryKeyConstraint("request_id"),
        )
    if "sessions" not in existing:
        op.create_table(
            "sessions",
            sa.Column("identity_id", sa.String(length=128), nullable=False),
            sa.Column("session_epoch", sa.BigInteger(), nullable=False),
            sa.Column("public_key", sa.LargeBinary(), nullable=False),
            sa.Column("opened_us", sa.BigInteger(), nullable=False),
            sa.Column("request_fingerprint", sa.LargeBinary(), nullable=False),
            sa.PrimaryKeyConstraint("identity_id", "session_epoch"),
            sa.UniqueConstraint("request_fingerprint"),
        )
    # The directory's revision counter: one row, raised by every change (registry.record_change).
    op.execute(
        "INSERT INTO identity_revision (singleton, revision) "
        "SELECT 1, 0 WHERE NOT EXISTS (SELECT 1 FROM identity_revision)"
    )
