"""GatewayService.Connect, first slice: HELLO, SUBSCRIBE with replay and credits, durable ACK cursors,
visibility of restricted Conversations, COMMAND -> RESULT (spec 16, MW-8-07, MW-9-05)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import blake3
import grpc
import pytest
from sqlalchemy import select

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.signing import session_key_id, sign_envelope, verify_signature
from missionweave.sdk.client import SessionSigner, decode_events
from missionweave.v1 import conversation_pb2, membership_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc
from missionweave_server.services.gateway.schema import cursors
from tests import builders
from tests.conftest import World
from tests.test_missions import G, as_member, create

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

E = pb.GatewayErrorCode


class Stream:
    def __init__(self, w: World, channel: Any = None) -> None:
        self.call: Any = pb_grpc.GatewayServiceStub(channel or w.client.channel).Connect()

    async def send(self, **frame: Any) -> None:
        await self.call.write(pb.ConnectRequest(frame=pb.ClientFrame(**frame)))

    async def recv(self) -> pb.ServerFrame:
        response = await self.call.read()
        return response.frame

    async def until(self, kind: str) -> pb.ServerFrame:
        return await self.until_any(kind)

    async def until_any(self, *kinds: str) -> pb.ServerFrame:
        while True:
            frame = await self.recv()
            if frame.WhichOneof("frame") in kinds:
                return frame


def hello(
    w: World,
    signer: SessionSigner,
    key: Any = None,
    *,
    audience: str | None = None,
    nonce: bytes | None = None,
) -> pb.HelloFrame:
    """A HELLO for ``signer``'s session, made for the gateway at ``w.target`` (its audience)."""
    proof = pb.HelloProof(
        agent_id=signer.identity_id,
        session_epoch=signer.session_epoch,
        issued_at=to_timestamp(w.clock.now()),
        nonce=nonce or os.urandom(16),
        audience=w.target if audience is None else audience,
    )
    envelope = sign_envelope(
        proof.SerializeToString(),
        "application/vnd.missionweave.v1.hello-proof+protobuf",
        key or signer.key,
        session_key_id(signer.identity_id, signer.session_epoch),
    )
    return pb.HelloFrame(agent_id=signer.identity_id, session_epoch=signer.session_epoch, proof=envelope)


async def connected(w: World, signer: SessionSigner, channel: Any = None) -> Stream:
    stream = Stream(w, channel)
    await stream.send(hello=hello(w, signer))
    assert (await stream.recv()).WhichOneof("frame") == "welcome"
    return stream


async def test_hello_comes_first_and_must_prove_the_session_key(world: World) -> None:
    w = world
    early = Stream(w)
    await early.send(subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G))
    error = (await early.recv()).error
    assert error.fatal and error.code == E.GATEWAY_ERROR_CODE_HELLO_REQUIRED
    forged = Stream(w)
    await forged.send(hello=hello(w, w.worker, key=w.owner.key))
    error = (await forged.recv()).error
    assert error.fatal and error.code == E.GATEWAY_ERROR_CODE_HELLO_INVALID


@pytest.mark.req("MW-16-01", "MW-16-06", "MW-8-17", "MW-8-18")
async def test_replay_in_order_within_credits_and_durable_acks(world: World) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    for i in range(4):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"m{i}"), membership_epoch=1)
    stream = await connected(w, w.owner)
    await stream.send(
        subscribe=pb.SubscribeFrame(subscription_id="s1", group_id=G, after_sequence=0, initial_credits=3)
    )
    assert (await stream.until("flow")).flow.reason == pb.FLOW_REASON_SUBSCRIBED
    first = (await stream.until("event")).event
    assert (first.first_sequence, first.last_sequence, len(first.events)) == (1, 3, 3)
    paused = (await stream.until("flow")).flow
    assert paused.reason == pb.FLOW_REASON_CREDIT_EXHAUSTED and paused.delivered_sequence == 3
    await stream.send(ack=pb.AckFrame(cursors=[pb.CursorAck(subscription_id="s1", cursor=9)]))
    assert (await stream.until("error")).error.code == E.GATEWAY_ERROR_CODE_ACK_BEYOND_DELIVERED
    await stream.send(ack=pb.AckFrame(cursors=[pb.CursorAck(subscription_id="s1", cursor=3, credits=100)]))
    rest = (await stream.until("event")).event
    head = (await w.client.group_state(G)).head_sequence
    assert rest.first_sequence == 4 and rest.last_sequence == head

    async def stored() -> int | None:
        async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
            query = select(cursors.c.cursor).where(cursors.c.agent_id == "alice")
            return (await conn.execute(query)).scalar_one_or_none()

    for _ in range(100):  # stored with the ACKs of the same moment, within CURSOR_FLUSH_DELAY_S
        if await stored() is not None:
            break
        await asyncio.sleep(0.02)
    assert await stored() == 3  # durable per (agent, Group)
    await stream.send(ack=pb.AckFrame(cursors=[pb.CursorAck(subscription_id="s1", cursor=2)]))
    assert (await stream.until("error")).error.code == E.GATEWAY_ERROR_CODE_ACK_REGRESSED
    await stream.call.done_writing()


