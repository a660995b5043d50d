"""Throw-away X.509 certificates: a mesh CA and the certificates it issues (docs/tls.md).

``mwp serve --topology split --tls auto`` makes a CA and one certificate per service process in
``<data dir>/tls/`` so that its processes talk TLS and present client certificates to each other
(mTLS) without the operator making any; the tests make theirs with the same functions. Production
meshes bring their own certificates (Kubernetes: from Secrets).

A certificate names a mesh service with the URI SAN ``spiffe://missionweave/<service>``
(``missionweave_server.edge.channels.service_uri``): what the internal services accept from a peer. Keys
are ECDSA P-256; certificates are valid for both server and client authentication.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from missionweave_server.config import Settings
from missionweave_server.edge.channels import listen_host, service_uri

CA_DAYS = 30
LEAF_DAYS = 30


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """``<name>.crt`` and ``<name>.key`` (mode 0600) in ``directory``; their paths."""
        directory.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
        cert_path.write_bytes(self.cert_pem)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(self.key_pem)
        return cert_path, key_path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _issued(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), key_pem, cert, key)


def new_ca(name: str = "MissionWeave mesh CA", days: int = CA_DAYS) -> Issued:
    """A self-signed CA that may issue leaf certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _issued(cert, key)


def issue(
    ca: Issued,
    common_name: str,
    *,
    hosts: Iterable[str] = (),
    service: str | None = None,
    days: int = LEAF_DAYS,
) -> Issued:
    """A leaf certificate signed by ``ca`` for ``hosts`` (DNS names or IP addresses, the names
    clients check) that names the mesh ``service`` when given; usable by servers and clients."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    if service is not None:
        names.append(x509.UniformResourceIdentifier(service_uri(service)))
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return _issued(builder.sign(ca.key, hashes.SHA256()), key)


# ------------------------------------------------------------------ `mwp serve --tls-auto`

# A CA in the data dir is reused while it stays valid this much longer; certificates are made anew
# at every start (their host names follow the listen addresses).
CA_REUSE_MARGIN = datetime.timedelta(days=1)


def tls_dir(data_dir: Path) -> Path:
    return data_dir / "tls"


def load(cert_path: Path, key_path: Path) -> Issued:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path} is not an ECDSA key")
    return _issued(cert, key)


def ensure_ca(directory: Path) -> Issued:
    """The mesh CA in ``directory`` (``ca.crt``, ``ca.key``), made when missing or about to expire."""
    cert_path, key_path = directory / "ca.crt", directory / "ca.key"
    if cert_path.exists() and key_path.exists():
        try:
            ca = load(cert_path, key_path)
            if ca.cert.not_valid_after_utc - _now() > CA_REUSE_MARGIN:
                return ca
        except ValueError:
            pass  # unreadable: replaced below
    ca = new_ca()
    ca.write(directory, "ca")
    return ca


def hosts_for(listen: str) -> list[str]:
    """The names a certificate for a server on ``listen`` carries: its host (every interface: this
    machine's host name), and always localhost and 127.0.0.1."""
    host = listen_host(listen)
    names = ["localhost", "127.0.0.1"]
    if host in ("", "0.0.0.0", "::"):
        names.append(socket.gethostname())
    elif host not in names:
        names.append(host)
    return names


def auto_server_tls(settings: Settings) -> Path:
    """``mwp serve --tls-auto`` in one process: a server certificate from the data dir's mesh CA
    for ``settings.listen``, set as the server's; the CA file clients verify it with."""
    directory = tls_dir(settings.data_dir)
    ca = ensure_ca(directory)
    settings.tls_cert, settings.tls_key = issue(ca, "mwp serve", hosts=hosts_for(settings.listen)).write(
        directory, "server"
    )
    return directory / "ca.crt"
