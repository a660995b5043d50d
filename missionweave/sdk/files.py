"""The SDK's small durable files: JSON written atomically and durably, read back with a clear error."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from missionweave.kernel import ids
from missionweave.sdk.errors import AgentError


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Writes ``data`` to ``path`` atomically: temporary file (mode 0600), fsync, rename, fsync directory.

    Lean on purpose: an agent saves its cursors often (a round every few tens of ms), on a pool thread, and every Python
    step here holds the GIL its event loop needs. The temp name is unique per process and thread
    (no random name, no mkdir unless the directory is missing).
    """
    payload = json.dumps(data, sort_keys=True).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, flags, 0o600)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if hasattr(os, "O_DIRECTORY"):  # POSIX: make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def user_state_dir() -> Path:
    """Where an agent keeps its state by default: ``$MWP_STATE_DIR``, else the XDG state location
    (``$XDG_STATE_HOME/missionweave``, ``~/.local/state/missionweave``): never the working tree,
    where a session's private key could end up in a commit."""
    explicit = os.environ.get("MWP_STATE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "missionweave"


def private_dir(path: Path) -> Path:
    """``path`` created if missing, readable by its owner only (0700): it holds a session's key."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise AgentError(f"{path} is unreadable ({err}); move it away to start over") from err
    if not isinstance(data, dict):
        raise AgentError(f"{path} does not hold a JSON object")
    return data


def file_name(identifier: str) -> str:
    if not ids.is_valid(identifier) or identifier.startswith("."):
        raise ValueError(f"{identifier!r} is not a valid id")
    return identifier
