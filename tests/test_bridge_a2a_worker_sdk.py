"""What the A2A bridge needed from the SDK's Worker runtime, for any Worker: a handler that cannot
go on without an answer hands back ``Blocked`` (its question posted in the WorkItem's Conversation,
then ``work.block`` citing it) and runs again after the unblock with the resolution on its slot;
a runtime restarted over its durable cursor still gets the contract of work it resumes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from missionweave.sdk.worker import Blocked, Slot, WorkerRuntime, WorkResult
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.conftest import World, polled
from tests.test_agent_sdk import connect
from tests.test_missions import G
from tests.test_work_items import Flow, setup
from tests.test_worker_runtime import serving


@pytest.mark.both_topologies
@pytest.mark.req("MW-10.2-T09", "MW-10.2-T10", "MW-11.4-04")
async def test_a_blocked_handler_asks_in_the_conversation_and_resumes_with_the_resolution(
    world: World, tmp_path: Path
) -> None:
    w = world
    flow: Flow = await setup(w)
    calls: list[Slot] = []

    async def handle(slot: Slot) -> WorkResult | Blocked:
        calls.append(slot)
        if not slot.unblocked_with:
            return Blocked("Which ledger, Q3 or Q4?", wp.Checkpoint(checkpoint_id="ck-ask"))
        await slot.put(f"reconciled {slot.unblocked_with}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="answered")

    async with serving(w, handle, tmp_path) as runtime:
        await flow.authorize("wi-1")
        await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))

        async def blocked() -> bool:
            return "work_blocked" in [e.WhichOneof("payload") async for e in w.client.read_events(G)]

        await polled(blocked, 30)
        await flow.coord(
            "work_unblock", wp.WorkUnblock(work_item_id="wi-1", resolution="Q3", coordinator_epoch=1)
        )
        async with asyncio.timeout(30):
            assert await runtime.submitted(1) == [(G, "wi-1")]
    log = [e async for e in w.client.read_events(G)]
    [posted] = [e.message_posted for e in log if e.WhichOneof("payload") == "message_posted"]
    [block] = [e.work_blocked for e in log if e.WhichOneof("payload") == "work_blocked"]
    [unblocked] = [e for e in log if e.WhichOneof("payload") == "work_unblocked"]
    authorized = next(e.work_authorized for e in log if e.WhichOneof("payload") == "work_authorized")
    # The question is a Message of the WorkItem's own Conversation; the blocker cites it.
    assert (
        posted.conversation_id == authorized.conversation_id
        and posted.content.text == "Which ledger, Q3 or Q4?"
    )
    assert block.blockers[0].message_id == posted.message_id
    assert (
        block.blockers[0].kind == wp.BLOCKER_KIND_INFORMATION and block.checkpoint.checkpoint_id == "ck-ask"
    )
    # The start after the unblock resumes from the block's checkpoint with the resolution.
    assert [(c.unblocked_with, c.unblocked_at) for c in calls] == [("", 0), ("Q3", unblocked.sequence)]
    assert calls[1].resume_from_checkpoint_id == "ck-ask"


@pytest.mark.req("MW-11.3-09")
async def test_a_runtime_restarted_over_its_cursor_still_has_the_contract_of_the_work_it_resumes(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The second runtime's subscription resumes after the authorization (the cursor is durable),
    so the contract comes from the WorkItem itself; and its lease ids are not the first one's."""
    w = world
    flow: Flow = await setup(w)
    started = asyncio.Event()
    seen: list[wp.WorkContract] = []

    async def stuck(slot: Slot) -> WorkResult:
        started.set()
        await asyncio.Event().wait()  # the process dies here
        raise AssertionError("unreachable")

    async def finish(slot: Slot) -> WorkResult:
        seen.append(slot.contract)
        await slot.put(b"done", media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="after the restart")

    async with connect(w, "worker-bot", w.worker.key, tmp_path) as agent:
        first = WorkerRuntime(agent, stuck)
        await first.serve([G])
        await flow.authorize("wi-1")
        await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))
        async with asyncio.timeout(30):
            await started.wait()
    await first.close()
    (tmp_path / "worker-bot" / "session.json").unlink()  # a new session: the old lease is fenced
    async with serving(w, finish, tmp_path) as second:
        async with asyncio.timeout(30):
            assert await second.submitted(1) == [(G, "wi-1")]
    [contract] = seen
    # The restarted runtime's first start was accepted: its lease id was new (this session's).
    assert not [r for r in caplog.records if "lease id" in r.getMessage()]
    assert (
        contract.goal == "Reconcile the Q3 ledger"
        and contract.acceptance_criteria[0].criterion_id == "balances"
    )
