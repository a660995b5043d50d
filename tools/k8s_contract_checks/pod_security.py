"""One Namespace holds every namespaced object and enforces the restricted Pod Security Standard;
every pod (Deployments, StatefulSets, Jobs, CronJobs) meets it, so that a pod the admission would
refuse fails offline."""

from __future__ import annotations

from .contract import Contract, Obj
from .objects import pod_of


def check_namespace_and_pods(c: Contract) -> None:
    namespaces = c.of_kind("Namespace")
    c.check(len(namespaces) == 1, f"expected one Namespace, found {len(namespaces)}")
    c.ns = namespaces[0]["metadata"]["name"] if namespaces else "missionweave"
    c.check(
        bool(namespaces)
        and (namespaces[0]["metadata"].get("labels") or {}).get("pod-security.kubernetes.io/enforce")
        == "restricted",
        f"Namespace {c.ns} must enforce the restricted Pod Security Standard",
    )
    for d in c.docs:
        if d["kind"] != "Namespace":
            got = d["metadata"].get("namespace")
            c.check(got == c.ns, f"{d['kind']} {d['metadata']['name']} is in namespace {got!r}, not {c.ns}")
    for label, w in c.all_pods():
        restricted(c, pod_of(w), label)


def restricted(c: Contract, pod: Obj, label: str) -> None:
    """The restricted Pod Security Standard the namespace enforces."""
    ctx = pod.get("securityContext") or {}
    c.check(ctx.get("runAsNonRoot") is True, f"{label}: securityContext.runAsNonRoot must be true")
    c.check(
        (ctx.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
        f"{label}: seccompProfile must be RuntimeDefault",
    )
    c.check(
        pod.get("automountServiceAccountToken") is False, f"{label}: must not mount a service account token"
    )
    for container in (pod.get("initContainers") or []) + pod["containers"]:
        sc = container.get("securityContext") or {}
        c.check(
            sc.get("allowPrivilegeEscalation") is False
            and sc.get("readOnlyRootFilesystem") is True
            and (sc.get("capabilities") or {}).get("drop") == ["ALL"]
            and not (sc.get("capabilities") or {}).get("add"),
            f"{label}: container {container['name']} must drop ALL capabilities, forbid privilege "
            "escalation and run on a read-only root filesystem",
        )
