"""Assembles the mesh: all five services in one process (embedded default) or any subset.

Every server gets standard gRPC health checking (one entry per service by full name) and server
reflection. SIGTERM/SIGINT drain in-flight calls and queued appends before exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from sqlalchemy.ext.asyncio import AsyncEngine

from artifactstore.backends import blobstore_from_env
from artifactstore.blobstore import BlobStore
from artifactstore.index import ArtifactIndex
from artifactstore.service import ArtifactServicer, add_artifact_service
from gateway.service import GatewayServicer
from missionweave import ids
from missionweave.clock import Clock, SystemClock
from missionweave.config import Settings
from missionweave.db import make_engine
from missionweave.internal.v1 import group_log_pb2, group_log_pb2_grpc
from missionweave.mesh.peers import Peers
from missionweave.rpc.local import LocalChannel
from missionweave.signing import load_or_create_key
from missionweave.v1 import (
    artifact_service_pb2,
    authority_service_pb2,
    authority_service_pb2_grpc,
    gateway_service_pb2,
    gateway_service_pb2_grpc,
    membership_service_pb2,
    membership_service_pb2_grpc,
    scheduling_service_pb2,
    scheduling_service_pb2_grpc,
)
from missionweave.verifier import SignatureVerifier
from services.authority.authority import GroupAuthority
from services.authority.group_log import GroupLogServicer
from services.authority.ingress import GroupIngressLimiter
from services.authority.servicer import AuthorityServicer
from services.authority.store import EventStore
from services.membership.registry import IdentityRegistry
from services.membership.servicer import MembershipServicer

log = logging.getLogger("missionweave.mesh.server")

# Transport limit: larger messages are refused by gRPC itself with RESOURCE_EXHAUSTED. Commands have
# their own, smaller, structured limit (services/authority/authority.py MAX_COMMAND_BYTES).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

# The shortest interval between keepalive pings a client may send on an idle connection (the peers'
# channels ping every 20 s).
MIN_PEER_PING_INTERVAL_MS = 10_000

# The Authority keeps every owned Group's folded state in memory: a large, long-lived object graph
# that CPython's default thresholds (700, 10, 10) re-scan over and over, in pauses that grow with the
# log and land in the tail latency. Young collections every 10,000 allocations, older ones far rarer
# (the 3.11 collector still runs a full pass only when long-lived objects grew by a quarter). D48.
GC_THRESHOLDS = (10_000, 50, 1_000)

SERVICE_NAMES = {
    "authority": authority_service_pb2.DESCRIPTOR.services_by_name["AuthorityService"].full_name,
    "membership": membership_service_pb2.DESCRIPTOR.services_by_name["MembershipService"].full_name,
    "scheduling": scheduling_service_pb2.DESCRIPTOR.services_by_name["SchedulingService"].full_name,
    "artifacts": artifact_service_pb2.DESCRIPTOR.services_by_name["ArtifactService"].full_name,
    "gateway": gateway_service_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name,
}
GROUP_LOG_SERVICE = group_log_pb2.DESCRIPTOR.services_by_name["GroupLogService"].full_name
# Service-to-service contracts (missionweave.internal.v1) each service serves beside its public one.
INTERNAL_SERVICE_NAMES: dict[str, tuple[str, ...]] = {"authority": (GROUP_LOG_SERVICE,)}


def served_names(services: tuple[str, ...]) -> list[str]:
    """Full names of every gRPC service a mesh of ``services`` serves (health and reflection)."""
    return [name for s in services for name in (SERVICE_NAMES[s], *INTERNAL_SERVICE_NAMES.get(s, ()))]


@dataclass
class Mesh:
    server: grpc.aio.Server
    port: int
    engine: AsyncEngine
    store: EventStore
    registry: IdentityRegistry
    authority: GroupAuthority
    health: health_aio.HealthServicer
    settings: Settings
    peers: Peers
    blobstore: BlobStore | None = None
    gateway: GatewayServicer | None = None
    group_log: GroupLogServicer | None = None

    async def stop(self, grace: float | None = None) -> None:
        grace = self.settings.grace_seconds if grace is None else grace
        for name in served_names(self.settings.services):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        # Streams never end on their own, so they would hold the whole grace period and then be
        # cancelled after the database is gone: end them first, while their tasks can still finish.
        if self.gateway is not None:
            await self.gateway.stop(grace)
        if self.group_log is not None:  # the same for the gateways following Groups here
            self.group_log.stop()
        await self.server.stop(grace)
        await self.peers.close()
        await self.authority.verifier.close()
        await self.store.close()
        if self.blobstore is not None:
            await self.blobstore.close()
        await self.engine.dispose()


async def create_schemas(engine: AsyncEngine) -> None:
    """Each service creates its own tables (idempotent)."""
    import artifactstore.schema
    import gateway.schema
    import services.authority.schema
    import services.membership.schema

    for schema in (services.membership.schema, services.authority.schema, artifactstore.schema, gateway.schema):
        await schema.create_schema(engine)


async def bootstrap_admin(settings: Settings, registry: IdentityRegistry) -> None:
    """First start of an empty Organization: create its administrator and say where the key is."""
    if await registry.count():
        return
    key = load_or_create_key(settings.admin_key_path)
    await registry.bootstrap_admin("admin", bytes(key.verify_key), "Organization administrator")
    log.warning(
        "created the Organization administrator identity 'admin'",
        extra={"identity": "admin", "key_file": str(settings.admin_key_path.resolve())},
    )


async def start(settings: Settings, clock: Clock | None = None) -> Mesh:
    clock = clock or SystemClock()
    gc.set_threshold(*GC_THRESHOLDS)
    engine = make_engine(settings.db_url, sqlite_synchronous=settings.sqlite_synchronous)
    await create_schemas(engine)
    in_process_registry = "membership" in settings.services
    registry = IdentityRegistry(engine, clock, authoritative_cache=in_process_registry)
    await bootstrap_admin(settings, registry)
    store = EventStore(
        engine,
        clock,
        instance_id=settings.instance_id or ids.new_id("auth"),
        linger=settings.commit_linger_ms / 1000,
        linger_idle=settings.commit_idle_ms / 1000,
        linger_batch=settings.commit_batch,
    )
    ingress = GroupIngressLimiter(settings.group_rate, settings.group_burst)
    verifier = SignatureVerifier(settings.verify_workers if "authority" in settings.services else 0)
    await verifier.start()
    authority = GroupAuthority(
        store, registry, clock, load_or_create_key(settings.authority_key_path), ingress=ingress, verifier=verifier
    )

    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            # Peers keep their channels alive with a ping every 20 s, even while a stream (a gateway's
            # FollowGroup) is idle (mesh/peers.py CHANNEL_OPTIONS). gRPC's default lets a client ping
            # an idle connection only every 5 minutes and answers more with GOAWAY
            # (ENHANCE_YOUR_CALM), which would cut every idle follow stream after a minute.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", MIN_PEER_PING_INTERVAL_MS),
        ]
    )
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    # Services served here reach each other through this channel; the others through their addresses.
    local = LocalChannel()
    peers = Peers(settings.services, settings.peers, local)
    group_log_servicer: GroupLogServicer | None = None
    if "authority" in settings.services:
        store.start()
        authority_servicer = AuthorityServicer(authority)
        authority_service_pb2_grpc.add_AuthorityServiceServicer_to_server(authority_servicer, server)
        local.register(SERVICE_NAMES["authority"], authority_servicer)
        group_log_servicer = GroupLogServicer(authority)
        group_log_pb2_grpc.add_GroupLogServiceServicer_to_server(group_log_servicer, server)
        local.register(GROUP_LOG_SERVICE, group_log_servicer)
    if "membership" in settings.services:
        membership_servicer = MembershipServicer(registry, authority)
        membership_service_pb2_grpc.add_MembershipServiceServicer_to_server(membership_servicer, server)
        local.register(SERVICE_NAMES["membership"], membership_servicer)
    # Scheduling exposes its full contract now; until its issue lands every
    # RPC answers UNIMPLEMENTED (the generated base servicer's behaviour). The mypy-protobuf stubs mark
    # the base servicer's methods abstract, hence the [abstract] ignores on these placeholders.
    if "scheduling" in settings.services:
        scheduling_service_pb2_grpc.add_SchedulingServiceServicer_to_server(
            scheduling_service_pb2_grpc.SchedulingServiceServicer(), server  # type: ignore[abstract]
        )
    blobstore = None
    gateway = None
    if "artifacts" in settings.services:
        blobstore = blobstore_from_env(settings.data_dir)
        artifact_servicer = ArtifactServicer(blobstore, ArtifactIndex(engine), registry, clock)
        add_artifact_service(artifact_servicer, server)
        local.register(SERVICE_NAMES["artifacts"], artifact_servicer)
    if "gateway" in settings.services:
        gateway = GatewayServicer(peers.channel("authority"), registry, engine, clock)
        gateway_service_pb2_grpc.add_GatewayServiceServicer_to_server(gateway, server)
    names = served_names(settings.services)
    reflection.enable_server_reflection([*names, reflection.SERVICE_NAME, "grpc.health.v1.Health"], server)
    port = server.add_insecure_port(settings.listen)
    if port == 0:
        raise OSError(f"cannot listen on {settings.listen}")
    await server.start()
    for name in names:
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    log.info("mesh listening", extra={"listen": settings.listen, "port": port, "services": ",".join(settings.services)})
    return Mesh(server, port, engine, store, registry, authority, health, settings, peers, blobstore, gateway, group_log_servicer)


async def serve_forever(settings: Settings) -> None:
    mesh = await start(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: draining in-flight calls", extra={"in_flight": mesh.authority.in_flight})
    await mesh.stop()
    log.info("stopped")
