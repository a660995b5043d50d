"""The bridge's handler against the real A2A agent (tests/a2a_agents.py), with a slot whose Group
side is recorded instead of sent: the rules of worker.py that the live-mesh tests do not reach
(auth-required, a reply message, an answer not sent twice, a task the agent will not cancel, an
earlier ownership's task superseded)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import blake3
from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import TaskNotCancelableError

from missionweave.sdk.agent import Agent
from missionweave.sdk.worker import Blocked, Paused, Slot, WorkResult
from missionweave.v1 import command_pb2, common_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.a2a.mapping import context_id
from missionweave_bridges.a2a.task_journal import TaskJournal
from missionweave_bridges.a2a.worker import A2AWorker, open_client, resolve_card
from tests.a2a_agents import RunningAgent, running_agent


class RecordedChannel:
    """Stands in for the slot's channel to its Group: what the handler reports is kept."""

    conversation_id = "conv-1"

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    async def send(self, kind: str, body: Any, usage: common_pb2.ResourceVector) -> command_pb2.CommandResult:
        self.sent.append((kind, body))
        return command_pb2.CommandResult()


class RecordedArtifacts:
    """Stands in for the slot's artifact store: what the handler stores is kept, by digest."""

    inputs: tuple[()] = ()

    def __init__(self) -> None:
        self.stored: list[tuple[bytes, str, bool]] = []

    async def put(self, content: bytes, **options: Any) -> common_pb2.ArtifactRef:
        self.stored.append((content, options["media_type"], options["deliverable"]))
        digest = common_pb2.Digest(hex=blake3.blake3(content).hexdigest(), size_bytes=len(content))
        return common_pb2.ArtifactRef(digest=digest, media_type=options["media_type"])


def slot_for(
    goal: str,
    *,
    epoch: int = 1,
    revision: int = 1,
    unblocked: tuple[str, int] = ("", 0),
    work_item_id: str = "wi-1",
) -> Slot:
    contract = wp.WorkContract(
        goal=goal,
        revision=revision,
        acceptance_criteria=[wp.AcceptanceCriterion(criterion_id="c1", description="done", required=True)],
    )
    return Slot(
        slot_id="slot-0",
        group_id="grp",
        work_item_id=work_item_id,
        ownership_epoch=epoch,
        lease_id=f"lease-{epoch}",
        contract=contract,
        token=None,
        budget=common_pb2.ResourceVector(),
        resume_from_checkpoint_id="",
        channel=RecordedChannel(),  # type: ignore[arg-type]
        artifacts=RecordedArtifacts(),  # type: ignore[arg-type]
        unblocked_with=unblocked[0],
        unblocked_at=unblocked[1],
    )


@asynccontextmanager
async def handler(tmp_path: Path, streaming: bool = True) -> AsyncIterator[tuple[A2AWorker, RunningAgent]]:
    async with running_agent(streaming=streaming) as agent:
        card = await resolve_card(agent.url)
        client = open_client(card, "jsonrpc")
        try:
            yield A2AWorker(client, card, TaskJournal(tmp_path / "journal.jsonl"), "bot"), agent
        finally:
            await client.close()


async def test_auth_required_blocks_with_an_external_blocker(tmp_path: Path) -> None:
    async with handler(tmp_path) as (worker, _):
        outcome = await worker(slot_for("auth first"))
    assert isinstance(outcome, Blocked) and outcome.kind == wp.BLOCKER_KIND_EXTERNAL
    assert outcome.question == "ledger-agent asks: Sign in at https://ledger.example/auth"


async def test_a_reply_message_instead_of_a_task_is_the_completed_work(tmp_path: Path) -> None:
    async with handler(tmp_path) as (worker, agent):
        slot = slot_for("reply please")
        outcome = await worker(slot)
    assert isinstance(outcome, WorkResult) and outcome.evidence[0].result == wp.EVIDENCE_RESULT_PASS
    assert slot.artifacts.stored == [(b"done in one reply", "text/plain", True)]  # type: ignore[union-attr]
    assert not agent.seen.tasks


