"""A mesh pod's probes: kubelet's gRPC health checks, startup and readiness for the service it serves,
liveness for the server as a whole."""

from __future__ import annotations

from .contract import HEALTH, HEALTH_PORT, PORT, Contract, Obj


def check_workload_probes(c: Contract, label: str, served: str, container: Obj) -> None:
    for probe in ("startupProbe", "readinessProbe"):
        got = ((container.get(probe) or {}).get("grpc") or {}).get("service")
        c.check(
            got == HEALTH[served], f"{label}: {probe} must be gRPC health for {HEALTH[served]}, is {got!r}"
        )
    live = (container.get("livenessProbe") or {}).get("grpc")
    c.check(
        live is not None and live.get("service", "") == "",
        f"{label}: livenessProbe must be gRPC health for ''",
    )
    # TLS: kubelet's gRPC probes speak plain text, so they ask the health-only port (MWP_HEALTH_LISTEN).
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = ((container.get(probe) or {}).get("grpc") or {}).get("port")
        c.check(
            port == HEALTH_PORT,
            f"{label}: {probe} must ask the health port {HEALTH_PORT} (TLS on {PORT}), asks {port!r}",
        )
