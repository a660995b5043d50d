"""${message}

Revision ${up_revision} (after ${down_revision | comma,n}), written ${create_date}.
"""

import sqlalchemy as sa
from alembic import op

${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None

# May the services keep serving while this runs? Say why in one line when it is False
# (docs/upgrades.md "Writing a migration").
online = True


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}
