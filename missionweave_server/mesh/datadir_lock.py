"""One mesh per data directory: a second process on a held data dir is refused at start.

The holder keeps an exclusive ``flock`` on ``<data dir>/mesh.lock`` for its lifetime (the kernel
drops it when the process dies, however it dies) and writes its pid and mesh id there. Processes
started as parts of the same mesh (the split topology's children) carry that mesh id in
``MWP_MESH_ID`` and are let in; anyone else gets ``DataDirHeld`` naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from missionweave_server.storage.db import private_dir

LOCK_NAME = "mesh.lock"


class DataDirHeld(Exception):
    """The data directory belongs to another running mesh."""


class DataDirLock:
    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def hold(data_dir: Path, mesh_id: str) -> DataDirLock:
    """Take the data directory for the mesh ``mesh_id`` (see the module docstring)."""
    private_dir(data_dir)
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        if mesh_id and holder.get("mesh_id") == mesh_id:
            return DataDirLock(None)  # a part of the mesh that holds it
        raise DataDirHeld(
            f"the data directory {data_dir} is in use by process {holder.get('pid', '?')} "
            f"(mesh {holder.get('mesh_id', '?')}): stop that process, or start with another --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "mesh_id": mesh_id}).encode(), 0)
    return DataDirLock(fd)


def _read(fd: int) -> dict[str, object]:
    with contextlib.suppress(OSError, ValueError):
        held = json.loads(os.pread(fd, 4096, 0) or b"{}")
        if isinstance(held, dict):
            return held
    return {}