@pytest.mark.req("MW-9-05", "MW-8-07")
async def test_restricted_messages_are_skipped_for_others_and_late_joiners_start_at_their_grant(
    world: World,
) -> None:
    w = world
    await create(w)
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    granted = await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    open_secret = conversation_pb2.ConversationOpen(
        conversation_id="conv_secret", kind=conversation_pb2.CONVERSATION_KIND_RESTRICTED, title="s"
    )
    await w.run(w.coordinator, G, "conversation_open", open_secret, membership_epoch=2)
    await w.run(
        w.owner, G, "message_post", builders.message("conv_secret", "password is hunter2"), membership_epoch=1
    )
    stream = await connected(w, w.worker)
    await stream.send(
        subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G, after_sequence=0, initial_credits=100)
    )
    subscribed = (await stream.until("flow")).flow
    assert subscribed.effective_after_sequence == granted.group_revision - 1  # never before the grant
    frame = (await stream.until("event")).event
    assert frame.first_sequence == granted.group_revision
    delivered = {e.payload for e in frame.events}
    assert not any(b"hunter2" in p for p in delivered)
    assert [(r.first, r.last) for r in frame.skipped] == [
        (frame.last_sequence - 1, frame.last_sequence - 1),
        (frame.last_sequence, frame.last_sequence),
    ]
    owner = await connected(w, w.owner)
    await owner.send(
        subscribe=pb.SubscribeFrame(subscription_id="o", group_id=G, after_sequence=0, initial_credits=100)
    )
    full = (await owner.until("event")).event
    assert any(b"hunter2" in e.payload for e in full.events) and not full.skipped


@pytest.mark.req("MW-16-13")
async def test_commands_over_the_stream_answer_with_results_and_non_members_cannot_subscribe(
    world: World,
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    stream = await connected(w, w.worker)
    await stream.send(subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G))
    assert (await stream.until("error")).error.code == E.GATEWAY_ERROR_CODE_NOT_A_MEMBER
    owner = await connected(w, w.owner)
    command = w.owner.command(
        G, "message_post", builders.message(conv, "via the gateway"), membership_epoch=1
    )
    await owner.send(command=pb.CommandFrame(command_id=command.command_id, command=w.owner.sign(command)))
    result = (await owner.until("result")).result
    assert result.command_id == command.command_id and result.result.group_revision > 0
    await owner.send(command=pb.CommandFrame(command_id=command.command_id, command=w.owner.sign(command)))
    again = (await owner.until("result")).result
    assert again.result.replayed  # idempotent by command id
    stale = w.owner.command(G, "message_post", builders.message(conv, "x"), membership_epoch=7)
    await owner.send(command=pb.CommandFrame(command_id=stale.command_id, command=w.owner.sign(stale)))
    refused = (await owner.until("result")).result
    assert refused.HasField("rejection") and refused.command_id == stale.command_id


