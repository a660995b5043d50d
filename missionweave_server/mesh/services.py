"""Each service a process serves, built and added to its server: the Authority's contracts, membership
(with the Organization administrator's bootstrap and key anchor), scheduling, artifacts and the gateway;
and the identity directory client every service authenticates callers with."""

from __future__ import annotations

import logging

import grpc
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.internal.v1 import group_log_pb2_grpc, identities_pb2_grpc, publications_pb2_grpc
from missionweave.kernel.clock import Clock
from missionweave.kernel.health_names import SERVICE_NAMES
from missionweave.kernel.signing import load_or_create_key
from missionweave.v1 import (
    agent_card_pb2,
    authority_service_pb2_grpc,
    gateway_service_pb2_grpc,
    membership_service_pb2_grpc,
    scheduling_service_pb2_grpc,
)
from missionweave_server.config import Settings
from missionweave_server.edge.callers import CallAuthenticator
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.edge.local import LocalChannel
from missionweave_server.mesh.contracts import INTERNAL_SERVICE_NAMES
from missionweave_server.mesh.peers import Peers, PeerUnknown
from missionweave_server.services.artifacts.backends import blobstore_from_env
from missionweave_server.services.artifacts.blobstore import BlobStore
from missionweave_server.services.artifacts.holder_seal import HolderSeal
from missionweave_server.services.artifacts.index import ArtifactIndex
from missionweave_server.services.artifacts.publications import PublicationServicer
from missionweave_server.services.artifacts.service import ArtifactServicer, add_artifact_service
from missionweave_server.services.authority.authority import GroupAuthority
from missionweave_server.services.authority.group_log import GroupLogServicer
from missionweave_server.services.authority.links import LinkRelay
from missionweave_server.services.authority.servicer import AuthorityServicer
from missionweave_server.services.authority.session_fence import SessionFence
from missionweave_server.services.authority.store import EventStore
from missionweave_server.services.gateway.limits import GatewayLimits
from missionweave_server.services.gateway.service import GatewayServicer
from missionweave_server.services.membership.directory import IdentityDirectoryServicer
from missionweave_server.services.membership.registry import IdentityRegistry, has_identities
from missionweave_server.services.membership.servicer import MembershipServicer
from missionweave_server.services.scheduling.servicer import SchedulingServicer
from missionweave_server.services.scheduling.store import ProjectionStore
from missionweave_server.services.scheduling.workers import Workers
from missionweave_server.storage.replay import SharedNonces

# The mesh's start-up log: one logger name, whichever of its modules writes the line.
log = logging.getLogger("missionweave_server.mesh.server")


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


async def admin_anchor(settings: Settings, engine: AsyncEngine) -> bytes:
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


def directory_client(peers: Peers) -> IdentityDirectoryClient:
    """Membership's directory, in process or at MWP_MEMBERSHIP_ADDR; without either, lookups fail
    PEER_UNAVAILABLE (the process still starts: a configuration error is reported, not a crash loop)."""
    try:
        return IdentityDirectoryClient(peers.as_mesh("membership"))
    except PeerUnknown as missing:
        log.error(
            "callers cannot be authenticated until Membership is reachable", extra={"detail": str(missing)}
        )
        return IdentityDirectoryClient(None, unavailable_reason=str(missing))


def serve_authority(
    settings: Settings,
    store: EventStore,
    authority: GroupAuthority,
    identities: IdentityDirectoryClient,
    callers: CallAuthenticator,
    handlers: grpc.aio.Server,
    local: LocalChannel,
) -> tuple[GroupLogServicer, LinkRelay | None, SessionFence]:
    """Where the Authority is served: its group commit, the cross-Group relay, the session fence,
    its public contract and its Group log."""
    links = None
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
    return group_log_servicer, links, fence


def serve_membership(
    registry: IdentityRegistry,
    peers: Peers,
    callers: CallAuthenticator,
    handlers: grpc.aio.Server,
    local: LocalChannel,
) -> IdentityDirectoryServicer:
    """Where membership is served: the identity directory and the MembershipService."""
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
    return directory


def serve_scheduling(
    peers: Peers,
    identities: IdentityDirectoryClient,
    engine: AsyncEngine,
    clock: Clock,
    callers: CallAuthenticator,
    handlers: grpc.aio.Server,
) -> Workers:
    schedulers, scheduling_servicer = scheduling_service(peers, identities, engine, clock)
    scheduling_servicer.callers = callers
    scheduling_service_pb2_grpc.add_SchedulingServiceServicer_to_server(scheduling_servicer, handlers)
    return schedulers


def serve_artifacts(
    settings: Settings,
    engine: AsyncEngine,
    identities: IdentityDirectoryClient,
    clock: Clock,
    peers: Peers,
    callers: CallAuthenticator,
    handlers: grpc.aio.Server,
    local: LocalChannel,
) -> tuple[BlobStore, ArtifactServicer]:
    """Where artifacts are served: the blob store, the ArtifactService and the PublicationService."""
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
    return blobstore, artifact_servicer


def serve_gateway(
    settings: Settings,
    peers: Peers,
    identities: IdentityDirectoryClient,
    engine: AsyncEngine,
    clock: Clock,
    callers: CallAuthenticator,
    handlers: grpc.aio.Server,
    nonces_engine: AsyncEngine,
    shared_nonces: bool,
) -> GatewayServicer:
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
    return gateway


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

    workers = Workers(
        clock, group_log_pb2_grpc.GroupLogServiceStub(authority), ProjectionStore(engine), slots
    )
    servicer = SchedulingServicer(workers, clock, capabilities)
    return workers, servicer


def gateway_limits(settings: Settings) -> GatewayLimits:
    return GatewayLimits(
        max_streams=settings.gateway_max_streams,
        max_streams_per_identity=settings.gateway_max_streams_per_identity,
        hello_timeout_s=settings.gateway_hello_timeout_s,
        stall_timeout_s=settings.gateway_stall_timeout_s,
        stream_buffer_bytes=settings.gateway_stream_buffer_bytes,
    )
