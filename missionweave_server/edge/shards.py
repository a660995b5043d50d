"""A channel over several Authority shards: each call goes to the shard that owns its Group.

Placement is rendezvous hashing of the Group id over the shards' addresses (stable: adding or
losing a shard moves only the Groups it gains or held). A Group stays with whichever shard holds its
ownership lease, so the hashed shard may not be the owner: it answers ``NOT_OWNER`` naming the
owner's address, the call is retried there once, and the placement is remembered. A shard that
is down, or gives no answer within ``ANSWER_S`` (a hung process: alive to TCP, answering nothing),
is skipped for the next one in the Group's order (which takes the Group over once the silent shard's
lease has lapsed); a silent shard is tried last for ``ANSWER_S``. Callers build the generated stubs on
this channel and never see any of it.

Calls carry either messages (stubs) or raw bytes (the front door): bytes are parsed with the
method's request type to find the Group, and answers go back as bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import blake3
import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message
from grpc_status import rpc_status

from missionweave.kernel.errors import R, Rejected
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import authority_service_pb2, command_pb2, common_pb2
from missionweave_server.edge.command_stream import MAX_STREAM_IN_FLIGHT, CommandStream, StreamEnded
from missionweave_server.edge.status import owner_unreachable, peer_unavailable, to_status

log = logging.getLogger("missionweave.shards")

PLACEMENT_CACHE = 100_000
# How long one shard may take to answer one unary call before the next in the Group's order is asked
# (D289). A healthy shard answers a command in milliseconds; the outcome of a call given up on is
# unknown, and the caller's retry with the same command id is answered as the first (D6).
ANSWER_S = 5.0
_BATCH = "/missionweave.v1.AuthorityService/ExecuteCommandBatch"
_COMMAND = "/missionweave.v1.AuthorityService/ExecuteCommand"


def rendezvous(group_id: str, addresses: Sequence[str]) -> list[str]:
    """The shards in the order a Group tries them: highest BLAKE3(group, shard) first."""
    return sorted(addresses, key=lambda a: blake3.blake3(f"{group_id}\0{a}".encode()).digest(), reverse=True)


@functools.cache
def _types(method: str) -> tuple[type[Message], type[Message]]:
    service, _, name = method.lstrip("/").partition("/")
    found = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(name)
    return message_factory.GetMessageClass(found.input_type), message_factory.GetMessageClass(
        found.output_type
    )


def group_of(request: Message) -> str:
    """The Group a request is about: its ``group_id``, or its signed command's (empty if none)."""
    fields = request.DESCRIPTOR.fields_by_name
    any_request: Any = request
    if "group_id" in fields:
        return str(any_request.group_id)
    if "command" in fields:
        envelope = any_request.command
        if isinstance(envelope, common_pb2.SignedEnvelope):
            with contextlib.suppress(DecodeError):
                return command_pb2.Command.FromString(envelope.payload).group_id
    return ""


def _misplaced(answer: authority_service_pb2.ExecuteCommandStreamResponse) -> bool:
    """Whether a command's in-band answer is its shard's NOT_OWNER: the command goes to the owner."""
    return (
        answer.WhichOneof("outcome") == "rejection"
        and answer.rejection.reason == R.REJECTION_REASON_NOT_OWNER
    )


