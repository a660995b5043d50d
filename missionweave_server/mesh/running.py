"""A running mesh: what ``server.start`` returns (everything one process serves and holds open) and
its orderly stop, streams first and the database last."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave_server.config import Settings
from missionweave_server.console.site import ConsoleServer
from missionweave_server.edge.going_away import GoingAway
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.mesh.contracts import health_names
from missionweave_server.mesh.front_door import stop_mirrors
from missionweave_server.mesh.health import MeshHealth
from missionweave_server.mesh.peers import Peers
from missionweave_server.observability.metrics import MetricsServer
from missionweave_server.services.artifacts.blobstore import BlobStore
from missionweave_server.services.artifacts.service import ArtifactServicer
from missionweave_server.services.authority.authority import GroupAuthority
from missionweave_server.services.authority.group_log import GroupLogServicer
from missionweave_server.services.authority.links import LinkRelay
from missionweave_server.services.authority.rebalance import Rebalancer
from missionweave_server.services.authority.session_fence import SessionFence
from missionweave_server.services.authority.store import EventStore
from missionweave_server.services.authority.witness import WitnessWriter
from missionweave_server.services.gateway.service import GatewayServicer
from missionweave_server.services.membership.directory import IdentityDirectoryServicer
from missionweave_server.services.membership.registry import IdentityRegistry
from missionweave_server.services.scheduling.workers import Workers

log = logging.getLogger("missionweave_server.mesh.server")


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
    # The web console (MWP_CONSOLE_LISTEN), where the gateway is served.
    console: ConsoleServer | None = None
    # Ends the main server's streams and long polls at shutdown (followers reconnect elsewhere).
    going_away: GoingAway | None = None
    # A shard's hand-back rounds (rebalance.py); drained at a graceful stop.
    rebalancer: Rebalancer | None = None

    async def stop(self, grace: float | None = None) -> None:
        """Also the stop of a start-up that failed part-way (``server.start``): what had not started
        is None, and the servers may never have been started."""
        grace = self.settings.grace_seconds if grace is None else grace
        for name in health_names(self.settings.services):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.stop_watches()
        if self.console is not None:  # its streams are relayed mesh calls: they end first
            await self.console.stop()
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
        if self.going_away is not None:  # every other stream and long poll: only unary calls wait
            await self.going_away.end_streams(grace)
        await self.server.stop(grace)
        if self.rebalancer is not None:  # no call is served now: its Groups go to the other shards
            try:
                await self.rebalancer.drain()
            except Exception:  # the store did not answer: the Groups wait out their leases instead
                log.warning("could not hand this shard's Groups over before stopping", exc_info=True)
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
