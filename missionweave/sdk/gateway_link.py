"""One ``GatewayService.Connect`` call, the agent's stream to the gateway, and how its failures are
judged: ``GatewayLink`` wraps the call (writes serialised, the frames of a batched response read
together, those batched behind WELCOME kept for the next read); ``handshake`` opens one with HELLO and
waits for WELCOME; ``transient`` tells the agent's connection loop whether a failure is worth
reconnecting for. The loop itself, and what travels over the link, are the agent's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc

from missionweave.sdk.errors import AgentError, GatewayError
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc

__all__ = ["GatewayLink", "StreamEnded", "being_cancelled", "handshake", "transient"]

E = pb.GatewayErrorCode

TRANSIENT_STATUS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)
TRANSIENT_GATEWAY = frozenset(
    {E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE, E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED}
)


class StreamEnded(AgentError):
    """The gateway closed the stream before answering HELLO."""


class GatewayLink:
    """One ``GatewayService.Connect`` call; writes are serialised."""

    def __init__(self, call: grpc.aio.StreamStreamCall[pb.ConnectRequest, pb.ConnectResponse]) -> None:
        self.call = call
        self._writing = asyncio.Lock()
        self._unread: Sequence[pb.ServerFrame] = ()  # what came in WELCOME's response after it

    async def send(self, frame: pb.ClientFrame) -> None:
        async with self._writing:
            await self.call.write(pb.ConnectRequest(frame=frame))

    async def read(self) -> Sequence[pb.ServerFrame] | None:
        """The next response's frames (several under load: HELLO.accepts_frame_batches), None at the end."""
        if self._unread:
            unread, self._unread = self._unread, ()
            return unread
        response = await self.call.read()
        if response is grpc.aio.EOF:
            return None
        assert isinstance(response, pb.ConnectResponse)
        return (response.frame, *response.more_frames)

    async def read_first(self) -> pb.ServerFrame | None:
        """The next frame alone (WELCOME); any frames batched behind it come with the next ``read``."""
        frames = await self.read()
        if not frames:
            return None
        self._unread = frames[1:]
        return frames[0]

    async def finish(self) -> None:
        async with self._writing:
            await self.call.done_writing()

    def cancel(self) -> None:
        self.call.cancel()


async def handshake(channel: grpc.aio.Channel, hello: pb.HelloFrame) -> tuple[GatewayLink, pb.WelcomeFrame]:
    """Opens a Connect call, sends HELLO and waits for WELCOME. Raises :class:`GatewayError` when the
    gateway answers with an ERROR, :class:`StreamEnded` when it closes the stream first."""
    link = GatewayLink(pb_grpc.GatewayServiceStub(channel).Connect())
    try:
        await link.send(pb.ClientFrame(hello=hello))
        frame = await link.read_first()
    except BaseException:
        link.cancel()
        raise
    if frame is not None and frame.HasField("welcome"):
        return link, frame.welcome
    link.cancel()
    if frame is not None and frame.HasField("error"):
        raise GatewayError(frame.error)
    raise StreamEnded("the gateway closed the stream before WELCOME")


def transient(err: BaseException) -> bool:
    """Whether a failure to connect (or of the stream) may pass: retried with backoff, even the first time."""
    if isinstance(err, grpc.aio.AioRpcError):
        return err.code() in TRANSIENT_STATUS
    if isinstance(err, GatewayError):
        return err.code in TRANSIENT_GATEWAY
    return isinstance(err, StreamEnded | OSError)


def being_cancelled() -> bool:
    """Whether the current task is being cancelled (not merely a call cancelled under it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
