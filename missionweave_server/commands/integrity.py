"""``mwp verify`` and ``mwp authority ...``: the store's integrity, offline (docs/integrity.md).

Both work on the store directly (a data directory or a database URL), not through a server:
``verify`` to check a store whether or not an Authority runs on it, ``rotate-key`` while every
Authority on the store is stopped (the data directory's lock is taken for the SQLite default).

``mwp verify`` exits 0 when the store is clean, 1 when it found corruption, 2 on a usage error
(also: no store where one was named), 3 when the database could not be opened.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from missionweave.cli.common import CliError
from missionweave.cli.status_line import StatusLine, size_text
from missionweave_server.commands.store import StoreUnreachable, describe_store, store_flags, store_of


def groups_progress(line: StatusLine) -> Callable[[int, int, int], None]:
    """``mwp verify``'s progress through the Authority's logs."""

    def report(done: int, total: int, events: int) -> None:
        if line.due():
            line.show(f"{done:,}/{total:,} Groups, {events:,} events checked")

    return report


def blobs_progress(line: StatusLine) -> Callable[[int, int, int, int], None]:
    """``mwp verify``'s progress through the stored blobs."""

    def report(done: int, total: int, done_bytes: int, total_bytes: int) -> None:
        if line.due():
            line.show(
                f"{done:,}/{total:,} blobs, {size_text(done_bytes)} of {size_text(total_bytes)} checked"
            )

    return report


