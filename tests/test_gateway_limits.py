"""Gateway hardening (issue 13 item 6): a HELLO proof is accepted once and only by the gateway it
names, a COMMAND frame whose id is not its signed command's is refused before anything is executed,
streams are capped per identity and in total, streams that never say HELLO or stop reading are
closed, and what a stream held is given back when it ends.

The spec's seeds do not cover sessions and HELLO (sections 12 and 15 are missing, REQUIREMENTS.md
§0): these rules are the gateway contract's (protos/missionweave/v1/gateway_service.proto), so only
the delivery requirements they protect are named.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import weakref
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc
from missionweave_server.edge.callers import audiences_for
from missionweave_server.edge.status import peer_unavailable
from missionweave_server.services.gateway import service as gateway_service
from missionweave_server.services.gateway.connection import Connection
from missionweave_server.services.gateway.outbox import Outbox
from missionweave_server.services.gateway.stream import Subscription
from tests import builders
from tests.conftest import World
from tests.test_bad_input import row_counts
from tests.test_gateway import Stream, connected, hello
from tests.test_missions import G, create

E = pb.GatewayErrorCode
R = common_pb2.RejectionReason


def gateway_of(w: World) -> gateway_service.GatewayServicer:
    return w.mesh.gateway  # type: ignore[attr-defined,no-any-return]


def limit(w: World, **changes: Any) -> None:
    """This test's limits (read by each new stream)."""
    gw = gateway_of(w)
    gw.limits = dataclasses.replace(gw.limits, **changes)


async def fatal(stream: Stream) -> pb.ErrorFrame:
    frame = await stream.recv()
    assert frame.WhichOneof("frame") == "error" and frame.error.fatal, frame
    return frame.error


async def ended_with(stream: Stream) -> grpc.aio.AioRpcError | None:
    """How the stream ends after its last frame: its error status, or None for OK."""
    try:
        while (response := await stream.call.read()) is not grpc.aio.EOF:
            assert response is not None
    except grpc.aio.AioRpcError as err:
        return err
    return None


