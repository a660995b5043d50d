"""An agent's durable cursors (MW-16-06): every Group's in one file, ``<dir>/cursors.json``, written in
rounds (D143).

A subscription asks for its processed cursor to be saved and waits for the round that writes it; a
round writes every cursor asked for since the last one with one atomic write (two fsyncs), at most
one round per ``interval`` seconds. An agent following many Groups thus costs the disk a few writes
per second whatever its event rate, where a file per Group cost two fsyncs per batch per Group, which
on a busy agent was one per event (bench/README.md, delivery). The file only moves forward.

Cursors written by SDKs before D143, one ``<group>.cursor.json`` per Group, are still read: a Group
the agent file does not name starts from its old file, which the next round writes here and removes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from missionweave.sdk.errors import AgentError
from missionweave.sdk.files import file_name, read_json, write_json_atomic

CURSORS_FILE = "cursors.json"
# The least time between two rounds: what an ACK (and the credits it returns) may wait for the disk.
CURSOR_INTERVAL_S = 0.02


class CursorStore:
    """The cursors of one agent (``<directory>/cursors.json``), saved in rounds; one per Agent."""

    def __init__(self, directory: Path, agent_id: str, *, interval: float = CURSOR_INTERVAL_S) -> None:
        self.directory = directory
        self.path = directory / CURSORS_FILE
        self.agent_id = agent_id
        self.interval = interval
        self._saved = self._read()  # what the file holds (and will hold: never less)
        self._asked: dict[str, int] = {}  # for the next round
        self._round: asyncio.Future[None] | None = None  # resolved once the next round is written
        self._writer: asyncio.Task[None] | None = None
        self._last_write = 0.0  # time.monotonic() at the end of the last round
        self._legacy_files: list[Path] = []  # read from, removed once this file carries their cursors

    def load(self, group_id: str) -> int:
        """The saved cursor of ``group_id``, 0 when there is none yet."""
        file_name(group_id)  # never a path out of the directory, nor a hidden file
        saved = self._saved.get(group_id)
        if saved is None:
            saved = self._saved[group_id] = self._legacy(group_id)
        return saved

    def saved(self, group_id: str) -> int:
        """The cursor of ``group_id`` that the file holds."""
        return self._saved.get(group_id, 0)

    async def save(self, group_id: str, cursor: int) -> None:
        """Returns once ``cursor`` (or a later one) of ``group_id`` is durable; raises the round's
        error if its write failed."""
        round_ = self.ask(group_id, cursor)
        if round_ is not None:
            await asyncio.shield(round_)

    def ask(self, group_id: str, cursor: int) -> asyncio.Future[None] | None:
        """Puts ``cursor`` (or a later one) of ``group_id`` in the next round, without waiting: the
        round's future, resolved once the file holds it (``saved``) or with the write's error; None
        when the file holds ``cursor`` already. A subscription saving behind its handler hangs a
        callback on it instead of a task per batch (bench/README.md, the SDK's cursor bookkeeping)."""
        saved = max(self._saved.get(group_id, 0), self._asked.get(group_id, 0))
        if cursor < saved:
            raise ValueError(f"cursor {cursor} of {group_id} would move {self.path} backwards from {saved}")
        if cursor == self._saved.get(group_id, 0):
            return None
        self._asked[group_id] = cursor
        if self._round is None:
            self._round = asyncio.get_running_loop().create_future()
            # A round whose waiters were all cancelled must not log an unretrieved exception.
            self._round.add_done_callback(lambda done: done.cancelled() or done.exception())
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(
                self._write_rounds(), name=f"missionweave-cursors-{self.agent_id}"
            )
        return self._round

    async def _write_rounds(self) -> None:
        while self._asked:
            wait = self._last_write + self.interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            asked, self._asked = self._asked, {}
            done, self._round = self._round, None
            cursors = {**self._saved, **asked}
            try:
                await asyncio.to_thread(self._write, cursors)
            except BaseException as err:
                if done is not None and not done.done():
                    done.set_exception(
                        err if isinstance(err, Exception) else AgentError(f"{self.path}: {err!r}")
                    )
                if not isinstance(err, Exception):
                    raise
                continue
            finally:
                self._last_write = time.monotonic()
            self._saved = cursors
            if done is not None and not done.done():
                done.set_result(None)

    def _write(self, cursors: dict[str, int]) -> None:
        """One round's write, on a pool thread."""
        write_json_atomic(self.path, {"agent_id": self.agent_id, "cursors": cursors})
        legacy, self._legacy_files = self._legacy_files, []
        for path in legacy:  # so that removing a Group's entry here starts it over
            path.unlink(missing_ok=True)

    def _read(self) -> dict[str, int]:
        data = read_json(self.path)
        if data is None:
            return {}
        cursors = data.get("cursors")
        if data.get("agent_id") != self.agent_id or not isinstance(cursors, dict):
            raise AgentError(f"{self.path} is not the cursor file of {self.agent_id}")
        for group_id, cursor in cursors.items():
            if not (isinstance(cursor, int) and cursor >= 0) or not _valid_group(group_id):
                raise AgentError(f"{self.path} holds {cursor!r} as the cursor of {group_id!r}")
        return dict(cursors)

    def _legacy(self, group_id: str) -> int:
        """The cursor an SDK before D143 wrote to ``<group>.cursor.json``, 0 when there is none."""
        path = self.directory / f"{group_id}.cursor.json"
        data: dict[str, Any] | None = read_json(path)
        if data is None:
            return 0
        cursor = data.get("cursor")
        if (data.get("agent_id"), data.get("group_id")) != (self.agent_id, group_id) or not (
            isinstance(cursor, int) and cursor >= 0
        ):
            raise AgentError(f"{path} is not the cursor of {self.agent_id} in {group_id}")
        self._legacy_files.append(path)
        return cursor


def _valid_group(group_id: object) -> bool:
    try:
        return isinstance(group_id, str) and file_name(group_id) == group_id
    except ValueError:
        return False
