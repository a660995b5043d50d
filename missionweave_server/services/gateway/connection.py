"""The Connect stream as a whole: its reader, which takes the agent's frames in order and hands each
to the part of the stream that answers it.

``Connection`` joins the parts of a stream built on ``stream.Stream`` (HELLO, subscriptions, COMMAND,
FETCH) and runs its reader task: HELLO within ``hello_timeout_s`` and first, then every frame in the
order sent, SUBSCRIBE, ACK and UNSUBSCRIBE in the reader itself (they change the stream's own state
in order) and COMMAND and FETCH in tasks of their own (they wait for the Authority). A ``Fatal`` or a
malformed frame ends the stream after its ERROR frame; whatever happens, the outbox is closed so the
writer (``service.GatewayServicer.Connect``) sends what is queued and the call ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.edge.status import MalformedRequest
from missionweave_server.services.gateway.commands import Commands
from missionweave_server.services.gateway.delivery import Subscriptions
from missionweave_server.services.gateway.fatal import Fatal, error_frame
from missionweave_server.services.gateway.fetch import Fetches
from missionweave_server.services.gateway.hello import Hello

R = common_pb2.RejectionReason
E = pb.GatewayErrorCode
log = logging.getLogger("missionweave.gateway")


class Connection(Hello, Subscriptions, Commands, Fetches):
    """One Connect stream, every part of it."""

    async def read(self, requests: AsyncIterator[pb.ConnectRequest]) -> None:
        try:
            frames = aiter(requests)
            try:  # HELLO within hello_timeout_s of the stream's start
                async with asyncio.timeout(self.gateway.limits.hello_timeout_s):
                    first = await anext(frames, None)
            except TimeoutError:
                raise Fatal(
                    E.GATEWAY_ERROR_CODE_HELLO_REQUIRED,
                    f"no HELLO within {self.gateway.limits.hello_timeout_s:g} s of the stream's start",
                ) from None
            if first is not None:
                await self.handle(first.frame)
                async for request in frames:
                    await self.handle(request.frame)
        except Fatal as fatal:
            await self.send_frame(pb.ServerFrame(error=error_frame(fatal)))
            if fatal.status:
                self.ended_with = fatal.rejected
        except MalformedRequest as malformed:  # a frame that does not parse: say so, then end with it
            await self.error(
                E.GATEWAY_ERROR_CODE_MALFORMED_FRAME,
                str(malformed),
                fatal=True,
                rejection=malformed.to_proto(),
            )
            self.ended_with = malformed
        except Rejected as refused:  # a peer did not answer (Membership, the nonce store): retry later
            code = (
                E.GATEWAY_ERROR_CODE_PEER_UNAVAILABLE
                if refused.reason == R.REJECTION_REASON_PEER_UNAVAILABLE
                else 0
            )
            await self.error(E.ValueType(code), str(refused), fatal=True, rejection=refused.to_proto())
            self.ended_with = refused
        except Exception:
            log.exception("gateway stream failed")
        finally:
            self.outbox.end()  # never blocks: what is queued is still sent, then the stream ends

    async def handle(self, frame: pb.ClientFrame) -> None:
        kind = frame.WhichOneof("frame")
        if not self.agent_id:
            if kind != "hello":
                raise Fatal(E.GATEWAY_ERROR_CODE_HELLO_REQUIRED, "the first frame is HELLO")
            await self.hello(frame.hello)
        elif kind == "hello":
            raise Fatal(E.GATEWAY_ERROR_CODE_DUPLICATE_HELLO, "HELLO was already received on this stream")
        elif kind == "subscribe":
            await self.subscribe(frame.subscribe)
        elif kind == "ack":
            await self.ack(frame.ack)
        elif kind == "command":
            self._answer(self.command(frame.command))
        elif kind == "unsubscribe":
            await self.unsubscribe(frame.unsubscribe.subscription_id)
        elif kind == "fetch":
            self._answer(self.fetch(frame.fetch))
        else:
            raise Fatal(E.GATEWAY_ERROR_CODE_MALFORMED_FRAME, "unknown frame")

    def _answer(self, request: Coroutine[Any, Any, None]) -> None:
        """Answer a request in its own task, so the reader goes on reading (tracked for close)."""
        task = asyncio.create_task(request)
        self.requests.add(task)
        task.add_done_callback(self.requests.discard)
