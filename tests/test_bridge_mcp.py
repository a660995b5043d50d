"""`mwp mcp` (issue 43, docs/mcp.md) driven by the mcp SDK's own ClientSession over stdio, against a
live mesh: an MCP-driven Worker takes an offer, reads its input verified by hash, stores an output
under its lease and submits it with Evidence; refusals come back as tool errors with their stable
reason and write nothing; a question blocks the work until the Coordinator (through MCP too)
answers it; a Coordinator plans, offers and reviews; leases are renewed while the host thinks."""

from __future__ import annotations

import asyncio
import base64
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from missionweave.kernel.manifest import verify_manifest
from missionweave.sdk.client import MeshClient, SessionSigner, blob_digest
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.mcp_server.desk import Desk
from missionweave_bridges.mcp_server.refusals import Refused
from tests.conftest import World, polled
from tests.mcp_fixtures import (
    authorized,
    data,
    mission,
    offered,
    party,
    refusal,
    stdio_session,
    task_result,
)
from tests.test_missions import G

LEDGER = b"account,balance\ncash,100\nbank,250\n"


async def head(w: World) -> int:
    return int((await w.client.group_state(G)).head_sequence)


@pytest.mark.both_topologies
async def test_an_mcp_worker_takes_an_offer_reads_its_input_stores_and_submits_with_evidence(
    world: World, tmp_path: Path
) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1", ledger=LEDGER)
    offer_id = await offered(w, "wi-1")
    worker = party(tmp_path, w.worker)
    async with stdio_session(w, worker, tmp_path / "worker-state") as mcp:
        tools = {t.name for t in (await mcp.list_tools()).tools}
        assert {
            "list_work",
            "accept_offer",
            "start_work",
            "read_input",
            "store_output",
            "submit_work",
        } <= tools
        listed = await data(mcp, "list_work")
        assert [(o["work_item_id"], o["offer_ids"]) for o in listed["offers"]] == [("wi-1", [offer_id])]
        accepted = await data(mcp, "accept_offer", group_id=G, work_item_id="wi-1")
        assert accepted["offer_id"] == offer_id and accepted["ownership_epoch"] == 1
        # The same call again (the host lost the answer) is answered with the first result, not refused.
        again = await data(mcp, "accept_offer", group_id=G, work_item_id="wi-1", offer_id=offer_id)
        assert again["replayed"] is True and again["events"] == accepted["events"]
        started = await data(mcp, "start_work", group_id=G, work_item_id="wi-1")
        shown = await data(mcp, "show_work_item", group_id=G, work_item_id="wi-1")
        assert shown["state"] == "active" and shown["you_hold_the_lease"] is True
        assert shown["lease"]["lease_id"] == started["lease_id"]
        assert [i["name"] for i in shown["inputs"]] == ["ledger"]
        read = await data(mcp, "read_input", group_id=G, work_item_id="wi-1", name="ledger")
        assert read["text"] == LEDGER.decode() and read["verified"] is True
        await data(
            mcp,
            "report_progress",
            group_id=G,
            work_item_id="wi-1",
            phase="reconciling",
            milestones=["read the ledger"],
        )
        stored = await data(
            mcp,
            "store_output",
            group_id=G,
            work_item_id="wi-1",
            text="cash 100 = 100\nbank 250 = 250\n",
            media_type="text/plain",
        )
        report = stored["artifact"]
        evidence = [{"criterion_id": "balances", "summary": "2 of 2 balances match", "artifacts": [report]}]
        submitted = await data(
            mcp, "submit_work", group_id=G, work_item_id="wi-1", evidence=evidence, summary="reconciled"
        )
        assert submitted["artifacts"] == [report] and submitted["submission_event_id"]
        # Once it is submitted, a repeat is refused by this server before anything is sent.
        before = await head(w)
        resent = await refusal(mcp, "submit_work", group_id=G, work_item_id="wi-1", evidence=evidence)
        assert resent["reason"] == "NOT_HELD" and resent["metadata"]["state"] == "submitted"
        assert await head(w) == before

    item = await w.client.work_item(G, "wi-1")
    assert item.state == wp.WORK_ITEM_STATE_SUBMITTED
    _, hex_, size = report.split(":")
    digest = common_pb2.Digest(algorithm="blake3", hex=hex_, size_bytes=int(size))
    assert [a.digest for a in item.artifacts] == [digest]
    # Verifiable by content hash afterwards: the bytes hash to their name, and the manifest the
    # Worker signed under its lease names the Mission, the WorkItem, the lease and its input.
    stored_bytes = await w.client.download(digest)
    assert blob_digest(stored_bytes) == digest and stored_bytes == b"cash 100 = 100\nbank 250 = 250\n"
    manifests = (await w.client.artifacts.GetManifest(apb.GetManifestRequest(digest=digest))).manifests
    manifest = verify_manifest(
        manifests[0],
        bytes(w.worker.key.verify_key),
        expected_digest_hex=hex_,
        expected_size=int(size),
        producer_id="worker-bot",
    )
    assert manifest.producer_agent_id == "worker-bot" and manifest.work_item_id == "wi-1"
    assert manifest.lease_id == started["lease_id"]
    assert [s.hex for s in manifest.source_artifacts] == [blob_digest(LEDGER).hex]


