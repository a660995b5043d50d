"""Assembles the mesh: all five services in one process (embedded default) or any subset.

Every server gets standard gRPC health checking (one entry per service by full name) and server
reflection. SIGTERM/SIGINT drain in-flight calls and queued appends before exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field
from datetime import timedelta

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.internal.v1 import (
    group_log_pb2,
    group_log_pb2_grpc,
    identities_pb2,
    identities_pb2_grpc,
    publications_pb2,
    publications_pb2_grpc,
)
from missionweave.internal.v1.publications_pb2_grpc import PublicationServiceStub
from missionweave.kernel import gc_policy, ids
from missionweave.kernel.clock import Clock, SystemClock
from missionweave.kernel.health_names import INTEGRITY_HEALTH as INTEGRITY_HEALTH
from missionweave.kernel.health_names import SERVICE_NAMES as SERVICE_NAMES
from missionweave.kernel.signing import load_or_create_key
from missionweave.kernel.transport import ClientTLS
from missionweave.v1 import (
    agent_card_pb2,
    artifact_service_pb2,
    authority_service_pb2,
    authority_service_pb2_grpc,
    gateway_service_pb2_grpc,
    membership_service_pb2,
    membership_service_pb2_grpc,
    scheduling_service_pb2,
    scheduling_service_pb2_grpc,
)
from missionweave_server.config import Settings
from missionweave_server.edge.access_log import AccessLog
from missionweave_server.edge.callers import CallAuthenticator, audiences_for, load_or_create_mesh_token
from missionweave_server.edge.channels import (
    MeshPeersOnly,
    ServerTLS,
    add_listener,
    check_listen,
    check_port_free,
)
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.edge.local import LocalChannel
from missionweave_server.edge.reflection import enable_reflection
from missionweave_server.edge.registration import generic_handlers_only
from missionweave_server.edge.status import RequestParsing
from missionweave_server.mesh.front_door import FrontDoor, mirror_health, stop_mirrors
from missionweave_server.mesh.health import MeshHealth
from missionweave_server.mesh.peers import Peers, PeerUnknown
from missionweave_server.mesh.schemas import LINES, lines_for
from missionweave_server.observability import metrics, tracing
from missionweave_server.observability.metrics import MetricsServer
from missionweave_server.services.artifacts.backends import blobstore_from_env
from missionweave_server.services.artifacts.blobstore import BlobStore
from missionweave_server.services.artifacts.holder_seal import HolderSeal
from missionweave_server.services.artifacts.index import ArtifactIndex
from missionweave_server.services.artifacts.publications import PublicationServicer
from missionweave_server.services.artifacts.service import ArtifactServicer, add_artifact_service
from missionweave_server.services.authority import witness
from missionweave_server.services.authority.authority import GroupAuthority
from missionweave_server.services.authority.group_log import GroupLogServicer
from missionweave_server.services.authority.ingress import GroupIngressLimiter
from missionweave_server.services.authority.keys import KeyContinuityError, ensure_key
from missionweave_server.services.authority.links import LinkRelay
from missionweave_server.services.authority.rules.common import OrganizationPolicy
from missionweave_server.services.authority.servicer import AuthorityServicer
from missionweave_server.services.authority.session_fence import SessionFence
from missionweave_server.services.authority.store import EventStore
from missionweave_server.services.authority.witness import WitnessWriter
from missionweave_server.services.gateway.limits import GatewayLimits
from missionweave_server.services.gateway.service import GatewayServicer
from missionweave_server.services.membership.directory import IdentityDirectoryServicer
from missionweave_server.services.membership.registry import IdentityRegistry, has_identities
from missionweave_server.services.membership.servicer import MembershipServicer
from missionweave_server.services.scheduling.servicer import SchedulingServicer
from missionweave_server.services.scheduling.store import ProjectionStore
from missionweave_server.services.scheduling.workers import Workers
from missionweave_server.storage import schema_versions
from missionweave_server.storage.db import make_engine
from missionweave_server.storage.replay import NonceCache, SharedNonces, nonce_engine
from missionweave_server.verification.verifier import SignatureVerifier

log = logging.getLogger("missionweave_server.mesh.server")

# Transport limit: larger messages are refused by gRPC itself with RESOURCE_EXHAUSTED. Commands have
# their own, smaller, structured limit (missionweave_server/services/authority/ingress.py MAX_COMMAND_BYTES).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

# The public services the front door can route (the gateway is the front door itself).
PUBLIC_DESCRIPTORS = {
    "authority": authority_service_pb2.DESCRIPTOR.services_by_name["AuthorityService"],
    "membership": membership_service_pb2.DESCRIPTOR.services_by_name["MembershipService"],
    "scheduling": scheduling_service_pb2.DESCRIPTOR.services_by_name["SchedulingService"],
    "artifacts": artifact_service_pb2.DESCRIPTOR.services_by_name["ArtifactService"],
}
# Service-to-service contracts each public service also serves (never routed to agents).
INTERNAL_SERVICE_NAMES = {
    "publications": publications_pb2.DESCRIPTOR.services_by_name["PublicationService"].full_name,
    "identities": identities_pb2.DESCRIPTOR.services_by_name["IdentityDirectoryService"].full_name,
    "group_log": group_log_pb2.DESCRIPTOR.services_by_name["GroupLogService"].full_name,
}
# The shortest interval between keepalive pings a client may send on an idle connection (the peers'
# channels ping every 20 s).
MIN_PEER_PING_INTERVAL_MS = 10_000
# In the embedded default the directory's stream is in process and starts in milliseconds; start-up
# waits this long for it so the first commands are already answered from the cache.
LOCAL_DIRECTORY_WAIT_S = 2.0


def health_names(services: tuple[str, ...]) -> list[str]:
    """The services a process serving ``services`` reports in health checking and reflection: the
    public ones, and the identity directory where membership is served (the other services' probes
    and operators ask for it by name)."""
    names = [SERVICE_NAMES[s] for s in services]
    if "membership" in services:
        names.append(INTERNAL_SERVICE_NAMES["identities"])
    if "authority" in services:
        names.append(INTERNAL_SERVICE_NAMES["group_log"])
    return names


@dataclass
class Mesh:
    server: grpc.aio.Server
    port: int
    engine: AsyncEngine
    # The Authority's store and core; None in a process that does not serve the Authority.
    store: EventStore | None
    # The membership service's own registry; None where membership is not served.
    registry: IdentityRegistry | None
    # Every other service's view of the identity directory (missionweave_server/edge/identities.py).
    identities: IdentityDirectoryClient
    authority: GroupAuthority | None
    health: MeshHealth
    settings: Settings
    peers: Peers
    blobstore: BlobStore | None = None
    gateway: GatewayServicer | None = None
    background: list[asyncio.Task[None]] = field(default_factory=list)  # health mirrors, the peer check
    directory: IdentityDirectoryServicer | None = None
    group_log: GroupLogServicer | None = None
    # The plain-text grpc.health.v1-only listener (MWP_HEALTH_LISTEN), if any, and its port.
    health_server: grpc.aio.Server | None = None
    health_port: int = 0
    # The ArtifactService where artifacts are served (its quota is read from Settings).
    artifacts: ArtifactServicer | None = None
    # Every Worker's scheduler, where the SchedulingService is served.
    schedulers: Workers | None = None
    # The cross-Group relay where the Authority is served and delivers links (docs/subtasks.md).
    links: LinkRelay | None = None
    # The Prometheus endpoint (MWP_METRICS_LISTEN), if any.
    metrics: MetricsServer | None = None
    # Where the Authority is served: revokes replaced sessions' leases (MW-11.3-09).
    fence: SessionFence | None = None
    # Where proof nonces are recorded (MWP_NONCE_STORE=database), when not ``engine`` itself.
    nonces_engine: AsyncEngine | None = None
    # Where the Authority is served: its witness of the store, outside the store (D173).
    witness: WitnessWriter | None = None

    async def stop(self, grace: float | None = None) -> None:
        grace = self.settings.grace_seconds if grace is None else grace
        for name in health_names(self.settings.services):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.stop_watches()
        # Streams never end on their own, so they would hold the whole grace period and then be
        # cancelled after the database is gone: end them first, while their tasks can still finish.
        # Commands still arriving meanwhile ask Membership directly (the cache is no longer followed).
        await self.identities.close()
        if self.directory is not None:
            self.directory.stop()
        if self.group_log is not None:  # the same for the gateways following Groups here
            self.group_log.stop()
        if self.gateway is not None:
            await self.gateway.stop(grace)
        if self.schedulers is not None:
            await self.schedulers.close()
        await self.server.stop(grace)
        if self.health_server is not None:
            await self.health_server.stop(0)
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.stop)
        await stop_mirrors(self.background)
        await self.peers.close()
        if self.links is not None:
            await self.links.close()
        if self.fence is not None:
            await self.fence.close()
        if self.authority is not None:
            await self.authority.verifier.close()
        if self.store is not None:
            await self.store.close()  # the last appends committed: the witness sees them
        if self.witness is not None:
            await self.witness.close()
        if self.artifacts is not None:  # the verification times not written yet (D142)
            await self.artifacts.index.close()
        if self.blobstore is not None:
            await self.blobstore.close()
        if self.nonces_engine is not None and self.nonces_engine is not self.engine:
            await self.nonces_engine.dispose()
        await self.engine.dispose()


class DatabaseUnavailable(OSError):
    """The store cannot be opened at start-up (unreachable server, bad credentials, unwritable file)."""


async def create_schemas(engine: AsyncEngine, served: tuple[str, ...]) -> None:
    """The tables of each service served here, and only those: installed into an empty store, or
    checked to be at this release's schema (``SchemaMismatch`` names the command to run)."""
    await schema_versions.prepare(engine, lines_for(name for name in served if name in LINES))


