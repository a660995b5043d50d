"""The bridge's durable journal: which A2A task runs which ownership of which WorkItem, and how far
the bridge followed it. One fsynced JSON line per change, folded on load; a line torn by a crash is
the last one and is skipped. It is what lets a restarted bridge re-attach to a task instead of
sending the work again (no A2A task runs twice)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

Key = tuple[str, str, int]  # (Group, WorkItem, ownership epoch)


@dataclass(frozen=True)
class TaskEntry:
    group_id: str
    work_item_id: str
    ownership_epoch: int
    context_id: str
    # The message that started the task: recorded before it is sent, so a send whose answer was
    # lost is found again by listing the context (its task has this message in its history).
    message_id: str
    task_id: str = ""
    state: str = ""  # the last A2A task state seen ("working", "input-required", ...)
    events: int = 0  # A2A events seen for this task: the cursor a re-attach reports from
    answers: tuple[str, ...] = ()  # ids of the answer messages sent (one per unblock)
    superseded: bool = False  # canceled by the bridge (preempted or a newer ownership): not resumed
    attempt: int = 0  # tasks started for this ownership before this one (after preemptions)
    previous_task_ids: tuple[str, ...] = field(default=())
    contract_revision: int = 0  # the contract revision the task was sent for
    adopted_from: int = 0  # the earlier ownership epoch whose task this ownership took over

    @property
    def key(self) -> Key:
        return (self.group_id, self.work_item_id, self.ownership_epoch)


class TaskJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._entries: dict[Key, TaskEntry] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError:  # torn by a crash while writing: nothing was sent after it
                    continue
                raw["answers"] = tuple(raw.get("answers", ()))
                raw["previous_task_ids"] = tuple(raw.get("previous_task_ids", ()))
                entry = TaskEntry(**raw)
                self._entries[entry.key] = entry

    def get(self, key: Key) -> TaskEntry | None:
        return self._entries.get(key)

    def of_work_item(self, group_id: str, work_item_id: str) -> list[TaskEntry]:
        """Every ownership's entry of the WorkItem, oldest epoch first."""
        found = [e for k, e in self._entries.items() if k[:2] == (group_id, work_item_id)]
        return sorted(found, key=lambda e: e.ownership_epoch)

    def record(self, entry: TaskEntry) -> TaskEntry:
        """Durable before it returns: the line is written and fsynced."""
        line = json.dumps(asdict(entry), sort_keys=True) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._entries[entry.key] = entry
        return entry

    def update(self, entry: TaskEntry, **changes: object) -> TaskEntry:
        """``changes`` applied to the journal's current entry for ``entry``'s key: a caller holding an
        older copy (a follower that ran on) cannot undo what was recorded since."""
        current = self._entries.get(entry.key, entry)
        return self.record(replace(current, **changes))  # type: ignore[arg-type]
