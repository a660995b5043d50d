"""The policies that select the mesh's pods: one PodDisruptionBudget per workload that protects a pod
and still lets a drain go on; NetworkPolicies that deny by default, let anyone reach the gateway and
the rest only from the mesh's own pods."""

from __future__ import annotations

from .contract import CONSOLE_PORT, METRICS_PORT, PART_OF, Contract, Obj
from .objects import matches

BAD_PDB = "protects no pod, or lets no drain evict one (needs 1 <= n < replicas)"


def ingress_policies(c: Contract) -> list[Obj]:
    """The NetworkPolicies that govern ingress (those without policyTypes do)."""
    return [
        p for p in c.of_kind("NetworkPolicy") if "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
    ]


def ingress_rules(policies: list[Obj], labels: Obj) -> list[Obj]:
    """Every ingress rule that applies to pods labelled ``labels``."""
    return [
        r
        for p in policies
        if matches(p["spec"].get("podSelector") or {}, labels)
        for r in p["spec"].get("ingress") or []
    ]


def check_disruption_budgets(c: Contract) -> None:
    pdbs = c.of_kind("PodDisruptionBudget")
    for served, w in c.workloads.items():
        labels = w["spec"]["template"]["metadata"]["labels"]
        replicas = w["spec"].get("replicas", 1)
        mine = [p for p in pdbs if matches(p["spec"]["selector"], labels)]
        c.check(len(mine) == 1, f"{served}: expected one PodDisruptionBudget, found {len(mine)}")
        for p in mine:
            spec = p["spec"]
            if "maxUnavailable" in spec:
                m = spec["maxUnavailable"]
                ok = isinstance(m, int) and 1 <= m < replicas
                c.check(
                    ok, f"PDB {p['metadata']['name']}: maxUnavailable {m!r} of {replicas} replicas {BAD_PDB}"
                )
            else:
                n = spec.get("minAvailable")
                ok = isinstance(n, int) and 1 <= n < replicas
                c.check(
                    ok, f"PDB {p['metadata']['name']}: minAvailable {n!r} of {replicas} replicas {BAD_PDB}"
                )


def check_network_policies(c: Contract) -> None:
    policies = ingress_policies(c)
    c.check(
        any(p["spec"].get("podSelector") == {} and not p["spec"].get("ingress") for p in policies),
        "no default-deny ingress NetworkPolicy",
    )
    gateway_labels = (
        c.workloads["gateway"]["spec"]["template"]["metadata"]["labels"] if "gateway" in c.workloads else {}
    )
    for served, w in c.workloads.items():
        labels = w["spec"]["template"]["metadata"]["labels"]
        rules = ingress_rules(policies, labels)
        c.check(bool(rules), f"{served}: no NetworkPolicy lets anything in")
        if served == "gateway":
            c.check(any(not r.get("from") for r in rules), "gateway: must accept gRPC from anywhere")
            c.check(
                any(
                    not r.get("from")
                    and (
                        not r.get("ports")
                        or any(p.get("port") in ("console", CONSOLE_PORT) for p in r["ports"])
                    )
                    for r in rules
                ),
                f"gateway: must accept the web console ({CONSOLE_PORT}) from anywhere",
            )
            continue
        for r in rules:
            peers = r.get("from") or []
            if r.get("ports") and all(p.get("port") in ("metrics", METRICS_PORT) for p in r["ports"]):
                continue  # the metrics port alone (Prometheus, from its namespace): never gRPC
            c.check(
                bool(peers)
                and all(
                    set(x) == {"podSelector"}
                    and (x["podSelector"].get("matchLabels") or {}).get(PART_OF[0]) == PART_OF[1]
                    for x in peers
                ),
                f"{served}: an ingress rule admits more than this namespace's pods labelled {PART_OF[0]}={PART_OF[1]}: {r}",
            )
        # Same-namespace pod peers only (any other kind of peer already failed above).
        sources = [x["podSelector"] for r in rules for x in r.get("from") or [] if set(x) == {"podSelector"}]
        c.check(
            any(matches(sel, gateway_labels) for sel in sources), f"{served}: the gateway cannot reach it"
        )
        if served == "authority":
            c.check(
                any(matches(sel, labels) for sel in sources), "authority: shards cannot reach one another"
            )
