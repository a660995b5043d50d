"""No transaction spans two Groups (MW-10.4-05): the parent's half of a child Mission's creation and of
its approval is appended after the child's, from a durable outbox written with the child's events.
Here the process dies between the two appends (SIGKILL), and the link is completed once an
Authority runs again; on three PostgreSQL shards the child's Group sits on another shard than the
parent's and the shard that wrote the child's events is the one killed. A delivery repeated after
a crash between the parent's append and the outbox row's removal appends nothing twice."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nacl.signing import SigningKey
from sqlalchemy import insert, select, text

from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.v1 import authority_service_pb2, common_pb2, mission_pb2, subtask_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.edge.shards import rendezvous
from missionweave_server.services.authority.schema import cross_group_outbox
from missionweave_server.storage.db import make_engine
from tests import builders
from tests.conftest import World, mesh_process_env, polled, register
from tests.split_mesh import free_port, wait_serving
from tests.test_work_items import setup

R = common_pb2.RejectionReason
WS = wp.WorkItemState
ROOT = Path(__file__).resolve().parent.parent
PARENT = "grp_crash_parent"
WAIT_S = 60.0


def base_env() -> dict[str, str]:
    return {
        **mesh_process_env(),
        "MWP_VERIFY_WORKERS": "0",
        "PYTHONPATH": str(ROOT),
    }


@asynccontextmanager
async def single(data_dir: Path, port: int, **env: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """``mwp serve`` (one process, SQLite) until the block ends; the block may kill it first."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--data-dir",
        str(data_dir),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        stdin=asyncio.subprocess.DEVNULL,
        env={**base_env(), **env},
        cwd=ROOT,
    )
    try:
        await serving(f"127.0.0.1:{port}")
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def serving(target: str) -> None:
    from missionweave.kernel.transport import open_channel

    channel = open_channel(target, None)
    try:
        async with asyncio.timeout(WAIT_S):
            for _ in range(10**6):
                try:
                    answer = await health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(), timeout=1
                    )
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except Exception:  # not listening yet
                    pass
                await asyncio.sleep(0.1)
    finally:
        await channel.close()


class Tree:
    """The parent Mission, its WorkItem and a child Mission, driven through one client."""

    def __init__(
        self,
        client: MeshClient,
        owner: SessionSigner,
        coordinator: SessionSigner,
        child_coordinator: SessionSigner,
    ) -> None:
        self.client, self.owner, self.coordinator, self.child_coordinator = (
            client,
            owner,
            coordinator,
            child_coordinator,
        )

    async def run(self, signer: SessionSigner, group: str, kind: str, body: Any, epoch: int = 0) -> None:
        await self.client.execute(signer.sign(signer.command(group, kind, body, membership_epoch=epoch)))

    async def plan(self) -> None:
        now = SystemClock().now()
        create = builders.mission_create("alice", "coord-bot", now)
        create.coordinator_renewal.lease_duration.FromSeconds(3600)
        await self.run(self.owner, PARENT, "mission_create", create)
        authorize = wp.WorkAuthorize(
            work_item_id="wi-1", title="ledger", contract=builders.contract(now), coordinator_epoch=1
        )
        await self.run(self.coordinator, PARENT, "work_authorize", authorize, epoch=2)

    async def create_child(self, group: str) -> None:
        now = SystemClock().now()
        definition = builders.definition(
            "coord-bot",
            now,
            deadline=to_timestamp(now + timedelta(hours=12)),
            budget=common_pb2.ResourceVector(
                currency="EUR", financial_micros=100_000, tokens=1_000, tool_calls=5
            ),
            risk_policy=mission_pb2.RiskPolicy(
                risk_class=mission_pb2.RISK_CLASS_LOW, execution_approver_ids=["alice"]
            ),
        )
        body = subtask_pb2.MissionCreateChild(
            parent_group_id=PARENT,
            parent_work_item_id="wi-1",
            definition=definition,
            coordinator_id="child-bot",
            parent_coordinator_epoch=1,
        )
        await self.run(self.coordinator, group, "mission_create_child", body)

    async def approve_child(self, group: str) -> None:
        revision = (await self.client.group_state(group)).mission.revision
        submit = mission_pb2.MissionSubmitForApproval(
            coordinator_epoch=1, mission_revision=revision, summary="done"
        )
        await self.run(self.child_coordinator, group, "mission_submit_for_approval", submit, epoch=2)
        submitted = (await self.client.group_state(group)).mission.latest_submission_event_id
        await self.run(
            self.coordinator,
            group,
            "mission_approve",
            mission_pb2.MissionApprove(submission_event_id=submitted),
            epoch=1,
        )

    async def item(self) -> authority_service_pb2.WorkItemProgress:
        progress = await self.client.authority.GetMissionProgress(
            authority_service_pb2.GetMissionProgressRequest(group_id=PARENT)
        )
        return progress.work_items[0]

    async def until(self, state: int) -> None:
        async def reached() -> bool:
            return (await self.item()).state == state

        await polled(reached, WAIT_S, 0.1)

    async def parent_events(self, event_type: str) -> int:
        return len([e async for e in self.client.read_events(PARENT) if e.type == event_type])


