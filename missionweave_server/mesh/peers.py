"""How a service reaches the others: through their contracts, on one channel per peer service.

A peer served in this process is reached through ``LocalChannel`` (no network hop, same stubs);
any other through a gRPC channel to its address (``MWP_<SERVICE>_ADDR``), over TLS (with this
process's client certificate where peers require one) when ``MWP_TLS_*`` configure it (docs/tls.md). Callers build the
generated stub on ``peers.channel(name)`` and never learn which of the two they got.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from missionweave.kernel.transport import ClientTLS, open_channel
from missionweave_server.edge.affinity import WorkerAffinityChannel
from missionweave_server.edge.callers import MeshServiceChannel
from missionweave_server.edge.local import LocalChannel
from missionweave_server.edge.shards import ShardedChannel

# Service-to-service calls carry small messages, except event batches (bounded by the Authority's
# read batch) and snapshots; the same ceiling as the public transport.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # A peer that was down is reconnected to within 2 s of coming back (gRPC's default backoff grows
    # to 120 s, during which every call fails at once): callers recover as soon as it answers.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class PeerUnknown(Exception):
    """A service was asked for a peer that is neither served here nor given an address."""


class Peers:
    def __init__(
        self,
        served: tuple[str, ...],
        addresses: Mapping[str, str],
        local: LocalChannel,
        tls: ClientTLS | None = None,
        mesh_token: bytes = b"",
    ) -> None:
        self.served = served
        self.tls = tls
        self.addresses = dict(addresses)
        self.local = local
        self.mesh_token = mesh_token
        self._remote: dict[str, grpc.aio.Channel] = {}
        self._sharded: ShardedChannel | None = None
        self._affinity: WorkerAffinityChannel | None = None

    def is_local(self, service: str) -> bool:
        return service in self.served

    def reachable(self, service: str) -> bool:
        """Served here, or an address is configured for it."""
        return service in self.served or bool(self.addresses.get(service))

    def channel(self, service: str) -> Any:
        """The channel to ``service`` ('authority', 'membership', 'artifacts', 'scheduling', 'gateway')."""
        if service in self.served:
            return self.local
        address = self.addresses.get(service)
        if not address:
            raise PeerUnknown(
                f"{service} is not served in this process and MWP_{service.upper()}_ADDR is not set"
            )
        shards = [a.strip() for a in address.split(",") if a.strip()]
        if len(shards) == 1:
            return self.address_channel(shards[0])
        if service == "scheduling":
            # MWP_SCHEDULING_ADDR lists every replica: calls go to their Worker's (rpc/affinity.py).
            if self._affinity is None:
                self._affinity = WorkerAffinityChannel(shards, self.address_channel)
            return self._affinity
        # MWP_AUTHORITY_ADDR lists every shard: calls are placed by Group (missionweave_server/edge/shards.py).
        if self._sharded is None:
            self._sharded = ShardedChannel(shards, self.address_channel)
        return self._sharded

    def as_mesh(self, service: str) -> Any:
        """The channel to ``service`` for this process's own calls: each made as a service of the
        mesh (``missionweave_server.edge.callers``). Calls forwarded for a client use ``channel``."""
        return MeshServiceChannel(self.channel(service), self.mesh_token)

    def address_channel(self, address: str) -> grpc.aio.Channel:
        """A channel to one address (an Authority shard named in NOT_OWNER), shared by all callers."""
        channel = self._remote.get(address)
        if channel is None:
            channel = self._remote[address] = open_channel(address, self.tls, CHANNEL_OPTIONS)
        return channel

    async def unanswered(self, wait_s: float = 2.0) -> list[tuple[str, str]]:
        """The configured peers (service, address) whose health check does not answer SERVING within
        ``wait_s``: said loudly at start, since every request that needs one is refused
        PEER_UNAVAILABLE until it does."""
        silent = []
        for service, addresses in sorted(self.addresses.items()):
            if service in self.served or not addresses:
                continue
            for address in (a.strip() for a in addresses.split(",") if a.strip()):
                stub = health_pb2_grpc.HealthStub(self.address_channel(address))
                try:
                    answer = await stub.Check(
                        health_pb2.HealthCheckRequest(), timeout=wait_s, wait_for_ready=True
                    )
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        continue
                except grpc.aio.AioRpcError:
                    pass
                silent.append((service, address))
        return silent

    async def close(self) -> None:
        channels, self._remote = list(self._remote.values()), {}
        for channel in channels:
            await channel.close()
