"""The seal of each Group's ownership row (D171, missionweave_server/services/authority/ownership_seal.py).

Adds ``groups.owner_seal``, NULL in the rows there are: an unsealed row holds no lease, so the first
instance to need such a Group takes it over and seals it (a one-time move of Groups between shards
after the upgrade, fenced by the writer epoch as every takeover is).

Revision authority_0002 (after authority_0001).
"""

import sqlalchemy as sa
from alembic import op

revision = "authority_0002"
down_revision = "authority_0001"
branch_labels = None
depends_on = None

# An older release keeps working on the table (it neither reads nor writes the new column); its
# Groups are sealed by the new release's instances as they take them.
online = True


def upgrade() -> None:
    # 0001 adopts tables as they are: add the column only when it is missing.
    if "owner_seal" not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("groups")}:
        with op.batch_alter_table("groups", schema=None) as batch_op:
            batch_op.add_column(sa.Column("owner_seal", sa.LargeBinary(), nullable=True))
