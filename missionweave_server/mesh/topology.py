"""``mwp serve --topology split``: every service in a process of its own, on one machine, wired
exactly as Kubernetes wires them (docs/kubernetes.md): the gateway on the one address agents and
people use, membership, artifacts, scheduling and N Authority shards on loopback ports of their own,
each told its peers' addresses through the same ``MWP_*_ADDR`` variables.

The launcher holds the data directory (its children are let in by ``MWP_MESH_ID``), waits until
every child reports SERVING, restarts a child that dies (as Kubernetes restarts a pod), stops the
whole mesh (exit 1) if one keeps dying, and forwards SIGTERM/SIGINT to all of them.

Metrics (docs/operations.md): the gateway child serves them on the launcher's MWP_METRICS_LISTEN,
every other child on the ports after it (authority-0..N-1, membership, artifacts, scheduling).

TLS (docs/tls.md): the launcher's TLS settings reach every child. With ``--tls-auto`` it makes a
throw-away mesh CA and a certificate per process in ``<data dir>/tls/`` instead: every process
serves TLS, the back services require client certificates (mTLS) and every process presents its
own (naming its service) to its peers; the gateway, where agents connect, asks for none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from missionweave.kernel.transport import ClientTLS, open_channel
from missionweave_server.config import Settings
from missionweave_server.edge.channels import ListenError, ServerTLS, check_listen
from missionweave_server.mesh import certs
from missionweave_server.mesh.ports import Port, check_ports, serve_ports
from missionweave_server.mesh.server import SERVICE_NAMES
from missionweave_server.observability import grpc_core

log = logging.getLogger("missionweave.topology")

START_TIMEOUT_S = 60.0
RESTART_LIMIT = 5
SHARD_REBALANCE_S = 5.0  # MWP_REBALANCE_INTERVAL_S of the launcher's shards (rebalance.py)
RESTART_WINDOW_S = 60.0
BACK_SERVICES = ("membership", "artifacts", "scheduling")


class TopologyError(Exception):
    """The split topology cannot be started as asked."""


@dataclass
class Child:
    name: str
    services: tuple[str, ...]
    address: str
    env: dict[str, str]
    process: asyncio.subprocess.Process | None = None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def plan(settings: Settings, shards: int, mesh_id: str) -> list[Child]:
    """The processes of the split topology and the environment each is started with."""
    if shards < 1:
        raise TopologyError("--shards must be at least 1")
    if shards > 1 and not settings.database_url.startswith(("postgresql", "postgres")):
        # Shards share the Group table and its fenced ownership leases; on the embedded default
        # one SQLite file with its single writer process per shard is not safe (docs/decisions.md).
        raise TopologyError(
            "more than one Authority shard needs PostgreSQL: set --database-url postgresql://..."
        )
    host = settings.listen.rsplit(":", 1)[0] or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "[::]") else host
    addresses = {name: f"{host}:{_free_port(host)}" for name in BACK_SERVICES}
    shard_addresses = [f"{host}:{_free_port(host)}" for _ in range(shards)]
    common = {
        **_tls_env(settings),
        # Children serve one address each: the launcher's extra listeners are not theirs.
        "MWP_TLS_AUTO": "0",
        "MWP_HEALTH_LISTEN": "",
        "MWP_CONSOLE_LISTEN": "",
        "MWP_DATA_DIR": str(settings.data_dir),
        "MWP_MESH_ID": mesh_id,
        "MWP_LOG_LEVEL": settings.log_level,
        "MWP_LOG_FORMAT": settings.log_format,
        "MWP_AUTHORITY_ADDR": ",".join(shard_addresses),
        # Clients dial the front door: their call proofs name it, and every service accepts that.
        "MWP_AUDIENCE": ",".join(a for a in (settings.audience, settings.listen) if a),
        **{f"MWP_{name.upper()}_ADDR": address for name, address in addresses.items()},
    }
    if settings.database_url:
        common["MWP_DATABASE_URL"] = settings.database_url
    # Shards hand Groups back to where their placement puts them (D275), unless told otherwise.
    rebalance = (
        {}
        if "MWP_REBALANCE_INTERVAL_S" in os.environ
        else {"MWP_REBALANCE_INTERVAL_S": str(SHARD_REBALANCE_S)}
    )
    children = [
        Child(
            f"authority-{i}",
            ("authority",),
            address,
            {"MWP_INSTANCE_ID": f"authority-{i}", "MWP_ADVERTISE_ADDR": address, **rebalance},
        )
        for i, address in enumerate(shard_addresses)
    ]
    children += [Child(name, (name,), address, {}) for name, address in addresses.items()]
    children.append(
        Child(
            "gateway",
            ("gateway",),
            settings.listen,
            {
                "MWP_HEALTH_LISTEN": settings.health_listen,
                "MWP_CONSOLE_LISTEN": settings.console_listen,  # the console relays to the front door
                "MWP_CONSOLE_HOSTS": ",".join(settings.console_hosts),
            },
        )
    )
    metrics = metrics_addresses(settings.metrics_listen, shards)
    for child in children:
        child.env = {
            **common,
            **child.env,
            "MWP_SERVICES": ",".join(child.services),
            "MWP_LISTEN": child.address,
            "MWP_METRICS_LISTEN": metrics[child.name],
        }
    return children


def split_ports(settings: Settings, children: list[Child]) -> list[Port]:
    """Every port the launcher was asked to serve through its children: the gateway's (the one
    address, health, console) and each child's metrics port. The back services' own gRPC ports were
    just picked free by ``plan``."""
    gateway = serve_ports(settings, console=bool(settings.console_listen))
    moved_by = (
        "--metrics-listen or MWP_METRICS_LISTEN: the children serve on the ports from it on, '' for none"
    )
    metrics = [Port(c.env["MWP_METRICS_LISTEN"], f"metrics of {c.name}", moved_by) for c in children]
    return [p for p in gateway if p.role != "metrics"] + metrics


def metrics_addresses(listen: str, shards: int) -> dict[str, str]:
    """Each child's own metrics address, by child name: the launcher's MWP_METRICS_LISTEN for the
    gateway, the ports after it for the others in order (authority-0..N-1, membership, artifacts,
    scheduling); port 0 lets each pick one; empty: none serves metrics. Public so that a tool
    scraping a split mesh (bench/delivery.py) finds each process where the launcher put it."""
    names = ["gateway", *(f"authority-{i}" for i in range(shards)), *BACK_SERVICES]
    if not listen:
        return dict.fromkeys(names, "")
    host, _, port = listen.rpartition(":")
    first = int(port)
    return {name: f"{host}:{first + i if first else 0}" for i, name in enumerate(names)}


def _tls_env(settings: Settings) -> dict[str, str]:
    """The launcher's TLS settings (flags included) as the children's MWP_TLS_* variables; every one
    is set, empty when unset, so nothing of the same name in the environment overrides them."""
    paths = {
        "MWP_TLS_CERT": settings.tls_cert,
        "MWP_TLS_KEY": settings.tls_key,
        "MWP_TLS_CLIENT_CA": settings.tls_client_ca,
        "MWP_TLS_CA": settings.tls_ca,
        "MWP_TLS_CLIENT_CERT": settings.tls_client_cert,
        "MWP_TLS_CLIENT_KEY": settings.tls_client_key,
    }
    env = {name: str(path) if path else "" for name, path in paths.items()}
    env["MWP_TLS_SERVER_NAME"] = settings.tls_server_name
    env["MWP_TLS"] = "1" if settings.tls else "0"
    env["MWP_INSECURE"] = "1" if settings.insecure else "0"
    return env


def auto_tls(settings: Settings, children: list[Child]) -> tuple[ClientTLS, Path]:
    """``--tls-auto``: a certificate per child from the data dir's mesh CA, naming its service, set in
    its environment (mTLS everywhere but at the gateway); the launcher's own client TLS, and the CA."""
    directory = certs.tls_dir(settings.data_dir)
    ca = certs.ensure_ca(directory)
    ca_file = directory / "ca.crt"
    for child in children:
        service = child.services[0]
        cert, key = certs.issue(ca, child.name, hosts=certs.hosts_for(child.address), service=service).write(
            directory, child.name
        )
        child.env.update(
            {
                "MWP_TLS_CERT": str(cert),
                "MWP_TLS_KEY": str(key),
                # Agents connect to the gateway with no certificate; every other process is reached by peers.
                "MWP_TLS_CLIENT_CA": "" if service == "gateway" else str(ca_file),
                "MWP_TLS_CA": str(ca_file),
                "MWP_TLS_CLIENT_CERT": str(cert),
                "MWP_TLS_CLIENT_KEY": str(key),
                "MWP_TLS_SERVER_NAME": "",
            }
        )
    cert, key = certs.issue(ca, "mwp serve launcher").write(directory, "launcher")  # names no service
    return ClientTLS(ca_file, cert, key), ca_file


