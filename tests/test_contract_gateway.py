"""Contract truth (issue 17 item 7) for gateway_service.proto and the gateway part of
docs/errors.md: the limits WELCOME announces, credit defaults, the per-subscription frame
refusals, and the fatal HELLO refusals with the stream status after them. Each docstring names the
comment it holds to; tests/test_gateway*.py cover the rest (replay, ACKs, snapshots, FETCH, caps)."""

from __future__ import annotations

import grpc
import pytest

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc
from missionweave_server.services.gateway import limits
from tests.conftest import World, polled
from tests.test_contract_authority import posts
from tests.test_gateway import Stream, connected, hello
from tests.test_gateway_limits import ended_with, fatal
from tests.test_missions import G, create

E = pb.GatewayErrorCode
R = common_pb2.RejectionReason


async def refused(stream: Stream, code: int) -> pb.ErrorFrame:
    """The next ERROR frame: ``code``, not fatal (the stream goes on)."""
    error = (await stream.until("error")).error
    assert (E.Name(error.code), error.fatal) == (E.Name(code), False), error
    return error


async def test_welcome_announces_the_documented_limits(world: World) -> None:
    """gateway_service.proto "Limits: a frame is at most 4 MiB; ... at most 1,024 subscriptions per
    stream; credits per subscription at most 65,536" and WelcomeFrame's fields that carry them."""
    stream = Stream(world)
    await stream.send(hello=hello(world, world.owner))
    welcome = (await stream.recv()).welcome
    assert (welcome.max_frame_bytes, welcome.max_credits, welcome.max_subscriptions) == (
        4 * 1024 * 1024,
        65_536,
        1_024,
    )
    assert welcome.connection_id and welcome.HasField("server_time")
    await stream.call.done_writing()


async def test_default_credits_are_256_and_an_event_frame_carries_at_most_256_events(world: World) -> None:
    """SubscribeFrame.initial_credits "0 = the gateway default, 256"; "an EVENT frame carries at
    most 256 events" even when the window allows more; EventFrame.credits_remaining."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    await posts(w, conv, 300)
    stream = await connected(w, w.owner)
    await stream.send(subscribe=pb.SubscribeFrame(subscription_id="default", group_id=G))
    flow = (await stream.until("flow")).flow
    assert (flow.reason, flow.state, flow.credits) == (pb.FLOW_REASON_SUBSCRIBED, pb.FLOW_STATE_OPEN, 256)
    first = (await stream.until("event")).event
    assert (first.first_sequence, first.last_sequence, len(first.events), first.credits_remaining) == (
        1,
        256,
        256,
        0,
    )
    assert (await stream.recv()).flow.reason == pb.FLOW_REASON_CREDIT_EXHAUSTED
    await stream.send(subscribe=pb.SubscribeFrame(subscription_id="wide", group_id=G, initial_credits=1000))
    sizes = []
    while sum(sizes) < 305:
        frame = await stream.until("event")
        if frame.event.subscription_id == "wide":
            sizes.append(len(frame.event.events))
    assert max(sizes) == 256 and sum(sizes) == 305
    await stream.call.done_writing()


async def test_subscription_frames_are_refused_one_by_one_and_the_stream_goes_on(world: World) -> None:
    """SubscribeFrame.subscription_id "1..128 chars" (MALFORMED_FRAME) and unique
    (SUBSCRIPTION_EXISTS); initial_credits over 65,536 (LIMIT_EXCEEDED); CursorAck.group_id "else it
    must be the subscription's"; CREDIT_OVERFLOW, UNKNOWN_SUBSCRIPTION; UNSUBSCRIBE "answers FLOW
    (reason UNSUBSCRIBED)" and "The acknowledged cursor stays stored"."""
    w = world
    await create(w)
    head = (await w.client.group_state(G)).head_sequence
    stream = await connected(w, w.owner)
    for bad_id in ("", "s" * 129):
        await stream.send(subscribe=pb.SubscribeFrame(subscription_id=bad_id, group_id=G))
        error = await refused(stream, E.GATEWAY_ERROR_CODE_MALFORMED_FRAME)
        assert (error.rejection.reason, error.rejection.metadata["field"]) == (
            R.REJECTION_REASON_MALFORMED,
            "subscription_id",
        )
    await stream.send(
        subscribe=pb.SubscribeFrame(subscription_id="s" * 128, group_id=G, initial_credits=65_537)
    )
    assert (await refused(stream, E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED)).subscription_id == "s" * 128
    # From the head: nothing to deliver, so the window stays whole and every frame below is an answer.
    full = pb.SubscribeFrame(
        subscription_id="s" * 128, group_id=G, after_sequence=head, initial_credits=65_536
    )
    await stream.send(subscribe=full)
    assert (await stream.until("flow")).flow.credits == 65_536
    await stream.send(subscribe=pb.SubscribeFrame(subscription_id="s" * 128, group_id=G))
    assert (await refused(stream, E.GATEWAY_ERROR_CODE_SUBSCRIPTION_EXISTS)).subscription_id == "s" * 128

    def ack(**cursor: object) -> pb.AckFrame:
        return pb.AckFrame(cursors=[pb.CursorAck(subscription_id="s" * 128, **cursor)])  # type: ignore[arg-type]

    await stream.send(ack=ack(group_id="grp_other", cursor=head))
    error = await refused(stream, E.GATEWAY_ERROR_CODE_MALFORMED_FRAME)
    assert error.rejection.metadata["field"] == "group_id"
    await stream.send(ack=ack(cursor=head, credits=1))  # one over the full window
    await refused(stream, E.GATEWAY_ERROR_CODE_CREDIT_OVERFLOW)
    await stream.send(ack=ack(group_id=G, cursor=head - 1))
    await stream.send(ack=pb.AckFrame(cursors=[pb.CursorAck(subscription_id="nope", cursor=1)]))
    assert (await refused(stream, E.GATEWAY_ERROR_CODE_UNKNOWN_SUBSCRIPTION)).subscription_id == "nope"
    gateway = w.mesh.gateway  # type: ignore[attr-defined]

    async def stored() -> bool:
        return bool(await gateway.stored_cursor("alice", G) == head - 1)

    await polled(stored)  # the refused ACKs took nothing: the group_id one named `head`
    await stream.send(unsubscribe=pb.UnsubscribeFrame(subscription_id="s" * 128))
    closed = (await stream.until("flow")).flow
    assert (closed.reason, closed.state, closed.acked_sequence) == (
        pb.FLOW_REASON_UNSUBSCRIBED,
        pb.FLOW_STATE_CLOSED,
        head - 1,
    )
    await stream.send(unsubscribe=pb.UnsubscribeFrame(subscription_id="s" * 128))
    await refused(stream, E.GATEWAY_ERROR_CODE_UNKNOWN_SUBSCRIPTION)
    await stream.send(subscribe=pb.SubscribeFrame(subscription_id="again", group_id=G, after_sequence=head))
    again = (await stream.until("flow")).flow
    assert (again.reason, again.acked_sequence) == (pb.FLOW_REASON_SUBSCRIBED, head - 1)  # still stored
    await stream.call.done_writing()


