"""A replaced session's gateway streams end (issue 40 part 2, MW-11.3-09): when an agent opens a new
session, every stream HELLO'd with an older one ends at once, on the gateway where the session was
opened and on every other gateway replica (each learns of it from the identity directory's watch),
with a fatal ERROR SESSION_STALE and status FAILED_PRECONDITION, both carrying the Rejection
SESSION_EPOCH_STALE (docs/gateway.md "When a session is replaced"). A stream of the new session
works as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.client import SessionSigner
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from tests import builders
from tests.conftest import World
from tests.test_gateway import Stream, connected, hello
from tests.test_missions import G, create

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

E = pb.GatewayErrorCode
R = common_pb2.RejectionReason
# How long a replaced session's stream may take to end (it ends as soon as the directory's change
# reaches the gateway: OpenSession answers only once every watch stream was written it).
DEADLINE_S = 5.0


@pytest.fixture
async def replica(world: World) -> AsyncIterator[Any]:
    """A second gateway replica, in a mesh of its own, reaching Membership and the Authority over
    gRPC (those of the split topology, or the single mesh's). Agents' proofs name the first gateway's
    address, the replicas' shared audience."""
    from missionweave_server.mesh.server import start

    w = world
    if w.settings.services == ("gateway",):  # split: the first gateway's own settings and peers
        settings = replace(w.settings, listen="127.0.0.1:0", instance_id="gateway-2")
    else:
        peers = {name: w.target for name in ("membership", "artifacts", "scheduling", "authority")}
        settings = replace(
            w.settings,
            listen="127.0.0.1:0",
            services=("gateway",),
            peers=peers,
            instance_id="gateway-2",
            audience=w.target,
        )
    mesh = await start(settings, w.clock)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{mesh.port}")
    try:
        yield channel
    finally:
        await channel.close()
        await mesh.stop(grace=1)


async def ended_replaced(stream: Stream, old: int, new: int) -> None:
    """The stream's next frames end in a fatal SESSION_STALE, then status FAILED_PRECONDITION with the
    same Rejection, within DEADLINE_S."""
    async with asyncio.timeout(DEADLINE_S):
        while True:
            response = await stream.call.read()
            assert response is not grpc.aio.EOF, "the stream ended without its fatal ERROR frame"
            if response.frame.WhichOneof("frame") == "error":
                error = response.frame.error
                break
        assert error.fatal and error.code == E.GATEWAY_ERROR_CODE_SESSION_STALE, error
        assert error.rejection.reason == R.REJECTION_REASON_SESSION_EPOCH_STALE
        assert dict(error.rejection.metadata) == {"session_epoch": str(old), "current_epoch": str(new)}
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            while await stream.call.read() is not grpc.aio.EOF:
                pass
    assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    rejection = rejection_from_rpc_error(ended.value)
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_SESSION_EPOCH_STALE
    assert rejection.metadata["current_epoch"] == str(new)


async def subscribed(stream: Stream, subscription_id: str) -> None:
    await stream.send(
        subscribe=pb.SubscribeFrame(subscription_id=subscription_id, group_id=G, initial_credits=1000)
    )
    flow = (await stream.until_any("flow", "error")).flow
    assert flow.reason == pb.FLOW_REASON_SUBSCRIBED


async def posted(w: World, signer: SessionSigner, text: str) -> int:
    conversation = (await w.client.group_state(G)).mission.planning_conversation_id
    result = await w.run(signer, G, "message_post", builders.message(conversation, text), membership_epoch=1)
    return int(result.group_revision)


async def delivered(stream: Stream, sequence: int) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while True:
            frame = await stream.recv()
            assert frame.WhichOneof("frame") != "error", frame
            if frame.WhichOneof("frame") == "event" and frame.event.last_sequence >= sequence:
                return


async def test_a_new_session_ends_the_old_sessions_streams_on_every_gateway(
    world: World, replica: Any
) -> None:
    w = world
    await create(w)
    old = w.owner
    here = await connected(w, old)  # the gateway the agent and the new session go through
    there = await connected(w, old, replica)  # another replica: it learns from the directory's watch
    await subscribed(here, "s-here")
    await subscribed(there, "s-there")
    unsubscribed = await connected(w, old)  # a stream without subscriptions ends too
    assert w.mesh.gateway.streams_of("alice") == 2  # type: ignore[attr-defined]

    new = await w.client.open_session("alice", old.key)
    assert new.session_epoch > old.session_epoch
    for stream in (here, there, unsubscribed):
        await ended_replaced(stream, old.session_epoch, new.session_epoch)
    assert w.mesh.gateway.streams_of("alice") == 0  # type: ignore[attr-defined]

    # The old session cannot connect again; the new one works on both replicas, live.
    refused = Stream(w, replica)
    await refused.send(hello=hello(w, old))
    error = (await refused.recv()).error
    assert error.fatal and error.code == E.GATEWAY_ERROR_CODE_SESSION_STALE
    current_here = await connected(w, new)
    current_there = await connected(w, new, replica)
    await subscribed(current_here, "s1")
    await subscribed(current_there, "s1")
    sequence = await posted(w, new, "after the new session")
    await delivered(current_here, sequence)
    await delivered(current_there, sequence)
    await asyncio.sleep(0.3)  # nothing else ends them
    await current_here.send(
        ack=pb.AckFrame(cursors=[pb.CursorAck(subscription_id="s1", cursor=sequence, credits=1)])
    )
    sequence = await posted(w, new, "still here")
    await delivered(current_here, sequence)
    current_here.call.cancel()
    current_there.call.cancel()


async def test_other_agents_and_the_current_session_are_untouched(world: World) -> None:
    w = world
    await create(w)
    theirs = await connected(w, w.owner)
    await subscribed(theirs, "s")
    mine = await connected(w, w.worker)
    new = await w.client.open_session("worker-bot", w.worker.key)
    await ended_replaced(mine, w.worker.session_epoch, new.session_epoch)
    current = await connected(w, new)
    newer = await w.client.open_session("worker-bot", w.worker.key)  # replaced in turn
    await ended_replaced(current, new.session_epoch, newer.session_epoch)
    sequence = await posted(w, w.owner, "alice's stream goes on")
    await delivered(theirs, sequence)
    theirs.call.cancel()


async def test_a_directory_resync_ends_streams_of_sessions_replaced_meanwhile(world: World) -> None:
    """A change the watch never delivered (its cache was reset): the gateway asks Membership for the
    current session of every agent with a stream, and ends those replaced."""
    w = world
    gateway = w.mesh.gateway  # type: ignore[attr-defined]
    stream = await connected(w, w.worker)
    gateway._unlisten_sessions()  # the change is "missed"
    gateway._unlisten_sessions = None
    new = await w.client.open_session("worker-bot", w.worker.key)
    await asyncio.sleep(0.2)
    assert gateway.streams_of("worker-bot") == 1
    gateway.sessions_resync()  # what the directory client's restart of its cache calls
    await ended_replaced(stream, w.worker.session_epoch, new.session_epoch)
