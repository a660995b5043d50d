"""A client's gRPC channel, with or without TLS (docs/tls.md): what the SDK and any other client
needs and nothing of a server's (no tracing or metrics machinery is imported here; the mesh's own
channels add their tracing interceptors in ``missionweave_server.edge.channels``).

TLS is described by ``ClientTLS``: the CA that verifies servers, an optional client certificate for
mTLS, an optional server name override, read from the ``MWP_TLS*`` environment (missionweave_server/config.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from missionweave.kernel.env import env_flag, env_path

ChannelOptions = Sequence[tuple[str, Any]]

# What every channel's calls pass through besides the caller's own interceptors: each factory is
# asked at the channel's opening. ``missionweave_server.observability.tracing`` registers its client spans here when it
# is imported (the servers and the CLI import it), so that the SDK's calls carry the caller's trace
# context in such a process while the SDK itself imports no tracing machinery.
CHANNEL_INTERCEPTORS: list[Callable[[], Sequence[grpc.aio.ClientInterceptor]]] = []


class ClientTLSSettings(Protocol):
    """The client TLS settings ``ClientTLS.from_settings`` reads (``missionweave_server.config.Settings``)."""

    @property
    def tls(self) -> bool: ...
    @property
    def tls_ca(self) -> Path | None: ...
    @property
    def tls_client_cert(self) -> Path | None: ...
    @property
    def tls_client_key(self) -> Path | None: ...
    @property
    def tls_server_name(self) -> str: ...


@dataclass
class ClientTLSConfig:
    """The client TLS settings of an environment (``client_tls_config``), which flags may then override."""

    tls: bool
    tls_ca: Path | None
    tls_client_cert: Path | None
    tls_client_key: Path | None
    tls_server_name: str


def read_file(path: Path, what: str) -> bytes:
    """The bytes of a TLS file, or an OSError naming what it is for."""
    try:
        return path.read_bytes()
    except OSError as err:
        raise OSError(f"cannot read the {what} {path}: {err.strerror or err}") from None


@dataclass(frozen=True)
class ClientTLS:
    """How a client speaks TLS: ``ca_file`` verifies the server (None: the system's trusted roots),
    ``cert_file``/``key_file`` are presented to servers that require client certificates (mTLS), and
    ``server_name`` replaces the target's host name when the server certificate is checked."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str = ""

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(
                "a client certificate needs its key and a key its certificate: "
                "set both --tls-client-cert and --tls-client-key (MWP_TLS_CLIENT_CERT, MWP_TLS_CLIENT_KEY)"
            )

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials, reading the files now (so a renewed certificate is picked up by
        the next channel)."""
        ca = read_file(self.ca_file, "TLS CA bundle") if self.ca_file else None
        cert = read_file(self.cert_file, "TLS client certificate") if self.cert_file else None
        key = read_file(self.key_file, "TLS client key") if self.key_file else None
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    @classmethod
    def from_settings(cls, settings: ClientTLSSettings) -> ClientTLS | None:
        """The client side of ``settings`` (``missionweave_server.config.Settings``); None (plain text)
        unless TLS is asked for or configured."""
        configured = (
            settings.tls_ca or settings.tls_client_cert or settings.tls_client_key or settings.tls_server_name
        )
        if not (settings.tls or configured):
            return None
        return cls(
            settings.tls_ca, settings.tls_client_cert, settings.tls_client_key, settings.tls_server_name
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientTLS | None:
        """The client side of the ``MWP_TLS*`` environment (docs/tls.md)."""
        return cls.from_settings(client_tls_config(env))


def client_tls_config(env: Mapping[str, str] | None = None) -> ClientTLSConfig:
    """The ``MWP_TLS*`` client variables of ``env`` (default: this process's environment)."""
    e = os.environ if env is None else env
    return ClientTLSConfig(
        env_flag(e, "MWP_TLS"),
        env_path(e, "MWP_TLS_CA"),
        env_path(e, "MWP_TLS_CLIENT_CERT"),
        env_path(e, "MWP_TLS_CLIENT_KEY"),
        e.get("MWP_TLS_SERVER_NAME", ""),
    )


def open_channel(
    target: str,
    tls: ClientTLS | None = None,
    options: ChannelOptions = (),
    *,
    credentials: grpc.ChannelCredentials | None = None,
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
) -> grpc.aio.Channel:
    """A channel to ``target``: TLS as ``tls`` says (or with ready-made ``credentials``), plain text
    when neither is given. ``interceptors`` wrap every call made on it, inside those of
    ``CHANNEL_INTERCEPTORS`` (while tracing is on, a client span per call that sends the caller's
    trace context)."""
    interceptors = [
        *(i for factory in CHANNEL_INTERCEPTORS for i in factory()),
        *(interceptors or ()),
    ] or None
    opts = list(options)
    if credentials is None and tls is not None:
        credentials = tls.credentials()
        if tls.server_name:
            opts.append(("grpc.ssl_target_name_override", tls.server_name))
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=opts, interceptors=interceptors)
    return grpc.aio.secure_channel(target, credentials, options=opts, interceptors=interceptors)
