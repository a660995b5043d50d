"""Authority benchmark: signed commands per second end to end over gRPC, with anchors, in one run.

    PYTHONPATH=. .venv/bin/python bench/authority.py            # default run (~1-3 minutes)
    PYTHONPATH=. .venv/bin/python bench/authority.py --quick    # smoke run (seconds)
    PYTHONPATH=. .venv/bin/python bench/authority.py --database-url postgresql://u:pw@host/db
    PYTHONPATH=. .venv/bin/python bench/authority.py --topologies single,split-1,split-2   # the default

What it measures (issue #2, "Benchmark"):

1. ours, unary    - ``message_post`` commands through ``ExecuteCommand``, ``--clients`` concurrent
                    callers spread over ``--groups`` Groups (each created first with mission_create by
                    the human owner, who then posts into the planning Conversation).
2. ours, streamed - the same workload through ``ExecuteCommandStream`` (``--streams`` streams, each
                    keeping ``--window`` commands in flight).
3. ours, batched  - the same workload through ``ExecuteCommandBatch``, ``--batch`` (32) commands per
                    call, ``--batch-calls`` (8) calls in flight (as many commands in flight as streamed).
4. echo anchors   - a no-op grpc.aio server answering the same request messages with a canned
                    response of exactly the size of our real results, unary, streamed and batched, at
                    the same concurrency. This is the transport's limit on this machine.
5. SQLite anchor  - stdlib sqlite3 batched inserts of the same ``events`` rows (same columns, same
                    envelope sizes, WAL, synchronous=FULL, batches of ~concurrency rows).
6. Ed25519 anchor - PyNaCl sign + verify pairs per second over a payload of our command's size
                    (the Authority does exactly one verify and one sign per message_post).

Topologies (issue 12, ``--topologies``): the phases and the echo anchor run against each in turn,
``single`` (every service in one process) and ``split-N`` (``mwp serve --topology split --shards N``,
each service in its own process, clients talking to the gateway, which routes AuthorityService calls
to the N shards). More than one shard needs PostgreSQL: ``--database-url``, ``MWP_BENCH_POSTGRES_URL``,
or the machine's PostgreSQL 15 (started as ``.ci/run`` does, a throw-away role and a fresh database
per topology); without one those topologies are skipped with the reason. Beside a split-N on
PostgreSQL, single and split-1 run on PostgreSQL too, so that they differ only in topology. Server
CPU sums every process of the topology (signature workers and SQLite writers included), named per
process; the PostgreSQL backends' CPU and the whole machine's busy CPU are shown apart.

Every server (ours and the echo) runs in its own process, so client and server share the machine's
cores as they would in reality. All commands are built and signed before the timed loops: signing is
a real client cost, but it is not the server's, and it would otherwise eat the CPU the server needs.
Everything listens on 127.0.0.1 and each phase is bounded by ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from missionweave.kernel.transport import open_channel  # noqa: E402
from missionweave_server.edge.channels import add_listener  # noqa: E402

ECHO_UNARY = "/bench.Echo/Unary"
ECHO_STREAM = "/bench.Echo/Stream"
ECHO_BATCH = "/bench.Echo/Batch"
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    ("grpc.max_send_message_length", 4 * 1024 * 1024),
]

# Issue #2 targets.
FIRST_TARGET_RATIO = 0.50
FIRST_TARGET_P99_MS = 50.0
GOAL_RATIO = 0.60
GOAL_RATE = 5000.0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ====================================================================== server processes


def _wait_for_stdin_eof_then(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)

    def reader() -> None:
        with contextlib.suppress(Exception):
            sys.stdin.buffer.read()
        loop.call_soon_threadsafe(stop.set)

    import threading

    threading.Thread(target=reader, daemon=True).start()


async def role_mesh(args: argparse.Namespace) -> None:
    """Child process: our server. Prints ``PORT <n>`` and runs until stdin closes."""
    import logging

    from missionweave.kernel import logs
    from missionweave_server.config import Settings
    from missionweave_server.mesh.server import start

    logs.configure("warning", "text")
    logging.getLogger().setLevel(logging.WARNING)
    # The environment's MWP_* tuning (e.g. MWP_COMMIT_LINGER_MS) applies; where and what to store is ours.
    settings = Settings.from_env()
    settings.listen, settings.data_dir, settings.database_url = (
        "127.0.0.1:0",
        Path(args.data_dir),
        args.database_url or "",
    )
    if settings.malloc_tuning:  # as `mwp serve` does
        from missionweave_server.mesh.allocator import tune_allocator

        tune_allocator()
    profiler = None
    if args.profile_out:
        import cProfile

        profiler = cProfile.Profile()
    mesh = await start(settings)
    print(f"PORT {mesh.port}", flush=True)
    stop = asyncio.Event()
    _wait_for_stdin_eof_then(stop)
    if profiler is not None:
        # Profile only while the parent says so (SIGUSR1 toggles), so setup is not in the profile.
        loop = asyncio.get_running_loop()
        state = {"on": False}

        def toggle() -> None:
            if state["on"]:
                profiler.disable()
            else:
                profiler.enable()
            state["on"] = not state["on"]

        loop.add_signal_handler(signal.SIGUSR1, toggle)
    await stop.wait()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile_out)
    print(f"STATS batches={mesh.store.batches} appends={mesh.store.appends}", flush=True)
    await mesh.stop(1)


async def role_echo(unary_response: bytes, stream_response_rest: bytes, batch_response: bytes) -> None:
    """Child process: the no-op anchor. Parses the real request types, answers canned bytes."""
    from missionweave.v1 import authority_service_pb2 as pb

    async def unary(request: pb.ExecuteCommandRequest, context: grpc.aio.ServicerContext) -> bytes:
        return unary_response

    async def batch(request: pb.ExecuteCommandBatchRequest, context: grpc.aio.ServicerContext) -> bytes:
        return batch_response

    async def stream(request_iterator, context):  # type: ignore[no-untyped-def]
        async for req in request_iterator:
            # field 1 (request_tag, varint) then the pre-serialised rest: same bytes as ours.
            yield b"\x08" + _varint(req.request_tag) + stream_response_rest

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=pb.ExecuteCommandRequest.FromString, response_serializer=None
            ),
            "Batch": grpc.unary_unary_rpc_method_handler(
                batch, request_deserializer=pb.ExecuteCommandBatchRequest.FromString, response_serializer=None
            ),
            "Stream": grpc.stream_stream_rpc_method_handler(
                stream,
                request_deserializer=pb.ExecuteCommandStreamRequest.FromString,
                response_serializer=None,
            ),
        },
    )
    server = grpc.aio.server(options=[*GRPC_OPTIONS, ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    port = add_listener(server, "127.0.0.1:0", None)
    await server.start()
    print(f"PORT {port}", flush=True)
    stop = asyncio.Event()
    _wait_for_stdin_eof_then(stop)
    await stop.wait()
    await server.stop(1)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    port: int

    def stop(self, timeout: float = 15.0) -> str:
        """Close stdin (the child's stop signal), collect its remaining stdout, kill if it hangs."""
        out = b""
        try:
            out, _ = self.proc.communicate(input=b"", timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.name} did not stop in {timeout}s; killing pid {self.proc.pid}")
            self.proc.kill()
            out, _ = self.proc.communicate()
        except ValueError:
            pass
        return out.decode(errors="replace")


def spawn(name: str, role_args: list[str], stderr_path: Path) -> Child:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *role_args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(stderr_path, "wb"),
        env=env,
        cwd=str(ROOT),
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(b"PORT "):
            return Child(name, proc, int(line.split()[1]))
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{name} failed to start; see {stderr_path}:\n{stderr_path.read_text()[-3000:]}")


def spawn_mesh(
    data_dir: Path,
    work: Path,
    database_url: str = "",
    profile_out: Path | None = None,
    stderr_name: str = "server.stderr",
) -> Child:
    """Our server (all services of ``mwp serve``) in its own process; stderr goes to ``work/stderr_name``."""
    mesh_args = ["--role", "mesh", "--data-dir", str(data_dir)]
    if database_url:
        mesh_args += ["--database-url", database_url]
    if profile_out is not None:
        mesh_args += ["--profile-out", str(profile_out)]
    return spawn("server", mesh_args, work / stderr_name)


def spawn_echo(
    work: Path, unary_response: bytes, stream_response_rest: bytes = b"", batch_response: bytes = b""
) -> Child:
    """The no-op echo anchor in its own process, answering ``unary_response`` (on the stream method,
    the request tag followed by ``stream_response_rest``; on the batch method, ``batch_response``)."""
    (work / "unary_response.hex").write_text(unary_response.hex())
    (work / "stream_response_rest.hex").write_text(stream_response_rest.hex())
    (work / "batch_response.hex").write_text(batch_response.hex())
    return spawn(
        "echo",
        [
            "--role",
            "echo",
            "--unary-response",
            str(work / "unary_response.hex"),
            "--stream-response-rest",
            str(work / "stream_response_rest.hex"),
            "--batch-response",
            str(work / "batch_response.hex"),
        ],
        work / "echo.stderr",
    )


def echo_unary_call(channel: grpc.aio.Channel) -> Callable[[Any], Awaitable[Any]]:
    """The echo anchor's unary method, typed with our real request and response messages."""
    from missionweave.v1 import authority_service_pb2 as pb

    return channel.unary_unary(
        ECHO_UNARY,
        request_serializer=pb.ExecuteCommandRequest.SerializeToString,
        response_deserializer=pb.ExecuteCommandResponse.FromString,
    )


def echo_stream_call(channel: grpc.aio.Channel) -> Callable[[], Any]:
    """The echo anchor's stream method, typed with our real request and response messages."""
    from missionweave.v1 import authority_service_pb2 as pb

    return channel.stream_stream(
        ECHO_STREAM,
        request_serializer=pb.ExecuteCommandStreamRequest.SerializeToString,
        response_deserializer=pb.ExecuteCommandStreamResponse.FromString,
    )


# ====================================================================== topologies


@dataclass
class Topology:
    """One way to run the mesh: ``single`` (every service in one process, the bench's ``--role mesh``
    child) or ``split-N`` (``mwp serve --topology split --shards N``: each service in its own process,
    the gateway the one address), on SQLite or PostgreSQL."""

    name: str
    shards: int  # 0: single process
    store: str  # "sqlite" | "postgresql"
    skip: str = ""  # why it is not measured in this run

    @property
    def label(self) -> str:
        return f"{self.name} ({'PostgreSQL' if self.store == 'postgresql' else 'SQLite'})"

    @property
    def slug(self) -> str:
        return f"{self.name}-{'pg' if self.store == 'postgresql' else 'sqlite'}"


def parse_topologies(spec: str, database_url_given: bool, pg_baselines: bool) -> list[Topology]:
    """``single``, ``split-N``, each optionally ``:sqlite`` or ``:pg``. Unsuffixed: PostgreSQL with
    ``--database-url``, else SQLite, except ``split-N`` with N > 1 (the launcher refuses SQLite, D60).
    Where a split-N (N > 1) runs on PostgreSQL, ``single:pg`` and ``split-1:pg`` are added before it
    (unless listed or ``pg_baselines`` is off) so that single vs split-1 vs split-N differ only in
    topology."""
    out: list[Topology] = []
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        name, _, store = item.partition(":")
        if name == "single":
            shards = 0
        elif name.startswith("split-") and name[6:].isdigit() and int(name[6:]) >= 1:
            shards = int(name[6:])
        else:
            raise SystemExit(
                f"--topologies: unknown topology {item!r} (single, split-N, optionally :sqlite or :pg)"
            )
        if store in ("pg", "postgres", "postgresql"):
            store = "postgresql"
        elif store == "":
            store = "postgresql" if database_url_given or shards > 1 else "sqlite"
        elif store != "sqlite":
            raise SystemExit(f"--topologies: unknown store {store!r} in {item!r} (sqlite or pg)")
        if shards > 1 and store == "sqlite":
            raise SystemExit(f"--topologies: {item}: more than one Authority shard needs PostgreSQL (D60)")
        out.append(Topology(name, shards, store))
    if pg_baselines:
        for i, topo in enumerate(list(out)):
            if topo.shards > 1 and topo.store == "postgresql":
                have = {(t.name, t.store) for t in out}
                extra = [
                    Topology(n, s, "postgresql")
                    for n, s in (("single", 0), ("split-1", 1))
                    if (n, "postgresql") not in have
                ]
                out[i:i] = extra
                break
    seen: set[str] = set()
    unique = [t for t in out if not (t.slug in seen or seen.add(t.slug))]  # type: ignore[func-returns-value]
    if not unique:
        raise SystemExit("--topologies: nothing to measure")
    return unique


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SplitMesh:
    """``python -m missionweave.cli serve --topology split --shards N`` as a child process: started,
    ready once the launcher prints "split topology serving", stopped with SIGTERM. Its stderr (with
    the launcher's "starting NAME pid N" lines that name the processes) goes to ``stderr_path``."""

    READY = "split topology serving"

    def __init__(self, shards: int, data_dir: Path, stderr_path: Path, database_url: str = "") -> None:
        self.port = _free_port()
        self.stderr_path = stderr_path
        argv = [
            sys.executable, "-m", "missionweave.cli", "serve", "--topology", "split", "--shards", str(shards),
            "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(data_dir),
        ]  # fmt: skip
        if database_url:
            argv += ["--database-url", database_url]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        env.setdefault("MWP_LOG_LEVEL", "warning")  # as the single-process child (info logs cost CPU)
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(stderr_path, "wb"),
            env=env,
            cwd=str(ROOT),
        )
        deadline = time.monotonic() + 120
        while self.READY not in self._stderr():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"split topology failed to start; see {stderr_path}:\n{self._stderr()[-3000:]}"
                )
            time.sleep(0.2)

    def _stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def names(self) -> dict[int, str]:
        """pid -> process name, from the launcher's "starting NAME pid N" lines (restarts included)."""
        out = {}
        for line in self._stderr().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[0] == "starting" and parts[2] == "pid" and parts[3].isdigit():
                out[int(parts[3])] = parts[1]
        return out

    def stop(self, timeout: float = 30.0) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"split launcher did not stop in {timeout}s; killing pid {self.proc.pid}")
                self.proc.kill()
                self.proc.wait()
        return ""