async def people(client: MeshClient, admin_key: SigningKey) -> Tree:
    owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
    coordinator = await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
    child_coordinator = await register(client, admin_key, "child-bot", common_pb2.IDENTITY_KIND_AGENT)
    return Tree(client, owner, coordinator, child_coordinator)


async def restarted_pids(launcher: asyncio.subprocess.Process, pids: dict[str, int]) -> None:
    """Keeps ``pids`` current: the launcher starts a killed process again and says so on stderr."""
    assert launcher.stderr is not None
    while line := (await launcher.stderr.readline()).decode():
        for name, pid in re.findall(r"starting (\S+) +pid (\d+)", line):
            pids[name] = int(pid)


async def outbox_rows(db_url: str) -> list[tuple[str, int, str]]:
    engine = make_engine(db_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(
                    cross_group_outbox.c.source_group_id,
                    cross_group_outbox.c.source_seq,
                    cross_group_outbox.c.target_group_id,
                )
            )
            return [(r[0], int(r[1]), r[2]) for r in rows]
    finally:
        await engine.dispose()


@pytest.mark.req("MW-10.4-05", "MW-10.2-T15", "MW-10.2-T16")
@pytest.mark.timeout(170)
async def test_single_process_killed_between_the_two_groups_appends(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    target, db_url = f"127.0.0.1:{port}", f"sqlite+aiosqlite:///{(data / 'missionweave.db').resolve()}"
    child = "grp_crash_child"
    # This process delivers no links: it dies with the child's half appended and the parent's not.
    async with single(data, port, MWP_LINK_RELAY_POLL_MS="0") as process:
        client = MeshClient(target)
        tree = await people(client, read_key(data / "keys" / "admin.key"))
        await tree.plan()
        await tree.create_child(child)
        assert (await tree.item()).state == WS.WORK_ITEM_STATE_OPEN
        process.send_signal(signal.SIGKILL)
        await process.wait()
        await client.channel.close()
    assert [(s, t) for s, _, t in await outbox_rows(db_url)] == [(child, PARENT)]
    async with single(data, port, MWP_LINK_RELAY_POLL_MS="0") as process:  # approval, then the kill again
        client = MeshClient(target)
        tree.client = client
        await client.open_session("alice", tree.owner.key)
        assert (await tree.item()).state == WS.WORK_ITEM_STATE_OPEN  # nobody delivered the link yet
        await tree.approve_child(child)
        process.send_signal(signal.SIGKILL)
        await process.wait()
        await client.channel.close()
    assert len(await outbox_rows(db_url)) == 2
    async with single(data, port):  # an Authority that delivers completes both links, in order
        client = MeshClient(target)
        tree.client = client
        await client.open_session("alice", tree.owner.key)
        await tree.until(WS.WORK_ITEM_STATE_VERIFIED)
        assert await tree.parent_events("work.subtask.linked") == 1
        assert await tree.parent_events("work.subtask.ended") == 1
        await client.channel.close()
    assert await outbox_rows(db_url) == []


@pytest.mark.req("MW-10.4-05")
@pytest.mark.timeout(170)
async def test_shards_the_childs_shard_killed_after_each_of_its_appends(db_url: str, tmp_path: Path) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("shards share PostgreSQL (D60)")
    port = free_port()
    # The parent's shard reads the outbox every 2 s; the child's shard is killed well before.
    env = {**base_env(), "MWP_OWNERSHIP_LEASE_S": "3", "MWP_LINK_RELAY_POLL_MS": "2000"}
    launcher = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        "serve",
        "--topology",
        "split",
        "--shards",
        "3",
        "--listen",
        f"127.0.0.1:{port}",
        "--data-dir",
        str(tmp_path / "data"),
        "--database-url",
        db_url,
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
    )
    assert launcher.stderr is not None
    try:
        addresses: dict[str, str] = {}
        pids = await wait_serving(launcher, addresses=addresses)
        follow = asyncio.create_task(restarted_pids(launcher, pids))
        shards = sorted(name for name in addresses if name.startswith("authority"))
        by_address = {addresses[name]: name for name in shards}
        place = {
            g: by_address[rendezvous(g, [addresses[n] for n in shards])[0]]
            for g in (PARENT, *(f"grp_child_{i}" for i in range(40)))
        }
        first = next(g for g in place if g != PARENT and place[g] != place[PARENT])
        client = MeshClient(f"127.0.0.1:{port}")
        tree = await people(client, read_key(tmp_path / "data" / "keys" / "admin.key"))
        await tree.plan()
        # The child's Group on another shard: that shard appends the child's events and the outbox
        # row, then dies before the parent's shard (the target's owner) has read the outbox.
        await tree.create_child(first)
        os.kill(pids[place[first]], signal.SIGKILL)
        await tree.until(WS.WORK_ITEM_STATE_BLOCKED)
        assert await tree.parent_events("work.subtask.linked") == 1
        # The child's Group moves to a live shard once its lease lapses; its approval is appended
        # there and that shard is killed in turn.
        async with asyncio.timeout(WAIT_S):
            for _ in range(10**6):
                try:
                    await tree.approve_child(first)
                    break
                except Exception:  # the child's Group is between owners for up to one lease
                    await asyncio.sleep(0.5)
        engine = make_engine(db_url)
        async with engine.connect() as conn:
            owner = (
                await conn.execute(
                    text("SELECT owner_instance FROM groups WHERE group_id = :g"), {"g": first}
                )
            ).scalar_one()
        await engine.dispose()
        # Whichever shard appended the approval dies now (the launcher starts it again, as Kubernetes
        # would); the parent's half is appended by the parent's owner from the outbox.
        os.kill(pids[owner], signal.SIGKILL)
        await tree.until(WS.WORK_ITEM_STATE_VERIFIED)
        assert await tree.parent_events("work.subtask.ended") == 1
        await client.channel.close()
        follow.cancel()
    finally:
        if launcher.returncode is None:
            launcher.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await launcher.wait()
            except TimeoutError:
                launcher.kill()
                await launcher.wait()


