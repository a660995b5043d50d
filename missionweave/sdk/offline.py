"""Bounded offline execution in the Worker runtime (spec 11.5, MW-11.5-04..09, OP-20, OP-23).

While the Group service is unreachable, a slot whose handler is declared :func:`reversible` keeps
computing until its lease's grace deadline (the last known lease expiry plus the contract's
``time_policy.offline_grace_period``). Its progress reports and checkpoints are signed and
appended to a durable buffer (one append-only, fsynced file per Worker, surviving a restart),
each carrying the critical bounded-offline-execution binding. Nothing new starts and no side
effect is authorized meanwhile (:meth:`SlotChannel.authorize` raises). On reconnection the
runtime reconciles first: it replays its Groups, confirms the ownership epochs, and submits the
buffered commands in order, each rebased on the current session with its binding unchanged
(MW-11.5-09); refused ones are logged and dropped. Only then may anything else be submitted.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message

from missionweave.kernel import ids
from missionweave.kernel.clock import Clock, SystemClock, from_timestamp, to_timestamp
from missionweave.kernel.extensions import BOUNDED_OFFLINE_EXECUTION, bindings
from missionweave.sdk.agent import Agent, AgentError, CommandRejected
from missionweave.v1 import command_pb2, common_pb2
from missionweave.v1 import work_pb2 as wp

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
_REVERSIBLE = "__missionweave_reversible__"


def reversible(handler: F) -> F:
    """Declares a handler's work reversible: it may continue offline within the grace period
    (MW-11.5-04). Without it, a slot that loses the Group service reports nothing and its
    progress calls raise :class:`OfflineForbidden`."""
    setattr(handler, _REVERSIBLE, True)
    return handler


def is_reversible(handler: object) -> bool:
    return bool(getattr(handler, _REVERSIBLE, False))


class OfflineForbidden(AgentError):
    """What the runtime refuses without a currently valid lease and capability token (MW-11.5-05,
    OP-20): a side effect, or offline continuation that is not allowed (not reversible, no grace
    period, past the grace deadline)."""


@dataclass
class LeaseWindow:
    """What the Worker knows of one slot's execution lease: its claims in a binding (OP-05)."""

    lease_id: str
    session_epoch: int
    ownership_epoch: int
    started_at: datetime
    expires_at: datetime  # as last known (a renewal moves it)
    grace: timedelta  # the contract's offline grace period (0: no offline continuation)

    @property
    def grace_deadline(self) -> datetime:
        return self.expires_at + self.grace


