"""The front door's names: the clients' proofs name the address they dialled (MWP_AUDIENCE), browsers
the console's Host (MWP_CONSOLE_HOSTS); both must name the gateway in this namespace and domain, and
every Ingress host that leads to it. An Ingress ends TLS and leads to the gateway only."""

from __future__ import annotations

import re

from .contract import CONSOLE_PORT, PORT, Contract
from .objects import env_of, pod_of


def check_front_door(c: Contract) -> None:
    ns, domain = c.ns, c.domain
    audience = [a.strip() for a in c.config.get("MWP_AUDIENCE", "").split(",") if a.strip()]
    c.check(
        f"gateway.{ns}.svc.{domain}:{PORT}" in audience,
        f"MWP_AUDIENCE must name gateway.{ns}.svc.{domain}:{PORT}, is {audience}",
    )
    gateway_env = env_of(pod_of(c.workloads["gateway"])["containers"][0]) if "gateway" in c.workloads else {}
    console_hosts = [
        h.strip() for h in ((gateway_env.get("MWP_CONSOLE_HOSTS") or {}).get("value") or "").split(",")
    ]
    c.check(
        f"gateway.{ns}.svc.{domain}:{CONSOLE_PORT}" in console_hosts,
        f"MWP_CONSOLE_HOSTS must name gateway.{ns}.svc.{domain}:{CONSOLE_PORT}",
    )
    for name in audience + console_hosts:
        m = re.fullmatch(r"[a-z0-9-]+\.([a-z0-9-]+)\.svc(?:\.([a-z0-9.-]+))?:\d+", name)
        if m:
            c.check(
                m.group(1) == ns and m.group(2) in (None, domain),
                f"{name} names another namespace or cluster domain than {ns}, {domain}",
            )
    for ing in c.of_kind("Ingress"):
        label = f"Ingress {ing['metadata']['name']}"
        tls_hosts = {h for t in ing["spec"].get("tls") or [] for h in t.get("hosts") or []}
        c.check(bool(tls_hosts), f"{label}: must end TLS (spec.tls): the front door speaks nothing else")
        for rule in ing["spec"].get("rules") or []:
            host = rule.get("host")
            c.check(host in tls_hosts, f"{label}: host {host!r} has no TLS certificate (spec.tls)")
            for path in (rule.get("http") or {}).get("paths") or []:
                backend = path["backend"].get("service") or {}
                port = (backend.get("port") or {}).get("name") or (backend.get("port") or {}).get("number")
                c.check(
                    backend.get("name") == "gateway",
                    f"{label}: leads to {backend.get('name')!r}: only the gateway is a front door",
                )
                if port in ("grpc", PORT):
                    c.check(
                        f"{host}:443" in audience,
                        f"{label}: MWP_AUDIENCE must name {host}:443, the address agents dial",
                    )
                elif port in ("console", CONSOLE_PORT):
                    c.check(
                        host in console_hosts,
                        f"{label}: MWP_CONSOLE_HOSTS must name {host}, the Host browsers send",
                    )
                else:
                    c.check(False, f"{label}: leads to gateway port {port!r}, neither grpc nor console")
        notes = ing["metadata"].get("annotations") or {}
        for key, want in (
            ("nginx.ingress.kubernetes.io/proxy-ssl-name", f"gateway.{ns}.svc.{domain}"),
            ("nginx.ingress.kubernetes.io/proxy-ssl-secret", f"{ns}/missionweave-tls-gateway"),
        ):
            if key in notes:
                c.check(notes[key] == want, f"{label}: {key} must be {want}, is {notes[key]!r}")
