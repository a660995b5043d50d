"""Offline operator actions on a store: ``mwp verify`` and ``mwp authority rotate-key``.

The CLI reaches the Authority's tables only through here (like ``mwp serve`` through
``mesh.server``): the client commands never import a service.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey
from sqlalchemy import inspect

from missionweave.kernel.clock import SystemClock
from missionweave.kernel.signing import authority_key_id, generate_key, read_key, write_key
from missionweave_server.edge.callers import load_or_create_mesh_token
from missionweave_server.services.artifacts.audit import (
    BlobReport,
    source_for,
    unsealed_holders,
    verify_blobs,
)
from missionweave_server.services.artifacts.backends import BlobStoreConfig
from missionweave_server.services.artifacts.holder_seal import HolderSeal
from missionweave_server.services.authority import schema as authority_schema
from missionweave_server.services.authority.audit import Report, verify_store
from missionweave_server.services.authority.keys import (
    KeyContinuityError,
    KeyHistory,
    load_history,
    record_rotation,
)
from missionweave_server.services.membership.audit import GrantFinding, GrantReport, verify_grants
from missionweave_server.storage.db import make_engine

__all__ = [
    "BlobReport",
    "KeyContinuityError",
    "Report",
    "RotationResult",
    "blob_location",
    "rotate_key",
    "verify",
    "verify_stored_blobs",
]


def verify(
    url: str, key_file: Path | None, progress: Callable[[int, int, int], None] | None = None
) -> Report:
    """Checks every Group of the store at ``url`` (docs/integrity.md)."""
    public = None
    if key_file is not None and key_file.exists():
        public = (key_file, bytes(read_key(key_file).verify_key))

    async def run() -> Report:
        engine = make_engine(url)
        try:
            await authority_schema.create_schema(engine)  # refuses a store at another schema revision
            return await verify_store(engine, public, progress)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def verify_granting_rows(url: str, admin_key_file: Path, mesh_token_file: Path) -> GrantReport | None:
    """Checks every identity and session row against its grant (D170) and, with the mesh token,
    every holder row's seal (D172); None without the administrator's key file, the root of grants."""
    if not admin_key_file.exists():
        return None
    admin_public_key = bytes(read_key(admin_key_file).verify_key)
    seal = HolderSeal(load_or_create_mesh_token(mesh_token_file)) if mesh_token_file.exists() else None

    async def run() -> GrantReport:
        engine = make_engine(url)
        try:
            report = await verify_grants(engine, admin_public_key)
            if seal is not None and await _has_table(engine, "holders"):
                report.holders, bad = await unsealed_holders(engine, seal)
                report.findings += [
                    GrantFinding(
                        "holder",
                        identity,
                        0,
                        f"blake3:{digest}: the holder row is not sealed by the artifact service",
                    )
                    for digest, identity in bad
                ]
            return report
        finally:
            await engine.dispose()

    return asyncio.run(run())


async def _has_table(engine: Any, name: str) -> bool:
    async with engine.connect() as conn:
        return bool(await conn.run_sync(lambda sync: inspect(sync).has_table(name)))


def blob_location(data_dir: Path, env: Mapping[str, str] | None = None) -> str:
    """Where ``mwp serve`` keeps blobs for this data directory and ``MWP_S3_*``."""
    config = BlobStoreConfig.from_env(data_dir, env)
    return f"s3://{config.s3_bucket}" if config.backend == "s3" else str(config.data_dir / "blobs")


def verify_stored_blobs(
    url: str,
    data_dir: Path,
    progress: Callable[[int, int, int, int], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> BlobReport:
    """Checks every blob the artifact index of the store at ``url`` names, in the blob store
    ``mwp serve`` would use (``MWP_DATA_DIR``'s ``blobs/``, or S3 when ``MWP_S3_BUCKET`` is set):
    present, of its size, hashing to its name (docs/integrity.md)."""
    config = BlobStoreConfig.from_env(data_dir, env)

    async def run() -> BlobReport:
        source, location = source_for(config)
        engine = make_engine(url)
        try:
            report = await verify_blobs(engine, source, progress)
        finally:
            await engine.dispose()
            await source.close()
        report.location = location
        return report

    return asyncio.run(run())


@dataclass
class RotationResult:
    previous_key_id: str
    key_id: str
    history: KeyHistory
    installed: Path | None  # where the new key file was written (None: the operator's own file)
    retired: Path | None  # where the old key file went


def rotate_key(
    url: str, key_path: Path, old_key_path: Path | None, new_key_path: Path | None, reason: str
) -> RotationResult:
    """Record a rotation of the Authority key in the store, signed by the old key and the new one.

    * no ``old_key_path``/``new_key_path``: the key at ``key_path`` is the old one; a new key is
      generated, the rotation recorded, then the old file renamed ``<key>.retired-<fingerprint>``
      and the new one put in its place;
    * ``--old-key`` only: the key file at ``key_path`` (already replaced) is the new one;
    * ``--new-key``: that file is the new key; files are left as they are (configure it).
    """
    old_path = old_key_path or key_path
    old = read_key(old_path)
    generated: SigningKey | None = None
    if new_key_path is not None:
        new = read_key(new_key_path)
    elif old_key_path is not None and old_key_path.resolve() != key_path.resolve():
        new = read_key(key_path)
    else:
        generated = new = generate_key()
    staged = key_path.with_name(key_path.name + ".new")
    if generated is not None:
        with contextlib.suppress(FileNotFoundError):
            staged.unlink()  # left by an attempt that failed before recording
        write_key(staged, generated)

    async def record() -> KeyHistory:
        engine = make_engine(url)
        try:
            await authority_schema.create_schema(engine)
            return await record_rotation(engine, old, new, SystemClock(), reason)
        finally:
            await engine.dispose()

    try:
        history = asyncio.run(record())
    except BaseException:
        if generated is not None:
            staged.unlink(missing_ok=True)
        raise
    installed = retired = None
    if generated is not None:
        retired = key_path.with_name(
            f"{key_path.name}.retired-{authority_key_id(bytes(old.verify_key)).split(':')[1]}"
        )
        os.replace(key_path, retired)
        os.replace(staged, key_path)
        installed = key_path
    return RotationResult(
        authority_key_id(bytes(old.verify_key)),
        authority_key_id(bytes(new.verify_key)),
        history,
        installed,
        retired,
    )


def key_history(url: str) -> KeyHistory:
    async def run() -> KeyHistory:
        engine = make_engine(url)
        try:
            await authority_schema.create_schema(engine)
            return await load_history(engine)
        finally:
            await engine.dispose()

    return asyncio.run(run())