async def test_an_answer_the_task_holds_is_not_sent_again_and_a_new_question_blocks_again(
    tmp_path: Path,
) -> None:
    async with handler(tmp_path) as (worker, agent):
        first = await worker(slot_for("ask2 twice"))
        assert isinstance(first, Blocked) and first.question.endswith("Which currency?")
        answered = slot_for("ask2 twice", unblocked=("EUR", 41))
        second = await worker(answered)
        assert isinstance(second, Blocked) and second.question.endswith("Which year?")
        # The same start again (say, the bridge restarted before it blocked): the answer to unblock
        # 41 is in the task's history already, so it is not sent twice; the question stands.
        again = await worker(slot_for("ask2 twice", unblocked=("EUR", 41)))
        assert isinstance(again, Blocked) and again.question.endswith("Which year?")
        assert len(agent.seen.messages) == 2
        last = await worker(slot_for("ask2 twice", unblocked=("2026", 57)))
    assert isinstance(last, WorkResult)
    answers = [m.message_id for m in agent.seen.messages[1:]]
    assert answers == [answered.idempotency_key("a2a-answer-41"), answered.idempotency_key("a2a-answer-57")]
    assert len(agent.seen.tasks) == 1


async def test_a_task_the_agent_will_not_cancel_keeps_its_slot_until_it_ends(tmp_path: Path) -> None:
    """An agent that refuses CancelTask and runs on (a2a-sdk's own server fails such a task, so
    the refusal is made at the client here): the work is not paused while the task runs, which
    would run it a second time on resumption; it keeps its slot and submits."""
    async with handler(tmp_path) as (worker, agent):
        refused: list[str] = []

        async def refuse(request: a2a.CancelTaskRequest, **_: object) -> a2a.Task:
            refused.append(request.id)
            raise TaskNotCancelableError("this work cannot be interrupted")

        worker.client.cancel_task = refuse  # type: ignore[method-assign]
        slot = slot_for("gate work")
        running = asyncio.create_task(worker(slot))
        async with asyncio.timeout(20):
            while not agent.seen.tasks:  # noqa: ASYNC110 (the agent records; nothing to wait on)
                await asyncio.sleep(0.02)
        slot.preemption_requested.set()
        async with asyncio.timeout(20):
            while not refused:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert not running.done()  # no pause while the task runs on
        agent.gate.set()
        outcome = await asyncio.wait_for(running, 20)
    assert isinstance(outcome, WorkResult) and len(agent.seen.tasks) == 1 and refused == agent.seen.task_ids


async def test_an_earlier_ownerships_task_of_another_revision_is_canceled_and_the_work_sent_anew(
    tmp_path: Path,
) -> None:
    async with handler(tmp_path) as (worker, agent):
        old = slot_for("gate old", epoch=1, revision=1)
        running = asyncio.create_task(worker(old))
        async with asyncio.timeout(20):
            while not agent.seen.tasks:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        running.cancel()  # the bridge went away; its task runs on at the agent
        await asyncio.gather(running, return_exceptions=True)
        new = asyncio.create_task(worker(slot_for("gate new", epoch=2, revision=2)))
        async with asyncio.timeout(20):
            while len(agent.seen.tasks) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        agent.gate.set()
        outcome = await asyncio.wait_for(new, 20)
    assert isinstance(outcome, WorkResult)
    first, second = agent.seen.task_ids
    assert agent.seen.cancels == [first] and len(agent.seen.tasks) == 2
    assert worker.journal.get(("grp", "wi-1", 2)).task_id == second  # type: ignore[union-attr]
    assert worker.journal.get(("grp", "wi-1", 1)).superseded  # type: ignore[union-attr]


