"""Where the process serving the gateway also serves the web console (MWP_CONSOLE_LISTEN, docs/console.md).

The console relays to this process's own public listener through an ordinary client channel, so
its calls pass the same authentication, authorization, limits and access log as any other client's.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from missionweave.kernel.transport import ClientTLS, open_channel
from missionweave_server.config import Settings
from missionweave_server.console.site import ConsoleServer, serve_console
from missionweave_server.edge.channels import ServerTLS
from missionweave_server.mesh import certs


def check_console_tls(settings: Settings, server_tls: ServerTLS | None, peer_tls: ClientTLS | None) -> None:
    """Before anything starts: a console that could not dial this mesh ends the start-up now."""
    if settings.console_listen and server_tls is not None and _dial_tls(settings, peer_tls) is None:
        raise ValueError(
            "the console (MWP_CONSOLE_LISTEN) dials this mesh over TLS and needs its CA: set MWP_TLS_CA "
            "(and a client certificate where clients must present one), or --console-listen '' for no console"
        )


def _dial_tls(settings: Settings, peer_tls: ClientTLS | None) -> ClientTLS | None:
    """How this process dials itself over TLS: as it dials its peers, or with ``--tls-auto`` (which
    sets no MWP_TLS_CA) with the throw-away CA that issued its certificate."""
    if peer_tls is None and settings.tls_auto:
        ca = certs.tls_dir(settings.data_dir) / "ca.crt"
        return ClientTLS(ca) if ca.is_file() else None
    return peer_tls


def self_server_name(cert_file: Path, host: str) -> str:
    """The name to check this server's own certificate against when dialling it at ``host``: none
    (``host`` itself) when the certificate names it, else a name it carries (``localhost``, else its
    first DNS name, else its common name). A certificate for a cluster name (k8s/make-tls-certs.sh)
    names no loopback address, and the console dials loopback."""
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = sans.get_values_for_type(x509.DNSName)
        ips = sans.get_values_for_type(x509.IPAddress)
    except x509.ExtensionNotFound:
        dns, ips = [], []
    try:
        if ipaddress.ip_address(host) in ips:
            return ""
    except ValueError:  # a name, not an address
        if host.lower() in (name.lower() for name in dns):
            return ""
    if "localhost" in dns:
        return "localhost"
    concrete = [name for name in dns if not name.startswith("*.")]
    if concrete:
        return concrete[0]
    if dns:  # only wildcards: any one label matches
        return "mwp-console" + dns[0][1:]
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(common[0].value) if common else ""


async def start_console(
    settings: Settings, port: int, server_tls: ServerTLS | None, peer_tls: ClientTLS | None
) -> ConsoleServer:
    host = settings.listen.rsplit(":", 1)[0].strip("[]")
    target_host = "127.0.0.1" if host in ("", "0.0.0.0", "::", "localhost") else host
    target = f"[{target_host}]:{port}" if ":" in target_host else f"{target_host}:{port}"
    dial: ClientTLS | None = None
    tls: ssl.SSLContext | None = None
    if server_tls is not None:  # the page is served as the rest: over TLS, with the mesh's certificate
        dial = _dial_tls(settings, peer_tls)
        assert dial is not None  # check_console_tls refused the start otherwise
        dial = dataclasses.replace(dial, server_name=self_server_name(server_tls.cert_file, target_host))
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(server_tls.cert_file, server_tls.key_file)
    channel = open_channel(target, dial)
    try:
        return await serve_console(
            settings.console_listen,
            channel,
            target,
            hosts=settings.console_hosts,
            tls=tls,
            log_rate=settings.access_log_rate,
        )
    except BaseException:
        await channel.close()
        raise
