"""A followed ReadEvents proven by a session ends once that session is replaced (MW-11.3-09), as the
gateway's streams do (tests/test_gateway_sessions.py)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.client import MeshClient
from missionweave.v1 import common_pb2
from tests import builders
from tests.conftest import World, polled
from tests.test_missions import G, create

pytestmark = pytest.mark.both_topologies


async def _holds(condition: bool) -> bool:
    return condition


async def test_a_follow_of_a_replaced_session_ends_and_the_new_session_follows_on(world: World) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    reader = MeshClient(w.target)
    reader.read_as(w.owner)
    seen: list[int] = []

    async def follow(client: MeshClient) -> None:
        async for event in client.read_events(G, follow=True):
            seen.append(event.sequence)

    try:
        following = asyncio.create_task(follow(reader))
        posted = await w.run(w.owner, G, "message_post", builders.message(conv, "before"), membership_epoch=1)
        await polled(lambda: _holds(posted.group_revision in seen))
        async with MeshClient(w.target) as other:
            newer = await other.open_session("alice", w.owner.key)
        async with asyncio.timeout(10):  # ended at its next wait (every 0.5 s at most)
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await following
        assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        rejection = rejection_from_rpc_error(ended.value)
        assert rejection is not None and rejection.reason == common_pb2.REJECTION_REASON_SESSION_EPOCH_STALE
        assert rejection.metadata["current_epoch"] == str(newer.session_epoch)
        # The new session follows on from where the old one was.
        renewed = MeshClient(w.target)
        renewed.read_as(newer)
        again: list[int] = []

        async def follow_again() -> None:
            async for event in renewed.read_events(G, after=seen[-1], follow=True):
                again.append(event.sequence)

        task = asyncio.create_task(follow_again())
        posted = await w.run(newer, G, "message_post", builders.message(conv, "after"), membership_epoch=1)
        await polled(lambda: _holds(posted.group_revision in again))
        task.cancel()
        await renewed.channel.close()
    finally:
        await reader.channel.close()
