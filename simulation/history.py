"""A recorded history of operations on Group logs, in the manner of Jepsen's histories.

Both the deterministic simulation (``simulation.run``) and the real mesh's fault tests record
histories in this one format; ``simulation.checker`` looks for the anomalies a Group log must never
show. Each operation is written twice: once when a client invokes it and once when its outcome is
known (``ok``, ``fail`` when it certainly did not happen, ``info`` when the client cannot tell, e.g.
a timeout or a crash of either side). ``time`` orders the records of one history; an operation A
*precedes* B when A's completion was recorded before B's invocation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Phase(Enum):
    INVOKE = "invoke"
    OK = "ok"  # acknowledged: a command was appended (or answered as replayed); a read returned
    FAIL = "fail"  # refused: it certainly changed nothing
    INFO = "info"  # outcome unknown (timeout, broken connection, crash)


class Kind(Enum):
    COMMAND = "command"  # one command sent to a Group's Authority
    READ = "read"  # the Group's events read from a cursor (ReadEvents, a follow stream, a gateway stream)


@dataclass(frozen=True)
class Op:
    process: str  # the client (or agent) that invoked it; one process has one operation open at a time
    kind: Kind
    phase: Phase
    time: int  # position in the history: strictly increasing over all records
    group_id: str
    command_id: str = ""  # COMMAND: the command's id (a retry re-sends the same id)
    seq: int = 0  # COMMAND ok: the sequence of the command's first event as the answer named it
    shard: str = ""  # which Authority instance or shard answered (ok or fail)
    after: int = 0  # READ invoke: the cursor read from (events with seq > after)
    # READ ok: what was delivered, in delivery order: (seq, command_id) per event
    events: tuple[tuple[int, str], ...] = ()
    head: int = 0  # READ ok: the Group's head as the reader was told it (0 if not told)


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    # Each Group's log as finally stored (after every fault healed): (seq, command_id) per event in order.
    final_logs: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    _clock: int = 0

    def record(self, process: str, kind: Kind, phase: Phase, group_id: str, **fields: object) -> Op:
        """Append one record, stamped with the next time."""
        self._clock += 1
        op = Op(process, kind, phase, self._clock, group_id, **fields)  # type: ignore[arg-type]
        self.ops.append(op)
        return op