async def test_a_refused_command_is_a_tool_error_with_its_reason_and_writes_nothing(
    world: World, tmp_path: Path
) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1", lease_seconds=2)
    await offered(w, "wi-1")
    worker = party(tmp_path, w.worker)
    # --idle-release 1: the server stops renewing at once, so the 2 s lease lapses while it waits.
    async with stdio_session(w, worker, tmp_path / "state", "--idle-release", "1") as mcp:
        await data(mcp, "accept_offer", group_id=G, work_item_id="wi-1")
        await data(mcp, "start_work", group_id=G, work_item_id="wi-1")
        await asyncio.sleep(3.5)
        before = await head(w)
        refused = await refusal(mcp, "report_progress", group_id=G, work_item_id="wi-1", phase="late")
        assert refused["reason"] == "LEASE_EXPIRED" and refused["refused_by"] == "mesh"
        assert "start_work" in refused["hint"]
        assert await head(w) == before  # nothing was written
        # A client-side refusal names its reason too, before anything is sent.
        missing = await refusal(mcp, "accept_offer", group_id=G, work_item_id="wi-1")
        assert missing["reason"] == "NO_OPEN_OFFER" and missing["refused_by"] == "mwp-mcp"
        # Evidence for every required criterion is checked before sending (the mesh would refuse it too).
        bare = await refusal(mcp, "submit_work", group_id=G, work_item_id="wi-1", evidence=[])
        assert bare["reason"] == "MISSING_EVIDENCE" and bare["metadata"] == {"criteria": "balances"}
        assert await head(w) == before


async def test_a_worker_declines_an_offer_with_a_structured_reason(world: World, tmp_path: Path) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1")
    offer_id = await offered(w, "wi-1")
    async with stdio_session(w, party(tmp_path, w.worker), tmp_path / "state") as mcp:
        vague = await refusal(mcp, "decline_offer", group_id=G, work_item_id="wi-1", reason="other")
        assert vague["reason"] == "INVALID_ARGUMENT"  # 'other' needs its namespaced code
        declined = await data(
            mcp,
            "decline_offer",
            group_id=G,
            work_item_id="wi-1",
            reason="capacity",
            detail="two items running",
        )
        assert declined["offer_id"] == offer_id
    declines = [
        e.work_offer_declined async for e in w.client.read_events(G) if e.type == "work.offer_declined"
    ]
    assert [(d.offer_id, d.decline.reason, d.decline.detail) for d in declines] == [
        (offer_id, wp.DECLINE_REASON_CAPACITY, "two items running")
    ]


