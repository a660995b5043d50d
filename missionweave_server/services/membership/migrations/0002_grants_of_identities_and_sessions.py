"""Grants of identities and sessions (D170): each row carries the signed request that granted it.

Rows written before this revision have none: the Organization administrator's key vouches for
each of them here (``mwp db upgrade`` reads it from ``<data dir>/keys/admin.key`` or
``--admin-key``), as it stands at the upgrade. A store with such rows cannot be upgraded without it.

Revision membership_0002 (after membership_0001).
"""

import time

import sqlalchemy as sa
from alembic import context, op

from missionweave_server.services.membership.grants import GrantedIdentity, attest_identity, attest_session
from missionweave_server.storage.schema_versions import SchemaMismatch

revision = "membership_0002"
down_revision = "membership_0001"
branch_labels = None
depends_on = None

# Services of an older release would go on writing rows without grants, which this one refuses.
online = False


def upgrade() -> None:
    conn = op.get_bind()
    for table in ("identities", "sessions"):  # 0001 adopts tables as they are: add only what is missing
        if "grant_envelope" not in {c["name"] for c in sa.inspect(conn).get_columns(table)}:
            with op.batch_alter_table(table, schema=None) as batch_op:
                batch_op.add_column(sa.Column("grant_envelope", sa.LargeBinary(), nullable=True))

    identities = conn.execute(
        sa.text(
            "SELECT identity_id, kind, display_name, public_key, org_admin FROM identities "
            "WHERE grant_envelope IS NULL ORDER BY identity_id"
        )
    ).all()
    sessions = conn.execute(
        sa.text("SELECT identity_id, session_epoch, public_key FROM sessions WHERE grant_envelope IS NULL")
    ).all()
    if not identities and not sessions:
        return
    admin_key = context.config.attributes.get("admin_key")
    if admin_key is None:
        raise SchemaMismatch(
            f"membership_0002 vouches for the {len(identities)} identities and {len(sessions)} sessions of this "
            "store with the Organization administrator's key: give it to `mwp db upgrade` "
            "(<data dir>/keys/admin.key, or --admin-key FILE)"
        )
    now_us = time.time_ns() // 1000
    for row in identities:
        granted = GrantedIdentity(
            row.identity_id, int(row.kind), row.display_name, bytes(row.public_key), bool(row.org_admin)
        )
        conn.execute(
            sa.text("UPDATE identities SET grant_envelope = :g WHERE identity_id = :i"),
            {"g": attest_identity(admin_key, granted, now_us), "i": row.identity_id},
        )
    for row in sessions:
        conn.execute(
            sa.text("UPDATE sessions SET grant_envelope = :g WHERE identity_id = :i AND session_epoch = :e"),
            {
                "g": attest_session(admin_key, row.identity_id, bytes(row.public_key), now_us),
                "i": row.identity_id,
                "e": row.session_epoch,
            },
        )