def cmd_verify(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from missionweave.kernel.signing import KeyFileError
    from missionweave_server.mesh.maintenance import (
        blob_location,
        verify,
        verify_granting_rows,
        verify_stored_blobs,
    )

    settings, url = store_of(args)
    progress = None if args.json else groups_progress(StatusLine("mwp verify"))
    try:
        report = verify(url, settings.authority_key_path, progress)
    except (OSError, SQLAlchemyError) as err:
        raise StoreUnreachable(f"cannot read the store at {describe_store(url)}: {err}") from None
    admin_key = Path(args.admin_key) if args.admin_key else settings.admin_key_path
    if args.admin_key and not admin_key.exists():
        raise CliError(f"--admin-key: no such file: {admin_key}")
    try:
        grants = verify_granting_rows(url, admin_key, settings.mesh_token_path)
    except (OSError, SQLAlchemyError) as err:
        raise StoreUnreachable(f"cannot read the membership tables at {describe_store(url)}: {err}") from None
    except KeyFileError as err:
        raise CliError(f"--admin-key: {err}") from None
    blobs = None
    if not args.no_blobs:
        try:
            blobs = verify_stored_blobs(
                url, settings.data_dir, None if args.json else blobs_progress(StatusLine("mwp verify"))
            )
        except (OSError, SQLAlchemyError) as err:
            raise StoreUnreachable(
                f"cannot read the artifact index at {describe_store(url)}: {err}"
            ) from None
        except (
            ValueError
        ) as err:  # a misconfigured blob store (MWP_S3_*), an index at another schema revision
            raise StoreUnreachable(
                f"cannot check the blobs in {blob_location(settings.data_dir)}: {err}"
            ) from None
    clean = report.clean and (blobs is None or blobs.clean) and (grants is None or grants.clean)
    if args.json:
        document = {
            "store": describe_store(url),
            **report.as_dict(),
            "clean": clean,
            "logs_clean": report.clean,
        }
        document["grants"] = grants.as_dict() if grants is not None else None
        document["blobs"] = blobs.as_dict() if blobs is not None else None
        print(json.dumps(document, indent=2))
        return 0 if clean else 1
    print(f"store      {describe_store(url)}")
    print(
        f"keys       {', '.join(report.keys) or '(none)'}"
        + ("  (last: current)" if len(report.keys) > 1 else "")
    )
    print(
        f"checked    {report.groups:,} Groups, {report.events:,} events "
        f"({report.unlinked_events:,} from before the event chain), {report.snapshots:,} snapshots in {report.seconds:.1f} s"
    )
    if grants is None:
        print(f"grants     not checked: no administrator key at {admin_key} (--admin-key FILE)")
    else:
        print(
            f"grants     {grants.identities:,} identities, {grants.sessions:,} sessions, "
            f"{grants.holders:,} holders ({grants.seconds:.1f} s)"
        )
    if blobs is None:
        print("blobs      not checked (--no-blobs)")
    elif not blobs.indexed:
        print("blobs      none: this store has no artifact index")
    else:
        print(
            f"blobs      {blobs.blobs:,} blobs, {size_text(blobs.bytes)} in {blobs.location} ({blobs.seconds:.1f} s)"
        )
    if clean:
        print(
            "result     CLEAN: every signature, sequence, chain link and snapshot verifies"
            + ("" if grants is None else "; every identity and session matches the request that granted it")
            + (
                ""
                if blobs is None or not blobs.blobs
                else "; every blob is stored, of its size, hashing to its name"
            )
        )
        return 0
    groups = f", {len(report.corrupted_groups)} Group(s)" if report.corrupted_groups else ""
    blob_count = f", {len(blobs.findings)} blob(s)" if blobs is not None and blobs.findings else ""
    grant_count = (
        f", {len(grants.findings)} granting row(s)" if grants is not None and grants.findings else ""
    )
    findings = len(report.findings) + (len(blobs.findings) if blobs is not None else 0)
    findings += len(grants.findings) if grants is not None else 0
    print(f"result     CORRUPTED: {findings} finding(s){groups}{grant_count}{blob_count}")
    for finding in report.findings:
        where = f"{finding.group_id} at sequence {finding.sequence}" if finding.group_id else "store"
        print(f"  {where}: {finding.detail}")
    for grant in grants.findings if grants is not None else ():
        where = (
            f"{grant.identity_id} session {grant.session_epoch}"
            if grant.what == "session"
            else grant.identity_id
        )
        print(f"  {grant.what} {where}: {grant.detail}")
    for blob in blobs.findings if blobs is not None else ():
        print(f"  blob blake3:{blob.digest} ({blob.size_bytes:,} bytes): {blob.problem}: {blob.detail}")
    return 1


def cmd_rotate_key(args: argparse.Namespace) -> int:
    from missionweave_server.mesh.datadir_lock import DataDirHeld, hold
    from missionweave_server.mesh.maintenance import KeyContinuityError, rotate_key

    settings, url = store_of(args)
    lock = None
    if not settings.database_url:  # the SQLite default: no mesh may hold the data directory meanwhile
        try:
            lock = hold(settings.data_dir, "")
        except DataDirHeld as held:
            raise CliError(f"stop the mesh first: {held}") from None
    try:
        result = rotate_key(
            url,
            settings.authority_key_path,
            Path(args.old_key) if args.old_key else None,
            Path(args.new_key) if args.new_key else None,
            args.reason or "",
        )
    except KeyContinuityError as refused:
        raise CliError(f"rotation refused: {refused}") from None
    finally:
        if lock is not None:
            lock.release()
    print(f"recorded the rotation {result.previous_key_id} -> {result.key_id} (signed by both keys)")
    if result.installed is not None:
        print(f"new key file {result.installed} (mode 0600); the old one is kept as {result.retired}")
    elif args.new_key:
        print(f"start the Authority with {args.new_key} (MWP_AUTHORITY_KEY); it refuses any other key now")
    print(f"key history: {', '.join(r.key_id for r in result.history.records)}")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from missionweave_server.mesh.maintenance import key_history

    _, url = store_of(args)
    history = key_history(url)
    for record in history.records:
        print(
            f"{record.position}  {record.key_id}  {record.public_key.hex()}"
            + ("  (current)" if record is history.current else "")
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    v = sub.add_parser(
        "verify",
        help="check a whole store offline: signatures, sequences, the event chain, snapshots, key history, "
        "the grants of identities and sessions, every stored blob",
        description="Exit codes: 0 clean, 1 corruption found, 2 usage error, 3 the store cannot be read.",
    )
    store_flags(v)
    v.add_argument("--json", action="store_true", help="one JSON document (for scripts)")
    v.add_argument(
        "--no-blobs",
        action="store_true",
        help="skip the blob pass (every blob the artifact index names, read from the blob store: "
        "$MWP_DATA_DIR/blobs, or S3 with MWP_S3_BUCKET)",
    )
    v.add_argument(
        "--admin-key",
        help="the Organization administrator's key file, the root of every identity's grant "
        "(default <data dir>/keys/admin.key; without it the grants are not checked)",
    )
    v.set_defaults(func=cmd_verify, ignores_contexts=True)

    authority = sub.add_parser("authority", help="the Authority's signing key").add_subparsers(
        dest="sub", required=True
    )
    r = authority.add_parser(
        "rotate-key",
        help="record a rotation of the Authority key, signed by the old key (stop the Authority first)",
    )
    store_flags(r)
    r.add_argument(
        "--old-key", help="the current key's file, when the configured key file already holds the new key"
    )
    r.add_argument(
        "--new-key", help="the new key's file (default: generate one and put it in place of the old)"
    )
    r.add_argument("--reason", help="why (recorded in the signed rotation, at most 512 characters)")
    r.set_defaults(func=cmd_rotate_key, ignores_contexts=True)
    k = authority.add_parser("keys", help="the store's recorded key history, oldest first")
    store_flags(k)
    k.set_defaults(func=cmd_keys, ignores_contexts=True)
