"""`mwp demo` (issue 4): the scenario against an in-process mesh, and the command as a process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from missionweave.cli.demo.plan import TASKS
from missionweave.cli.demo.result import DemoResult
from missionweave.cli.demo.scenario import run_demo
from missionweave.cli.demo.timeline import TimelineEntry
from missionweave.kernel.clock import SystemClock
from missionweave.kernel.signing import generate_key, read_key, write_key
from missionweave.sdk.client import MeshClient
from missionweave.v1 import artifact_service_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.config import Settings
from missionweave_server.mesh.server import start

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^ +\+\d+\.\d\ds  \S+ +[a-z_.]+ +\S")


@pytest.fixture(params=["single", "split"])
async def mesh(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, Path]]:
    """A running mesh on a free port and its Organization admin key file: all services in one
    process on SQLite, or the split topology (every service its own mesh over gRPC) on PostgreSQL."""
    from tests.conftest import POSTGRES_URL, reset_database
    from tests.split_mesh import start_split

    split = request.param == "split"
    if split and not POSTGRES_URL:
        pytest.skip("the split topology runs on PostgreSQL (MWP_TEST_POSTGRES_URL, set by .ci/run)")
    if split:
        await reset_database(POSTGRES_URL)
    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=POSTGRES_URL if split else f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
        grace_seconds=1,
    )
    running: Any = await (start_split(settings, SystemClock()) if split else start(settings))
    try:
        yield f"127.0.0.1:{running.port}", settings.admin_key_path
    finally:
        await running.stop(grace=1)


def after(entries: list[TimelineEntry], entry: TimelineEntry) -> list[TimelineEntry]:
    return entries[entries.index(entry) + 1 :]


def first(entries: list[TimelineEntry], event_type: str, work_item_id: str) -> TimelineEntry:
    return next(e for e in entries if e.event_type == event_type and e.work_item_id == work_item_id)


def assert_preempted_and_resumed(entries: list[TimelineEntry]) -> None:
    request = next(e for e in entries if e.event_type == "work.preemption_requested")
    wid = request.work_item_id
    checkpoint = first(after(entries, request), "work.checkpointed", wid)
    assert f"answers pre-{wid}" in checkpoint.detail  # the safe point cites the request
    resumed = first(after(entries, checkpoint), "work.started", wid)
    assert (
        "resumes from checkpoint" in resumed.detail
        and resumed.ownership_epoch == checkpoint.ownership_epoch > 0
    )  # same owner


def assert_failed_and_retried(entries: list[TimelineEntry]) -> None:
    """Whichever way the server retries: re-offered under a higher ownership epoch (`failed`), or
    re-queued by the Authority itself (a lease revoked for the failure); either way a new attempt."""
    failure = next(
        e
        for e in entries
        if e.event_type == "work.failed" or (e.event_type == "work.lease_revoked" and "(failed)" in e.detail)
    )
    wid = failure.work_item_id
    failed_attempt = [
        e
        for e in entries[: entries.index(failure)]
        if e.event_type == "work.started" and e.work_item_id == wid
    ][-1]
    retry = first(after(entries, failure), "work.started", wid)
    assert retry.attempt == failed_attempt.attempt + 1
    if failure.event_type == "work.failed":
        assert "transient" in failure.detail
        assert retry.ownership_epoch > failure.ownership_epoch  # the failed ownership is fenced
    first(after(entries, retry), "work.result_accepted", wid)


def assert_offered_only_after_dependencies(entries: list[TimelineEntry]) -> None:
    for offer in (e for e in entries if e.event_type == "work.offered"):
        verified = {
            e.work_item_id for e in entries[: entries.index(offer)] if e.event_type == "work.result_accepted"
        }
        assert set(TASKS[offer.work_item_id].depends_on) <= verified, offer


def assert_readable(result: DemoResult) -> None:
    text = "\n".join(result.lines())
    timeline = result.timeline.lines()
    assert len(timeline) == len(result.timeline.entries) and all(LINE.match(line) for line in timeline), (
        timeline
    )
    assert f"Mission {result.mission_id}: APPROVED" in text
    assert f"mwp mission progress --group {result.group_id} --format dot" in text
    document = json.loads(json.dumps(result.document()))
    assert document["progress"]["mission_state"] == "MISSION_STATE_APPROVED"  # proto3 JSON: the enum by name
    assert [e["event_type"] for e in document["timeline"]] == [e.event_type for e in result.timeline.entries]


@pytest.mark.req("MW-10.3-07")
async def test_the_demo_runs_a_complete_mission_and_can_run_again(mesh: tuple[str, Path]) -> None:
    address, admin_key = mesh
    async with MeshClient(address) as client:
        result = await run_demo(client, read_key(admin_key), target=address)
        log = [e async for e in client.read_events(result.group_id)]  # read as the MissionOwner
        again = await run_demo(client, read_key(admin_key), target=address)
    progress = result.progress
    assert progress.mission_state == mission_pb2.MISSION_STATE_APPROVED and progress.approval_event_id
    assert [item.work_item_id for item in progress.work_items] == list(TASKS)
    assert all(item.state == wp.WORK_ITEM_STATE_VERIFIED for item in progress.work_items)
    assert (progress.required_verified, progress.required_total) == (5, 5)
    assert 0 < progress.used.tokens <= progress.budget.tokens and progress.used.tool_calls > 0
    entries = result.timeline.entries
    assert_preempted_and_resumed(entries)
    assert_failed_and_retried(entries)
    assert_offered_only_after_dependencies(entries)
    assert_readable(result)
    # The Workers are Worker runtimes: each answered its offers after admission control by its own
    # scheduler, so every acceptance carries the schedule that scheduler disclosed (MW-10.3-07).
    accepted = [e.work_offer_accepted for e in log if e.WhichOneof("payload") == "work_offer_accepted"]
    assert {a.work_item_id for a in accepted} == set(TASKS)
    assert all(a.HasField("schedule") and a.schedule.HasField("estimated_completion") for a in accepted)
    sessions = [e for e in entries if e.event_type == "session.opened"]
    assert {e.actor for e in sessions} == {result.identities["worker_a"], result.identities["worker_b"]}
    # D161: what was approved exists; fetched by its content hash it verifies, and its provenance
    # walks back through the DAG to the WorkItems that had no inputs.
    submitted = next(e.mission_submitted for e in log if e.WhichOneof("payload") == "mission_submitted")
    (approved,) = submitted.artifacts
    async with MeshClient(address) as reader:
        reader.read_as(await reader.open_session("admin", read_key(admin_key)))
        assert (await reader.download(approved.digest)).startswith(b"q3-report.md")
        graph = await reader.artifacts.QueryProvenance(
            artifact_service_pb2.QueryProvenanceRequest(
                digest=approved.digest,
                direction=artifact_service_pb2.PROVENANCE_DIRECTION_ANCESTORS,
                max_depth=8,
            )
        )
        firsts = [
            ref.digest.hex
            for wid in ("extract-eu", "extract-us", "reconcile")
            for ref in (await reader.work_item(result.group_id, wid)).artifacts
        ]
    ancestors = {n.digest.hex for n in graph.nodes if n.is_ancestor}
    assert len(firsts) == 3 and set(firsts) <= ancestors
    # Fresh identities and a fresh Group each run.
    assert again.group_id != result.group_id
    assert set(again.identities.values()).isdisjoint(result.identities.values())
    assert again.progress.mission_state == mission_pb2.MISSION_STATE_APPROVED


async def mwp(*args: str) -> tuple[int, str, str]:
    """``python -m missionweave.cli ARGS`` without blocking the event loop the mesh serves on."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        *args,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_mwp_demo_as_a_process(mesh: tuple[str, Path]) -> None:
    address, admin_key = mesh
    text, as_json = await asyncio.gather(
        mwp("demo", "--target", address, "--admin-key", str(admin_key)),
        mwp(
            "--target", address, "demo", "--admin-key", str(admin_key), "--json"
        ),  # the global --target works too
    )
    code, out, err = text
    assert code == 0, err
    assert "APPROVED" in out and "work.preemption_requested" in out
    assert f"mwp --target {address} mission progress --group grp_" in out
    code, out, err = as_json
    assert code == 0, err
    document = json.loads(out)
    assert document["completed"] and document["progress"]["required_verified"] == 5


async def test_mwp_demo_refused_exits_1_and_unreachable_exits_3(
    mesh: tuple[str, Path], tmp_path: Path
) -> None:
    address, _ = mesh
    wrong = tmp_path / "not-the-admin.key"
    write_key(wrong, generate_key())
    refused, unreachable = await asyncio.gather(
        mwp("demo", "--target", address, "--admin-key", str(wrong)),
        mwp("demo", "--target", f"127.0.0.1:{free_port()}", "--admin-key", str(wrong)),
    )
    code, out, err = refused
    assert code == 1 and "mwp: refused: " in err
    assert "stopped at identity registration" in out
    code, out, err = unreachable
    assert code == 3 and "cannot reach" in err
