"""The authority tables of release 0.1.0, the first versioned schema.

Creates each table that is missing, so that it also adopts a store made by 0.1.0 or earlier (made
then by ``create_all``, with no version table): tables that exist are left as they are.
"""

import sqlalchemy as sa
from alembic import op

revision = "authority_0001"
down_revision = None
branch_labels = None
depends_on = None

online = True  # creates only what is missing; the rows of existing tables are not touched


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    if "authority_instances" not in existing:
        op.create_table(
            "authority_instances",
            sa.Column("instance_id", sa.String(length=128), nullable=False),
            sa.Column("address", sa.String(length=256), nullable=False),
            sa.Column("updated_us", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("instance_id"),
        )
    if "authority_keys" not in existing:
        op.create_table(
            "authority_keys",
            sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
            sa.Column("key_id", sa.String(length=128), nullable=False),
            sa.Column("public_key", sa.LargeBinary(), nullable=False),
            sa.Column("recorded_us", sa.BigInteger(), nullable=False),
            sa.Column("rotation", sa.LargeBinary(), nullable=False),
            sa.PrimaryKeyConstraint("position"),
            sa.UniqueConstraint("key_id"),
        )
    if "chain_checkpoints" not in existing:
        op.create_table(
            "chain_checkpoints",
            sa.Column("group_id", sa.String(length=128), nullable=False),
            sa.Column("seq", sa.BigInteger(), nullable=False),
            sa.Column("envelope", sa.LargeBinary(), nullable=False),
            sa.PrimaryKeyConstraint("group_id"),
        )
    if "commands" not in existing:
        op.create_table(
            "commands",
            sa.Column("group_id", sa.String(length=128), nullable=False),
            sa.Column("command_id", sa.String(length=128), nullable=False),
            sa.Column("fingerprint", sa.LargeBinary(), nullable=False),
            sa.Column("first_seq", sa.BigInteger(), nullable=False),
            sa.Column("last_seq", sa.BigInteger(), nullable=False),
            sa.Column("event_count", sa.Integer(), nullable=False),
            sa.PrimaryKeyConstraint("group_id", "command_id"),
        )
    if "cross_group_outbox" not in existing:
        op.create_table(
            "cross_group_outbox",
            sa.Column("source_group_id", sa.String(length=128), nullable=False),
            sa.Column("source_seq", sa.BigInteger(), nullable=False),
            sa.Column("target_group_id", sa.String(length=128), nullable=False),
            sa.Column("created_us", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("source_group_id", "source_seq", "target_group_id"),
        )
    if "events" not in existing:
        op.create_table(
            "events",
            sa.Column("group_id", sa.String(length=128), nullable=False),
            sa.Column("seq", sa.BigInteger(), nullable=False),
            sa.Column("event_id", sa.String(length=128), nullable=False),
            sa.Column("type", sa.String(length=128), nullable=False),
            sa.Column("command_id", sa.String(length=128), nullable=False),
            sa.Column("recorded_us", sa.BigInteger(), nullable=False),
            sa.Column("envelope", sa.LargeBinary(), nullable=False),
            sa.PrimaryKeyConstraint("group_id", "seq"),
        )
    if "events_archive" not in existing:
        op.create_table(
            "events_archive",
            sa.Column("group_id", sa.String(length=128), nullable=False),
            sa.Column("seq", sa.BigInteger(), nullable=False),
            sa.Column("event_id", sa.String(length=128), nullable=False),
            sa.Column("type", sa.String(length=128), nullable=False),
            sa.Column("command_id", sa.String(length=128), nullable=False),
            sa.Column("recorded_us", sa.BigInteger(), nullable=False),
            sa.Column("envelope", sa.LargeBinary(), nullable=False),
            sa.PrimaryKeyConstraint("group_id", "seq"),
        )
    if "groups" not in existing:
        op.create_table(
            "groups",
            sa.Column("group_id", sa.String(length=128), nullable=False),
            sa.Column("head_seq", sa.BigInteger(), nullable=False),
            sa.Column("writer_epoch", sa.BigInteger(), nullable=False),
            sa.Column("owner_instance", sa.String(length=128), nullable=False),
            sa.Column("lease_expires_us", sa.BigInteger(), nullable=False),
            sa.Column("created_us", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("group_id"),
        )
    if "live_leases" not in existing:
        op.create_table(
            "live_leases",
            sa.Column("group_id", sa.String(length=128), nullable=False),
            sa.Column("work_item_id", sa.String(length=128), nullable=False),
            sa.Column("agent_id", sa.String(length=128), nullable=False),
            sa.Column("session_epoch", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("group_id", "work_item_id"),
        )
        op.create_index(op.f("ix_live_leases_agent_id"), "live_leases", ["agent_id"], unique=False)
    if "snapshots" not in existing:
        op.create_table(
            "snapshots",
            sa.Column("group_id", sa.String(length=128), nullable=False),
            sa.Column("seq", sa.BigInteger(), nullable=False),
            sa.Column("digest", sa.String(length=64), nullable=False),
            sa.Column("archival", sa.Integer(), nullable=False),
            sa.Column("created_us", sa.BigInteger(), nullable=False),
            sa.Column("envelope", sa.LargeBinary(), nullable=False),
            sa.PrimaryKeyConstraint("group_id", "seq"),
            sa.UniqueConstraint("digest"),
        )
