"""Taking a backup (``mwp backup``): the database at one instant first (snapshot.py), then exactly
the blobs that snapshot names, then the key files and the throw-away certificates, and the manifest
last (manifest.py).

A blob is stored before its index row is written and never changes (its name is its BLAKE3), so
every blob the snapshot names is in the store when the copy begins; one that is gone (removed
meanwhile) or that does not hash to its name fails the backup, and a backup that fails leaves
nothing behind.
"""

from __future__ import annotations

import asyncio
import shutil
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import missionweave
from missionweave.kernel.digests import EMPTY_BLAKE3
from missionweave_server.mesh.backup.files import (
    copy_file,
    empty_dir,
    file_chunks,
    hash_file,
    is_empty_dir,
    private_dirs,
    sync_tree,
    write_file,
    write_stream,
)
from missionweave_server.mesh.backup.manifest import (
    FORMAT,
    PG_DUMP_FILE,
    SQLITE_FILE,
    VERSION,
    BlobEntry,
    FileEntry,
    write_manifest,
)
from missionweave_server.mesh.backup.snapshot import pg_backup, sqlite_backup, sqlite_snapshot
from missionweave_server.mesh.backup.store import (
    STORE_FILE,
    BackupRefused,
    BackupUsage,
    Progress,
    Store,
    silent,
)
from missionweave_server.services.artifacts.backends import blobstore_from_config
from missionweave_server.services.artifacts.blobstore import BlobStore, check_digest


@dataclass
class BackupResult:
    path: Path
    manifest: dict[str, Any]

    @property
    def digest(self) -> str:
        return str(self.manifest["digest"])


def backup(
    destination: Path,
    source: Store,
    *,
    blobs: str = "copy",
    keys: bool = True,
    progress: Progress | None = None,
) -> BackupResult:
    """Takes a backup of ``source`` into ``destination`` (a new or empty directory). ``blobs``:
    ``copy`` (default) or ``reference`` (S3 only: the manifest lists them, the bucket keeps them).
    ``keys``: include the key files (refused when the Authority key is missing)."""
    if blobs not in ("copy", "reference"):
        raise BackupUsage(f"--blobs is copy or reference, not {blobs!r}")
    if blobs == "reference" and source.blobs.backend != "s3":
        raise BackupUsage(
            "--blobs reference needs blobs in S3 (MWP_S3_BUCKET): blobs on local disk are copied"
        )
    if source.dialect == "sqlite" and not source.sqlite_file.is_file():
        raise BackupUsage(
            f"no store in {source.data_dir} ({STORE_FILE}); name one with --data-dir or --database-url"
        )
    if keys and not source.authority_key.is_file():
        raise BackupRefused(
            f"the Authority key {source.authority_key} does not exist: a store restored without its key cannot be "
            "served (key continuity); name it with --authority-key, or pass --no-keys if you keep the keys elsewhere"
        )
    if destination.exists() and not is_empty_dir(destination):
        raise BackupRefused(
            f"{destination} exists and is not an empty directory: a backup goes into a new one"
        )
    created = not destination.exists()
    destination.mkdir(parents=True, mode=0o700, exist_ok=True)
    destination.chmod(0o700)
    try:
        document = asyncio.run(_take(destination, source, blobs, keys, progress or silent))
    except BaseException:
        if created:
            shutil.rmtree(destination, ignore_errors=True)
        else:
            empty_dir(destination)
        raise
    return BackupResult(destination, document)


async def _take(
    destination: Path, source: Store, how: str, with_keys: bool, progress: Progress
) -> dict[str, Any]:
    files: list[FileEntry] = []
    database: dict[str, Any] = {"dialect": source.dialect, "source": source.describe_database()}
    # 1. The database, at one instant.
    if source.dialect == "sqlite":
        relative = PurePosixPath(SQLITE_FILE)
        copy = private_dirs(destination, relative)
        await asyncio.to_thread(sqlite_backup, source.sqlite_file, copy)
        snapshot = await asyncio.to_thread(sqlite_snapshot, copy)
        database["method"] = "sqlite3 online backup API (one read transaction)"
    else:
        relative = PurePosixPath(PG_DUMP_FILE)
        copy = private_dirs(destination, relative)
        snapshot, snapshot_id = await pg_backup(source.database_url, copy)
        database["method"] = "pg_dump --format=custom --no-owner --no-privileges --snapshot (REPEATABLE READ)"
        database["snapshot"] = snapshot_id
    copy.chmod(0o600)
    size, digest = await asyncio.to_thread(hash_file, copy)
    files.append(FileEntry(str(relative), size, digest, 0o600, "database"))
    database["file"] = str(relative)
    # 2. The blobs it names, after it.
    blob_entries = await _copy_blobs(destination, source, snapshot.blobs, how, progress)
    # 3. The keys and the throw-away certificates (whose CA key is as secret as the keys).
    if with_keys:
        files += _copy_keys(destination, source)
        files += _copy_tree(destination, source.data_dir / "tls", "tls")
    document: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "missionweave": missionweave.__version__,
        "source": {
            "dialect": source.dialect,
            "data_dir": str(source.data_dir.resolve()),
            "database": source.describe_database(),
            "blob_backend": source.blobs.backend,
            "bucket": source.blobs.s3_bucket,
            "endpoint": source.blobs.s3_endpoint,
            "region": source.blobs.s3_region,
        },
        "database": database,
        # Each schema line's revision at the snapshot (docs/upgrades.md): a backup of an older release
        # restores as it was and is then upgraded by `mwp db upgrade`.
        "schema": snapshot.schema,
        "keys_included": with_keys,
        "files": [f.as_dict() for f in files],
        "blobs": [b.as_dict() for b in blob_entries],
        "groups": [h.as_dict() for h in snapshot.heads],
        "counts": {
            "groups": len(snapshot.heads),
            "events": snapshot.events,
            "blobs": len(blob_entries),
            "blob_bytes": sum(b.size for b in blob_entries),
            "blobs_copied": sum(1 for b in blob_entries if b.how == "copied"),
            "files": len(files),
        },
    }
    write_manifest(destination, document)  # last: a directory without it is no backup
    await asyncio.to_thread(sync_tree, destination)
    return document


