"""The endpoint process: the A2A gRPC binding (lf.a2a.v1) and JSON-RPC over HTTP with the Agent Card
at /.well-known/agent-card.json, both in front of one MissionTaskHandler; bearer tokens checked
before a request reaches it (gRPC UNAUTHENTICATED, HTTP 401 with ``WWW-Authenticate: Bearer``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import a2a.types.a2a_pb2_grpc as a2a_grpc
import grpc
import uvicorn
from a2a.auth.user import UnauthenticatedUser, User
from a2a.server.request_handlers.grpc_handler import DefaultGrpcServerCallContextBuilder, GrpcHandler
from a2a.server.routes import DefaultServerCallContextBuilder, create_agent_card_routes, create_jsonrpc_routes
from a2a.types import a2a_pb2 as a2a
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_CURRENT, TransportProtocol
from starlette.applications import Starlette
from starlette.requests import Request

from missionweave.kernel.signing import read_key
from missionweave.kernel.transport import ClientTLS
from missionweave_bridges.a2a.server_config import ServerConfig
from missionweave_bridges.a2a.server_handler import (
    Acting,
    IdentityUser,
    MissionTaskHandler,
    close_identities,
    open_identity,
)
from missionweave_bridges.http_bearer import BearerGate

log = logging.getLogger("missionweave_bridges.a2a.server")

BEARER = "bearer"
SKILLS = (
    a2a.AgentSkill(
        id="propose-work",
        name="propose work to a Group",
        description=(
            "Send a message to a Group you are a member of (context_id = the Group id, or task_id = one of "
            "its tasks): it becomes a work proposal (work.propose) the Coordinator may authorize. Text parts "
            "are the goal; a data part may give title, goal, rationale, parent_work_item_id and a contract. "
            "The message id is the idempotency key: resending it returns the same task."
        ),
        tags=["missionweave", "work", "proposal"],
        examples=["Reconcile the Q3 ledger against the bank statements"],
    ),
    a2a.AgentSkill(
        id="follow-mission",
        name="follow a Mission",
        description=(
            "Task mission:<group>: the Mission's state, its WorkItems' changes and published Artifacts, in "
            "Group order. Every event carries metadata mwp.cursor; resubscribe with the MWP-Cursor header to "
            "get each later event exactly once."
        ),
        tags=["missionweave", "mission", "events"],
    ),
    a2a.AgentSkill(
        id="follow-work-item",
        name="follow a WorkItem",
        description=(
            "Task workitem:<group>/<work item id>: its state (8 A2A states), progress, blocks with their "
            "questions, its Conversation and its Artifacts by content hash; resumable like a Mission."
        ),
        tags=["missionweave", "work-item", "events"],
    ),
)


def agent_card(config: ServerConfig, grpc_url: str, http_url: str) -> a2a.AgentCard:
    interfaces = [
        a2a.AgentInterface(
            url=grpc_url, protocol_binding=TransportProtocol.GRPC, protocol_version=PROTOCOL_VERSION_CURRENT
        )
    ]
    if http_url:
        interfaces.append(
            a2a.AgentInterface(
                url=http_url,
                protocol_binding=TransportProtocol.JSONRPC,
                protocol_version=PROTOCOL_VERSION_CURRENT,
            )
        )
    card = a2a.AgentCard(
        name=config.name,
        description=(
            "MissionWeave Missions as A2A tasks: propose work to a Group, follow Missions and WorkItems "
            "with ordered, verified, resumable events. Each bearer token acts as one MissionWeave identity."
        ),
        supported_interfaces=interfaces,
        version="1.0.0",
        capabilities=a2a.AgentCapabilities(
            streaming=True, push_notifications=False, extended_agent_card=True
        ),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/octet-stream"],
        skills=list(SKILLS),
    )
    card.security_schemes[BEARER].http_auth_security_scheme.CopyFrom(
        a2a.HTTPAuthSecurityScheme(
            scheme="Bearer",
            description="a token the endpoint's configuration maps to a MissionWeave identity",
        )
    )
    requirement = card.security_requirements.add()
    requirement.schemes[BEARER].SetInParent()
    return card


class _GrpcContext(DefaultGrpcServerCallContextBuilder):
    def __init__(self, config: ServerConfig) -> None:
        self.config = config

    def build_user(self, context: grpc.aio.ServicerContext) -> User:
        for key, value in context.invocation_metadata() or ():
            if key.lower() == "authorization":
                identity = self.config.identity_for(value if isinstance(value, str) else value.decode())
                if identity:
                    return IdentityUser(identity)
        return UnauthenticatedUser()


class _HttpContext(DefaultServerCallContextBuilder):
    def __init__(self, config: ServerConfig) -> None:
        self.config = config

    def build_user(self, request: Request) -> User:
        identity = self.config.identity_for(request.headers.get("authorization", ""))
        return IdentityUser(identity) if identity else UnauthenticatedUser()


class _BearerInterceptor(grpc.aio.ServerInterceptor):
    """A call without a token of a served identity ends UNAUTHENTICATED before any handler runs."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        metadata = {k.lower(): v for k, v in (details.invocation_metadata or ())}  # type: ignore[attr-defined]
        token = metadata.get("authorization", "")
        if handler is None or self.config.identity_for(token if isinstance(token, str) else token.decode()):
            return handler
        why = "a bearer token of an identity this endpoint serves is required (Authorization: Bearer <token>)"

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        async def deny_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
            yield  # pragma: no cover (abort raises)

        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                deny_stream, handler.request_deserializer, handler.response_serializer
            )
        return grpc.unary_unary_rpc_method_handler(
            deny, handler.request_deserializer, handler.response_serializer
        )


