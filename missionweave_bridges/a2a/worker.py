"""An A2A agent as a MissionWeave Worker: the handler the Worker runtime runs for every WorkItem
placed in the bridge's slots. Each ownership of a WorkItem is one A2A task (a new one after a
preemption, which cancels the running one); the journal (task_journal.py) maps it to that task and
records how far the bridge followed it, so a restarted bridge re-attaches instead of sending the
work again. docs/bridge-a2a-worker.md has the mapping tables."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import grpc
import httpx
from a2a.client import (
    A2ACardResolver,
    AuthInterceptor,
    Client,
    ClientConfig,
    ClientFactory,
    CredentialService,
)
from a2a.client.client import ClientCallContext
from a2a.client.errors import A2AClientError, A2AClientTimeoutError, AgentCardResolutionError
from a2a.client.interceptors import ClientCallInterceptor
from a2a.types import a2a_pb2 as a2a
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import A2AError, TaskNotCancelableError
from google.protobuf.timestamp_pb2 import Timestamp

from missionweave.sdk.agent import CommandRejected
from missionweave.sdk.offline import OfflineForbidden
from missionweave.sdk.worker import Blocked, Failed, Outcome, Paused, Slot, WorkResult
from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.a2a.mapping import (
    INTERRUPTED,
    TERMINAL,
    InputPart,
    answer_message,
    artifact_content,
    context_id,
    evidence_for,
    failure_of,
    message_text,
    state_name,
    task_failure,
    work_message,
)
from missionweave_bridges.a2a.task_journal import TaskEntry, TaskJournal

log = logging.getLogger(__name__)

# A task the agent does not stream (or a stream that ended early) is polled this often.
POLL_S = 0.5
NO_DEADLINE_ESTIMATE = timedelta(hours=1)  # the estimate a report states for a contract with no deadline
TRANSPORTS = {"grpc": TransportProtocol.GRPC.value, "jsonrpc": TransportProtocol.JSONRPC.value}


class BridgeError(Exception):
    """The A2A agent cannot be bridged as configured: said once, at start, in words."""


async def resolve_card(url: str, *, timeout_s: float = 10.0) -> a2a.AgentCard:
    """The agent's card from ``url``/.well-known/agent-card.json, through the SDK's resolver."""
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        try:
            return await A2ACardResolver(http, url).get_agent_card()
        except AgentCardResolutionError as err:
            raise BridgeError(f"cannot read the A2A Agent Card at {url}: {err}") from None


class MissingCredentials(BridgeError):
    """The agent's card requires credentials the bridge config does not hold (a config problem)."""


class SchemeCredentials(CredentialService):
    """The credential configured for each of the agent card's security schemes, by scheme name; the
    SDK's AuthInterceptor puts it where the scheme says (a bearer token, an API key header)."""

    def __init__(self, by_scheme: Mapping[str, str]) -> None:
        self.by_scheme = dict(by_scheme)

    async def get_credentials(
        self, security_scheme_name: str, context: ClientCallContext | None
    ) -> str | None:
        return self.by_scheme.get(security_scheme_name)


def missing_credentials(card: a2a.AgentCard, by_scheme: Mapping[str, str]) -> list[str]:
    """The schemes of the card's first satisfiable requirement still lacking a credential: empty when
    the card asks for none, or when one of its alternative requirements is fully configured."""
    requirements = [list(r.schemes) for r in card.security_requirements]
    if not requirements or any(all(s in by_scheme for s in schemes) for schemes in requirements):
        return []
    return [s for s in requirements[0] if s not in by_scheme]


