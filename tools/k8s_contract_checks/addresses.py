"""In-cluster addresses: the cluster domain (the one the first Authority shard advertises, which every
other name must agree with), the StatefulSets whose pods are dialled by name, and the peers dialled
through one ClusterIP Service each."""

from __future__ import annotations

import re

from .contract import PORT, Contract, Obj
from .objects import env_of, pod_of, selects


def find_cluster_domain(c: Contract) -> None:
    for sts in c.of_kind("StatefulSet"):
        if sts["metadata"]["name"] == "authority":
            env = env_of(pod_of(sts)["containers"][0])
            advertised = (env.get("MWP_ADVERTISE_ADDR") or {}).get("value") or ""
            m = re.fullmatch(r"\$\(POD_NAME\)\.[a-z0-9-]+\.[a-z0-9-]+\.svc\.([a-z0-9.-]+):\d+", advertised)
            c.check(m is not None, f"authority: MWP_ADVERTISE_ADDR {advertised!r} names no cluster domain")
            c.domain = m.group(1) if m else c.domain


def check_addresses(c: Contract) -> None:
    check_pods_listed(c, "scheduling")
    # The Authority shards also advertise their own address (named in NOT_OWNER answers).
    listed = check_pods_listed(c, "authority")
    if listed is not None:
        sts, headless, ns = listed
        env = env_of(sts["spec"]["template"]["spec"]["containers"][0])
        names = [e["name"] for e in sts["spec"]["template"]["spec"]["containers"][0].get("env") or []]
        for key in ("MWP_INSTANCE_ID", "POD_NAME"):
            got = ((env.get(key) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
            c.check(
                got == "metadata.name",
                f"authority: {key} must come from the downward API's metadata.name, is {got!r}",
            )
        advertise = (env.get("MWP_ADVERTISE_ADDR") or {}).get("value")
        c.check(
            advertise == f"$(POD_NAME).{headless}.{ns}.svc.{c.domain}:{PORT}",
            f"authority: MWP_ADVERTISE_ADDR is {advertise!r}",
        )
        c.check(
            "POD_NAME" in names
            and "MWP_ADVERTISE_ADDR" in names
            and names.index("POD_NAME") < names.index("MWP_ADVERTISE_ADDR"),
            "authority: POD_NAME must be defined before MWP_ADVERTISE_ADDR (which expands it)",
        )

    # The other peers: one ClusterIP Service each, selecting the pods that serve it.
    for peer in ("membership", "artifacts"):
        key = f"MWP_{peer.upper()}_ADDR"
        w = c.workloads.get(peer)
        s = c.services.get(peer) or {}
        ns = s.get("metadata", {}).get("namespace", "?")
        c.check(
            c.config.get(key) == f"{peer}.{ns}.svc.{c.domain}:{PORT}",
            f"{key} must be {peer}.{ns}.svc.{c.domain}:{PORT}, is {c.config.get(key)!r}",
        )
        c.check(
            bool(s) and any(p.get("port") == PORT for p in s["spec"].get("ports") or []),
            f"Service {peer} must serve port {PORT}",
        )
        c.check(
            bool(s)
            and w is not None
            and selects(s["spec"].get("selector"), w["spec"]["template"]["metadata"]["labels"]),
            f"Service {peer} must select the {peer} pods",
        )


def check_pods_listed(c: Contract, service: str) -> tuple[Obj, str, str] | None:
    """A StatefulSet of several pods, its headless Service, and MWP_<SERVICE>_ADDR listing every
    pod in ordinal order: the Authority's shards (placed by Group) and the scheduling replicas
    (placed by Worker) are each dialled by name, never through a balancing Service."""
    sts = c.workloads.get(service)
    c.check(sts is not None and sts["kind"] == "StatefulSet", f"{service} must be a StatefulSet")
    if sts is None or sts["kind"] != "StatefulSet":
        return None
    name, ns = sts["metadata"]["name"], sts["metadata"]["namespace"]
    headless = sts["spec"]["serviceName"]
    replicas = sts["spec"].get("replicas", 1)
    c.check(replicas >= 2, f"{service} runs {replicas} pod(s): the split topology has several")
    hs = c.services.get(headless) or {}
    c.check(
        hs.get("spec", {}).get("clusterIP") == "None",
        f"Service {headless} must exist and be headless (clusterIP: None)",
    )
    c.check(
        selects(hs.get("spec", {}).get("selector"), sts["spec"]["template"]["metadata"]["labels"]),
        f"Service {headless} must select the {service} pods",
    )
    c.check(
        any(p.get("port") == PORT for p in hs.get("spec", {}).get("ports") or []),
        f"Service {headless} must serve port {PORT}",
    )
    key = f"MWP_{service.upper()}_ADDR"
    expected = [f"{name}-{i}.{headless}.{ns}.svc.{c.domain}:{PORT}" for i in range(replicas)]
    got = [a.strip() for a in c.config.get(key, "").split(",") if a.strip()]
    c.check(got == expected, f"{key} must list the {replicas} pods in ordinal order: {expected}, is {got}")
    c.check(service not in c.services, f"no balancing Service '{service}' in front of its pods")
    return sts, headless, ns
