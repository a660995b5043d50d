"""The mesh's workloads (labelled part-of=missionweave; engines run beside the mesh are engines.py's):
one per service, each with one container serving the service its MWP_SERVICES names, on the ports
the mesh expects. What each must hold besides is asked here workload by workload, by concern."""

from __future__ import annotations

from .config import check_workload_refs
from .console import check_workload_console
from .contract import HEALTH, HEALTH_PORT, METRICS_PORT, PART_OF, PORT, Contract
from .objects import env_of, labels_of
from .probes import check_workload_probes
from .tls import check_workload_tls


def check_workloads(c: Contract) -> None:
    """Learns which workload serves which service (``Contract.workloads``) and checks each."""
    for w in c.of_kind("Deployment") + c.of_kind("StatefulSet"):
        if labels_of(w).get(PART_OF[0]) != PART_OF[1]:
            continue  # an engine run beside the mesh (the dev overlay's PostgreSQL and S3 store)
        label = f"{w['kind']} {w['metadata']['name']}"
        pod = w["spec"]["template"]["spec"]
        containers = pod["containers"]
        c.check(len(containers) == 1, f"{label}: expected one container, found {len(containers)}")
        container = containers[0]
        served = (env_of(container).get("MWP_SERVICES") or {}).get("value", "")
        c.check(
            served in HEALTH,
            f"{label}: MWP_SERVICES must name one service of {sorted(HEALTH)}, is {served!r}",
        )
        if served not in HEALTH:
            continue
        c.check(served not in c.workloads, f"{label}: a second workload serves {served}")
        c.workloads[served] = w
        check_workload_probes(c, label, served, container)
        declared = {p.get("containerPort") for p in container.get("ports") or []}
        c.check(
            {PORT, HEALTH_PORT} <= declared, f"{label}: must declare container ports {PORT} and {HEALTH_PORT}"
        )
        # Prometheus finds every pod's metrics (MWP_METRICS_LISTEN) by its annotations.
        scrape = w["spec"]["template"].get("metadata", {}).get("annotations") or {}
        c.check(
            METRICS_PORT in declared
            and scrape.get("prometheus.io/scrape") == "true"
            and scrape.get("prometheus.io/port") == str(METRICS_PORT),
            f"{label}: must declare container port {METRICS_PORT} and annotate prometheus.io/scrape and /port for it",
        )
        check_workload_tls(c, label, served, pod, container)
        check_workload_refs(c, label, served, pod, container)
        check_workload_console(c, label, served, container)
    c.check(
        sorted(c.workloads) == sorted(HEALTH),
        f"workloads serve {sorted(c.workloads)}, expected {sorted(HEALTH)}",
    )
