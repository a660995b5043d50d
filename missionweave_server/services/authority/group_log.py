"""GroupLogService over gRPC: one member's view of a Group's log, for the gateways, and the same
view reduced to scheduling metadata for the scheduling service (``scheduling_view.py``).

The contract, field by field, is protos/missionweave/internal/v1/group_log.proto; what it promises
is in docs/internal-contracts.md. Who may read what is decided here (``visibility.py``); the
gateway keeps the agent-facing state (credits, fairness, ACK cursors) and relays the answers.

FollowGroup replays from the log tail in memory or the database and then pushes: a caught-up
stream waits on the Authority's own append wake-up (``GroupAuthority.wait_for_append``), which
fires the moment an append is durable, and re-reads the log every ``IDLE_RECHECK_S`` in case
another Authority instance appended (a takeover). Events found that way were written elsewhere:
once they are served, a stream at an instance that does not own the Group ends with NOT_OWNER
naming the owner, and the gateway follows the Group there, where appends are pushed again (a stream opened
at a shard while the Group's owner was down would otherwise be polled for as long as it lives).
The stream is an async generator: it runs only as fast as its reader reads (gRPC flow control over
the network, lazily in process).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable

import blake3
import grpc

from missionweave.internal.v1 import group_log_pb2 as pb
from missionweave.internal.v1 import group_log_pb2_grpc as pb_grpc
from missionweave.kernel import codec
from missionweave.kernel.errors import R, Rejected
from missionweave.kernel.signing import SNAPSHOT_REFERENCE_TYPE, SNAPSHOT_TYPE, sign_envelope
from missionweave.v1 import authority_service_pb2, common_pb2, gateway_service_pb2
from missionweave_server.edge.callers import Access, CallAuthenticator, Caller, requires
from missionweave_server.edge.status import rejections_as_status
from missionweave_server.services.authority.authority import GroupAuthority
from missionweave_server.services.authority.scheduling_view import scheduling_event
from missionweave_server.services.authority.views import snapshot_view
from missionweave_server.services.authority.visibility import (
    MemberSet,
    active_member,
    as_ranges,
    audience,
    cited_for,
    may_see,
    member_set,
    wanted,
)

log = logging.getLogger("missionweave.authority.group_log")

DEFAULT_BATCH_ENTRIES = 256
MAX_BATCH_ENTRIES = 1_024
# A batch stops growing once its envelopes reach this (it always holds one entry): far below the
# transport's 4 MiB message limit whatever the events' sizes. Every follower holds one batch while
# its reader is not reading (a gateway's stalled agent: docs/gateway.md "What a slow agent costs"),
# so this is part of what a slow subscriber costs; a quarter MiB is already many events a message.
MAX_BATCH_BYTES = 256 * 1024
MAX_FETCH = 1_024
# A caught-up stream is woken at once by this instance's appends; it re-reads the log this often in
# case another instance appended (it took the Group over).
IDLE_RECHECK_S = 5.0
GOING_AWAY_MESSAGE = "the Group Authority is shutting down: follow the Group again (elsewhere)"


@rejections_as_status
class GroupLogServicer(pb_grpc.GroupLogServiceServicer):
    SERVICE = "missionweave.internal.v1.GroupLogService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave_server/mesh/server.py)

    def __init__(self, authority: GroupAuthority) -> None:
        self.authority = authority
        self.stopping = False

    def stop(self) -> None:
        """End every FollowGroup stream with UNAVAILABLE (shutdown): they never end on their own and
        would hold the server's whole grace period; their gateways resubscribe elsewhere at once.
        Streams that start from now on are refused the same way."""
        self.stopping = True
        self.authority.wake_all()

    @requires(Access.MESH)
    async def FollowGroup(
        self, request: pb.FollowGroupRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> AsyncIterator[pb.FollowGroupResponse]:
        """Replay, then push, one member's view of the log (MW-16-01..05, MW-8-07, MW-8-11..15, MW-9-05),
        as signed events or reduced to scheduling metadata (MW-13.3-09), or every member's view at
        once with each entry's audience (SHARED, D132: a gateway's fan-out)."""
        authority = self.authority
        group_id, member_id, attention = request.group_id, request.member_id, request.filter
        view = _view(request)
        _require_ids(group_id, member_id, shared=view == pb.FOLLOW_VIEW_SHARED)
        await self._unless_stopping(context)
        if view == pb.FOLLOW_VIEW_SHARED:  # no member: every member's view, each entry's audience
            state = await authority.state(group_id)
            if state is None:
                raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {group_id} does not exist")
            delivered = request.after_sequence
        else:
            state, member = active_member(
                await authority.state(group_id), group_id, member_id, authority.clock.now()
            )
            # OP-36 / MW-8-07: never before the member's visibility start.
            delivered = max(request.after_sequence, member.visibility_start_sequence - 1)
        limit = min(request.max_batch_entries or DEFAULT_BATCH_ENTRIES, MAX_BATCH_ENTRIES)
        started = pb.FollowStarted(effective_after_sequence=delivered, head_sequence=state.head_sequence)
        if view == pb.FOLLOW_VIEW_SCHEDULING and state.mission is not None:
            started.mission_owner_id = state.mission.owner_id
        yield pb.FollowGroupResponse(started=started)
        members: MemberSet | None = None  # SHARED view: the MemberSet last sent
        unwoken = False  # the last wait ended by its timeout: no append of this instance woke it
        foreign = False  # events came that no append of this instance announced: written elsewhere
        envelope_bytes = 0  # the size of the last batch's envelopes, on average: how many to read
        while True:
            # Read no more than a batch can take: envelopes of the size last seen, up to
            # MAX_BATCH_BYTES (what is read beyond it is read again for the next batch).
            wanted_entries = (
                limit if not envelope_bytes else max(1, min(limit, MAX_BATCH_BYTES // envelope_bytes + 1))
            )
            batch = await authority.read_online(group_id, delivered, wanted_entries)
            if not batch and await self._head(group_id) > delivered:
                # The head moved past us: either an append landed after our read (read again) or the
                # events we need were compacted away.
                batch = await authority.read_online(group_id, delivered, wanted_entries)
                if not batch:
                    yield await self._cannot_continue(group_id, delivered)
                    return
            if batch and batch[0].sequence != delivered + 1:
                yield await self._cannot_continue(
                    group_id, delivered
                )  # never skip: history before is archived
                return
            if not batch:
                if foreign:  # caught up with what another instance wrote: follow it there
                    await self._unless_owned_elsewhere(group_id)
                    foreign = False
                await self._unless_stopping(context)
                unwoken = not await authority.wait_for_append(group_id, timeout=IDLE_RECHECK_S)
                await self._unless_stopping(context)
                continue
            foreign, unwoken = foreign or unwoken, False
            current = await authority.state(group_id)
            out = pb.LogBatch()
            if view == pb.FOLLOW_VIEW_SHARED:
                if current is None:
                    return  # the Group is gone: nothing more to follow
                if (now := member_set(current)) != members:
                    members = now
                    out.members.full_member_ids.extend(now[0])
                    out.members.provisional_member_ids.extend(now[1])
            else:
                member_now = current.members.get(member_id) if current else None
                if current is None or member_now is None or not member_now.active:
                    yield pb.FollowGroupResponse(membership_ended=pb.MembershipEnded(last_sequence=delivered))
                    return
            size = 0
            for stored in batch:
                if size and size + len(stored.envelope) > MAX_BATCH_BYTES:
                    break  # the rest comes in the next batch
                size += len(stored.envelope)
                envelope, event = codec.decode_shared(stored.envelope)
                entry = out.entries.add(sequence=stored.sequence)
                if members is not None:  # SHARED: the Authority still decides who sees it
                    entry.envelope.CopyFrom(envelope)
                    entry.audience.CopyFrom(audience(current, event, members))
                    continue
                if not (may_see(current, member_id, event) and wanted(current, member_id, event, attention)):
                    continue
                if view != pb.FOLLOW_VIEW_SCHEDULING:
                    entry.envelope.CopyFrom(envelope)
                elif (reduced := scheduling_event(event)) is not None:
                    entry.scheduling_event.CopyFrom(reduced)
            delivered = out.entries[-1].sequence
            out.head_sequence = max(current.head_sequence, delivered)
            envelope_bytes = max(1, size // len(out.entries))
            # While the reader does not read, this generator waits at the yield below: it holds the
            # answer only, not the rows read for it (a stalled follower would keep both).
            del batch, stored, envelope, event, current
            yield pb.FollowGroupResponse(batch=out)
            del out

    @requires(Access.MESH)
    async def FetchEvents(
        self, request: pb.FetchEventsRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.FetchEventsResponse:
        """MW-8-13 / MW-8-08 / MW-8-09: the requested events this member's Membership lets it see."""
        authority = self.authority
        group_id, member_id = request.group_id, request.member_id
        _require_ids(group_id, member_id)
        sequences = requested(request.ranges)
        state, member = active_member(
            await authority.state(group_id), group_id, member_id, self.authority.clock.now()
        )
        cited: set[int] = set()
        if request.HasField("context_package"):
            cited = cited_for(request.context_package, authority.public_key, group_id, member_id)
        first, last = sequences[0], sequences[-1]
        found = {
            s.sequence: s.envelope
            for s in await authority.read_history(group_id, first - 1, last - first + 1)
        }
        answer = pb.FetchEventsResponse()
        withheld = []
        for seq in sequences:
            stored = found.get(seq)
            if stored is not None and (seq >= member.visibility_start_sequence or seq in cited):
                signed, event = codec.decode(stored)
                if may_see(state, member_id, event, cited=seq in cited):
                    answer.events.append(signed)
                    continue
            withheld.append(seq)
        answer.withheld.extend(as_ranges(withheld))
        return answer

    @requires(Access.MESH)
    async def GetMemberSnapshot(
        self, request: pb.GetMemberSnapshotRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetMemberSnapshotResponse:
        """MW-16-12: a stored snapshot as the member may see it (MW-9-05), with the reference to it
        signed by this Authority: the snapshot itself, or the member's view of it signed anew."""
        group_id, member_id = request.group_id, request.member_id
        _require_ids(group_id, member_id)
        state = await self.authority.state(group_id)
        active_member(state, group_id, member_id, self.authority.clock.now())
        assert state is not None  # active_member refused otherwise
        stored = await self.authority.store.snapshot_by_digest(group_id, request.digest.hex)
        if stored is None:
            raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no snapshot {request.digest.hex} of {group_id}")
        envelope, snapshot = self.authority.integrity.snapshot(group_id, None, request.digest.hex, stored)
        view = snapshot_view(snapshot, state, member_id)
        if view is None:
            reference = signed_snapshot_reference(
                self.authority, group_id, snapshot.sequence, request.digest.hex, envelope
            )
            return pb.GetMemberSnapshotResponse(snapshot=envelope, signed_reference=reference)
        payload = view.SerializeToString(deterministic=True)
        signed = sign_envelope(payload, SNAPSHOT_TYPE, self.authority.signing_key, self.authority.key_id)
        reference = signed_snapshot_reference(
            self.authority,
            group_id,
            view.sequence,
            blake3.blake3(payload).hexdigest(),
            signed,
            view_of=common_pb2.Digest(
                algorithm="blake3", hex=request.digest.hex, size_bytes=len(envelope.payload)
            ),
            viewer_id=member_id,
        )
        return pb.GetMemberSnapshotResponse(snapshot=signed, signed_reference=reference)

    async def _unless_stopping(self, context: grpc.aio.ServicerContext) -> None:
        if self.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, GOING_AWAY_MESSAGE)

    async def _unless_owned_elsewhere(self, group_id: str) -> None:
        """NOT_OWNER, naming the owner, when another instance owns the Group (or last did: it wrote
        what this stream just served, and its next command most likely goes there): this stream
        would only see its appends by re-reading every IDLE_RECHECK_S."""
        held = await self.authority.store.owner(group_id)
        if held is None or held[0] == self.authority.store.instance_id:
            return
        owner, address = held
        raise Rejected(
            R.REJECTION_REASON_NOT_OWNER,
            f"group {group_id} is written by authority instance {owner}"
            + (f" at {address}" if address else "")
            + ": follow it there",
            owner=owner,
            owner_address=address,
        )

    async def _head(self, group_id: str) -> int:
        """The Group's durable head: from the Authority's cached state when it has one (no query)."""
        state = await self.authority.state(group_id)
        return state.head_sequence if state is not None else (await self.authority.store.head(group_id) or 0)

    async def _cannot_continue(self, group_id: str, after: int) -> pb.FollowGroupResponse:
        """MW-16-11 / MW-16-05: the sequence after ``after`` is not online; name a signed snapshot to
        restore from, or say that none covers it."""
        store = self.authority.store
        first = await store.first_online(group_id)
        oldest_after = (first - 1) if first is not None else (await store.head(group_id) or 0)
        snapshot = await store.latest_snapshot(group_id, at_least=oldest_after)
        if snapshot is None:
            return pb.FollowGroupResponse(
                history_unavailable=pb.HistoryUnavailable(
                    requested_after_sequence=after, oldest_available_after_sequence=oldest_after
                )
            )
        sequence, digest, envelope_bytes = snapshot
        envelope, _ = self.authority.integrity.snapshot(
            group_id, sequence, digest, envelope_bytes
        )  # MW-16-12
        return pb.FollowGroupResponse(
            cursor_too_old=pb.CursorTooOld(
                requested_after_sequence=after,
                oldest_available_after_sequence=oldest_after,
                snapshot_sequence=sequence,
                snapshot_digest=common_pb2.Digest(
                    algorithm="blake3", hex=digest, size_bytes=len(envelope.payload)
                ),
                signed_reference=signed_snapshot_reference(
                    self.authority, group_id, sequence, digest, envelope
                ),
            )
        )