class OfflineBuffer:
    """The durable, append-only buffer of one Worker: a JSON line per buffered command (its signed
    envelope) and per command reconciled, each fsynced before the call returns. A torn last line
    (a crash mid-write) is ignored on load."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: dict[str, common_pb2.SignedEnvelope] = {}
        self._load()

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if data and not data.endswith(b"\n"):  # a torn last line: cut it, or the next record would join it
            data = data[: data.rfind(b"\n") + 1]
            os.truncate(self.path, len(data))
        for line in data.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("op") == "buffered":
                envelope = common_pb2.SignedEnvelope()
                envelope.ParseFromString(base64.b64decode(record["envelope"]))
                self._pending[record["command_id"]] = envelope
            elif record.get("op") == "reconciled":
                self._pending.pop(record["command_id"], None)

    def pending(self) -> list[command_pb2.Command]:
        """The buffered commands not yet reconciled, in the order they were buffered."""
        out = []
        for envelope in self._pending.values():
            command = command_pb2.Command()
            command.ParseFromString(envelope.payload)
            out.append(command)
        return out

    def __len__(self) -> int:
        return len(self._pending)

    def append(self, command_id: str, envelope: common_pb2.SignedEnvelope) -> None:
        self._write(
            {
                "op": "buffered",
                "command_id": command_id,
                "envelope": base64.b64encode(envelope.SerializeToString()).decode(),
            }
        )
        self._pending[command_id] = envelope

    def reconciled(self, command_id: str) -> None:
        """Drops a buffered command (accepted or refused); the file goes once none is left."""
        self._pending.pop(command_id, None)
        if self._pending:
            self._write({"op": "reconciled", "command_id": command_id})
        else:
            self.path.unlink(missing_ok=True)

    def _write(self, record: dict[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            os.write(fd, json.dumps(record).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)


def binding_of(command: command_pb2.Command) -> wp.BoundedOfflineExecutionBinding | None:
    found = bindings(command, BOUNDED_OFFLINE_EXECUTION)
    if not found:
        return None
    binding = wp.BoundedOfflineExecutionBinding()
    binding.ParseFromString(found[0].data)
    return binding


class SlotChannel:
    """How one slot's reports reach its Group: online under its lease, or buffered while the Group
    service is unreachable. Bound to one WorkItem and one lease; it reaches no other slot."""

    def __init__(
        self,
        agent: Agent,
        buffer: OfflineBuffer,
        group_id: str,
        work_item_id: str,
        conversation_id: str,
        window: LeaseWindow,
        *,
        reversible: bool,
        reconciled: Callable[[], bool],
        on_buffered: Callable[[], None],
        clock: Clock | None = None,
    ) -> None:
        self.agent, self.buffer = agent, buffer
        self.group_id, self.work_item_id, self.conversation_id = group_id, work_item_id, conversation_id
        self.window = window
        self.reversible = reversible
        self._reconciled = reconciled
        self._on_buffered = on_buffered
        self.clock = clock or SystemClock()
        self.disconnected_at: datetime | None = None

    def online(self) -> bool:
        """Connected, with nothing buffered still to reconcile (MW-11.5-06)."""
        return self.agent.connected and self._reconciled()

    def lost(self) -> None:
        """The Group service was found unreachable (a renewal or a report failed to get through)."""
        if self.disconnected_at is None:
            self.disconnected_at = self.clock.now()

    def authorize(self) -> None:
        """MW-11.5-05 / OP-20: a side effect needs a currently valid lease and capability token,
        which only the Group service can confirm: online and before the lease's expiry."""
        if not self.online():
            raise OfflineForbidden(
                f"{self.work_item_id}: the Group service is unreachable (or not reconciled): no side effect now"
            )
        if self.clock.now() >= self.window.expires_at:
            raise OfflineForbidden(f"{self.work_item_id}: the lease {self.window.lease_id} has expired")

    async def send(
        self, kind: str, body: Message, usage: common_pb2.ResourceVector
    ) -> command_pb2.CommandResult | None:
        """Online: executes it. Offline: buffers it durably (None). Refusals are raised."""
        command_id = ids.new_id("cmd")
        if self.online():
            try:
                return await self.agent.execute(self.group_id, kind, body, command_id=command_id)
            except CommandRejected:
                raise
            except AgentError:  # lost on the way, no RESULT: the buffered copy keeps the command id,
                self.lost()  # so if the original was applied after all, the copy is refused, never charged twice
        self.lost()
        self._buffer(kind, body, usage, command_id)
        return None

    def _buffer(self, kind: str, body: Message, usage: common_pb2.ResourceVector, command_id: str) -> None:
        now, window = self.clock.now(), self.window
        assert self.disconnected_at is not None
        if not self.reversible:
            raise OfflineForbidden(
                f"{self.work_item_id}: the handler's work is not declared reversible (MW-11.5-04)"
            )
        if window.grace <= timedelta(0):
            raise OfflineForbidden(f"{self.work_item_id}: the contract allows no offline continuation")
        if self.disconnected_at > window.expires_at:
            raise OfflineForbidden(f"{self.work_item_id}: the lease had expired before the service was lost")
        if now > window.grace_deadline:
            raise OfflineForbidden(
                f"{self.work_item_id}: the grace deadline {window.grace_deadline.isoformat()} has passed"
            )
        binding = wp.BoundedOfflineExecutionBinding(
            agent_id=self.agent.identity_id,
            group_id=self.group_id,
            work_item_id=self.work_item_id,
            original_session_epoch=window.session_epoch,
            ownership_epoch=window.ownership_epoch,
            historical_lease_id=window.lease_id,
            disconnected_at=to_timestamp(self.disconnected_at),
            buffered_at=to_timestamp(now),
            grace_deadline=to_timestamp(window.grace_deadline),
            historical_lease_expires_at=to_timestamp(window.expires_at),
            usage_delta=usage,
            conversation_id=self.conversation_id,
        )
        signer = self.agent.session
        command = signer.command(self.group_id, kind, body, command_id=command_id)
        command.extensions.add(urn=BOUNDED_OFFLINE_EXECUTION, critical=True, data=binding.SerializeToString())
        self.buffer.append(command.command_id, signer.sign(command))
        log.info(
            "%s/%s: buffered %s offline (grace until %s)",
            self.group_id,
            self.work_item_id,
            kind,
            window.grace_deadline,
        )
        self._on_buffered()


async def reconcile(
    agent: Agent, buffer: OfflineBuffer, owned: Callable[[str, str], int | None]
) -> list[tuple[command_pb2.Command, CommandRejected | None]]:
    """Submits the buffered commands in their original order (OP-23 step 3), each rebased on the
    current session with its binding unchanged (MW-11.5-09); one whose ownership epoch is no
    longer the WorkItem's (``owned(group, work item)``, from the replayed log; None when the
    replay since the cursor did not say) is dropped unsent. Refusals are logged and dropped. A
    lost connection stops it: the rest stays buffered."""
    outcomes: list[tuple[command_pb2.Command, CommandRejected | None]] = []
    for command in buffer.pending():
        binding = binding_of(command)
        assert binding is not None
        epoch = owned(command.group_id, binding.work_item_id)
        if epoch is not None and epoch != binding.ownership_epoch:
            log.warning(
                "%s/%s: dropped buffered %s: the ownership changed",
                command.group_id,
                binding.work_item_id,
                command.command_id,
            )
            buffer.reconciled(command.command_id)
            continue
        try:
            await agent.resubmit(command)
            outcomes.append((command, None))
        except CommandRejected as refused:
            log.warning(
                "%s/%s: buffered %s refused: %s",
                command.group_id,
                binding.work_item_id,
                command.command_id,
                refused,
            )
            outcomes.append((command, refused))
        buffer.reconciled(command.command_id)
    return outcomes


def window_of(lease: wp.ExecutionLease, contract: wp.WorkContract) -> LeaseWindow:
    period = contract.time_policy.offline_grace_period
    return LeaseWindow(
        lease.lease_id,
        lease.session_epoch,
        lease.ownership_epoch,
        from_timestamp(lease.started_at),
        from_timestamp(lease.expires_at),
        period.ToTimedelta() if period.seconds or period.nanos else timedelta(0),
    )


__all__ = [
    "LeaseWindow",
    "OfflineBuffer",
    "OfflineForbidden",
    "SlotChannel",
    "binding_of",
    "is_reversible",
    "reconcile",
    "reversible",
    "window_of",
]