async def _authority(
    settings: Settings,
    engine: AsyncEngine,
    clock: Clock,
    identities: IdentityDirectoryClient,
    peers: Peers,
    health: MeshHealth,
) -> tuple[EventStore, GroupAuthority, WitnessWriter]:
    """The Authority's store and core (only a process serving the Authority loads its key), and the
    writer of its witness outside the store."""
    signing_key = load_or_create_key(settings.authority_key_path)
    try:  # key continuity: refuses a key that is not the store's (docs/integrity.md)
        key_history = await ensure_key(engine, signing_key, clock)
    except KeyContinuityError as refused:
        log.error("the Authority key is refused", extra={"detail": str(refused), "key_file": str(settings.authority_key_path)})
        await engine.dispose()
        raise
    try:  # a whole store put back to an older copy (D173)
        await witness.check(engine, settings.witness_dir_path, key_history)
    except witness.StoreRolledBack as refused:
        log.error("the store is older than its witness", extra={"detail": str(refused)})
        await engine.dispose()
        raise
    instance_id = settings.instance_id or ids.new_id("auth")
    writer = witness.WitnessWriter(engine, settings.witness_dir_path, signing_key, key_history, instance_id, clock)
    store = EventStore(
        engine,
        clock,
        instance_id=instance_id,
        linger=settings.commit_linger_ms / 1000,
        linger_idle=settings.commit_idle_ms / 1000,
        linger_batch=settings.commit_batch,
        ownership_ttl=timedelta(seconds=settings.ownership_lease_s),
    )
    verifier = SignatureVerifier(settings.verify_workers)
    await verifier.start()
    publications = (
        PublicationServiceStub(peers.as_mesh("artifacts")) if peers.reachable("artifacts") else None
    )
    authority = GroupAuthority(
        store,
        identities,
        clock,
        signing_key,
        ingress=GroupIngressLimiter(settings.group_rate, settings.group_burst),
        verifier=verifier,
        publications=publications,
        key_history=key_history,
        on_corrupted=health.group_corrupted,
        policy=OrganizationPolicy(
            max_delegation_depth=settings.max_delegation_depth, max_mission_depth=settings.max_mission_depth
        ),
    )
    writer.start()
    return store, authority, writer