async def test_a_checkpoint_keeps_its_state_and_a_failure_is_reported_with_evidence(
    world: World, tmp_path: Path
) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1")
    await offered(w, "wi-1")
    async with stdio_session(w, party(tmp_path, w.worker), tmp_path / "state") as mcp:
        await data(mcp, "accept_offer", group_id=G, work_item_id="wi-1")
        await data(mcp, "start_work", group_id=G, work_item_id="wi-1")
        point = await data(
            mcp, "checkpoint", group_id=G, work_item_id="wi-1", phase="half the accounts", state="cash: done"
        )
        shown = await data(mcp, "show_work_item", group_id=G, work_item_id="wi-1")
        # What a resuming host needs: the phase and the state, stored under the lease, read back by hash.
        assert shown["latest_checkpoint"] == {
            "checkpoint_id": point["checkpoint_id"],
            "phase": "half the accounts",
            "completed_operation_ids": [],
            "state_artifact": _ref_text(b"cash: done"),
            "state_text": "cash: done",
        }
        assert shown["state"] == "queued"  # paused: the host resumes it from the checkpoint
        await data(
            mcp,
            "start_work",
            group_id=G,
            work_item_id="wi-1",
            resume_from_checkpoint_id=point["checkpoint_id"],
        )
        bad = await refusal(mcp, "fail_work", group_id=G, work_item_id="wi-1", reason="x", kind="sometimes")
        assert bad["reason"] == "INVALID_ARGUMENT"
        await data(mcp, "fail_work", group_id=G, work_item_id="wi-1", reason="the ledger file is truncated")
    item = await w.client.work_item(G, "wi-1")
    assert item.state == wp.WORK_ITEM_STATE_FAILED
    failed = [e.work_failed async for e in w.client.read_events(G) if e.type == "work.failed"]
    assert [(f.reason, [e.summary for e in f.evidence]) for f in failed] == [
        ("the ledger file is truncated", ["the ledger file is truncated"])
    ]


async def test_the_server_renews_the_lease_while_the_host_thinks(world: World, tmp_path: Path) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1", lease_seconds=3)
    await offered(w, "wi-1")
    worker = party(tmp_path, w.worker)
    async with stdio_session(w, worker, tmp_path / "state") as mcp:
        await data(mcp, "accept_offer", group_id=G, work_item_id="wi-1")
        await data(mcp, "start_work", group_id=G, work_item_id="wi-1")
        await asyncio.sleep(7)  # over two lease terms without a tool call
        item = await w.client.work_item(G, "wi-1")
        assert item.state == wp.WORK_ITEM_STATE_ACTIVE
        assert item.lease.expires_at.ToDatetime(tzinfo=UTC) > datetime.now(UTC)
        renewed = [e async for e in w.client.read_events(G) if e.type == "work.lease_renewed"]
        assert len(renewed) >= 2
        # Still held: the host goes on under the same lease.
        await data(mcp, "report_progress", group_id=G, work_item_id="wi-1", phase="still here")


async def test_a_restarted_server_keeps_renewing_the_leases_its_session_holds(
    world: World, tmp_path: Path
) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1", lease_seconds=4)  # outlasts the restart
    await offered(w, "wi-1")
    worker = party(tmp_path, w.worker)
    async with stdio_session(w, worker, tmp_path / "state") as mcp:
        await data(mcp, "accept_offer", group_id=G, work_item_id="wi-1")
        lease = (await data(mcp, "start_work", group_id=G, work_item_id="wi-1"))["lease_id"]
    # The host restarted it: the new process reuses the saved session and finds the lease it holds.
    async with stdio_session(w, worker, tmp_path / "state") as mcp:
        await asyncio.sleep(9)  # two lease terms
        item = await w.client.work_item(G, "wi-1")
        assert item.state == wp.WORK_ITEM_STATE_ACTIVE and item.lease.lease_id == lease
        assert item.lease.expires_at.ToDatetime(tzinfo=UTC) > datetime.now(UTC)
        await data(mcp, "report_progress", group_id=G, work_item_id="wi-1", phase="resumed")


