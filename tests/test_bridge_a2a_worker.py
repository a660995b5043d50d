"""`mwp bridge a2a`: an A2A agent (a2a-sdk's own server, tests/a2a_agents.py) works WorkItems of a
live mesh through the Worker runtime: completion with Artifacts verifiable by content hash, a
failure, a block the Coordinator answers, a preemption, a kill -9 of the bridge and its restart;
and the mapping rules one by one (docs/bridge-a2a-worker.md)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import blake3
import pytest
from a2a.client.errors import A2AClientError, A2AClientTimeoutError
from a2a.types import a2a_pb2 as a2a
from a2a.utils import errors as a2a_errors

from missionweave.kernel.signing import write_key
from missionweave.sdk.agent import Agent
from missionweave.sdk.worker import WorkerRuntime
from missionweave.v1 import event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.a2a.mapping import (
    InputPart,
    artifact_content,
    context_id,
    failure_of,
    input_part,
    mission_card,
    task_failure,
    work_message,
)
from missionweave_bridges.a2a.task_journal import TaskEntry, TaskJournal
from missionweave_bridges.a2a.worker import A2AWorker, BridgeError, open_client, resolve_card
from tests.a2a_agents import BINARY, running_agent
from tests.conftest import World, polled
from tests.test_agent_sdk import connect
from tests.test_cli_worker import mwp, start_mwp, write_config
from tests.test_missions import G
from tests.test_work_items import Flow, setup


@asynccontextmanager
async def bridged(
    w: World, agent_url: str, state: Path, transport: str = "jsonrpc", journal_path: Path | None = None
) -> AsyncIterator[WorkerRuntime]:
    """worker-bot as the bridged A2A agent, in this process: the runtime with the bridge's handler."""
    card = await resolve_card(agent_url)
    client = open_client(card, transport)
    async with connect(w, "worker-bot", w.worker.key, state) as mw_agent:
        journal = TaskJournal(journal_path or mw_agent.directory / "a2a-tasks.jsonl")
        runtime = WorkerRuntime(mw_agent, A2AWorker(client, card, journal, "worker-bot"))
        await runtime.serve([G])
        try:
            yield runtime
        finally:
            await runtime.close()
            await client.close()


async def events(w: World) -> list[event_pb2.Event]:
    return [e async for e in w.client.read_events(G)]


def of(log: list[event_pb2.Event], kind: str) -> list:  # type: ignore[type-arg]
    return [getattr(e, kind) for e in log if e.WhichOneof("payload") == kind]


async def work_and_offer(flow: Flow, work_item_id: str, goal: str) -> None:
    await flow.authorize(work_item_id, goal=goal)
    await flow.coord("work_offer", flow.offer_body(work_item_id, "worker-bot"))


# ------------------------------------------------------------------ against a live mesh


@pytest.mark.both_topologies
@pytest.mark.parametrize("transport", ["jsonrpc", "grpc"])
@pytest.mark.req("MW-10.2-T11", "MW-13.2-02", "MW-13.1-05")
async def test_a_completed_a2a_task_is_submitted_with_its_artifacts_and_evidence(
    world: World, tmp_path: Path, transport: str
) -> None:
    w = world
    flow = await setup(w)
    async with running_agent() as agent, bridged(w, agent.url, tmp_path, transport) as runtime:
        await work_and_offer(flow, "wi-1", "complete the Q3 ledger")
        async with asyncio.timeout(30):
            assert await runtime.submitted(1) == [(G, "wi-1")]
    log = await events(w)
    [submitted] = of(log, "work_submitted")
    # Both A2A artifacts are Artifacts of the submission, each verifiable by its content hash.
    stored = {}
    for ref in submitted.artifacts:
        data = await w.client.download(ref.digest)
        assert blake3.blake3(data).hexdigest() == ref.digest.hex and len(data) == ref.digest.size_bytes
        stored[ref.media_type] = data
    assert stored == {"text/plain": b"report for: complete the Q3 ledger", "application/octet-stream": BINARY}
    # One Evidence per acceptance criterion, citing them, in the method the criterion asks for.
    [evidence] = submitted.evidence
    assert evidence.criterion_id == "balances" and evidence.result == wp.EVIDENCE_RESULT_PASS
    assert evidence.method == wp.EVIDENCE_METHOD_TEST
    assert {a.digest.hex for a in evidence.artifacts} == {a.digest.hex for a in submitted.artifacts}
    # The A2A status updates were progress reports under the lease.
    phases = [p.report.phase for p in of(log, "work_progress_reported")]
    assert "a2a working" in phases
    # One task; its message carried the contract, with a deterministic id.
    [sent] = agent.seen.tasks
    [started] = of(log, "work_started")
    epoch = started.lease.ownership_epoch
    assert sent.message_id == Agent.idempotency_key(G, "wi-1", epoch, "a2a-message-0")  # MW-16-13
    assert sent.context_id == context_id(G, "wi-1", started.lease.ownership_epoch)
    assert "all balances match" in sent.parts[0].text and "complete the Q3 ledger" in sent.parts[0].text


