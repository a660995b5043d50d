"""A fault-injecting gRPC proxy between an SDK under test and the mesh (docs/sdk-behaviour.md).

Every method is forwarded as raw bytes (no generated stubs: a generic handler, stream-stream both
ways, which carries unary calls as well), with the caller's metadata, the call proofs
(``mwp-call-proof-bin``) included, and the upstream status and trailing metadata (a Rejection)
handed back. The proxy signs nothing: the SDK's HELLO and call proofs name the mesh's address as
their audience (MWP_AUDIENCE), which the mesh accepts whoever relays them.

``GatewayService.Connect`` streams are decoded frame by frame, so a test can script faults on them:
break every stream (now, after N more server frames, or in place of a command's RESULT), and on a
chosen EVENT frame: drop it (a gap), send it twice (a replay), hold it back until after the next
EVENT frame (reordering), or flip a byte of its newest event's payload or signature (tampering).
A fault names the frame by sequence: the first EVENT frame whose range reaches ``sequence``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc

from missionweave.v1 import gateway_service_pb2 as pb

log = logging.getLogger("conformance.fault_proxy")
CONNECT = "/missionweave.v1.GatewayService/Connect"
# Transport metadata the client's channel sets again on the upstream call (or refuses to be given).
HOP_BY_HOP = ("user-agent", "te", "content-type", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout")

EventFault = Literal["drop", "duplicate", "reorder", "tamper_payload", "tamper_signature"]


@dataclass
class Fault:
    kind: EventFault
    sequence: int
    group_id: str = ""  # empty: any Group
    fired: tuple[int, int] | None = None  # the frame's (first, last) sequence once applied


@dataclass(eq=False)  # one per stream, kept in a set by identity
class Connection:
    """One Connect stream through the proxy."""

    broken: asyncio.Event = field(default_factory=asyncio.Event)
    held: pb.ServerFrame | None = None
    server_frames: int = 0


class FaultProxy:
    """Listens on 127.0.0.1 (``address``) and forwards to ``upstream``; faults are set by the test."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.address = ""
        self.faults: list[Fault] = []
        self.connections: set[Connection] = set()
        self.connects = 0  # Connect streams opened so far (a reconnect counts)
        self.commands: list[str] = []  # command ids seen in COMMAND frames
        self._break_after: int | None = None  # server frames still to pass before every stream breaks
        self._break_on_result = False
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None

    # ------------------------------------------------------------------ scripting

    def fault(self, kind: EventFault, sequence: int, group_id: str = "") -> Fault:
        """Apply ``kind`` once, to the first EVENT frame (of ``group_id``) whose range reaches ``sequence``."""
        fault = Fault(kind, sequence, group_id)
        self.faults.append(fault)
        return fault

    def break_streams(self) -> None:
        """Every open Connect stream ends now with UNAVAILABLE (a broken connection)."""
        for connection in list(self.connections):
            connection.broken.set()

    def break_after(self, frames: int) -> None:
        """Every open Connect stream breaks once ``frames`` more server frames have passed."""
        self._break_after = frames

    def break_on_result(self) -> None:
        """The next RESULT frame is lost with its stream: the command was applied, its answer never came."""
        self._break_on_result = True

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        self._channel = grpc.aio.insecure_channel(self.upstream)
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers([_Forwarder(self)])
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"
        return self.address

    async def stop(self) -> None:
        self.break_streams()
        if self._server is not None:
            await self._server.stop(grace=0.5)
        if self._channel is not None:
            await self._channel.close()

    # ------------------------------------------------------------------ forwarding

    async def forward(
        self, method: str, requests: AsyncIterator[bytes], context: Any
    ) -> AsyncIterator[bytes]:
        assert self._channel is not None
        metadata = _end_to_end(context.invocation_metadata())
        remaining = context.time_remaining()
        # Bytes both ways: no serializers, so no stub is needed for any method.
        forward: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = self._channel.stream_stream(method)
        call = forward(
            self._client_frames(requests) if method == CONNECT else requests,
            metadata=metadata,
            timeout=remaining if remaining is not None and remaining < 1e6 else None,
        )
        connection = Connection()
        if method == CONNECT:
            self.connects += 1
            self.connections.add(connection)
        responses: asyncio.Queue[bytes | _Headers | BaseException | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                # The server's initial metadata goes first: an upload waits for its go-ahead there
                # (missionweave/kernel/uploads.py) before it sends a byte.
                await responses.put(_Headers(await call.initial_metadata()))
                async for response in call:
                    await responses.put(response)
                await responses.put(None)
            except BaseException as error:  # handed to the handler, which re-raises it
                await responses.put(error)

        reader = asyncio.create_task(pump())
        broken = asyncio.create_task(connection.broken.wait())
        try:
            while True:
                got = asyncio.create_task(responses.get())
                await asyncio.wait({got, broken}, return_when=asyncio.FIRST_COMPLETED)
                if broken.done():
                    got.cancel()
                    break
                item = got.result()
                if item is None:
                    break
                if isinstance(item, grpc.aio.AioRpcError):
                    context.set_trailing_metadata(item.trailing_metadata() or ())
                    await context.abort(item.code(), item.details() or "")
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, _Headers):
                    await context.send_initial_metadata(_end_to_end(item.metadata))
                    continue
                if method != CONNECT:
                    yield item
                    continue
                for out in self._server_frames(connection, item):
                    yield out
        finally:
            self.connections.discard(connection)
            broken.cancel()
            reader.cancel()
            call.cancel()
        if connection.broken.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fault proxy: the connection broke")

    async def _client_frames(self, requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for raw in requests:
            request = pb.ConnectRequest.FromString(raw)
            if request.frame.HasField("command"):
                self.commands.append(request.frame.command.command_id)
            yield raw

    def _server_frames(self, connection: Connection, raw: bytes) -> list[bytes]:
        """What the client gets for one upstream response: each frame re-sent on its own (valid with
        or without frame batches), faults applied."""
        response = pb.ConnectResponse.FromString(raw)
        out: list[pb.ServerFrame] = []
        for frame in [response.frame, *response.more_frames]:
            if connection.broken.is_set():
                break
            connection.server_frames += 1
            out += self._apply(connection, frame)
            if self._break_after is not None:
                self._break_after -= 1
                if self._break_after <= 0:
                    self._break_after = None
                    log.info("fault proxy: breaking every stream after a frame")
                    self.break_streams()
        return [pb.ConnectResponse(frame=f).SerializeToString() for f in out]

    def _apply(self, connection: Connection, frame: pb.ServerFrame) -> list[pb.ServerFrame]:
        if frame.HasField("result") and self._break_on_result:
            self._break_on_result = False
            log.info("fault proxy: RESULT of %s lost with its stream", frame.result.command_id)
            self.break_streams()
            return []
        if not frame.HasField("event"):
            return [frame]  # a frame held back waits for the next EVENT frame, not for any frame
        held, connection.held = connection.held, None
        event = frame.event
        fault = next(
            (
                f
                for f in self.faults
                if f.fired is None
                and f.sequence <= event.last_sequence
                and (not f.group_id or f.group_id == event.group_id)
            ),
            None,
        )
        if fault is None or not event.events:
            return [frame] + ([held] if held is not None else [])
        fault.fired = (event.first_sequence, event.last_sequence)
        log.info("fault proxy: %s on EVENT frame %d..%d", fault.kind, *fault.fired)
        after = [held] if held is not None else []
        if fault.kind == "drop":
            return after
        if fault.kind == "duplicate":
            return [frame, frame, *after]
        if fault.kind == "reorder":
            # Goes out right after the next EVENT frame of this stream; if the stream ends first, it
            # is lost with it (as a frame in flight would be).
            connection.held = frame
            return after
        tampered = pb.ServerFrame()
        tampered.CopyFrom(frame)
        newest = tampered.event.events[-1]  # the one whose own signature vouches for the batch
        if fault.kind == "tamper_payload":
            newest.payload = _flip(newest.payload)
        else:
            newest.signatures[0].sig = _flip(newest.signatures[0].sig)
        return [tampered, *after]


@dataclass(frozen=True)
class _Headers:
    metadata: Any


def _end_to_end(metadata: Any) -> tuple[tuple[str, Any], ...]:
    """What a hop passes on: every entry but the transport's own."""
    return tuple(
        (key, value) for key, value in metadata or () if not key.startswith(":") and key not in HOP_BY_HOP
    )


def _flip(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]


class _Forwarder(grpc.GenericRpcHandler):
    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method

        async def handle(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            async for response in self.proxy.forward(method, requests, context):
                yield response

        return grpc.stream_stream_rpc_method_handler(handle)


@contextlib.asynccontextmanager
async def proxied(upstream: str) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(upstream)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()