def _bind(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(128)
    sock.setblocking(False)
    return sock


@dataclass
class Endpoint:
    """A running endpoint: its bound ports, the card it serves, and how to stop it."""

    config: ServerConfig
    card: a2a.AgentCard
    grpc_port: int
    http_port: int
    _grpc: grpc.aio.Server
    _http: uvicorn.Server | None
    _http_task: asyncio.Task[None] | None
    _identities: dict[str, Acting]
    handler: MissionTaskHandler

    async def stop(self, grace: float = 1.0) -> None:
        if self._http is not None and self._http_task is not None:
            self._http.should_exit = True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._http_task), timeout=grace + 2)
            if not self._http_task.done():
                self._http_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._http_task
            _http_running.discard(id(self))
            if not _http_running:
                await _stop_sse_watcher()
        await self._grpc.stop(grace)
        await close_identities(self._identities)


# HTTP endpoints running in this process (ids), so that the last one to stop ends sse-starlette's
# shutdown watcher: a task it starts on the loop at the first stream and only ends at a process-wide
# flag that is never reset (a stopped endpoint would leave it polling forever).
_http_running: set[int] = set()


async def _stop_sse_watcher() -> None:
    watchers = [
        t
        for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "") == "_shutdown_watcher" and not t.done()
    ]
    for task in watchers:
        task.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)


async def start(config: ServerConfig, mesh_tls: ClientTLS | None = None) -> Endpoint:
    """Opens every served identity's session, then serves gRPC (and HTTP, unless disabled). TLS
    towards the mesh: the config's ``mesh_tls_ca``, else ``mesh_tls`` (`mwp`'s TLS flags)."""
    tls = ClientTLS(ca_file=config.mesh_tls_ca) if config.mesh_tls_ca else mesh_tls
    scheme = "https" if config.tls_cert else "http"
    # Both addresses are bound before any session is opened: opening one fences the identity's other
    # sessions, which an endpoint that then cannot listen must not have done.
    grpc_server = grpc.aio.server(interceptors=[_BearerInterceptor(config)])
    try:
        if config.tls_cert and config.tls_key:
            credentials = grpc.ssl_server_credentials(
                [(config.tls_key.read_bytes(), config.tls_cert.read_bytes())]
            )
            grpc_port = grpc_server.add_secure_port(config.grpc_listen, credentials)
        else:
            grpc_port = grpc_server.add_insecure_port(config.grpc_listen)
    except RuntimeError as err:  # grpc's way of saying the bind failed
        raise OSError(f"gRPC on {config.grpc_listen}: the address is in use or not this host's") from err
    try:
        http_sock = _bind(config.http_listen) if config.http_listen else None
    except OSError as err:
        raise OSError(f"HTTP on {config.http_listen}: {err.strerror or err}") from err
    identities: dict[str, Acting] = {}
    try:
        for served in config.identities:
            identities[served.identity_id] = await open_identity(
                config.target, tls, served.identity_id, read_key(served.key_file)
            )
    except BaseException:
        await close_identities(identities)
        if http_sock is not None:
            http_sock.close()
        await grpc_server.stop(0)
        raise
    http_port = http_sock.getsockname()[1] if http_sock else 0
    grpc_host = config.grpc_listen.rpartition(":")[0] or "127.0.0.1"
    http_host = config.http_listen.rpartition(":")[0] or "127.0.0.1"
    grpc_url = config.grpc_url or f"{grpc_host}:{grpc_port}"
    http_url = config.http_url or (f"{scheme}://{http_host}:{http_port}/" if http_sock else "")
    card = agent_card(config, grpc_url, http_url)
    handler = MissionTaskHandler(
        identities, card, replay_window=config.replay_window, inline_bytes=config.inline_bytes
    )
    a2a_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler, _GrpcContext(config)), grpc_server)
    await grpc_server.start()
    http_server: uvicorn.Server | None = None
    http_task: asyncio.Task[None] | None = None
    if http_sock is not None:
        routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/", _HttpContext(config))
        app = BearerGate(
            Starlette(routes=routes),
            lambda authorization: config.identity_for(authorization) is not None,
            realm="missionweave",
            error={
                "error": "unauthenticated",
                "message": "a bearer token of an identity this endpoint serves is required",
            },
            public_paths=(AGENT_CARD_WELL_KNOWN_PATH,),
        )
        http_server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_level="warning",
                ssl_certfile=str(config.tls_cert) if config.tls_cert else None,
                ssl_keyfile=str(config.tls_key) if config.tls_key else None,
                lifespan="off",
            )
        )
        # The process's signals are the command's to handle (server_command.py), not uvicorn's.
        http_server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        http_task = asyncio.create_task(http_server.serve(sockets=[http_sock]))
        deadline = asyncio.get_running_loop().time() + 10
        while not http_server.started:  # poll with a deadline: uvicorn signals nothing else
            if http_task.done() or asyncio.get_running_loop().time() > deadline:
                await grpc_server.stop(0)
                await close_identities(identities)
                raise RuntimeError(f"the HTTP server did not start on {config.http_listen}")
            await asyncio.sleep(0.02)
    endpoint = Endpoint(
        config, card, grpc_port, http_port, grpc_server, http_server, http_task, identities, handler
    )
    if http_server is not None:
        _http_running.add(id(endpoint))
    log.info(
        "A2A endpoint: gRPC %s, JSON-RPC %s, identities %s", grpc_url, http_url or "off", sorted(identities)
    )
    return endpoint
