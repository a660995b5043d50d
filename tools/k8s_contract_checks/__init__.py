"""The runtime contract of docs/kubernetes.md on the objects ``kubectl kustomize`` rendered from
k8s/base or one of k8s/overlays/ (tools/k8s_contract.py runs it; .ci/k8s-validate runs that on each).

The namespace is the rendered Namespace's, the cluster domain the one the first Authority shard
advertises; every other in-cluster name must agree with both. An overlay must also render what an
applied overlay needs and the base leaves out: every ConfigMap the pods read, either every Secret or
none (created out of band), no placeholder in a Secret, and engines run beside the mesh (PostgreSQL,
the S3 store) that are reachable by their consumers only.

One module per concern; ``run`` calls their checks in a fixed order, as later checks compare against
what earlier ones learn (the namespace, the cluster domain, the shared ConfigMap, which workload
serves which service).
"""

from __future__ import annotations

from . import (
    addresses,
    config,
    console,
    db_upgrade,
    engines,
    front_door,
    overlay_provides,
    pod_security,
    policies,
    workloads,
)
from .contract import Contract, Obj


def run(docs: list[Obj], overlay: bool) -> Contract:
    """Every check on one rendering: ``overlay`` for an overlay, false for k8s/base."""
    c = Contract(docs, overlay)
    pod_security.check_namespace_and_pods(c)
    addresses.find_cluster_domain(c)
    config.find_config(c)
    workloads.check_workloads(c)
    config.check_config(c)
    console.check_console_config_and_service(c)
    addresses.check_addresses(c)
    policies.check_disruption_budgets(c)
    policies.check_network_policies(c)
    front_door.check_front_door(c)
    overlay_provides.check_provided(c)
    engines.check_engines(c)
    db_upgrade.check_db_upgrade(c)
    return c
