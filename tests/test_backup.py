"""``mwp backup`` and ``mwp restore`` (docs/backup.md, issue 39): a backup taken while the mesh
serves and writes, everything destroyed, restored, and the restored mesh serving again; tampered
backups and occupied targets refused with nothing written; a stopped mesh; blobs in S3.

The mesh, ``backup``, ``restore`` and ``verify`` run as the operator runs them (``mwp`` processes);
the writer and the set-up are an agent of the SDK in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nacl.signing import SigningKey
from sqlalchemy import text

from missionweave.kernel.clock import SystemClock
from missionweave.kernel.signing import read_key, write_key
from missionweave.sdk.client import MeshClient, SessionSigner, blob_digest
from missionweave.v1 import common_pb2
from missionweave_server.config import Settings
from missionweave_server.mesh.server import SERVICE_NAMES, start
from missionweave_server.storage.db import make_engine
from tests import builders

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_URL = os.environ.get("MWP_TEST_POSTGRES_URL", "")
S3_ENDPOINT = os.environ.get("MWP_TEST_S3_ENDPOINT", "")
GROUP = "grp_backup"
DEADLINE_S = 30.0


# ---------------------------------------------------------------------- the operator's commands


def base_env(data_dir: Path, database_url: str = "", **extra: str) -> dict[str, str]:
    """What an operator's shell would hold: the store's location, nothing inherited that would
    point elsewhere (another database, a bucket, a context)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("MWP_") and k not in ("MWP_CONTEXT_DIR",)) and not k.startswith("AWS_")
    }
    env.update(
        PYTHONPATH=str(ROOT),
        MWP_DATA_DIR=str(data_dir),
        MWP_METRICS_LISTEN="",
        MWP_CONSOLE_LISTEN="",
        MWP_LOG_LEVEL="warning",
    )
    if database_url:
        env["MWP_DATABASE_URL"] = database_url
    env.update(extra)
    return env


