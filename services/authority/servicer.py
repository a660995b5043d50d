"""AuthorityService over gRPC: a thin adapter around GroupAuthority."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from missionweave import codec
from missionweave.errors import R, Rejected
from missionweave.rpc.status import rejections_as_status
from missionweave.v1 import authority_service_pb2 as pb
from missionweave.v1 import authority_service_pb2_grpc as pb_grpc
from missionweave.v1 import common_pb2
from services.authority.authority import GroupAuthority
from services.authority.progress import mission_progress
from services.authority.views import group_state_proto

log = logging.getLogger("missionweave.authority.grpc")

MAX_STREAM_IN_FLIGHT = 256
MAX_BATCH_COMMANDS = 512
MAX_READ_BATCH = 1024


@rejections_as_status
class AuthorityServicer(pb_grpc.AuthorityServiceServicer):
    def __init__(self, authority: GroupAuthority) -> None:
        self.authority = authority

    async def ExecuteCommand(
        self, request: pb.ExecuteCommandRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExecuteCommandResponse:
        return pb.ExecuteCommandResponse(result=await self.authority.execute(request.command))

    async def ExecuteCommandStream(
        self, request_iterator: AsyncIterator[pb.ExecuteCommandStreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ExecuteCommandStreamResponse]:
        """Pipelined commands: up to MAX_STREAM_IN_FLIGHT run at once, answers in completion order."""
        answers: asyncio.Queue[pb.ExecuteCommandStreamResponse | None] = asyncio.Queue()
        slots = asyncio.Semaphore(MAX_STREAM_IN_FLIGHT)

        async def run(req: pb.ExecuteCommandStreamRequest) -> None:
            try:
                await answers.put(await self._answer(req))
            finally:
                slots.release()

        async def pump() -> None:
            tasks: set[asyncio.Task[None]] = set()
            async for req in request_iterator:
                await slots.acquire()  # backpressure: stop reading when too many are in flight
                task = asyncio.create_task(run(req))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
            await answers.put(None)

        pumper = asyncio.create_task(pump())
        try:
            while (answer := await answers.get()) is not None:
                yield answer
        finally:
            pumper.cancel()

    async def ExecuteCommandBatch(
        self, request: pb.ExecuteCommandBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExecuteCommandBatchResponse:
        if len(request.commands) > MAX_BATCH_COMMANDS:
            raise Rejected(
                R.REJECTION_REASON_TOO_LARGE,
                f"a batch holds at most {MAX_BATCH_COMMANDS} commands; this one has {len(request.commands)}",
                limit=MAX_BATCH_COMMANDS,
            )
        answers = await asyncio.gather(*(self._answer(req) for req in request.commands))
        return pb.ExecuteCommandBatchResponse(results=answers)

    async def _answer(self, req: pb.ExecuteCommandStreamRequest) -> pb.ExecuteCommandStreamResponse:
        """One command of a stream or a batch: its result or its rejection, never an exception."""
        try:
            result = await self.authority.execute(req.command)
            return pb.ExecuteCommandStreamResponse(request_tag=req.request_tag, command_id=result.command_id, result=result)
        except Rejected as rejected:
            return pb.ExecuteCommandStreamResponse(request_tag=req.request_tag, rejection=rejected.to_proto())
        except Exception:
            log.exception("command failed unexpectedly")
            return pb.ExecuteCommandStreamResponse(
                request_tag=req.request_tag,
                rejection=common_pb2.Rejection(reason=R.REJECTION_REASON_OVERLOADED, message="internal error; retry"),
            )

    async def ReadEvents(
        self, request: pb.ReadEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadEventsResponse]:
        store = self.authority.store
        head = await store.head(request.group_id)
        if head is None:
            raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} does not exist")
        batch_size = min(request.batch_size or 256, MAX_READ_BATCH)
        after, sent = request.after_sequence, 0
        while True:
            want = batch_size if not request.limit else min(batch_size, request.limit - sent)
            if want <= 0:
                return
            # Audits see archived events too; verified before they are served (DATA_CORRUPTED otherwise).
            batch = await self.authority.read_history(request.group_id, after, want)
            if batch:
                if batch[0].sequence != after + 1:  # never skip: a hole means the log is not servable
                    raise Rejected(
                        R.REJECTION_REASON_NOT_FOUND,
                        f"events after {after} are not available online",
                        first_available=batch[0].sequence,
                    )
                envelopes = [codec.envelope(stored.envelope) for stored in batch]
                after = batch[-1].sequence
                sent += len(batch)
                yield pb.ReadEventsResponse(events=envelopes, head_sequence=max(after, head))
                continue
            if not request.follow:
                return
            await self.authority.wait_for_append(request.group_id, timeout=0.5)
            head = await store.head(request.group_id) or head

    async def GetGroupState(
        self, request: pb.GetGroupStateRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetGroupStateResponse:
        state = await self.authority.state(request.group_id)
        if state is None:
            raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} does not exist")
        return pb.GetGroupStateResponse(state=group_state_proto(state))

    async def GetSignedGroupSummary(
        self, request: pb.GetSignedGroupSummaryRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSignedGroupSummaryResponse:
        summary = await self.authority.signed_summary(request.group_id)
        if summary is None:
            raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} does not exist")
        return pb.GetSignedGroupSummaryResponse(summary=summary)

    async def GetMissionProgress(
        self, request: pb.GetMissionProgressRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMissionProgressResponse:
        state = await self.authority.state(request.group_id)
        if state is None or state.mission is None:
            raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} does not exist")
        return mission_progress(state, self.authority.clock.now())

    async def GetContextPackage(
        self, request: pb.GetContextPackageRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetContextPackageResponse:
        package = await self.authority.context_package(
            request.group_id,
            work_item_ids=list(request.work_item_ids),
            purpose=request.purpose,
            recipient_ids=list(request.recipient_ids),
            previous=request.previous_version if request.HasField("previous_version") else None,
            target_group_id=request.target_group_id,
            transfer_authorization_event_id=request.transfer_authorization_event_id,
        )
        if package is None:
            raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} does not exist")
        return pb.GetContextPackageResponse(package=package)

    async def TakeSnapshot(
        self, request: pb.TakeSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.TakeSnapshotResponse:
        taken = await self.authority.take_snapshot(request.group_id, compact=request.compact, archival=request.archival)
        if taken is None:
            raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} does not exist")
        envelope, digest, sequence = taken
        size = len(envelope.payload)
        return pb.TakeSnapshotResponse(
            snapshot=envelope, digest=common_pb2.Digest(algorithm="blake3", hex=digest, size_bytes=size), sequence=sequence
        )

    async def GetAuthorityKey(
        self, request: pb.GetAuthorityKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAuthorityKeyResponse:
        return pb.GetAuthorityKeyResponse(
            key_id=self.authority.key_id, public_key=self.authority.public_key, keys=self.authority.key_history.as_proto()
        )
