"""What every check shares: the rendered objects, the tally of checks and failures, the figures the
manifests must agree on, and the facts earlier checks learn that later ones compare against."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]  # one rendered object, or any mapping within one, as yaml.safe_load gives it

HEALTH = {
    "authority": "missionweave.v1.AuthorityService",
    "membership": "missionweave.v1.MembershipService",
    "scheduling": "missionweave.v1.SchedulingService",
    "artifacts": "missionweave.v1.ArtifactService",
    "gateway": "missionweave.v1.GatewayService",
}
PART_OF = ("app.kubernetes.io/part-of", "missionweave")
PORT = 50051
HEALTH_PORT = 50052
METRICS_PORT = 9464
CONSOLE_PORT = 50080
TLS_DIR = "/etc/missionweave/tls"


class Contract:
    """One run of the contract on one rendering: each module's checks report here, in the order the
    package's ``run`` calls them, so that the failures are listed in the order they were found."""

    def __init__(self, docs: list[Obj], overlay: bool) -> None:
        self.docs = docs
        self.overlay = overlay  # an overlay, which must render what the base leaves out
        self.problems: list[str] = []
        self.count = 0
        # Learnt by the checks that come first (pod_security, addresses, config, workloads); the
        # defaults stand when a rendering lacks what they are learnt from (which has failed a check).
        self.ns = "missionweave"
        self.domain = "cluster.local"
        self.config: dict[str, str] = {}  # the data of ConfigMap missionweave-config
        self.services: dict[str, Obj] = {d["metadata"]["name"]: d for d in self.of_kind("Service")}
        self.workloads: dict[str, Obj] = {}  # the mesh workload serving each service (MWP_SERVICES)

    def check(self, ok: bool, what: str) -> None:
        self.count += 1
        if not ok:
            self.problems.append(what)

    def of_kind(self, kind: str) -> list[Obj]:
        return [d for d in self.docs if d["kind"] == kind]

    def all_pods(self) -> list[tuple[str, Obj]]:
        """Every workload that runs pods, mesh or not, each with the label its failures name it by."""
        return [
            (f"{w['kind']} {w['metadata']['name']}", w)
            for w in self.of_kind("Deployment")
            + self.of_kind("StatefulSet")
            + self.of_kind("Job")
            + self.of_kind("CronJob")
        ]
