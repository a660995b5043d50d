"""Commands over the gateway stream: the typed builders an agent author passes to
:meth:`Agent.execute <missionweave.sdk.agent.Agent.execute>` (``post_message``, ``accept_offer``,
``start_work``, ``renew_lease``, ``checkpoint``, ``submit``, ``fail``, each a ``CommandBody``), and
``PendingCommands``, the table of COMMAND frames still waiting for their RESULT, which the agent
re-sends with the same command id after a reconnect. Signing is the session's
(``SessionSigner``); sending is the agent's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import NamedTuple

from google.protobuf import duration_pb2
from google.protobuf.message import Message

from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.sdk.errors import AgentError, CommandRejected
from missionweave.v1 import command_pb2, common_pb2, conversation_pb2, work_pb2
from missionweave.v1 import gateway_service_pb2 as pb

__all__ = [
    "CommandBody",
    "PendingCommands",
    "accept_offer",
    "checkpoint",
    "fail",
    "post_message",
    "renew_lease",
    "start_work",
    "submit",
]

_clock = SystemClock()


class CommandBody(NamedTuple):
    """A command kind (the field name in ``Command.body``) with its body, for :meth:`Agent.execute`."""

    kind: str
    body: Message


def _duration(seconds: float | None) -> duration_pb2.Duration | None:
    if seconds is None:
        return None
    out = duration_pb2.Duration()
    out.FromNanoseconds(int(seconds * 1e9))
    return out


def post_message(
    conversation_id: str,
    text: str,
    *,
    mentions: Iterable[str] = (),
    reply_to_message_id: str = "",
    topic: str = "",
    data_json: str = "",
    message_id: str = "",
) -> CommandBody:
    """``message.post`` (MW-9-13): a Message in a Conversation, never an assignment.

    >>> cmd = post_message("conv_1", "@coord ready?", mentions=["coord"])
    >>> cmd.kind, list(cmd.body.content.mentions)
    ('message_post', ['coord'])
    """
    content = conversation_pb2.MessageContent(text=text, data_json=data_json, mentions=list(mentions))
    return CommandBody(
        "message_post",
        conversation_pb2.MessagePost(
            conversation_id=conversation_id,
            message_id=message_id,
            content=content,
            reply_to_message_id=reply_to_message_id,
            topic=topic,
        ),
    )


def accept_offer(
    work_item_id: str,
    offer_id: str,
    contract_revision: int,
    *,
    schedule: work_pb2.ScheduleDisclosure | None = None,
) -> CommandBody:
    """``work.accept_offer``: accept an offer made to you at the current contract revision.

    >>> accept_offer("wi-1", "offer-1", 1).body.contract_revision
    1
    """
    return CommandBody(
        "work_accept_offer",
        work_pb2.WorkAcceptOffer(
            work_item_id=work_item_id,
            offer_id=offer_id,
            contract_revision=contract_revision,
            schedule=schedule,
        ),
    )


def start_work(
    work_item_id: str,
    ownership_epoch: int,
    *,
    lease_id: str = "",
    lease_seconds: float | None = None,
    resume_from_checkpoint_id: str = "",
    requested_scope: work_pb2.ExecutionPermissions | None = None,
) -> CommandBody:
    """``work.start``: take the execution lease (empty ``lease_id``: derived from the command id).

    >>> start_work("wi-1", 1, lease_id="lease-a", lease_seconds=90).body.requested_duration.seconds
    90
    """
    return CommandBody(
        "work_start",
        work_pb2.WorkStart(
            work_item_id=work_item_id,
            ownership_epoch=ownership_epoch,
            lease_id=lease_id,
            requested_duration=_duration(lease_seconds),
            resume_from_checkpoint_id=resume_from_checkpoint_id,
            requested_scope=requested_scope,
        ),
    )


def renew_lease(
    work_item_id: str,
    lease_id: str,
    ownership_epoch: int,
    *,
    lease_seconds: float | None = None,
    usage_delta: common_pb2.ResourceVector | None = None,
) -> CommandBody:
    """``work.renew_lease``: extend the current execution lease before it expires.

    >>> renew_lease("wi-1", "lease-a", 1).kind
    'work_renew_lease'
    """
    return CommandBody(
        "work_renew_lease",
        work_pb2.WorkRenewLease(
            work_item_id=work_item_id,
            lease_id=lease_id,
            ownership_epoch=ownership_epoch,
            requested_duration=_duration(lease_seconds),
            usage_delta=usage_delta,
        ),
    )


def checkpoint(
    work_item_id: str,
    lease_id: str,
    ownership_epoch: int,
    checkpoint_id: str,
    *,
    progress: work_pb2.ProgressReport | None = None,
    state: common_pb2.ArtifactRef | None = None,
    completed_operation_ids: Iterable[str] = (),
    preemption_request_id: str = "",
    usage_delta: common_pb2.ResourceVector | None = None,
) -> CommandBody:
    """``work.checkpoint``: record durable progress (releases the execution lease, keeps ownership).

    ``completed_operation_ids`` names the logical operations whose external side effects are done, so a
    later owner does not repeat them (MW-16-13).

    >>> checkpoint("wi-1", "lease-a", 1, "ck-1", completed_operation_ids=["send-mail"]).body.checkpoint.checkpoint_id
    'ck-1'
    """
    taken = work_pb2.Checkpoint(
        checkpoint_id=checkpoint_id,
        state=state,
        progress=progress,
        completed_operation_ids=list(completed_operation_ids),
        taken_at=to_timestamp(_clock.now()),
    )
    return CommandBody(
        "work_checkpoint",
        work_pb2.WorkCheckpoint(
            work_item_id=work_item_id,
            lease_id=lease_id,
            ownership_epoch=ownership_epoch,
            checkpoint=taken,
            preemption_request_id=preemption_request_id,
            usage_delta=usage_delta,
        ),
    )


def submit(
    work_item_id: str,
    lease_id: str,
    ownership_epoch: int,
    contract_revision: int,
    evidence: Iterable[work_pb2.Evidence],
    *,
    artifacts: Iterable[common_pb2.ArtifactRef] = (),
    summary: str = "",
    usage_delta: common_pb2.ResourceVector | None = None,
) -> CommandBody:
    """``work.submit``: hand in the result with Evidence per required acceptance criterion (MW-13.2-02).

    >>> submit("wi-1", "lease-a", 1, 1, [work_pb2.Evidence(criterion_id="balances")], summary="done").kind
    'work_submit'
    """
    return CommandBody(
        "work_submit",
        work_pb2.WorkSubmit(
            work_item_id=work_item_id,
            lease_id=lease_id,
            ownership_epoch=ownership_epoch,
            contract_revision=contract_revision,
            artifacts=list(artifacts),
            evidence=list(evidence),
            summary=summary,
            usage_delta=usage_delta,
        ),
    )


def fail(
    work_item_id: str,
    lease_id: str,
    ownership_epoch: int,
    kind: work_pb2.WorkFailureKind.ValueType,
    reason: str,
    evidence: Iterable[work_pb2.Evidence],
    *,
    usage_delta: common_pb2.ResourceVector | None = None,
) -> CommandBody:
    """``work.fail`` as the Worker: classify the failure and attach failure Evidence.

    >>> fail("wi-1", "lease-a", 1, work_pb2.WORK_FAILURE_KIND_TRANSIENT, "API down", []).body.reason
    'API down'
    """
    return CommandBody(
        "work_fail",
        work_pb2.WorkFail(
            work_item_id=work_item_id,
            lease_id=lease_id,
            ownership_epoch=ownership_epoch,
            kind=kind,
            reason=reason,
            evidence=list(evidence),
            usage_delta=usage_delta,
        ),
    )


class PendingCommands:
    """COMMAND frames waiting for their RESULT, by command id (re-sent after a reconnect)."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[pb.CommandFrame, asyncio.Future[command_pb2.CommandResult]]] = {}

    def add(self, frame: pb.CommandFrame) -> asyncio.Future[command_pb2.CommandResult]:
        if frame.command_id in self._pending:
            raise ValueError(f"command {frame.command_id} is already waiting for its result")
        future: asyncio.Future[command_pb2.CommandResult] = asyncio.get_running_loop().create_future()
        self._pending[frame.command_id] = (frame, future)
        return future

    def frames(self) -> list[pb.CommandFrame]:
        return [frame for frame, _ in self._pending.values()]

    def resolve(self, result: pb.ResultFrame) -> None:
        if result.HasField("rejection"):
            self.fail(result.command_id, CommandRejected(result.command_id, result.rejection))
            return
        entry = self._pending.get(result.command_id)
        if entry is not None and not entry[1].done():
            entry[1].set_result(result.result)

    def fail(self, command_id: str, error: AgentError) -> None:
        entry = self._pending.get(command_id)
        if entry is not None and not entry[1].done():
            entry[1].set_exception(error)

    def fail_all(self, error: AgentError) -> None:
        for command_id in list(self._pending):
            self.fail(command_id, error)

    def forget(self, command_id: str) -> None:
        self._pending.pop(command_id, None)
