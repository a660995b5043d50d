"""``mwp db status`` and ``mwp db upgrade``: each service's schema in a store (docs/upgrades.md);
``mwp db shards``: which Authority shard owns how many Groups (docs/operations.md, "Scaling").

Both work on the store directly, like ``mwp verify``. ``status`` exits 0 when this release can
serve the store as it is (every schema line current, or not installed yet), 1 when it cannot (an
upgrade is needed, or a newer release wrote it), 2 on a usage error, 3 when the store cannot be read.
``upgrade`` exits 0 when every line is at this release's schema, 1 when a migration was refused.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from missionweave.cli.common import CliError, UsageError
from missionweave_server.commands.store import StoreUnreachable, describe_store, store_flags, store_of


def _lines(args: argparse.Namespace) -> list[str]:
    from missionweave_server.mesh.schemas import LINES

    return list(args.service) if args.service else list(LINES)


def cmd_status(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from missionweave_server.mesh import schemas
    from missionweave_server.storage.schema_versions import State

    _, url = store_of(args)
    try:
        found = schemas.status(url, _lines(args))
    except (OSError, SQLAlchemyError) as err:
        raise StoreUnreachable(f"cannot read the store at {describe_store(url)}: {err}") from None
    except ValueError as unknown:
        raise UsageError(str(unknown)) from None
    servable = all(s.refusal() is None for s in found)
    if args.json:
        print(
            json.dumps(
                {
                    "store": describe_store(url),
                    "servable": servable,
                    "lines": [
                        {
                            "line": s.line,
                            "state": str(s.state),
                            "revision": s.revision,
                            "head": s.head,
                            "pending": [
                                {"revision": p.revision, "description": p.description, "online": p.online}
                                for p in s.pending
                            ],
                        }
                        for s in found
                    ],
                },
                indent=2,
            )
        )
        return 0 if servable else 1
    print(f"store      {describe_store(url)}")
    for s in found:
        names = ", ".join(p.revision + ("" if p.online else " (offline)") for p in s.pending)
        pending = f"  {len(s.pending)} to run: {names}" if s.pending and s.state is not State.EMPTY else ""
        print(f"  {s.line:<11} {s.state:<12} {s.revision or '-':<16} this release: {s.head}{pending}")
    if servable:
        print("result     this release can serve the store as it is")
        return 0
    refusals = [r for r in (s.refusal() for s in found) if r]
    print(
        f"result     {refusals[0]}"
        + (f" (and {len(refusals) - 1} more line(s))" if len(refusals) > 1 else "")
    )
    return 1


def cmd_upgrade(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from missionweave_server.mesh import schemas
    from missionweave_server.mesh.datadir_lock import DataDirHeld, hold
    from missionweave_server.storage.schema_versions import SchemaMismatch

    settings, url = store_of(args)
    lock = None
    if args.offline and not settings.database_url:  # the SQLite default: no mesh may serve meanwhile
        try:
            lock = hold(settings.data_dir, "")
        except DataDirHeld as held:
            raise CliError(f"--offline: stop the mesh first: {held}") from None
    started = time.monotonic()
    try:
        done = schemas.upgrade(
            url,
            _lines(args),
            offline_ok=args.offline,
            progress=None if args.json else _progress,
            secrets=_secrets(args, settings.admin_key_path, settings.mesh_token_path),
        )
    except (OSError, SQLAlchemyError) as err:
        raise StoreUnreachable(f"cannot upgrade the store at {describe_store(url)}: {err}") from None
    except SchemaMismatch as refused:
        raise CliError(f"upgrade refused: {refused}") from None
    except ValueError as unknown:
        raise UsageError(str(unknown)) from None
    finally:
        if lock is not None:
            lock.release()
    ran = sum(len(steps) for _, steps in done)
    if args.json:
        print(
            json.dumps(
                {
                    "store": describe_store(url),
                    "lines": [
                        {
                            "line": before.line,
                            "from": before.revision,
                            "state_before": str(before.state),
                            "to": before.head,
                            "ran": [step.revision for step in steps],
                        }
                        for before, steps in done
                    ],
                    "migrations": ran,
                },
                indent=2,
            )
        )
        return 0
    print(f"store      {describe_store(url)}")
    for before, steps in done:
        change = (
            f"{before.revision or before.state} -> {before.head}" if steps else f"{before.head} (already)"
        )
        print(f"  {before.line:<11} {change}")
    print(
        f"result     {ran} migration(s) in {time.monotonic() - started:.1f} s; every line is at this release's schema"
    )
    return 0


def _secrets(
    args: argparse.Namespace, default_admin_key: Path, default_mesh_token: Path
) -> dict[str, object]:
    """What migrations that vouch for older rows need from outside the store: the administrator's
    key (D170) and the mesh token (D172), from the flags, else the data directory's when there."""
    from missionweave.kernel.signing import KeyFileError, read_key
    from missionweave_server.edge.callers import load_or_create_mesh_token

    found: dict[str, object] = {}
    admin_key = Path(args.admin_key) if args.admin_key else default_admin_key
    if args.admin_key or admin_key.exists():
        try:
            found["admin_key"] = read_key(admin_key)
        except (OSError, KeyFileError) as err:
            raise UsageError(f"--admin-key: {err}") from None
    token = Path(args.mesh_token) if args.mesh_token else default_mesh_token
    if args.mesh_token or token.exists():
        if not token.exists():
            raise UsageError(f"--mesh-token: no such file: {token}")
        try:
            found["mesh_token"] = load_or_create_mesh_token(token)
        except (OSError, ValueError) as err:
            raise UsageError(f"--mesh-token: {err}") from None
    return found


