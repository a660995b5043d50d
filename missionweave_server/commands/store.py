"""The store an offline operator command works on (``mwp verify``, ``mwp authority``, ``mwp db``):
a data directory (the SQLite default) or a database URL, named by flags or the serve variables."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from missionweave.cli.common import CliError, UsageError

if TYPE_CHECKING:  # imported when a store command runs: `mwp` registers these commands at every start
    from missionweave_server.config import Settings


class StoreUnreachable(CliError):
    exit_code = 3


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings ``MWP_*`` name, with the store flags' overrides."""
    from missionweave_server.config import Settings

    settings = Settings.from_env()
    if args.data_dir:
        settings.data_dir = Path(args.data_dir)
    if args.database_url:
        settings.database_url = args.database_url
    if getattr(args, "authority_key", None):
        settings.authority_key = Path(args.authority_key)
    return settings


def store_of(args: argparse.Namespace) -> tuple[Settings, str]:
    """The settings the flags and ``MWP_*`` name, and the store's URL (UsageError: no store there)."""
    settings = settings_of(args)
    if not settings.database_url and not (settings.data_dir / "missionweave.db").exists():
        raise UsageError(
            f"no store in {settings.data_dir} (missionweave.db); name one with --data-dir or --database-url"
        )
    return settings, settings.db_url


def describe_store(url: str) -> str:
    """The store's URL without credentials (the host and database, or the SQLite file)."""
    return url.split("@")[-1] if "@" in url else url.split("///")[-1]


def store_flags(p: argparse.ArgumentParser, *, authority_key: bool = True) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--data-dir", help="data directory (default $MWP_DATA_DIR or ./.missionweave)")
    where.add_argument("--database-url", help="database URL (default SQLite in the data directory)")
    if authority_key:
        p.add_argument(
            "--authority-key",
            help="the Authority key file (default $MWP_AUTHORITY_KEY or <data dir>/keys/authority.key)",
        )
