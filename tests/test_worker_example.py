"""examples/worker_three_missions.py against an in-process mesh: one Worker serving three Missions
at once with one handler, which pauses at a safe point when preempted and resumes from its
checkpoint without redoing the steps it recorded."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from missionweave.v1 import membership_pb2
from missionweave.v1 import scheduling_service_pb2 as spb
from missionweave.v1 import work_pb2 as wp
from missionweave.v1.authority_service_pb2 import GetMissionProgressRequest
from tests import builders
from tests.conftest import World
from tests.test_agent_sdk import connect
from tests.test_missions import G
from tests.test_work_items import Flow, setup

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "worker_three_missions.py"
GROUPS = (G, "grp_second", "grp_third")


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("worker_three_missions", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    yield module


def criteria(*ids: str) -> list[wp.AcceptanceCriterion]:
    return [
        wp.AcceptanceCriterion(
            criterion_id=cid,
            description=f"{cid} holds",
            required_evidence_methods=[wp.EVIDENCE_METHOD_TEST],
            deliverable_ids=["report"],
            required=True,
        )
        for cid in ids
    ]


async def missions(w: World) -> Flow:
    """Three Missions with worker-bot a Worker of each (the Coordinator's Membership epoch is 2)."""
    flow: Flow = await setup(w)
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    for group in GROUPS[1:]:
        await w.run(
            w.owner, group, "mission_create", builders.mission_create("alice", "coord-bot", w.clock.now())
        )
        await w.run(w.owner, group, "membership_grant", grant, membership_epoch=1)
    return flow


async def authorize_and_offer(
    w: World, flow: Flow, group: str, work_item_id: str, contract: wp.WorkContract
) -> None:
    body = wp.WorkAuthorize(
        work_item_id=work_item_id, title=f"task {work_item_id}", contract=contract, coordinator_epoch=1
    )
    await w.run(w.coordinator, group, "work_authorize", body, membership_epoch=2)
    await w.run(
        w.coordinator, group, "work_offer", flow.offer_body(work_item_id, "worker-bot"), membership_epoch=2
    )


def submissions(log: list[wp.WorkSubmitted]) -> dict[str, wp.WorkSubmitted]:
    return {s.work_item_id: s for s in log}


@pytest.mark.req("MW-11.1-01", "MW-11.1-05", "MW-10.3-07")
async def test_the_example_worker_serves_three_missions_at_once(
    world: World, tmp_path: Path, example: ModuleType
) -> None:
    w = world
    example.STEP_SECONDS = 0.05
    flow = await missions(w)
    async with connect(w, "worker-bot", w.worker.key, tmp_path) as agent:
        runtime = await example.serve(agent, GROUPS)
        try:
            for n, group in enumerate(GROUPS):
                contract = builders.contract(
                    w.clock.now(), acceptance_criteria=criteria(*(f"c{i}" for i in range(n + 1)))
                )
                await authorize_and_offer(w, flow, group, f"wi-{n}", contract)
            async with asyncio.timeout(60):
                done = await runtime.submitted(3)
            # Each Group kept its own queue in the Worker's scheduler (MW-11.1-01).
            for n, group in enumerate(GROUPS):
                queue = (await runtime.scheduler.GetQueue(spb.GetQueueRequest(group_id=group))).queue
                assert queue.group_id == group and {e.work_item_id for e in queue.entries} <= {f"wi-{n}"}
        finally:
            await runtime.close()
    assert sorted(done) == sorted((group, f"wi-{n}") for n, group in enumerate(GROUPS))
    for n, group in enumerate(GROUPS):
        progress = await w.client.authority.GetMissionProgress(GetMissionProgressRequest(group_id=group))
        assert {p.work_item_id: p.state for p in progress.work_items}[
            f"wi-{n}"
        ] == wp.WORK_ITEM_STATE_SUBMITTED
        log = [e async for e in w.client.read_events(group)]
        submitted = submissions(
            [e.work_submitted for e in log if e.WhichOneof("payload") == "work_submitted"]
        )[f"wi-{n}"]
        # One Evidence per criterion of that WorkItem's own contract, each checked on the worksheet.
        assert [e.criterion_id for e in submitted.evidence] == [f"c{i}" for i in range(n + 1)]
        assert all(e.result == wp.EVIDENCE_RESULT_PASS for e in submitted.evidence)
        [ref] = submitted.artifacts
        assert ref.digest.algorithm == "blake3" and len(ref.digest.hex) == 64 and ref.digest.size_bytes > 0
        assert f"{n + 1} section(s)" in submitted.summary


@pytest.mark.req("MW-11.3-11", "MW-11.3-12")
async def test_the_example_pauses_at_a_safe_point_and_resumes_without_redoing_steps(
    world: World, tmp_path: Path, example: ModuleType
) -> None:
    w = world
    # A step lasts until the preemption request cuts it short (the example waits on it): the pause
    # comes after the first section however slow the machine; the resumed run's steps are quick.
    example.STEP_SECONDS = 120
    written: list[str] = []
    first_written = asyncio.Event()
    section = example.section

    def counted(contract: wp.WorkContract, criterion: wp.AcceptanceCriterion) -> str:
        written.append(criterion.criterion_id)
        first_written.set()
        return str(section(contract, criterion))

    example.section = counted
    flow = await missions(w)
    async with connect(w, "worker-bot", w.worker.key, tmp_path) as agent:
        runtime = await example.serve(agent, [G])
        try:
            contract = builders.contract(w.clock.now(), acceptance_criteria=criteria("a", "b", "c", "d"))
            await authorize_and_offer(w, flow, G, "wi-long", contract)
            async with asyncio.timeout(60):
                async for event in w.client.read_events(G, follow=True):
                    if event.WhichOneof("payload") == "work_started":
                        started = event.work_started
                        break
                await (
                    first_written.wait()
                )  # the handler is inside its first step (which lasts until the request)
                ask = wp.WorkRequestPreemption(
                    work_item_id="wi-long",
                    preemption_request_id="pre-1",
                    lease_id=started.lease.lease_id,
                    reason=wp.PREEMPTION_REASON_PRIORITY,
                    coordinator_epoch=1,
                    ownership_epoch=started.lease.ownership_epoch,
                )
                await flow.coord("work_request_preemption", ask)
                example.STEP_SECONDS = 0.05
                assert await runtime.submitted(1) == [(G, "wi-long")]
        finally:
            await runtime.close()
    log = [e async for e in w.client.read_events(G)]
    [paused] = [e.work_checkpointed for e in log if e.WhichOneof("payload") == "work_checkpointed"]
    assert paused.preemption_request_id == "pre-1"
    done = list(paused.checkpoint.completed_operation_ids)
    assert done == ["section:a"]  # stopped at the first safe point after the request, between steps
    starts = [e.work_started for e in log if e.WhichOneof("payload") == "work_started"]
    assert [s.resume_from_checkpoint_id for s in starts] == ["", paused.checkpoint.checkpoint_id]
    [submitted] = [e.work_submitted for e in log if e.WhichOneof("payload") == "work_submitted"]
    assert [e.criterion_id for e in submitted.evidence] == ["a", "b", "c", "d"]
    assert all(e.result == wp.EVIDENCE_RESULT_PASS for e in submitted.evidence)
    assert written == ["a", "b", "c", "d"]  # each section written once: the resumed run skipped the done ones


def test_the_example_config_names_the_example_handler() -> None:
    """examples/worker.toml stays a config `mwp worker run` accepts, naming the example's handler."""
    import argparse

    from missionweave.cli.worker import load_config, load_handler

    path = EXAMPLE.with_name("worker.toml")
    config = load_config(path, argparse.Namespace(actor=None, key=None, target=None))
    assert len(config.groups) == 3 and config.key == path.parent.resolve() / "../worker-1.key"
    handler = load_handler(config)
    assert handler.__name__ == "handle" and handler.__module__.startswith("mwp_worker_handler_")