async def bootstrap_admin(settings: Settings, registry: IdentityRegistry) -> None:
    """First start of an empty Organization: create its administrator and say where the key is."""
    if await has_identities(registry.engine):
        return
    key = load_or_create_key(settings.admin_key_path)
    await registry.bootstrap_admin("admin", key, "Organization administrator")
    log.warning(
        "created the Organization administrator identity 'admin'",
        extra={"identity": "admin", "key_file": str(settings.admin_key_path.resolve())},
    )


async def _admin_anchor(settings: Settings, engine: AsyncEngine) -> bytes:
    """The administrator's public key, outside the database: the root of every identity's grant
    (D170). Made on the first start of an empty Organization; never silently replaced after it."""
    path = settings.admin_key_path
    if not path.exists() and await has_identities(engine):
        await engine.dispose()
        raise ValueError(
            f"the membership service checks every identity against the Organization administrator's key "
            f"(docs/integrity.md), and {path} is missing: put the key back (the missionweave-admin-key Secret on Kubernetes)"
        )
    return bytes(load_or_create_key(path).verify_key)


async def start(settings: Settings, clock: Clock | None = None) -> Mesh:
    # TLS settings are checked before anything starts: a refusal leaves nothing behind.
    server_tls = ServerTLS.from_settings(settings)
    check_listen(settings.listen, server_tls, insecure=settings.insecure)
    for address in (settings.listen, settings.health_listen):  # a port in use fails now, loudly
        if address:
            check_port_free(address)
    peer_tls = ClientTLS.from_settings(settings)
    clock = clock or SystemClock()
    # The Authority keeps every owned Group's folded state in memory: a large, long-lived graph (D48).
    gc_policy.for_long_running_process()
    engine = make_engine(settings.db_url, sqlite_synchronous=settings.sqlite_synchronous)
    shared_nonces = settings.nonce_store == "database"
    try:
        await create_schemas(engine, (*settings.services, *(("nonces",) if shared_nonces else ())))
    except (OSError, SQLAlchemyError) as unreachable:
        await engine.dispose()
        shown = make_url(settings.db_url).render_as_string(hide_password=True)
        raise DatabaseUnavailable(f"cannot open the database {shown}: {unreachable}") from None
    except schema_versions.SchemaMismatch:
        await engine.dispose()
        raise
    # Services served here reach each other through this channel; the others through their addresses.
    local = LocalChannel()
    peers = Peers(
        settings.services, settings.peers, local, tls=peer_tls, mesh_token=load_or_create_mesh_token(settings.mesh_token_path)
    )
    registry = None
    if "membership" in settings.services:
        registry = IdentityRegistry(engine, clock, admin_public_key=await _admin_anchor(settings, engine))
        await bootstrap_admin(settings, registry)
    identities = _directory_client(peers)
    # Proof freshness is a transport matter, judged by this host's wall clock (the protocol clock
    # may be a test's shifted one). Replicas answer to one audience: with MWP_NONCE_STORE=database
    # each nonce is also recorded where they all see it (D118).
    # The default (D168): a restart forgets nothing either, so no proof is accepted twice across one.
    wall = SystemClock()
    nonces_engine = nonce_engine(engine) if shared_nonces else engine
    callers = CallAuthenticator(
        identities,
        wall,
        audiences_for(*settings.audiences),
        peers.mesh_token,
        NonceCache(wall, shared=SharedNonces(nonces_engine, wall, "call") if shared_nonces else None),
    )
    health = MeshHealth(INTEGRITY_HEALTH)
    store, authority, witness = (
        (await _authority(settings, engine, clock, identities, peers, health))
        if "authority" in settings.services
        else (None, None, None)
    )

    server = grpc.aio.server(
        # With client certificates required, the internal contracts answer mesh services only.
        # Requests are parsed at the edge, not by gRPC: one that does not parse is answered
        # INVALID_ARGUMENT (MALFORMED), never UNKNOWN with a traceback (missionweave_server/edge/status.py).
        # The access log is outermost but for the trace's server span (tracing on only), inside
        # which its line is written: it sees every call's final code, the parsing edge's too.
        interceptors=[
            *tracing.server_interceptors(),
            AccessLog(settings.access_log_rate),
            *([MeshPeersOnly(INTERNAL_SERVICE_NAMES.values())] if server_tls is not None and server_tls.mutual else []),
            RequestParsing(),
        ],
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
        ],
    )
    handlers = generic_handlers_only(server)
    health_pb2_grpc.add_HealthServicer_to_server(health, handlers)
    group_log_servicer: GroupLogServicer | None = None
    links = None
    fence = None
    if store is not None and authority is not None:
        store.start()
        if settings.link_relay_poll_ms:
            links = LinkRelay(authority, settings.link_relay_poll_ms / 1000)
            links.start()
        fence = SessionFence(authority, identities)
        fence.start()
        authority_servicer = AuthorityServicer(authority)
        authority_servicer.callers = callers
        authority_service_pb2_grpc.add_AuthorityServiceServicer_to_server(authority_servicer, handlers)
        local.register(SERVICE_NAMES["authority"], authority_servicer)
        group_log_servicer = GroupLogServicer(authority)
        group_log_servicer.callers = callers
        group_log_pb2_grpc.add_GroupLogServiceServicer_to_server(group_log_servicer, handlers)
        local.register(INTERNAL_SERVICE_NAMES["group_log"], group_log_servicer)
    directory = None
    if registry is not None:
        directory = IdentityDirectoryServicer(registry)
        directory.callers = callers
        identities_pb2_grpc.add_IdentityDirectoryServiceServicer_to_server(directory, handlers)
        local.register(INTERNAL_SERVICE_NAMES["identities"], directory)
        authority_stub = (
            authority_service_pb2_grpc.AuthorityServiceStub(peers.as_mesh("authority"))
            if peers.reachable("authority")
            else None
        )
        membership_servicer = MembershipServicer(registry, directory, authority_stub)
        membership_servicer.callers = callers
        membership_service_pb2_grpc.add_MembershipServiceServicer_to_server(membership_servicer, handlers)
        local.register(SERVICE_NAMES["membership"], membership_servicer)
    schedulers: Workers | None = None
    if "scheduling" in settings.services:
        schedulers, scheduling_servicer = scheduling_service(peers, identities, engine, clock)
        scheduling_servicer.callers = callers
        scheduling_service_pb2_grpc.add_SchedulingServiceServicer_to_server(scheduling_servicer, handlers)
    blobstore = None
    gateway = None
    artifact_servicer = None
    if "artifacts" in settings.services:
        blobstore = blobstore_from_env(settings.data_dir)
        # Reads by Group reference ask the Authority's public contract whether the caller is an
        # active member (as a mesh service: GetGroupState answers it in full).
        artifact_servicer = ArtifactServicer(
            blobstore,
            ArtifactIndex(engine, HolderSeal(peers.mesh_token)),  # holder rows sealed (D172)
            identities,
            clock,
            authority=(
                authority_service_pb2_grpc.AuthorityServiceStub(peers.as_mesh("authority"))
                if peers.reachable("authority")
                else None
            ),
            quota_bytes=settings.artifact_quota_bytes,
        )
        artifact_servicer.callers = callers
        add_artifact_service(artifact_servicer, handlers)
        local.register(SERVICE_NAMES["artifacts"], artifact_servicer)
        publication_servicer = PublicationServicer(ArtifactIndex(engine, HolderSeal(peers.mesh_token)))
        publication_servicer.callers = callers
        publications_pb2_grpc.add_PublicationServiceServicer_to_server(publication_servicer, handlers)
        local.register(INTERNAL_SERVICE_NAMES["publications"], publication_servicer)
    if "gateway" in settings.services:
        gateway = GatewayServicer(
            peers.as_mesh("authority"),
            identities,
            engine,
            clock,
            gateway_limits(settings),
            shared_nonces=SharedNonces(nonces_engine, clock, "hello") if shared_nonces else None,
        )
        gateway.callers = callers
        gateway_service_pb2_grpc.add_GatewayServiceServicer_to_server(gateway, handlers)
    mirrors: list[asyncio.Task[None]] = []
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
            mirrors = [
                asyncio.create_task(mirror_health(health, peers.channel(s), SERVICE_NAMES[s]))
                for s in front_door.routed_services
            ]
            if "authority" in front_door.routed_services:
                mirrors.append(asyncio.create_task(mirror_health(health, peers.channel("authority"), INTEGRITY_HEALTH)))
    names = health_names(settings.services)
    enable_reflection([*names, *routed, "grpc.health.v1.Health"], handlers)
    port = add_listener(server, settings.listen, server_tls, insecure=settings.insecure)
    health_server, health_port = await _health_listener(settings.health_listen, health)
    metrics_server = metrics.serve(settings.metrics_listen)
    # Listening on port 0 picks a port: proofs (call proofs and HELLO) name the address clients
    # dial, with that port; the gateway checks HELLO against the same audiences.
    callers.audiences |= audiences_for(f"{settings.listen.rsplit(':', 1)[0]}:{port}")
    if gateway is not None:
        gateway.audiences = callers.audiences
    await server.start()
    if store is not None:
        host = settings.listen.rsplit(":", 1)[0]
        await store.announce(
            settings.advertise or f"{'127.0.0.1' if host in ('0.0.0.0', '[::]', '') else host}:{port}"
        )
    # The services that authenticate callers follow the directory (in process or over the network).
    if {"authority", "artifacts", "gateway"} & set(settings.services):
        identities.start()
        if directory is not None:
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
                    health, peers.channel("authority"), SERVICE_NAMES["authority"], as_name=SERVICE_NAMES["scheduling"]
                )
            )
        )
    # In the background: peers of a split mesh start in any order, and start-up never waits on them.
    mirrors.append(asyncio.create_task(_say_silent_peers(peers)))
    if server_tls is not None and peer_tls is None and any(s not in settings.services for s in settings.peers):
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
    return Mesh(
        server,
        port,
        engine,
        store,
        registry,
        identities,
        authority,
        health,
        settings,
        peers,
        blobstore,
        gateway,
        mirrors,
        directory,
        group_log_servicer,
        health_server,
        health_port,
        artifact_servicer,
        schedulers,
        links,
        metrics_server,
        fence,
        nonces_engine,
        witness,
    )