@pytest.mark.parametrize(
    ("goal", "reason"),
    [("fail now", "the ledger is corrupt"), ("reject this", "rejected the task: not my kind of work")],
)
@pytest.mark.req("MW-10.2-T13")
async def test_a_failed_or_rejected_a2a_task_is_a_permanent_failure_with_evidence(
    world: World, tmp_path: Path, goal: str, reason: str
) -> None:
    w = world
    flow = await setup(w)
    async with running_agent() as agent, bridged(w, agent.url, tmp_path):
        await work_and_offer(flow, "wi-1", goal)

        async def failed() -> bool:
            return bool(of(await events(w), "work_failed"))

        await polled(failed, 30)
    [fail] = of(await events(w), "work_failed")
    assert fail.kind == wp.WORK_FAILURE_KIND_PERMANENT and reason in fail.reason
    [evidence] = fail.evidence
    assert evidence.result == wp.EVIDENCE_RESULT_FAIL and evidence.criterion_id == "balances"
    assert len(agent.seen.tasks) == 1


@pytest.mark.req("MW-10.2-T09", "MW-10.2-T10", "MW-11.4-04")
async def test_input_required_blocks_with_the_question_and_the_coordinators_answer_resumes_the_task(
    world: World, tmp_path: Path
) -> None:
    w = world
    flow = await setup(w)
    async with running_agent() as agent, bridged(w, agent.url, tmp_path) as runtime:
        await work_and_offer(flow, "wi-1", "ask about the currency")

        async def blocked() -> bool:
            return bool(of(await events(w), "work_blocked"))

        await polled(blocked, 30)
        log = await events(w)
        [block] = of(log, "work_blocked")
        [question] = [m for m in of(log, "message_posted") if "Which currency?" in m.content.text]
        # The question is in the WorkItem's Conversation and the blocker cites it.
        assert block.blockers[0].message_id == question.message_id
        assert block.checkpoint.checkpoint_id.endswith("-input-0")
        await flow.coord(
            "work_unblock", wp.WorkUnblock(work_item_id="wi-1", resolution="EUR", coordinator_epoch=1)
        )
        async with asyncio.timeout(30):
            assert await runtime.submitted(1) == [(G, "wi-1")]
    [submitted] = of(await events(w), "work_submitted")
    assert [await w.client.download(a.digest) for a in submitted.artifacts] == [b"converted to EUR"]
    # One task, two messages: the work, then the answer as the same task's next message, its id
    # derived from the unblock it carries (a resend after a crash is the same message).
    log = await events(w)
    [unblocked] = [e for e in log if e.WhichOneof("payload") == "work_unblocked"]
    epoch = of(log, "work_started")[0].lease.ownership_epoch
    assert len(agent.seen.tasks) == 1
    work, answer = agent.seen.messages
    assert work.message_id == agent.seen.tasks[0].message_id
    assert answer.message_id == Agent.idempotency_key(G, "wi-1", epoch, f"a2a-answer-{unblocked.sequence}")
    assert answer.task_id == agent.seen.task_ids[0] and answer.parts[0].text == "EUR"


