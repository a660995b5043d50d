"""PostgreSQL's client tools as the backup runs them: ``pg_dump`` (snapshot.py) and ``pg_restore``
(restore.py), found on PATH, given the connection as libpq's environment (so that the password
never appears in argv), and run with their stderr kept for the refusal when they fail.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

from sqlalchemy.engine import make_url

from missionweave_server.mesh.backup.store import BackupRefused


def libpq_env(url: str) -> dict[str, str]:
    """The connection as libpq's variables: the password travels in PGPASSWORD, never in argv."""
    parsed = make_url(url)
    env = dict(os.environ)
    for name, value in (
        ("PGHOST", parsed.host),
        ("PGPORT", parsed.port),
        ("PGUSER", parsed.username),
        ("PGPASSWORD", parsed.password),
        ("PGDATABASE", parsed.database),
    ):
        if value:
            env[name] = str(value)
    ssl = parsed.query.get("sslmode") or parsed.query.get("ssl")
    if isinstance(ssl, str) and ssl in ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"):
        env["PGSSLMODE"] = ssl
    env.setdefault("PGCONNECT_TIMEOUT", "10")
    env["PGAPPNAME"] = "mwp backup"
    return env


def tool(name: str) -> str:
    """The path of PostgreSQL's client tool ``name``; BackupRefused when it is not on PATH."""
    found = shutil.which(name)
    if found is None:
        raise BackupRefused(
            f"{name} is not on PATH: install PostgreSQL's client tools (of the server's major version or newer)"
        )
    return found


async def run_tool(argv: list[str], env: dict[str, str]) -> None:
    """Runs ``argv``; BackupRefused with the last lines of its stderr when it fails."""
    process = await asyncio.create_subprocess_exec(
        *argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, err = await process.communicate()
    if process.returncode != 0:
        detail = err.decode(errors="replace").strip().splitlines()
        raise BackupRefused(
            f"{Path(argv[0]).name} failed (exit {process.returncode}): {' / '.join(detail[-5:])}"
        )