class LocalPostgres:
    """The machine's PostgreSQL cluster, started as ``.ci/run`` does when it is not running, with a
    throw-away role and one fresh database per topology, all dropped at the end. Needs root (psql
    runs as the ``postgres`` user through runuser). ``reason`` says why it cannot be used."""

    def __init__(self, version: str = "15", cluster: str = "main") -> None:
        self.version, self.cluster = version, cluster
        self.port = 5432
        self.role = f"mwp_bench_{os.getpid()}_{os.urandom(3).hex()}"
        self.password = os.urandom(12).hex()
        self.databases: list[str] = []
        self.ready = False
        self.reason = ""

    def _psql(self, sql: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-p", str(self.port), "-d", "postgres", "-c", sql],
            check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
        )  # fmt: skip

    def start(self) -> bool:
        if self.ready:
            return True
        if not shutil.which("pg_ctlcluster") or not Path(f"/usr/lib/postgresql/{self.version}/bin").is_dir():
            self.reason = f"PostgreSQL {self.version} is not installed (pass --database-url or set MWP_BENCH_POSTGRES_URL)"
            return False
        if os.geteuid() != 0:
            self.reason = (
                "starting the local PostgreSQL needs root (pass --database-url or set MWP_BENCH_POSTGRES_URL)"
            )
            return False
        try:
            listing = subprocess.run(
                ["pg_lsclusters", "-h"], capture_output=True, text=True, check=True
            ).stdout
            row = next(
                (r.split() for r in listing.splitlines() if r.split()[:2] == [self.version, self.cluster]),
                None,
            )
            if row is None:
                self.reason = f"no PostgreSQL cluster {self.version}/{self.cluster} (pg_lsclusters)"
                return False
            self.port = int(row[2])
            if row[3] != "online":
                log(f"starting PostgreSQL {self.version}/{self.cluster} (pg_ctlcluster, as .ci/run does)")
                subprocess.run(
                    ["pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.cluster, "start"],
                    check=True, capture_output=True, timeout=60,
                )  # fmt: skip
            for _ in range(60):
                if (
                    subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)]).returncode
                    == 0
                ):
                    break
                time.sleep(1)
            else:
                self.reason = f"PostgreSQL on 127.0.0.1:{self.port} did not become ready"
                return False
            self._psql(f"CREATE ROLE {self.role} LOGIN PASSWORD '{self.password}'")
        except (subprocess.SubprocessError, OSError, ValueError) as exc:
            err = getattr(exc, "stderr", b"") or b""
            self.reason = f"could not use the local PostgreSQL: {exc} {err.decode(errors='replace').strip()}"[
                :500
            ]
            return False
        self.ready = True
        log(
            f"  PostgreSQL {self.version}/{self.cluster} on 127.0.0.1:{self.port}, throw-away role {self.role}"
        )
        return True

    def new_database(self) -> str:
        """A fresh database owned by the throw-away role; its asyncpg URL."""
        name = f"{self.role}_{len(self.databases)}"
        self._psql(f"CREATE DATABASE {name} OWNER {self.role}")
        self.databases.append(name)
        return f"postgresql+asyncpg://{self.role}:{self.password}@127.0.0.1:{self.port}/{name}"

    def drop(self) -> None:
        if not self.ready:
            return
        for name in self.databases:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._psql(f"DROP ROLE IF EXISTS {self.role}")
        log(
            f"dropped the throw-away PostgreSQL role and databases ({len(self.databases)}); the cluster keeps running"
        )