async def test_a_stream_holds_at_most_max_subscriptions(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gateway_service.proto "at most 1,024 subscriptions per stream" (LIMIT_EXCEEDED: "Too many
    subscriptions"); the limit is lowered to 2 here, the check is the same."""
    w = world
    await create(w)
    monkeypatch.setattr(limits, "MAX_SUBSCRIPTIONS", 2)
    stream = await connected(w, w.owner)
    for n in (1, 2):
        await stream.send(subscribe=pb.SubscribeFrame(subscription_id=f"s{n}", group_id=G))
        assert (await stream.until("flow")).flow.reason == pb.FLOW_REASON_SUBSCRIBED
    await stream.send(subscribe=pb.SubscribeFrame(subscription_id="s3", group_id=G))
    assert (await refused(stream, E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED)).subscription_id == "s3"
    await stream.call.done_writing()


async def test_fatal_hello_refusals_carry_their_reason_and_end_the_stream_ok(world: World) -> None:
    """docs/errors.md "Gateway streams": a frame before HELLO and a second HELLO (HELLO_REQUIRED,
    DUPLICATE_HELLO: FRAME_OUT_OF_ORDER), a newer session (SESSION_STALE: SESSION_EPOCH_STALE),
    each fatal (ErrorFrame.fatal: "the gateway closes the stream after this frame") with stream
    status OK; GetSnapshot answers a stale session FAILED_PRECONDITION (SESSION_EPOCH_STALE)."""
    w = world
    early = Stream(w)
    await early.send(ack=pb.AckFrame())
    error = await fatal(early)
    assert (error.code, error.rejection.reason) == (
        E.GATEWAY_ERROR_CODE_HELLO_REQUIRED,
        R.REJECTION_REASON_FRAME_OUT_OF_ORDER,
    )
    assert await ended_with(early) is None
    twice = await connected(w, w.owner)
    await twice.send(hello=hello(w, w.owner))
    error = await fatal(twice)
    assert (error.code, error.rejection.reason) == (
        E.GATEWAY_ERROR_CODE_DUPLICATE_HELLO,
        R.REJECTION_REASON_FRAME_OUT_OF_ORDER,
    )
    assert await ended_with(twice) is None
    old = w.worker
    await w.client.open_session("worker-bot", old.key)  # fences the old session
    stale = Stream(w)
    await stale.send(hello=hello(w, old))
    error = await fatal(stale)
    assert (error.code, error.rejection.reason) == (
        E.GATEWAY_ERROR_CODE_SESSION_STALE,
        R.REJECTION_REASON_SESSION_EPOCH_STALE,
    )
    assert await ended_with(stale) is None
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await pb_grpc.GatewayServiceStub(w.client.channel).GetSnapshot(
            pb.GetSnapshotRequest(group_id=G, proof=hello(w, old).proof)
        )
    rejection = rejection_from_rpc_error(err.value)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_SESSION_EPOCH_STALE
