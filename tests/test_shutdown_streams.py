"""Shutdown ends followers at once: every open stream ends UNAVAILABLE with the ErrorInfo reason
SHUTTING_DOWN (missionweave_server/edge/going_away.py), instead of holding the grace period, and a
follower reconnects to the restarted mesh without losing or repeating an event."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from missionweave.cli.common import save_session
from missionweave.kernel.clock import SystemClock
from missionweave.kernel.rejections import is_shutting_down
from missionweave.kernel.signing import generate_key, read_key, write_key
from missionweave.sdk.client import MeshClient
from missionweave.v1 import common_pb2
from missionweave.v1.scheduling_service_pb2 import NextSlotRequest
from missionweave.v1.scheduling_service_pb2_grpc import SchedulingServiceStub
from tests import builders
from tests.conftest import World
from tests.test_cli_serve import ROOT, free_port, wait_healthy

# The grace period of the stops below, and a bound well inside it: a stop held by its streams
# takes the whole grace; ended at once it takes about a second (measured in the report).
LONG_GRACE_S, WELL_WITHIN_S = 30.0, 20.0


@pytest.mark.topologies("single", "split")
async def test_a_stop_ends_a_follow_with_shutting_down_well_within_the_grace(world: World) -> None:
    body = builders.mission_create("alice", "coord-bot", world.clock.now())
    await world.run(world.owner, "grp_stop", "mission_create", body)
    follower = MeshClient(world.target, reader=world.owner)
    following_now = asyncio.Event()

    async def follow() -> grpc.aio.AioRpcError:
        try:
            async for _ in follower.read_events("grp_stop", follow=True):
                following_now.set()
        except grpc.aio.AioRpcError as err:
            return err
        raise AssertionError("a follow ended without a status")

    following = asyncio.create_task(follow())
    await asyncio.wait_for(following_now.wait(), 20)
    # A Worker's long poll for its next slot, waiting as long as the scheduler lets it.
    worker = MeshClient(world.target, reader=world.worker)
    stub = SchedulingServiceStub(worker.channel)

    async def poll() -> object:
        return await stub.NextSlot(NextSlotRequest(wait=Duration(seconds=30)), timeout=LONG_GRACE_S * 2)

    polling = asyncio.create_task(poll())
    await asyncio.sleep(1)  # the poll is waiting at the scheduler
    assert not polling.done()
    started = time.monotonic()
    await world.mesh.stop(grace=LONG_GRACE_S)  # type: ignore[attr-defined]
    took = time.monotonic() - started
    err = await asyncio.wait_for(following, 5)
    await follower.channel.close()
    assert err.code() == grpc.StatusCode.UNAVAILABLE and is_shutting_down(err), err
    with pytest.raises(grpc.aio.AioRpcError) as poll:
        await asyncio.wait_for(polling, 5)
    await worker.channel.close()
    assert poll.value.code() == grpc.StatusCode.UNAVAILABLE and is_shutting_down(poll.value), poll.value
    assert took < WELL_WITHIN_S, f"the stop took {took:.1f} s: the follow held it"


def _mesh(tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MWP_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    env.update(MWP_METRICS_LISTEN="", MWP_CONSOLE_LISTEN="")
    proc = subprocess.Popen(
        [sys.executable, "-m", "missionweave.cli", "serve", "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_healthy(f"127.0.0.1:{port}", env)
    return proc


async def test_sigterm_sends_an_events_follower_to_the_restarted_mesh_nothing_lost_or_twice(
    tmp_path: Path,
) -> None:
    port = free_port()
    target = f"127.0.0.1:{port}"
    serve = await asyncio.to_thread(_mesh, tmp_path, port)
    follower: asyncio.subprocess.Process | None = None
    try:
        client = MeshClient(target)
        admin_key = read_key(tmp_path / "data" / "keys" / "admin.key")
        alice_key, key_path = generate_key(), tmp_path / "alice.key"
        write_key(key_path, alice_key)
        await client.register_identity(
            "admin", admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN, bytes(alice_key.verify_key)
        )
        alice = await client.open_session("alice", alice_key)
        save_session(key_path, alice)
        await client.register_identity(
            "admin", admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT, bytes(generate_key().verify_key)
        )
        create = builders.mission_create("alice", "coord-bot", SystemClock().now())
        await client.execute(alice.sign(alice.command("grp_restart", "mission_create", create)))
        conversation = (await client.group_state("grp_restart")).mission.planning_conversation_id
        await client.channel.close()
        follower = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "missionweave.cli", "--target", target, "events"),
            *("--group", "grp_restart", "--follow", "--as", "alice", "--key", str(key_path)),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert follower.stdout is not None and follower.stderr is not None
        lines: list[dict[str, object]] = []
        async with asyncio.timeout(30):
            lines.append(json.loads(await follower.stdout.readline()))
        serve.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(serve.wait, 60) == 0
        async with asyncio.timeout(30):  # the follower says why it lost the server, and waits
            assert b"shutting down" in await follower.stderr.readline()
        serve = await asyncio.to_thread(_mesh, tmp_path, port)
        client = MeshClient(target)
        post = builders.message(conversation, "after the restart")
        await client.execute(
            alice.sign(alice.command("grp_restart", "message_post", post, membership_epoch=1))
        )
        await client.channel.close()
        async with asyncio.timeout(60):
            while not any(line["type"] == "message.posted" for line in lines):
                lines.append(json.loads(await follower.stdout.readline()))
    finally:
        if follower is not None and follower.returncode is None:
            follower.send_signal(signal.SIGINT)
            await follower.wait()
        serve.send_signal(signal.SIGTERM)
        await asyncio.to_thread(serve.wait, 60)
    sequences = [int(line["seq"]) for line in lines]  # type: ignore[call-overload]
    assert sequences == list(range(1, len(sequences) + 1))  # in order, none twice, none skipped