def mwp(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "missionweave.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"mwp {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


async def amwp(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """``mwp`` without blocking this event loop (the writer goes on meanwhile)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        *args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    return int(process.returncode or 0), out.decode(), err.decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    target: str


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


async def serving(target: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Polls the health of every service until all answer SERVING (or the process ends)."""
    deadline = time.monotonic() + DEADLINE_S
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.poll() is not None:
                raise AssertionError(f"mwp serve exited {process.returncode}: {tail(log)}")
            try:
                answers = [
                    (await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=2)).status
                    for name in SERVICE_NAMES.values()
                ]
                if all(a == health_pb2.HealthCheckResponse.SERVING for a in answers):
                    return
            except grpc.aio.AioRpcError:
                pass
            assert time.monotonic() < deadline, "mwp serve did not become healthy"
            await asyncio.sleep(0.1)


def spawn_serve(target: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "missionweave.cli", "serve", "--listen", target],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )


Serve = Callable[[dict[str, str]], Awaitable[Served]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    """``await serve(env)``: a ``mwp serve`` process, stopped (SIGTERM, exit 0) by ``stop`` or at the end."""
    started: list[subprocess.Popen[bytes]] = []

    async def start(env: dict[str, str]) -> Served:
        target = f"127.0.0.1:{free_port()}"
        log = tmp_path / f"serve-{len(started)}.log"
        process = spawn_serve(target, env, log)
        started.append(process)
        await serving(target, process, log)
        return Served(process, target)

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def stop(served: Served) -> None:
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(30) == 0


# ---------------------------------------------------------------------- the stores


@dataclass
class Store:
    kind: str
    data_dir: Path
    database_url: str  # "" for SQLite

    def env(self, **extra: str) -> dict[str, str]:
        return base_env(self.data_dir, self.database_url, **extra)

    async def destroy(self) -> None:
        """Everything the mesh stored is gone: the data directory, and the database's tables."""
        shutil.rmtree(self.data_dir)
        if self.database_url:
            await empty_postgres(self.database_url)


async def empty_postgres(url: str) -> None:
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("DROP SCHEMA public CASCADE"))
            await conn.execute(text("CREATE SCHEMA public"))
    finally:
        await engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "postgres":
        if not POSTGRES_URL:
            pytest.skip("PostgreSQL variant needs MWP_TEST_POSTGRES_URL (set by .ci/run)")
        await empty_postgres(POSTGRES_URL)  # the restore needs an empty database; so does this test's start
        yield Store("postgres", tmp_path / "data", POSTGRES_URL)
    else:
        yield Store("sqlite", tmp_path / "data", "")


# ---------------------------------------------------------------------- the agent's side


@dataclass
class Org:
    client: MeshClient
    alice: SessionSigner
    alice_key: Path
    coord_key: Path
    conversation: str


async def organise(target: str, data_dir: Path, keys: Path) -> Org:
    """alice (human) and coord (agent), each with a key file, and alice's Mission in GROUP."""
    client = MeshClient(target)
    admin_key = read_key(data_dir / "keys" / "admin.key")
    await client.open_session("admin", admin_key)
    paths = {}
    for name, kind in (("alice", common_pb2.IDENTITY_KIND_HUMAN), ("coord", common_pb2.IDENTITY_KIND_AGENT)):
        key = SigningKey.generate()
        paths[name] = keys / f"{name}.key"
        write_key(paths[name], key)
        await client.register_identity("admin", admin_key, name, kind, bytes(key.verify_key))
    alice = await client.open_session("alice", read_key(paths["alice"]))
    client.read_as(alice)
    body = builders.mission_create("alice", "coord", SystemClock().now())
    await client.execute(alice.sign(alice.command(GROUP, "mission_create", body)))
    conversation = (await client.group_state(GROUP)).mission.planning_conversation_id
    return Org(client, alice, paths["alice"], paths["coord"], conversation)


@contextlib.asynccontextmanager
async def in_process(data_dir: Path, keys: Path) -> AsyncIterator[Org]:
    """A mesh in this process on ``data_dir`` (blobs where MWP_S3_* say), stopped on leaving: a
    store written by a mesh that no longer runs."""
    mesh = await start(Settings(listen="127.0.0.1:0", data_dir=data_dir, grace_seconds=1))
    try:
        org = await organise(f"127.0.0.1:{mesh.port}", data_dir, keys)
        try:
            yield org
        finally:
            await org.client.channel.close()
    finally:
        await mesh.stop(grace=1)


async def post(org: Org, text_: str) -> str:
    command = org.alice.command(
        GROUP, "message_post", builders.message(org.conversation, text_), membership_epoch=1
    )
    return (await org.client.execute(org.alice.sign(command))).command_id


@dataclass
class Writer:
    """Posts messages continuously; each acknowledged command with the moment of its answer."""

    org: Org
    acked: list[tuple[str, float]]
    refused: list[str]
    stopping: asyncio.Event
    task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            try:
                command_id = await post(self.org, f"load {n}")
            except grpc.aio.AioRpcError as err:  # e.g. the per-Group admission limit: not acknowledged
                self.refused.append(err.code().name)
            else:
                self.acked.append((command_id, time.monotonic()))
            await asyncio.sleep(0.005)  # pacing, well under the Group's admission rate

    async def until(self, count: int, after: float = 0.0) -> None:
        """Waits (bounded) until ``count`` commands were acknowledged after ``after``."""
        async with asyncio.timeout(DEADLINE_S):
            while sum(1 for _, at in self.acked if at > after) < count:
                assert self.task is not None and not self.task.done(), "the writer stopped"
                await asyncio.sleep(0.01)


async def group_events(client: MeshClient) -> list[tuple[int, str, str]]:
    return [(e.sequence, e.event_id, e.causing_command_id) async for e in client.read_events(GROUP)]


def flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------- the tests


async def test_a_backup_taken_under_load_restores_everything_acknowledged_before_it(
    store: Store, serve: Serve, tmp_path: Path
) -> None:
    """Issue 39: backup while a writer posts, destroy everything, restore, serve again."""
    env = store.env()
    keys = tmp_path / "keys"
    served = await serve(env)
    org = await organise(served.target, store.data_dir, keys)
    content = os.urandom(2 * 1024 * 1024 + 12_345)  # several chunks
    (tmp_path / "report.bin").write_bytes(content)
    put = json.loads(
        mwp(
            "--target",
            served.target,
            "artifact",
            "put",
            str(tmp_path / "report.bin"),
            "--as",
            "coord",
            "--key",
            str(org.coord_key),
            "--json",
            env=env,
        ).stdout
    )
    writer = Writer(org, [], [], asyncio.Event())
    writer.task = asyncio.create_task(writer.run())
    try:
        await writer.until(20)
        began = time.monotonic()
        code, out, err = await amwp("backup", str(tmp_path / "backup"), "--json", env=env)
        ended = time.monotonic()
        assert code == 0, err
        await writer.until(5, after=ended)  # the log goes on past the backup
    finally:
        writer.stopping.set()
        await writer.task
    taken = json.loads(out)
    during = [c for c, at in writer.acked if began <= at <= ended]
    assert during, "the writer acknowledged nothing while the backup ran: not a backup under load"
    before = {c for c, at in writer.acked if at < began}
    original = await group_events(org.client)
    await org.client.channel.close()
    stop(served)

    manifest = json.loads((tmp_path / "backup" / "manifest.json").read_text())
    assert taken["digest"] == f"blake3:{manifest['digest']}"
    assert stat.S_IMODE((tmp_path / "backup").stat().st_mode) == 0o700
    assert {f["path"] for f in manifest["files"] if f["kind"] == "key"} >= {
        "keys/authority.key",
        "keys/admin.key",
        "keys/mesh.token",
    }
    assert [b for b in manifest["blobs"] if b["digest"] == put["blake3"]] == [
        {"digest": put["blake3"], "size": len(content), "how": "copied"}
    ]
    head = next(g for g in manifest["groups"] if g["group_id"] == GROUP)

    # Not over the store it came from: the data directory (SQLite), the database (PostgreSQL) is not empty.
    elsewhere = tmp_path / "elsewhere"
    target_env = env if store.kind == "sqlite" else store.env(MWP_DATA_DIR=str(elsewhere))
    occupied = mwp("restore", str(tmp_path / "backup"), env=target_env, check=False)
    assert occupied.returncode == 1 and "is not empty" in occupied.stderr, occupied.stderr
    assert ("the database" in occupied.stderr) == (store.kind == "postgres") and not elsewhere.exists()

    await store.destroy()
    assert not store.data_dir.exists()
    restored = mwp("restore", str(tmp_path / "backup"), "--expect-digest", taken["digest"], "--json", env=env)
    report = json.loads(restored.stdout)
    assert report["ok"] and report["verify"]["clean"] and not report["differences"], restored.stdout
    assert stat.S_IMODE((store.data_dir / "keys" / "authority.key").stat().st_mode) == 0o600
    if store.kind == "sqlite":
        assert stat.S_IMODE((store.data_dir / "missionweave.db").stat().st_mode) == 0o600

    served = await serve(env)
    client = MeshClient(served.target)
    try:
        client.read_as(org.alice)  # a session opened before the backup is in it
        events = await group_events(client)
        # The restored log is the original one up to the backup's instant: a prefix, nothing else.
        assert len(events) == head["head_seq"] and events == original[: len(events)]
        assert before <= {command for _, _, command in events}, (
            "a command acknowledged before the backup is missing"
        )
        got = tmp_path / "got.bin"
        mwp(
            "--target",
            served.target,
            "artifact",
            "get",
            f"blake3:{put['blake3']}:{len(content)}",
            "-o",
            str(got),
            "--as",
            "coord",
            "--key",
            str(org.coord_key),
            env=env,
        )
        assert got.read_bytes() == content
        # The restored mesh accepts new work, after the restored head.
        mwp(
            "--target",
            served.target,
            "message",
            "post",
            "--as",
            "alice",
            "--key",
            str(org.alice_key),
            "--group",
            GROUP,
            "--text",
            "after the restore",
            env=env,
        )
        last = [
            json.loads(line)
            for line in mwp(
                "--target",
                served.target,
                "events",
                "--group",
                GROUP,
                "--after",
                str(len(events)),
                "--as",
                "alice",
                "--key",
                str(org.alice_key),
                env=env,
            ).stdout.splitlines()
        ]
        assert [(e["seq"], e["type"]) for e in last] == [(len(events) + 1, "message.posted")]
        assert "CLEAN" in mwp("verify", env=env).stdout  # the new event continues the restored chain
    finally:
        await client.channel.close()
    stop(served)


async def test_a_stopped_mesh_backs_up_and_a_damaged_backup_or_an_occupied_target_is_refused(
    tmp_path: Path,
) -> None:
    """Every byte of the backup is checked before anything is written: a flipped byte in the database
    copy, in a blob or in manifest.json is refused (exit 1) and the target stays as it was; so is a
    target that is not empty. The intact backup restores."""
    store = Store("sqlite", tmp_path / "data", "")
    env = store.env()
    content = os.urandom(300_000)
    async with in_process(store.data_dir, tmp_path / "keys") as org:
        await post(org, "one message")
        await org.client.upload(content)
    digest = blake3.blake3(content).hexdigest()

    backup = tmp_path / "backup"
    taken = json.loads(mwp("backup", str(backup), "--json", env=env).stdout)
    assert taken["ok"] and taken["blobs"]["copied"] == 1 and taken["groups"] == 1
    assert mwp("backup", str(backup), env=env, check=False).returncode == 1  # never into a backup
    assert mwp("restore", str(backup), "--verify-only", env=env).returncode == 0

    target = tmp_path / "restored"
    renv = base_env(target)
    blob = f"blobs/{digest[:2]}/{digest[2:4]}/{digest}"
    for damaged, where, at in (
        ("database", "database/missionweave.db", 5000),
        ("blob", blob, 1234),
        ("manifest", "manifest.json", None),
    ):
        copy = tmp_path / f"damaged-{damaged}"
        shutil.copytree(backup, copy)
        if at is None:  # a value in the manifest: one digit of the database file's size
            raw = (copy / where).read_text()
            size = str(next(f["size"] for f in json.loads(raw)["files"] if f["kind"] == "database"))
            at = raw.index(f'"size": {size}') + len('"size": ')
        flip_byte(copy / where, at)
        refused = mwp("restore", str(copy), env=renv, check=False)
        assert refused.returncode == 1, (damaged, refused.stdout, refused.stderr)
        assert "restore refused (nothing was written)" in refused.stderr
        assert where in refused.stderr, refused.stderr
        assert not target.exists(), f"a {damaged} damaged backup wrote {list(target.iterdir())}"

    # A manifest re-hashed after an edit passes its own digest, not the digest recorded apart.
    forged = tmp_path / "forged"
    shutil.copytree(backup, forged)
    from missionweave_server.mesh.backup import manifest_digest

    document = json.loads((forged / "manifest.json").read_text())
    document["groups"] = []
    document["digest"] = manifest_digest(document)
    (forged / "manifest.json").write_text(json.dumps(document))
    refused = mwp("restore", str(forged), "--expect-digest", taken["digest"], env=renv, check=False)
    assert refused.returncode == 1 and "not the expected" in refused.stderr and not target.exists()

    # An occupied target: a data directory with anything in it, written by nobody else meanwhile.
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    refused = mwp("restore", str(backup), env=renv, check=False)
    assert refused.returncode == 1 and "is not empty" in refused.stderr
    assert [p.name for p in target.iterdir()] == ["notes.txt"]
    # Usage errors: a SQLite backup into PostgreSQL; references to blobs on local disk.
    (target / "notes.txt").unlink()
    wrong = mwp(
        "restore",
        str(backup),
        "--database-url",
        "postgresql://nobody@127.0.0.1:1/none",
        env=renv,
        check=False,
    )
    assert wrong.returncode == 2 and "SQLite" in wrong.stderr and list(target.iterdir()) == []
    assert mwp("backup", str(tmp_path / "ref"), "--blobs", "reference", env=env, check=False).returncode == 2
    assert not (tmp_path / "ref").exists()

    restored = mwp("restore", str(backup), env=renv)
    assert "CLEAN" in restored.stdout
    assert (target / blob).read_bytes() == content
    assert mwp("verify", env=renv).returncode == 0


async def test_a_blob_gone_from_the_store_fails_the_backup_and_keeps_nothing(tmp_path: Path) -> None:
    """A blob the database names but the blob store no longer holds (removed between the snapshot and
    the copy): the backup fails naming it, and no partial backup is left."""
    store = Store("sqlite", tmp_path / "data", "")
    env = store.env()
    content = os.urandom(10_000)
    async with in_process(store.data_dir, tmp_path / "keys") as org:
        await org.client.upload(content)
    digest = blake3.blake3(content).hexdigest()
    (store.data_dir / "blobs" / digest[:2] / digest[2:4] / digest).unlink()
    failed = mwp("backup", str(tmp_path / "backup"), env=env, check=False)
    assert failed.returncode == 1
    assert (
        f"blob {digest} ({len(content)} bytes) is named by the database snapshot but is not in the blob store"
        in failed.stderr
    )
    assert not (tmp_path / "backup").exists()
    no_key = mwp(
        "backup",
        str(tmp_path / "backup"),
        "--authority-key",
        str(tmp_path / "absent.key"),
        env=env,
        check=False,
    )
    assert no_key.returncode == 1 and "--no-keys" in no_key.stderr


# ---------------------------------------------------------------------- blobs in S3


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A bucket of its own on the test S3 server, named in this process's environment too (the
    in-process mesh reads it there)."""
    if not S3_ENDPOINT:
        pytest.skip("S3 variant needs MWP_TEST_S3_ENDPOINT (.ci/run starts moto's server and sets it)")
    bucket = f"mwp-backup-{uuid.uuid4().hex[:12]}"
    # moto accepts any credentials; a developer's real ones must never reach a test server.
    env = {
        "MWP_S3_BUCKET": bucket,
        "MWP_S3_ENDPOINT": S3_ENDPOINT,
        "MWP_S3_CREATE_BUCKET": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    }
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield env


async def test_blobs_in_s3_are_copied_or_referenced(tmp_path: Path, s3_env: dict[str, str]) -> None:
    """``--blobs copy`` downloads each blob into the backup (restorable anywhere, local disk too);
    ``--blobs reference`` lists them, and a restore checks the target bucket holds each one."""
    env = base_env(tmp_path / "data", **s3_env)
    content = os.urandom(1_500_000)
    async with in_process(tmp_path / "data", tmp_path / "keys") as org:
        await org.client.upload(content)
    digest = blob_digest(content).hex
    assert not (tmp_path / "data" / "blobs" / digest[:2]).exists()  # in the bucket, not on disk

    copied = json.loads(mwp("backup", str(tmp_path / "copy"), "--json", env=env).stdout)
    assert copied["blobs"] == {"copied": 1, "referenced": 0, "bytes": len(content)}
    local = tmp_path / "local"
    mwp("restore", str(tmp_path / "copy"), env=base_env(local))  # no bucket: onto local disk
    assert (local / "blobs" / digest[:2] / digest[2:4] / digest).read_bytes() == content

    referenced = json.loads(
        mwp("backup", str(tmp_path / "ref"), "--blobs", "reference", "--json", env=env).stdout
    )
    assert referenced["blobs"] == {"copied": 0, "referenced": 1, "bytes": len(content)}
    assert not (tmp_path / "ref" / "blobs").exists()
    usage = mwp("restore", str(tmp_path / "ref"), env=base_env(tmp_path / "nowhere"), check=False)
    assert usage.returncode == 2 and "MWP_S3_BUCKET" in usage.stderr
    other = {**s3_env, "MWP_S3_BUCKET": f"{s3_env['MWP_S3_BUCKET']}-empty"}
    missing = mwp(
        "restore", str(tmp_path / "ref"), env=base_env(tmp_path / "elsewhere", **other), check=False
    )
    assert (
        missing.returncode == 1
        and f"blob {digest}" in missing.stderr
        and not (tmp_path / "elsewhere").exists()
    )
    same = json.loads(
        mwp("restore", str(tmp_path / "ref"), "--json", env=base_env(tmp_path / "same", **s3_env)).stdout
    )
    assert same["ok"] and same["restored"]["blobs_present"] == 1
