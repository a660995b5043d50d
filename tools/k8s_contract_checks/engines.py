"""Engines run beside the mesh (the dev overlay's PostgreSQL and S3 store): the address the mesh is
given must be a Service of this namespace selecting one of them; their pods are probed and admitted
only from the pods that use them. An engine outside the cluster (prod) is not checked."""

from __future__ import annotations

import base64
from urllib.parse import urlsplit

from .contract import PART_OF, Contract
from .objects import labels_of, matches, pod_of, refs, selects
from .overlay_provides import rendered_secrets
from .policies import ingress_policies, ingress_rules


def check_engines(c: Contract) -> None:
    policies = ingress_policies(c)
    engine_workloads = [
        w
        for w in c.of_kind("Deployment") + c.of_kind("StatefulSet")
        if labels_of(w).get(PART_OF[0]) != PART_OF[1]
    ]
    s3_config = next(
        (d.get("data") or {} for d in c.of_kind("ConfigMap") if d["metadata"]["name"] == "missionweave-s3"),
        {},
    )
    db_secret = rendered_secrets(c).get("missionweave-database")
    db_url = ""
    if db_secret:
        db_url = (db_secret.get("stringData") or {}).get("MWP_DATABASE_URL") or base64.b64decode(
            (db_secret.get("data") or {}).get("MWP_DATABASE_URL", "")
        ).decode()
    mesh_labels = {served: labels_of(w) for served, w in c.workloads.items()}
    bucket_jobs = [j for j in c.of_kind("Job") if "missionweave-s3" in refs(pod_of(j))[1]]
    endpoints = [
        ("database", db_url, list(mesh_labels.values())),
        ("S3 store", s3_config.get("MWP_S3_ENDPOINT", ""), [mesh_labels.get("artifacts", {})]),
    ]
    for what, url, consumers in endpoints:
        host = urlsplit(url).hostname or ""
        in_cluster = host.endswith(f".svc.{c.domain}") or host.endswith(".svc")
        if not in_cluster:
            continue
        c.check(host.split(".")[1:2] == [c.ns], f"the {what} {host} is in another namespace than {c.ns}")
        svc = c.services.get(host.split(".")[0])
        c.check(svc is not None, f"the {what} {host}: no Service {host.split('.')[0]} rendered")
        if svc is None:
            continue
        port = urlsplit(url).port
        c.check(
            any(p.get("port") == port for p in svc["spec"].get("ports") or []),
            f"Service {host.split('.')[0]} must serve port {port} ({what})",
        )
        backing = [w for w in engine_workloads if selects(svc["spec"].get("selector"), labels_of(w))]
        c.check(
            len(backing) == 1,
            f"the {what}: Service {host.split('.')[0]} selects {len(backing)} workloads, expected one",
        )
        if what == "S3 store":
            c.check(bool(bucket_jobs), "the S3 store runs in the cluster: a Job must create the bucket")
            consumers = consumers + [labels_of(j) for j in bucket_jobs]
        for w in backing:
            label = f"{w['kind']} {w['metadata']['name']} ({what})"
            container = pod_of(w)["containers"][0]
            c.check(
                all(container.get(p) for p in ("readinessProbe", "livenessProbe")),
                f"{label}: needs readiness and liveness probes",
            )
            rules = ingress_rules(policies, labels_of(w))
            peers = [x for r in rules for x in r.get("from") or []]
            c.check(
                bool(rules)
                and all(r.get("from") for r in rules)
                and all(set(x) == {"podSelector"} for x in peers),
                f"{label}: its NetworkPolicies must admit named pods of this namespace only",
            )
            sources = [x["podSelector"] for x in peers if set(x) == {"podSelector"}]
            for want in consumers:
                c.check(
                    any(matches(sel, want) for sel in sources),
                    f"{label}: pods labelled {want} cannot reach it",
                )