@pytest.mark.req("MW-16-11", "MW-16-12", "MW-7.4-01", "MW-16-09", "MW-7.4-06")
async def test_compacted_history_answers_cursor_too_old_with_a_signed_snapshot_to_restore(
    world: World,
) -> None:
    from missionweave.v1 import authority_service_pb2 as apb

    w = world
    conv = (await create(w)).mission.planning_conversation_id
    for i in range(3):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"before {i}"), membership_epoch=1)
    taken = await w.client.authority.TakeSnapshot(apb.TakeSnapshotRequest(group_id=G, compact=True))
    await w.run(w.owner, G, "message_post", builders.message(conv, "after"), membership_epoch=1)
    # History is moved to the archive tier, never deleted.
    async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
        from missionweave_server.services.authority.schema import events_archive

        archived = (
            (await conn.execute(select(events_archive.c.seq).where(events_archive.c.group_id == G)))
            .scalars()
            .all()
        )
    assert list(archived) == list(range(1, taken.sequence + 1))
    stream = await connected(w, w.owner)
    await stream.send(
        subscribe=pb.SubscribeFrame(subscription_id="old", group_id=G, after_sequence=2, initial_credits=100)
    )
    too_old = (await stream.until("cursor_too_old")).cursor_too_old
    assert too_old.requested_after_sequence == 2 and too_old.snapshot_sequence == taken.sequence
    _, public_key = await w.client.authority_key()
    assert verify_signature(too_old.signed_reference, public_key)
    reference = pb.SnapshotReference.FromString(too_old.signed_reference.payload)
    # MW-16-12: fetch, verify hash and signature, restore, resume from the snapshot sequence.
    get_snapshot = pb_grpc.GatewayServiceStub(w.client.channel).GetSnapshot
    for who, code in ((None, grpc.StatusCode.UNAUTHENTICATED), (w.worker, grpc.StatusCode.PERMISSION_DENIED)):
        proof = hello(w, who).proof if who else None
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # only a proven member gets it
            await get_snapshot(pb.GetSnapshotRequest(group_id=G, digest=reference.digest, proof=proof))
        assert refused.value.code() == code
    fetched = await get_snapshot(
        pb.GetSnapshotRequest(group_id=G, digest=reference.digest, proof=hello(w, w.owner).proof)
    )
    assert blake3.blake3(fetched.snapshot.payload).hexdigest() == reference.digest.hex
    assert verify_signature(fetched.snapshot, public_key)
    restored = apb.GroupSnapshot.FromString(fetched.snapshot.payload)
    assert restored.sequence == taken.sequence and restored.state.mission.planning_conversation_id == conv
    await stream.send(
        subscribe=pb.SubscribeFrame(
            subscription_id="new", group_id=G, after_sequence=restored.sequence, initial_credits=100
        )
    )
    resumed = (await stream.until("event")).event
    assert resumed.first_sequence == taken.sequence + 1 and b"after" in resumed.events[0].payload


@pytest.mark.req("MW-9-05", "MW-16-12")
async def test_a_snapshot_is_served_as_the_members_view_without_restricted_conversations(
    world: World,
) -> None:
    """The Group's snapshot holds a restricted Conversation: its participant gets the snapshot as
    stored; the Worker, not party to it, gets its view (that Conversation left out), signed by the
    Authority with a reference naming the snapshot it is a view of."""
    from missionweave.v1 import authority_service_pb2 as apb

    w = world
    await create(w)
    opened = conversation_pb2.ConversationOpen(
        conversation_id="conv_secret",
        kind=conversation_pb2.CONVERSATION_KIND_RESTRICTED,
        title="secret",
        participant_ids=["coord-bot"],
    )
    await w.run(w.coordinator, G, "conversation_open", opened, membership_epoch=2)
    await as_member(w, G, w.worker)
    taken = await w.client.authority.TakeSnapshot(apb.TakeSnapshotRequest(group_id=G))
    _, public_key = await w.client.authority_key()
    get_snapshot = pb_grpc.GatewayServiceStub(w.client.channel).GetSnapshot

    async def fetched(signer: SessionSigner) -> tuple[apb.GroupSnapshot, pb.SnapshotReference]:
        answer = await get_snapshot(
            pb.GetSnapshotRequest(group_id=G, digest=taken.digest, proof=hello(w, signer).proof)
        )
        assert verify_signature(answer.snapshot, public_key) and verify_signature(
            answer.signed_reference, public_key
        )
        reference = pb.SnapshotReference.FromString(answer.signed_reference.payload)
        assert blake3.blake3(answer.snapshot.payload).hexdigest() == reference.digest.hex
        return apb.GroupSnapshot.FromString(answer.snapshot.payload), reference

    full, reference = await fetched(w.coordinator)
    assert reference.digest == taken.digest and not reference.HasField("view_of")
    assert "conv_secret" in [c.conversation_id for c in full.state.conversations]
    view, reference = await fetched(w.worker)
    assert (
        reference.view_of == taken.digest
        and reference.viewer_id == "worker-bot"
        and reference.digest != taken.digest
    )
    assert "conv_secret" not in [c.conversation_id for c in view.state.conversations]
    assert b"secret" not in view.SerializeToString()
    kept = [c for c in full.state.conversations if c.conversation_id != "conv_secret"]
    del full.state.conversations[:]
    full.state.conversations.extend(kept)
    assert view == full  # nothing else differs