async def test_a_question_blocks_the_work_until_the_coordinator_answers_through_mcp(
    world: World, tmp_path: Path
) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1")
    await offered(w, "wi-1")
    worker, coordinator = party(tmp_path, w.worker), party(tmp_path, w.coordinator)
    async with (
        stdio_session(w, worker, tmp_path / "worker") as mcp,
        stdio_session(w, coordinator, tmp_path / "coord") as coord,
    ):
        await data(mcp, "accept_offer", group_id=G, work_item_id="wi-1")
        await data(mcp, "start_work", group_id=G, work_item_id="wi-1")
        blocked = await data(
            mcp,
            "block_with_question",
            group_id=G,
            work_item_id="wi-1",
            question="Which currency do the balances use?",
        )
        assert (await w.client.work_item(G, "wi-1")).state == wp.WORK_ITEM_STATE_BLOCKED
        # Only a blocked WorkItem has a question to answer.
        assert (await refusal(mcp, "report_progress", group_id=G, work_item_id="wi-1", phase="x"))[
            "reason"
        ] == "NOT_HELD"
        answered = await data(
            coord, "answer_block", group_id=G, work_item_id="wi-1", answer="EUR, all of them"
        )
        assert answered["state"] == "queued"
        # A wait is an MCP task for a client that declares the tasks extension.
        followed = await task_result(
            mcp, "follow_work_item", group_id=G, work_item_id="wi-1", from_state="blocked", timeout_seconds=10
        )
        assert followed["changed"] is True and followed["state"] == "queued"
        messages = (await data(mcp, "read_messages", group_id=G, work_item_id="wi-1"))["messages"]
        assert [(m["author_id"], m["text"]) for m in messages] == [
            ("worker-bot", "Which currency do the balances use?"),
            ("coord-bot", "EUR, all of them"),
        ]
        assert messages[1]["reply_to_message_id"] == blocked["message_id"]
        assert (await refusal(coord, "answer_block", group_id=G, work_item_id="wi-1", answer="again"))[
            "reason"
        ] == "NOT_BLOCKED"
        await data(mcp, "start_work", group_id=G, work_item_id="wi-1")
        assert (await w.client.work_item(G, "wi-1")).state == wp.WORK_ITEM_STATE_ACTIVE


async def test_an_mcp_coordinator_plans_offers_and_reviews(world: World, tmp_path: Path) -> None:
    w = world
    await mission(w)
    worker, coordinator = party(tmp_path, w.worker), party(tmp_path, w.coordinator)
    plan = [
        {
            "work_item_id": "wi-a",
            "title": "reconcile",
            "goal": "Reconcile the ledger",
            "deliverables": {"report": "the reconciled ledger"},
            "criteria": [
                {
                    "criterion_id": "balances",
                    "description": "all balances match",
                    "evidence_methods": ["test"],
                }
            ],
        }
    ]
    async with (
        stdio_session(w, worker, tmp_path / "worker") as mcp,
        stdio_session(w, coordinator, tmp_path / "coord") as coord,
    ):
        assert (await data(coord, "plan_work", group_id=G, items=plan))["work_item_ids"] == ["wi-a"]
        assert (await w.client.work_item(G, "wi-a")).contract.acceptance_criteria[
            0
        ].criterion_id == "balances"
        # A candidate that is not a member is refused before anything is sent.
        assert (await refusal(coord, "offer_work", group_id=G, work_item_id="wi-a", candidates=["nobody"]))[
            "reason"
        ] == "INVALID_ARGUMENT"
        offer = await data(coord, "offer_work", group_id=G, work_item_id="wi-a", candidates=["worker-bot"])
        assert offer["offer_id"]
        await data(mcp, "accept_offer", group_id=G, work_item_id="wi-a")
        await data(mcp, "start_work", group_id=G, work_item_id="wi-a")
        ref = (await data(mcp, "store_output", group_id=G, work_item_id="wi-a", text="balanced"))["artifact"]
        await data(
            mcp,
            "submit_work",
            group_id=G,
            work_item_id="wi-a",
            evidence=[{"criterion_id": "balances", "summary": "all match", "artifacts": [ref]}],
        )
        # The Worker may not review its own work: the mesh refuses it by role.
        worker_review = await refusal(
            mcp,
            "review_submission",
            group_id=G,
            work_item_id="wi-a",
            decision="accept",
            findings=[{"criterion_id": "balances", "summary": "fine"}],
        )
        assert worker_review["reason"] in ("PERMISSION_DENIED", "COORDINATOR_EPOCH_STALE")
        changes = await data(
            coord,
            "review_submission",
            group_id=G,
            work_item_id="wi-a",
            decision="request_changes",
            findings=[{"criterion_id": "balances", "summary": "bank balance off by 1"}],
        )
        assert changes["offer_id"]
        await data(mcp, "accept_offer", group_id=G, work_item_id="wi-a")
        await data(mcp, "start_work", group_id=G, work_item_id="wi-a")
        ref = (await data(mcp, "store_output", group_id=G, work_item_id="wi-a", text="balanced, fixed"))[
            "artifact"
        ]
        await data(
            mcp,
            "submit_work",
            group_id=G,
            work_item_id="wi-a",
            evidence=[{"criterion_id": "balances", "summary": "all match now", "artifacts": [ref]}],
        )
        accepted = await data(
            coord,
            "review_submission",
            group_id=G,
            work_item_id="wi-a",
            decision="accept",
            findings=[{"criterion_id": "balances", "summary": "re-ran the check: all match"}],
        )
        assert len(accepted["review_evidence_ids"]) == 1
    await polled(lambda: _state_is(w, "wi-a", wp.WORK_ITEM_STATE_VERIFIED))


