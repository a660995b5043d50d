"""Idempotency: a command id already used in a Group is answered, never decided again.

A command is "the same" as an earlier one with its id when everything but its issue time matches
(``fingerprint``); a different body under a used id is refused COMMAND_ID_REUSED. The answer to a
replay is the original's result: awaited when its append is still on its way to the store, else read
back (verified) from the log, and only ever the replayed command's own events (truncation.py).
The command path (authority.py) asks ``replay`` under the Group's lock before admitting a command.
"""

from __future__ import annotations

import asyncio

import blake3

from missionweave.kernel import codec
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2
from missionweave_server.services.authority.owned import OwnedGroup
from missionweave_server.services.authority.reads import EventReads
from missionweave_server.services.authority.store import EventStore
from missionweave_server.services.authority.truncation import check_replayed

R = common_pb2.RejectionReason


def fingerprint(command: command_pb2.Command) -> bytes:
    """What makes two commands with one id "the same": everything but the issue time."""
    issued_at = command.issued_at.SerializeToString()
    command.ClearField("issued_at")
    try:
        return blake3.blake3(command.SerializeToString(deterministic=True)).digest()
    finally:
        command.issued_at.ParseFromString(issued_at)


def check_same_body(command: command_pb2.Command, recorded: bytes, fingerprint_: bytes) -> None:
    if recorded != fingerprint_:
        raise Rejected(
            R.REJECTION_REASON_COMMAND_ID_REUSED,
            f"command id {command.command_id} was already used in this Group with a different body",
        )


async def replay(
    command: command_pb2.Command,
    fingerprint_: bytes,
    owned: OwnedGroup | None,
    store: EventStore,
    reads: EventReads,
) -> command_pb2.CommandResult | None:
    """The answer to ``command`` when its id was used before in its Group (``owned``: this instance's
    view of the Group, if it holds one); None when it is new (or its original failed)."""
    if owned is not None:
        in_flight = owned.pending.get(command.command_id)
        if in_flight is not None:  # the same command id is still on its way to the store
            check_same_body(command, in_flight.fingerprint, fingerprint_)
            try:
                await asyncio.shield(in_flight.request.done)
            except Rejected:
                return None  # the original failed: this one is decided afresh
            replayed = command_pb2.CommandResult()
            replayed.CopyFrom(in_flight.finish())
            replayed.replayed = True
            return replayed
        # While this instance owns the Group under its writer epoch, the command ids it loaded and
        # appended are complete: a foreign append would have fenced us and emptied the cache.
        record = owned.commands.get(command.command_id)
    else:
        record = await store.find_command(command.group_id, command.command_id)
    if record is None:
        return None
    check_same_body(command, record.fingerprint, fingerprint_)
    stored = await reads.range(command.group_id, record.first_seq, record.last_seq)
    check_replayed(
        reads.integrity, command.group_id, command.command_id, stored
    )  # never another command's events
    return command_pb2.CommandResult(
        command_id=command.command_id,
        group_id=command.group_id,
        events=[codec.envelope(s.envelope) for s in stored],
        group_revision=record.last_seq,
        replayed=True,
    )
