"""The backup's manifest: what a backup holds and how it is checked.

``manifest.json`` names every file (with its kind, size, mode and BLAKE3), every blob (copied into
the backup or referenced in a bucket), every Group's head and each schema line's revision at the
snapshot. Its ``digest`` is BLAKE3 of its canonical JSON without that field (an integrity hash: it
finds damage, not a forger who re-hashes; ``mwp restore --expect-digest`` is for that). It is
written last, so a directory without it is no backup.

Here are the manifest's format (its entries, canonical JSON and digest), writing it, and reading
one back: parsing it (no path it names reaches the filesystem unchecked) and checking the backup
it describes, every file and copied blob against its size and hash.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import blake3

from missionweave_server.mesh.backup.files import hash_file, write_file
from missionweave_server.mesh.backup.store import BackupRefused, Progress, silent
from missionweave_server.services.artifacts.blobstore import check_digest

FORMAT = "missionweave-backup"
VERSION = 1
MANIFEST = "manifest.json"
SQLITE_FILE = "database/missionweave.db"
PG_DUMP_FILE = "database/postgres.dump"
# Where a backup may put files (a manifest naming anything else is refused): no path of a manifest
# ever reaches the filesystem unchecked.
FILE_KINDS = {"database": "database/", "key": "keys/", "tls": "tls/"}


def canonical(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def manifest_digest(document: dict[str, Any]) -> str:
    """BLAKE3 of the manifest's canonical JSON without its ``digest`` field."""
    return blake3.blake3(canonical({k: v for k, v in document.items() if k != "digest"})).hexdigest()


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, POSIX
    size: int
    blake3: str
    mode: int
    kind: str  # database | key | tls

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "blake3": self.blake3,
            "mode": f"{self.mode:04o}",
            "kind": self.kind,
        }


@dataclass(frozen=True)
class BlobEntry:
    digest: str
    size: int
    how: str  # copied | referenced

    @property
    def path(self) -> str:
        return f"blobs/{self.digest[:2]}/{self.digest[2:4]}/{self.digest}"

    def as_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "size": self.size, "how": self.how}


@dataclass(frozen=True)
class GroupHead:
    group_id: str
    head_seq: int
    head_hash: str  # hex of the head event's chain value (eventlog.link_of); "" when there is none

    def as_dict(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "head_seq": self.head_seq, "head_hash": self.head_hash}


@dataclass
class Manifest:
    document: dict[str, Any]
    dialect: str
    files: list[FileEntry]
    blobs: list[BlobEntry]
    heads: list[GroupHead]
    keys_included: bool

    @property
    def digest(self) -> str:
        return str(self.document["digest"])

    @property
    def database_file(self) -> FileEntry:
        return next(f for f in self.files if f.kind == "database")

    @property
    def events(self) -> int:
        return int(self.document.get("counts", {}).get("events", 0))


def write_manifest(destination: Path, document: dict[str, Any]) -> None:
    """``document``, given its ``digest``, as the manifest of the backup in ``destination``: staged
    beside it and renamed into place, so that a backup holds a whole manifest or none."""
    document["digest"] = manifest_digest(document)
    staged = destination / (MANIFEST + ".part")
    write_file(staged, [json.dumps(document, indent=2).encode() + b"\n"], 0o600)
    os.replace(staged, destination / MANIFEST)


def check_backup(path: Path, expect_digest: str | None = None, progress: Progress | None = None) -> Manifest:
    """The backup's manifest, once the manifest's digest, every file's size and BLAKE3 and every
    copied blob's BLAKE3 (its name) verify; BackupRefused naming every difference otherwise."""
    progress = progress or silent
    manifest = _read_manifest(path, expect_digest)
    stages = [
        ("files checked", [(f.path, f.size, f.blake3) for f in manifest.files]),
        ("blobs checked", [(b.path, b.size, b.digest) for b in manifest.blobs if b.how == "copied"]),
    ]
    problems: list[str] = []
    checked_bytes = 0
    for stage, entries in stages:
        for done, (name, size, digest) in enumerate(entries):
            problems += _check_file(path / name, name, size, digest)
            checked_bytes += size
            progress(stage, done + 1, len(entries), checked_bytes)
    if problems:
        raise BackupRefused(problems)
    return manifest


