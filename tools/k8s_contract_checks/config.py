"""ConfigMap missionweave-config, which every mesh pod reads, and the Secrets and ConfigMaps each
service's pods reference (their own, and no others')."""

from __future__ import annotations

from .contract import HEALTH, HEALTH_PORT, METRICS_PORT, Contract, Obj
from .objects import env_of, refs
from .tls import TLS_CONFIG

# The Secrets and ConfigMaps each service's pods may reference, and no others.
SECRETS = {
    "authority": {"missionweave-database", "missionweave-authority-key"},
    "membership": {"missionweave-database", "missionweave-admin-key"},
    "scheduling": {"missionweave-database"},
    "artifacts": {"missionweave-database", "missionweave-s3"},
    "gateway": {"missionweave-database"},
}
# Every service's pods mount their own TLS Secret, and only theirs (docs/tls.md).
# ...and the mesh token every service proves itself to its peers with (docs/security.md).
for _name in SECRETS:
    SECRETS[_name].add(f"missionweave-tls-{_name}")
    SECRETS[_name].add("missionweave-mesh-token")
CONFIGMAPS = {name: {"missionweave-config"} for name in HEALTH}
CONFIGMAPS["artifacts"] = {"missionweave-config", "missionweave-s3"}


def find_config(c: Contract) -> None:
    config = next(
        (
            d.get("data") or {}
            for d in c.of_kind("ConfigMap")
            if d["metadata"]["name"] == "missionweave-config"
        ),
        None,
    )
    c.check(config is not None, "ConfigMap missionweave-config is missing")
    c.config = config or {}


def check_workload_refs(c: Contract, label: str, served: str, pod: Obj, container: Obj) -> None:
    secrets, configmaps = refs(pod)
    c.check(
        secrets == SECRETS[served],
        f"{label}: references Secrets {sorted(secrets)}, expected {sorted(SECRETS[served])}",
    )
    c.check(
        configmaps == CONFIGMAPS[served],
        f"{label}: references ConfigMaps {sorted(configmaps)}, expected {sorted(CONFIGMAPS[served])}",
    )
    c.check(
        ("MWP_AUTHORITY_KEY" in env_of(container)) == (served == "authority"),
        f"{label}: MWP_AUTHORITY_KEY is for authority pods only",
    )
    c.check(
        "MWP_DATABASE_URL" in env_of(container),
        f"{label}: every service keeps its tables in the database (MWP_DATABASE_URL)",
    )


def check_config(c: Contract) -> None:
    """What the shared ConfigMap sets, and what it must leave to each pod (console.py asks for the
    gateway's own keys right after)."""
    config = c.config
    for key in (
        "MWP_AUTHORITY_KEY",
        "MWP_DATABASE_URL",
        "MWP_INSTANCE_ID",
        "MWP_ADVERTISE_ADDR",
        "MWP_SERVICES",
    ):
        c.check(key not in config, f"ConfigMap missionweave-config must not set the per-pod {key}")
    for key in config:
        c.check(
            not key.startswith(("MWP_S3_", "AWS_")),
            f"ConfigMap missionweave-config must not set {key} (artifacts only)",
        )
    for key, value in TLS_CONFIG.items():
        c.check(
            config.get(key) == value,
            f"ConfigMap missionweave-config: {key} must be {value}, is {config.get(key)!r}",
        )
    c.check(
        config.get("MWP_METRICS_LISTEN") == f"0.0.0.0:{METRICS_PORT}",
        f"ConfigMap missionweave-config: MWP_METRICS_LISTEN must be 0.0.0.0:{METRICS_PORT}",
    )
    c.check(
        config.get("MWP_HEALTH_LISTEN") == f"0.0.0.0:{HEALTH_PORT}",
        f"ConfigMap missionweave-config: MWP_HEALTH_LISTEN must be 0.0.0.0:{HEALTH_PORT}",
    )
    c.check(
        config.get("MWP_INSECURE", "0").lower() in ("", "0", "false", "no", "off"),
        "ConfigMap missionweave-config must not set MWP_INSECURE: the pods serve TLS",
    )
    c.check("MWP_TLS_CLIENT_CA" not in config, "MWP_TLS_CLIENT_CA is per workload (not the gateway)")
