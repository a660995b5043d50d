"""Every gRPC channel and every listening port of the project, with or without TLS (docs/tls.md).

``open_channel`` is the one client channel factory (SDK, CLI, the mesh's peer channels, the split
launcher, tests and benches); ``add_listener`` the one way a server binds a port. TLS is described
by ``ClientTLS`` (the CA that verifies servers, an optional client certificate for mTLS, an optional
server name override) and ``ServerTLS`` (the server certificate, and a CA to require and verify
client certificates with: mTLS). Both are read from ``Settings`` (``MWP_TLS_*``, missionweave_server/config.py).

Plain text listens on loopback only (the embedded default); anything else needs TLS or an explicit
``--insecure`` / ``MWP_INSECURE=1`` (``PlaintextRefused``).

A mesh service is recognised by its certificate: the URI SAN ``spiffe://missionweave/<service>``
(``service_uri``). ``peer_service_name(context)`` answers which mesh service made a call, and
``MeshPeersOnly`` (a server interceptor) lets only such callers reach the internal contracts when
client certificates are required.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from missionweave.kernel.errors import R, Rejected

# Re-exported: the one client channel factory and its TLS, for the mesh, the CLI and the tests.
from missionweave.kernel.transport import read_file
from missionweave_server.config import SERVICES, Settings
from missionweave_server.edge.local import LocalContext
from missionweave_server.edge.status import abort_with

SERVICE_URI_PREFIX = "spiffe://missionweave/"
# What peer_service_name answers for a call made in process (LocalChannel): a service of this very
# process, which never crosses a network.
LOCAL_PEER = "local"


def service_uri(service: str) -> str:
    """The URI SAN by which a certificate names the mesh service ``service``."""
    return f"{SERVICE_URI_PREFIX}{service}"


# ------------------------------------------------------------------ server side


class PlaintextRefused(ValueError):
    """A server was asked to listen in plain text on an address other hosts can reach."""


@dataclass(frozen=True)
class ServerTLS:
    """A server's TLS: its certificate chain and key; with ``client_ca_file``, clients must present a
    certificate issued by that CA (mTLS; grpcio cannot ask for one without requiring it)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None

    def credentials(self) -> grpc.ServerCredentials:
        chain = read_file(self.cert_file, "TLS certificate")
        key = read_file(self.key_file, "TLS key")
        client_ca = read_file(self.client_ca_file, "TLS client CA bundle") if self.client_ca_file else None
        return grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerTLS | None:
        """The server side of ``settings``; None (plain text) when no certificate is configured."""
        if settings.tls_cert is None and settings.tls_key is None:
            if settings.tls_client_ca is not None:
                raise ValueError(
                    "--tls-client-ca (MWP_TLS_CLIENT_CA) requires client certificates over TLS: "
                    "also set --tls-cert and --tls-key (MWP_TLS_CERT, MWP_TLS_KEY)"
                )
            return None
        if settings.tls_cert is None or settings.tls_key is None:
            raise ValueError(
                "serving TLS needs a certificate and its key: set both --tls-cert and --tls-key "
                "(MWP_TLS_CERT, MWP_TLS_KEY)"
            )
        return cls(settings.tls_cert, settings.tls_key, settings.tls_client_ca)


def listen_host(address: str) -> str:
    """The host part of ``host:port`` (IPv6 without its brackets); empty for ``:port``."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


def is_loopback(address: str) -> bool:
    """Whether a listen address is reachable from this host only (loopback IPs, localhost, unix sockets)."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    host = listen_host(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name, or empty / 0.0.0.0 / [::]: every interface


def check_listen(address: str, tls: ServerTLS | None, *, insecure: bool = False) -> None:
    """Raises ``PlaintextRefused`` for plain text on a non-loopback address without ``insecure``."""
    if tls is None and not insecure and not is_loopback(address):
        raise PlaintextRefused(
            f"refusing to listen in plain text on {address}, which other hosts can reach: serve TLS "
            "(--tls-cert and --tls-key, or MWP_TLS_CERT and MWP_TLS_KEY; docs/tls.md), listen on loopback "
            "(127.0.0.1), or pass --insecure (MWP_INSECURE=1) to accept unencrypted connections"
        )


class ListenError(OSError):
    """A listen address this process cannot bind (in use, not this host's, not permitted)."""