def _check_file(path: Path, name: str, size: int, digest: str) -> list[str]:
    try:
        if path.is_symlink() or not path.is_file():
            return [f"{name} is missing"]
        found_size, found = hash_file(path)
    except OSError as err:
        return [f"{name} cannot be read: {err}"]
    if found_size != size:
        return [f"{name} holds {found_size} bytes, the manifest says {size}"]
    if found != digest:
        return [f"{name} does not hash to the manifest's BLAKE3 (it was changed or damaged)"]
    return []


def _read_manifest(path: Path, expect_digest: str | None) -> Manifest:
    where = path / MANIFEST
    if not path.is_dir():
        raise BackupRefused(f"{path} is not a directory")
    if not where.is_file():
        raise BackupRefused(f"{path} holds no {MANIFEST}: not a backup, or one that did not finish")
    try:
        document = json.loads(where.read_bytes())
    except (ValueError, UnicodeDecodeError) as err:
        raise BackupRefused(f"{MANIFEST} is not valid JSON ({err}): it was changed or damaged") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise BackupRefused(f"{MANIFEST} is not a MissionWeave backup manifest")
    if document.get("version") != VERSION:
        raise BackupRefused(
            f"the backup is of format version {document.get('version')!r}; this release reads {VERSION}"
        )
    recorded = document.get("digest")
    if recorded != manifest_digest(document):
        raise BackupRefused(f"{MANIFEST} does not hash to its digest: it was changed or damaged")
    if expect_digest is not None and expect_digest.removeprefix("blake3:") != recorded:
        raise BackupRefused(f"the manifest's digest is {recorded}, not the expected {expect_digest}")
    try:
        manifest = _parse(document)
    except (KeyError, TypeError, ValueError) as err:
        raise BackupRefused(f"{MANIFEST} is malformed: {err}") from None
    return manifest


def _parse(document: dict[str, Any]) -> Manifest:
    dialect = document["database"]["dialect"]
    if dialect not in ("sqlite", "postgresql"):
        raise ValueError(f"unknown database dialect {dialect!r}")
    files = []
    for item in document["files"]:
        kind, name = str(item["kind"]), str(item["path"])
        relative = PurePosixPath(name)
        prefix = FILE_KINDS.get(kind)
        if prefix is None or relative.is_absolute() or ".." in relative.parts or not name.startswith(prefix):
            raise ValueError(f"a file may not be at {name!r} ({kind})")
        if kind == "key" and len(relative.parts) != 2:
            raise ValueError(f"a key file may not be at {name!r}")
        files.append(
            FileEntry(
                name, _count(item["size"]), check_digest(item["blake3"]), int(item["mode"], 8) & 0o777, kind
            )
        )
    databases = [f for f in files if f.kind == "database"]
    expected = SQLITE_FILE if dialect == "sqlite" else PG_DUMP_FILE
    if [f.path for f in databases] != [expected]:
        raise ValueError(f"a {dialect} backup holds exactly {expected}")
    blobs = []
    for item in document["blobs"]:
        how = item["how"]
        if how not in ("copied", "referenced"):
            raise ValueError(f"a blob is copied or referenced, not {how!r}")
        blobs.append(BlobEntry(check_digest(item["digest"]), _count(item["size"]), how))
    heads = [
        GroupHead(str(h["group_id"]), _count(h["head_seq"]), str(h["head_hash"])) for h in document["groups"]
    ]
    return Manifest(document, dialect, files, blobs, heads, bool(document["keys_included"]))


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value
