"""Assembles the mesh: all five services in one process (embedded default) or any subset.

Every server gets standard gRPC health checking (one entry per service by full name) and server
reflection. SIGTERM/SIGINT drain in-flight calls and queued appends before exit.

This module is the start-up's order and ``serve_forever``; the parts are in the modules named for
them: the contracts a process serves (``contracts.py``), its store (``database.py``), its gRPC
servers (``grpc_server.py``), the Authority's core (``authority_core.py``), each service built and
added (``services.py``) and the running mesh with its stop (``running.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

from grpc_health.v1 import health_pb2, health_pb2_grpc

from missionweave.kernel import gc_policy
from missionweave.kernel.clock import Clock, SystemClock
from missionweave.kernel.health_names import INTEGRITY_HEALTH as INTEGRITY_HEALTH
from missionweave.kernel.health_names import SERVICE_NAMES as SERVICE_NAMES
from missionweave.kernel.transport import ClientTLS
from missionweave_server.config import Settings
from missionweave_server.edge.callers import CallAuthenticator, audiences_for, load_or_create_mesh_token
from missionweave_server.edge.channels import ServerTLS, add_listener, check_listen
from missionweave_server.edge.going_away import GoingAway
from missionweave_server.edge.local import LocalChannel
from missionweave_server.edge.reflection import enable_reflection
from missionweave_server.edge.registration import generic_handlers_only
from missionweave_server.mesh.authority_core import authority_core
from missionweave_server.mesh.console import check_console_tls, start_console
from missionweave_server.mesh.contracts import PUBLIC_DESCRIPTORS, health_names
from missionweave_server.mesh.database import open_database
from missionweave_server.mesh.front_door import FrontDoor, mirror_health
from missionweave_server.mesh.grpc_server import grpc_server, health_listener
from missionweave_server.mesh.health import MeshHealth
from missionweave_server.mesh.peers import Peers
from missionweave_server.mesh.ports import Port, bound_as_checked, check_ports, serve_ports
from missionweave_server.mesh.running import Mesh
from missionweave_server.mesh.services import (
    admin_anchor,
    bootstrap_admin,
    directory_client,
    serve_artifacts,
    serve_authority,
    serve_gateway,
    serve_membership,
    serve_scheduling,
)
from missionweave_server.observability import metrics
from missionweave_server.services.authority.rebalance import Rebalancer
from missionweave_server.services.membership.registry import IdentityRegistry
from missionweave_server.storage.db import private_dir
from missionweave_server.storage.replay import NonceCache, SharedNonces, nonce_engine

log = logging.getLogger("missionweave_server.mesh.server")

# In the embedded default the directory's stream is in process and starts in milliseconds; start-up
# waits this long for it so the first commands are already answered from the cache.
LOCAL_DIRECTORY_WAIT_S = 2.0


async def start(settings: Settings, clock: Clock | None = None) -> Mesh:
    # TLS settings are checked before anything starts: a refusal leaves nothing behind.
    server_tls = ServerTLS.from_settings(settings)
    check_listen(settings.listen, server_tls, insecure=settings.insecure)
    peer_tls = ClientTLS.from_settings(settings)
    serves_console = bool(settings.console_listen) and "gateway" in settings.services
    ports = {port.role: port for port in serve_ports(settings, console=serves_console)}
    check_ports(ports.values())  # a port in use fails now, loudly
    if serves_console:
        check_console_tls(settings, server_tls, peer_tls)
    # Bound after the checks, before anything starts: a failure to bind it leaves nothing half-started.
    metrics_server = metrics.serve(settings.metrics_listen)
    clock = clock or SystemClock()
    # The Authority keeps every owned Group's folded state in memory: a large, long-lived graph (D48).
    gc_policy.for_long_running_process()
    shared_nonces = settings.nonce_store == "database"
    # The data dir (keys, the store, blobs) private before anything is written in it, the token first.
    private_dir(settings.data_dir)
    mesh_token = load_or_create_mesh_token(settings.mesh_token_path)
    engine = await open_database(settings, shared_nonces)
    # Services served here reach each other through this channel; the others through their addresses.
    local = LocalChannel()
    peers = Peers(settings.services, settings.peers, local, tls=peer_tls, mesh_token=mesh_token)
    going_away = GoingAway()  # ends streams and long polls at shutdown
    # From the open database on, the mesh holds each part as it starts: a failure part-way (a port
    # taken since the check) stops what has started, by the mesh's own stop, before the error
    # propagates; left to asyncio.run, its tasks would be cancelled mid-start and one spawning the
    # store's writer process never ends (D284).
    mesh = Mesh(
        server=grpc_server(settings, server_tls, going_away),
        port=0,  # bound last
        engine=engine,
        store=None,
        registry=None,
        identities=directory_client(peers),
        authority=None,
        health=MeshHealth(INTEGRITY_HEALTH),
        settings=settings,
        peers=peers,
        metrics=metrics_server,
        going_away=going_away,
    )
    try:
        await _start_services(mesh, clock, local, server_tls, peer_tls, ports, shared_nonces)
    except BaseException:
        try:
            await mesh.stop(grace=0)
        except Exception:  # the start-up's own error is the one to report
            log.warning("could not stop the half-started mesh cleanly", exc_info=True)
        raise
    return mesh


async def _start_services(
    mesh: Mesh,
    clock: Clock,
    local: LocalChannel,
    server_tls: ServerTLS | None,
    peer_tls: ClientTLS | None,
    ports: dict[str, Port],
    shared_nonces: bool,
) -> None:
    """Builds every service ``mesh.settings`` asks for into ``mesh`` and starts it, listeners last."""
    settings, engine, peers = mesh.settings, mesh.engine, mesh.peers
    identities, health = mesh.identities, mesh.health
    if "membership" in settings.services:
        mesh.registry = IdentityRegistry(engine, clock, admin_public_key=await admin_anchor(settings, engine))
        await bootstrap_admin(settings, mesh.registry)
    # Proof freshness is a transport matter, judged by this host's wall clock (the protocol clock
    # may be a test's shifted one). Replicas answer to one audience: with MWP_NONCE_STORE=database
    # each nonce is also recorded where they all see it (D118).
    # The default (D168): a restart forgets nothing either, so no proof is accepted twice across one.
    wall = SystemClock()
    nonces_engine = mesh.nonces_engine = nonce_engine(engine) if shared_nonces else engine
    callers = CallAuthenticator(
        identities,
        wall,
        audiences_for(*settings.audiences),
        peers.mesh_token,
        NonceCache(wall, shared=SharedNonces(nonces_engine, wall, "call") if shared_nonces else None),
    )
    if "authority" in settings.services:
        mesh.store, mesh.authority, mesh.witness = await authority_core(
            settings, engine, clock, identities, peers, health
        )
    store, authority = mesh.store, mesh.authority
    server = mesh.server
    handlers = generic_handlers_only(server)
    health_pb2_grpc.add_HealthServicer_to_server(health, handlers)
    if store is not None and authority is not None:
        mesh.group_log, mesh.links, mesh.fence = serve_authority(
            settings, store, authority, identities, callers, handlers, local
        )
    if mesh.registry is not None:
        mesh.directory = serve_membership(mesh.registry, peers, callers, handlers, local)
    if "scheduling" in settings.services:
        mesh.schedulers = serve_scheduling(peers, identities, engine, clock, callers, handlers)
    if "artifacts" in settings.services:
        mesh.blobstore, mesh.artifacts = serve_artifacts(
            settings, engine, identities, clock, peers, callers, handlers, local
        )
    if "gateway" in settings.services:
        mesh.gateway = serve_gateway(
            settings, peers, identities, engine, clock, callers, handlers, nonces_engine, shared_nonces
        )
    mirrors = mesh.background
    routed: list[str] = []
    if "gateway" in settings.services:
        # The front door: every public service not served here is routed to the peer serving it.
        away = {
            s: PUBLIC_DESCRIPTORS[s]
            for s in PUBLIC_DESCRIPTORS
            if s not in settings.services and peers.reachable(s)
        }
        if away:
            front_door = FrontDoor(peers, away)
            handlers.add_generic_rpc_handlers([front_door])
            routed = [SERVICE_NAMES[s] for s in front_door.routed_services]
            mirrors.extend(
                asyncio.create_task(mirror_health(health, peers.channel(s), SERVICE_NAMES[s]))
                for s in front_door.routed_services
            )
            if "authority" in front_door.routed_services:
                mirrors.append(
                    asyncio.create_task(mirror_health(health, peers.channel("authority"), INTEGRITY_HEALTH))
                )
    names = health_names(settings.services)
    enable_reflection([*names, *routed, "grpc.health.v1.Health"], handlers)
    with bound_as_checked(ports["gRPC"]):
        port = mesh.port = add_listener(server, settings.listen, server_tls, insecure=settings.insecure)
    with bound_as_checked(ports["health"]):
        mesh.health_server, mesh.health_port = await health_listener(settings.health_listen, health)
    # Listening on port 0 picks a port: proofs (call proofs and HELLO) name the address clients
    # dial, with that port; the gateway checks HELLO against the same audiences.
    callers.audiences |= audiences_for(f"{settings.listen.rsplit(':', 1)[0]}:{port}")
    if mesh.gateway is not None:
        mesh.gateway.audiences = callers.audiences
    await server.start()
    if "console" in ports:
        with bound_as_checked(ports["console"]):
            mesh.console = await start_console(settings, port, server_tls, peer_tls)
    if store is not None and authority is not None:
        host = settings.listen.rsplit(":", 1)[0]
        advertised = (
            settings.advertise or f"{'127.0.0.1' if host in ('0.0.0.0', '[::]', '') else host}:{port}"
        )
        await store.announce(advertised)
        if settings.rebalance_interval_s > 0 and store.engine.dialect.name == "postgresql":  # shards: D60
            mesh.rebalancer = Rebalancer(
                store, authority.hand_over, advertised, clock, settings.rebalance_interval_s
            )
            mirrors.append(mesh.rebalancer.start())
    # The services that authenticate callers follow the directory (in process or over the network).
    if {"authority", "artifacts", "gateway"} & set(settings.services):
        identities.start()
        if mesh.directory is not None:
            await identities.wait_current(LOCAL_DIRECTORY_WAIT_S)
    for name in names:
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    if authority is not None:
        await health.set(INTEGRITY_HEALTH, health_pb2.HealthCheckResponse.SERVING)
    if "scheduling" in settings.services and not peers.is_local("authority") and peers.reachable("authority"):
        # Each Worker's scheduler follows its Groups from the Authority: it serves only while that
        # answers, and says so (readiness, and the front door's mirror of it).
        mirrors.append(
            asyncio.create_task(
                mirror_health(
                    health,
                    peers.channel("authority"),
                    SERVICE_NAMES["authority"],
                    as_name=SERVICE_NAMES["scheduling"],
                )
            )
        )
    # In the background: peers of a split mesh start in any order, and start-up never waits on them.
    mirrors.append(asyncio.create_task(_say_silent_peers(peers)))
    if (
        server_tls is not None
        and peer_tls is None
        and any(s not in settings.services for s in settings.peers)
    ):
        log.warning(
            "this server speaks TLS but dials its peers in plain text: set MWP_TLS_CA (and a client "
            "certificate where peers require one) so peer calls use TLS too (docs/tls.md)"
        )
    log.info(
        "mesh listening",
        extra={
            "listen": settings.listen,
            "port": port,
            "services": ",".join(settings.services),
            "tls": "off" if server_tls is None else ("mutual" if server_tls.mutual else "server"),
        },
    )
    if mesh.console is not None:
        log.info("console listening", extra={"url": mesh.console.url, "port": mesh.console.port})


async def _say_silent_peers(peers: Peers) -> None:
    for service, address in await peers.unanswered():
        log.warning(
            "a peer service does not answer: requests that need it are refused PEER_UNAVAILABLE until it does",
            extra={"peer": service, "address": address},
        )


async def serve_forever(settings: Settings) -> None:
    mesh = await start(settings)
    if mesh.console is not None and settings.log_format != "json":
        # JSON logs carry the address in their "console listening" record; stderr stays JSON lines.
        print(f"mwp serve: console at {mesh.console.url}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info(
        "shutting down: draining in-flight calls",
        extra={"in_flight": mesh.authority.in_flight if mesh.authority else 0},
    )
    await mesh.stop()
    log.info("stopped")
