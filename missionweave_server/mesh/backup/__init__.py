"""``mwp backup`` and ``mwp restore``: a consistent copy of everything a mesh stores, taken while it
serves, and brought back into an empty place (docs/backup.md, issue 39).

What a backup holds (a new directory, 0700)::

    manifest.json                 what was taken, with sizes and BLAKE3 hashes, and its own digest
    database/missionweave.db      SQLite: the online backup API (one read transaction, WAL included)
    database/postgres.dump        PostgreSQL: pg_dump --format=custom of an exported snapshot
    blobs/ab/cd/<64 hex>          the blobs the database snapshot names, re-hashed as copied
    keys/...                      the key files (0600): the Authority key, the admin key, the mesh token
    tls/...                       throw-away certificates of ``mwp serve --tls-auto``, when present

The modules, each building only on those above it:

    store.py      the Store (where a mesh keeps its data), the errors, progress, opening a database
    files.py      private directories, new files hashed as written and synced, emptying a directory again
    pg_tools.py   pg_dump and pg_restore: found on PATH, given the connection as libpq's environment
    manifest.py   the manifest's format and digest; writing it, reading it back, checking a whole backup
    snapshot.py   the database at one instant (SQLite online backup, pg_dump of an exported snapshot)
                  and what is read from it: blobs, Group heads, events, schema revisions
    take.py       the backup: database, then the blobs it names, keys and certificates, manifest last
    restore.py    the restore: target checks, writing, taking back a failed one, checking the result

The CLI reaches the stores only through here (``missionweave_server/commands/backup.py``), by the names below.
"""

from __future__ import annotations

from missionweave_server.mesh.backup.manifest import (
    FORMAT,
    VERSION,
    GroupHead,
    Manifest,
    check_backup,
    manifest_digest,
)
from missionweave_server.mesh.backup.restore import RestoreResult, restore
from missionweave_server.mesh.backup.store import (
    BackupRefused,
    BackupUsage,
    DatabaseUnreachable,
    Progress,
    Store,
)
from missionweave_server.mesh.backup.take import BackupResult, backup

__all__ = [
    "FORMAT",
    "VERSION",
    "BackupRefused",
    "BackupResult",
    "BackupUsage",
    "DatabaseUnreachable",
    "GroupHead",
    "Manifest",
    "Progress",
    "RestoreResult",
    "Store",
    "backup",
    "check_backup",
    "manifest_digest",
    "restore",
]
