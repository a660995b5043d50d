"""`mwp serve --topology split`: every service in a process of its own, the gateway on the one
address, wired by the same MWP_*_ADDR variables as Kubernetes (issue 12, item 3)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient
from missionweave.v1 import common_pb2
from missionweave_server.config import Settings
from missionweave_server.mesh.topology import TopologyError, plan
from tests import builders
from tests.conftest import register
from tests.split_mesh import free_port, wait_serving


def test_the_plan_wires_every_process_to_its_peers() -> None:
    children = plan(Settings(listen="127.0.0.1:50099", database_url="postgresql://x/y"), 2, "mesh-t")
    by_name = {c.name: c for c in children}
    assert list(by_name) == ["authority-0", "authority-1", "membership", "artifacts", "scheduling", "gateway"]
    assert by_name["gateway"].address == "127.0.0.1:50099"
    shards = by_name["gateway"].env["MWP_AUTHORITY_ADDR"].split(",")
    assert shards == [by_name["authority-0"].address, by_name["authority-1"].address]
    for child in children:
        assert child.env["MWP_MESH_ID"] == "mesh-t" and child.env["MWP_LISTEN"] == child.address
        assert child.env["MWP_MEMBERSHIP_ADDR"] == by_name["membership"].address
    assert by_name["authority-1"].env["MWP_INSTANCE_ID"] == "authority-1"
    assert by_name["authority-1"].env["MWP_ADVERTISE_ADDR"] == by_name["authority-1"].address
    with pytest.raises(TopologyError, match="PostgreSQL"):
        plan(Settings(listen="127.0.0.1:50099"), 2, "mesh-t")  # shards never share a SQLite file


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


async def test_split_topology_serves_one_address_and_stops_whole(tmp_path: Path) -> None:
    port = free_port()
    # No console: the default address (127.0.0.1:50080) is one per machine (conftest.py).
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MWP_")},
        "MWP_CONSOLE_LISTEN": "",
        "MWP_METRICS_LISTEN": "",
        "MWP_VERIFY_WORKERS": "0",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        "serve",
        "--topology",
        "split",
        "--listen",
        f"127.0.0.1:{port}",
        "--data-dir",
        str(tmp_path / "data"),
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
    )
    try:
        children = list((await wait_serving(process)).values())
        assert len(children) == 5  # one Authority shard, membership, artifacts, scheduling, gateway
        client = MeshClient(f"127.0.0.1:{port}")
        admin_key = read_key(tmp_path / "data" / "keys" / "admin.key")
        owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
        await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
        from missionweave.kernel.clock import SystemClock

        body = builders.mission_create("alice", "coord-bot", SystemClock().now())
        await client.execute(owner.sign(owner.command("grp_split", "mission_create", body)))
        assert (await client.group_state("grp_split")).head_sequence >= 1
        await client.channel.close()
        # A second mesh on the same data dir is refused while this one runs.
        second = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "missionweave.cli",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                str(tmp_path / "data"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        assert second.returncode == 1 and "is in use by process" in second.stderr
        # A process that dies is started again (as Kubernetes restarts a pod) and the mesh serves on.
        assert process.stderr is not None
        os.kill(children[0], signal.SIGKILL)
        async with asyncio.timeout(60):
            while "starting authority-0" not in (line := (await process.stderr.readline()).decode()):
                assert line, "the launcher ended instead of restarting the process"
        async with asyncio.timeout(60):
            while True:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    again = MeshClient(f"127.0.0.1:{port}", reader=owner)
                    try:
                        if (await again.group_state("grp_split")).head_sequence >= 1:
                            break
                    finally:
                        await again.channel.close()
                await asyncio.sleep(0.2)
        # SIGTERM stops every process of the mesh and exits 0.
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            while await process.stderr.read(65536):  # drain, so the launcher never blocks on its pipe
                pass
            assert await process.wait() == 0
        survivors = [pid for pid in children[1:] if alive(pid)]
        assert survivors == []
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 60)
