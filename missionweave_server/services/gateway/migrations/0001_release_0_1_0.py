"""The gateway tables of release 0.1.0, the first versioned schema.

Creates each table that is missing, so that it also adopts a store made by 0.1.0 or earlier (made
then by ``create_all``, with no version table): tables that exist are left as they are.
"""

import sqlalchemy as sa
from alembic import op

revision = "gateway_0001"
down_revision = None
branch_labels = None
depends_on = None

online = True  # creates only what is missing; the rows of existing tables are not touched


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    if "gateway_cursors" not in existing:
        op.create_table(
            "gateway_cursors",
            sa.Column("agent_id", sa.String(length=128), nullable=False),
            sa.Column("group_id", sa.String(length=128), nullable=False),
            sa.Column("cursor", sa.BigInteger(), nullable=False),
            sa.Column("updated_us", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("agent_id", "group_id"),
        )
