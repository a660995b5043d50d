"""The gRPC servers of a process: the main server (its interceptors, message limits and keepalive
policy) and the plain-text health-only listener for probes that speak no TLS."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2_grpc

from missionweave_server.config import Settings
from missionweave_server.edge.access_log import AccessLog
from missionweave_server.edge.channels import MeshPeersOnly, ServerTLS, add_listener
from missionweave_server.edge.going_away import GoingAway
from missionweave_server.edge.registration import generic_handlers_only
from missionweave_server.edge.status import RequestParsing
from missionweave_server.mesh.contracts import INTERNAL_SERVICE_NAMES
from missionweave_server.mesh.health import MeshHealth
from missionweave_server.observability import tracing

# Transport limit: larger messages are refused by gRPC itself with RESOURCE_EXHAUSTED. Commands have
# their own, smaller, structured limit (missionweave_server/services/authority/ingress.py MAX_COMMAND_BYTES).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# The shortest interval between keepalive pings a client may send on an idle connection (the peers'
# channels ping every 20 s).
MIN_PEER_PING_INTERVAL_MS = 10_000


def grpc_server(
    settings: Settings, server_tls: ServerTLS | None, going_away: GoingAway | None = None
) -> grpc.aio.Server:
    """The server every service of this process is added to (its listener is added by ``start``);
    ``going_away`` ends its streams and long polls at shutdown (missionweave_server/edge/going_away.py)."""
    return grpc.aio.server(
        # With client certificates required, the internal contracts answer mesh services only.
        # Requests are parsed at the edge, not by gRPC: one that does not parse is answered
        # INVALID_ARGUMENT (MALFORMED), never UNKNOWN with a traceback (missionweave_server/edge/status.py).
        # The access log is outermost but for the trace's server span (tracing on only), inside
        # which its line is written: it sees every call's final code, the parsing edge's too.
        interceptors=[
            *tracing.server_interceptors(),
            AccessLog(settings.access_log_rate),
            *([going_away] if going_away is not None else []),
            *(
                [MeshPeersOnly(INTERNAL_SERVICE_NAMES.values())]
                if server_tls is not None and server_tls.mutual
                else []
            ),
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


async def health_listener(address: str, health: MeshHealth) -> tuple[grpc.aio.Server | None, int]:
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