def database_name(url: str) -> str:
    """The database of a postgresql:// URL on this machine (for its backends' CPU), '' if remote."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1", None):
        return ""
    return parts.path.lstrip("/")


class TopologyStores:
    """Where each topology of a run keeps its data: SQLite in a data dir of its own; PostgreSQL in a
    fresh database of the machine's cluster (LocalPostgres, started here when one is needed) or, with
    ``database_url`` / ``MWP_BENCH_POSTGRES_URL``, the one given (shared by those topologies, with one
    data dir). A PostgreSQL topology is marked skipped, with the reason, when there is none."""

    def __init__(self, topologies: list[Topology], database_url: str, data_dir: str, work: Path) -> None:
        self.pg_url = database_url or os.environ.get("MWP_BENCH_POSTGRES_URL", "")
        self.data_dir, self.work = data_dir, work
        self.local_pg: LocalPostgres | None = None
        # A database given by URL is shared by its topologies, with one data dir.
        self.shared: dict[str, Path] = {}
        if any(t.store == "postgresql" for t in topologies) and not self.pg_url:
            self.local_pg = LocalPostgres()
            if not self.local_pg.start():
                for t in topologies:
                    if t.store == "postgresql":
                        t.skip = f"no PostgreSQL: {self.local_pg.reason}"
                        log(f"SKIPPING {t.label}: {t.skip}")

    def place(self, topo: Topology) -> tuple[Path, str, bool]:
        """(data dir, database URL or '' for SQLite, fresh: a new store nobody has registered in yet)."""
        given = Path(self.data_dir) if self.data_dir else None
        if topo.store == "sqlite":
            return given or self.work / topo.slug / "data", "", not self.data_dir
        if self.local_pg is not None:
            return given or self.work / topo.slug / "data", self.local_pg.new_database(), not self.data_dir
        return given or self.shared.setdefault(self.pg_url, self.work / "pg-data"), self.pg_url, False

    def close(self) -> None:
        if self.local_pg is not None:
            self.local_pg.drop()


def comparisons(topologies: list[Topology]) -> list[tuple[str, Topology, Topology]]:
    """(what, from, to) among measured topologies on the same store: the extra hop (single -> split-1)
    on each store, then each split-N (N > 1) against split-1."""
    by = {(t.name, t.store): t for t in topologies}
    pairs = []
    for store in ("sqlite", "postgresql"):
        if ("single", store) in by and ("split-1", store) in by:
            pairs.append(("the extra hop", by[("single", store)], by[("split-1", store)]))
    for (name, store), t in by.items():
        if name.startswith("split-") and name != "split-1" and ("split-1", store) in by:
            pairs.append((f"shards 1 -> {name[6:]}", by[("split-1", store)], t))
    return pairs


# ====================================================================== measurement helpers


def proc_cpu(pid: int) -> float:
    """User+system CPU seconds of a process (Linux /proc), 0.0 where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


class Metered(Protocol):
    """What CpuMeter fills in and projection / process_rows read: a Run here, a phase record in
    bench/delivery.py (``done``: completed calls or deliveries, the unit of ``us``)."""

    seconds: float
    server_cpu: float
    client_cpu: float
    server_cpu_by: dict[str, float]
    pg_cpu: float | None
    machine_cores: float | None

    @property
    def done(self) -> int: ...

    def us(self, cpu: float) -> float: ...


@dataclass
class Run:
    name: str
    done: int = 0
    errors: int = 0
    seconds: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    latencies: list[float] = field(default_factory=list)
    first_error: str = ""
    # With a ProcTree meter: server CPU seconds per process name (server_cpu is their sum) and the
    # PostgreSQL backends' CPU (None when not measured).
    server_cpu_by: dict[str, float] = field(default_factory=dict)
    pg_cpu: float | None = None
    # Every CPU of the machine busy during the phase (from /proc/stat, other users' work included), in cores.
    machine_cores: float | None = None

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0

    def pct(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))] * 1000.0

    def line(self) -> str:
        return (
            f"{self.name}: {self.done} ok, {self.errors} errors in {self.seconds:.2f}s = {self.rate:,.0f}/s, "
            f"p50 {self.pct(50):.1f} ms, p99 {self.pct(99):.1f} ms; {self.cpu_line()}"
        )

    def us(self, cpu: float) -> float:
        """CPU seconds as microseconds per completed call."""
        return cpu / max(1, self.done) * 1e6

    def cpu_line(self) -> str:
        if not self.seconds:
            return ""
        procs = f" in {len(self.server_cpu_by)} processes" if len(self.server_cpu_by) > 1 else ""
        pg = (
            f", PostgreSQL backends {self.pg_cpu / self.seconds:.0%} ({self.us(self.pg_cpu):,.0f} us/call)"
            if self.pg_cpu is not None
            else ""
        )
        return (
            f"server CPU {self.server_cpu / self.seconds:.0%} of a core{procs} ({self.us(self.server_cpu):,.0f} us/call), "
            f"client CPU {self.client_cpu / self.seconds:.0%} ({self.us(self.client_cpu):,.0f} us/call){pg}"
        )


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot (Linux /proc/stat), (0, 0) where unavailable."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / tick, sum(fields) / tick


def _children(pid: int) -> list[int]:
    """Direct children of a process, from every thread's /proc/<pid>/task/<tid>/children."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _module(pid: int) -> str:
    """A short name for a process: the last part of its ``-m`` module, else its program's name."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    args = [a.decode(errors="replace") for a in argv if a]
    if "-m" in args[:-1]:
        return args[args.index("-m") + 1].rsplit(".", 1)[-1]
    return Path(args[0]).name if args else "?"