def scheduling_service(
    peers: Peers, identities: IdentityDirectoryClient, engine: AsyncEngine, clock: Clock
) -> tuple[Workers, SchedulingServicer]:
    """Each Worker's scheduler follows its Groups through the Authority's internal contract and
    declares the slots of its Agent Card in force (1 without one)."""
    authority = peers.as_mesh("authority")

    async def card(agent_id: str) -> agent_card_pb2.AgentCard | None:
        published = (await identities.agent_cards([agent_id])).get(agent_id)
        return published.card if published is not None else None

    async def slots(agent_id: str) -> int:
        found = await card(agent_id)
        return max(found.max_concurrency, 1) if found is not None else 1

    async def capabilities(agent_id: str) -> dict[str, str] | None:
        found = await card(agent_id)
        return {c.capability_id: c.version for c in found.capabilities} if found is not None else None

    workers = Workers(clock, group_log_pb2_grpc.GroupLogServiceStub(authority), ProjectionStore(engine), slots)
    servicer = SchedulingServicer(workers, clock, capabilities)
    return workers, servicer


async def _health_listener(address: str, health: MeshHealth) -> tuple[grpc.aio.Server | None, int]:
    """MWP_HEALTH_LISTEN: a plain-text server with grpc.health.v1 and nothing else, for probes that
    speak no TLS (kubelet's gRPC probes). It tells a caller only whether a service is serving."""
    if not address:
        return None, 0
    server = grpc.aio.server()
    handlers = generic_handlers_only(server)
    health_pb2_grpc.add_HealthServicer_to_server(health, handlers)
    port = add_listener(server, address, None, insecure=True)
    await server.start()
    return server, port