def check_port_free(address: str, role: str) -> None:
    """Raises ``ListenError`` when a server already listens on ``host:port``, before anything else
    starts: gRPC only logs a failed bind, and the process would carry on without a listener. It asks
    by connecting (a client socket that happens to use the port is no conflict for gRPC's bind).
    ``role`` names the listener in the message (``gRPC``, ``metrics``, ...): the operator's one line
    says which of the process's ports failed."""
    if address.startswith(("unix:", "unix-abstract:")) or ":" not in address:
        return
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]")
    if not port_text.isdigit() or int(port_text) == 0:
        return
    port = int(port_text)
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as trial:
            trial.setsockopt(
                socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
            )  # as gRPC binds: TIME_WAIT is no conflict
            trial.bind(sockaddr)
        return
    except OSError as err:
        if err.errno != errno.EADDRINUSE:  # not this host's address, not permitted, no such name
            raise ListenError(f"cannot listen on {address} ({role}): {err.strerror or err}") from None
    probe = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((probe, port), timeout=0.5):
            pass
    except OSError:
        return  # only a client socket holds the port (gRPC's dual-stack bind does not mind)
    raise ListenError(f"port {address} ({role}) is in use: another server listens there")


def add_listener(
    server: grpc.aio.Server, address: str, tls: ServerTLS | None, *, insecure: bool = False
) -> int:
    """Binds ``server`` to ``address`` (TLS as ``tls`` says) and answers the port; see ``check_listen``."""
    check_listen(address, tls, insecure=insecure)
    try:
        port = (
            server.add_insecure_port(address)
            if tls is None
            else server.add_secure_port(address, tls.credentials())
        )
    except RuntimeError:  # a failed bind (some gRPC releases answer 0 instead); neither says why
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return port


# ------------------------------------------------------------------ who is calling


def peer_service_name(context: Any) -> str | None:
    """The mesh service that made this call, from its verified client certificate's URI SAN
    ``spiffe://missionweave/<service>``; ``LOCAL_PEER`` for a call made in process; None for any
    other caller (no client certificate, or one that names no mesh service)."""
    if isinstance(context, LocalContext):
        return LOCAL_PEER
    auth = context.auth_context() or {}
    for value in auth.get("x509_subject_alternative_name", ()):
        text = value.decode() if isinstance(value, bytes) else str(value)
        if text.startswith(SERVICE_URI_PREFIX) and text.removeprefix(SERVICE_URI_PREFIX) in SERVICES:
            return text.removeprefix(SERVICE_URI_PREFIX)
    return None


class MeshPeersOnly(grpc.aio.ServerInterceptor):
    """Lets only mesh services (``peer_service_name``) call the methods of ``services`` (full names,
    e.g. ``missionweave.internal.v1.GroupLogService``); anyone else is refused PERMISSION_DENIED.
    Installed where client certificates are required; in-process calls never pass a server."""

    def __init__(self, services: Collection[str]) -> None:
        self.services = frozenset(services)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        if handler is None or method.lstrip("/").partition("/")[0] not in self.services:
            return handler
        return _guarded(handler, method)


async def _refuse_unless_mesh_peer(context: Any, method: str) -> None:
    if peer_service_name(context) is None:
        await abort_with(
            context,
            Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED,
                f"{method} is an internal contract: only mesh services may call it, with a client "
                f"certificate naming one ({SERVICE_URI_PREFIX}<service>)",
                required="mesh service certificate",
            ),
        )


def _guarded(handler: Any, method: str) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with the mesh-peer check before its behaviour runs."""
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            await _refuse_unless_mesh_peer(context, method)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> Any:
            await _refuse_unless_mesh_peer(context, method)
            async for answer in inner_us(request, context):
                yield answer

        return grpc.unary_stream_rpc_method_handler(
            unary_stream, handler.request_deserializer, handler.response_serializer
        )
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            await _refuse_unless_mesh_peer(context, method)
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(
            stream_unary, handler.request_deserializer, handler.response_serializer
        )
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: Any) -> Any:
        await _refuse_unless_mesh_peer(context, method)
        async for answer in inner_ss(requests, context):
            yield answer

    return grpc.stream_stream_rpc_method_handler(
        stream_stream, handler.request_deserializer, handler.response_serializer
    )
