"""``mwp backup`` and ``mwp restore`` (docs/backup.md): a consistent copy of everything a mesh
stores, taken while it serves, and brought back into an empty place.

Both work on the stores directly (the data directory, the database, the bucket), not through a
server, like ``mwp verify``; the work is done by ``missionweave_server.mesh.backup``.

Exit codes: 0 done (restore: and the restored store verifies); 1 refused (a backup that does not
verify, a target that is not empty, a blob gone from the store, ...: nothing written) or a restored
store that does not verify; 2 usage error (also: no store where one was named, a backup of one
database kind restored into the other); 3 the database cannot be reached.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from missionweave.cli.common import CliError, UsageError
from missionweave.cli.status_line import StatusLine, size_text
from missionweave_server.commands.store import StoreUnreachable, settings_of


def stage_progress(command: str) -> Callable[[str, int, int, int], None]:
    """A backup's or restore's progress through its stages (database, blobs, keys, checks)."""
    line = StatusLine(command)

    def report(stage: str, done: int, total: int, nbytes: int) -> None:
        if line.due():
            line.show(f"{stage} {done:,}/{total:,}" + (f" ({size_text(nbytes)})" if nbytes else ""))

    return report


def _refused(
    command: str, problems: list[str], args: argparse.Namespace, *, written: str = "nothing was written"
) -> CliError:
    if args.json:
        print(json.dumps({"ok": False, "refused": problems}, indent=2))
    if len(problems) == 1:
        return CliError(f"{command} refused ({written}): {problems[0]}")
    return CliError(f"{command} refused ({written}):\n" + "\n".join(f"  {p}" for p in problems))


def cmd_backup(args: argparse.Namespace) -> int:
    from missionweave_server.mesh.backup import BackupRefused, BackupUsage, DatabaseUnreachable, Store, backup

    try:
        store = Store.from_settings(settings_of(args))
        result = backup(
            Path(args.destination),
            store,
            blobs=args.blobs,
            keys=not args.no_keys,
            progress=None if args.json else stage_progress("mwp backup"),
        )
    except BackupUsage as usage:
        raise UsageError(str(usage)) from None
    except BackupRefused as refused:
        raise _refused("backup", refused.problems, args, written="nothing was kept") from None
    except DatabaseUnreachable as unreachable:
        raise StoreUnreachable(str(unreachable)) from None
    manifest = result.manifest
    counts = manifest["counts"]
    database = manifest["database"]
    database_file = next(f for f in manifest["files"] if f["kind"] == "database")
    keys = [f for f in manifest["files"] if f["kind"] == "key"]
    if args.json:
        print(
            json.dumps(
                {
                    "ok": True,
                    "backup": str(result.path.resolve()),
                    "digest": f"blake3:{result.digest}",
                    "created_at": manifest["created_at"],
                    "database": {**database, "size": database_file["size"]},
                    "blobs": {
                        "copied": counts["blobs_copied"],
                        "referenced": counts["blobs"] - counts["blobs_copied"],
                        "bytes": counts["blob_bytes"],
                    },
                    "keys": [f["path"] for f in keys],
                    "groups": counts["groups"],
                    "events": counts["events"],
                },
                indent=2,
            )
        )
        return 0
    referenced = counts["blobs"] - counts["blobs_copied"]
    print(f"backup     {result.path.resolve()} (0700)")
    print(
        f"database   {database['dialect']} {database['source']}: {database['method']}, {size_text(database_file['size'])}"
    )
    print(
        f"blobs      {counts['blobs_copied']:,} copied"
        + (f", {referenced:,} referenced in bucket {manifest['source']['bucket']}" if referenced else "")
        + f" ({size_text(counts['blob_bytes'])})"
    )
    if keys:
        print(f"keys       {', '.join(f['path'] for f in keys)}: SECRET, keep this backup private")
    else:
        print(
            "keys       none (--no-keys): keep the Authority key yourself, a restored store refuses any other"
        )
    print(f"groups     {counts['groups']:,} Groups, {counts['events']:,} events")
    print(f"digest     blake3:{result.digest}  (mwp restore --expect-digest checks it)")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from missionweave_server.mesh.backup import (
        BackupRefused,
        BackupUsage,
        DatabaseUnreachable,
        Store,
        check_backup,
        restore,
    )

    backup_dir = Path(args.backup)
    progress = None if args.json else stage_progress("mwp restore")
    try:
        if args.verify_only:
            manifest = check_backup(backup_dir, args.expect_digest, progress)
        else:
            target = Store.from_settings(settings_of(args))
            result = restore(backup_dir, target, expect_digest=args.expect_digest, progress=progress)
            manifest = result.manifest
    except BackupUsage as usage:
        raise UsageError(str(usage)) from None
    except BackupRefused as refused:
        raise _refused("restore", refused.problems, args) from None
    except DatabaseUnreachable as unreachable:
        raise StoreUnreachable(str(unreachable)) from None
    document = manifest.document
    copied = sum(1 for b in manifest.blobs if b.how == "copied")
    if args.verify_only:
        if args.json:
            print(
                json.dumps(
                    {
                        "ok": True,
                        "backup": str(backup_dir.resolve()),
                        "digest": f"blake3:{manifest.digest}",
                        "files": len(manifest.files),
                        "blobs": len(manifest.blobs),
                    },
                    indent=2,
                )
            )
            return 0
        _headline(
            backup_dir, document, manifest.digest, len(manifest.files), copied, len(manifest.blobs) - copied
        )
        print(
            "result     VERIFIED: the manifest and every file and blob hash as recorded (nothing was written)"
        )
        return 0
    report = result.report
    if args.json:
        out: dict[str, Any] = {
            "ok": result.ok,
            "backup": str(backup_dir.resolve()),
            "digest": f"blake3:{manifest.digest}",
            "created_at": document["created_at"],
            "restored": {
                "dialect": manifest.dialect,
                "database": result.target.describe_database(),
                "data_dir": str(result.target.data_dir.resolve()),
                "key_files": result.key_files,
                "blobs_written": result.blobs_written,
                "blobs_present": result.blobs_present,
            },
            "verify": report.as_dict(),
            "differences": result.differences,
            "notes": result.notes,
        }
        print(json.dumps(out, indent=2))
        return 0 if result.ok else 1
    _headline(
        backup_dir, document, manifest.digest, len(manifest.files), copied, len(manifest.blobs) - copied
    )
    target = result.target
    print(f"restored   database {manifest.dialect} {target.describe_database()}")
    if result.key_files:
        print(f"           keys {result.key_files} file(s) in {target.data_dir / 'keys'} (0600)")
    where = (
        f"bucket {target.blobs.s3_bucket}" if target.blobs.backend == "s3" else str(target.data_dir / "blobs")
    )
    print(
        f"           blobs {result.blobs_written:,} written to {where}"
        + (f", {result.blobs_present:,} referenced ones present there" if result.blobs_present else "")
    )
    for note in result.notes:
        print(f"note       {note}")
    print(
        f"checked    {report.groups:,} Groups, {report.events:,} events "
        f"({report.unlinked_events:,} from before the event chain), {report.snapshots:,} snapshots in {report.seconds:.1f} s"
    )
    if result.ok:
        print(
            "result     CLEAN: every signature, sequence, chain link and snapshot verifies; every Group's head is the backup's"
        )
        return 0
    print(
        f"result     NOT VERIFIED: {len(report.findings)} finding(s), {len(result.differences)} difference(s) from the backup"
    )
    for finding in report.findings:
        where = f"{finding.group_id} at sequence {finding.sequence}" if finding.group_id else "store"
        print(f"  {where}: {finding.detail}")
    for difference in result.differences:
        print(f"  {difference}")
    return 1


def _headline(
    path: Path, document: dict[str, Any], digest: str, files: int, copied: int, referenced: int
) -> None:
    source = document["source"]
    print(
        f"backup     {path.resolve()} (taken {document['created_at']} from {source['dialect']} {source['database']})"
    )
    print(
        f"digest     blake3:{digest}: the manifest, {files} file(s) and {copied:,} blob(s) verify"
        + (f" ({referenced:,} referenced in bucket {source.get('bucket')})" if referenced else "")
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    b = sub.add_parser(
        "backup",
        help="take a consistent copy of the store (database, blobs, keys) while the mesh serves, into a new directory",
        description="Exit codes: 0 done, 1 refused (nothing kept), 2 usage error, 3 the database cannot be reached. "
        "docs/backup.md",
    )
    b.add_argument("destination", metavar="DIR", help="a new (or empty) directory, made 0700")
    b.add_argument(
        "--data-dir",
        help="data directory (default $MWP_DATA_DIR or ./.missionweave): keys, tls/, SQLite, local blobs",
    )
    b.add_argument(
        "--database-url",
        help="PostgreSQL database URL (default $MWP_DATABASE_URL; unset: SQLite in the data directory)",
    )
    b.add_argument(
        "--authority-key",
        help="the Authority key file (default $MWP_AUTHORITY_KEY or <data dir>/keys/authority.key)",
    )
    b.add_argument(
        "--blobs",
        choices=("copy", "reference"),
        default="copy",
        help="copy every blob into the backup (default), or, with blobs in S3 (MWP_S3_BUCKET), only list them",
    )
    b.add_argument(
        "--no-keys", action="store_true", help="leave the key files and tls/ out (you keep them yourself)"
    )
    b.add_argument("--json", action="store_true", help="one JSON document (for scripts)")
    b.set_defaults(func=cmd_backup, ignores_contexts=True)

    r = sub.add_parser(
        "restore",
        help="check a backup and bring it back into an empty data directory / database, then verify it",
        description="Exit codes: 0 restored and verified, 1 refused (nothing written) or the restored store does not "
        "verify, 2 usage error, 3 the database cannot be reached. docs/backup.md",
    )
    r.add_argument("backup", metavar="BACKUP", help="the directory `mwp backup` wrote")
    r.add_argument(
        "--data-dir",
        help="the data directory to restore into, new or empty (default $MWP_DATA_DIR or ./.missionweave)",
    )
    r.add_argument(
        "--database-url",
        help="the empty PostgreSQL database to restore a PostgreSQL backup into (default $MWP_DATABASE_URL)",
    )
    r.add_argument(
        "--expect-digest",
        metavar="BLAKE3",
        help="refuse unless the manifest's digest is this one (as `mwp backup` printed it)",
    )
    r.add_argument("--verify-only", action="store_true", help="check the backup and write nothing")
    r.add_argument("--json", action="store_true", help="one JSON document (for scripts)")
    r.set_defaults(func=cmd_restore, ignores_contexts=True)
