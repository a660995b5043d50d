"""Locking: the per-Group locks that serialise the decisions of one Group's commands.

Commands to one Group are decided one at a time under its lock (authority.py); commands to different
Groups proceed concurrently. A Group's lock is forgotten once nobody holds or awaits it, so memory
stays bounded by the Groups in use, not the Groups ever seen.
"""

from __future__ import annotations

import asyncio


class GroupLocks:
    """One asyncio lock per Group, made on first use and dropped when its last user leaves."""

    def __init__(self) -> None:
        self._entries: dict[str, _LockEntry] = {}

    def hold(self, group_id: str) -> _GroupLock:
        """``async with locks.hold(group_id):`` runs the block as the Group's only decision."""
        return _GroupLock(self._entries, group_id)


class _LockEntry:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0  # holders plus waiters


class _GroupLock:
    """A per-Group asyncio lock that is forgotten once nobody holds or awaits it (bounded memory)."""

    def __init__(self, locks: dict[str, _LockEntry], key: str) -> None:
        self.locks = locks
        self.key = key

    async def __aenter__(self) -> None:
        entry = self.locks.get(self.key)
        if entry is None:
            entry = self.locks[self.key] = _LockEntry()
        entry.users += 1
        try:
            await entry.lock.acquire()
        except BaseException:
            self._leave(entry)
            raise
        self.entry = entry

    async def __aexit__(self, *exc: object) -> None:
        self.entry.lock.release()
        self._leave(self.entry)

    def _leave(self, entry: _LockEntry) -> None:
        entry.users -= 1
        if entry.users == 0:
            self.locks.pop(self.key, None)
