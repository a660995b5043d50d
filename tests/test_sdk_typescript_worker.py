"""The TypeScript SDK's Worker runtime against a live mesh, in both topologies, beyond what
tests/test_sdk_typescript.py covers: a slot's inputs include the Artifacts of the WorkItems it
depends on (read verified, named as the sources of what it stores, so provenance walks back through
the DAG), and the `blocked` outcome (the question in the WorkItem's Conversation, `work.block` citing
it, the work resumed from its checkpoint with the Coordinator's resolution). Driven through the
conformance driver's `work` op (modes `derive` and `block_once`, src/conformance-script.ts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from missionweave.sdk.client import blob_digest
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import membership_pb2
from missionweave.v1 import work_pb2 as wp
from tests.conftest import World
from tests.test_bridges_mission import accepted_by_coordinator
from tests.test_missions import G
from tests.test_sdk_typescript import driver, grant, identity, node
from tests.test_work_items import Flow, setup

pytestmark = pytest.mark.both_topologies

__all__ = ["node"]  # the fixture, shared with tests/test_sdk_typescript.py


@pytest.mark.req("MW-13.1-04", "MW-13.1-05")
async def test_the_typescript_worker_reads_its_dependencys_output_and_names_it_as_the_source(
    world: World, node: str, tmp_path: Path
) -> None:
    """A two-WorkItem DAG (wi-b depends on wi-a): the TypeScript Worker does wi-a, then wi-b, whose
    slot lists wi-a's Artifact as an input (named by the WorkItem), reads it verified and stores an
    output derived from it; that output's manifest names wi-a's Artifact as its source, and the
    provenance graph walks back from wi-b's output to wi-a's."""
    w = world
    key_file = await identity(w, tmp_path, "ts-worker")
    flow: Flow = await setup(w, w.worker)
    await grant(w, "ts-worker", membership_pb2.MEMBER_ROLE_WORKER)
    async with driver(node, w.target, "ts-worker", key_file, tmp_path / "state") as d:
        assert (await d.ask("work", groups=[G], mode="derive", content="derived; inputs: "))["ok"]
        await flow.authorize("wi-a")
        await flow.authorize("wi-b", depends_on=("wi-a",))
        await flow.coord("work_offer", flow.offer_body("wi-a", "ts-worker"))
        assert (await d.note("work_started"))["inputs"] == []
        a = await d.note("work_finished")
        assert a["work_item_id"] == "wi-a" and a["outcome"] == "submitted", a
        [a_hex] = a["artifacts"]
        await accepted_by_coordinator(flow, w, "wi-a")
        await flow.coord("work_offer", flow.offer_body("wi-b", "ts-worker"))
        started = await d.note("work_started")
        assert started["work_item_id"] == "wi-b"
        assert started["inputs"] == [{"name": "wi-a", "digest": a_hex, "from_work_item_id": "wi-a"}]
        b = await d.note("work_finished")
        assert b["work_item_id"] == "wi-b" and b["outcome"] == "submitted", b
        assert (await d.ask("close"))["ok"]
    [b_hex] = b["artifacts"]
    log = [e async for e in w.client.read_events(G)]
    outputs = {
        e.work_submitted.work_item_id: e.work_submitted.artifacts[0].digest
        for e in log
        if e.WhichOneof("payload") == "work_submitted"
    }
    assert (outputs["wi-a"].hex, outputs["wi-b"].hex) == (a_hex, b_hex)
    a_bytes = await w.client.download(outputs["wi-a"])
    b_bytes = await w.client.download(outputs["wi-b"])
    assert b_bytes == b"derived; inputs: " + a_bytes  # wi-b read wi-a's bytes
    assert blob_digest(a_bytes).hex == a_hex
    graph = await w.client.artifacts.QueryProvenance(
        apb.QueryProvenanceRequest(
            digest=outputs["wi-b"], direction=apb.PROVENANCE_DIRECTION_ANCESTORS, group_id=G
        )
    )
    assert [(e.source.hex, e.derived.hex) for e in graph.edges] == [(a_hex, b_hex)]
    assert {n.digest.hex: n.work_item_id for n in graph.nodes} == {b_hex: "wi-b", a_hex: "wi-a"}


@pytest.mark.req("MW-10.2-T09", "MW-10.2-T10", "MW-11.4-04")
async def test_a_blocked_typescript_handler_asks_in_the_conversation_and_resumes_with_the_resolution(
    world: World, node: str, tmp_path: Path
) -> None:
    """The handler returns `blocked(question, checkpoint)`: the runtime posts the question in the
    WorkItem's Conversation, records `work.block` with the checkpoint and a blocker citing that
    Message, and returns the slot; the Coordinator unblocks, the WorkItem is placed again and the
    handler runs from the checkpoint with the resolution in `slot.unblockedWith`."""
    w = world
    key_file = await identity(w, tmp_path, "ts-worker")
    flow: Flow = await setup(w, w.worker)
    await grant(w, "ts-worker", membership_pb2.MEMBER_ROLE_WORKER)
    question = "Which ledger, Q3 or Q4?"
    async with driver(node, w.target, "ts-worker", key_file, tmp_path / "state") as d:
        assert (await d.ask("work", groups=[G], mode="block_once", content=question))["ok"]
        await flow.authorize("wi-k")
        await flow.coord("work_offer", flow.offer_body("wi-k", "ts-worker"))
        first = await d.note("work_started")
        assert first["unblocked_with"] == "" and first["unblocked_at"] == 0
        assert (await d.note("work_finished"))["outcome"] == "blocked"
        assert (await w.client.work_item(G, "wi-k")).state == wp.WORK_ITEM_STATE_BLOCKED
        unblock = wp.WorkUnblock(work_item_id="wi-k", resolution="Q3", coordinator_epoch=1)
        await flow.coord("work_unblock", unblock)
        resumed = await d.note("work_started")
        done = await d.note("work_finished")
        assert done["outcome"] == "submitted", done
        assert (await d.ask("close"))["ok"]
    log = [e async for e in w.client.read_events(G)]
    authorized = next(e.work_authorized for e in log if e.WhichOneof("payload") == "work_authorized")
    [posted] = [e.message_posted for e in log if e.WhichOneof("payload") == "message_posted"]
    [block] = [e.work_blocked for e in log if e.WhichOneof("payload") == "work_blocked"]
    [unblocked] = [e for e in log if e.WhichOneof("payload") == "work_unblocked"]
    # The question is a Message of the WorkItem's own Conversation; the blocker cites it.
    assert (posted.conversation_id, posted.content.text) == (authorized.conversation_id, question)
    [blocker] = block.blockers
    assert blocker.message_id == posted.message_id and blocker.kind == wp.BLOCKER_KIND_INFORMATION
    assert block.checkpoint.checkpoint_id == f"ck-{first['lease_id']}" and block.lease_id == first["lease_id"]
    # Placed again after the unblock: resumed from the block's checkpoint, with the resolution.
    assert resumed["resume_from_checkpoint_id"] == f"ck-{first['lease_id']}"
    assert (resumed["unblocked_with"], resumed["unblocked_at"]) == ("Q3", unblocked.sequence)
    [submitted] = [e.work_submitted for e in log if e.WhichOneof("payload") == "work_submitted"]
    assert await w.client.download(submitted.artifacts[0].digest) == b"answered: Q3"
