"""Prometheus metrics of every service process, defined once (docs/operations.md "Metrics and logs").

Labels are bounded sets only: command kinds (the ``Command.body`` oneof's field names), rejection
reasons, RPC methods, gRPC codes, service names. Never a Group id or an identity: one series per
Group would grow without bound.

Each process serves them in the Prometheus text format on ``MWP_METRICS_LISTEN`` (``serve``
below; ``Mesh.stop`` stops it). Metrics live in prometheus_client's default registry: meshes
started one after another in one process (the tests) share the same counters, which only grow.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger("missionweave_server.observability.metrics")

# Latency buckets in seconds: sub-millisecond appends on SQLite up to multi-second stalls.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

COMMANDS = Counter(
    "mwp_commands_total",
    "Commands the Authority answered, by kind and outcome (accepted, rejected, replayed).",
    ["kind", "outcome"],
)
REJECTIONS = Counter(
    "mwp_rejections_total",
    "Requests refused with a Rejection at a service's gRPC edge, by service and reason.",
    ["service", "reason"],
)
APPEND_LATENCY = Histogram(
    "mwp_append_latency_seconds",
    "From an append's enqueue to its group commit being durable.",
    buckets=LATENCY_BUCKETS,
)
BATCH_LATENCY = Histogram(
    "mwp_group_commit_latency_seconds",
    "How long one group-commit batch took to write.",
    buckets=LATENCY_BUCKETS,
)
BATCH_SIZE = Histogram(
    "mwp_group_commit_batch_size",
    "Appends per group-commit batch.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
SIGNATURE_FAILURES = Counter(
    "mwp_signature_verification_failures_total",
    "Command envelopes whose signature did not verify with the session key.",
)
LOG_VERIFICATION_FAILURES = Counter(
    "mwp_log_verification_failures_total",
    "Stored Group logs refused as DATA_CORRUPTED when read (docs/integrity.md).",
)
GATEWAY_OPEN_STREAMS = Gauge("mwp_gateway_open_streams", "Gateway Connect streams open now.")
INGRESS_REFUSALS = Counter(
    "mwp_ingress_overloaded_total",
    "Commands refused OVERLOADED by the per-Group ingress rate limiter.",
)
SESSION_LEASES_REVOKED = Counter(
    "mwp_session_lease_revocations_total",
    "Groups where the Authority revoked a replaced session's leases on its own (MW-11.3-09).",
)
ARTIFACT_BYTES = Counter(
    "mwp_artifact_bytes_total",
    "Artifact blob bytes received (in) and served (out).",
    ["direction"],
)
ARTIFACT_VERIFICATION_FAILURES = Counter(
    "mwp_artifact_verification_failures_total",
    "Artifact blobs that failed BLAKE3 verification: uploads whose bytes did not match their declared "
    "digest (upload), stored blobs refused as corrupted when read (at_rest).",
    ["stage"],
)
DELIVERY_LAG = Histogram(
    "mwp_gateway_delivery_lag_events",
    "Events a subscription was behind its Group's head when the gateway sent it an EVENT frame.",
    buckets=(0, 1, 4, 16, 64, 256, 1024, 4096, 16384),
)
GATEWAY_CREDITS = Gauge(
    "mwp_gateway_credits_outstanding",
    "Delivery credits granted to open subscriptions and not yet used (MW-8-17 flow control).",
)
SCHEDULER_DECISIONS = Counter(
    "mwp_scheduler_decisions_total",
    "NextSlot answers of the scheduling service: a WorkItem placed (placed, or aged when fairness "
    "aging chose it), a preemption asked of a running slot (preemption), nothing to place (idle).",
    ["decision"],
)
SCHEDULER_WAIT = Histogram(
    "mwp_scheduler_wait_seconds",
    "How long a placed WorkItem waited in its Worker's queue.",
    buckets=(0.01, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600),
)
RPCS = Counter(
    "mwp_rpcs_total",
    "RPCs answered, by full method and gRPC status code.",
    ["method", "code"],
)
RPC_LATENCY = Histogram(
    "mwp_rpc_latency_seconds",
    "RPC duration, by full method (a stream's lifetime for streaming RPCs).",
    ["method"],
    buckets=LATENCY_BUCKETS,
)
ACCESS_LOG_SUPPRESSED = Counter(
    "mwp_access_log_suppressed_total",
    "Access-log lines not written because of the access log's rate limit.",
)


@dataclass
class MetricsServer:
    """The HTTP endpoint serving the text format (prometheus_client's own WSGI server, a thread)."""

    server: WSGIServer
    thread: threading.Thread
    port: int

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(address: str) -> MetricsServer | None:
    """Serves the metrics at ``host:port`` (port 0 picks one); None when ``address`` is empty.

    A port that cannot be bound raises ``OSError`` naming it: a process asked to serve metrics
    either serves them or does not start (``mesh/ports.py`` checks the port before anything starts;
    this catches one taken in between)."""
    if not address:
        return None
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        server, thread = start_http_server(int(port), addr=host)
    except (OSError, ValueError) as failed:
        raise OSError(f"cannot listen on {address} (metrics): {failed}") from None
    bound = int(server.server_address[1])
    log.info("metrics listening", extra={"listen": address, "port": bound})
    return MetricsServer(server, thread, bound)