def gateway_limits(settings: Settings) -> GatewayLimits:
    return GatewayLimits(
        max_streams=settings.gateway_max_streams,
        max_streams_per_identity=settings.gateway_max_streams_per_identity,
        hello_timeout_s=settings.gateway_hello_timeout_s,
        stall_timeout_s=settings.gateway_stall_timeout_s,
        stream_buffer_bytes=settings.gateway_stream_buffer_bytes,
    )


def _directory_client(peers: Peers) -> IdentityDirectoryClient:
    """Membership's directory, in process or at MWP_MEMBERSHIP_ADDR; without either, lookups fail
    PEER_UNAVAILABLE (the process still starts: a configuration error is reported, not a crash loop)."""
    try:
        return IdentityDirectoryClient(peers.as_mesh("membership"))
    except PeerUnknown as missing:
        log.error(
            "callers cannot be authenticated until Membership is reachable", extra={"detail": str(missing)}
        )
        return IdentityDirectoryClient(None, unavailable_reason=str(missing))


async def _say_silent_peers(peers: Peers) -> None:
    for service, address in await peers.unanswered():
        log.warning(
            "a peer service does not answer: requests that need it are refused PEER_UNAVAILABLE until it does",
            extra={"peer": service, "address": address},
        )


async def serve_forever(settings: Settings) -> None:
    mesh = await start(settings)
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
