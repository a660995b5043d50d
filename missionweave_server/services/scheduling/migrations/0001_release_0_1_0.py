"""The scheduling tables of release 0.1.0, the first versioned schema.

Creates each table that is missing, so that it also adopts a store made by 0.1.0 or earlier (made
then by ``create_all``, with no version table): tables that exist are left as they are.
"""

import sqlalchemy as sa
from alembic import op

revision = "scheduling_0001"
down_revision = None
branch_labels = None
depends_on = None

online = True  # creates only what is missing; the rows of existing tables are not touched


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    if "scheduler_projections" not in existing:
        op.create_table(
            "scheduler_projections",
            sa.Column("worker_id", sa.String(length=128), nullable=False),
            sa.Column("group_id", sa.String(length=128), nullable=False),
            sa.Column("sequence", sa.BigInteger(), nullable=False),
            sa.Column("body", sa.Text(), nullable=False),
            sa.PrimaryKeyConstraint("worker_id", "group_id"),
        )