class ShardedChannel:
    def __init__(
        self, addresses: Sequence[str], channel_for: Callable[[str], Any], answer_s: float = ANSWER_S
    ) -> None:
        if not addresses:
            raise ValueError("at least one shard address")
        self.addresses = list(addresses)
        self._channel_for = channel_for
        self._owners: OrderedDict[str, str] = OrderedDict()
        self.answer_s = answer_s
        self._silent: dict[str, float] = {}  # shard -> until when it is tried last (monotonic)

    # ------------------------------------------------------------ placement

    def order(self, group_id: str) -> list[str]:
        """Where to try a Group's call: its known owner first, then its rendezvous order; a shard
        that recently gave no answer after the others."""
        ranked = rendezvous(group_id, self.addresses) if group_id else list(self.addresses)
        owner = self._owners.get(group_id)
        placed = [owner, *(a for a in ranked if a != owner)] if owner else ranked
        if not self._silent:  # every call asks: the common case sorts nothing
            return placed
        return sorted(placed, key=self._is_silent)  # stable: the order stands within each part

    def _is_silent(self, address: str) -> bool:
        until = self._silent.get(address)
        if until is not None and until <= time.monotonic():
            del self._silent[address]
            return False
        return until is not None

    def _remember(self, group_id: str, address: str) -> None:
        if not group_id:
            return
        self._owners[group_id] = address
        self._owners.move_to_end(group_id)
        while len(self._owners) > PLACEMENT_CACHE:
            self._owners.popitem(last=False)

    async def _unary(self, method: str, request: Message, answer_type: type[Message], **kw: Any) -> Message:
        group_id = group_of(request)
        tried: set[str] = set()
        unanswered: set[str] = set()  # shards whose call ended without an answer: it may have run
        queue = self.order(group_id)
        timeout = kw.pop("timeout", None)
        deadline = None if timeout is None else time.monotonic() + timeout
        last: grpc.aio.AioRpcError | None = None
        while queue:
            address = queue.pop(0)
            if address in tried:
                continue
            tried.add(address)
            call = self._channel_for(address).unary_unary(
                method, type(request).SerializeToString, answer_type.FromString
            )
            attempt_s = self.answer_s if deadline is None else min(self.answer_s, deadline - time.monotonic())
            try:
                answer: Message = await call(request, timeout=max(attempt_s, 0.0), **kw)
            except grpc.aio.AioRpcError as err:
                last = err
                rejection = rejection_from_rpc_error(err)
                if rejection is not None and rejection.reason == R.REJECTION_REASON_NOT_OWNER:
                    owner = rejection.metadata.get("owner_address", "")
                    if owner in unanswered or (owner not in tried and self._is_silent(owner)):
                        # The owner got the request, or another lately, and did not answer: it may
                        # have written the command. NOT_OWNER would say nothing was written; the
                        # outcome is unknown, and the caller retries once the Group has moved.
                        log.info(
                            "a Group's owning shard did not answer",
                            extra={"group_id": group_id, "owner_address": owner, "method": method},
                        )
                        raise _as_error(owner_unreachable(group_id)) from None
                    if owner and owner not in tried:
                        queue.insert(0, owner)  # the owner named by the shard we asked
                    continue
                if rejection is None and err.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    if deadline is not None and time.monotonic() >= deadline:
                        raise  # the caller's own deadline, not the shard's silence
                    unanswered.add(address)
                    if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        self._silent[address] = time.monotonic() + self.answer_s
                        log.warning(
                            "an Authority shard gave no answer in time: asking the next",
                            extra={"shard": address, "group_id": group_id, "method": method},
                        )
                    continue  # that shard is down or hung: the next in the Group's order
                raise
            self._silent.pop(address, None)
            self._remember(group_id, address)
            return answer
        assert last is not None
        refused = rejection_from_rpc_error(last)
        if refused is not None and refused.reason == R.REJECTION_REASON_NOT_OWNER:
            # Every shard tried, and the one named owner never took the call: the Group is between
            # owners (a lease not yet lapsed, a shard restarting). Its address stays in the mesh.
            log.info(
                "no shard took a Group's call",
                extra={"group_id": group_id, "owner_address": refused.metadata.get("owner_address", "")},
            )
            raise _as_error(owner_unreachable(group_id)) from None
        raise last

    # ------------------------------------------------------------ the channel interface stubs use

    def unary_unary(self, method: str, *_: Any, **__: Any) -> Callable[..., Any]:
        request_type, answer_type = _types(method)

        async def call(request: Message | bytes, **kw: Any) -> Message | bytes:
            raw = isinstance(request, bytes)
            message = request_type.FromString(request) if isinstance(request, bytes) else request
            answer: Message
            if method == _BATCH:
                answer = await self._batch(message, **kw)  # type: ignore[arg-type]
            else:
                answer = await self._unary(method, message, answer_type, **kw)
            return answer.SerializeToString() if raw else answer

        return call

    def unary_stream(self, method: str, *_: Any, **__: Any) -> Callable[..., Any]:
        request_type, answer_type = _types(method)

        def call(request: Message | bytes, **kw: Any) -> FailoverStream:
            raw = isinstance(request, bytes)
            message = request_type.FromString(request) if isinstance(request, bytes) else request
            serializer = (lambda m: m) if raw else type(message).SerializeToString
            deserializer = (lambda b: b) if raw else answer_type.FromString

            def open_at(address: str) -> Any:
                return self._channel_for(address).unary_stream(method, serializer, deserializer)(
                    request, **kw
                )

            group_id = group_of(message)
            return FailoverStream(
                self.order(group_id), open_at, lambda owner: self._remember(group_id, owner)
            )

        return call

    def stream_unary(self, method: str, *_: Any, **__: Any) -> Callable[..., Any]:
        def refuse(*_: Any, **__: Any) -> Any:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNIMPLEMENTED, grpc.aio.Metadata(), grpc.aio.Metadata(), details=method
            )

        return refuse

    def stream_stream(self, method: str, *_: Any, **__: Any) -> Callable[..., Any]:
        request_type = _types(method)[0]

        def call(requests: AsyncIterator[Any], **kw: Any) -> _RoutedCommands:
            return _RoutedCommands(self, requests, request_type, kw)

        return call

    async def _batch(
        self, request: authority_service_pb2.ExecuteCommandBatchRequest, **kw: Any
    ) -> authority_service_pb2.ExecuteCommandBatchResponse:
        """A batch is not a transaction: each shard gets its share as one sub-batch (one call, as the
        caller paid); a command its shard does not own, or a share whose shard is down, is sent again
        on its own through the usual placement. Answers keep the request's order."""
        shares: dict[str, list[int]] = {}
        for i, item in enumerate(request.commands):
            shares.setdefault(self.order(group_of(item))[0], []).append(i)
        answers: list[authority_service_pb2.ExecuteCommandStreamResponse | None] = [None] * len(
            request.commands
        )

        async def share(address: str, indexes: list[int]) -> None:
            sub = authority_service_pb2.ExecuteCommandBatchRequest(
                commands=[request.commands[i] for i in indexes]
            )
            call = self._channel_for(address).unary_unary(
                _BATCH, sub.SerializeToString, authority_service_pb2.ExecuteCommandBatchResponse.FromString
            )
            try:
                got = await call(sub, **kw)
            except grpc.aio.AioRpcError as err:
                if rejection_from_rpc_error(err) is not None or err.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise
                got = None  # that shard is down: each command finds its way on its own below
            for position, i in enumerate(indexes):
                answer = got.results[position] if got is not None else None
                if answer is None or _misplaced(answer):
                    answers[i] = await self._command(request.commands[i], **kw)
                else:
                    self._remember(group_of(request.commands[i]), address)
                    answers[i] = answer

        await asyncio.gather(*(share(address, indexes) for address, indexes in shares.items()))
        return authority_service_pb2.ExecuteCommandBatchResponse(
            results=[a for a in answers if a is not None]
        )

    async def _command(
        self, item: authority_service_pb2.ExecuteCommandStreamRequest, **kw: Any
    ) -> authority_service_pb2.ExecuteCommandStreamResponse:
        """One command of a batch or stream: its result or its rejection, never an exception."""
        out = authority_service_pb2.ExecuteCommandStreamResponse(request_tag=item.request_tag)
        try:
            answer = await self._unary(
                _COMMAND,
                authority_service_pb2.ExecuteCommandRequest(command=item.command),
                authority_service_pb2.ExecuteCommandResponse,
                **kw,
            )
        except grpc.aio.AioRpcError as err:
            rejection = rejection_from_rpc_error(err)
            out.rejection.CopyFrom(
                rejection if rejection is not None else peer_unavailable("authority", err).to_proto()
            )
            return out
        result = answer.result  # type: ignore[attr-defined]
        out.command_id = result.command_id
        out.result.CopyFrom(result)
        return out

    async def _streamed(
        self, item: authority_service_pb2.ExecuteCommandStreamRequest, upstreams: _Upstreams
    ) -> authority_service_pb2.ExecuteCommandStreamResponse:
        """One command of a routed stream: on the stream to its Group's shard; through ``_command``
        (unary, with its failover) when that shard does not own the Group, or its stream broke."""
        group_id = group_of(item)
        address = self.order(group_id)[0]
        upstream = upstreams.to(address)
        if upstream is not None:
            try:
                answer = await upstream.execute(item.command)
            except (grpc.aio.AioRpcError, StreamEnded):
                upstreams.drop(address)  # its outcome is unknown: sent again below (D6 answers a repeat)
            else:
                if not _misplaced(answer):
                    answer.request_tag = item.request_tag  # the caller's, for the upstream stream's own
                    self._remember(group_id, address)
                    return answer
                if owner := answer.rejection.metadata.get("owner_address", ""):
                    self._remember(group_id, owner)  # the next ones go to the owner's stream
        return await self._command(item, **upstreams.kw)


