"""GatewayService.Connect, first slice: HELLO, SUBSCRIBE with replay and credits, durable ACK cursors,
visibility of restricted Conversations, COMMAND -> RESULT (spec 16, MW-8-07, MW-9-05)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from sqlalchemy import select

from gateway.schema import cursors
from missionweave.client import SessionSigner
from missionweave.clock import to_timestamp
from missionweave.signing import session_key_id, sign_envelope
from missionweave.v1 import conversation_pb2, membership_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc
from tests import builders
from tests.conftest import World
from tests.test_missions import G, create

E = pb.GatewayErrorCode


class Stream:
    def __init__(self, w: World) -> None:
        self.call: Any = pb_grpc.GatewayServiceStub(w.client.channel).Connect()

    async def send(self, **frame: Any) -> None:
        await self.call.write(pb.ConnectRequest(frame=pb.ClientFrame(**frame)))

    async def recv(self) -> pb.ServerFrame:
        response = await self.call.read()
        return response.frame

    async def until(self, kind: str) -> pb.ServerFrame:
        while True:
            frame = await self.recv()
            if frame.WhichOneof("frame") == kind:
                return frame


def hello(w: World, signer: SessionSigner, key: Any = None) -> pb.HelloFrame:
    proof = pb.HelloProof(
        agent_id=signer.identity_id,
        session_epoch=signer.session_epoch,
        issued_at=to_timestamp(w.clock.now()),
        nonce=os.urandom(16),
    )
    envelope = sign_envelope(
        proof.SerializeToString(),
        "application/vnd.missionweave.v1.hello-proof+protobuf",
        key or signer.key,
        session_key_id(signer.identity_id, signer.session_epoch),
    )
    return pb.HelloFrame(agent_id=signer.identity_id, session_epoch=signer.session_epoch, proof=envelope)


async def connected(w: World, signer: SessionSigner) -> Stream:
    stream = Stream(w)
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
    async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
        stored = (
            await conn.execute(select(cursors.c.cursor).where(cursors.c.agent_id == "alice"))
        ).scalar_one()
    assert stored == 3  # durable per (agent, Group)
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