async def eventually(condition: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Poll ``condition`` (state of the gateway, which signals nothing) until it holds."""
    async with asyncio.timeout(limit_s):
        while not condition():  # noqa: ASYNC110 (no event to wait for)
            await asyncio.sleep(0.02)


# ------------------------------------------------------------ HELLO proofs


async def test_a_hello_proof_is_accepted_once_on_any_stream_and_for_get_snapshot(world: World) -> None:
    w = world
    frame = hello(w, w.owner)
    first = Stream(w)
    await first.send(hello=frame)
    assert (await first.recv()).HasField("welcome")
    replayed = Stream(w)  # the same proof on a second stream
    await replayed.send(hello=frame)
    error = await fatal(replayed)
    assert error.code == E.GATEWAY_ERROR_CODE_HELLO_INVALID
    assert (
        error.rejection.reason == R.REJECTION_REASON_SIGNATURE_INVALID
        and error.rejection.metadata["field"] == "nonce"
    )
    # GetSnapshot takes a HelloProof too, from the same cache: a proof is good once, for either.
    get_snapshot = pb_grpc.GatewayServiceStub(w.client.channel).GetSnapshot
    digest = common_pb2.Digest(algorithm="blake3", hex="00" * 32, size_bytes=1)
    for proof in (frame.proof, hello(w, w.owner).proof):
        request = pb.GetSnapshotRequest(group_id=G, digest=digest, proof=proof)
        with pytest.raises(grpc.aio.AioRpcError):
            await get_snapshot(request)  # the fresh one reaches the Authority (no such Group)
        with pytest.raises(grpc.aio.AioRpcError) as again:
            await get_snapshot(request)
        assert again.value.code() == grpc.StatusCode.UNAUTHENTICATED
        rejection = rejection_from_rpc_error(again.value)
        assert rejection is not None and rejection.metadata["field"] == "nonce"
    # A fresh proof (new nonce) of the same session is fine.
    await connected(w, w.owner)


async def test_a_hello_proof_made_for_another_gateway_is_refused(world: World) -> None:
    w = world
    for audience in ("", "gateway.elsewhere:50051", w.target + "0"):
        stream = Stream(w)
        await stream.send(hello=hello(w, w.owner, audience=audience))
        error = await fatal(stream)
        assert error.code == E.GATEWAY_ERROR_CODE_HELLO_INVALID
        assert error.rejection.metadata["field"] == "audience", error
    # The same address written as a gRPC target, or by name, is the same audience.
    port = w.target.rsplit(":", 1)[1]
    for audience in (f"dns:///{w.target}", f"localhost:{port}", f"ipv4:{w.target}"):
        stream = Stream(w)
        await stream.send(hello=hello(w, w.owner, audience=audience))
        assert (await stream.recv()).HasField("welcome"), audience
    get_snapshot = pb_grpc.GatewayServiceStub(w.client.channel).GetSnapshot
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await get_snapshot(
            pb.GetSnapshotRequest(
                group_id=G, proof=hello(w, w.owner, audience="gateway.elsewhere:50051").proof
            )
        )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    rejection = rejection_from_rpc_error(refused.value)
    assert rejection is not None and rejection.metadata["field"] == "audience"


def test_the_audiences_are_the_mesh_addresses_normalized_with_loopback_spellings() -> None:
    assert audiences_for("127.0.0.1:5") == {"127.0.0.1:5", "localhost:5", "[::1]:5"}
    assert audiences_for("0.0.0.0:50051") == {"127.0.0.1:50051", "localhost:50051", "[::1]:50051"}
    assert audiences_for("10.0.0.7:50051") == {"10.0.0.7:50051"}
    assert audiences_for("Gateway.Example:443", "dns:///gateway:50051") == {
        "gateway.example:443",
        "gateway:50051",
    }


# ------------------------------------------------------------ COMMAND frames


async def test_a_command_frame_whose_id_is_not_the_signed_commands_is_refused_before_execution(
    world: World,
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    stream = await connected(w, w.owner)
    before = await row_counts(w)
    head = (await w.client.group_state(G)).head_sequence
    command = w.owner.command(G, "message_post", builders.message(conv, "the real one"), membership_epoch=1)
    signed = w.owner.sign(command)
    await stream.send(command=pb.CommandFrame(command_id="cmd-somebody-else", command=signed))
    async with asyncio.timeout(10):
        answer = await stream.until_any("error", "result")
    assert answer.WhichOneof("frame") == "error", answer  # not executed, so no RESULT
    error = answer.error
    assert error.code == E.GATEWAY_ERROR_CODE_COMMAND_ID_MISMATCH and error.command_id == "cmd-somebody-else"
    garbled = common_pb2.SignedEnvelope(
        payload=b"\xff" * 11, payload_type=signed.payload_type, signatures=signed.signatures
    )
    await stream.send(command=pb.CommandFrame(command_id=command.command_id, command=garbled))
    error = (await stream.until("error")).error
    assert (
        error.code == E.GATEWAY_ERROR_CODE_MALFORMED_FRAME
        and error.rejection.reason == R.REJECTION_REASON_MALFORMED
    )
    # Nothing was executed: no event, no command record; the same command with its own id then runs
    # for the first time (not a replay).
    assert await row_counts(w) == before
    assert (await w.client.group_state(G)).head_sequence == head
    await stream.send(command=pb.CommandFrame(command_id=command.command_id, command=signed))
    result = (await stream.until("result")).result
    assert result.command_id == command.command_id and not result.result.replayed
    assert (await w.client.group_state(G)).head_sequence == head + 1


# ------------------------------------------------------------ stream caps


async def test_streams_are_capped_per_identity_with_a_structured_refusal(world: World) -> None:
    w = world
    limit(w, max_streams_per_identity=2)
    first, _second = await connected(w, w.owner), await connected(w, w.owner)
    third = Stream(w)
    await third.send(hello=hello(w, w.owner))
    error = await fatal(third)
    assert error.code == E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED
    rejection = error.rejection
    assert rejection.reason == R.REJECTION_REASON_OVERLOADED
    assert (rejection.metadata["scope"], rejection.metadata["limit"]) == ("identity", "2")
    assert int(rejection.metadata["retry_after_ms"]) > 0
    status = await ended_with(third)
    assert status is not None and status.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert rejection_from_rpc_error(status) == rejection
    await connected(w, w.worker)  # another identity is not held back
    first.call.cancel()  # one of alice's ends: she may open another
    await eventually(lambda: gateway_of(w).streams_of("alice") == 1)
    await connected(w, w.owner)


async def test_streams_are_capped_in_total_before_hello(world: World) -> None:
    w = world
    limit(w, max_streams=3)
    held = [Stream(w) for _ in range(3)]
    for stream in held:  # the call opens with its first message
        await stream.send(hello=hello(w, w.admin))
        assert (await stream.recv()).HasField("welcome")
    refused = Stream(w)
    await refused.send(hello=hello(w, w.owner))
    error = await fatal(refused)
    assert (
        error.code == E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED and error.rejection.metadata["scope"] == "gateway"
    )
    status = await ended_with(refused)
    assert status is not None and status.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    held[0].call.cancel()
    await eventually(lambda: len(gateway_of(w).connections) == 2)
    await connected(w, w.owner)


# ------------------------------------------------------------ idle streams


async def test_a_hello_that_membership_cannot_confirm_is_refused_retryable_not_failed(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by bench/slow_readers.py: 2,000 HELLOs at once made Membership miss its deadline, and
    the stream ended with status OK, no frame, and an ERROR traceback "gateway stream failed"."""
    w = world
    registry = gateway_of(w).registry

    async def silent(*_: Any, **__: Any) -> Any:
        raise peer_unavailable(
            "membership", "the membership service did not answer (DEADLINE_EXCEEDED); retry shortly"
        )

    monkeypatch.setattr(registry, "session_key", silent)
    stream = Stream(w)
    await stream.send(hello=hello(w, w.owner))
    error = await fatal(stream)
    assert error.code == E.GATEWAY_ERROR_CODE_PEER_UNAVAILABLE
    assert error.rejection.reason == common_pb2.REJECTION_REASON_PEER_UNAVAILABLE
    assert (
        error.rejection.metadata["peer"] == "membership"
        and int(error.rejection.metadata["retry_after_ms"]) > 0
    )
    status = await ended_with(stream)
    assert status is not None and status.code() == grpc.StatusCode.UNAVAILABLE
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    monkeypatch.undo()
    await connected(w, w.owner)  # once Membership answers, a fresh HELLO is welcome


async def test_a_stream_that_never_says_hello_is_closed(world: World) -> None:
    w = world
    limit(w, hello_timeout_s=0.3)
    silent = Stream(w)
    await silent.call.wait_for_connection()
    async with asyncio.timeout(5):
        error = await fatal(silent)
    assert error.code == E.GATEWAY_ERROR_CODE_HELLO_REQUIRED and "within" in error.rejection.message
    await eventually(lambda: not gateway_of(w).connections)
    # A prompt HELLO is unaffected.
    await connected(w, w.owner)


@pytest.mark.req("MW-8-17")
async def test_a_stream_that_stops_reading_is_closed_and_gives_back_what_it_held(world: World) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    for i in range(60):  # far more than the transport's 64 KiB window and the outbox hold
        await w.run(
            w.owner, G, "message_post", builders.message(conv, f"{i} " + "x" * 4_000), membership_epoch=1
        )
    limit(w, stall_timeout_s=0.5, stream_buffer_bytes=32 * 1024)
    baseline = live(Connection)
    channel = grpc.aio.insecure_channel(w.target, options=[("grpc.http2.bdp_probe", 0)])
    try:
        stalled = Stream(w, channel)
        await stalled.send(hello=hello(w, w.owner))
        assert (await stalled.recv()).HasField("welcome")
        await stalled.send(
            subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G, initial_credits=65_536)
        )
        (held,) = gateway_of(w).connections
        held_ref = weakref.ref(held)  # not a reference of this test's: the last check sees it freed
        del held

        def connection() -> Connection:
            alive = held_ref()
            assert alive is not None
            return alive

        await eventually(lambda: connection().sending_since is not None)  # an EVENT frame it does not take
        await eventually(lambda: connection().ended and not gateway_of(w).connections)
        # The agent sees its stream end, after the frames the transport already held: with
        # RESOURCE_EXHAUSTED and a Rejection saying why (reconnect and resume).
        async with asyncio.timeout(10):
            status = await ended_with(stalled)
        assert status is not None and status.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        rejection = rejection_from_rpc_error(status)
        assert rejection is not None and rejection.metadata["scope"] == "stalled"
        await eventually(lambda: (alive := held_ref()) is None or not alive.tasks())
        alive = held_ref()
        assert alive is None or alive.outbox.queued_frames == 0
        del alive
        # A reader that keeps reading is never closed, however long it takes.
        reader = await connected(w, w.worker)
        await asyncio.sleep(1.0)
        assert any(c.agent_id == "worker-bot" for c in gateway_of(w).connections)
        reader.call.cancel()
        del reader
    finally:
        await channel.close()
    await eventually(lambda: live(Connection) <= baseline and held_ref() is None)


