"""Restoring a backup (``mwp restore``) into an empty place, and checking what was restored.

Before anything is written: the whole backup verifies (manifest.py), the backup's database kind
matches the target's, the data directory and the database are empty, and every blob the backup
only references is in the target's bucket. Then the blobs, the keys and certificates, and the
database last (SQLite: renamed into place; PostgreSQL: ``pg_restore --single-transaction``), so the
store appears whole or not at all; a restore that fails takes back what it wrote. Last, the
Authority's integrity check runs on the restored store, and its Group heads, blobs and events are
compared with the manifest's.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import blake3
from sqlalchemy import text

from missionweave_server.mesh.backup.files import copy_file, empty_dir, file_chunks, is_empty_dir, sync_tree
from missionweave_server.mesh.backup.manifest import BlobEntry, FileEntry, Manifest, check_backup
from missionweave_server.mesh.backup.pg_tools import libpq_env, run_tool, tool
from missionweave_server.mesh.backup.snapshot import read_snapshot
from missionweave_server.mesh.backup.store import (
    STORE_FILE,
    BackupRefused,
    BackupUsage,
    Progress,
    Store,
    connect,
    engine,
    first_line,
    shown_url,
    silent,
)
from missionweave_server.mesh.datadir_lock import LOCK_NAME, DataDirHeld, hold
from missionweave_server.mesh.maintenance import Report, verify
from missionweave_server.services.artifacts.backends import blobstore_from_config
from missionweave_server.services.artifacts.blobstore import BlobStore
from missionweave_server.storage.db import sqlite_url


@dataclass
class RestoreResult:
    manifest: Manifest
    target: Store
    report: Report
    differences: list[str]  # the restored store against the manifest (heads, blobs, events)
    blobs_written: int = 0
    blobs_present: int = 0  # referenced blobs found in the target bucket
    key_files: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.report.clean and not self.differences


def restore(
    path: Path, target: Store, *, expect_digest: str | None = None, progress: Progress | None = None
) -> RestoreResult:
    """Checks the backup at ``path`` and the target, writes the backup into the target (blobs, keys,
    then the database), and checks what was restored. BackupRefused (nothing written) when the
    backup does not verify or the target is not empty; the result says whether the restored store
    verifies and matches the manifest."""
    progress = progress or silent
    manifest = check_backup(path, expect_digest, progress)
    if manifest.dialect == "sqlite" and target.database_url:
        raise BackupUsage(
            "this backup holds a SQLite store: restore it into a data directory (no --database-url, MWP_DATABASE_URL unset)"
        )
    if manifest.dialect == "postgresql" and not target.database_url:
        raise BackupUsage(
            "this backup holds a PostgreSQL database: name the (empty) target with --database-url"
        )
    referenced = [b for b in manifest.blobs if b.how == "referenced"]
    if referenced and target.blobs.backend != "s3":
        raise BackupUsage(
            f"the backup references {len(referenced)} blobs kept in S3 (bucket {manifest.document['source'].get('bucket')}): "
            "set MWP_S3_BUCKET (and MWP_S3_ENDPOINT) to the bucket that holds them"
        )
    data_dir = target.data_dir
    if data_dir.exists() and not is_empty_dir(data_dir, ignore=(LOCK_NAME,)):
        raise BackupRefused(f"the data directory {data_dir} is not empty: restore into a new or empty one")
    asyncio.run(_target_ready(target, referenced))
    existed, had_lock = data_dir.exists(), (data_dir / LOCK_NAME).exists()
    try:
        lock = hold(data_dir, "")  # no mesh starts on it meanwhile (this creates it, 0700)
    except DataDirHeld as held:
        raise BackupRefused(str(held)) from None
    written = False
    try:
        result = asyncio.run(_restore(path, manifest, target, progress))
        written = True
    finally:
        lock.release()
        if not written:  # what was written goes again: the data directory is as it was
            if not existed:
                shutil.rmtree(data_dir, ignore_errors=True)
            else:
                empty_dir(data_dir, keep=(LOCK_NAME,))
                if not had_lock:
                    (data_dir / LOCK_NAME).unlink(missing_ok=True)
    asyncio.run(_check_restored(result, progress))
    return result


async def _target_ready(target: Store, referenced: list[BlobEntry]) -> None:
    """An empty database, and every blob the backup references in the target's bucket."""
    if target.database_url:
        await _pg_target_empty(target.database_url)
    if not referenced:
        return
    store = blobstore_from_config(target.blobs)
    try:
        missing = []
        for blob in referenced:
            stored = await store.stored_size(blob.digest)
            if stored != blob.size:
                missing.append(
                    f"blob {blob.digest} ({blob.size} bytes) is referenced by the backup but the bucket "
                    f"{target.blobs.s3_bucket} holds {'none' if stored is None else f'{stored} bytes'}"
                )
    finally:
        await store.close()
    if missing:
        raise BackupRefused(missing)


_TABLES = text(
    "SELECT table_schema, table_name FROM information_schema.tables "
    "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2"
)


async def _pg_target_empty(url: str) -> None:
    async with connect(url) as conn:
        rows = (await conn.execute(_TABLES)).all()
    if rows:
        shown = ", ".join(f"{r[0]}.{r[1]}" for r in rows[:5]) + (
            f" and {len(rows) - 5} more" if len(rows) > 5 else ""
        )
        raise BackupRefused(
            f"the database {shown_url(url)} is not empty ({shown}): restore into an empty database"
        )


