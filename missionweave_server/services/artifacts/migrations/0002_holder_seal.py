"""The seal of each holder row (D172, missionweave_server/services/artifacts/holder_seal.py).

Adds ``holders.holder_seal`` and seals the rows there are with the mesh token's derived key
(``mwp db upgrade`` reads the token from ``MWP_MESH_TOKEN_FILE`` or ``<data dir>/keys/mesh.token``,
or ``--mesh-token FILE``): a store with holder rows cannot be upgraded without it.

Revision artifacts_0002 (after artifacts_0001).
"""

import sqlalchemy as sa
from alembic import context, op

from missionweave_server.services.artifacts.holder_seal import HolderSeal
from missionweave_server.storage.schema_versions import SchemaMismatch

revision = "artifacts_0002"
down_revision = "artifacts_0001"
branch_labels = None
depends_on = None

# Services of an older release would go on writing holder rows without seals, which this one refuses.
online = False


def upgrade() -> None:
    conn = op.get_bind()
    # 0001 adopts tables as they are: add the column only when it is missing.
    if "holder_seal" not in {c["name"] for c in sa.inspect(conn).get_columns("holders")}:
        with op.batch_alter_table("holders", schema=None) as batch_op:
            batch_op.add_column(sa.Column("holder_seal", sa.LargeBinary(), nullable=True))
    rows = conn.execute(
        sa.text("SELECT digest, identity_id, size_bytes FROM holders WHERE holder_seal IS NULL")
    ).all()
    if not rows:
        return
    token = context.config.attributes.get("mesh_token")
    if token is None:
        raise SchemaMismatch(
            f"artifacts_0002 seals the {len(rows)} holder rows of this store with the mesh token: give it to "
            "`mwp db upgrade` (MWP_MESH_TOKEN_FILE, <data dir>/keys/mesh.token, or --mesh-token FILE)"
        )
    seal = HolderSeal(token)
    for row in rows:
        conn.execute(
            sa.text("UPDATE holders SET holder_seal = :s WHERE digest = :d AND identity_id = :i"),
            {
                "s": seal.seal(row.digest, row.identity_id, int(row.size_bytes)),
                "d": row.digest,
                "i": row.identity_id,
            },
        )