def cmd_shards(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from missionweave_server.mesh.shard_report import shard_report

    _, url = store_of(args)
    try:
        rows = shard_report(url)
    except (OSError, SQLAlchemyError) as err:
        raise StoreUnreachable(
            f"cannot read the Groups in the store at {describe_store(url)}: {err}"
        ) from None
    if args.json:
        print(json.dumps({"store": describe_store(url), "shards": [vars(r) for r in rows]}, indent=2))
        return 0
    print(f"store      {describe_store(url)}")
    print(f"  {'instance':<16} {'address':<40} {'announced':<16} {'Groups':>7} {'lease lapsed':>13}")
    for r in rows:
        ago = r.announced_s_ago
        announced = "-" if not r.address else "retired" if ago is None else f"{ago:.1f} s ago"
        print(f"  {r.instance_id:<16} {r.address or '-':<40} {announced:<16} {r.groups:>7} {r.lapsed:>13}")
    print(
        f"result     {sum(r.groups for r in rows)} Groups on {sum(1 for r in rows if r.groups)} instance(s)"
    )
    return 0


def _progress(line: str, revision: str) -> None:
    print(f"mwp db upgrade: {line}: applied {revision}", file=sys.stderr, flush=True)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    db = sub.add_parser(
        "db", help="the store: each service's schema (status, upgrade) and the Groups per shard"
    ).add_subparsers(dest="sub", required=True)
    s = db.add_parser(
        "status",
        help="each schema line's revision in the store and what an upgrade would run",
        description="Exit codes: 0 this release can serve the store as it is, 1 it cannot (upgrade needed, "
        "or a newer release wrote it), 2 usage error, 3 the store cannot be read.",
    )
    u = db.add_parser(
        "upgrade",
        help="run the migrations the store lacks (online ones while the mesh serves)",
        description="Exit codes: 0 every line is at this release's schema, 1 a migration was refused, "
        "2 usage error, 3 the store cannot be read.",
    )
    sh = db.add_parser(
        "shards",
        help="each Authority instance's last announcement and how many Groups it owns",
        description="Read only. With heartbeats (MWP_REBALANCE_INTERVAL_S) a live shard announced itself "
        "within a few rounds; 'retired' is a shard stopped gracefully. Exit codes: 0 read, 2 usage error, "
        "3 the store cannot be read.",
    )
    for p in (s, u, sh):
        store_flags(p, authority_key=False)
        p.add_argument("--json", action="store_true", help="one JSON document (for scripts)")
    for p in (s, u):
        p.add_argument("--service", action="append", help="only this schema line (repeatable; default: all)")
    u.add_argument(
        "--offline", action="store_true", help="also run migrations that need every service stopped"
    )
    u.add_argument(
        "--admin-key",
        help="the Organization administrator's key file, for a migration that vouches for existing identities "
        "(default <data dir>/keys/admin.key when present)",
    )
    u.add_argument(
        "--mesh-token",
        help="the mesh token file, for a migration that seals existing holder rows "
        "(default $MWP_MESH_TOKEN_FILE or <data dir>/keys/mesh.token when present)",
    )
    s.set_defaults(func=cmd_status, ignores_contexts=True)
    u.set_defaults(func=cmd_upgrade, ignores_contexts=True)
    sh.set_defaults(func=cmd_shards, ignores_contexts=True)