def launcher_tls(settings: Settings) -> ClientTLS | None:
    """How the launcher (and every child, with the same settings) dials the processes; refuses a
    configuration under which the processes could not reach one another."""
    server = ServerTLS.from_settings(settings)
    check_listen(settings.listen, server, insecure=settings.insecure)
    client = ClientTLS.from_settings(settings)
    if server is not None and client is None:
        raise TopologyError(
            "the processes of the split topology dial one another with the client TLS settings: with "
            "--tls-cert, also set --tls-ca (MWP_TLS_CA) and, with --tls-client-ca, a client certificate "
            "(--tls-client-cert, --tls-client-key), or use --tls-auto"
        )
    return client


async def _serving(child: Child, deadline: float, tls: ClientTLS | None) -> None:
    service = SERVICE_NAMES[child.services[0]]
    async with open_channel(child.address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            assert child.process is not None
            if child.process.returncode is not None:
                raise TopologyError(
                    f"{child.name} exited with code {child.process.returncode} during start-up "
                    "(its own line above says why): the split topology is stopped"
                )
            with contextlib.suppress(grpc.aio.AioRpcError):
                answer = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            if time.monotonic() > deadline:
                raise TopologyError(f"{child.name} did not report SERVING within {START_TIMEOUT_S:.0f} s")
            await asyncio.sleep(0.2)


async def _stop(children: list[Child], grace: float) -> None:
    running = [c.process for c in children if c.process is not None and c.process.returncode is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    if running:
        _, late = await asyncio.wait([asyncio.create_task(p.wait()) for p in running], timeout=grace + 5)
        if late:
            for process in running:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()


async def _spawn(child: Child, env: dict[str, str]) -> None:
    child.process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        "serve",
        env={**env, **child.env},
        stdin=asyncio.subprocess.DEVNULL,
        stderr=grpc_core.original_stderr(),  # each child routes its gRPC core lines itself
    )
    print(f"  starting {child.name:<12} pid {child.process.pid:<7} on {child.address}", file=sys.stderr)


async def run_split(settings: Settings, *, shards: int = 1) -> int:
    """Start, supervise and stop the split topology; the exit code of ``mwp serve``."""
    mesh_id = (
        settings.mesh_id or f"mesh-{uuid.uuid4().hex[:12]}"
    )  # `mwp serve` sets it before taking the data dir
    try:
        children = plan(settings, shards, mesh_id)
        tls: ClientTLS | None
        if settings.tls_auto:
            tls, ca_file = auto_tls(settings, children)
            print(
                f"  TLS with a throw-away mesh CA: clients verify the gateway with --tls-ca {ca_file}",
                file=sys.stderr,
            )
        else:
            tls = launcher_tls(settings)
    except (TopologyError, ValueError) as refused:
        print(f"mwp serve: {refused}", file=sys.stderr)
        return 2
    try:  # before any child starts: a port in use ends the start-up with nothing left running
        check_ports(split_ports(settings, children))
    except ListenError as taken:
        print(f"mwp serve: {taken}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    # Tuning (MWP_COMMIT_*, MWP_VERIFY_WORKERS, MWP_OWNERSHIP_LEASE_S, ...) reaches every child; the
    # wiring each child gets from plan() overrides anything of the same name.
    env = dict(os.environ)
    try:
        # One at a time, back services first, the gateway last (it routes to the others from its first
        # call on); each creates its tables before the next opens the database.
        deadline = time.monotonic() + START_TIMEOUT_S
        for child in children:
            await _spawn(child, env)
            await _serving(child, deadline, tls)
        print(
            f"split topology serving: gateway (the one address) on {settings.listen}, "
            f"{shards} Authority shard(s), {len(children)} processes (mesh {mesh_id})",
            file=sys.stderr,
        )
        return await _supervise(children, env, stop)
    except TopologyError as failed:
        print(f"mwp serve: {failed}", file=sys.stderr)
        return 1
    finally:
        await _stop(children, settings.grace_seconds)


async def _supervise(children: list[Child], env: dict[str, str], stop: asyncio.Event) -> int:
    """Until asked to stop: a process that dies is started again, as Kubernetes restarts a pod (a
    dead shard's Groups meanwhile move to the others once its leases lapse); one that keeps dying
    (RESTART_LIMIT times within RESTART_WINDOW_S) stops the whole mesh."""
    restarts: dict[str, list[float]] = {c.name: [] for c in children}
    stopping = asyncio.create_task(stop.wait())
    while True:
        waits = {asyncio.create_task(c.process.wait()): c for c in children if c.process is not None}
        done, pending = await asyncio.wait([stopping, *waits], return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            if task is not stopping:
                task.cancel()
        if stopping in done:
            log.info("stopping the split topology", extra={"children": len(children)})
            return 0
        for task in done:
            died = waits[task]
            code = died.process.returncode if died.process else None
            recent = [t for t in restarts[died.name] if time.monotonic() - t < RESTART_WINDOW_S]
            if len(recent) >= RESTART_LIMIT:
                log.error(
                    "a process of the split topology keeps dying: stopping the mesh",
                    extra={"child": died.name, "exit_code": code},
                )
                return 1
            restarts[died.name] = [*recent, time.monotonic()]
            log.warning(
                "a process of the split topology died: starting it again",
                extra={"child": died.name, "exit_code": code},
            )
            await _spawn(died, env)
