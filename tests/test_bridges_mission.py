"""One Mission done by agents that speak other protocols (issue 43's whole story, against a live
mesh): an A2A agent built with a2a-sdk's own server works WorkItems through `mwp bridge a2a` (a
subprocess), an LLM host's MCP client (the mcp SDK's own ClientSession) works one through `mwp mcp`,
and the Coordinator and the owner act through the SDK. On the way: a failure the Coordinator
re-offers to the MCP-driven Worker, a block the Coordinator answers, a preemption, a kill -9 of the
bridge and its restart; then the Coordinator's review and the owner's approval. Afterwards every
Artifact the Mission was given is fetched by its content hash and checked against it, with the
manifest its producer signed."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import blake3
import pytest

from missionweave.sdk.client import SessionSigner
from missionweave.v1 import common_pb2, event_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from tests.a2a_agents import BINARY, running_agent
from tests.conftest import World, polled, register
from tests.mcp_fixtures import data, party, stdio_session
from tests.test_bridge_a2a_worker import bridge_config, started_line
from tests.test_cli_worker import mwp, start_mwp
from tests.test_missions import G
from tests.test_work_items import Flow, setup

A2A_AGENT = "worker-bot"  # the A2A agent's MissionWeave identity, held by `mwp bridge a2a`
MCP_WORKER = "mcp-bot"  # the LLM host's identity, under which `mwp mcp` signs


async def log_of(w: World) -> list[event_pb2.Event]:
    return [e async for e in w.client.read_events(G)]


def payloads(log: list[event_pb2.Event], kind: str, work_item_id: str = "") -> list[Any]:
    found = [getattr(e, kind) for e in log if e.WhichOneof("payload") == kind]
    return [p for p in found if not work_item_id or p.work_item_id == work_item_id]


async def until(w: World, kind: str, work_item_id: str, count: int = 1) -> None:
    async def there() -> bool:
        return len(payloads(await log_of(w), kind, work_item_id)) >= count

    await polled(there, 90)


async def accepted_by_coordinator(flow: Flow, w: World, work_item_id: str) -> None:
    """The Coordinator's review: Evidence of its own, then the latest submission accepted."""
    submitted = [e for e in await log_of(w) if e.WhichOneof("payload") == "work_submitted"]
    latest = [e for e in submitted if e.work_submitted.work_item_id == work_item_id][-1]
    review = wp.Evidence(
        evidence_id=f"review-{work_item_id}",
        criterion_id="balances",
        method=wp.EVIDENCE_METHOD_REVIEW,
        result=wp.EVIDENCE_RESULT_PASS,
        summary="read against the ledger",
    )
    await flow.coord(
        "work_record_evidence",
        wp.WorkRecordEvidence(work_item_id=work_item_id, evidence=review, coordinator_epoch=1),
    )
    accept = wp.WorkAcceptResult(
        work_item_id=work_item_id,
        coordinator_epoch=1,
        submission_event_id=latest.event_id,
        review_evidence_ids=[review.evidence_id],
    )
    await flow.coord("work_accept_result", accept)


async def offer(flow: Flow, work_item_id: str, to: str) -> None:
    await flow.coord("work_offer", flow.offer_body(work_item_id, to, seconds=600))


