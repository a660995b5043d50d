"""TLS everywhere (docs/tls.md): every service's pods mount their own TLS Secret, and every one but
the gateway (whose agents have no client certificates) asks its callers for one (mTLS)."""

from __future__ import annotations

from .contract import TLS_DIR, Contract, Obj
from .objects import env_of

# What ConfigMap missionweave-config must set for every pod (config.check_config asks it).
TLS_CONFIG = {
    "MWP_TLS_CERT": f"{TLS_DIR}/tls.crt",
    "MWP_TLS_KEY": f"{TLS_DIR}/tls.key",
    "MWP_TLS_CA": f"{TLS_DIR}/ca.crt",
    "MWP_TLS_CLIENT_CERT": f"{TLS_DIR}/tls.crt",
    "MWP_TLS_CLIENT_KEY": f"{TLS_DIR}/tls.key",
}


def check_workload_tls(c: Contract, label: str, served: str, pod: Obj, container: Obj) -> None:
    client_ca = (env_of(container).get("MWP_TLS_CLIENT_CA") or {}).get("value")
    if served == "gateway":
        c.check(
            client_ca is None,
            f"{label}: agents have no client certificates: the gateway must not set MWP_TLS_CLIENT_CA",
        )
    else:
        c.check(
            client_ca == f"{TLS_DIR}/ca.crt",
            f"{label}: MWP_TLS_CLIENT_CA must be {TLS_DIR}/ca.crt (mTLS), is {client_ca!r}",
        )
    tls_volumes = {
        v["name"]
        for v in pod.get("volumes") or []
        if (v.get("secret") or {}).get("secretName") == f"missionweave-tls-{served}"
    }
    c.check(
        any(
            m.get("name") in tls_volumes and m.get("mountPath") == TLS_DIR
            for m in container.get("volumeMounts") or []
        ),
        f"{label}: must mount Secret missionweave-tls-{served} at {TLS_DIR}",
    )