async def _state_is(w: World, work_item_id: str, state: int) -> bool:
    return (await w.client.work_item(G, work_item_id)).state == state


async def test_tools_are_listed_with_typed_schemas_and_descriptions_for_a_model(
    world: World, tmp_path: Path
) -> None:
    w = world
    await mission(w)
    async with stdio_session(w, party(tmp_path, w.worker), tmp_path / "state") as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        submit = tools["submit_work"]
        assert submit.description and "Evidence" in submit.description
        properties = submit.input_schema["properties"]
        assert set(submit.input_schema["required"]) == {"group_id", "work_item_id", "evidence"}
        assert properties["group_id"]["type"] == "string" and properties["group_id"]["description"]
        for name, tool in tools.items():
            assert tool.description and len(tool.description) > 60, name


async def test_conversation_messages_and_a_verified_context_package(world: World, tmp_path: Path) -> None:
    w = world
    await mission(w)
    await authorized(w, "wi-1", ledger=LEDGER)
    await offered(w, "wi-1")
    worker, coordinator = party(tmp_path, w.worker), party(tmp_path, w.coordinator)
    async with (
        stdio_session(w, worker, tmp_path / "worker") as mcp,
        stdio_session(w, coordinator, tmp_path / "coord") as coord,
    ):
        posted = await data(mcp, "post_message", group_id=G, text="I can take the ledger work today.")
        planning = (await w.client.group_state(G)).mission.planning_conversation_id
        assert posted["conversation_id"] == planning
        read = await data(coord, "read_messages", group_id=G)
        assert [(m["author_id"], m["text"]) for m in read["messages"]] == [
            ("worker-bot", "I can take the ledger work today.")
        ]
        newer = await data(coord, "read_messages", group_id=G, after_sequence=read["messages"][0]["sequence"])
        assert newer["messages"] == []
        # Only the Coordinator has the Authority sign one; it hands it over in the WorkItem's Conversation.
        denied = await refusal(
            mcp, "make_context_package", group_id=G, work_item_ids=["wi-1"], recipient_ids=["worker-bot"]
        )
        assert denied["reason"] == "PERMISSION_DENIED" and denied["refused_by"] == "mesh"
        made = await data(
            coord,
            "make_context_package",
            group_id=G,
            work_item_ids=["wi-1"],
            recipient_ids=["worker-bot"],
            share_in_work_item="wi-1",
        )
        assert made["verified"] is True and made["package"]["work_item_ids"] == ["wi-1"]
        shared = (await data(mcp, "read_messages", group_id=G, work_item_id="wi-1"))["messages"]
        assert [m["artifacts"] for m in shared] == [[made["shared"]["artifact"]]]
        package = await data(mcp, "read_context_package", artifact=shared[0]["artifacts"][0])
        assert package["verified"] is True and package["package"] == made["package"]
        assert package["package"]["group_id"] == G
        not_a_package = await refusal(mcp, "read_context_package", artifact=_ledger_ref())
        assert not_a_package["reason"] == "NOT_VERIFIED"
        # A package edited after the Authority signed it does not verify.
        _, hex_, size = made["shared"]["artifact"].split(":")
        signed = await w.client.download(
            common_pb2.Digest(algorithm="blake3", hex=hex_, size_bytes=int(size))
        )
        forged = common_pb2.SignedEnvelope.FromString(signed)
        package_pb = apb.ContextPackage.FromString(forged.payload)
        package_pb.open_questions.add().question = "who approved this?"
        forged.payload = package_pb.SerializeToString()
        await data(mcp, "accept_offer", group_id=G, work_item_id="wi-1")
        await data(mcp, "start_work", group_id=G, work_item_id="wi-1")
        stored = await data(
            mcp,
            "store_output",
            group_id=G,
            work_item_id="wi-1",
            base64=base64.b64encode(forged.SerializeToString()).decode(),
            deliverable=False,
        )
        tampered = await refusal(mcp, "read_context_package", artifact=stored["artifact"])
        assert tampered["reason"] == "NOT_VERIFIED"


