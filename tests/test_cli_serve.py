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

from missionweave.kernel.clock import SystemClock
from missionweave.v1 import common_pb2
from missionweave_server.config import Settings
from missionweave_server.mesh.server import start
from missionweave_server.verification.pipe_frames import child_command
from tests import builders
from tests.conftest import World

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mwp(
    *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "missionweave.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
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
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
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
    mwp(
        "--target",
        target,
        "identity",
        "register",
        "alice",
        "--kind",
        "human",
        "--key-file",
        str(alice_key),
        env=env,
    )
    mwp(
        "--target",
        target,
        "identity",
        "register",
        "bot",
        "--kind",
        "agent",
        "--key-file",
        str(bot_key),
        env=env,
    )
    created = mwp(
        "--target",
        target,
        "mission",
        "create",
        "--as",
        "alice",
        "--key",
        str(alice_key),
        "--title",
        "Demo",
        "--objective",
        "Show the CLI",
        "--done",
        "a message exists",
        "--coordinator",
        "bot",
        env=env,
    )
    group = created.stdout.strip().splitlines()[-1]
    mwp(
        "--target",
        target,
        "message",
        "post",
        "--as",
        "alice",
        "--key",
        str(alice_key),
        "--group",
        group,
        "--text",
        "hi",
        env=env,
    )
    lines = mwp(
        "--target", target, "events", "--as", "alice", "--key", str(alice_key), "--group", group, env=env
    ).stdout.splitlines()
    assert [json.loads(line)["type"] for line in lines][-1] == "message.posted"
    # An agent cannot own a root Mission: refused with exit code 1 and the reason.
    refused = mwp(
        "--target",
        target,
        "mission",
        "create",
        "--as",
        "bot",
        "--key",
        str(bot_key),
        "--title",
        "x",
        "--objective",
        "y",
        "--done",
        "z",
        "--coordinator",
        "alice",
        env=env,
        check=False,
    )
    assert refused.returncode == 1 and "INVALID_ARGUMENT" in refused.stderr
    unreachable = mwp(
        "--target",
        f"127.0.0.1:{free_port()}",
        "state",
        "--as",
        "alice",
        "--key",
        str(alice_key),
        "--group",
        group,
        env=env,
        check=False,
    )
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
        [
            sys.executable,
            "-m",
            "missionweave.cli",
            "serve",
            "--service",
            "authority",
            "--listen",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 20
        while True:
            health = mwp("--target", f"127.0.0.1:{port}", "health", env=env, check=False)
            if (
                "missionweave.v1.AuthorityService" in health.stdout
                and "SERVING" in health.stdout.split("AuthorityService")[1].splitlines()[0]
            ):
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
    envs = [
        world.owner.sign(
            world.owner.command("grp_d", "message_post", builders.message(conv, str(i)), membership_epoch=1)
        )
        for i in range(40)
    ]
    calls = [asyncio.ensure_future(world.client.execute(e)) for e in envs]
    await asyncio.sleep(0.01)
    stopping = asyncio.ensure_future(world.mesh.stop(grace=5))  # type: ignore[attr-defined]
    results = await asyncio.gather(*calls, return_exceptions=True)
    await stopping
    acknowledged = {r.command_id for r in results if not isinstance(r, BaseException)}
    assert all(isinstance(r, grpc.aio.AioRpcError) for r in results if isinstance(r, BaseException))
    settings = Settings(
        listen="127.0.0.1:0", data_dir=world.settings.data_dir, database_url=world.settings.database_url
    )
    reopened = await start(settings)
    try:
        stored = {e.causing_command_id for e in [ev for ev in await _events(reopened, "grp_d")]}
        assert acknowledged <= stored
    finally:
        await reopened.stop(grace=1)


async def _events(mesh, group_id: str):  # type: ignore[no-untyped-def]
    from missionweave.kernel.codec import decode_event

    return [decode_event(s.envelope) for s in await mesh.store.read(group_id, 0, 10_000)]


def test_serve_fails_at_once_with_one_clear_line(tmp_path: Path) -> None:
    """A port in use, an unreadable key, a database it cannot open: exit 1 within seconds, saying which
    (gRPC only logs a failed bind; the process used to carry on without a listener)."""
    import socket

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = mwp(
            "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "a"), env=env, check=False
        )
    assert busy.returncode == 1 and f"mwp serve: port 127.0.0.1:{port} (gRPC) is in use" in busy.stderr
    keys = tmp_path / "b" / "keys"
    keys.mkdir(parents=True)
    (keys / "authority.key").write_text("not a key")
    (keys / "authority.key").chmod(0o600)
    bad_key = mwp("serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "b"), env=env, check=False)
    assert bad_key.returncode == 1 and bad_key.stderr.strip().splitlines()[-1].startswith("mwp serve: ")
    assert "authority.key" in bad_key.stderr.strip().splitlines()[-1]
    no_db = mwp(
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        str(tmp_path / "c"),
        "--database-url",
        "postgresql://nobody:secret@127.0.0.1:1/none",
        env=env,
        check=False,
    )
    last = no_db.stderr.strip().splitlines()[-1]
    assert no_db.returncode == 1 and last.startswith(
        "mwp serve: cannot open the database postgresql://nobody:***@127.0.0.1:1/none"
    )
    assert "secret" not in no_db.stderr


def test_exit_codes_for_an_unreachable_or_silent_server_and_for_bad_key_files(tmp_path: Path) -> None:
    """README: 3 for unreachable (health too), 3 after --timeout for a server that never answers,
    and one line naming a key file that is missing or not a key (no raw Python error)."""
    import socket

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        down = mwp("--target", f"127.0.0.1:{port}", "health", env=env, check=False)
    assert down.returncode == 3 and down.stderr.startswith(f"mwp: cannot reach 127.0.0.1:{port}")
    key = tmp_path / "k.key"
    mwp("keygen", str(key), env=env)
    with socket.socket() as silent:  # accepts connections, never speaks HTTP/2
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        target = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        hung = mwp(
            "--target",
            target,
            "--timeout",
            "1.5",
            "mission",
            "show",
            "--group",
            "g",
            "--as",
            "x",
            "--key",
            str(key),
            env=env,
            check=False,
        )
        assert time.monotonic() - started < 10
    assert hung.returncode == 3 and "no answer from" in hung.stderr and "(--timeout)" in hung.stderr
    nope = tmp_path / "nope.key"
    missing = mwp("mission", "show", "--group", "g", "--as", "x", "--key", str(nope), env=env, check=False)
    assert (
        missing.returncode == 1
        and missing.stderr.strip()
        == f"mwp: key file {nope} does not exist (make one with `mwp keygen {nope}`)"
    )
    garbage = tmp_path / "garbage.key"
    garbage.write_text("not hex")
    garbage.chmod(0o600)
    bad = mwp("mission", "show", "--group", "g", "--as", "x", "--key", str(garbage), env=env, check=False)
    assert bad.returncode == 1 and "is not an Ed25519 key" in bad.stderr and "fromhex" not in bad.stderr


def test_output_piped_into_a_reader_that_stops_early_ends_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`mwp ... | head`: the write into the closed pipe ends the command quietly, exit 0, no
    `[Errno 32] Broken pipe` on stderr."""
    from missionweave.cli import app

    async def reader_gone(args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(app, "cmd_health", reader_gone)
    monkeypatch.setattr(app.os, "dup2", lambda fd, fd2: None)  # keep pytest's stdout
    assert app.main(["health"]) == 0
    assert "Broken pipe" not in capsys.readouterr().err


async def test_events_follow_prints_payloads_and_resumes_after_a_server_restart(tmp_path: Path) -> None:
    """`mwp events --follow --payloads` outlives a restart of the server: it reconnects and goes on
    after the last event it printed, nothing twice, nothing skipped."""
    from missionweave.cli.common import save_session
    from missionweave.kernel.signing import generate_key, read_key, write_key
    from missionweave.sdk.client import MeshClient

    port = free_port()
    settings = Settings(listen=f"127.0.0.1:{port}", data_dir=tmp_path / "data", grace_seconds=1)
    mesh = await start(settings)
    client = MeshClient(f"127.0.0.1:{port}")
    admin_key = read_key(settings.admin_key_path)
    key_path = tmp_path / "alice.key"
    write_key(key_path, generate_key())
    alice_key = read_key(key_path)
    await client.register_identity(
        "admin", admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN, bytes(alice_key.verify_key)
    )
    alice = await client.open_session("alice", alice_key)
    save_session(key_path, alice)
    await client.register_identity(
        "admin", admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT, bytes(generate_key().verify_key)
    )
    create = builders.mission_create("alice", "coord-bot", SystemClock().now())
    await client.execute(alice.sign(alice.command("grp_follow", "mission_create", create)))
    conversation = (await client.group_state("grp_follow")).mission.planning_conversation_id
    await client.channel.close()
    follower = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        "--target",
        f"127.0.0.1:{port}",
        "events",
        "--group",
        "grp_follow",
        "--follow",
        "--payloads",
        "--as",
        "alice",
        "--key",
        str(key_path),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert follower.stdout is not None
    lines: list[dict[str, object]] = []

    async def until(count: int) -> None:
        async with asyncio.timeout(30):
            while len(lines) < count:
                lines.append(json.loads(await follower.stdout.readline()))  # type: ignore[union-attr]

    try:
        await until(1)
        await mesh.stop(grace=1)  # the server goes away, and comes back on the same port and data
        mesh = await start(settings)
        client = MeshClient(f"127.0.0.1:{port}")
        post = builders.message(conversation, "after the restart")
        await client.execute(
            alice.sign(alice.command("grp_follow", "message_post", post, membership_epoch=1))
        )
        await client.channel.close()
        async with asyncio.timeout(30):
            while not any(line.get("type") == "message.posted" for line in lines):
                lines.append(json.loads(await follower.stdout.readline()))
    finally:
        follower.send_signal(signal.SIGINT)
        await follower.wait()
        await mesh.stop(grace=1)
    sequences = [int(line["seq"]) for line in lines]  # type: ignore[call-overload]
    assert sequences == list(range(1, len(sequences) + 1))  # in order, none twice, none skipped
    posted = next(line for line in lines if line["type"] == "message.posted")
    assert posted["payload"]["content"]["text"] == "after the restart"  # type: ignore[index]


def test_ctrl_c_to_the_whole_process_group_stops_the_mesh_in_order(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches every process of the group: the signature workers and the SQLite
    writer end with their pipes, when the server closes them, so the shutdown logs no child's death."""
    port = free_port()
    env = {
        **os.environ,
        "MWP_DATA_DIR": str(tmp_path / "data"),
        "PYTHONPATH": str(ROOT),
        "MWP_METRICS_LISTEN": "",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "missionweave.cli", "serve", "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_healthy(f"127.0.0.1:{port}", env)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    logs = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]  # type: ignore[union-attr]
    assert logs[-1]["msg"] == "stopped"
    assert not [entry for entry in logs if entry["level"] in ("error", "critical")], logs


def _ignored_signals(pid: int) -> int:
    """The process's ignored-signal mask (Linux /proc); 0 until it is readable."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigIgn:")), 0)


def test_a_child_process_ignores_a_ctrl_c_that_lands_while_it_is_still_starting(tmp_path: Path) -> None:
    """The SQLite writer takes a few hundred ms to import; a Ctrl-C to the process group in that
    time must not kill it (a traceback in the mesh's log, a writer gone mid-shutdown): it ignores
    the signals from its first statement, and ends with its pipe."""
    child = subprocess.Popen(
        child_command(
            "missionweave_server.services.authority.writer_process",
            str(tmp_path / "events.db"),
            "FULL",
            "inst",
            "1",
        ),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The signals land once its first statement ran (SigIgn in /proc shows both ignored) and while
    # the module's imports go on: a fixed sleep could land before the interpreter's start on a
    # loaded machine, a window no statement of the child can close.
    wanted = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    deadline = time.monotonic() + 20
    while not _ignored_signals(child.pid) & wanted == wanted:
        assert time.monotonic() < deadline, "the child never ignored SIGINT and SIGTERM"
        time.sleep(0.001)
    child.send_signal(signal.SIGINT)
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=30)  # closes its stdin: the pipe ends
    assert "KeyboardInterrupt" not in stderr and child.returncode != -signal.SIGTERM, stderr
