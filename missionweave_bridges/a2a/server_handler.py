"""The A2A RequestHandler of `mwp bridge a2a-server`: each call acts as the MissionWeave identity its
bearer token stands for (server_config.py), through that identity's own session on the mesh.

Reads: GetTask, SubscribeToTask and the streaming send fold the Group's events as the identity may
read them (``AuthorityService.ReadEvents``, its member view), each batch verified against the
Authority's key before anything parses it (as the SDK's subscriptions do), in sequence order, with
no sequence twice. A2A clients resume with the ``mwp.cursor`` of the last event they processed
(``MWP-Cursor`` request header / gRPC metadata): every later event once, in order; a cursor older
than ``replay_window`` gets a snapshot flagged as such, then the live tail.

Writes: a message is a ``work.propose`` (any member but an observer may propose, MW-9.1-17); its
command id and proposal id derive from the identity and the A2A message id, so a resent message is
the same command and the same task. CancelTask is ``mission.cancel`` (the MissionOwner) or
``work.cancel`` (the Coordinator): the Authority decides, and its refusal comes back as an A2A error
with the MWP reason in it (server_errors.py).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import grpc
from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import (
    InternalError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf import json_format
from nacl.signing import SigningKey

from missionweave.kernel import ids
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.transport import ClientTLS
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.sdk.event_verification import AuthorityVerifier, NotVerified
from missionweave.v1 import authority_service_pb2, common_pb2, event_pb2, mission_pb2, work_pb2
from missionweave_bridges.a2a import server_errors
from missionweave_bridges.a2a.server_tasks import (
    CURSOR,
    CURSOR_TOO_OLD,
    MISSION_STATES,
    REQUESTED_CURSOR,
    SNAPSHOT,
    WORK_ITEM_STATES,
    BadTaskId,
    TaskRef,
    Tracker,
    Update,
    with_bytes,
)

log = logging.getLogger("missionweave_bridges.a2a.server")

CURSOR_HEADER = "mwp-cursor"
MAX_PAGE = 100
DEFAULT_PAGE = 50


class IdentityUser(User):
    """The A2A caller, once its bearer token matched a served identity."""

    def __init__(self, identity_id: str) -> None:
        self.identity_id = identity_id

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self.identity_id


@dataclass
class Acting:
    """One served identity: its session on the mesh and the reads proven as it."""

    identity_id: str
    mesh: MeshClient
    signer: SessionSigner
    verifier: AuthorityVerifier


async def open_identity(target: str, tls: ClientTLS | None, identity_id: str, key: SigningKey) -> Acting:
    """Opens the identity's session (MW-11.3-09: it fences any other session of the identity, so an
    identity served here is served by this process only)."""
    mesh = MeshClient(target, tls)
    signer = await mesh.open_session(identity_id, key)
    mesh.read_as(signer)
    response = await mesh.authority.GetAuthorityKey(authority_service_pb2.GetAuthorityKeyRequest())
    earlier = {k.key_id: k.public_key for k in response.keys}
    return Acting(identity_id, mesh, signer, AuthorityVerifier(response.key_id, response.public_key, earlier))


def _header(context: ServerCallContext, name: str) -> str:
    headers = context.state.get("headers")
    if isinstance(headers, dict):
        for key, value in headers.items():
            if key.lower() == name:
                return str(value)
    grpc_context = context.state.get("grpc_context")
    if grpc_context is not None:
        for key, value in grpc_context.invocation_metadata() or ():
            if key.lower() == name:
                return value.decode() if isinstance(value, bytes) else str(value)
    return ""


def _message_text(message: a2a.Message) -> str:
    return "\n".join(p.text for p in message.parts if p.text).strip()


def _message_data(message: a2a.Message) -> dict[str, object]:
    """The structured proposal, when the message carries a data part (an object)."""
    for part in message.parts:
        if part.HasField("data"):
            value = json_format.MessageToDict(part.data)
            if isinstance(value, dict):
                return value
            raise InvalidParamsError(
                "a data part must be a JSON object (title, goal, rationale, parent_work_item_id, contract)"
            )
    return {}


@dataclass(frozen=True)
class Cursor:
    """Where an A2A client stands: through Group sequence ``sequence``, or, when one event became
    several A2A events (a submission's artifacts and its status), through its part ``part``. The
    wire form is ``N`` or ``N:K``: what the events' ``mwp.cursor`` says."""

    sequence: int
    part: int | None = None

    @staticmethod
    def parse(raw: str) -> Cursor:
        sequence, _, part = raw.strip().partition(":")
        cursor = Cursor(int(sequence), int(part) if part else None)
        if cursor.sequence < 0 or (cursor.part is not None and cursor.part < 0):
            raise ValueError(raw)
        return cursor

    def __str__(self) -> str:
        return str(self.sequence) if self.part is None else f"{self.sequence}:{self.part}"

    def after(self, sequence: int, updates: list[Event]) -> list[Event]:
        """The A2A events of Group sequence ``sequence`` that lie after this cursor."""
        if sequence < self.sequence:
            return []
        if sequence == self.sequence:
            return updates[self.part + 1 :] if self.part is not None else []
        return updates


def numbered(sequence: int, updates: list[Update]) -> list[Event]:
    """Each A2A event's resume cursor: ``N`` on the last one an event became, ``N:K`` before it."""
    for i, update in enumerate(updates):
        if i < len(updates) - 1:
            update.metadata.fields[CURSOR].string_value = f"{sequence}:{i}"
    return list(updates)


# How many (identity, task) folds GetTask keeps (each a few protobuf messages and its artifacts' refs).
FOLDS_KEPT = 1024


class MissionTaskHandler(RequestHandler):
    def __init__(
        self,
        identities: dict[str, Acting],
        card: a2a.AgentCard,
        *,
        replay_window: int = 10_000,
        inline_bytes: int = 65_536,
    ) -> None:
        self.identities = identities
        self.card = card
        self.replay_window = replay_window
        self.inline_bytes = inline_bytes
        # The last fold of each (identity, task) GetTask answered, and the Group sequence it covers:
        # a client polling GetTask costs the events since its last answer, not the whole log. Every
        # call still reads through ReadEvents as the identity, so a revoked reader gets nothing.
        self._folds: OrderedDict[tuple[str, str], tuple[Tracker, int]] = OrderedDict()

    # ---------------------------------------------------------------- who is calling

    def _acting(self, context: ServerCallContext) -> Acting:
        user = context.user
        if isinstance(user, IdentityUser) and user.identity_id in self.identities:
            return self.identities[user.identity_id]
        # The transports refuse a request without a valid token before it gets here
        # (server_app.py); this is the handler's own guard.
        raise InvalidParamsError("no served identity for this request: send Authorization: Bearer <token>")

    @staticmethod
    def _ref(task_id: str) -> TaskRef:
        try:
            return TaskRef.parse(task_id)
        except BadTaskId as err:
            raise TaskNotFoundError(str(err)) from None

    # ---------------------------------------------------------------- reading a Group

    async def _batches(
        self, acting: Acting, group_id: str, after: int, follow: bool
    ) -> AsyncIterator[tuple[authority_service_pb2.ReadEventsResponse, list[event_pb2.Event]]]:
        """The Group's events after ``after`` as the identity may see them, each batch verified."""
        call = acting.mesh.authority.ReadEvents(
            authority_service_pb2.ReadEventsRequest(group_id=group_id, after_sequence=after, follow=follow)
        )
        last = after
        try:
            async for batch in call:
                try:
                    events = [linked.event for linked in acting.verifier.events(batch.events)]
                except NotVerified as err:
                    raise InternalError(
                        f"an event of {group_id} did not verify against the Authority key: {err}"
                    ) from err
                fresh = []
                for event in events:
                    if event.group_id != group_id:
                        raise InternalError(
                            f"event {event.event_id} names Group {event.group_id}, not {group_id}"
                        )
                    if event.sequence > last:  # never one twice, never out of order
                        fresh.append(event)
                        last = event.sequence
                yield batch, fresh
        except grpc.RpcError as err:
            raise server_errors.for_read(err) from err
        finally:
            call.cancel()

    async def _fold(self, acting: Acting, ref: TaskRef) -> tuple[Tracker, int]:
        """The task folded to the Group's head; the head it reflects (the task's cursor). It goes on
        from this identity's last fold of the task, when one is kept."""
        key = (acting.identity_id, ref.task_id)
        kept = self._folds.get(key)
        tracker, covered = (copy.deepcopy(kept[0]), kept[1]) if kept else (Tracker(ref), 0)
        async for batch, events in self._batches(acting, ref.group_id, covered, follow=False):
            for event in events:
                tracker.apply(event)
            covered = max(covered, batch.last_sequence)
        if ref.kind == "mission":
            tracker.exists = True  # ReadEvents answered: the identity may read the Group
        if not tracker.exists:
            raise TaskNotFoundError(f"no task {ref.task_id} visible to {acting.identity_id}")
        self._folds[key] = (copy.deepcopy(tracker), covered)
        self._folds.move_to_end(key)
        while len(self._folds) > FOLDS_KEPT:
            self._folds.popitem(last=False)
        return tracker, covered

    async def _inline(self, acting: Acting, update: Event) -> Event:
        """Small artifacts travel as bytes (fetched from the artifact store, verified by their hash)."""
        if not isinstance(update, a2a.TaskArtifactUpdateEvent):
            return update
        size = int(update.artifact.metadata.fields["mwp.size_bytes"].string_value or "0")
        if size == 0 or size > self.inline_bytes:
            return update
        algorithm, _, hex_ = update.artifact.artifact_id.partition(":")
        try:
            data = await acting.mesh.download(
                common_pb2.Digest(algorithm=algorithm, hex=hex_, size_bytes=size)
            )
        except grpc.RpcError as err:  # not readable by this identity, or gone: the reference stays
            log.info("artifact %s not inlined: %s", update.artifact.artifact_id, err.code())
            return update
        out = a2a.TaskArtifactUpdateEvent()
        out.CopyFrom(update)
        out.artifact.CopyFrom(with_bytes(update.artifact, data))
        return out

    async def _task(self, acting: Acting, tracker: Tracker, cursor: int, **flags: object) -> a2a.Task:
        task = tracker.task(cursor, **flags)
        artifacts = []
        for artifact in task.artifacts:
            update = await self._inline(acting, a2a.TaskArtifactUpdateEvent(artifact=artifact))
            assert isinstance(update, a2a.TaskArtifactUpdateEvent)
            artifacts.append(update.artifact)
        del task.artifacts[:]
        task.artifacts.extend(artifacts)
        return task

    async def _follow(
        self, acting: Acting, ref: TaskRef, resume: Cursor | None, *, snapshot_when_terminal: bool
    ) -> AsyncGenerator[Event]:
        """The task's event stream. ``resume`` None: a snapshot at the head, then the live tail;
        ``resume`` a cursor: every A2A event after it once, in order (a snapshot flagged
        ``mwp.cursor_too_old`` when it lies before the replay window), then the live tail. Ends
        after the task reaches a terminal A2A state."""
        tracker, covered, first, replaying = Tracker(ref), 0, True, resume is not None
        async for batch, events in self._batches(acting, ref.group_id, 0, follow=False):
            if first and resume is not None:
                first = False
                if resume.sequence > batch.head_sequence:
                    raise InvalidParamsError(
                        f"cursor {resume} is ahead of the Group's head {batch.head_sequence}"
                    )
                if batch.head_sequence - resume.sequence > self.replay_window:
                    replaying = False  # older than the retained window: a snapshot instead
            for event in events:
                updates = numbered(event.sequence, tracker.apply(event))
                if replaying and resume is not None and tracker.exists:
                    for update in resume.after(event.sequence, updates):
                        yield await self._inline(acting, update)
            covered = max(covered, batch.last_sequence)
        if ref.kind == "mission":
            tracker.exists = True
        if not tracker.exists:
            raise TaskNotFoundError(f"no task {ref.task_id} visible to {acting.identity_id}")
        if not replaying:
            if tracker.terminal and resume is None and not snapshot_when_terminal:
                state = a2a.TaskState.Name(tracker.state)  # type: ignore[arg-type]
                raise UnsupportedOperationError(f"task {ref.task_id} is in a terminal state ({state})")
            flags: dict[str, object] = {SNAPSHOT: True}
            if resume is not None:
                flags.update({CURSOR_TOO_OLD: True, REQUESTED_CURSOR: str(resume)})
            yield await self._task(acting, tracker, covered, **flags)
        if tracker.terminal:
            return
        async for _batch, events in self._batches(acting, ref.group_id, covered, follow=True):
            for event in events:
                for update in numbered(event.sequence, tracker.apply(event)):
                    yield await self._inline(acting, update)
                if tracker.terminal:
                    return

    # ---------------------------------------------------------------- A2A methods

    async def on_get_task(self, params: a2a.GetTaskRequest, context: ServerCallContext) -> a2a.Task | None:
        acting = self._acting(context)
        tracker, covered = await self._fold(acting, self._ref(params.id))
        return await self._task(acting, tracker, covered)

    async def on_subscribe_to_task(
        self, params: a2a.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        acting = self._acting(context)
        raw = _header(context, CURSOR_HEADER)
        try:
            resume = Cursor.parse(raw) if raw else None
        except ValueError:
            raise InvalidParamsError(
                f"{CURSOR_HEADER} must be an mwp.cursor this endpoint sent (N or N:K), not {raw!r}"
            ) from None
        async for event in self._follow(acting, self._ref(params.id), resume, snapshot_when_terminal=False):
            yield event

    async def _propose(self, acting: Acting, params: a2a.SendMessageRequest) -> TaskRef:
        message = params.message
        if not message.message_id:
            raise InvalidParamsError("message.message_id is required: it is the proposal's idempotency key")
        data = _message_data(message)
        group_id, parent = message.context_id, str(data.get("parent_work_item_id", ""))
        if message.task_id:
            target = self._ref(message.task_id)
            if group_id and group_id != target.group_id:
                raise InvalidParamsError(f"context_id {group_id} is not the Group of task {message.task_id}")
            group_id = target.group_id
            if target.kind == "workitem" and not parent:
                parent = target.item_id
        if not group_id:
            raise InvalidParamsError(
                "name the Group: context_id = the Group id (or task_id = one of its tasks)"
            )
        text = _message_text(message)
        goal = str(data.get("goal", "")) or text
        title = str(data.get("title", "")) or (goal.splitlines()[0][:200] if goal else "")
        if not title:
            raise InvalidParamsError(
                "the message says nothing to propose: add a text part (or a data part with a goal)"
            )
        contract = work_pb2.WorkContract()
        proposed = data.get("contract")
        if isinstance(proposed, dict):
            try:
                json_format.ParseDict(proposed, contract)
            except json_format.ParseError as err:
                raise InvalidParamsError(
                    f"data.contract is not a missionweave.v1.WorkContract: {err}"
                ) from err
        if not contract.goal:
            contract.goal = goal
        # The A2A message id is the idempotency key: the same identity resending it issues the same
        # command (same id, same body: the Authority answers it from the log, never twice).
        proposal_id = ids.derived_id("prop", "a2a", acting.identity_id, message.message_id)
        command_id = ids.derived_id("cmd", "a2a-propose", acting.identity_id, message.message_id)
        body = work_pb2.WorkPropose(
            proposal_id=proposal_id,
            title=title,
            contract=contract,
            parent_work_item_id=parent,
            rationale=str(data.get("rationale", ""))
            or (text if text != goal else "")
            or f"proposed through A2A by {acting.identity_id}",
        )
        ref = TaskRef("proposal", group_id, proposal_id)
        try:
            await acting.mesh.execute_as(acting.signer, group_id, "work_propose", body, command_id=command_id)
        except grpc.RpcError as err:
            rejection = rejection_from_rpc_error(err)
            if (
                rejection is not None
                and rejection.reason == server_errors.R.REJECTION_REASON_COMMAND_ID_REUSED
            ):
                # The id was used by an earlier session of the endpoint (a restart): the same
                # message if it proposed the same thing, else a client reusing a message id.
                tracker, _ = await self._fold(acting, ref)
                if tracker.proposal is not None and tracker.proposal.SerializeToString(
                    deterministic=True
                ) == body.SerializeToString(deterministic=True):
                    return ref
            raise server_errors.for_command(err, "SendMessage") from err
        return ref

    async def on_message_send(
        self, params: a2a.SendMessageRequest, context: ServerCallContext
    ) -> a2a.Task | a2a.Message:
        acting = self._acting(context)
        ref = await self._propose(acting, params)
        tracker, covered = await self._fold(acting, ref)
        return await self._task(acting, tracker, covered)

    async def on_message_send_stream(
        self, params: a2a.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        acting = self._acting(context)
        ref = await self._propose(acting, params)
        async for event in self._follow(acting, ref, None, snapshot_when_terminal=True):
            yield event

    async def on_cancel_task(
        self, params: a2a.CancelTaskRequest, context: ServerCallContext
    ) -> a2a.Task | None:
        acting = self._acting(context)
        ref = self._ref(params.id)
        tracker, _ = await self._fold(acting, ref)
        if tracker.terminal:
            raise TaskNotCancelableError(f"task {ref.task_id} is already {a2a.TaskState.Name(tracker.state)}")  # type: ignore[arg-type]
        reason = ""
        if params.HasField("metadata") and "reason" in params.metadata.fields:
            reason = params.metadata.fields["reason"].string_value
        reason = reason or f"cancelled through A2A by {acting.identity_id}"
        try:
            if ref.kind == "mission":
                await acting.mesh.execute_as(
                    acting.signer, ref.group_id, "mission_cancel", mission_pb2.MissionCancel(reason=reason)
                )
            elif tracker.work_item_id:
                epoch = await acting.mesh.coordinator_epoch(ref.group_id)
                await acting.mesh.execute_as(
                    acting.signer,
                    ref.group_id,
                    "work_cancel",
                    work_pb2.WorkCancel(
                        work_item_id=tracker.work_item_id, coordinator_epoch=epoch, reason=reason
                    ),
                )
            else:
                raise TaskNotCancelableError(
                    f"proposal {ref.item_id} is not authorized yet: MWP has no withdrawal of a proposal"
                )
        except grpc.RpcError as err:
            raise server_errors.for_command(err, "CancelTask") from err
        tracker, covered = await self._fold(acting, ref)
        return await self._task(acting, tracker, covered)

    async def on_list_tasks(
        self, params: a2a.ListTasksRequest, context: ServerCallContext
    ) -> a2a.ListTasksResponse:
        """The Missions the identity may read and their WorkItems, from the read models (the same
        state tables as the fold), by Group then WorkItem id; ``page_token`` is an offset."""
        acting = self._acting(context)
        tasks: list[a2a.Task] = []
        try:
            missions = await acting.mesh.missions()
            for summary in sorted(missions, key=lambda m: m.group_id):
                if params.context_id and summary.group_id != params.context_id:
                    continue
                mission_task = a2a.Task(
                    id=TaskRef("mission", summary.group_id).task_id,
                    context_id=summary.group_id,
                    status=a2a.TaskStatus(
                        state=MISSION_STATES.get(summary.state, a2a.TASK_STATE_UNSPECIFIED)
                    ),  # type: ignore[arg-type]
                )
                mission_task.metadata.update(
                    {"mwp.state": mission_pb2.MissionState.Name(summary.state), "mwp.title": summary.title}
                )
                tasks.append(mission_task)
                for item in await acting.mesh.work_items(summary.group_id):
                    task = a2a.Task(
                        id=TaskRef("workitem", summary.group_id, item.work_item_id).task_id,
                        context_id=summary.group_id,
                        status=a2a.TaskStatus(
                            state=WORK_ITEM_STATES.get(item.state, a2a.TASK_STATE_UNSPECIFIED)
                        ),  # type: ignore[arg-type]
                    )
                    task.metadata.update(
                        {"mwp.state": work_pb2.WorkItemState.Name(item.state), "mwp.title": item.title}
                    )
                    tasks.append(task)
        except grpc.RpcError as err:
            raise server_errors.for_read(err) from err
        if params.status:
            tasks = [t for t in tasks if t.status.state == params.status]
        size = min(params.page_size or DEFAULT_PAGE, MAX_PAGE)
        try:
            offset = int(params.page_token or "0")
        except ValueError:
            raise InvalidParamsError(
                f"page_token {params.page_token!r} was not issued by this endpoint"
            ) from None
        page = tasks[offset : offset + size]
        following = offset + size
        return a2a.ListTasksResponse(
            tasks=page,
            next_page_token=str(following) if following < len(tasks) else "",
            page_size=size,
            total_size=len(tasks),
        )

    async def on_get_extended_agent_card(
        self, params: a2a.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> a2a.AgentCard:
        self._acting(context)
        return self.card

    # Push notifications: the endpoint streams; it calls no client back.

    async def on_create_task_push_notification_config(
        self, params: a2a.TaskPushNotificationConfig, context: ServerCallContext
    ) -> a2a.TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: a2a.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> a2a.TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: a2a.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> a2a.ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: a2a.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError


async def close_identities(identities: dict[str, Acting]) -> None:
    await asyncio.gather(*(a.mesh.channel.close() for a in identities.values()), return_exceptions=True)