class FailoverStream:
    """A server stream opened at the first shard of the Group's order that answers: a shard that is
    down before its first answer is skipped for the next (once answers flowed, a failure is the
    caller's, who resumes from what it has, as from any broken stream). A stream that ends with
    NOT_OWNER naming the owner's address (the Group moved, e.g. a follow stream whose Group another
    shard took over) leaves that placement remembered, so the caller's next call goes there."""

    def __init__(
        self, addresses: list[str], open_at: Callable[[str], Any], placed: Callable[[str], None]
    ) -> None:
        self._addresses, self._open_at, self._placed = list(addresses), open_at, placed
        self._stream: Any = None
        self._answered = False
        self._cancelled = False

    def __aiter__(self) -> FailoverStream:
        return self

    async def __anext__(self) -> Any:
        while True:
            if self._stream is None:
                self._stream = self._open_at(self._addresses.pop(0))
            try:
                answer = await self._stream.read()  # gRPC's calls and LocalStreamCall both read()
            except grpc.aio.AioRpcError as err:
                rejection = rejection_from_rpc_error(err)
                if rejection is not None and rejection.reason == R.REJECTION_REASON_NOT_OWNER:
                    if owner := rejection.metadata.get("owner_address", ""):
                        self._placed(owner)
                down = rejection is None and err.code() == grpc.StatusCode.UNAVAILABLE
                if self._answered or not down or not self._addresses or self._cancelled:
                    raise
                self._stream = None  # that shard is down: the next in the Group's order
                continue
            if answer is grpc.aio.EOF:
                raise StopAsyncIteration
            self._answered = True
            return answer

    async def read(self) -> Any:
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            return grpc.aio.EOF

    def cancel(self) -> bool:
        self._cancelled = True
        return bool(self._stream.cancel()) if self._stream is not None else True


