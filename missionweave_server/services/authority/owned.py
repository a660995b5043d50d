"""What this instance holds of a Group it owns, and of a decided command on its way to the store.

``OwnedGroup`` is the cached view the command path decides on (loaded by loading.py, advanced by
authority.py as appends are decided and acknowledged); ``Pending`` is one decided command whose append
waits in the group-commit queue, with the answer to give once it is durable (also to a replay of
the same command meanwhile, idempotency.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from missionweave.kernel.signing import EVENT_TYPE, signed_envelope
from missionweave.v1 import command_pb2, event_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState
from missionweave_server.services.authority.store import AppendRequest, CommandRecord

# Durable events a Group's readers' copy applies at once: the command path only queues them (a
# second fold per event on the loop's hot path), the next reader or this bound applies them.
SETTLE_BATCH = 64


@dataclass
class OwnedGroup:
    """A Group this instance owns: its writer epoch, folded state and accepted command ids.

    ``state`` includes appends still in the group-commit queue (what the next command decides on);
    ``durable_state``, a separate object, only what the store has acknowledged (what readers see).
    """

    writer_epoch: int
    state: GroupState | None
    commands: dict[str, CommandRecord]
    _durable: GroupState | None = None
    pending: dict[str, Pending] = field(default_factory=dict)
    # Acknowledged events not yet folded into ``_durable`` (at most SETTLE_BATCH).
    _unsettled: list[event_pb2.Event] = field(default_factory=list)
    durable_head: int = field(init=False)
    # Until then (µs since the epoch) this instance is certainly the Group's only writer.
    sole_writer_until_us: int = 0
    # Event digests (docs/integrity.md) at the head of ``state`` (what the next append names) and
    # at ``durable_head``.
    chain_head: bytes = b""
    durable_link: bytes = b""

    def __post_init__(self) -> None:
        self.durable_head = self._durable.head_sequence if self._durable else 0

    def settle(self, events: list[event_pb2.Event]) -> None:
        """The store acknowledged ``events`` (the next ones after ``durable_head``)."""
        self._unsettled.extend(events)
        self.durable_head = events[-1].sequence
        if len(self._unsettled) >= SETTLE_BATCH:
            self._apply_unsettled()

    def acknowledge(self, command_id: str, pending: Pending, lease_margin_us: int) -> bool:
        """The store made ``pending``'s append durable: the command id is recorded, and the readers'
        copy advances by the same events, in append order. False: it completed out of order (should
        not happen), and this view must be rebuilt from the log when next needed."""
        request = pending.request
        self.commands[command_id] = CommandRecord(
            pending.fingerprint, request.expected_head + 1, request.expected_head + len(request.events)
        )
        if request.expected_head != self.durable_head:
            return False
        self.settle(pending.events)
        self.durable_link = pending.link
        self.sole_writer_until_us = max(self.sole_writer_until_us, pending.decided_us + lease_margin_us)
        return True

    @property
    def durable_state(self) -> GroupState | None:
        if self._unsettled:
            self._apply_unsettled()
        return self._durable

    def _apply_unsettled(self) -> None:
        state = self._durable
        for event in self._unsettled:
            state = decider.evolve(state, event)
        self._durable, self._unsettled = state, []


@dataclass
class Pending:
    """A decided command whose append is queued: what to answer once the store confirms it."""

    owned: OwnedGroup
    request: AppendRequest
    events: list[event_pb2.Event]
    result: command_pb2.CommandResult
    fingerprint: bytes
    decided_us: int  # before the append's commit, so before the ownership lease it renews
    key_id: str
    unsigned: bool  # the store's writer signs the events: envelopes come with its answer
    link: bytes  # the event digest of its last event

    def finish(self) -> command_pb2.CommandResult:
        """The answer, once the append is durable: where the writer signed the events, their
        envelopes are rebuilt from its signatures, byte for byte the ones it stored."""
        if self.unsigned:
            request = self.request
            envelopes = [
                signed_envelope(p, EVENT_TYPE, self.key_id, sig)
                for p, sig in zip(request.payloads, request.signatures, strict=True)
            ]
            request.events = [
                dataclasses.replace(e, envelope=env.SerializeToString())
                for e, env in zip(request.events, envelopes, strict=True)
            ]
            self.result.events.extend(envelopes)
            self.unsigned = False
        return self.result
