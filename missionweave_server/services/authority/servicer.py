"""AuthorityService over gRPC: a thin adapter around GroupAuthority."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from missionweave.kernel import codec, ids
from missionweave.kernel.errors import R, Rejected
from missionweave.kernel.signing import COMMAND_TYPE
from missionweave.v1 import authority_service_pb2 as pb
from missionweave.v1 import authority_service_pb2_grpc as pb_grpc
from missionweave.v1 import command_pb2, common_pb2, event_pb2, membership_pb2, subtask_pb2, work_pb2
from missionweave_server.edge.callers import Access, CallAuthenticator, Caller, requires
from missionweave_server.edge.command_stream import MAX_STREAM_IN_FLIGHT
from missionweave_server.edge.paging import decode_token, encode_token, page_size
from missionweave_server.edge.status import log_rejection, rejections_as_status
from missionweave_server.services.authority import mission_review
from missionweave_server.services.authority.authority import GroupAuthority
from missionweave_server.services.authority.progress import mission_progress
from missionweave_server.services.authority.state import GroupState
from missionweave_server.services.authority.store import StoredEvent
from missionweave_server.services.authority.tree import (
    MAX_TREE_NODES,
    child_group_ids,
    root_group_id,
    tree_node,
)
from missionweave_server.services.authority.views import group_state_proto, mission_summary, work_item_proto
from missionweave_server.services.authority.visibility import active_member, may_see, sees_work_item

log = logging.getLogger("missionweave.authority.grpc")

MAX_BATCH_COMMANDS = 512
MAX_SEQUENCE = 2**63 - 1  # the largest sequence a store holds (BIGINT)
MAX_READ_BATCH = 1024
# Groups one ListMissions call examines at most (there is no index of Memberships by member).
MAX_LIST_SCAN = 1000
Role = membership_pb2.MemberRole


@rejections_as_status
class AuthorityServicer(pb_grpc.AuthorityServiceServicer):
    SERVICE = "missionweave.v1.AuthorityService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave_server/mesh/server.py)

    def __init__(self, authority: GroupAuthority) -> None:
        self.authority = authority

    async def _readable(self, group_id: str, caller: Caller) -> tuple[GroupState, str | None]:
        """The Group's state and whose view of it the caller reads: None (everything) for an
        operator, else its own as an active member. A non-member learns nothing, not even whether
        the Group exists."""
        state = await self.authority.state(group_id)
        if caller.operator:
            if state is None:
                raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {group_id} does not exist")
            return state, None
        if state is None:
            raise Rejected(
                R.REJECTION_REASON_NOT_A_MEMBER,
                f"{caller.identity_id} holds no active Membership in {group_id}",
            )
        active_member(state, group_id, caller.identity_id, self.authority.clock.now())
        return state, caller.identity_id

    @requires(Access.SIGNED)
    async def ExecuteCommand(
        self, request: pb.ExecuteCommandRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExecuteCommandResponse:
        return pb.ExecuteCommandResponse(result=await self.authority.execute(request.command))

    @requires(Access.SIGNED)
    async def ExecuteCommandStream(
        self,
        request_iterator: AsyncIterator[pb.ExecuteCommandStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ExecuteCommandStreamResponse]:
        """Pipelined commands: up to MAX_STREAM_IN_FLIGHT at once, answers in completion order.

        A command holds one of the stream's slots from when it is read until its answer has been
        written (gRPC resumes this generator only once the answer it yielded is sent): answers
        waiting to be sent are bounded by the slots, and a client that stops reading answers stops
        the reading of its requests here, so HTTP/2 flow control holds its writes back instead of
        the server executing and buffering them.

        A request that fails (one that does not parse: ``MalformedRequest``) ends the stream with its
        error, after the answers of the commands already running. A client that cancels cancels the
        commands still running, as a unary call's would be."""
        answers: asyncio.Queue[pb.ExecuteCommandStreamResponse | Exception | None] = asyncio.Queue()
        slots = asyncio.Semaphore(MAX_STREAM_IN_FLIGHT)
        running: set[asyncio.Task[None]] = set()

        async def run(req: pb.ExecuteCommandStreamRequest) -> None:
            answers.put_nowait(await self._answer(req, "ExecuteCommandStream"))  # its slot: freed once sent

        async def pump() -> None:
            failed: Exception | None = None
            try:
                async for req in request_iterator:
                    await slots.acquire()  # backpressure: stop reading while every slot is held
                    task = asyncio.create_task(run(req))
                    running.add(task)
                    task.add_done_callback(running.discard)
            except Exception as err:  # the stream's end: answered as its status below
                failed = err
            if running:
                await asyncio.wait(set(running))
            answers.put_nowait(failed)

        pumper = asyncio.create_task(pump())
        try:
            while (answer := await answers.get()) is not None:
                if isinstance(answer, Exception):
                    raise answer
                yield answer
                slots.release()  # that answer is written: its slot takes the next request
        finally:
            pumper.cancel()
            for task in list(running):
                task.cancel()

    @requires(Access.SIGNED)
    async def ExecuteCommandBatch(
        self, request: pb.ExecuteCommandBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExecuteCommandBatchResponse:
        if len(request.commands) > MAX_BATCH_COMMANDS:
            raise Rejected(
                R.REJECTION_REASON_TOO_LARGE,
                f"a batch holds at most {MAX_BATCH_COMMANDS} commands; this one has {len(request.commands)}",
                limit=MAX_BATCH_COMMANDS,
            )
        answers = await asyncio.gather(
            *(self._answer(req, "ExecuteCommandBatch") for req in request.commands)
        )
        return pb.ExecuteCommandBatchResponse(results=answers)

    async def _answer(self, req: pb.ExecuteCommandStreamRequest, rpc: str) -> pb.ExecuteCommandStreamResponse:
        """One command of a stream or a batch: its result or its rejection, never an exception."""
        try:
            result = await self.authority.execute(req.command)
            return pb.ExecuteCommandStreamResponse(
                request_tag=req.request_tag, command_id=result.command_id, result=result
            )
        except Rejected as rejected:
            log_rejection("Authority", rpc, rejected)  # answered in band: counted and logged as at the edge
            return pb.ExecuteCommandStreamResponse(
                request_tag=req.request_tag,
                command_id=_command_id(req.command),
                rejection=rejected.to_proto(),
            )
        except Exception:
            log.exception("command failed unexpectedly")
            return pb.ExecuteCommandStreamResponse(
                request_tag=req.request_tag,
                command_id=_command_id(req.command),
                rejection=common_pb2.Rejection(
                    reason=R.REJECTION_REASON_OVERLOADED, message="internal error; retry"
                ),
            )

    @requires(Access.IDENTITY)
    async def ReadEvents(
        self, request: pb.ReadEventsRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> AsyncIterator[pb.ReadEventsResponse]:
        group_id = request.group_id
        state, viewer = await self._readable(group_id, caller)
        store = self.authority.store
        head = await store.head(group_id) or state.head_sequence
        batch_size = min(request.batch_size or 256, MAX_READ_BATCH)
        # Sequences are stored as signed 64-bit integers: nothing lies after the largest one, and a
        # cursor past it (a uint64 a client may send) reads nothing instead of overflowing the query.
        after, sent = min(request.after_sequence, MAX_SEQUENCE), 0
        if viewer is not None:  # MW-8-07: nothing before the member's visibility start
            after = max(after, state.members[viewer].visibility_start_sequence - 1)
        while True:
            want = batch_size if not request.limit else min(batch_size, request.limit - sent)
            if want <= 0:
                return
            batch = await self._history(group_id, after, want)
            if batch:
                if viewer is None:
                    envelopes = [codec.envelope(stored.envelope) for stored in batch]
                else:
                    # The member's view follows the state as it is now (who is party to what).
                    current = await self.authority.state(group_id) or state
                    active_member(
                        current, group_id, viewer, self.authority.clock.now()
                    )  # a Membership that ended ends the read
                    envelopes = []
                    for stored in batch:
                        envelope, event = codec.decode(stored.envelope)
                        if may_see(current, viewer, event):
                            envelopes.append(envelope)
                first, after = batch[0].sequence, batch[-1].sequence
                sent += len(batch)
                yield pb.ReadEventsResponse(
                    events=envelopes,
                    head_sequence=max(after, head),
                    first_sequence=first,
                    last_sequence=after,
                )
                continue
            if not request.follow:
                return
            await self._session_still_current(caller)
            await self.authority.wait_for_append(group_id, timeout=0.5)
            head = await store.head(group_id) or head

    async def _session_still_current(self, caller: Caller) -> None:
        """A follow proven by a session ends once the identity opens a newer one (MW-11.3-09), as its
        gateway streams do: checked at each wait, from the directory's cache while it is current.
        Mesh services (no session) are exempt."""
        if caller.service or not caller.identity_id:
            return
        identity = await self.authority.identities.get(caller.identity_id)
        if identity is not None and identity.session_epoch > caller.session_epoch:
            raise Rejected(
                R.REJECTION_REASON_SESSION_EPOCH_STALE,
                f"session {caller.session_epoch} of {caller.identity_id} was replaced by session "
                f"{identity.session_epoch}: follow again with the new session",
                session_epoch=caller.session_epoch,
                current_epoch=identity.session_epoch,
            )

    async def _history(self, group_id: str, after: int, limit: int) -> list[StoredEvent]:
        """Events after ``after``, archived ones too, verified before they are served (DATA_CORRUPTED
        otherwise); never with a hole: a log that does not continue at ``after`` is not servable."""
        batch = await self.authority.read_history(group_id, after, limit)
        if batch and batch[0].sequence != after + 1:
            raise Rejected(
                R.REJECTION_REASON_NOT_FOUND,
                f"events after {after} are not available online",
                first_available=batch[0].sequence,
            )
        return batch

    async def _events_up_to(
        self, group_id: str, head: int, payloads: frozenset[str]
    ) -> list[event_pb2.Event]:
        """The Group's events through ``head`` that carry one of ``payloads``, in order."""
        events: list[event_pb2.Event] = []
        after = 0
        while after < head and (batch := await self._history(group_id, after, MAX_READ_BATCH)):
            events.extend(
                event
                for stored in batch
                if stored.sequence <= head
                and (event := codec.decode_event(stored.envelope)).WhichOneof("payload") in payloads
            )
            after = batch[-1].sequence
        return events

    @requires(Access.IDENTITY)
    async def GetGroupState(
        self, request: pb.GetGroupStateRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetGroupStateResponse:
        state, viewer = await self._readable(request.group_id, caller)
        return pb.GetGroupStateResponse(state=group_state_proto(state, viewer))

    @requires(Access.IDENTITY)
    async def GetSignedGroupSummary(
        self, request: pb.GetSignedGroupSummaryRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetSignedGroupSummaryResponse:
        _, viewer = await self._readable(request.group_id, caller)
        summary = await self.authority.signed_summary(request.group_id, viewer)
        if summary is None:
            raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} does not exist")
        return pb.GetSignedGroupSummaryResponse(summary=summary)

    @requires(Access.IDENTITY)
    async def GetMissionProgress(
        self, request: pb.GetMissionProgressRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetMissionProgressResponse:
        state, viewer = await self._readable(request.group_id, caller)
        if state.mission is None:
            raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} holds no Mission")
        return mission_progress(state, self.authority.clock.now(), viewer)

    @requires(Access.IDENTITY)
    async def GetMissionReview(
        self, request: pb.GetMissionReviewRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetMissionReviewResponse:
        """The review of a submission (missionweave_server/services/authority/mission_review.py), from the state at its
        durable head and the log read once up to it."""
        if not ids.is_valid(request.group_id):  # no such Group can exist: this tells nobody anything
            raise Rejected(
                R.REJECTION_REASON_INVALID_ARGUMENT, "group_id: 1..128 of [A-Za-z0-9._:-]", field="group_id"
            )
        state, viewer = await self._readable(request.group_id, caller)
        if state.mission is None:
            raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} holds no Mission")
        if request.submission_event_id and not ids.is_valid(request.submission_event_id):
            raise Rejected(
                R.REJECTION_REASON_INVALID_ARGUMENT,
                "submission_event_id: a mission.submitted event id, or empty for the latest",
                field="submission_event_id",
            )
        events = await self._events_up_to(request.group_id, state.head_sequence, mission_review.PAYLOADS)
        review = mission_review.mission_review(
            state, events, viewer=viewer, submission_event_id=request.submission_event_id
        )
        await mission_review.add_session_keys(review, self.authority.identities.session_key)
        return review

    @requires(Access.IDENTITY)
    async def GetWorkItem(
        self, request: pb.GetWorkItemRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetWorkItemResponse:
        state, viewer = await self._readable(request.group_id, caller)
        item = state.work_items.get(request.work_item_id)
        if item is None or not sees_work_item(state, viewer, item):  # D124: hidden as if missing
            raise Rejected(
                R.REJECTION_REASON_NOT_FOUND,
                f"{request.group_id} holds no WorkItem {request.work_item_id!r}",
                work_item_id=request.work_item_id,
            )
        return pb.GetWorkItemResponse(
            work_item=work_item_proto(state, item, self.authority.clock.now()),
            group_revision=state.head_sequence,
        )

    @requires(Access.IDENTITY)
    async def ListWorkItems(
        self, request: pb.ListWorkItemsRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.ListWorkItemsResponse:
        state, viewer = await self._readable(
            request.group_id, caller
        )  # a non-member learns nothing, not even of bad input
        size = page_size(request.page_size)
        after = decode_token("wi", request.page_token)
        if request.state and request.state not in work_pb2.WorkItemState.values():
            raise Rejected(
                R.REJECTION_REASON_INVALID_ARGUMENT, f"unknown state {request.state}", field="state"
            )
        now = self.authority.clock.now()
        ids = sorted(
            wid
            for wid, item in state.work_items.items()
            if wid > after
            and (not request.state or item.state == request.state)
            and sees_work_item(state, viewer, item)  # D124
        )
        page = ids[:size]
        return pb.ListWorkItemsResponse(
            work_items=[work_item_proto(state, state.work_items[wid], now) for wid in page],
            next_page_token=encode_token("wi", page[-1]) if len(ids) > size else "",
            group_revision=state.head_sequence,
        )

    @requires(Access.IDENTITY)
    async def ListMissions(
        self, request: pb.ListMissionsRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.ListMissionsResponse:
        """Operators see every Mission; anyone else those of the Groups it is an active member of.
        At most MAX_LIST_SCAN Groups are examined per call, so a page may come back short."""
        size = page_size(request.page_size)
        after = decode_token("mis", request.page_token)
        out = pb.ListMissionsResponse()
        now = self.authority.clock.now()
        scanned = 0
        while scanned < MAX_LIST_SCAN and len(out.missions) < size:
            batch = await self.authority.store.group_ids_after(after, min(MAX_LIST_SCAN - scanned, 256))
            if not batch:
                return out  # every Group examined: the last page
            for group_id in batch:
                scanned += 1
                after = group_id
                state = await self.authority.state(group_id)
                if state is None or state.mission is None:
                    continue
                if not caller.operator:
                    member = state.members.get(caller.identity_id)
                    if member is None or not member.active or member.lapsed(now):
                        continue
                out.missions.append(mission_summary(state))
                if len(out.missions) == size:
                    break
        if await self.authority.store.group_ids_after(after, 1):
            out.next_page_token = encode_token("mis", after)
        return out

    @requires(Access.IDENTITY)
    async def GetMissionTree(
        self, request: subtask_pb2.GetMissionTreeRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> subtask_pb2.GetMissionTreeResponse:
        """MW-14-19: the whole tree for an operator or the root MissionOwner; for a MissionOwner or
        Coordinator of the Group asked for, its subtree (a parent Coordinator inspecting its
        children, MW-14-18); nothing for anyone else."""
        state = await self.authority.state(request.group_id)
        if state is None or state.mission is None:
            if caller.operator:
                raise Rejected(
                    R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} holds no Mission"
                )
            raise Rejected(
                R.REJECTION_REASON_NOT_A_MEMBER,
                f"{caller.identity_id} holds no Membership in {request.group_id}",
            )
        start = request.group_id
        if caller.operator or caller.identity_id == (state.mission.root_owner_id or state.mission.owner_id):
            start = root_group_id(state)
        else:
            _, member = active_member(state, request.group_id, caller.identity_id, self.authority.clock.now())
            if member.role not in (Role.MEMBER_ROLE_MISSION_OWNER, Role.MEMBER_ROLE_COORDINATOR):
                raise Rejected(
                    R.REJECTION_REASON_PERMISSION_DENIED,
                    "the Mission tree is inspected by the root MissionOwner, or from a Group by its MissionOwner or Coordinator",
                )
        out = subtask_pb2.GetMissionTreeResponse()
        pending = [start]
        while pending and len(out.nodes) < MAX_TREE_NODES:
            node_state = await self.authority.state(pending.pop())
            if node_state is None or node_state.mission is None:
                continue
            out.nodes.append(tree_node(node_state))
            pending.extend(reversed(child_group_ids(node_state)))  # pre-order: the first child next
        return out

    @requires(Access.IDENTITY)
    async def GetContextPackage(
        self, request: pb.GetContextPackageRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetContextPackageResponse:
        state, _ = await self._readable(request.group_id, caller)
        may_mint(state, caller, list(request.recipient_ids), list(request.work_item_ids))
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

    @requires(Access.IDENTITY)
    async def TakeSnapshot(
        self, request: pb.TakeSnapshotRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.TakeSnapshotResponse:
        if not caller.operator:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED,
                "snapshots and compaction are operator calls (an Organization administrator or policy identity)",
            )
        taken = await self.authority.take_snapshot(
            request.group_id, compact=request.compact, archival=request.archival
        )
        if taken is None:
            raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} does not exist")
        envelope, digest, sequence = taken
        size = len(envelope.payload)
        return pb.TakeSnapshotResponse(
            snapshot=envelope,
            digest=common_pb2.Digest(algorithm="blake3", hex=digest, size_bytes=size),
            sequence=sequence,
        )

    @requires(Access.PUBLIC)
    async def GetAuthorityKey(
        self, request: pb.GetAuthorityKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAuthorityKeyResponse:
        return pb.GetAuthorityKeyResponse(
            key_id=self.authority.key_id,
            public_key=self.authority.public_key,
            keys=self.authority.key_history.as_proto(),
        )


def _command_id(envelope: common_pb2.SignedEnvelope) -> str:
    """The id a rejected command names, for the client to match its answer (empty when the
    payload is not a Command). Only echoed back to its sender: nothing unverified is trusted."""
    if envelope.payload_type != COMMAND_TYPE:
        return ""
    try:
        return command_pb2.Command.FromString(envelope.payload).command_id
    except DecodeError:
        return ""


def may_mint(state: GroupState, caller: Caller, recipient_ids: list[str], work_item_ids: list[str]) -> None:
    """Context Packages are minted by the Group's current Coordinator (or an operator) for
    recipients the Group's state authorizes: active members, or candidates of an open offer of a
    WorkItem the package covers (MW-8-07, MW-8-09, MW-13.3-03). A package names who may use it, so
    minting one for anyone else would let its holder read before its visibility start."""
    mission = state.mission
    coordinator = mission.coordinator.agent_id if mission is not None and mission.coordinator else ""
    if not caller.operator and caller.identity_id != coordinator:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "only the Group's current Coordinator mints Context Packages",
        )
    offered = {
        candidate
        for work_item_id in work_item_ids
        if (item := state.work_items.get(work_item_id)) is not None
        for offer in item.offers.values()
        if offer.open
        for candidate in offer.candidate_ids
    }
    for recipient in recipient_ids:
        member = state.members.get(recipient)
        if not (member is not None and member.active) and recipient not in offered:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED,
                f"{recipient} is neither an active member of {state.group_id} nor offered a WorkItem of this package",
                field="recipient_ids",
            )
