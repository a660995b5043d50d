"""The Group Authority's core where it is served: its key (key continuity), the witness check of its
store, the store with its group commit, the signature verifier and ``GroupAuthority`` itself."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.internal.v1.publications_pb2_grpc import PublicationServiceStub
from missionweave.kernel import ids
from missionweave.kernel.clock import Clock
from missionweave.kernel.signing import load_or_create_key
from missionweave_server.config import Settings
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.mesh.health import MeshHealth
from missionweave_server.mesh.peers import Peers
from missionweave_server.services.authority import witness
from missionweave_server.services.authority.authority import GroupAuthority
from missionweave_server.services.authority.ingress import GroupIngressLimiter
from missionweave_server.services.authority.keys import KeyContinuityError, ensure_key
from missionweave_server.services.authority.rules.common import OrganizationPolicy
from missionweave_server.services.authority.store import EventStore
from missionweave_server.services.authority.witness import WitnessWriter
from missionweave_server.verification.verifier import SignatureVerifier

# The mesh's start-up log: one logger name, whichever of its modules writes the line.
log = logging.getLogger("missionweave_server.mesh.server")


async def authority_core(
    settings: Settings,
    engine: AsyncEngine,
    clock: Clock,
    identities: IdentityDirectoryClient,
    peers: Peers,
    health: MeshHealth,
) -> tuple[EventStore, GroupAuthority, WitnessWriter]:
    """The Authority's store and core (only a process serving the Authority loads its key), and the
    writer of its witness outside the store. A refusal raises; ``server.start``'s stop of the
    half-started mesh disposes of ``engine``."""
    signing_key = load_or_create_key(settings.authority_key_path)
    try:  # key continuity: refuses a key that is not the store's (docs/integrity.md)
        key_history = await ensure_key(engine, signing_key, clock)
    except KeyContinuityError as refused:
        log.error(
            "the Authority key is refused",
            extra={"detail": str(refused), "key_file": str(settings.authority_key_path)},
        )
        raise
    try:  # a whole store put back to an older copy (D173)
        await witness.check(engine, settings.witness_dir_path, key_history)
    except witness.StoreRolledBack as refused:
        log.error("the store is older than its witness", extra={"detail": str(refused)})
        raise
    instance_id = settings.instance_id or ids.new_id("auth")
    writer = witness.WitnessWriter(
        engine, settings.witness_dir_path, signing_key, key_history, instance_id, clock
    )
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