async def test_a_preempted_handler_pauses_with_the_canceled_task_in_its_checkpoint(tmp_path: Path) -> None:
    async with handler(tmp_path) as (worker, agent):
        slot = slot_for("gate me")
        running = asyncio.create_task(worker(slot))
        async with asyncio.timeout(20):
            while not agent.seen.tasks:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        slot.preemption_requested.set()
        outcome = await asyncio.wait_for(running, 20)
    assert isinstance(outcome, Paused)
    [task_id] = agent.seen.task_ids
    assert outcome.checkpoint.checkpoint_id == f"a2a-0-{task_id}" and agent.seen.cancels == [task_id]
    message_id = Agent.idempotency_key("grp", "wi-1", 1, "a2a-message-0")
    assert list(outcome.checkpoint.completed_operation_ids) == [message_id]
    entry = worker.journal.get(("grp", "wi-1", 1))
    assert entry is not None and entry.superseded and entry.context_id == context_id("grp", "wi-1", 1)


async def test_a_pause_asked_before_the_agent_named_its_task_still_cancels_that_task(tmp_path: Path) -> None:
    async with handler(tmp_path) as (worker, agent):
        slot = slot_for("late start")
        running = asyncio.create_task(worker(slot))
        async with asyncio.timeout(20):
            while not agent.seen.messages:  # noqa: ASYNC110 (the agent records; nothing to wait on)
                await asyncio.sleep(0.02)
        slot.preemption_requested.set()  # the message is in; its task does not exist yet
        await asyncio.sleep(0.2)
        assert not running.done()  # not paused while the task it sent is unknown
        agent.late.set()
        outcome = await asyncio.wait_for(running, 20)
    assert isinstance(outcome, Paused) and agent.seen.cancels == agent.seen.task_ids
    assert len(agent.seen.task_ids) == 1


async def test_a_cancelled_handler_stops_following_its_task(tmp_path: Path) -> None:
    """The runtime closing cancels the handler: nothing of it runs on to journal what the task
    does afterwards (the next start re-attaches and reads that itself)."""
    async with handler(tmp_path) as (worker, agent):
        running = asyncio.create_task(worker(slot_for("gate x")))
        key = ("grp", "wi-1", 1)
        async with asyncio.timeout(20):
            while (entry := worker.journal.get(key)) is None or entry.state != "working":  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        agent.gate.set()
        async with asyncio.timeout(20):
            while (await worker.client.get_task(a2a.GetTaskRequest(id=entry.task_id))).status.state != (  # noqa: ASYNC110
                a2a.TASK_STATE_COMPLETED
            ):
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # what a follower left running would have journaled by now
    assert worker.journal.get(key).state == "working"  # type: ignore[union-attr]


async def test_a_task_silent_for_longer_than_the_http_read_timeout_is_still_followed(tmp_path: Path) -> None:
    """JSON-RPC streams over HTTP: no event for longer than the client's read timeout (httpx's 5 s)
    is a quiet agent, not a failure; the bridge subscribes again."""
    async with handler(tmp_path) as (worker, agent):
        running = asyncio.create_task(worker(slot_for("gate quiet")))
        await asyncio.sleep(7)
        assert not running.done(), running.result()
        agent.gate.set()
        outcome = await asyncio.wait_for(running, 20)
    assert isinstance(outcome, WorkResult) and len(agent.seen.tasks) == 1


async def test_an_agent_that_does_not_stream_is_followed_by_its_answers(tmp_path: Path) -> None:
    async with handler(tmp_path, streaming=False) as (worker, agent):
        slot = slot_for("complete quietly")
        outcome = await worker(slot)
        asked = await worker(slot_for("ask2 plainly", work_item_id="wi-2"))
    assert isinstance(outcome, WorkResult) and len(slot.artifacts.stored) == 2  # type: ignore[union-attr]
    assert isinstance(asked, Blocked) and asked.question.endswith("Which currency?")
    assert len(agent.seen.tasks) == 2