@pytest.mark.req("MW-7.4-01")
async def test_a_compacted_group_is_rebuilt_from_the_archive_and_online_tiers_together(world: World) -> None:
    """The Authority folds the whole history after compaction: on a restart it must not start from
    the first online event (that state would have no Mission at all)."""
    from missionweave.v1 import authority_service_pb2 as apb

    w = world
    conv = (await create(w)).mission.planning_conversation_id
    first = w.signed(w.owner, G, "message_post", builders.message(conv, "first"), membership_epoch=1)
    await w.client.execute(first)
    for i in range(3):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"before {i}"), membership_epoch=1)
    await w.client.authority.TakeSnapshot(apb.TakeSnapshotRequest(group_id=G, compact=True))
    await w.run(w.owner, G, "message_post", builders.message(conv, "after"), membership_epoch=1)
    authority = w.mesh.authority  # type: ignore[attr-defined]
    live = await authority.state(G)
    assert await authority.fold(G) == live
    everything = list(range(1, live.head_sequence + 1))
    assert [e.sequence for e in await authority.store.read_history(G)] == everything
    # Audits (ReadEvents) and command replays still see the archived part of the history.
    read = [
        e async for r in w.client.authority.ReadEvents(apb.ReadEventsRequest(group_id=G)) for e in r.events
    ]
    assert [e.sequence for e in decode_events(read)] == everything
    again = await w.client.execute(first)
    assert again.replayed and len(again.events) == 1


async def test_stopping_the_mesh_ends_open_streams_with_unavailable_at_once(world: World) -> None:
    """Streams never end by themselves: a stop must end them (UNAVAILABLE, which clients retry on)
    rather than hold its whole grace period and have them cancelled after the database is closed.
    The world fixture then checks that no task is left running."""
    import grpc

    w = world
    await create(w)
    stream = await connected(w, w.owner)
    await stream.send(subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G, initial_credits=100))
    await stream.until("event")
    await w.mesh.stop(grace=60)  # type: ignore[attr-defined]
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        while True:
            await stream.recv()
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in (ended.value.details() or "")


@pytest.mark.req("MW-7.4-02")
async def test_archival_snapshot_of_a_finished_mission_holds_decisions_work_items_approvals_and_artifacts(
    world: World,
) -> None:
    import grpc

    from missionweave.v1 import authority_service_pb2 as apb
    from missionweave.v1 import mission_pb2

    w = world
    await create(w)
    with pytest.raises(grpc.aio.AioRpcError):
        await w.client.authority.TakeSnapshot(
            apb.TakeSnapshotRequest(group_id=G, archival=True)
        )  # still live
    from tests.test_missions import approve_body, mission, submit

    await submit(w)
    await w.run(w.owner, G, "mission_approve", approve_body(await mission(w)), membership_epoch=1)
    final = await w.client.authority.TakeSnapshot(apb.TakeSnapshotRequest(group_id=G, archival=True))
    snapshot = apb.GroupSnapshot.FromString(final.snapshot.payload)
    assert snapshot.archival and snapshot.state.mission.state == mission_pb2.MISSION_STATE_APPROVED
    assert snapshot.state.mission.approval_event_id and snapshot.progress.approval_event_id
    assert snapshot.progress.latest_submission_event_id  # decisions
    _, public_key = await w.client.authority_key()
    assert verify_signature(final.snapshot, public_key)