@pytest.mark.req("MW-11.3-11", "MW-11.3-12")
async def test_a_preemption_cancels_the_a2a_task_checkpoints_and_the_resumed_start_runs_a_new_one(
    world: World, tmp_path: Path
) -> None:
    w = world
    flow = await setup(w)
    async with running_agent() as agent, bridged(w, agent.url, tmp_path) as runtime:
        await work_and_offer(flow, "wi-1", "gate the ledger")

        async def working() -> bool:
            return bool(agent.seen.tasks) and any(
                p.report.phase == "a2a working" for p in of(await events(w), "work_progress_reported")
            )

        await polled(working, 30)
        [started] = of(await events(w), "work_started")
        ask = wp.WorkRequestPreemption(
            work_item_id="wi-1",
            preemption_request_id="pre-1",
            lease_id=started.lease.lease_id,
            reason=wp.PREEMPTION_REASON_PRIORITY,
            coordinator_epoch=1,
            ownership_epoch=started.lease.ownership_epoch,
        )
        await flow.coord("work_request_preemption", ask)

        async def resumed() -> bool:
            return len(agent.seen.tasks) == 2

        await polled(resumed, 30)
        agent.gate.set()
        async with asyncio.timeout(30):
            assert await runtime.submitted(1) == [(G, "wi-1")]
    log = await events(w)
    [paused] = of(log, "work_checkpointed")
    first, second = agent.seen.task_ids
    assert agent.seen.cancels == [first]  # CancelTask, for the task that was running
    assert paused.preemption_request_id == "pre-1" and first in paused.checkpoint.checkpoint_id
    # The resumed start sent a new task that references the canceled one, under a new message id.
    assert list(agent.seen.tasks[1].reference_task_ids) == [first]
    assert agent.seen.tasks[1].message_id != agent.seen.tasks[0].message_id
    assert [s.resume_from_checkpoint_id for s in of(log, "work_started")] == [
        "",
        paused.checkpoint.checkpoint_id,
    ]
    assert second not in agent.seen.cancels


@pytest.mark.req("MW-11.5-01", "MW-16-13")
async def test_a_lapsed_lease_offered_again_to_the_same_agent_takes_over_its_a2a_task(
    world: World, tmp_path: Path
) -> None:
    """The bridge stops while its A2A task works and stays away past the execution lease; the
    Coordinator offers the WorkItem again (a new ownership epoch) to the same agent. The restarted
    bridge takes the running task over for the new ownership instead of sending the work again."""
    w = world
    flow = await setup(w)
    journal = tmp_path / "a2a-tasks.jsonl"
    short = wp.TimePolicy()
    short.execution_lease_duration.FromSeconds(2)
    short.start_deadline.FromSeconds(3)  # the ownership lasts as long as the later of the two
    async with running_agent() as agent:
        async with bridged(w, agent.url, tmp_path / "first", journal_path=journal):
            await flow.authorize("wi-1", goal="gate the ledger", time_policy=short)
            await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))

            async def sent() -> bool:
                return bool(agent.seen.tasks)

            await polled(sent, 30)
        w.clock.advance(seconds=10)  # the lease lapsed while the bridge was away
        await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))  # fences it: a new epoch
        async with bridged(w, agent.url, tmp_path / "second", journal_path=journal) as runtime:

            async def second_start() -> bool:
                return len(of(await events(w), "work_started")) == 2

            await polled(second_start, 30)
            agent.gate.set()
            async with asyncio.timeout(30):
                assert await runtime.submitted(1) == [(G, "wi-1")]
    log = await events(w)
    epochs = [s.lease.ownership_epoch for s in of(log, "work_started")]
    assert epochs[1] == epochs[0] + 1
    assert [r.cause for r in of(log, "lease_revoked")] == [wp.LEASE_REVOCATION_CAUSE_EXPIRY_FENCED]
    assert len(agent.seen.tasks) == 1 and agent.seen.cancels == []
    entry = TaskJournal(journal).get((G, "wi-1", epochs[1]))
    assert entry is not None and entry.adopted_from == epochs[0] and entry.task_id == agent.seen.task_ids[0]


@pytest.mark.req("MW-16-13")
async def test_a_send_whose_answer_was_lost_is_found_in_its_context_and_not_sent_again(
    world: World, tmp_path: Path
) -> None:
    """The bridge journaled its message and sent it, then died before the answer named the task:
    the restarted bridge lists the ownership's A2A context, finds the task holding its message id
    and follows it; the agent gets the work once."""
    w = world
    flow = await setup(w)
    journal_path = tmp_path / "a2a-tasks.jsonl"
    message_id, context = Agent.idempotency_key(G, "wi-1", 1, "a2a-message-0"), context_id(G, "wi-1", 1)
    TaskJournal(journal_path).record(TaskEntry(G, "wi-1", 1, context, message_id, contract_revision=1))
    async with running_agent() as agent:
        client = open_client(await resolve_card(agent.url), "jsonrpc")
        contract = wp.WorkContract(goal="complete the Q3 ledger")
        sent = work_message(contract, [], message_id=message_id, context_id=context)
        async for _ in client.send_message(a2a.SendMessageRequest(message=sent)):
            pass  # what the first bridge sent; the answer is lost with it
        await client.close()
        async with bridged(w, agent.url, tmp_path / "state", journal_path=journal_path) as runtime:
            await work_and_offer(flow, "wi-1", "complete the Q3 ledger")
            async with asyncio.timeout(30):
                assert await runtime.submitted(1) == [(G, "wi-1")]
    assert len(agent.seen.tasks) == 1 and len(agent.seen.messages) == 1
    entry = TaskJournal(journal_path).get((G, "wi-1", 1))
    assert entry is not None and entry.task_id == agent.seen.task_ids[0] and entry.state == "completed"


