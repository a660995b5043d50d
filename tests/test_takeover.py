"""Two authority instances on one database: a takeover fences the old writer (ARCHITECTURE scale-out)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from nacl.signing import SigningKey

from missionweave.clock import ManualClock, SystemClock
from missionweave.config import Settings
from missionweave.mesh.server import start
from missionweave.rpc.status import rejection_from_rpc_error
from missionweave.sdk.client import MeshClient
from missionweave.signing import read_key
from missionweave.v1 import common_pb2
from tests import builders

R = common_pb2.RejectionReason


async def test_takeover_fences_the_old_instance_and_never_interleaves(db_url: str, tmp_path: Path) -> None:
    clock = ManualClock(SystemClock().now())
    data = tmp_path / "data"
    a = await start(Settings(listen="127.0.0.1:0", data_dir=data, database_url=db_url, instance_id="auth-a"), clock)
    b = await start(Settings(listen="127.0.0.1:0", data_dir=data, database_url=db_url, instance_id="auth-b"), clock)
    ca, cb = MeshClient(f"127.0.0.1:{a.port}"), MeshClient(f"127.0.0.1:{b.port}")
    try:
        admin_key = read_key(data / "keys" / "admin.key")
        alice_key = SigningKey.generate()
        await ca.register_identity("admin", admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN, bytes(alice_key.verify_key))
        await ca.register_identity("admin", admin_key, "bot", common_pb2.IDENTITY_KIND_AGENT, bytes(SigningKey.generate().verify_key))
        alice = await ca.open_session("alice", alice_key)
        cb.read_as(alice)
        await ca.execute(alice.sign(alice.command("grp_t", "mission_create", builders.mission_create("alice", "bot", clock.now()))))
        conv = (await ca.group_state("grp_t")).mission.planning_conversation_id

        def post(text: str) -> common_pb2.SignedEnvelope:
            return alice.sign(alice.command("grp_t", "message_post", builders.message(conv, text), membership_epoch=1))

        # While a's ownership lease is live, b refuses and names the owner.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await cb.execute(post("via b"))
        rejection = rejection_from_rpc_error(info.value)
        assert rejection and rejection.reason == R.REJECTION_REASON_NOT_OWNER and rejection.metadata["owner"] == "auth-a"
        assert rejection.metadata["owner_address"] == f"127.0.0.1:{a.port}"  # where a router retries
        # A caught-up follower of a's Group is answered from a's memory while a's lease holds.
        follower_queries: list[int] = []
        store_read = a.authority.store.read

        async def counted_read(group_id: str, after: int = 0, limit: int = 1024) -> list:  # type: ignore[type-arg]
            follower_queries.append(after)
            return await store_read(group_id, after, limit)

        a.authority.store.read = counted_read  # type: ignore[method-assign]
        assert await a.authority.read_online("grp_t", 5, 100) == [] and follower_queries == []
        # a goes quiet past its lease; b takes the Group over with a higher writer epoch.
        clock.advance(seconds=31)
        taken = await cb.execute(post("b owns it now"))
        assert taken.group_revision == 6
        # a's followers (its gateway) still see b's append: past half its lease a no longer trusts
        # its own view of the head and asks the database (MW-16-01: nothing is skipped).
        assert [e.sequence for e in await a.authority.read_online("grp_t", 5, 100)] == [6]
        assert follower_queries == [5]
        # a still caches writer epoch 1: its append is fenced and it cannot take the Group back.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await ca.execute(post("late write from a"))
        rejection = rejection_from_rpc_error(info.value)
        assert rejection and rejection.reason == R.REJECTION_REASON_NOT_OWNER
        seqs = [e.sequence async for e in cb.read_events("grp_t")]
        assert seqs == [1, 2, 3, 4, 5, 6]
        texts = [e.message_posted.content.text async for e in cb.read_events("grp_t") if e.type == "message.posted"]
        assert texts == ["b owns it now"]
    finally:
        await ca.channel.close()
        await cb.channel.close()
        await a.stop(grace=1)
        await b.stop(grace=1)