def signed_snapshot_reference(
    authority: GroupAuthority,
    group_id: str,
    sequence: int,
    digest: str,
    envelope: common_pb2.SignedEnvelope,
    *,
    view_of: common_pb2.Digest | None = None,
    viewer_id: str = "",
) -> common_pb2.SignedEnvelope:
    """A SnapshotReference to a stored snapshot, or to one member's view of it, signed by the
    Authority (MW-16-11, OP-25)."""
    snapshot = authority_service_pb2.GroupSnapshot.FromString(envelope.payload)
    reference = gateway_service_pb2.SnapshotReference(
        group_id=group_id,
        sequence=sequence,
        created_at=snapshot.created_at,
        archival=snapshot.archival,
        digest=common_pb2.Digest(algorithm="blake3", hex=digest, size_bytes=len(envelope.payload)),
        view_of=view_of,
        viewer_id=viewer_id,
    )
    payload = reference.SerializeToString(deterministic=True)
    return sign_envelope(payload, SNAPSHOT_REFERENCE_TYPE, authority.signing_key, authority.key_id)


def requested(ranges: Iterable[gateway_service_pb2.SequenceRange]) -> list[int]:
    """The distinct sequences asked for, in order; refuses empty, inverted or oversized requests."""
    ranges = list(ranges)
    if not ranges:
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT, "name at least one sequence range", field="ranges"
        )
    total = 0
    for r in ranges:
        if r.first < 1 or r.last < r.first:
            raise Rejected(
                R.REJECTION_REASON_INVALID_ARGUMENT,
                f"range {r.first}..{r.last} is not 1 <= first <= last",
                field="ranges",
            )
        total += r.last - r.first + 1
        if total > MAX_FETCH:
            raise Rejected(
                R.REJECTION_REASON_TOO_LARGE, f"at most {MAX_FETCH} sequences per fetch", limit=MAX_FETCH
            )
    return sorted({seq for r in ranges for seq in range(r.first, r.last + 1)})


def _view(request: pb.FollowGroupRequest) -> int:
    """The view FollowGroup serves (UNSPECIFIED is MEMBER); an unknown view is refused rather than
    answered with the full one, and so is a SHARED view asked with an attention filter (D132: it
    serves every member at once, filters are one member's)."""
    view = request.view
    if view in (pb.FOLLOW_VIEW_UNSPECIFIED, pb.FOLLOW_VIEW_MEMBER):
        return pb.FOLLOW_VIEW_MEMBER
    if view == pb.FOLLOW_VIEW_SHARED and request.HasField("filter"):
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT, "the SHARED view takes no attention filter", field="filter"
        )
    if view in (pb.FOLLOW_VIEW_SCHEDULING, pb.FOLLOW_VIEW_SHARED):
        return view
    raise Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, f"unknown view {view}", field="view")


def _require_ids(group_id: str, member_id: str, *, shared: bool = False) -> None:
    """Both ids are required, except that the SHARED view names no member (and refuses one)."""
    if shared and member_id:
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT, "the SHARED view names no member", field="member_id"
        )
    for name, value in (("group_id", group_id), ("member_id", "-" if shared else member_id)):
        if not value:
            raise Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, f"{name} is required", field=name)
