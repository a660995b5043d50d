"""The Authority's own commands: a linked event applied across Groups, and a replaced session's leases.

A cross-Group outbox row (MW-10.4-05) is applied in its target Group as a command whose id derives
from the source event, or, refused by the target's rules, compensated in the source Group
(``apply_link``); a session that replaced an older one revokes the leases the older ones still hold
(``revoke_replaced_session``, MW-11.3-09). Both are decided by the core (``decider``) as an ``Effect``
on the Group's state and go through the same command path as signed commands (authority.py), minus
authentication, lookups and admission.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from missionweave.kernel import codec, ids
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.loading import GroupLoader
from missionweave_server.services.authority.reads import EventReads
from missionweave_server.services.authority.rules import children
from missionweave_server.services.authority.state import GroupState
from missionweave_server.services.authority.store import EventStore

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.authority")

# A decision of the Authority's own (a linked effect or a compensation) on the Group's state.
Effect = Callable[[GroupState | None, datetime], "decider.Decision"]
# The command path for one of them: the command, no envelope, and its effect.
Execute = Callable[
    [command_pb2.Command, common_pb2.SignedEnvelope | None, Effect | None],
    Awaitable[command_pb2.CommandResult],
]


class Refused(Exception):
    """The target Group's rules refused a linked effect (not a transient failure of the store)."""

    def __init__(self, rejection: Rejected) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


async def apply_link(
    execute: Execute,
    reads: EventReads,
    loader: GroupLoader,
    store: EventStore,
    source_group_id: str,
    source_seq: int,
    target_group_id: str,
) -> None:
    """Deliver one cross-Group outbox row (MW-10.4-05): the target Group applies the source event
    (once: its command id derives from the event), or refuses it and the source Group is
    compensated; then the row is dropped. A transient failure (the target owned by another
    instance, a store race) raises Rejected and leaves the row for a later try."""
    (stored,) = await reads.range(source_group_id, source_seq, source_seq)  # verified
    source = codec.decode_event(stored.envelope)
    source_state = await loader.state(source_group_id)
    assert source_state is not None
    command = children.linked_command(target_group_id, source)
    try:
        await execute(
            command, None, lambda state, now: decider.decide_linked(state, source, source_state, now)
        )
    except Refused as refused:
        refusal = refused.rejection
        log.warning(
            "a Group refused a linked event; compensating",
            extra={
                "group_id": target_group_id,
                "source_group_id": source_group_id,
                "source_event_id": source.event_id,
                "reason": R.Name(refusal.reason),
                "detail": refusal.message,
            },
        )
        compensation = command_pb2.Command()
        compensation.CopyFrom(command)
        compensation.group_id = source_group_id
        compensation.command_id = ids.derived_id("xgc", source_group_id, str(source_seq))
        await execute(
            compensation,
            None,
            lambda state, now: decider.decide_compensation(state, source, refusal, now) if state else [],
        )
    await store.drop_link(source_group_id, source_seq, target_group_id)


async def revoke_replaced_session(
    execute: Execute, store: EventStore, group_id: str, agent_id: str, session_epoch: int
) -> bool:
    """MW-11.3-09: revoke the leases ``agent_id``'s sessions before ``session_epoch`` hold in
    ``group_id`` (the WorkItems return to ``queued``); whether any were revoked. Raises Rejected
    (NOT_OWNER and the like) when this instance cannot write the Group now."""
    command = decider.session_replaced_command(group_id, agent_id, session_epoch)
    result = await execute(
        command, None, lambda state, now: decider.decide_session_replaced(state, agent_id, session_epoch, now)
    )
    if not result.replayed and result.group_revision == 0:
        # Nothing was running under an older session: the index row outlived its lease.
        await store.drop_running_leases(group_id, agent_id, session_epoch)
        return False
    return True