@pytest.mark.both_topologies
@pytest.mark.req("MW-10.2-T09", "MW-10.2-T10", "MW-10.2-T13", "MW-11.3-12", "MW-7.1-T03", "MW-13.1-05")
async def test_a_mission_done_by_an_a2a_agent_and_an_mcp_driven_worker_is_approved_and_verifiable(
    world: World, tmp_path: Path
) -> None:
    w = world
    mcp_signer: SessionSigner = await register(
        w.client, w.keys["admin"], MCP_WORKER, common_pb2.IDENTITY_KIND_AGENT
    )
    flow = await setup(w, w.worker, mcp_signer)
    # What the A2A agent does follows the first word of its goal (tests/a2a_agents.py).
    goals = {
        "extract": "complete the Q3 extraction",
        "check": "fail the balance check",
        "convert": "ask about the currency",
        "report": "gate the Q3 report",
    }
    for work_item_id, goal in goals.items():
        await flow.authorize(work_item_id, goal=goal)

    async with running_agent() as agent:
        config = bridge_config(w, tmp_path, agent.url)
        bridge = await start_mwp("bridge", "a2a", "--config", str(config), "--json")
        try:
            first_run = await started_line(bridge)

            # Done at once: its two A2A artifacts become the submission's Artifacts.
            await offer(flow, "extract", A2A_AGENT)
            await until(w, "work_submitted", "extract")

            # The A2A task fails: a worker-reported failure with Evidence; the Coordinator then
            # offers the WorkItem to the MCP-driven Worker (below).
            await offer(flow, "check", A2A_AGENT)
            await until(w, "work_failed", "check")

            # input-required: a block whose question is in the WorkItem's Conversation; the
            # Coordinator's answer goes back to the same A2A task, which completes with it.
            await offer(flow, "convert", A2A_AGENT)
            await until(w, "work_blocked", "convert")
            [question] = [
                m for m in payloads(await log_of(w), "message_posted") if "Which currency?" in m.content.text
            ]
            [blocked] = payloads(await log_of(w), "work_blocked", "convert")
            assert blocked.blockers[0].message_id == question.message_id
            await flow.coord(
                "work_unblock",
                wp.WorkUnblock(work_item_id="convert", resolution="EUR", coordinator_epoch=1),
            )
            await until(w, "work_submitted", "convert")

            # Long work, preempted: the A2A task is canceled at the checkpoint; the next start sends
            # a new task that refers to it.
            await offer(flow, "report", A2A_AGENT)
            await until(w, "work_progress_reported", "report")
            [started] = payloads(await log_of(w), "work_started", "report")
            preempt = wp.WorkRequestPreemption(
                work_item_id="report",
                preemption_request_id="pre-report",
                lease_id=started.lease.lease_id,
                reason=wp.PREEMPTION_REASON_PRIORITY,
                coordinator_epoch=1,
                ownership_epoch=started.lease.ownership_epoch,
            )
            await flow.coord("work_request_preemption", preempt)
            await until(w, "work_started", "report", 2)

            async def second_task() -> bool:
                return sum("gate the Q3 report" in t.parts[0].text for t in agent.seen.tasks) == 2

            await polled(second_task, 90)
        finally:
            bridge.kill()  # kill -9 while the resumed A2A task works: nothing released, nothing said
            await bridge.wait()

        # The restarted bridge fences the killed one's session, takes the WorkItem up again and
        # re-attaches to the A2A task it had sent (its journal): the agent runs no third task.
        bridge = await start_mwp("bridge", "a2a", "--config", str(config), "--json")
        try:
            second_run = await started_line(bridge)
            assert second_run["session_epoch"] > first_run["session_epoch"]
            await until(w, "work_started", "report", 3)
            agent.gate.set()
            await until(w, "work_submitted", "report")

            # The MCP-driven Worker takes the failed check over: offer, lease, its input read
            # verified, an output stored under its lease, submitted with Evidence citing it.
            await offer(flow, "check", MCP_WORKER)
            mcp_party = party(tmp_path / "mcp-keys", mcp_signer)
            async with stdio_session(w, mcp_party, tmp_path / "mcp-state") as mcp:
                listed = await data(mcp, "list_work")
                assert [o["work_item_id"] for o in listed["offers"]] == ["check"]
                await data(mcp, "accept_offer", group_id=G, work_item_id="check")
                await data(mcp, "start_work", group_id=G, work_item_id="check")
                stored = await data(
                    mcp,
                    "store_output",
                    group_id=G,
                    work_item_id="check",
                    text="cash 100 = 100\nbank 250 = 250\n",
                    media_type="text/plain",
                )
                evidence = [
                    {
                        "criterion_id": "balances",
                        "summary": "2 of 2 balances match",
                        "artifacts": [stored["artifact"]],
                    }
                ]
                await data(
                    mcp, "submit_work", group_id=G, work_item_id="check", evidence=evidence, summary="checked"
                )
        finally:
            if bridge.returncode is None:
                bridge.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(bridge.communicate(), 60)
        assert bridge.returncode == 0, err.decode()[-3000:]
        stopped = json.loads(out.decode().splitlines()[-1])
        assert stopped["event"] == "stopped"

    # The A2A agent ran one task per WorkItem it was given, and two for the preempted one (the
    # first canceled at the preemption, the second surviving the kill): none was sent twice.
    per_goal = {goal: sum(goal in t.parts[0].text for t in agent.seen.tasks) for goal in goals.values()}
    assert per_goal == {
        "complete the Q3 extraction": 1,
        "fail the balance check": 1,
        "ask about the currency": 1,
        "gate the Q3 report": 2,
    }
    assert len(agent.seen.cancels) == 1  # the preempted task's CancelTask, nothing else

    log = await log_of(w)
    [failed] = payloads(log, "work_failed", "check")
    assert failed.kind == wp.WORK_FAILURE_KIND_PERMANENT and failed.evidence
    [paused] = payloads(log, "work_checkpointed", "report")
    assert paused.preemption_request_id == "pre-report"
    assert [r.cause for r in payloads(log, "lease_revoked", "report")] == [
        wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED
    ]

    # The Coordinator reviews and accepts each WorkItem, submits the Mission; the owner approves.
    for work_item_id in goals:
        await accepted_by_coordinator(flow, w, work_item_id)
    mission = (await w.client.group_state(G)).mission
    submissions = {s.work_item_id: s for s in payloads(await log_of(w), "work_submitted")}
    deliverables = [a for s in submissions.values() for a in s.artifacts]
    submit = mission_pb2.MissionSubmitForApproval(
        coordinator_epoch=1,
        mission_revision=mission.revision,
        summary="Q3 figures extracted, checked, converted and reported",
        artifacts=deliverables,
    )
    await flow.coord("mission_submit_for_approval", submit)
    # The owner reviews as a person does, without code: every Artifact's manifest checked against
    # its producer's session key and its bytes re-hashed, then the approval, refused had one failed.
    owner = party(tmp_path / "owner-keys", w.owner)
    code, out, err = await mwp(
        "--target", w.target, "mission", "review", "--group", G, "--verify-bytes", "--approve",
        "--as", "alice", "--key", str(owner.key), "--json",
    )  # fmt: skip
    assert code == 0, err
    review = json.loads(out)
    assert review["verified"] is True and review["decision"]
    checks = review["artifact_checks"]
    assert all(c["signature"] == "verified" and c["bytes"]["status"] == "OK" for c in checks), checks
    named = {f"{a.digest.algorithm}:{a.digest.hex}:{a.digest.size_bytes}" for a in deliverables}
    assert named <= {c["digest"] for c in checks}
    assert (await w.client.group_state(G)).mission.state == mission_pb2.MISSION_STATE_APPROVED

    # Every Artifact of every submission and every piece of Evidence, fetched by its content hash.
    checked = 0
    for submission in submissions.values():
        for ref in [*submission.artifacts, *(a for e in submission.evidence for a in e.artifacts)]:
            blob = await w.client.download(ref.digest)
            assert blake3.blake3(blob).hexdigest() == ref.digest.hex
            assert len(blob) == ref.digest.size_bytes
            checked += 1
    assert checked >= 5
    extract = [await w.client.download(a.digest) for a in submissions["extract"].artifacts]
    assert BINARY in extract
    assert [await w.client.download(a.digest) for a in submissions["convert"].artifacts] == [
        b"converted to EUR"
    ]
    assert [await w.client.download(a.digest) for a in submissions["report"].artifacts] == [
        b"through the gate"
    ]