# ------------------------------------------------------------------ mwp bridge a2a, a process


def bridge_config(w: World, tmp_path: Path, agent_url: str, **more: object) -> Path:
    key = tmp_path / "worker.key"
    if not key.exists():
        write_key(key, w.worker.key)
    entries: dict[str, object] = {
        "agent_url": agent_url,
        "target": w.target,
        "identity": "worker-bot",
        "key": "worker.key",
        "groups": [G],
        "state_dir": "state",
        **more,
    }
    return write_config(tmp_path / "bridge.toml", **entries)


async def started_line(proc: asyncio.subprocess.Process) -> dict:  # type: ignore[type-arg]
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if not line:
        assert proc.stderr is not None
        raise AssertionError((await proc.stderr.read()).decode()[-3000:])
    return json.loads(line)


@pytest.mark.req("MW-11.3-09", "MW-16-13")
async def test_a_bridge_killed_mid_task_reattaches_on_restart_and_the_agent_sees_one_task(
    world: World, tmp_path: Path
) -> None:
    """SIGKILL while the A2A task works: the restarted bridge (new session, its journal) takes the
    WorkItem up again under a new lease, re-attaches to the same A2A task and submits it once."""
    w = world
    flow = await setup(w)
    async with running_agent() as agent:
        config = bridge_config(w, tmp_path, agent.url, max_concurrency=2)
        proc = await start_mwp("bridge", "a2a", "--config", str(config), "--json")
        try:
            started = await started_line(proc)
            assert (
                started["event"] == "started" and started["slots"] == 2 and started["transport"] == "jsonrpc"
            )
            # The matching MissionWeave Agent Card: one capability per A2A skill, the declared slots.
            published = await w.client.agent_card("worker-bot")
            assert published.card.card_version == "1.2.0" and published.card.max_concurrency == 2
            assert sorted(c.capability_id for c in published.card.capabilities) == [
                "a2a.skill.convert",
                "a2a.skill.reconcile",
            ]
            await work_and_offer(flow, "wi-1", "gate the ledger")

            async def working() -> bool:
                return bool(agent.seen.tasks) and any(
                    p.report.phase == "a2a working" for p in of(await events(w), "work_progress_reported")
                )

            await polled(working, 60)
        finally:
            proc.kill()  # SIGKILL: no handler runs, nothing is released
            await proc.wait()
        proc = await start_mwp("bridge", "a2a", "--config", str(config), "--json")
        try:
            restarted = await started_line(proc)
            assert restarted["session_epoch"] > started["session_epoch"]  # a new session fences the old

            async def second_start() -> bool:
                return len(of(await events(w), "work_started")) == 2

            await polled(second_start, 60)
            agent.gate.set()  # the one task completes; the re-attached bridge sees it

            async def submitted() -> bool:
                return bool(of(await events(w), "work_submitted"))

            await polled(submitted, 60)
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert json.loads(out.decode().splitlines()[-1])["submitted"] == [{"group_id": G, "work_item_id": "wi-1"}]
    assert len(agent.seen.tasks) == 1 and agent.seen.cancels == []  # exactly one A2A task, never resent
    log = await events(w)
    [submitted] = of(log, "work_submitted")
    assert [await w.client.download(a.digest) for a in submitted.artifacts] == [b"through the gate"]
    revoked = of(log, "lease_revoked")
    assert [r.cause for r in revoked] == [wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED]
    journal = TaskJournal(tmp_path / "state" / "worker-bot" / "a2a-tasks.jsonl")
    [entry] = journal.of_work_item(G, "wi-1")
    assert entry.task_id == agent.seen.task_ids[0] and entry.state == "completed"


