"""The artifacts tables of release 0.1.0, the first versioned schema.

Creates each table that is missing, so that it also adopts a store made by 0.1.0 or earlier (made
then by ``create_all``, with no version table): tables that exist are left as they are.
"""

import sqlalchemy as sa
from alembic import op

revision = "artifacts_0001"
down_revision = None
branch_labels = None
depends_on = None

online = True  # creates only what is missing; the rows of existing tables are not touched


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    if "blobs" not in existing:
        op.create_table(
            "blobs",
            sa.Column("digest", sa.String(length=64), nullable=False),
            sa.Column("size_bytes", sa.BigInteger(), nullable=False),
            sa.Column("stored_us", sa.BigInteger(), nullable=False),
            sa.Column("verified_us", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("digest"),
        )
    if "holders" not in existing:
        op.create_table(
            "holders",
            sa.Column("digest", sa.String(length=64), nullable=False),
            sa.Column("identity_id", sa.String(length=128), nullable=False),
            sa.Column("size_bytes", sa.BigInteger(), nullable=False),
            sa.Column("stored_us", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("digest", "identity_id"),
        )
        op.create_index("holders_identity", "holders", ["identity_id"], unique=False)
    if "holdings" not in existing:
        op.create_table(
            "holdings",
            sa.Column("identity_id", sa.String(length=128), nullable=False),
            sa.Column("held_bytes", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("identity_id"),
        )
    if "manifests" not in existing:
        op.create_table(
            "manifests",
            sa.Column("manifest_digest", sa.String(length=64), nullable=False),
            sa.Column("content_digest", sa.String(length=64), nullable=False),
            sa.Column("producer_agent_id", sa.String(length=128), nullable=False),
            sa.Column("group_id", sa.String(length=128), nullable=False),
            sa.Column("work_item_id", sa.String(length=128), nullable=False),
            sa.Column("media_type", sa.String(length=255), nullable=False),
            sa.Column("envelope", sa.LargeBinary(), nullable=False),
            sa.PrimaryKeyConstraint("manifest_digest"),
        )
        op.create_index(op.f("ix_manifests_content_digest"), "manifests", ["content_digest"], unique=False)
    if "provenance" not in existing:
        op.create_table(
            "provenance",
            sa.Column("source_digest", sa.String(length=64), nullable=False),
            sa.Column("derived_digest", sa.String(length=64), nullable=False),
            sa.Column("manifest_digest", sa.String(length=64), nullable=False),
            sa.PrimaryKeyConstraint("source_digest", "derived_digest", "manifest_digest"),
        )
        op.create_index("provenance_derived", "provenance", ["derived_digest"], unique=False)
    if "upload_reservations" not in existing:
        op.create_table(
            "upload_reservations",
            sa.Column("reservation_id", sa.String(length=32), nullable=False),
            sa.Column("identity_id", sa.String(length=128), nullable=False),
            sa.Column("size_bytes", sa.BigInteger(), nullable=False),
            sa.Column("expires_us", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("reservation_id"),
        )
        op.create_index("upload_reservations_identity", "upload_reservations", ["identity_id"], unique=False)

    if "holdings" not in existing and "holders" in existing:
        # A store made before `holdings` existed: what each identity holds, summed once.
        op.execute(
            "INSERT INTO holdings (identity_id, held_bytes) "
            "SELECT identity_id, SUM(size_bytes) FROM holders GROUP BY identity_id"
        )
