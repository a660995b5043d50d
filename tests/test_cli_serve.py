"""The operator's view: ``mwp serve`` as a process, the CLI, key files, graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from missionweave.clock import SystemClock
from missionweave.config import Settings
from missionweave.mesh.server import start
from tests import builders
from tests.conftest import World

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mwp(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "missionweave.cli", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"mwp {' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result


def wait_healthy(target: str, env: dict[str, str], timeout: float = 20) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if mwp("--target", target, "health", env=env, check=False).returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError("server did not become healthy")


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    port = free_port()
    env = {**os.environ, "MWP_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "missionweave.cli", "serve", "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    target = f"127.0.0.1:{port}"
    try:
        wait_healthy(target, env)
        yield proc, target, env, tmp_path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_serve_cli_walkthrough_and_graceful_sigterm(server) -> None:  # type: ignore[no-untyped-def]
    proc, target, env, tmp = server
    admin_key = tmp / "data" / "keys" / "admin.key"
    assert stat.S_IMODE(admin_key.stat().st_mode) == 0o600
    alice_key, bot_key = tmp / "alice.key", tmp / "bot.key"
    out = mwp("keygen", str(alice_key), env=env).stdout
    assert "public key" in out and stat.S_IMODE(alice_key.stat().st_mode) == 0o600
    assert mwp("keygen", str(alice_key), env=env, check=False).returncode == 1  # never overwrite a key
    mwp("keygen", str(bot_key), env=env)
    mwp("--target", target, "identity", "register", "alice", "--kind", "human", "--key-file", str(alice_key), env=env)
    mwp("--target", target, "identity", "register", "bot", "--kind", "agent", "--key-file", str(bot_key), env=env)
    created = mwp(
        "--target", target, "mission", "create", "--as", "alice", "--key", str(alice_key),
        "--title", "Demo", "--objective", "Show the CLI", "--done", "a message exists", "--coordinator", "bot",
        env=env,
    )
    group = created.stdout.strip().splitlines()[-1]
    mwp("--target", target, "message", "post", "--as", "alice", "--key", str(alice_key), "--group", group, "--text", "hi", env=env)
    lines = mwp("--target", target, "events", "--as", "alice", "--key", str(alice_key), "--group", group, env=env).stdout.splitlines()
    assert [json.loads(line)["type"] for line in lines][-1] == "message.posted"
    # An agent cannot own a root Mission: refused with exit code 1 and the reason.
    refused = mwp(
        "--target", target, "mission", "create", "--as", "bot", "--key", str(bot_key),
        "--title", "x", "--objective", "y", "--done", "z", "--coordinator", "alice", env=env, check=False,
    )
    assert refused.returncode == 1 and "INVALID_ARGUMENT" in refused.stderr
    unreachable = mwp("--target", f"127.0.0.1:{free_port()}", "state", "--as", "alice", "--key", str(alice_key), "--group", group, env=env, check=False)
    assert unreachable.returncode == 3
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    logs = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]
    assert any(entry["msg"] == "mesh listening" for entry in logs)
    assert logs[-1]["msg"] == "stopped"


def test_single_service_mode(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "MWP_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "missionweave.cli", "serve", "--service", "authority", "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.time() + 20
        while True:
            health = mwp("--target", f"127.0.0.1:{port}", "health", env=env, check=False)
            if "missionweave.v1.AuthorityService" in health.stdout and "SERVING" in health.stdout.split("AuthorityService")[1].splitlines()[0]:
                break
            assert time.time() < deadline, health.stdout
            time.sleep(0.2)
        assert health.returncode == 1  # the other four are not served by this process
        assert "missionweave.v1.GatewayService" in health.stdout and "NOT_FOUND" in health.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


async def test_shutdown_drains_in_flight_commands(world: World) -> None:
    """Every command acknowledged before or during shutdown is durable afterwards."""
    body = builders.mission_create("alice", "coord-bot", SystemClock().now())
    await world.client.execute(world.owner.sign(world.owner.command("grp_d", "mission_create", body)))
    conv = (await world.client.group_state("grp_d")).mission.planning_conversation_id
    envs = [world.owner.sign(world.owner.command("grp_d", "message_post", builders.message(conv, str(i)), membership_epoch=1)) for i in range(40)]
    calls = [asyncio.ensure_future(world.client.execute(e)) for e in envs]
    await asyncio.sleep(0.01)
    stopping = asyncio.ensure_future(world.mesh.stop(grace=5))  # type: ignore[attr-defined]
    results = await asyncio.gather(*calls, return_exceptions=True)
    await stopping
    acknowledged = {r.command_id for r in results if not isinstance(r, BaseException)}
    assert all(isinstance(r, grpc.aio.AioRpcError) for r in results if isinstance(r, BaseException))
    settings = Settings(listen="127.0.0.1:0", data_dir=world.settings.data_dir, database_url=world.settings.database_url)
    reopened = await start(settings)
    try:
        stored = {e.causing_command_id for e in [ev for ev in await _events(reopened, "grp_d")]}
        assert acknowledged <= stored
    finally:
        await reopened.stop(grace=1)


async def _events(mesh, group_id: str):  # type: ignore[no-untyped-def]
    from missionweave.codec import decode_event

    return [decode_event(s.envelope) for s in await mesh.store.read(group_id, 0, 10_000)]