async def test_mwp_bridge_a2a_says_clearly_what_is_wrong(world: World, tmp_path: Path) -> None:
    w = world
    await setup(w)
    # Nothing listens: the Agent Card cannot be read (exit 3, like an unreachable mesh).
    config = bridge_config(w, tmp_path, "http://127.0.0.1:9")
    proc = await start_mwp("bridge", "a2a", "--config", str(config))
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 3 and "cannot read the A2A Agent Card at http://127.0.0.1:9" in err.decode()
    async with running_agent(bindings=("GRPC",)) as agent:
        # A transport the card does not offer.
        config = bridge_config(w, tmp_path, agent.url, transport="jsonrpc")
        proc = await start_mwp("bridge", "a2a", "--config", str(config))
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 3 and "offers GRPC; the bridge speaks JSONRPC" in err.decode()
    # A config mistake is a usage error (exit 2) naming the key.
    config = bridge_config(w, tmp_path, "http://127.0.0.1:9", max_concurrency=0)
    proc = await start_mwp("bridge", "a2a", "--config", str(config))
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and "max_concurrency must be an integer" in err.decode()


# ------------------------------------------------------------------ the mapping, rule by rule


def test_the_work_message_carries_the_contract_and_its_inputs() -> None:
    contract = wp.WorkContract(
        goal="Reconcile",
        acceptance_criteria=[wp.AcceptanceCriterion(criterion_id="c1", description="sums match")],
        revision=3,
    )
    inputs = [
        InputPart("notes", "text/plain", b"small text", "aa"),
        InputPart("big", "text/plain", b"x" * (64 * 1024 + 1), "bb"),
        InputPart("blob", "application/octet-stream", b"\x00\x01", "cc"),
        InputPart("liar", "text/plain", b"\xff\xfe", "dd"),
    ]
    message = work_message(contract, inputs, message_id="m-1", context_id="ctx", reference_task_ids=["t0"])
    text, data, *files = message.parts
    assert "Reconcile" in text.text and "[c1] sums match" in text.text
    assert data.data.struct_value.fields["contract_revision"].number_value == 3
    kinds = [(p.WhichOneof("content"), p.filename) for p in files]
    # Small text inline; large text, binary, and "text" that is not UTF-8 as bytes.
    assert kinds == [("text", "notes"), ("raw", "big"), ("raw", "blob"), ("raw", "liar")]
    assert message.message_id == "m-1" and list(message.reference_task_ids) == ["t0"]
    assert message.role == a2a.ROLE_USER
    assert input_part(inputs[0]).text == "small text"


def test_a2a_artifacts_become_bytes_one_part_as_is_several_as_a_json_document() -> None:
    text = artifact_content(a2a.Artifact(artifact_id="a", name="r", parts=[a2a.Part(text="hi")]))
    raw = artifact_content(
        a2a.Artifact(artifact_id="b", parts=[a2a.Part(raw=b"\x00", media_type="image/png")])
    )
    many = artifact_content(
        a2a.Artifact(artifact_id="c", parts=[a2a.Part(text="x"), a2a.Part(url="https://e/")])
    )
    assert text is not None and (text.data, text.media_type, text.name) == (b"hi", "text/plain", "r")
    assert raw is not None and (raw.data, raw.media_type) == (b"\x00", "image/png")
    assert many is not None and many.media_type == "application/vnd.a2a.artifact+json"
    assert json.loads(many.data)["parts"][1]["url"] == "https://e/"
    assert artifact_content(a2a.Artifact(artifact_id="d")) is None


def test_a2a_errors_and_terminal_states_map_to_structured_failure_kinds() -> None:
    permanent, transient = wp.WORK_FAILURE_KIND_PERMANENT, wp.WORK_FAILURE_KIND_TRANSIENT
    assert failure_of(a2a_errors.ContentTypeNotSupportedError("no pdf")).kind == permanent
    assert failure_of(a2a_errors.TaskNotFoundError("gone")).kind == permanent
    assert failure_of(a2a_errors.UnsupportedOperationError("no")).kind == permanent
    assert failure_of(a2a_errors.InternalError("boom")).kind == transient
    assert failure_of(A2AClientTimeoutError("slow")).kind == transient
    assert failure_of(A2AClientError("refused")).kind == transient
    assert "rejected the task: nope" in task_failure(a2a.TASK_STATE_REJECTED, "nope").reason
    assert task_failure(a2a.TASK_STATE_FAILED, "").reason == "the A2A task ended failed: no reason given"