async def test_a_streams_queue_is_bounded_in_bytes() -> None:
    box = Outbox(max_bytes=10_000)
    big = pb.ServerFrame(event=pb.EventFrame(group_id="g", subscription_id="x" * 6_000))
    await box.put_group("g", big)  # an empty outbox takes any frame
    blocked = asyncio.create_task(box.put_group("h", big))  # 12 KB would pass the budget: it waits
    control = asyncio.create_task(
        box.put_control(pb.ServerFrame(result=pb.ResultFrame(command_id="c" * 5_000)))
    )
    await asyncio.sleep(0.05)
    assert not blocked.done() and not control.done() and box.queued_bytes < 10_000
    for _ in range(2):  # the agent reads: room again, one frame at a time
        assert (await box.get()) is not None
        await asyncio.sleep(0.05)
        assert box.queued_bytes <= 10_000
    await asyncio.wait_for(asyncio.gather(blocked, control), 1)
    assert box.queued_frames == 1
    box.end(drop=True)
    assert box.queued_bytes == 0


# ------------------------------------------------------------ memory after streams end


def live(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


@pytest.mark.req("MW-8-17")
async def test_streams_that_end_give_back_everything_they_held(world: World) -> None:
    """Many streams, each subscribed and never reading, then cancelled by their clients: afterwards no
    connection, subscription, outbox or task of theirs is left (objects counted, not RSS)."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    for i in range(20):
        await w.run(
            w.owner, G, "message_post", builders.message(conv, f"{i} " + "x" * 4_000), membership_epoch=1
        )
    limit(w, max_streams_per_identity=1_000)
    gw = gateway_of(w)
    kinds = (Connection, Subscription, Outbox)
    before = {k: live(k) for k in kinds}
    tasks_before = len(asyncio.all_tasks())
    channels = [grpc.aio.insecure_channel(w.target, options=[("grpc.http2.bdp_probe", 0)]) for _ in range(5)]
    streams = []
    try:
        for i in range(50):
            stream = Stream(w, channels[i % len(channels)])
            await stream.send(hello=hello(w, w.owner))
            assert (await stream.recv()).HasField("welcome")
            await stream.send(
                subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G, initial_credits=65_536)
            )
            streams.append(stream)
        await eventually(lambda: len(gw.connections) == 50 and all(c.subscriptions for c in gw.connections))
        assert live(Connection) >= before[Connection] + 50
        for stream in streams:
            stream.call.cancel()
        del stream, streams
        await eventually(lambda: not gw.connections and gw.streams_of("alice") == 0)
        await eventually(lambda: len(asyncio.all_tasks()) <= tasks_before, limit_s=15)
        await eventually(lambda: all(live(k) <= before[k] for k in kinds), limit_s=15)
    finally:
        for channel in channels:
            await channel.close()