async def _copy_blobs(
    destination: Path, source: Store, named: list[tuple[str, int]], how: str, progress: Progress
) -> list[BlobEntry]:
    entries: list[BlobEntry] = []
    s3: BlobStore | None = blobstore_from_config(source.blobs) if source.blobs.backend == "s3" else None
    copied_bytes = 0
    try:
        for done, (digest, size) in enumerate(named):
            check_digest(digest)
            if how == "reference":
                assert s3 is not None
                stored = await s3.stored_size(digest)
                if stored != size:
                    raise BackupRefused(_gone(digest, size, stored, f"bucket {source.blobs.s3_bucket}"))
                entries.append(BlobEntry(digest, size, "referenced"))
            else:
                entry = BlobEntry(digest, size, "copied")
                target = private_dirs(destination, PurePosixPath(entry.path))
                await _copy_blob(source, s3, digest, size, target)
                entries.append(entry)
                copied_bytes += size
            progress("blobs", done + 1, len(named), copied_bytes)
    finally:
        if s3 is not None:
            await s3.close()
    return entries


def _gone(digest: str, size: int, stored: int | None, where: str) -> str:
    if stored is None:
        return (
            f"blob {digest} ({size} bytes) is named by the database snapshot but is not in the {where}: was it removed "
            "after the snapshot? A backup without it would not restore; take the backup again"
        )
    return f"the {where} holds {stored} bytes for blob {digest}, the artifact index {size}: the blob store is damaged"


async def _copy_blob(source: Store, s3: BlobStore | None, digest: str, size: int, target: Path) -> None:
    where = (
        f"bucket {source.blobs.s3_bucket}" if s3 is not None else f"blob store {source.data_dir / 'blobs'}"
    )
    if digest == EMPTY_BLAKE3 and size == 0:  # the empty blob is always present, never stored
        written, hashed = await asyncio.to_thread(write_file, target, (), 0o600)
    elif s3 is None:
        path = source.data_dir / "blobs" / digest[:2] / digest[2:4] / digest
        try:
            stored: int | None = path.stat().st_size
        except FileNotFoundError:
            stored = None
        if stored != size:
            raise BackupRefused(_gone(digest, size, stored, where))
        written, hashed = await asyncio.to_thread(write_file, target, file_chunks(path), 0o600)
    else:
        try:
            written, hashed = await write_stream(target, s3.read(digest, size), 0o600)
        except KeyError:
            await asyncio.to_thread(target.unlink, missing_ok=True)
            raise BackupRefused(_gone(digest, size, None, where)) from None
    if written != size or hashed != digest:
        await asyncio.to_thread(target.unlink, missing_ok=True)
        raise BackupRefused(
            f"blob {digest} in the {where} does not hash to its name ({written} bytes hashing to {hashed}): "
            "the blob store is damaged; nothing was backed up"
        )


def _copy_keys(destination: Path, source: Store) -> list[FileEntry]:
    """Every file in ``<data dir>/keys/``, and the Authority key and mesh token wherever they are
    configured (as ``keys/authority.key`` and ``keys/mesh.token``), each 0600."""
    wanted: dict[str, Path] = {}
    keys_dir = source.data_dir / "keys"
    if keys_dir.is_dir():
        for path in sorted(keys_dir.iterdir()):
            if path.is_file():
                wanted[path.name] = path
    wanted["authority.key"] = source.authority_key
    if source.mesh_token.is_file():
        wanted["mesh.token"] = source.mesh_token
    return [
        _copy_in(destination, path, PurePosixPath("keys") / name, 0o600, "key")
        for name, path in sorted(wanted.items())
    ]


def _copy_tree(destination: Path, root: Path, kind: str) -> list[FileEntry]:
    """Every regular file under ``root`` (none when it does not exist), with its mode."""
    if not root.is_dir():
        return []
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = PurePosixPath(kind) / path.relative_to(root).as_posix()
        entries.append(_copy_in(destination, path, relative, stat.S_IMODE(path.stat().st_mode) & 0o777, kind))
    return entries


def _copy_in(destination: Path, path: Path, relative: PurePosixPath, mode: int, kind: str) -> FileEntry:
    """``path`` copied into the backup as ``relative`` (0600 there, whatever it is): its entry, with
    the ``mode`` it is restored with."""
    size, digest = copy_file(path, destination, relative, 0o600)
    return FileEntry(str(relative), size, digest, mode, kind)
