"""``make migration LINE=<line> MESSAGE="what changes"``: write the next migration of a schema line.

Alembic compares the line's tables as the code now declares them (``<service>/schema.py``) with a
scratch store built by the line's migrations so far, and writes the difference as
``<migrations>/<NNNN>_<slug>.py``. Read it, set ``online`` (may the services serve while it runs?),
add any data it must move, and commit it with the change to the tables (docs/upgrades.md).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine

from missionweave_server.mesh.schemas import LINES
from missionweave_server.storage import schema_versions
from missionweave_server.storage.db import make_engine


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("line", choices=list(LINES))
    parser.add_argument("message", help="what the migration changes, in a few words")
    args = parser.parse_args()
    line = LINES[args.line]
    number = len(schema_versions.steps(line, None)) + 1
    revision = f"{line.name}_{number:04d}"
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{scratch}/scratch.db"

        async def build() -> None:
            engine = make_engine(url.replace("sqlite://", "sqlite+aiosqlite://"))
            await schema_versions.prepare(engine, [line])
            await engine.dispose()

        asyncio.run(build())
        config = Config()
        config.set_main_option("script_location", str(schema_versions.ENV_DIR))
        config.set_main_option("version_locations", str(line.migrations))
        config.set_main_option("path_separator", "os")
        with create_engine(url).connect() as conn:
            config.attributes.update(connection=conn, line=line)
            script = command.revision(
                config,
                message=args.message,
                autogenerate=True,
                rev_id=revision,
                version_path=str(line.migrations),
            )
    assert script is not None and not isinstance(script, list)
    written = Path(script.path)
    slug = re.sub(r"[^a-z0-9]+", "_", args.message.lower()).strip("_")[:40]
    target = written.with_name(f"{number:04d}_{slug}.py")
    written.rename(target)
    print(
        f"wrote {target}: read it, set `online`, and commit it with the change to the tables", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
