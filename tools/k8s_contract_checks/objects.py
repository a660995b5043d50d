"""Reading rendered objects: label selectors, a container's env, the Secrets and ConfigMaps a pod
references, and a workload's pod template (whatever its kind)."""

from __future__ import annotations

from .contract import Obj


def matches(selector: Obj, labels: Obj) -> bool:
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def selects(service_selector: Obj | None, labels: Obj) -> bool:
    """Whether a Service's ``spec.selector`` picks pods labelled ``labels`` (none picks no pod)."""
    return matches({"matchLabels": service_selector or {"-": "-"}}, labels)


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env") or []}


def refs(pod: Obj) -> tuple[set[str], set[str]]:
    """The names of the Secrets and of the ConfigMaps a pod spec references, by volume or env."""
    secrets: set[str] = set()
    configmaps: set[str] = set()
    for v in pod.get("volumes") or []:
        if "secret" in v:
            secrets.add(v["secret"]["secretName"])
        if "configMap" in v:
            configmaps.add(v["configMap"]["name"])
        for source in (v.get("projected") or {}).get("sources") or []:
            if "secret" in source:
                secrets.add(source["secret"]["name"])
            if "configMap" in source:
                configmaps.add(source["configMap"]["name"])
    for c in (pod.get("initContainers") or []) + pod["containers"]:
        for e in c.get("envFrom") or []:
            if "secretRef" in e:
                secrets.add(e["secretRef"]["name"])
            if "configMapRef" in e:
                configmaps.add(e["configMapRef"]["name"])
        for e in c.get("env") or []:
            source = e.get("valueFrom") or {}
            if "secretKeyRef" in source:
                secrets.add(source["secretKeyRef"]["name"])
            if "configMapKeyRef" in source:
                configmaps.add(source["configMapKeyRef"]["name"])
    return secrets, configmaps


def template_of(w: Obj) -> Obj:
    """The pod template of a workload, a Job or a CronJob (the db-upgrade Job's template)."""
    spec = w["spec"]["jobTemplate"]["spec"] if w["kind"] == "CronJob" else w["spec"]
    template: Obj = spec["template"]
    return template


def pod_of(w: Obj) -> Obj:
    pod: Obj = template_of(w)["spec"]
    return pod


def labels_of(w: Obj) -> Obj:
    return template_of(w)["metadata"].get("labels") or {}
