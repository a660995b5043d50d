"""The web console (docs/console.md): served where the gateway is, and only there, on its own port,
answering only the Host headers it is told (MWP_CONSOLE_HOSTS)."""

from __future__ import annotations

from .contract import CONSOLE_PORT, Contract, Obj
from .objects import env_of


def check_workload_console(c: Contract, label: str, served: str, container: Obj) -> None:
    declared = {p.get("containerPort") for p in container.get("ports") or []}
    named = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
    console_listen = (env_of(container).get("MWP_CONSOLE_LISTEN") or {}).get("value")
    if served == "gateway":
        c.check(
            console_listen == f"0.0.0.0:{CONSOLE_PORT}",
            f"{label}: the gateway serves the web console: MWP_CONSOLE_LISTEN must be 0.0.0.0:{CONSOLE_PORT}, is {console_listen!r}",
        )
        c.check(
            named.get("console") == CONSOLE_PORT,
            f"{label}: must declare container port {CONSOLE_PORT} named console",
        )
        hosts = [
            h.strip()
            for h in ((env_of(container).get("MWP_CONSOLE_HOSTS") or {}).get("value") or "").split(",")
            if h.strip()
        ]
        c.check(
            bool(hosts),
            f"{label}: MWP_CONSOLE_HOSTS must name the Host headers the console answers to "
            "(on 0.0.0.0 without it, it answers any: no defence against DNS rebinding)",
        )
    else:
        c.check(
            "console" not in named and CONSOLE_PORT not in declared and not console_listen,
            f"{label}: only the gateway serves the web console",
        )


def check_console_config_and_service(c: Contract) -> None:
    for key in ("MWP_CONSOLE_LISTEN", "MWP_CONSOLE_HOSTS"):
        c.check(
            key not in c.config, f"ConfigMap missionweave-config must not set {key} (the gateway's own env)"
        )
    gateway_service = (c.services.get("gateway") or {}).get("spec") or {}
    c.check(
        any(
            p.get("port") == CONSOLE_PORT and p.get("targetPort") in ("console", CONSOLE_PORT)
            for p in gateway_service.get("ports") or []
        ),
        f"Service gateway must expose the web console: port {CONSOLE_PORT} to the pods' port console",
    )