def test_the_mission_card_of_an_a2a_card() -> None:
    card = a2a.AgentCard(
        name="x",
        version="2.1.0",
        skills=[a2a.AgentSkill(id="b"), a2a.AgentSkill(id="a"), a2a.AgentSkill(id="a")],
    )
    ours = mission_card(card, agent_id="bot", max_concurrency=3, endpoint="http://h")
    assert [c.capability_id for c in ours.capabilities] == ["a2a.skill.a", "a2a.skill.b"]
    assert (ours.card_version, ours.max_concurrency, list(ours.endpoints)) == ("2.1.0", 3, ["http://h"])
    card.version = "v2"  # not a semantic version: the card still publishes
    assert mission_card(card, agent_id="bot", max_concurrency=1, endpoint="e").card_version == "0.0.0"


def test_context_ids_are_per_ownership_and_stable() -> None:
    assert context_id("g", "w", 1) == context_id("g", "w", 1)
    assert len({context_id("g", "w", 1), context_id("g", "w", 2), context_id("g", "v", 1)}) == 3


def test_the_journal_survives_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    journal = TaskJournal(path)
    entry = journal.record(TaskEntry("g", "w", 1, "ctx", "m-1"))
    journal.update(entry, task_id="t-1", state="working", answers=("a-1",))
    with path.open("a") as f:
        f.write('{"group_id": "g", "work_it')  # the crash came mid-write
    again = TaskJournal(path).get(("g", "w", 1))
    assert again is not None and (again.task_id, again.state, again.answers) == ("t-1", "working", ("a-1",))


async def test_an_unreachable_card_and_a_transport_the_card_lacks_are_bridge_errors() -> None:
    with pytest.raises(BridgeError, match="cannot read the A2A Agent Card"):
        await resolve_card("http://127.0.0.1:9", timeout_s=2)
    async with running_agent(bindings=("JSONRPC",)) as agent:
        card = await resolve_card(agent.url)
        with pytest.raises(BridgeError, match="offers JSONRPC; the bridge speaks GRPC"):
            open_client(card, "grpc")
        with pytest.raises(BridgeError, match="is not one of"):
            open_client(card, "carrier-pigeon")
        await open_client(card).close()


def test_a_bridge_process_logs_structured_lines_but_no_line_per_http_request() -> None:
    import argparse
    import logging

    from missionweave_bridges import process_logs

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        process_logs.configure(argparse.Namespace())
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
        assert logging.getLogger("missionweave.sdk.worker").isEnabledFor(logging.INFO)
    finally:
        root.handlers[:], root.level = handlers, level
        for name in process_logs.QUIETED:
            logging.getLogger(name).setLevel(logging.NOTSET)


async def test_an_agent_whose_card_requires_a_token_gets_the_configured_credential(
    world: World, tmp_path: Path
) -> None:
    """The card's security scheme is satisfied from the config's [credentials] (the SDK's
    AuthInterceptor sends it as the scheme says); without it the bridge does not start (exit 2)."""
    w = world
    flow = await setup(w)
    async with running_agent(bindings=("JSONRPC",), token="agent-secret") as agent:
        config = bridge_config(w, tmp_path, agent.url)
        code, _, err = await mwp("bridge", "a2a", "--config", str(config))
        assert code == 2 and "requires credentials for agent-token" in err and "[credentials]" in err
        (tmp_path / "agent.token").write_text("agent-secret\n")
        with config.open("a") as f:
            f.write('\n[credentials]\n"agent-token" = "agent.token"\n')
        proc = await start_mwp("bridge", "a2a", "--config", str(config), "--json")
        try:
            await started_line(proc)
            await work_and_offer(flow, "wi-1", "complete the Q3 ledger")

            async def submitted() -> bool:
                return bool(of(await events(w), "work_submitted"))

            await polled(submitted, 60)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err_bytes = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err_bytes.decode()[-3000:]
        assert len(agent.seen.tasks) == 1


def test_the_credentials_a_card_still_lacks() -> None:
    from missionweave_bridges.a2a.worker import missing_credentials

    card = a2a.AgentCard(name="x")
    assert missing_credentials(card, {}) == []  # a card asking for nothing
    card.security_requirements.add().schemes["oauth"].SetInParent()
    either = card.security_requirements.add()  # or: an API key and a bearer token together
    either.schemes["key"].SetInParent()
    either.schemes["bearer"].SetInParent()
    assert missing_credentials(card, {}) == ["oauth"]
    assert missing_credentials(card, {"key": "k"}) == ["oauth"]
    assert missing_credentials(card, {"key": "k", "bearer": "t"}) == []
    assert missing_credentials(card, {"oauth": "t"}) == []
