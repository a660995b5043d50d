"""One address for agents and people: the process serving the gateway also routes every other
public service to the peer that serves it.

Routing is by the method's full name only (``/missionweave.v1.AuthorityService/...``): the front
door forwards the request's bytes and metadata unchanged and answers the peer's initial metadata,
bytes, status and trailers unchanged (a Rejection in ``grpc-status-details-bin`` reaches the client
as the peer sent it), except a shard's NOT_OWNER: placement is the mesh's own, so the caller gets
PEER_UNAVAILABLE. Internal contracts (``missionweave.internal.v1``) are never routed: agents cannot
reach them.
A peer that does not answer gives the caller UNAVAILABLE with a PEER_UNAVAILABLE Rejection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_status import rpc_status

from missionweave.kernel.errors import R
from missionweave.kernel.rejections import is_shutting_down, rejection_from_rpc_error
from missionweave_server.edge.callers import MESH_TOKEN_METADATA
from missionweave_server.edge.status import owner_unreachable, peer_unavailable, to_status
from missionweave_server.mesh.peers import Peers

log = logging.getLogger("missionweave.front_door")

# Unary calls through the front door wait at most this long when the caller set no deadline.
DEFAULT_DEADLINE_S = 30.0


def _identity(data: bytes) -> bytes:
    return data


async def _fail(context: grpc.aio.ServicerContext, peer: str, err: grpc.aio.AioRpcError) -> None:  # type: ignore[type-arg]
    """The peer's own status when it answered one (a Rejection, or SHUTTING_DOWN: its client goes
    elsewhere); PEER_UNAVAILABLE when it did not answer, or when a shard said another owns the Group
    (a follow whose Group moved: the shard routing remembers the owner, so the caller's retry goes
    there; the owner's address is never the caller's)."""
    unanswered = err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    rejection = rejection_from_rpc_error(err)
    if rejection is not None and rejection.reason == R.REJECTION_REASON_NOT_OWNER:
        await context.abort_with_status(rpc_status.to_status(to_status(owner_unreachable())))
    if unanswered and rejection is None and not is_shutting_down(err):
        await context.abort_with_status(rpc_status.to_status(to_status(peer_unavailable(peer, err))))
    await context.abort(err.code(), err.details() or "", tuple(err.trailing_metadata() or ()))


async def _relay_initial_metadata(call: Any, context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
    """The peer's initial metadata, sent on as soon as it arrives (a peer that ends the call without
    any sends none: its status follows). A call routed over shards or replicas has none to relay."""
    initial = getattr(call, "initial_metadata", None)
    if initial is None:
        return
    metadata = await initial()
    if metadata:
        await context.send_initial_metadata(tuple(metadata))


# How long a call waits for a peer's connection that is being (re)established before it is sent:
# the first call after a peer (re)starts would otherwise fail at once while the channel sits in its
# reconnect backoff. Longer than that backoff's ceiling (mesh/peers.py: 2 s, plus gRPC's 20% jitter).
PEER_CONNECT_WAIT_S = 3.0


async def _connected(channel: Any, context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
    """Waits (bounded by the call's deadline) for a remote peer channel that is not READY; a peer
    that stays unreachable is then refused as before. Channels without a state (in-process, sharded
    by Group) are used as they are."""
    get_state = getattr(channel, "get_state", None)
    if get_state is None or get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(channel.channel_ready(), min(PEER_CONNECT_WAIT_S, _deadline(context)))


def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, Any], ...]:  # type: ignore[type-arg]
    """What the caller sent, forwarded as it is, except a mesh token: callers never speak as the mesh."""
    return tuple(
        (k, v)
        for k, v in (context.invocation_metadata() or ())
        if not k.startswith(":") and k != MESH_TOKEN_METADATA
    )


def _deadline(context: grpc.aio.ServicerContext) -> float:  # type: ignore[type-arg]
    remaining = context.time_remaining()
    return DEFAULT_DEADLINE_S if remaining is None else remaining


class FrontDoor(grpc.GenericRpcHandler):
    """Routes the methods of ``services`` (name → descriptor) to ``peers.channel(name)``."""

    def __init__(self, peers: Peers, services: dict[str, ServiceDescriptor]) -> None:
        self.peers = peers
        self._routes: dict[str, tuple[str, Any]] = {}
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        for name, descriptor in services.items():
            for method in descriptor.methods:
                self._routes[f"/{descriptor.full_name}/{method.name}"] = (name, method)

    @property
    def routed_services(self) -> Iterable[str]:
        return sorted({name for name, _ in self._routes.values()})

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        """gRPC asks this for every call: the handler of a method is built once, at its first call."""
        path: str = handler_call_details.method  # type: ignore[attr-defined]
        handler = self._handlers.get(path)
        if handler is None and path in self._routes:
            handler = self._handlers[path] = self._handler(path)
        return handler

    def _handler(self, path: str) -> grpc.RpcMethodHandler:
        peer, method = self._routes[path]
        channel = self.peers.channel(peer)
        if method.client_streaming and method.server_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._streaming(peer, channel, channel.stream_stream(path, _identity, _identity))
            )
        if method.client_streaming:
            return grpc.stream_unary_rpc_method_handler(
                self._upload(peer, channel, channel.stream_unary(path, _identity, _identity))
            )
        if method.server_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(peer, channel, channel.unary_stream(path, _identity, _identity))
            )
        return grpc.unary_unary_rpc_method_handler(
            self._unary(peer, channel, channel.unary_unary(path, _identity, _identity))
        )

    @staticmethod
    def _unary(peer: str, channel: Any, call: Callable[..., Any]) -> Callable[..., Any]:
        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[type-arg]
            await _connected(channel, context)
            try:
                answer: bytes = await call(request, metadata=_metadata(context), timeout=_deadline(context))
                return answer
            except grpc.aio.AioRpcError as err:
                await _fail(context, peer, err)
                raise AssertionError("abort returned") from None

        return forward

    @staticmethod
    def _upload(peer: str, channel: Any, call: Callable[..., Any]) -> Callable[..., Any]:
        async def forward(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[type-arg]
            await _connected(channel, context)
            upload = call(requests, metadata=_metadata(context), timeout=context.time_remaining())
            try:
                await _relay_initial_metadata(
                    upload, context
                )  # the go-ahead of missionweave/kernel/uploads.py
                answer: bytes = await upload
                return answer
            except grpc.aio.AioRpcError as err:
                await _fail(context, peer, err)
                raise AssertionError("abort returned") from None

        return forward

    @staticmethod
    def _streaming(peer: str, channel: Any, call: Callable[..., Any]) -> Callable[..., Any]:
        """A server-streaming or bidirectional call: the request (bytes, or the iterator of them)
        goes on as it is, the answers come back one by one."""

        async def forward(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:  # type: ignore[type-arg]
            await _connected(channel, context)
            stream = call(request, metadata=_metadata(context), timeout=context.time_remaining())
            try:
                await _relay_initial_metadata(stream, context)
                async for answer in stream:
                    yield answer
            except grpc.aio.AioRpcError as err:
                await _fail(context, peer, err)
            finally:
                stream.cancel()

        return forward


# How soon a broken health watch of a peer is opened again.
HEALTH_RETRY_S = 1.0


async def mirror_health(
    health: health_aio.HealthServicer, channel: Any, service: str, as_name: str | None = None
) -> None:
    """Keep ``service``'s status here (or ``as_name``'s: a service that serves only while that peer
    does) equal to its status at the peer, NOT_SERVING while the peer cannot be reached, so one
    health check at one address covers the whole mesh."""
    stub = health_pb2_grpc.HealthStub(channel)
    name = as_name or service
    while True:
        try:
            async for answer in stub.Watch(health_pb2.HealthCheckRequest(service=service)):
                await health.set(name, answer.status)
        except grpc.aio.AioRpcError:
            pass
        await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await asyncio.sleep(HEALTH_RETRY_S)


async def stop_mirrors(tasks: Iterable[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