def open_client(
    card: a2a.AgentCard, transport: str = "", credentials: Mapping[str, str] | None = None
) -> Client:
    """A client on the transport the card offers: ``transport`` ("grpc" or "jsonrpc") when the
    config names one (refused if the card does not offer it), else the card's own preference.
    ``credentials`` (by security scheme name) are sent as the card's schemes say; a card whose
    security the credentials do not satisfy is refused here, before any task is sent."""
    by_scheme = dict(credentials or {})
    lacking = missing_credentials(card, by_scheme)
    if lacking:
        raise MissingCredentials(
            f"the A2A agent {card.name!r} requires credentials for {', '.join(lacking)}: "
            f'add them under [credentials] in the bridge config (scheme = "FILE")'
        )
    offered = [i.protocol_binding for i in card.supported_interfaces]
    if transport:
        if transport not in TRANSPORTS:
            raise BridgeError(f"transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
        wanted = [TRANSPORTS[transport]]
    else:
        wanted = list(TRANSPORTS.values())
    if not any(b in wanted for b in offered):
        raise BridgeError(
            f"the A2A agent {card.name!r} offers {', '.join(offered) or 'no interface'}; "
            f"the bridge speaks {', '.join(wanted)}"
        )
    config = ClientConfig(
        streaming=card.capabilities.streaming,
        supported_protocol_bindings=wanted,
        grpc_channel_factory=grpc.aio.insecure_channel,
    )
    interceptors: list[ClientCallInterceptor] | None = (
        [AuthInterceptor(SchemeCredentials(by_scheme))] if by_scheme else None
    )
    return ClientFactory(config).create(card, interceptors=interceptors)


@dataclass
class _Followed:
    """Where following a task got to: its latest snapshot, or that it was preempted."""

    task: a2a.Task | None = None
    preempted: bool = False


class A2AWorker:
    """The Worker runtime's handler for one bridged A2A agent (``async def handle(slot)``)."""

    def __init__(self, client: Client, card: a2a.AgentCard, journal: TaskJournal, agent_id: str) -> None:
        self.client = client
        self.card = card
        self.journal = journal
        self.agent_id = agent_id

    async def __call__(self, slot: Slot) -> Outcome:
        try:
            return await self._handle(slot)
        except (A2AError, A2AClientError) as err:
            failure = failure_of(err)
            log.warning("%s/%s: %s", slot.group_id, slot.work_item_id, failure.reason)
            evidence = evidence_for(
                slot.contract, [], passed=False, summary=failure.reason, producer_id=self.agent_id
            )
            return Failed(kind=failure.kind, reason=failure.reason, evidence=evidence)

    async def _handle(self, slot: Slot) -> Outcome:
        entry = self.journal.get((slot.group_id, slot.work_item_id, slot.ownership_epoch))
        if entry is None:
            entry = self._adopt(slot)
        await self._supersede_older(slot)
        if entry is None or entry.superseded:
            return await self._start(slot, entry)
        if not entry.task_id:  # sent, answer unseen (the bridge stopped): did the agent get it?
            found = await self._find(entry)
            if found is None:
                return await self._send(slot, entry)  # never arrived: the same message, same id
            entry = self.journal.update(entry, task_id=found.id, state=state_name(found.status.state))
        return await self._resume(slot, entry)

    # ------------------------------------------------------------ starting

    async def _start(self, slot: Slot, before: TaskEntry | None) -> Outcome:
        """A new task for this ownership: the first, or the next after a preemption canceled one."""
        attempt = before.attempt + 1 if before is not None else 0
        previous = (
            (*before.previous_task_ids, before.task_id) if before is not None and before.task_id else ()
        )
        entry = self.journal.record(
            TaskEntry(
                group_id=slot.group_id,
                work_item_id=slot.work_item_id,
                ownership_epoch=slot.ownership_epoch,
                context_id=context_id(slot.group_id, slot.work_item_id, slot.ownership_epoch),
                # Deterministic (MW-16-13): a resend after a crash carries the same id.
                message_id=slot.idempotency_key(f"a2a-message-{attempt}"),
                attempt=attempt,
                previous_task_ids=previous,
                contract_revision=slot.contract.revision or 1,
            )
        )
        return await self._send(slot, entry)

    async def _send(self, slot: Slot, entry: TaskEntry) -> Outcome:
        inputs = [
            InputPart(
                name=i.name,
                media_type=i.ref.media_type or "application/octet-stream",
                data=await slot.read(i),
                digest_hex=i.ref.digest.hex,
            )
            for i in slot.inputs
        ]
        message = work_message(
            slot.contract,
            inputs,
            message_id=entry.message_id,
            context_id=entry.context_id,
            reference_task_ids=entry.previous_task_ids,
        )
        stream = self.client.send_message(a2a.SendMessageRequest(message=message))
        return await self._run(slot, entry, stream)

    async def _find(self, entry: TaskEntry) -> a2a.Task | None:
        """The task the journal's message started, by its context (each ownership has its own)."""
        listed = await self.client.list_tasks(
            a2a.ListTasksRequest(context_id=entry.context_id, history_length=100)
        )
        for task in listed.tasks:
            if any(m.message_id == entry.message_id for m in task.history):
                return task
        return None

    def _adopt(self, slot: Slot) -> TaskEntry | None:
        """A new ownership of work this bridge already sent the agent (its lease lapsed while the
        bridge was down, and the Coordinator offered it again to the same agent): the earlier task,
        sent for the same contract revision and not failed or canceled, is taken over rather than
        run a second time."""
        usable = {"", *(state_name(s) for s in (a2a.TASK_STATE_COMPLETED, *INTERRUPTED))}
        usable |= {state_name(s) for s in (a2a.TASK_STATE_SUBMITTED, a2a.TASK_STATE_WORKING)}
        for old in reversed(self.journal.of_work_item(slot.group_id, slot.work_item_id)):
            if old.ownership_epoch >= slot.ownership_epoch:
                continue
            if (
                old.superseded
                or old.state not in usable
                or old.contract_revision != (slot.contract.revision or 1)
            ):
                return None
            log.info(
                "%s/%s: ownership %d takes over A2A task %s of ownership %d",
                slot.group_id,
                slot.work_item_id,
                slot.ownership_epoch,
                old.task_id,
                old.ownership_epoch,
            )
            self.journal.update(old, superseded=True)  # not canceled: it is this ownership's task now
            return self.journal.record(
                replace(old, ownership_epoch=slot.ownership_epoch, adopted_from=old.ownership_epoch)
            )
        return None

    async def _supersede_older(self, slot: Slot) -> None:
        """A task of an earlier ownership of this WorkItem is fenced (its results cannot be
        submitted): canceled, so that no two tasks run the same WorkItem."""
        for old in self.journal.of_work_item(slot.group_id, slot.work_item_id):
            if old.ownership_epoch >= slot.ownership_epoch or old.superseded:
                continue
            if old.task_id and old.state not in {state_name(s) for s in TERMINAL}:
                try:
                    await self._cancel(old.task_id)
                except TaskNotCancelableError:  # it ended (or will not stop): nothing of it is submitted
                    log.info(
                        "%s/%s: A2A task %s was not canceled", slot.group_id, slot.work_item_id, old.task_id
                    )
            self.journal.update(old, superseded=True)

    # ------------------------------------------------------------ following

    async def _resume(self, slot: Slot, entry: TaskEntry) -> Outcome:
        """A restart, or the start after a block: where is the task now?"""
        task = await self.client.get_task(a2a.GetTaskRequest(id=entry.task_id, history_length=100))
        entry = self.journal.update(entry, state=state_name(task.status.state))
        if task.status.state in INTERRUPTED:
            if slot.unblocked_at:  # this start follows the Coordinator's answer
                # One id per unblock: an answer recorded and then lost to a crash is sent again
                # with the same id; one the task's history holds is not sent twice.
                answer_id = slot.idempotency_key(f"a2a-answer-{slot.unblocked_at}")
                if not any(m.message_id == answer_id for m in task.history):
                    if answer_id not in entry.answers:
                        entry = self.journal.update(entry, answers=(*entry.answers, answer_id))
                    return await self._answer(slot, entry, answer_id)
            return await self._ended(slot, entry, task)  # the agent asks (again): the question stands
        if task.status.state in TERMINAL:
            return await self._ended(slot, entry, task)
        return await self._run(
            slot, entry, self.client.subscribe(a2a.SubscribeToTaskRequest(id=entry.task_id))
        )

    async def _answer(self, slot: Slot, entry: TaskEntry, answer_id: str) -> Outcome:
        message = answer_message(
            slot.unblocked_with, message_id=answer_id, task_id=entry.task_id, context_id=entry.context_id
        )
        return await self._run(slot, entry, self.client.send_message(a2a.SendMessageRequest(message=message)))

    async def _run(
        self,
        slot: Slot,
        entry: TaskEntry,
        stream: AsyncIterator[a2a.StreamResponse],
        *,
        preemptible: bool = True,
    ) -> Outcome:
        """Follows the task until it ends or waits for input, or the work is asked to pause."""
        holder = [entry]
        named = asyncio.Event()  # the agent named the task: it can be canceled
        if entry.task_id:
            named.set()
        following = asyncio.create_task(self._follow(slot, holder, stream, named))
        pause = slot.preemption_requested if preemptible else asyncio.Event()
        asked = asyncio.create_task(pause.wait())
        try:
            await asyncio.wait({following, asked}, return_when=asyncio.FIRST_COMPLETED)
            if not following.done() and not named.is_set():
                # Asked to pause before the agent named its task: pausing now would leave that
                # task running unseen, and the resumed start would send the work again.
                naming = asyncio.create_task(named.wait())
                try:
                    await asyncio.wait({following, naming}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    naming.cancel()
        finally:
            asked.cancel()
            if not following.done():  # asked to pause, or this handler itself was cancelled
                following.cancel()
                await asyncio.gather(following, return_exceptions=True)
        if following.cancelled():
            return await self._preempt(slot, holder[0])
        followed = following.result()
        entry = holder[0]
        if followed.preempted:
            return await self._preempt(slot, entry)
        assert followed.task is not None
        return await self._ended(slot, entry, followed.task)

    async def _follow(
        self,
        slot: Slot,
        holder: list[TaskEntry],
        stream: AsyncIterator[a2a.StreamResponse],
        named: asyncio.Event,
    ) -> _Followed:
        """Each A2A event: journaled (task id, state, count), reported as progress; then the task's
        final snapshot (with every artifact) once it ends or waits for input."""
        state = 0
        while True:
            try:
                async for event in stream:
                    kind = event.WhichOneof("payload")
                    entry = holder[0]
                    if kind == "message":  # the agent answered with a message, no task: the work is done
                        return _Followed(task=_message_task(entry, event.message))
                    state = await self._seen(slot, holder, event, state)
                    if holder[0].task_id:
                        named.set()
                    if state in TERMINAL or state in INTERRUPTED:
                        break
                break
            except A2AClientTimeoutError:
                # A quiet agent, not a failed one: over HTTP, no event within the client's read
                # timeout ends the stream. Subscribe again (SubscribeToTask) once the task is named.
                if not holder[0].task_id:
                    raise
                log.info(
                    "%s/%s: A2A task %s quiet: subscribing again",
                    slot.group_id,
                    slot.work_item_id,
                    holder[0].task_id,
                )
                now = await self.client.get_task(a2a.GetTaskRequest(id=holder[0].task_id))
                if now.status.state in TERMINAL or now.status.state in INTERRUPTED:
                    break
                stream = self.client.subscribe(a2a.SubscribeToTaskRequest(id=holder[0].task_id))
        while True:  # the snapshot with every artifact; polled if the stream ended first
            task = await self.client.get_task(a2a.GetTaskRequest(id=holder[0].task_id, history_length=100))
            if task.status.state in TERMINAL or task.status.state in INTERRUPTED:
                holder[0] = self.journal.update(holder[0], state=state_name(task.status.state))
                return _Followed(task=task)
            await asyncio.sleep(POLL_S)

    async def _seen(self, slot: Slot, holder: list[TaskEntry], event: a2a.StreamResponse, state: int) -> int:
        """One A2A event journaled (task id, state, count) and reported; the task's state after it."""
        kind = event.WhichOneof("payload")
        entry = holder[0]
        changes: dict[str, object] = {"events": entry.events + 1}
        if kind == "task":
            changes["task_id"] = event.task.id
            state = event.task.status.state
        elif kind == "status_update":
            changes["task_id"] = event.status_update.task_id
            state = event.status_update.status.state
            await self._progress(slot, state, message_text(event.status_update.status.message))
        elif kind == "artifact_update":
            changes["task_id"] = event.artifact_update.task_id
            artifact = event.artifact_update.artifact
            await self._progress(slot, state, f"artifact {artifact.name or artifact.artifact_id}")
        if state:
            changes["state"] = state_name(state)
        holder[0] = self.journal.update(entry, **changes)
        return state

    async def _progress(self, slot: Slot, state: int, note: str) -> None:
        phase = f"a2a {state_name(state)}" if state else "a2a"
        # A2A carries no estimate: the contract's deadline is the only date known, said as such.
        deadline = slot.contract.deadline if slot.contract.HasField("deadline") else None
        if deadline is None:
            deadline = Timestamp()
            deadline.FromDatetime(datetime.now(UTC) + NO_DEADLINE_ESTIMATE)
        report = wp.ProgressReport(
            phase=phase,
            next_checkpoint=wp.PlannedCheckpoint(
                description="the A2A task's next state", expected_at=deadline
            ),
            revised_estimate=wp.RevisedEstimate(
                estimated_completion=deadline,
                confidence=wp.ESTIMATE_CONFIDENCE_LOW,
                reason="the A2A agent gives no estimate: the contract's deadline",
            ),
        )
        if note:
            report.completed_milestones.add(description=note[:1024])
        try:
            await slot.report_progress(report)
        except (CommandRejected, OfflineForbidden) as refused:  # progress is informative: the task goes on
            log.info("%s/%s: progress not recorded: %s", slot.group_id, slot.work_item_id, refused)

    # ------------------------------------------------------------ ending

    async def _preempt(self, slot: Slot, entry: TaskEntry) -> Outcome:
        """Asked to pause: the A2A task is canceled (A2A has no pause), the checkpoint names it, and
        the resumed start sends a new task referencing it."""
        if entry.task_id:
            try:
                await self._cancel(entry.task_id)
            except TaskNotCancelableError:
                task = await self.client.get_task(a2a.GetTaskRequest(id=entry.task_id, history_length=100))
                if task.status.state in TERMINAL:  # it ended meanwhile: its outcome stands
                    return await self._ended(slot, entry, task)
                # The agent will not stop it. Preemption is cooperative (MW-11.3-11): the work
                # keeps its slot until the task ends, rather than pausing while the task runs on
                # and running it a second time on resumption.
                log.info(
                    "%s/%s: A2A task %s cannot be canceled: kept",
                    slot.group_id,
                    slot.work_item_id,
                    entry.task_id,
                )
                stream = self.client.subscribe(a2a.SubscribeToTaskRequest(id=entry.task_id))
                return await self._run(slot, entry, stream, preemptible=False)
        entry = self.journal.update(entry, superseded=True, state=state_name(a2a.TASK_STATE_CANCELED))
        checkpoint = wp.Checkpoint(
            checkpoint_id=f"a2a-{entry.attempt}-{entry.task_id or 'unsent'}"[:128],
            progress=wp.ProgressReport(phase="a2a canceled for preemption"),
            completed_operation_ids=[entry.message_id, *entry.answers],
        )
        return Paused(checkpoint)

    async def _cancel(self, task_id: str) -> None:
        task = await self.client.cancel_task(a2a.CancelTaskRequest(id=task_id))
        log.info("A2A task %s: canceled (%s)", task_id, state_name(task.status.state))

    async def _ended(self, slot: Slot, entry: TaskEntry, task: a2a.Task) -> Outcome:
        state = task.status.state
        reason = message_text(task.status.message)
        name = self.card.name or self.agent_id
        if state in INTERRUPTED:
            question = reason or f"the A2A agent {name} asks for input"
            kind = (
                wp.BLOCKER_KIND_EXTERNAL
                if state == a2a.TASK_STATE_AUTH_REQUIRED
                else wp.BLOCKER_KIND_INFORMATION
            )
            checkpoint = wp.Checkpoint(
                checkpoint_id=f"a2a-{entry.attempt}-{task.id}-input-{len(entry.answers)}"[:128],
                progress=wp.ProgressReport(phase=f"a2a {state_name(state)}"),
                completed_operation_ids=[entry.message_id, *entry.answers],
            )
            return Blocked(question=f"{name} asks: {question}", checkpoint=checkpoint, kind=kind)
        passed = state == a2a.TASK_STATE_COMPLETED
        refs = await self._store(slot, task.artifacts, deliverable=passed)
        if passed:
            summary = f"A2A task {task.id} of {name} completed" + (f": {reason}" if reason else "")
            evidence = evidence_for(
                slot.contract, refs, passed=True, summary=summary, producer_id=self.agent_id
            )
            return WorkResult(evidence=evidence, summary=summary[:4096])
        failure = task_failure(state, reason)
        evidence = evidence_for(
            slot.contract, refs, passed=False, summary=failure.reason, producer_id=self.agent_id
        )
        return Failed(kind=failure.kind, reason=failure.reason[:4096], evidence=evidence)

    async def _store(
        self, slot: Slot, artifacts: Sequence[a2a.Artifact], *, deliverable: bool
    ) -> list[common_pb2.ArtifactRef]:
        """Each A2A artifact as a MissionWeave Artifact with a manifest signed under the lease."""
        refs = []
        for artifact in artifacts:
            content = artifact_content(artifact)
            if content is None:
                continue
            refs.append(await slot.put(content.data, media_type=content.media_type, deliverable=deliverable))
        return refs


def _message_task(entry: TaskEntry, message: a2a.Message) -> a2a.Task:
    """An agent that answers with a message instead of a task completed the work in that message:
    its parts are the task's one artifact."""
    return a2a.Task(
        id=entry.task_id or message.message_id,
        context_id=entry.context_id,
        status=a2a.TaskStatus(state=a2a.TASK_STATE_COMPLETED),
        artifacts=[a2a.Artifact(artifact_id=message.message_id, name="reply", parts=message.parts)],
    )
