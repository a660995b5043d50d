"""The nonces tables of release 0.1.0, the first versioned schema.

Creates each table that is missing, so that it also adopts a store made by 0.1.0 or earlier (made
then by ``create_all``, with no version table): tables that exist are left as they are.
"""

import sqlalchemy as sa
from alembic import op

revision = "nonces_0001"
down_revision = None
branch_labels = None
depends_on = None

online = True  # creates only what is missing; the rows of existing tables are not touched


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    if "proof_nonces" not in existing:
        op.create_table(
            "proof_nonces",
            sa.Column("nonce_digest", sa.LargeBinary(length=32), nullable=False),
            sa.Column("expires_us", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("nonce_digest"),
        )
        op.create_index(op.f("ix_proof_nonces_expires_us"), "proof_nonces", ["expires_us"], unique=False)