def _ref_text(data: bytes) -> str:
    digest = blob_digest(data)
    return f"blake3:{digest.hex}:{digest.size_bytes}"


def _ledger_ref() -> str:
    return _ref_text(LEDGER)


async def test_a_mesh_that_never_answers_is_a_timeout_refusal_not_a_hung_tool(tmp_path: Path) -> None:
    """A listener that accepts and then says nothing (a hung mesh, a black-holed port): the call ends
    at its limit as MESH_TIMEOUT, whose hint says a command may have been written."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers; ends when the client goes

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    mesh = MeshClient(f"127.0.0.1:{port}")
    signer = SessionSigner("worker-bot", 1, SigningKey.generate())
    desk = Desk(mesh, signer, tmp_path, f"127.0.0.1:{port}")
    try:
        async with asyncio.timeout(20):
            with pytest.raises(Refused) as refused:
                await desk.call(mesh.group_state(G), limit_s=0.5)
    finally:
        await mesh.channel.close()
        server.close()
    assert refused.value.reason == "MESH_TIMEOUT" and "may or may not have been written" in refused.value.hint


async def test_renewals_outlast_a_mesh_that_does_not_answer_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MESH_UNAVAILABLE or MESH_TIMEOUT says nothing about the lease: the keeper tries again instead
    of letting the lease lapse over a blip; a refusal about the lease itself (NOT_HELD) stops it."""
    from datetime import timedelta

    from google.protobuf.timestamp_pb2 import Timestamp

    from missionweave_bridges.mcp_server import leases

    monkeypatch.setattr(leases, "RETRY_S", 0.01)
    monkeypatch.setattr(leases, "MIN_RENEW_DELAY_S", 0.01)

    class Blinking:
        me = "worker-bot"

        def __init__(self) -> None:
            self.touched = time.monotonic()
            self.reads, self.renewals, self.unanswered = 0, 0, 2

        async def work_item(self, group_id: str, work_item_id: str) -> wp.WorkItem:
            self.reads += 1
            if self.reads == 1:
                raise Refused("MESH_UNAVAILABLE", "the mesh restarts")
            expires = Timestamp()
            expires.FromDatetime(datetime.now(UTC) + timedelta(milliseconds=40))
            lease = wp.ExecutionLease(lease_id="l", ownership_epoch=1, expires_at=expires)
            return wp.WorkItem(work_item_id=work_item_id, state=wp.WORK_ITEM_STATE_ACTIVE, lease=lease)

        def held_lease(self, item: wp.WorkItem) -> wp.ExecutionLease:
            return item.lease

        async def execute(self, group_id: str, kind: str, body: object) -> None:
            if self.unanswered:
                self.unanswered -= 1
                raise Refused("MESH_TIMEOUT", "no answer within 30 s")
            self.renewals += 1
            if self.renewals == 2:
                raise Refused("NOT_HELD", "submitted meanwhile")

    desk = Blinking()
    keeper = leases.LeaseKeeper(desk, idle_release_s=60)  # type: ignore[arg-type]
    keeper.hold("grp", "wi-1")
    async with asyncio.timeout(10):
        await keeper.loops[("grp", "wi-1")]
    assert desk.unanswered == 0 and desk.renewals == 2 and keeper.renewals[("grp", "wi-1")] == 1