def _postgres_backends(database: str) -> list[int]:
    """Pids of the PostgreSQL backends connected to ``database`` on this machine (their process
    title is ``postgres: [cluster: ]user database host(port) state``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if title.startswith("postgres: ") and f" {database} " in title:
            pids.append(int(entry.name))
    return pids


class ProcTree:
    """CPU of a process and all its descendants, by name: the bench's mesh child and its signature
    worker and SQLite writer, or the split launcher and every process it started (named as the
    launcher printed them: ``starting NAME pid N``) with theirs. Optionally the PostgreSQL backends
    serving one database, kept apart (they are not the topology's processes)."""

    PG = "postgres backends"

    def __init__(
        self,
        root: int,
        root_label: str,
        names: Callable[[], dict[int, str]] | None = None,
        pg_database: str = "",
    ) -> None:
        self.root, self.root_label = root, root_label
        self.names = names or dict
        self.pg_database = pg_database

    def labels(self) -> dict[int, str]:
        names = self.names()
        labels = {self.root: self.root_label}
        stack = [self.root]
        while stack:
            parent = stack.pop()
            for child in _children(parent):
                labels[child] = names.get(child) or f"{labels[parent]}/{_module(child)}"
                stack.append(child)
        return labels

    def snapshot(self) -> dict[int, tuple[str, float]]:
        snap = {pid: (label, proc_cpu(pid)) for pid, label in self.labels().items()}
        if self.pg_database:
            snap.update({pid: (self.PG, proc_cpu(pid)) for pid in _postgres_backends(self.pg_database)})
        return snap

    @staticmethod
    def delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
        """CPU seconds per name between two snapshots (a process started in between counts from 0;
        one that ended in between is lost)."""
        out: dict[str, float] = {}
        for pid, (label, cpu) in after.items():
            start = before.get(pid)
            out[label] = out.get(label, 0.0) + cpu - (start[1] if start and start[0] == label else 0.0)
        return out


class CpuMeter:
    """Charges a phase's server CPU (one pid, or a ProcTree: every process of the topology) and
    client-process CPU time to its Run (or any Metered record)."""

    def __init__(self, run_: Metered, server: int | ProcTree) -> None:
        self.run, self.server = run_, server

    def __enter__(self) -> CpuMeter:
        if isinstance(self.server, ProcTree):
            self.snap = self.server.snapshot()
        else:
            self.s0 = proc_cpu(self.server)
        self.c0, self.m0, self.w0 = time.process_time(), machine_cpu()[0], time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.run.client_cpu = time.process_time() - self.c0
        busy, wall = machine_cpu()[0] - self.m0, time.perf_counter() - self.w0
        self.run.machine_cores = busy / wall if wall > 0 and busy > 0 else None
        if isinstance(self.server, ProcTree):
            by = ProcTree.delta(self.snap, self.server.snapshot())
            pg = by.pop(ProcTree.PG, None)
            self.run.server_cpu_by = by
            self.run.server_cpu = sum(by.values())
            self.run.pg_cpu = pg
        else:
            self.run.server_cpu = proc_cpu(self.server) - self.s0


_PROGRESS_PREFIX = ""


def set_progress_prefix(prefix: str) -> None:
    """Progress lines start with this (the topology being measured)."""
    global _PROGRESS_PREFIX
    _PROGRESS_PREFIX = prefix


class Progress:
    def __init__(self, run: Run, total: int) -> None:
        self.run, self.total = run, total
        self.task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        t0 = time.perf_counter()
        while True:
            await asyncio.sleep(3)
            el = time.perf_counter() - t0
            log(
                f"  {_PROGRESS_PREFIX}{self.run.name}: {self.run.done + self.run.errors}/{self.total} after {el:.0f}s "
                f"({(self.run.done + self.run.errors) / el:,.0f}/s)"
            )

    def __enter__(self) -> Progress:
        self.task = asyncio.get_running_loop().create_task(self._loop())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.task:
            self.task.cancel()


async def run_unary(
    name: str,
    call: Callable[[Any], Awaitable[Any]],
    requests: list[Any],
    clients: int,
    max_seconds: float,
    check: Callable[[Any], bool] | None = None,
    server_pid: int | ProcTree = 0,
    per_call: int = 1,
) -> Run:
    """``clients`` tasks, each taking the next request from a shared cursor, one call in flight each.
    A call carrying ``per_call`` commands counts as that many (its latency once per command)."""
    run = Run(name)
    cursor = iter(range(len(requests)))
    deadline = time.perf_counter() + max_seconds
    perf = time.perf_counter

    async def client() -> None:
        for i in cursor:
            if perf() > deadline:
                return
            t0 = perf()
            try:
                resp = await call(requests[i])
                if check is not None and not check(resp):
                    raise RuntimeError(f"unexpected response {resp!r:.200}")
            except Exception as exc:
                run.errors += per_call
                run.first_error = run.first_error or repr(exc)[:500]
                continue
            run.latencies.extend([perf() - t0] * per_call)
            run.done += per_call

    with Progress(run, len(requests) * per_call), CpuMeter(run, server_pid):
        t0 = perf()
        await asyncio.gather(*(client() for _ in range(clients)))
        run.seconds = perf() - t0
    return run


async def run_streamed(  # type: ignore[no-untyped-def]
    name: str,
    open_stream,
    requests: list,
    streams: int,
    window: int,
    max_seconds: float,
    check=None,
    server_pid: int | ProcTree = 0,
) -> Run:
    """``streams`` bidi streams, each writing its share of requests with up to ``window`` in flight."""
    run = Run(name)
    perf = time.perf_counter
    deadline = perf() + max_seconds
    shares = [requests[s::streams] for s in range(streams)]

    async def one(share: list) -> None:  # type: ignore[type-arg]
        call = open_stream()
        slots = asyncio.Semaphore(window)
        sent: dict[int, float] = {}

        async def writer() -> None:
            for req in share:
                await slots.acquire()
                if perf() > deadline:
                    break
                sent[req.request_tag] = perf()
                await call.write(req)
            await call.done_writing()

        async def reader() -> None:
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    return
                t0 = sent.pop(resp.request_tag, None)
                slots.release()
                if t0 is None or (check is not None and not check(resp)):
                    run.errors += 1
                    run.first_error = run.first_error or f"unexpected response {resp!r:.300}"
                    continue
                run.latencies.append(perf() - t0)
                run.done += 1

        await asyncio.gather(writer(), reader())

    with Progress(run, len(requests)), CpuMeter(run, server_pid):
        t0 = perf()
        try:
            await asyncio.gather(*(one(s) for s in shares))
        except grpc.aio.AioRpcError as exc:
            run.errors += 1
            run.first_error = run.first_error or repr(exc)[:500]
        run.seconds = perf() - t0
    return run


# ====================================================================== anchors without a server


def ed25519_anchor(payload_len: int, seconds: float) -> tuple[float, int]:
    from nacl.signing import SigningKey

    key = SigningKey.generate()
    vk = key.verify_key
    payload = os.urandom(payload_len)
    n = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        for _ in range(200):
            signed = key.sign(payload)
            vk.verify(payload, signed.signature)
        n += 200
        if time.perf_counter() >= end:
            break
    return n / (time.perf_counter() - t0), n


def sqlite_anchor(
    path: Path, rows: int, batch: int, envelope_len: int, full_write_set: bool
) -> tuple[float, int]:
    """Same ``events`` table as missionweave_server/services/authority/schema.py; optionally the whole write set per command
    (the fenced ``groups`` head update and the ``commands`` row too), as our store writes it."""
    if path.exists():
        path.unlink()
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(
        """
        CREATE TABLE groups (group_id VARCHAR(128) PRIMARY KEY, head_seq BIGINT NOT NULL, writer_epoch BIGINT NOT NULL,
            owner_instance VARCHAR(128) NOT NULL, lease_expires_us BIGINT NOT NULL, created_us BIGINT NOT NULL);
        CREATE TABLE events (group_id VARCHAR(128) NOT NULL, seq BIGINT NOT NULL, event_id VARCHAR(128) NOT NULL UNIQUE,
            type VARCHAR(128) NOT NULL, command_id VARCHAR(128) NOT NULL, recorded_us BIGINT NOT NULL,
            envelope BLOB NOT NULL, PRIMARY KEY (group_id, seq));
        CREATE TABLE commands (group_id VARCHAR(128) NOT NULL, command_id VARCHAR(128) NOT NULL, fingerprint BLOB NOT NULL,
            first_seq BIGINT NOT NULL, last_seq BIGINT NOT NULL, event_count INTEGER NOT NULL, PRIMARY KEY (group_id, command_id));
        """
    )
    from missionweave.kernel import ids

    groups_n = 100
    gids = [f"grp_bench_{g:03d}" for g in range(groups_n)]
    for g in gids:
        db.execute("INSERT INTO groups VALUES (?, 0, 1, 'local', 0, 0)", (g,))
    heads = dict.fromkeys(gids, 0)
    # Build rows first (ids like ours: 30-char prefixed ids; random envelope bytes of the real size).
    prepared = []
    for i in range(rows):
        g = gids[i % groups_n]
        heads[g] += 1
        cid = ids.new_id("cmd")
        prepared.append(
            (
                g,
                heads[g],
                ids.new_id("evt"),
                "message_posted",
                cid,
                1_700_000_000_000_000 + i,
                os.urandom(envelope_len),
            )
        )
    t0 = time.perf_counter()
    for start in range(0, rows, batch):
        chunk = prepared[start : start + batch]
        db.execute("BEGIN")
        if full_write_set:
            for r in chunk:
                db.execute(
                    "UPDATE groups SET head_seq=?, lease_expires_us=? WHERE group_id=? AND writer_epoch=1 AND head_seq=?",
                    (r[1], r[5], r[0], r[1] - 1),
                )
        db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", chunk)
        if full_write_set:
            db.executemany(
                "INSERT INTO commands VALUES (?, ?, ?, ?, ?, 1)",
                [(r[0], r[4], r[6][:32], r[1], r[1]) for r in chunk],
            )
        db.execute("COMMIT")
    el = time.perf_counter() - t0
    db.close()
    return rows / el, rows


# ====================================================================== the driver


async def measure(
    args: argparse.Namespace, work: Path, topo: Topology, data_dir: Path, database_url: str, fresh: bool
) -> dict[str, object]:
    """One topology: our three phases, then the echo anchor's three beside them (same sizes, same
    concurrency), so every topology has its own anchor from the same minutes of the run."""
    from nacl.signing import SigningKey

    from missionweave.kernel import ids
    from missionweave.kernel.clock import SystemClock
    from missionweave.kernel.signing import pae, read_key
    from missionweave.sdk.client import MeshClient
    from missionweave.v1 import authority_service_pb2 as pb
    from missionweave.v1 import common_pb2
    from tests import builders

    results: dict[str, object] = {"topology": topo}
    run_id = ids.new_id("b")[2:10]
    pg_database = database_name(database_url) if database_url else ""

    # ------------------------------------------------------------ our server
    store = "PostgreSQL" if database_url else "SQLite"
    results["store"] = "PostgreSQL" if database_url else "SQLite (WAL, synchronous=FULL)"
    profile_out = work / "server.prof"
    mesh: Child | None = None
    split: SplitMesh | None = None
    if topo.shards == 0:
        log(f"[{topo.label}] starting our server ({store} store) in a separate process")
        mesh = spawn_mesh(
            data_dir,
            work,
            database_url,
            profile_out if args.profile_server else None,
            stderr_name=f"{topo.slug}.stderr",
        )
        tree = ProcTree(mesh.proc.pid, "mesh", pg_database=pg_database)
        port = mesh.port
        log(f"  server pid {mesh.proc.pid}, port {port}")
    else:
        log(f"[{topo.label}] starting mwp serve --topology split --shards {topo.shards} ({store} store)")
        split = SplitMesh(topo.shards, data_dir, work / f"{topo.slug}.stderr", database_url)
        tree = ProcTree(split.proc.pid, "launcher", split.names, pg_database=pg_database)
        port = split.port
        log(
            f"  launcher pid {split.proc.pid}, gateway (the one address) on port {port}: {len(tree.labels())} processes"
        )
    results["processes"] = sorted(tree.labels().values())
    try:
        target = f"127.0.0.1:{port}"
        client = MeshClient(target)
        admin_key_path = data_dir / "keys" / "admin.key"
        if not admin_key_path.exists():
            raise SystemExit(
                f"no admin key at {admin_key_path}: pass --data-dir of the server that bootstrapped this database"
            )
        admin_key = read_key(admin_key_path)
        owner = "alice" if fresh else f"alice-{run_id}"
        coordinator = "coordinator-bot" if fresh else f"coordinator-bot-{run_id}"
        owner_key, bot_key = SigningKey.generate(), SigningKey.generate()
        await client.register_identity(
            "admin", admin_key, owner, common_pb2.IDENTITY_KIND_HUMAN, bytes(owner_key.verify_key)
        )
        await client.register_identity(
            "admin", admin_key, coordinator, common_pb2.IDENTITY_KIND_AGENT, bytes(bot_key.verify_key)
        )
        alice = await client.open_session(owner, owner_key)

        log(f"creating {args.groups} Groups with mission_create (owner {owner})")
        group_ids = [f"grp_bench_{run_id}_{g:03d}" for g in range(args.groups)]
        now = SystemClock().now()

        created_events = 0

        async def create(gid: str) -> str:
            nonlocal created_events
            cmd = alice.command(gid, "mission_create", builders.mission_create(owner, coordinator, now))
            result = await client.execute(alice.sign(cmd))
            created_events += result.group_revision
            st = await client.group_state(gid)
            return st.mission.planning_conversation_id

        conv: dict[str, str] = {}
        for start in range(0, len(group_ids), 16):
            chunk = group_ids[start : start + 16]
            for gid, cid in zip(chunk, await asyncio.gather(*(create(g) for g in chunk)), strict=True):
                if not cid:
                    raise RuntimeError(f"group {gid} has no planning conversation")
                conv[gid] = cid

        # ------------------------------------------------------------ pre-built, pre-signed commands
        warm = min(500, max(50, args.commands // 20))
        warm -= warm % args.batch  # whole batches
        total = 3 * (args.commands + warm)
        log(f"building and signing {total:,} message_post commands (outside the timed loops)")
        t0 = time.perf_counter()
        envelopes = []
        for i in range(total):
            gid = group_ids[i % len(group_ids)]
            cmd = alice.command(
                gid, "message_post", builders.message(conv[gid], f"benchmark message {i}"), membership_epoch=1
            )
            envelopes.append(alice.sign(cmd))
        sign_s = time.perf_counter() - t0
        results["client_sign_rate"] = total / sign_s
        log(f"  signed {total:,} in {sign_s:.1f}s ({total / sign_s:,.0f}/s client-side build+sign)")
        n, w = args.commands, warm
        unary_warm = [pb.ExecuteCommandRequest(command=e) for e in envelopes[0:w]]
        unary_reqs = [pb.ExecuteCommandRequest(command=e) for e in envelopes[w : w + n]]
        off = w + n
        stream_warm = [
            pb.ExecuteCommandStreamRequest(command=e, request_tag=i + 1)
            for i, e in enumerate(envelopes[off : off + w])
        ]
        stream_reqs = [
            pb.ExecuteCommandStreamRequest(command=e, request_tag=i + 1)
            for i, e in enumerate(envelopes[off + w : off + w + n])
        ]
        off += w + n

        def batches(envs: list[Any]) -> list[Any]:
            return [
                pb.ExecuteCommandBatchRequest(
                    commands=[
                        pb.ExecuteCommandStreamRequest(command=e, request_tag=j)
                        for j, e in enumerate(envs[i : i + args.batch])
                    ]
                )
                for i in range(0, len(envs) - args.batch + 1, args.batch)
            ]

        batch_warm = batches(envelopes[off : off + w])
        batch_reqs = batches(envelopes[off + w : off + w + n])
        del envelopes

        # One real result fixes the response sizes for the echo anchor.
        probe = await client.authority.ExecuteCommand(unary_warm[0])
        unary_warm = unary_warm[1:]
        if probe.result.group_revision < 2 or len(probe.result.events) != 1:
            raise RuntimeError(f"unexpected probe result: {probe}")
        request_bytes = statistics.mean(len(r.SerializeToString()) for r in unary_reqs[:200])
        response_bytes = len(probe.SerializeToString())
        stream_rest = pb.ExecuteCommandStreamResponse(
            command_id=probe.result.command_id, result=probe.result
        ).SerializeToString()
        batch_response = pb.ExecuteCommandBatchResponse(
            results=[
                pb.ExecuteCommandStreamResponse(
                    request_tag=j, command_id=probe.result.command_id, result=probe.result
                )
                for j in range(args.batch)
            ]
        ).SerializeToString()
        command_payload = len(unary_reqs[0].command.payload)
        event_envelope = len(probe.result.events[0].SerializeToString())
        pae_len = len(pae(unary_reqs[0].command.payload_type, unary_reqs[0].command.payload))
        results.update(
            request_bytes=request_bytes,
            response_bytes=response_bytes,
            command_payload=command_payload,
            event_envelope=event_envelope,
            pae_bytes=pae_len,
        )
        log(
            f"  sizes: request {request_bytes:.0f} B, response {response_bytes} B, command payload {command_payload} B, "
            f"event envelope {event_envelope} B"
        )

        stub = client.authority

        def ok_unary(resp: pb.ExecuteCommandResponse) -> bool:
            return resp.result.group_revision > 0 and not resp.result.replayed

        def ok_stream(resp: pb.ExecuteCommandStreamResponse) -> bool:
            return resp.WhichOneof("outcome") == "result" and not resp.result.replayed

        def ok_batch(resp: pb.ExecuteCommandBatchResponse) -> bool:
            return len(resp.results) == args.batch and all(ok_stream(a) for a in resp.results)

        # ------------------------------------------------------------ ours, unary
        log(f"ours, unary: warm-up {len(unary_warm)} then {n:,} commands, {args.clients} concurrent clients")
        acked = (
            1
            + (
                await run_unary("warm-up", stub.ExecuteCommand, unary_warm, args.clients, args.max_seconds)
            ).done
        )
        _profile_toggle(mesh, args)
        ours_unary = await run_unary(
            "ours unary",
            stub.ExecuteCommand,
            unary_reqs,
            args.clients,
            args.max_seconds,
            ok_unary,
            tree,
        )
        _profile_toggle(mesh, args)
        log("  " + ours_unary.line())

        # ------------------------------------------------------------ ours, streamed
        log(
            f"ours, streamed: warm-up {len(stream_warm)} then {n:,} commands, {args.streams} streams x {args.window} in flight"
        )
        acked += (
            await run_streamed(
                "warm-up", stub.ExecuteCommandStream, stream_warm, args.streams, args.window, args.max_seconds
            )
        ).done
        _profile_toggle(mesh, args)
        ours_stream = await run_streamed(
            "ours streamed",
            stub.ExecuteCommandStream,
            stream_reqs,
            args.streams,
            args.window,
            args.max_seconds,
            ok_stream,
            tree,
        )
        _profile_toggle(mesh, args)
        log("  " + ours_stream.line())

        # ------------------------------------------------------------ ours, batched
        log(
            f"ours, batched: warm-up {len(batch_warm) * args.batch} then {len(batch_reqs) * args.batch:,} commands, "
            f"{args.batch} per call, {args.batch_calls} calls in flight"
        )
        acked += (
            await run_unary(
                "warm-up",
                stub.ExecuteCommandBatch,
                batch_warm,
                args.batch_calls,
                args.max_seconds,
                per_call=args.batch,
            )
        ).done
        _profile_toggle(mesh, args)
        ours_batch = await run_unary(
            "ours batched",
            stub.ExecuteCommandBatch,
            batch_reqs,
            args.batch_calls,
            args.max_seconds,
            ok_batch,
            tree,
            per_call=args.batch,
        )
        _profile_toggle(mesh, args)
        log("  " + ours_batch.line())

        # Cross-check with the server's own view: every accepted command is one event in the logs.
        heads = await asyncio.gather(*(client.group_state(g) for g in group_ids))
        results["log_check"] = (
            sum(h.head_sequence for h in heads),
            created_events + acked + ours_unary.done + ours_stream.done + ours_batch.done,
        )
        await client.channel.close()
    finally:
        out = mesh.stop() if mesh is not None else (split.stop() if split is not None else "")
    stats = [line for line in out.splitlines() if line.startswith("STATS")]
    results["server_stats"] = stats[0][6:] if stats else ""
    if args.profile_server and profile_out.exists():
        results["profile"] = profile_out

    # ------------------------------------------------------------ echo anchors
    log("starting the echo anchor server in a separate process")
    echo = spawn_echo(work, probe.SerializeToString(), stream_rest, batch_response)
    try:
        channel = open_channel(f"127.0.0.1:{echo.port}", options=GRPC_OPTIONS)
        echo_call = echo_unary_call(channel)
        echo_streams = echo_stream_call(channel)
        log(f"echo, unary: {n:,} calls, {args.clients} concurrent clients")
        await run_unary("warm-up", echo_call, unary_warm, args.clients, args.max_seconds)
        echo_unary = await run_unary(
            "echo unary", echo_call, unary_reqs, args.clients, args.max_seconds, ok_unary, echo.proc.pid
        )
        log("  " + echo_unary.line())
        log(f"echo, streamed: {n:,} calls, {args.streams} streams x {args.window} in flight")
        await run_streamed("warm-up", echo_streams, stream_warm, args.streams, args.window, args.max_seconds)
        echo_stream = await run_streamed(
            "echo streamed",
            echo_streams,
            stream_reqs,
            args.streams,
            args.window,
            args.max_seconds,
            ok_stream,
            echo.proc.pid,
        )
        log("  " + echo_stream.line())
        echo_batch_call = channel.unary_unary(
            ECHO_BATCH,
            request_serializer=pb.ExecuteCommandBatchRequest.SerializeToString,
            response_deserializer=pb.ExecuteCommandBatchResponse.FromString,
        )
        log(
            f"echo, batched: {len(batch_reqs) * args.batch:,} commands, {args.batch} per call, {args.batch_calls} in flight"
        )
        await run_unary(
            "warm-up", echo_batch_call, batch_warm, args.batch_calls, args.max_seconds, per_call=args.batch
        )
        echo_batch = await run_unary(
            "echo batched",
            echo_batch_call,
            batch_reqs,
            args.batch_calls,
            args.max_seconds,
            ok_batch,
            echo.proc.pid,
            per_call=args.batch,
        )
        log("  " + echo_batch.line())
        await channel.close()
    finally:
        echo.stop()

    results.update(
        ours_unary=ours_unary,
        ours_stream=ours_stream,
        ours_batch=ours_batch,
        echo_unary=echo_unary,
        echo_stream=echo_stream,
        echo_batch=echo_batch,
    )
    return results


async def drive(args: argparse.Namespace, work: Path) -> dict[str, object]:
    """Every topology of ``--topologies`` in turn (each with its echo anchor beside it), then the
    SQLite and Ed25519 anchors once."""
    topologies: list[Topology] = args.topology_list
    stores = TopologyStores(topologies, args.database_url, args.data_dir, work)
    tuning = sorted(
        k for k in os.environ if k.startswith("MWP_") and k not in ("MWP_BENCH_POSTGRES_URL", "MWP_LOG_LEVEL")
    )
    if tuning and any(t.shards for t in topologies):
        log(
            f"NOTE: {', '.join(tuning)} reach the single-process server only: the split launcher passes no MWP_* tuning to its children"
        )
    measured: list[dict[str, object]] = []
    try:
        for topo in topologies:
            if topo.skip:
                continue
            set_progress_prefix(f"[{topo.name}] ")
            data_dir, url, fresh = stores.place(topo)
            try:
                measured.append(await measure(args, work, topo, data_dir, url, fresh))
            except Exception as exc:  # one topology failing must not lose the others' figures
                topo.skip = f"failed: {exc!r}"[:2000]
                log(f"{topo.label} FAILED: {exc!r}")
    finally:
        set_progress_prefix("")
        stores.close()
    if not measured:
        raise SystemExit("no topology could be measured")

    # ------------------------------------------------------------ SQLite and Ed25519 anchors
    first = measured[0]
    n = args.commands
    batch = args.clients
    sqlite_rows = max(2000, min(n, 20000))
    log(f"SQLite anchor: {sqlite_rows:,} event rows, batches of {batch}, WAL, synchronous=FULL")
    sq_rate, _ = sqlite_anchor(
        work / "anchor.db", sqlite_rows, batch, int(first["event_envelope"]), full_write_set=False
    )  # type: ignore[call-overload]
    sq_full_rate, _ = sqlite_anchor(
        work / "anchor_full.db",
        sqlite_rows,
        batch,
        int(first["event_envelope"]),
        full_write_set=True,  # type: ignore[call-overload]
    )
    log(
        f"  {sq_rate:,.0f} event rows/s; whole write set (head update + event + command row): {sq_full_rate:,.0f}/s"
    )
    log("Ed25519 anchor: PyNaCl sign + verify pairs")
    ed_rate, _ = ed25519_anchor(int(first["pae_bytes"]), 1.0 if args.quick else 2.0)  # type: ignore[call-overload]
    log(f"  {ed_rate:,.0f} sign+verify/s")
    anchors = dict(
        sqlite_rate=sq_rate,
        sqlite_full_rate=sq_full_rate,
        sqlite_batch=batch,
        sqlite_rows=sqlite_rows,
        ed25519_rate=ed_rate,
    )
    for r in measured:
        r.update(anchors)
    return {"measured": measured, "topologies": topologies}


def _profile_toggle(mesh: Child | None, args: argparse.Namespace) -> None:
    if args.profile_server and mesh is not None:
        os.kill(mesh.proc.pid, signal.SIGUSR1)


def report(args: argparse.Namespace, r: dict[str, object]) -> None:
    ou: Run = r["ours_unary"]  # type: ignore[assignment]
    os_: Run = r["ours_stream"]  # type: ignore[assignment]
    eu: Run = r["echo_unary"]  # type: ignore[assignment]
    es: Run = r["echo_stream"]  # type: ignore[assignment]
    ob: Run = r["ours_batch"]  # type: ignore[assignment]
    eb: Run = r["echo_batch"]  # type: ignore[assignment]
    sq, sqf, ed = float(r["sqlite_rate"]), float(r["sqlite_full_rate"]), float(r["ed25519_rate"])  # type: ignore[arg-type]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.0%}" if b else "n/a"

    store = f"{r['store']}, topology {cast(Topology, r['topology']).label}"
    print()
    print(
        f"MissionWeave authority benchmark - {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, grpcio {grpc.__version__}"
    )
    print(
        f"store: {store}; {args.groups} Groups; unary: {args.clients} concurrent clients; "
        f"streamed: {args.streams} streams x {args.window} in flight; batched: {args.batch} per call x "
        f"{args.batch_calls} calls in flight; {args.commands:,} commands per phase"
    )
    print(
        f"message_post request {r['request_bytes']:.0f} B (command payload {r['command_payload']} B), "
        f"response {r['response_bytes']} B, stored event envelope {r['event_envelope']} B"
    )
    print(
        "client-side command build + Ed25519 signing is done before the timed loops (all commands pre-signed; "
        f"the client signs {r['client_sign_rate']:,.0f}/s on its own); server and client are separate processes."
    )
    print()
    rows = [
        (
            "ours, unary ExecuteCommand",
            f"{ou.rate:,.0f} cmd/s",
            f"{ou.pct(50):.1f}",
            f"{ou.pct(99):.1f}",
            f"{ou.errors}",
        ),
        (
            "ours, streamed ExecuteCommandStream",
            f"{os_.rate:,.0f} cmd/s",
            f"{os_.pct(50):.1f}",
            f"{os_.pct(99):.1f}",
            f"{os_.errors}",
        ),
        (
            f"ours, batched ExecuteCommandBatch ({args.batch}/call)",
            f"{ob.rate:,.0f} cmd/s",
            f"{ob.pct(50):.1f}",
            f"{ob.pct(99):.1f}",
            f"{ob.errors}",
        ),
        (
            "anchor: echo, unary",
            f"{eu.rate:,.0f} calls/s",
            f"{eu.pct(50):.1f}",
            f"{eu.pct(99):.1f}",
            f"{eu.errors}",
        ),
        (
            "anchor: echo, streamed",
            f"{es.rate:,.0f} calls/s",
            f"{es.pct(50):.1f}",
            f"{es.pct(99):.1f}",
            f"{es.errors}",
        ),
        (
            f"anchor: echo, batched ({args.batch}/call)",
            f"{eb.rate:,.0f} cmds/s",
            f"{eb.pct(50):.1f}",
            f"{eb.pct(99):.1f}",
            f"{eb.errors}",
        ),
        (f"anchor: SQLite event rows, batch {r['sqlite_batch']}", f"{sq:,.0f} rows/s", "", "", ""),
        ("  (whole write set: head+event+command)", f"{sqf:,.0f} cmds/s", "", "", ""),
        ("anchor: Ed25519 sign+verify (PyNaCl)", f"{ed:,.0f} pairs/s", "", "", ""),
    ]
    w = max(len(x[0]) for x in rows)
    print(f"{'figure':<{w}}  {'value':>16}  {'p50 ms':>7}  {'p99 ms':>7}  {'errors':>6}")
    print("-" * (w + 44))
    for name, value, p50, p99, err in rows:
        print(f"{name:<{w}}  {value:>16}  {p50:>7}  {p99:>7}  {err:>6}")
    print()
    ratios = [
        ("ours unary / echo unary", ratio(ou.rate, eu.rate)),
        ("ours streamed / echo streamed", ratio(os_.rate, es.rate)),
        ("ours streamed / echo unary", ratio(os_.rate, eu.rate)),
        ("ours batched / echo batched", ratio(ob.rate, eb.rate)),
        ("ours batched / echo unary", ratio(ob.rate, eu.rate)),
        ("ours batched / SQLite whole write set", ratio(ob.rate, sqf)),
        ("ours unary / SQLite event rows", ratio(ou.rate, sq)),
        ("ours streamed / SQLite event rows", ratio(os_.rate, sq)),
        ("ours streamed / SQLite whole write set", ratio(os_.rate, sqf)),
        ("ours unary / Ed25519 sign+verify", ratio(ou.rate, ed)),
        ("ours streamed / Ed25519 sign+verify", ratio(os_.rate, ed)),
    ]
    w2 = max(len(x[0]) for x in ratios)
    print(f"{'ours / anchor':<{w2}}  ratio")
    print("-" * (w2 + 8))
    for name, value in ratios:
        print(f"{name:<{w2}}  {value:>6}")
    print()

    def verdict(ok: bool) -> str:
        return "MET" if ok else "NOT MET"

    u_ok = eu.rate and ou.rate / eu.rate >= FIRST_TARGET_RATIO and ou.pct(99) < FIRST_TARGET_P99_MS
    s_ok = es.rate and os_.rate / es.rate >= FIRST_TARGET_RATIO and os_.pct(99) < FIRST_TARGET_P99_MS
    g_ok = es.rate and os_.rate / es.rate >= GOAL_RATIO and os_.rate >= GOAL_RATE
    b_ok = eb.rate and ob.rate / eb.rate >= FIRST_TARGET_RATIO and ob.pct(99) < FIRST_TARGET_P99_MS
    gb_ok = eb.rate and ob.rate / eb.rate >= GOAL_RATIO and ob.rate >= GOAL_RATE
    gbu_ok = eu.rate and ob.rate / eu.rate >= GOAL_RATIO and ob.rate >= GOAL_RATE
    su_ok = eu.rate and os_.rate / eu.rate >= FIRST_TARGET_RATIO and os_.pct(99) < FIRST_TARGET_P99_MS
    bu_ok = eu.rate and ob.rate / eu.rate >= FIRST_TARGET_RATIO and ob.pct(99) < FIRST_TARGET_P99_MS
    print("targets (issue #2):")
    print(
        f"  first target, unary:    >= {FIRST_TARGET_RATIO:.0%} of echo and p99 < {FIRST_TARGET_P99_MS:.0f} ms: "
        f"{ratio(ou.rate, eu.rate)} of echo, p99 {ou.pct(99):.1f} ms -> {verdict(bool(u_ok))}"
    )
    print(
        f"  first target, streamed: >= {FIRST_TARGET_RATIO:.0%} of echo and p99 < {FIRST_TARGET_P99_MS:.0f} ms: "
        f"{ratio(os_.rate, es.rate)} of echo, p99 {os_.pct(99):.1f} ms -> {verdict(bool(s_ok))}"
    )
    print(
        f"  goal, streamed:         >= {GOAL_RATIO:.0%} of echo and >= {GOAL_RATE:,.0f} cmd/s: "
        f"{ratio(os_.rate, es.rate)} of echo, {os_.rate:,.0f} cmd/s -> {verdict(bool(g_ok))}"
    )
    print(
        f"  first target, batched:  >= {FIRST_TARGET_RATIO:.0%} of echo batched and p99 < {FIRST_TARGET_P99_MS:.0f} ms: "
        f"{ratio(ob.rate, eb.rate)} of echo, p99 {ob.pct(99):.1f} ms -> {verdict(bool(b_ok))}"
    )
    print(
        f"  goal, batched:          >= {GOAL_RATIO:.0%} of echo batched and >= {GOAL_RATE:,.0f} cmd/s: "
        f"{ratio(ob.rate, eb.rate)} of echo, {ob.rate:,.0f} cmd/s -> {verdict(bool(gb_ok))}"
    )
    print(
        "  against the transport's per-call limit (echo unary), which the streamed and batched paths amortise:"
    )
    print(
        f"  first target, streamed: >= {FIRST_TARGET_RATIO:.0%} of echo unary and p99 < {FIRST_TARGET_P99_MS:.0f} ms: "
        f"{ratio(os_.rate, eu.rate)}, p99 {os_.pct(99):.1f} ms -> {verdict(bool(su_ok))}"
    )
    print(
        f"  first target, batched:  >= {FIRST_TARGET_RATIO:.0%} of echo unary and p99 < {FIRST_TARGET_P99_MS:.0f} ms: "
        f"{ratio(ob.rate, eu.rate)}, p99 {ob.pct(99):.1f} ms -> {verdict(bool(bu_ok))}"
    )
    print(
        f"  goal, batched:          >= {GOAL_RATIO:.0%} of echo unary and >= {GOAL_RATE:,.0f} cmd/s: "
        f"{ratio(ob.rate, eu.rate)}, {ob.rate:,.0f} cmd/s -> {verdict(bool(gbu_ok))}"
    )
    print()
    logged, expected = cast(tuple[int, int], r["log_check"])
    stats = dict(kv.split("=") for kv in str(r["server_stats"]).split())
    if stats.get("batches") and int(stats["batches"]):
        r["server_stats"] = (
            f"{r['server_stats']} (mean group-commit batch {int(stats['appends']) / int(stats['batches']):.1f} appends)"
        )
    print(
        f"server check: sum of Group heads {logged:,} vs events acknowledged to this client {expected:,} "
        f"-> {'consistent' if logged == expected else 'MISMATCH'}; server store {r['server_stats']}"
    )
    print("CPU per phase (server: every process of the topology / client process):")
    for run in (ou, os_, ob, eu, es, eb):
        print(f"  {run.name:<14} {run.cpu_line()}")
    for run in (ou, os_, ob, eu, es, eb):
        if run.first_error:
            print(f"  first error in {run.name}: {run.first_error}")


PHASES = (
    ("unary", "ours_unary", "echo_unary"),
    ("streamed", "ours_stream", "echo_stream"),
    ("batched", "ours_batch", "echo_batch"),
)


def _table(header: list[str], rows: list[list[str]], first_left: bool = True) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            (c.ljust(w) if (k == 0 and first_left) else c.rjust(w))
            for k, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(fmt(header))
    print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    for row in rows:
        print(fmt(row))


def _role(label: str) -> str:
    """A process name's role in the projection: gateway, shard (an Authority's main process),
    verify (a signature worker), writer (a SQLite writer process), mesh (the single process) or other."""
    base, _, sub = label.partition("/")
    if sub:
        return {"verify_worker": "verify", "writer_process": "writer"}.get(sub.split("/")[-1], "other")
    if base.startswith("authority-"):
        return "shard"
    return base if base in ("gateway", "mesh") else "other"


def projection(run: Metered, shards: int, cores: int, to_shards: int) -> float:
    """Commands/s if each process's CPU per command stays as measured, ``to_shards`` Authority shards
    split the shards' (and their workers') share as unevenly as measured, every process can use at most one core
    (one event loop each) and the mesh's processes have ``cores`` cores to themselves (the client
    and PostgreSQL elsewhere). A CPU ceiling only: latency and concurrency bound the rate as well."""
    if not run.done or not run.server_cpu_by:
        return float("nan")
    per_role: dict[str, list[float]] = {}
    for label, cpu in run.server_cpu_by.items():
        if cpu > 0:
            per_role.setdefault(_role(label), []).append(run.us(cpu))
    ceilings = [cores * 1e6 / run.us(run.server_cpu)]
    for role, costs in per_role.items():
        if role in ("shard", "verify", "writer") and shards:
            # to_shards processes of this role, as unevenly loaded as the measured ones (the busiest
            # sets the ceiling: Groups are placed by hash, not balanced)
            ceilings.append(to_shards * 1e6 / (max(costs) * len(costs)))
        else:
            ceilings.append(1e6 / max(costs))
    return min(ceilings)


def process_rows(runs: list[Metered]) -> list[list[str]]:
    """One row per process of the topology, then the PostgreSQL backends, the client, their sum and
    the whole machine; one column per run: % of one core (us per completed unit)."""
    cpus = os.cpu_count() or 1
    labels = sorted({label for run in runs for label in run.server_cpu_by})

    def share(run: Metered, cpu: float) -> str:
        return f"{cpu / run.seconds:.0%} ({run.us(cpu):,.0f})" if run.seconds else ""

    rows = [[label, *(share(run, run.server_cpu_by.get(label, 0.0)) for run in runs)] for label in labels]
    if any(run.pg_cpu is not None for run in runs):
        rows.append([ProcTree.PG, *(share(run, run.pg_cpu or 0.0) for run in runs)])
    rows.append(["client (this process)", *(share(run, run.client_cpu) for run in runs)])
    rows.append(
        [
            "= ours (server + client + PG)",
            *(
                f"{(run.server_cpu + run.client_cpu + (run.pg_cpu or 0)) / run.seconds:.0%}"
                if run.seconds
                else ""
                for run in runs
            ),
        ]
    )
    rows.append(
        [
            f"machine busy, all users ({cpus} cores = {cpus * 100}%)",
            *(f"{run.machine_cores:.0%}" if run.machine_cores is not None else "n/a" for run in runs),
        ]
    )
    return rows


def report_topologies(
    args: argparse.Namespace, measured: list[dict[str, object]], topologies: list[Topology]
) -> None:
    print()
    print("=" * 100)
    print(
        f"Topologies ({len(measured)} measured in this run, each with the echo anchor measured just after it; "
        "server CPU = every process of the topology, PostgreSQL backends apart)"
    )
    for topo in topologies:
        if topo.skip:
            print(f"  {topo.label}: NOT MEASURED - {topo.skip}")
    for r in measured:
        topo = cast(Topology, r["topology"])
        logged, expected = cast(tuple[int, int], r["log_check"])
        print()
        print(f"{topo.label}: processes {', '.join(cast(list[str], r['processes']))}")
        print(
            f"  check: sum of Group heads {logged:,} vs events acknowledged {expected:,} -> "
            f"{'consistent' if logged == expected else 'MISMATCH'}"
        )
        rows = []
        for phase, ours_key, echo_key in PHASES:
            o, e = cast(Run, r[ours_key]), cast(Run, r[echo_key])
            main = o.server_cpu_by.get("mesh", o.server_cpu_by.get("gateway"))
            rows.append(
                [
                    phase,
                    f"{o.rate:,.0f}",
                    f"{o.pct(50):.1f} / {o.pct(99):.1f}",
                    f"{o.us(o.server_cpu):,.0f}",
                    f"{o.us(main):,.0f}" if main is not None else "",
                    f"{o.us(o.pg_cpu):,.0f}" if o.pg_cpu is not None else "",
                    f"{o.us(o.client_cpu):,.0f}",
                    f"{e.rate:,.0f}",
                    f"{o.rate / e.rate:.0%}" if e.rate else "n/a",
                    f"{o.rate / cast(Run, r['echo_unary']).rate:.0%}"
                    if phase != "unary" and cast(Run, r["echo_unary"]).rate
                    else "",
                    f"{o.machine_cores:.0%}" if o.machine_cores is not None else "n/a",
                    f"{o.errors}",
                ]
            )
        columns = "phase,cmd/s,p50 / p99 ms,server us/cmd,mesh/gw,PG us,client us,echo /s,% echo,% echo unary,machine,errors"
        _table(columns.split(","), rows)

    # ------------------------------------------------------------ side by side
    print()
    print(
        "side by side: cmd/s (% of the echo of the same phase measured beside it) | server CPU us per command"
    )
    header = ["phase", *(cast(Topology, r["topology"]).label for r in measured)]
    rows = []
    for phase, ours_key, echo_key in PHASES:
        row = [phase]
        for r in measured:
            o, e = cast(Run, r[ours_key]), cast(Run, r[echo_key])
            pct = f"{o.rate / e.rate:.0%}" if e.rate else "n/a"
            row.append(f"{o.rate:,.0f} ({pct}) | {o.us(o.server_cpu):,.0f}")
        rows.append(row)
    rows.append(["echo unary", *(f"{cast(Run, r['echo_unary']).rate:,.0f}/s" for r in measured)])
    _table(header, rows)

    # ------------------------------------------------------------ hop cost and shard gain
    by = {(cast(Topology, r["topology"]).name, cast(Topology, r["topology"]).store): r for r in measured}
    pairs = [
        (what, by[(a.name, a.store)], by[(b.name, b.store)])
        for what, a, b in comparisons([cast(Topology, r["topology"]) for r in measured])
    ]
    if pairs:
        print()
        print(
            "what the topology costs or gains (same store, same run; rate as measured and as % of each side's own echo):"
        )
        rows = []
        for what, a, b in pairs:
            ta, tb = cast(Topology, a["topology"]), cast(Topology, b["topology"])
            for phase, ours_key, echo_key in PHASES:
                oa, ob = cast(Run, a[ours_key]), cast(Run, b[ours_key])
                ea, eb = cast(Run, a[echo_key]), cast(Run, b[echo_key])
                ra = oa.rate / ea.rate if ea.rate else float("nan")
                rb = ob.rate / eb.rate if eb.rate else float("nan")
                rows.append(
                    [
                        f"{what}: {ta.label} -> {tb.label}",
                        phase,
                        f"{oa.rate:,.0f} -> {ob.rate:,.0f} ({ob.rate / oa.rate - 1:+.0%})"
                        if oa.rate
                        else "n/a",
                        f"{ra:.0%} -> {rb:.0%}",
                        f"{oa.pct(50):.1f} -> {ob.pct(50):.1f}",
                        f"{oa.pct(99):.1f} -> {ob.pct(99):.1f}",
                        f"{oa.us(oa.server_cpu):,.0f} -> {ob.us(ob.server_cpu):,.0f} ({ob.us(ob.server_cpu) - oa.us(oa.server_cpu):+,.0f})",
                    ]
                )
        _table(["comparison", "phase", "cmd/s", "% of echo", "p50 ms", "p99 ms", "server us/cmd"], rows)

    # ------------------------------------------------------------ per-process breakdown
    cpus = os.cpu_count() or 1
    print()
    print(f"per-process CPU, % of one core (us per command), this machine: {cpus} CPUs")
    if any(cast(Run, r["ours_unary"]).pg_cpu is not None for r in measured):
        print(
            "(postgres backends: those serving the bench's database at the phase's end; a backend that exited during the\n"
            " phase, e.g. a pool overflow connection closed on return, is not counted: a lower bound)"
        )
    for r in measured:
        topo = cast(Topology, r["topology"])
        rows = process_rows([cast(Run, r[k]) for _, k, _ in PHASES])
        print()
        print(topo.label)
        _table(["process", *(p for p, _, _ in PHASES)], rows)

    # ------------------------------------------------------------ projection
    print()
    print(
        "projection: CPU ceiling in cmd/s if each process's CPU per command stays as measured, every process can use one core\n"
        "(one event loop each), Authority shards (with their workers) split their share as unevenly as measured, the mesh's processes have\n"
        "N cores to themselves (client and PostgreSQL elsewhere). Not a forecast: latency, concurrency and the database bound it too.\n"
        "From split-1, more shards keep its stream and batch forwarding; with 2+ shards the gateway splits those per command (read split-2's)."
    )
    for r in measured:
        topo = cast(Topology, r["topology"])
        shard_counts = [0] if topo.shards == 0 else sorted({topo.shards, 1, 2, 4, 8})
        rows = []
        for phase, ours_key, _ in PHASES:
            run = cast(Run, r[ours_key])
            busiest = max(run.server_cpu_by.items(), key=lambda kv: kv[1], default=("", 0.0))
            for k in shard_counts:
                rows.append(
                    [
                        phase,
                        "-" if k == 0 else f"{k}{' (measured)' if k == topo.shards else ''}",
                        f"{busiest[0]} {busiest[1] / run.seconds:.0%}" if run.seconds else "",
                        *(f"{projection(run, topo.shards, c, k or 1):,.0f}" for c in (2, 4, 8, 16)),
                    ]
                )
        print()
        print(
            f"{topo.label} (measured: {', '.join(f'{p} {cast(Run, r[k]).rate:,.0f}' for p, k, _ in PHASES)} cmd/s)"
        )
        _table(["phase", "shards", "busiest process", "2 cores", "4 cores", "8 cores", "16 cores"], rows)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--commands", type=int, default=20000, help="commands per phase (default 20000)")
    p.add_argument("--clients", type=int, default=64, help="concurrent unary clients (default 64)")
    p.add_argument("--groups", type=int, default=100, help="Groups the commands spread over (default 100)")
    p.add_argument("--streams", type=int, default=4, help="streams on the streamed path (default 4)")
    p.add_argument("--window", type=int, default=64, help="commands in flight per stream (default 64)")
    p.add_argument("--batch", type=int, default=32, help="commands per ExecuteCommandBatch call (default 32)")
    p.add_argument(
        "--batch-calls",
        type=int,
        default=8,
        help="ExecuteCommandBatch calls in flight (default 8: 256 commands)",
    )
    p.add_argument("--max-seconds", type=float, default=45.0, help="cap on each timed phase (default 45)")
    p.add_argument("--quick", action="store_true", help="small smoke run")
    p.add_argument("--database-url", default="", help="postgresql://... instead of the embedded SQLite store")
    p.add_argument("--data-dir", default="", help="server data dir (default: a temp dir, removed afterwards)")
    p.add_argument(
        "--profile-server", action="store_true", help="cProfile the server during the timed phases"
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (server logs, profile)")
    p.add_argument(
        "--topologies",
        default="single,split-1,split-2",
        help="comma-separated: single, split-N, each optionally :sqlite or :pg (default single,split-1,split-2; "
        "split-N with N > 1 runs on PostgreSQL and brings single:pg and split-1:pg beside it)",
    )
    p.add_argument(
        "--no-pg-baselines",
        action="store_true",
        help="do not add single:pg and split-1:pg beside a split-N on PostgreSQL",
    )
    # internal: child process roles
    p.add_argument("--role", choices=["mesh", "echo"], help=argparse.SUPPRESS)
    p.add_argument("--profile-out", default="", help=argparse.SUPPRESS)
    p.add_argument("--unary-response", default="", help=argparse.SUPPRESS)
    p.add_argument("--stream-response-rest", default="", help=argparse.SUPPRESS)
    p.add_argument("--batch-response", default="", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.role == "mesh":
        asyncio.run(role_mesh(args))
        return 0
    if args.role == "echo":
        asyncio.run(
            role_echo(
                bytes.fromhex(Path(args.unary_response).read_text()),
                bytes.fromhex(Path(args.stream_response_rest).read_text()),
                bytes.fromhex(Path(args.batch_response).read_text()),
            )
        )
        return 0

    args.topology_list = parse_topologies(args.topologies, bool(args.database_url), not args.no_pg_baselines)
    log("topologies: " + ", ".join(t.label for t in args.topology_list))
    if args.quick:
        args.commands = min(args.commands, 2000)
        args.max_seconds = min(args.max_seconds, 20.0)
    work = Path(tempfile.mkdtemp(prefix="mwp-bench-"))
    t0 = time.perf_counter()
    try:
        everything = asyncio.run(drive(args, work))
        measured = cast(list[dict[str, object]], everything["measured"])
        results = measured[0]
        report(args, results)
        report_topologies(args, measured, cast(list[Topology], everything["topologies"]))
        if args.profile_server and results.get("profile"):
            import pstats

            print("\nserver profile (timed phases only), top 35 by cumulative time:")
            pstats.Stats(str(results["profile"])).sort_stats("cumulative").print_stats(35)
            pstats.Stats(str(results["profile"])).sort_stats("tottime").print_stats(25)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    log(f"done in {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