@pytest.mark.req("MW-10.4-05")
async def test_a_delivery_repeated_after_a_crash_before_the_row_was_dropped_appends_nothing(
    world: World,
) -> None:
    w = world
    flow = await setup(w)
    await flow.authorize("wi-1")
    await register(w.client, w.keys["admin"], "child-bot", common_pb2.IDENTITY_KIND_AGENT)
    body_group = "grp_redelivered"
    definition = builders.definition(
        "coord-bot",
        w.clock.now(),
        deadline=to_timestamp(w.clock.now() + timedelta(hours=12)),
        budget=common_pb2.ResourceVector(currency="EUR", tokens=1_000),
        risk_policy=mission_pb2.RiskPolicy(
            risk_class=mission_pb2.RISK_CLASS_LOW, execution_approver_ids=["alice"]
        ),
    )
    body = subtask_pb2.MissionCreateChild(
        parent_group_id="grp_lifecycle",
        parent_work_item_id="wi-1",
        definition=definition,
        coordinator_id="child-bot",
        parent_coordinator_epoch=1,
    )
    await w.run(w.coordinator, body_group, "mission_create_child", body)
    links = w.mesh.links  # type: ignore[attr-defined]

    async def linked() -> bool:
        return any(
            [e async for e in w.client.read_events("grp_lifecycle") if e.type == "work.subtask.linked"]
        )

    await polled(linked)
    source_seq = next(
        e.sequence
        for e in [e async for e in w.client.read_events(body_group)]
        if e.type == "mission.parent.linked"
    )
    head = (await w.client.group_state("grp_lifecycle")).head_sequence
    async with w.mesh.engine.begin() as conn:  # type: ignore[attr-defined]
        await conn.execute(
            insert(cross_group_outbox).values(
                source_group_id=body_group,
                source_seq=source_seq,
                target_group_id="grp_lifecycle",
                created_us=0,
            )
        )
    assert await links.drain() == 1
    assert (await w.client.group_state("grp_lifecycle")).head_sequence == head  # nothing appended twice
    assert await outbox_rows(w.settings.db_url) == []
