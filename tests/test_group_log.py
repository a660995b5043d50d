"""GroupLogService (missionweave.internal.v1): one member's view of a Group's log, as the gateway reads
it, called both in process (LocalChannel) and over the network, with the same answers and statuses."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest
from sqlalchemy import delete

import missionweave_server.services.authority.group_log
from missionweave.internal.v1 import group_log_pb2 as glpb
from missionweave.internal.v1 import group_log_pb2_grpc as glpb_grpc
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import verify_signature
from missionweave.sdk.client import decode_events
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import common_pb2, conversation_pb2, membership_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.edge.callers import MeshServiceChannel
from tests import builders
from tests.conftest import World
from tests.test_missions import G, as_member, create

R = common_pb2.RejectionReason


def stub(w: World, kind: str) -> glpb_grpc.GroupLogServiceStub:
    """In process, or over the network as a service of the mesh (its token): internal contracts
    answer nobody else (tests/test_read_authorization.py)."""
    if kind == "local":
        return glpb_grpc.GroupLogServiceStub(w.mesh.peers.local)  # type: ignore[attr-defined]
    return glpb_grpc.GroupLogServiceStub(
        MeshServiceChannel(w.client.channel, w.settings.mesh_token_path.read_bytes().strip())
    )


async def refusal(call: Any) -> tuple[grpc.StatusCode, int]:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        if hasattr(call, "read"):
            await call.read()
        else:
            await call
    rejection = rejection_from_rpc_error(refused.value)
    assert rejection is not None
    return refused.value.code(), rejection.reason


async def post(w: World, conv: str, text: str) -> int:
    return (
        await w.run(w.owner, G, "message_post", builders.message(conv, text), membership_epoch=1)
    ).group_revision


@pytest.mark.parametrize("kind", ["local", "remote"])
@pytest.mark.req("MW-8-08")
async def test_follow_is_refused_with_a_structured_status_for_non_members_and_unknown_groups(
    world: World, kind: str
) -> None:
    w = world
    await create(w)
    log = stub(w, kind)
    cases = [
        ("grp_nowhere", "alice", grpc.StatusCode.NOT_FOUND, R.REJECTION_REASON_GROUP_NOT_FOUND),
        (G, "worker-bot", grpc.StatusCode.PERMISSION_DENIED, R.REJECTION_REASON_NOT_A_MEMBER),
        (G, "", grpc.StatusCode.INVALID_ARGUMENT, R.REJECTION_REASON_INVALID_ARGUMENT),
    ]
    for group_id, member_id, code, reason in cases:
        call = log.FollowGroup(glpb.FollowGroupRequest(group_id=group_id, member_id=member_id))
        assert await refusal(call) == (code, reason)
    fetch = glpb.FetchEventsRequest(
        group_id=G, member_id="worker-bot", ranges=[pb.SequenceRange(first=1, last=1)]
    )
    assert await refusal(log.FetchEvents(fetch)) == (
        grpc.StatusCode.PERMISSION_DENIED,
        R.REJECTION_REASON_NOT_A_MEMBER,
    )
    snapshot = glpb.GetMemberSnapshotRequest(
        group_id=G, member_id="worker-bot", digest=common_pb2.Digest(hex="00")
    )
    assert await refusal(log.GetMemberSnapshot(snapshot)) == (
        grpc.StatusCode.PERMISSION_DENIED,
        R.REJECTION_REASON_NOT_A_MEMBER,
    )
    snapshot.member_id = "alice"
    assert await refusal(log.GetMemberSnapshot(snapshot)) == (
        grpc.StatusCode.NOT_FOUND,
        R.REJECTION_REASON_NOT_FOUND,
    )


@pytest.mark.parametrize("kind", ["local", "remote"])
@pytest.mark.req("MW-8-07", "MW-9-05", "MW-16-01", "MW-16-05")
async def test_follow_starts_at_the_visibility_start_skips_what_the_member_may_not_see_and_pushes_appends(
    world: World, kind: str
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    for i in range(3):
        await post(w, conv, f"before {i}")
    await as_member(w, G, w.worker)
    secret = conversation_pb2.ConversationOpen(
        conversation_id="conv_secret", kind=conversation_pb2.CONVERSATION_KIND_RESTRICTED, title="s"
    )
    await w.run(w.owner, G, "conversation_open", secret, membership_epoch=1)
    hidden = (
        await w.run(
            w.owner, G, "message_post", builders.message("conv_secret", "hunter2"), membership_epoch=1
        )
    ).group_revision
    head = (await w.client.group_state(G)).head_sequence
    start = next(
        m.visibility_start_sequence
        for m in (await w.client.group_state(G)).memberships
        if m.member_id == "worker-bot"
    )
    call = stub(w, kind).FollowGroup(
        glpb.FollowGroupRequest(group_id=G, member_id="worker-bot", after_sequence=0, max_batch_entries=2)
    )
    try:
        started = (await call.read()).started
        assert (started.effective_after_sequence, started.head_sequence) == (start - 1, head)
        entries: list[glpb.LogEntry] = []
        while len(entries) < head - start + 1:
            batch = (await call.read()).batch
            assert 1 <= len(batch.entries) <= 2 and batch.head_sequence >= batch.entries[-1].sequence
            entries += batch.entries
        assert [e.sequence for e in entries] == list(range(start, head + 1))  # contiguous, from the grant on
        skipped = [e.sequence for e in entries if not e.HasField("envelope")]
        assert skipped == [hidden - 1, hidden]  # the restricted Conversation's opening and its message
        assert not any(b"hunter2" in e.envelope.payload for e in entries)
        # Caught up: the next append is pushed on the open stream (no polling of the log).
        sent = time.perf_counter()
        appended = await post(w, conv, "live")
        async with asyncio.timeout(2):
            live = (await call.read()).batch
        assert [e.sequence for e in live.entries] == [appended] and time.perf_counter() - sent < 1.0
        assert decode_events([live.entries[0].envelope])[0].message_posted.content.text == "live"
    finally:
        call.cancel()


@pytest.mark.parametrize("kind", ["local", "remote"])
@pytest.mark.req("MW-8-11", "MW-8-12", "OP-26")
async def test_follow_applies_the_attention_filter_and_bounds_a_batch_by_bytes(
    world: World, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    await as_member(w, G, w.worker)
    chatter = await post(w, conv, "general chatter " + "x" * 3_000)
    mention = builders.message(conv, "@worker-bot look " + "y" * 3_000, mentions=["worker-bot"])
    mentioned = (await w.run(w.owner, G, "message_post", mention, membership_epoch=1)).group_revision
    # Each envelope is over 3 KB: a 4 KB bound makes every batch one entry.
    monkeypatch.setattr(missionweave_server.services.authority.group_log, "MAX_BATCH_BYTES", 4_000)
    focus = pb.AttentionFilter(mode=pb.ATTENTION_MODE_FILTERED, direct_mentions=True)
    request = glpb.FollowGroupRequest(
        group_id=G, member_id="worker-bot", after_sequence=chatter - 1, filter=focus
    )
    call = stub(w, kind).FollowGroup(request)
    try:
        assert (await call.read()).started.effective_after_sequence == chatter - 1
        first, second = (await call.read()).batch, (await call.read()).batch
        assert [(e.sequence, e.HasField("envelope")) for e in [*first.entries, *second.entries]] == [
            (chatter, False),
            (mentioned, True),
        ]
    finally:
        call.cancel()


@pytest.mark.parametrize("kind", ["local", "remote"])
@pytest.mark.req("MW-8-08", "MW-16-11", "MW-16-05")
async def test_follow_ends_with_membership_ended_cursor_too_old_and_history_unavailable(
    world: World, kind: str
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    await as_member(w, G, w.worker)
    log = stub(w, kind)
    call = log.FollowGroup(glpb.FollowGroupRequest(group_id=G, member_id="worker-bot"))
    assert (await call.read()).HasField("started")
    assert (await call.read()).HasField("batch")
    revoke = membership_pb2.MembershipRevoke(member_id="worker-bot", reason="done")
    await w.run(w.owner, G, "membership_revoke", revoke, membership_epoch=1)
    ended = await call.read()
    assert ended.WhichOneof("response") == "membership_ended"
    assert await call.read() is grpc.aio.EOF  # then the stream closes with OK

    for i in range(3):
        await post(w, conv, f"before {i}")
    taken = await w.client.authority.TakeSnapshot(apb.TakeSnapshotRequest(group_id=G, compact=True))
    await post(w, conv, "after")
    old = log.FollowGroup(glpb.FollowGroupRequest(group_id=G, member_id="alice", after_sequence=2))
    assert (await old.read()).started.effective_after_sequence == 2
    too_old = (await old.read()).cursor_too_old
    assert (too_old.requested_after_sequence, too_old.snapshot_sequence) == (2, taken.sequence)
    assert too_old.oldest_available_after_sequence == taken.sequence
    _, public_key = await w.client.authority_key()
    assert verify_signature(too_old.signed_reference, public_key)
    reference = pb.SnapshotReference.FromString(too_old.signed_reference.payload)
    assert (reference.sequence, reference.digest.hex) == (taken.sequence, taken.digest.hex)
    assert await old.read() is grpc.aio.EOF
    got = await log.GetMemberSnapshot(
        glpb.GetMemberSnapshotRequest(group_id=G, member_id="alice", digest=reference.digest)
    )
    assert got.snapshot == taken.snapshot and verify_signature(got.signed_reference, public_key)

    from missionweave_server.services.authority.schema import snapshots

    async with w.mesh.engine.begin() as conn:  # type: ignore[attr-defined]
        await conn.execute(delete(snapshots).where(snapshots.c.group_id == G))  # nothing covers the gap now
    lost = log.FollowGroup(glpb.FollowGroupRequest(group_id=G, member_id="alice", after_sequence=2))
    assert (await lost.read()).HasField("started")
    unavailable = (await lost.read()).history_unavailable
    assert (unavailable.requested_after_sequence, unavailable.oldest_available_after_sequence) == (
        2,
        taken.sequence,
    )


@pytest.mark.parametrize("kind", ["local", "remote"])
@pytest.mark.req("MW-8-08", "MW-8-09", "MW-13.3-03")
async def test_fetch_checks_ranges_and_the_context_package_on_the_authority_side(
    world: World, kind: str
) -> None:
    w = world
    await create(w)
    await as_member(w, G, w.worker)
    log = stub(w, kind)

    def request(first: int, last: int) -> glpb.FetchEventsRequest:
        return glpb.FetchEventsRequest(
            group_id=G, member_id="worker-bot", ranges=[pb.SequenceRange(first=first, last=last)]
        )

    assert await refusal(log.FetchEvents(request(5, 2))) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        R.REJECTION_REASON_INVALID_ARGUMENT,
    )
    assert await refusal(log.FetchEvents(request(1, 5_000))) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        R.REJECTION_REASON_TOO_LARGE,
    )
    package = (
        await w.client.authority.GetContextPackage(
            apb.GetContextPackageRequest(group_id=G, recipient_ids=["worker-bot"])
        )
    ).package
    head = (await w.client.group_state(G)).head_sequence
    cited = request(1, head)
    cited.context_package.CopyFrom(package)
    answer = await log.FetchEvents(cited)
    assert [e.sequence for e in decode_events(answer.events)] == list(
        range(1, head + 1)
    ) and not answer.withheld
    package.payload += b"\x00"
    cited.context_package.CopyFrom(package)
    with pytest.raises(grpc.aio.AioRpcError) as tampered:
        await log.FetchEvents(cited)
    rejection = rejection_from_rpc_error(tampered.value)
    assert rejection and rejection.reason == R.REJECTION_REASON_SIGNATURE_INVALID
    assert rejection.metadata["field"] == "context_package"


@pytest.mark.parametrize("kind", ["local", "remote"])
@pytest.mark.req("MW-9-05")
async def test_the_shared_view_names_each_events_audience_and_the_members(world: World, kind: str) -> None:
    """D132: every entry with its envelope, the members the Authority lets see it, and the active
    Memberships; a member or a filter is refused (the view is every member's)."""
    w = world
    await create(w)
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    opened = conversation_pb2.ConversationOpen(
        conversation_id="conv_two",
        kind=conversation_pb2.CONVERSATION_KIND_RESTRICTED,
        title="r",
        participant_ids=["worker-bot"],
    )
    await w.run(w.coordinator, G, "conversation_open", opened, membership_epoch=2)
    secret = await post(w, "conv_two", "between the worker and the stewards")
    log = stub(w, kind)
    shared = glpb.FollowGroupRequest(group_id=G, view=glpb.FOLLOW_VIEW_SHARED)
    for wrong in (
        glpb.FollowGroupRequest(group_id=G, member_id="alice", view=glpb.FOLLOW_VIEW_SHARED),
        glpb.FollowGroupRequest(group_id=G, view=glpb.FOLLOW_VIEW_SHARED, filter=pb.AttentionFilter()),
    ):
        assert await refusal(log.FollowGroup(wrong)) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            R.REJECTION_REASON_INVALID_ARGUMENT,
        )
    call = log.FollowGroup(shared)
    try:
        assert (await call.read()).started.effective_after_sequence == 0
        batch = (await call.read()).batch
    finally:
        call.cancel()
    assert [e.sequence for e in batch.entries] == list(range(1, secret + 1))
    assert all(e.HasField("envelope") for e in batch.entries)
    assert sorted(batch.members.full_member_ids) == ["alice", "coord-bot", "worker-bot"]
    restricted = batch.entries[-1].audience
    assert not restricted.full_members and sorted(restricted.member_ids) == [
        "alice",
        "coord-bot",
        "worker-bot",
    ]
    assert batch.entries[0].audience.full_members and not batch.entries[0].audience.member_ids