@pytest.mark.req("MW-8-11", "MW-8-12", "MW-8-13", "MW-8-15")
async def test_attention_filters_skip_the_rest_which_stays_retrievable(world: World) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    chatter = await w.run(
        w.owner, G, "message_post", builders.message(conv, "general chatter"), membership_epoch=1
    )
    mention = builders.message(conv, "@worker-bot please look", mentions=["worker-bot"])
    mentioned = await w.run(w.owner, G, "message_post", mention, membership_epoch=1)
    critical = builders.message(conv, "freeze all deploys")
    critical.topic = "critical"
    await w.run(w.owner, G, "message_post", critical, membership_epoch=1)
    head = (await w.client.group_state(G)).head_sequence
    stream = await connected(w, w.worker)
    focus = pb.AttentionFilter(
        mode=pb.ATTENTION_MODE_FILTERED,
        direct_mentions=True,
        critical_announcements=True,
        own_work_items=True,
    )
    await stream.send(
        subscribe=pb.SubscribeFrame(subscription_id="f", group_id=G, initial_credits=100, filter=focus)
    )
    frame = (await stream.until("event")).event
    texts = [e.payload for e in frame.events]
    assert any(b"please look" in t for t in texts) and any(b"freeze all deploys" in t for t in texts)
    assert not any(b"general chatter" in t for t in texts)
    skipped = {n for r in frame.skipped for n in range(r.first, r.last + 1)}
    assert chatter.group_revision in skipped and mentioned.group_revision not in skipped
    # Contiguity (OP-26): every sequence of the range is either delivered or listed as skipped.
    assert (
        len(frame.events) + len(skipped) == frame.last_sequence - frame.first_sequence + 1
        and frame.last_sequence == head
    )
    # MW-8-13: the filtered Message is still retrievable on demand.
    on_demand = [e async for e in w.client.read_events(G, after=chatter.group_revision - 1)]
    assert on_demand[0].message_posted.content.text == "general chatter"
    # MW-8-15: a summary subscription carries lifecycle events, not the conversation.
    owner = await connected(w, w.owner)
    await owner.send(
        subscribe=pb.SubscribeFrame(
            subscription_id="s",
            group_id=G,
            initial_credits=100,
            filter=pb.AttentionFilter(mode=pb.ATTENTION_MODE_SUMMARY),
        )
    )
    summary = (await owner.until("event")).event
    assert summary.events and not any(b"general chatter" in e.payload for e in summary.events)


@pytest.mark.req("MW-16-06", "MW-16-07")
async def test_stored_ack_cursors_only_move_forward_in_one_flush(world: World) -> None:
    """The write-behind flush stores every noted cursor with one upsert: new rows are inserted,
    higher cursors raise the stored one, a lower one (a stale or replayed ACK) changes nothing."""
    gateway = world.mesh.gateway  # type: ignore[attr-defined]
    await gateway.store_cursors({("agent-a", "grp_1"): 5, ("agent-b", "grp_1"): 3, ("agent-a", "grp_2"): 9})
    await gateway.store_cursors({("agent-a", "grp_1"): 4, ("agent-b", "grp_1"): 7, ("agent-a", "grp_2"): 9})
    assert await gateway.stored_cursor("agent-a", "grp_1") == 5
    assert await gateway.stored_cursor("agent-b", "grp_1") == 7
    assert await gateway.stored_cursor("agent-a", "grp_2") == 9
    assert await gateway.stored_cursor("agent-b", "grp_2") == 0


@pytest.mark.req("MW-8-17", "MW-16-08")
async def test_flow_reports_a_paused_window_reopening_but_not_every_grant(world: World) -> None:
    """FLOW frames carry state changes of the credit window: PAUSED when it is used up, OPEN again
    (CREDIT_GRANTED) when an ACK refills it. Grants to a window that is still open are not echoed,
    which would double the frames per delivery."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    head = (await w.client.group_state(G)).head_sequence
    stream = await connected(w, w.owner)
    await stream.send(
        subscribe=pb.SubscribeFrame(subscription_id="s1", group_id=G, after_sequence=head, initial_credits=1)
    )
    assert (await stream.until("flow")).flow.reason == pb.FLOW_REASON_SUBSCRIBED
    await w.run(w.owner, G, "message_post", builders.message(conv, "one"), membership_epoch=1)
    assert [e.sequence for e in decode_events((await stream.until("event")).event.events)] == [head + 1]
    assert (await stream.recv()).flow.reason == pb.FLOW_REASON_CREDIT_EXHAUSTED
    await stream.send(
        ack=pb.AckFrame(cursors=[pb.CursorAck(subscription_id="s1", cursor=head + 1, credits=5)])
    )
    reopened = (await stream.recv()).flow
    assert (reopened.reason, reopened.state, reopened.credits) == (
        pb.FLOW_REASON_CREDIT_GRANTED,
        pb.FLOW_STATE_OPEN,
        5,
    )
    # An open window: the grant is silent, the next frame is the next event.
    await stream.send(
        ack=pb.AckFrame(cursors=[pb.CursorAck(subscription_id="s1", cursor=head + 1, credits=3)])
    )
    await w.run(w.owner, G, "message_post", builders.message(conv, "two"), membership_epoch=1)
    frame = await stream.recv()
    assert frame.WhichOneof("frame") == "event"
    # 5 - 1 + 3 once the second grant is counted (it may land just after this event was sent: 5 - 1)
    assert frame.event.credits_remaining in (7, 4)
    await stream.call.done_writing()