class _Upstreams:
    """A routed stream's streams to the shards, opened on first use. A shard whose stream could not
    be opened (an in-process channel) or broke is not streamed to again by this routed stream: its
    commands go unary, through the placement's failover."""

    def __init__(self, channel_for: Callable[[str], Any], kw: dict[str, Any]) -> None:
        self._channel_for = channel_for
        self.kw = kw
        self._open: dict[str, CommandStream] = {}
        self._unary: set[str] = set()

    def to(self, address: str) -> CommandStream | None:
        upstream = self._open.get(address)
        if upstream is None and address not in self._unary:
            try:
                upstream = self._open[address] = CommandStream(self._channel_for(address), **self.kw)
            except grpc.aio.AioRpcError:
                self._unary.add(address)
        return upstream

    def drop(self, address: str) -> None:
        upstream = self._open.pop(address, None)
        if upstream is not None:
            upstream.cancel()
        self._unary.add(address)

    def close(self) -> None:
        for upstream in self._open.values():
            upstream.close()

    def cancel(self) -> None:
        for upstream in self._open.values():
            upstream.cancel()


class _RoutedCommands:
    """ExecuteCommandStream over shards: each command routed on its own, on a stream to its Group's
    shard (one per shard used, opened with the caller's metadata), answers in completion order.

    As at an Authority, a command holds one of MAX_STREAM_IN_FLIGHT slots from when it is read until
    its answer has been handed on: the slot of an answer this iterator returned is freed when the
    next one is asked for (the front door asks once it has written the previous one). A caller that
    stops reading answers stops the reading of its requests here, so nothing more goes to the
    shards. A request that does not parse ends the stream, after the answers of the commands
    already running, with INVALID_ARGUMENT and a MALFORMED Rejection."""

    def __init__(
        self,
        channel: ShardedChannel,
        requests: AsyncIterator[Any],
        request_type: type[Message],
        kw: dict[str, Any],
    ) -> None:
        self._answers: asyncio.Queue[Any] = asyncio.Queue()  # at most one per slot: each holds its own
        self._slots = asyncio.Semaphore(MAX_STREAM_IN_FLIGHT)
        self._handed = False  # an answer was returned whose slot is still held
        self._running: set[asyncio.Task[None]] = set()
        self._raw = False
        kw = {k: v for k, v in kw.items() if k != "timeout"}  # a stream's deadline is the stream's own
        self._upstreams = _Upstreams(channel._channel_for, kw)

        async def one(item: Any) -> None:
            self._answers.put_nowait(await channel._streamed(item, self._upstreams))

        async def pump() -> None:
            failed: Exception | None = None
            try:
                async for request in requests:
                    self._raw = isinstance(request, bytes)
                    await self._slots.acquire()  # backpressure: stop reading while every slot is held
                    try:
                        item = request_type.FromString(request) if self._raw else request
                    except DecodeError:
                        failed = _malformed()
                        break
                    task = asyncio.create_task(one(item))
                    self._running.add(task)
                    task.add_done_callback(self._running.discard)
            except Exception as err:  # the caller's requests broke: the stream's end, as at an Authority
                failed = err
            try:
                if self._running:
                    await asyncio.wait(set(self._running))
            finally:
                self._upstreams.close()
            self._answers.put_nowait(failed)

        self._pump = asyncio.create_task(pump())

    def __aiter__(self) -> _RoutedCommands:
        return self

    async def __anext__(self) -> Any:
        if self._handed:  # the caller is back for more: the answer it took is handed on
            self._handed = False
            self._slots.release()
        answer = await self._answers.get()
        if answer is None or isinstance(answer, BaseException):
            await self._pump  # its own failure (the caller's requests broke) is the stream's
            if answer is not None:
                raise answer
            raise StopAsyncIteration
        self._handed = True
        return answer.SerializeToString() if self._raw else answer

    def cancel(self) -> bool:
        for task in list(self._running):
            task.cancel()  # the caller is gone: nothing is sent again on its behalf
        self._upstreams.cancel()
        return self._pump.cancel()


def _as_error(rejected: Rejected) -> grpc.aio.AioRpcError:
    """A rejection as the error a gRPC call raises, the way an Authority would have answered it."""
    status = rpc_status.to_status(to_status(rejected))
    return grpc.aio.AioRpcError(
        status.code, grpc.aio.Metadata(), grpc.aio.Metadata(*status.trailing_metadata), details=status.details
    )


def _malformed() -> grpc.aio.AioRpcError:
    """What an Authority answers a stream message that does not parse, as the routed stream's end."""
    return _as_error(
        Rejected(R.REJECTION_REASON_MALFORMED, "a request of the stream is not a valid message of this RPC")
    )
