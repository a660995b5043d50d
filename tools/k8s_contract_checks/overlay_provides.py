"""What the pods read and an overlay (not the base) provides: every ConfigMap, either every Secret or
none (created out of band), and in the Secrets it renders no placeholder, keys of the right form."""

from __future__ import annotations

import base64
import re

from .contract import Contract, Obj
from .objects import pod_of, refs

# The words the old placeholder Secrets used. Not searched in PEM, whose base64 may spell anything.
PLACEHOLDER = re.compile(r"CHANGE_?ME|REPLACE|PLACEHOLDER", re.IGNORECASE)
HEX64 = re.compile(r"[0-9a-f]{64}\s*")


def rendered_secrets(c: Contract) -> dict[str, Obj]:
    return {d["metadata"]["name"]: d for d in c.of_kind("Secret")}


def check_provided(c: Contract) -> None:
    secrets = rendered_secrets(c)
    configmaps = {d["metadata"]["name"] for d in c.of_kind("ConfigMap")}
    wanted_secrets: set[str] = set()
    wanted_configmaps: set[str] = set()
    for _label, w in c.all_pods():
        got_s, got_c = refs(pod_of(w))
        wanted_secrets |= got_s
        wanted_configmaps |= got_c
    if c.overlay:
        c.check(
            wanted_configmaps <= configmaps,
            f"the pods read ConfigMaps the overlay does not render: {sorted(wanted_configmaps - configmaps)}",
        )
        # All or nothing: an overlay generates every Secret (dev) or leaves them all to the operator (prod).
        c.check(
            not secrets or wanted_secrets <= set(secrets),
            f"the overlay renders Secrets but not {sorted(wanted_secrets - set(secrets))}",
        )
    else:
        c.check(not secrets, "the base renders no Secret: the overlays provide them")
    for name, sec in secrets.items():
        values = {k: base64.b64decode(v).decode() for k, v in (sec.get("data") or {}).items()}
        values.update(sec.get("stringData") or {})
        for k, v in values.items():
            c.check("-----BEGIN" in v or not PLACEHOLDER.search(v), f"Secret {name}: {k} holds a placeholder")
        for key in ("authority.key", "admin.key", "mesh.token"):
            if key in values:
                c.check(bool(HEX64.fullmatch(values[key])), f"Secret {name}: {key} must be 64 hex characters")
        if sec.get("type") == "kubernetes.io/tls":
            c.check(
                all("-----BEGIN" in values.get(k, "") for k in ("tls.crt", "tls.key", "ca.crt")),
                f"Secret {name}: tls.crt, tls.key and ca.crt must be PEM",
            )