async def _restore(path: Path, manifest: Manifest, target: Store, progress: Progress) -> RestoreResult:
    result = RestoreResult(manifest, target, Report(), [])
    result.blobs_present = sum(1 for b in manifest.blobs if b.how == "referenced")
    store = blobstore_from_config(target.blobs)
    try:
        await _write_all(path, manifest, target, store, result, progress)
    finally:
        await store.close()
    return result


async def _write_all(
    path: Path, manifest: Manifest, target: Store, store: BlobStore, result: RestoreResult, progress: Progress
) -> None:
    """Blobs, keys and certificates, then the database: the store appears last, whole."""
    copied = [b for b in manifest.blobs if b.how == "copied"]
    written_bytes = 0
    for done, blob in enumerate(copied):
        await _put_blob(store, path / blob.path, blob)
        written_bytes += blob.size
        result.blobs_written += 1
        progress("blobs restored", done + 1, len(copied), written_bytes)
    for entry in manifest.files:
        if entry.kind == "database":
            continue
        await _restore_file(path, entry, target.data_dir, PurePosixPath(entry.path), entry.mode)
        if entry.kind == "key":
            result.key_files += 1
    database = manifest.database_file
    if manifest.dialect == "sqlite":
        staged = PurePosixPath(STORE_FILE + ".restoring")
        await _restore_file(path, database, target.data_dir, staged, 0o600)
        os.replace(target.data_dir / staged, target.sqlite_file)
    else:
        assert target.database_url
        await run_tool(
            [
                tool("pg_restore"),
                "--no-owner",
                "--no-privileges",
                "--single-transaction",
                "--exit-on-error",
                f"--dbname={libpq_env(target.database_url).get('PGDATABASE', '')}",
                str(path / database.path),
            ],
            libpq_env(target.database_url),
        )
    await asyncio.to_thread(sync_tree, target.data_dir)


async def _restore_file(
    backup: Path, entry: FileEntry, root: Path, relative: PurePosixPath, mode: int
) -> None:
    """The backup's file ``entry`` written to ``root/relative`` with ``mode``; refused unless what was
    written is what was checked (the backup did not change meanwhile)."""
    written, hashed = await asyncio.to_thread(copy_file, backup / entry.path, root, relative, mode)
    if (written, hashed) != (entry.size, entry.blake3):
        raise BackupRefused(
            f"{entry.path} changed while it was restored ({written} bytes hashing to {hashed})"
        )


async def _put_blob(store: BlobStore, source: Path, blob: BlobEntry) -> None:
    writer = await store.open_writer(blob.digest, blob.size)
    hasher = blake3.blake3()
    try:
        for chunk in file_chunks(source):
            hasher.update(chunk)
            await writer.write(chunk)
        if hasher.hexdigest() != blob.digest:
            raise BackupRefused(f"{blob.path} changed while it was restored")
        await writer.commit()
    except BaseException:
        await writer.abort()
        raise


async def _check_restored(result: RestoreResult, progress: Progress) -> None:
    """The Authority's integrity check on the restored store, and its heads against the manifest."""
    manifest, target = result.manifest, result.target
    if not manifest.keys_included:
        result.notes.append(
            f"the backup holds no keys: put the Authority key of this store at {target.authority_key} "
            "(the mesh refuses any other: key continuity) before starting it"
        )
    url = target.database_url or sqlite_url(target.data_dir)
    key_file = target.data_dir / "keys" / "authority.key" if manifest.keys_included else target.authority_key
    if manifest.keys_included and target.authority_key.resolve() != key_file.resolve():
        result.notes.append(
            f"the Authority key was restored to {key_file}; MWP_AUTHORITY_KEY names {target.authority_key}"
        )
    try:
        result.report = await asyncio.to_thread(
            verify, url, key_file, lambda done, total, events: progress("Groups verified", done, total, 0)
        )
    except Exception as unchecked:  # a store of another release's schema (docs/upgrades.md), a database gone
        result.differences.append(f"the restored store could not be checked: {unchecked}")
    result.differences += await _compare(url, manifest)


async def _compare(url: str, manifest: Manifest) -> list[str]:
    """The restored store's Group heads, blobs and event count against the manifest's."""
    async with engine(url) as opened:
        try:
            async with opened.connect() as conn:
                restored = await conn.run_sync(read_snapshot)
        except Exception as err:
            return [f"the restored database cannot be read: {first_line(err)}"]
    differences = []
    expected = {h.group_id: h for h in manifest.heads}
    found = {h.group_id: h for h in restored.heads}
    for group_id in sorted(expected.keys() | found.keys()):
        want, got = expected.get(group_id), found.get(group_id)
        if want is None:
            differences.append(f"{group_id}: restored, but the backup's manifest names no such Group")
        elif got is None:
            differences.append(f"{group_id}: in the backup's manifest (head {want.head_seq}), not restored")
        elif (got.head_seq, got.head_hash) != (want.head_seq, want.head_hash):
            differences.append(
                f"{group_id}: the restored head is #{got.head_seq} {got.head_hash[:16]}, the backup's #{want.head_seq} {want.head_hash[:16]}"
            )
    if sorted(restored.blobs) != sorted((b.digest, b.size) for b in manifest.blobs):
        differences.append("the restored artifact index names other blobs than the backup's manifest")
    if restored.events != manifest.events:
        differences.append(f"the restored store holds {restored.events} events, the backup {manifest.events}")
    return differences
