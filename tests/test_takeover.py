"""Two authority instances on one database: a takeover fences the old writer (ARCHITECTURE scale-out)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from missionweave.internal.v1 import group_log_pb2 as glpb
from missionweave.internal.v1 import group_log_pb2_grpc as glpb_grpc
from missionweave.kernel.clock import ManualClock, SystemClock, to_timestamp
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import HELLO_PROOF_TYPE, read_key, session_key_id, sign_envelope
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as gpb
from missionweave.v1 import gateway_service_pb2_grpc as gpb_grpc
from missionweave_server.config import Settings
from missionweave_server.edge.callers import MeshServiceChannel
from missionweave_server.mesh.server import start
from missionweave_server.services.authority import group_log
from tests import builders

R = common_pb2.RejectionReason


async def test_takeover_fences_the_old_instance_and_never_interleaves(db_url: str, tmp_path: Path) -> None:
    clock = ManualClock(SystemClock().now())
    data = tmp_path / "data"
    a = await start(
        Settings(listen="127.0.0.1:0", data_dir=data, database_url=db_url, instance_id="auth-a"), clock
    )
    b = await start(
        Settings(listen="127.0.0.1:0", data_dir=data, database_url=db_url, instance_id="auth-b"), clock
    )
    ca, cb = MeshClient(f"127.0.0.1:{a.port}"), MeshClient(f"127.0.0.1:{b.port}")
    try:
        admin_key = read_key(data / "keys" / "admin.key")
        alice_key = SigningKey.generate()
        await ca.register_identity(
            "admin", admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN, bytes(alice_key.verify_key)
        )
        await ca.register_identity(
            "admin", admin_key, "bot", common_pb2.IDENTITY_KIND_AGENT, bytes(SigningKey.generate().verify_key)
        )
        alice = await ca.open_session("alice", alice_key)
        cb.read_as(alice)
        await ca.execute(
            alice.sign(
                alice.command("grp_t", "mission_create", builders.mission_create("alice", "bot", clock.now()))
            )
        )
        conv = (await ca.group_state("grp_t")).mission.planning_conversation_id

        def post(text: str) -> common_pb2.SignedEnvelope:
            return alice.sign(
                alice.command("grp_t", "message_post", builders.message(conv, text), membership_epoch=1)
            )

        # While a's ownership lease is live, b refuses and names the owner.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await cb.execute(post("via b"))
        rejection = rejection_from_rpc_error(info.value)
        assert (
            rejection
            and rejection.reason == R.REJECTION_REASON_NOT_OWNER
            and rejection.metadata["owner"] == "auth-a"
        )
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
        texts = [
            e.message_posted.content.text async for e in cb.read_events("grp_t") if e.type == "message.posted"
        ]
        assert texts == ["b owns it now"]
    finally:
        await ca.channel.close()
        await cb.channel.close()
        await a.stop(grace=1)
        await b.stop(grace=1)


async def test_a_follow_stream_at_an_instance_that_lost_its_group_moves_to_the_new_owner(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FollowGroup stream at an instance that no longer writes its Group sees the new owner's appends
    only when it re-reads the log (IDLE_RECHECK_S). Having served them, it ends with NOT_OWNER naming
    the owner, so the gateway follows the Group there, where appends are pushed; the gateway does so
    from its delivered sequence without the agent noticing (no ERROR, no resubscription)."""
    monkeypatch.setattr(group_log, "IDLE_RECHECK_S", 0.3)  # a re-read soon, so the test is quick
    clock = ManualClock(SystemClock().now())
    data = tmp_path / "data"
    a = await start(
        Settings(listen="127.0.0.1:0", data_dir=data, database_url=db_url, instance_id="auth-a"), clock
    )
    b = await start(
        Settings(listen="127.0.0.1:0", data_dir=data, database_url=db_url, instance_id="auth-b"), clock
    )
    ca, cb = MeshClient(f"127.0.0.1:{a.port}"), MeshClient(f"127.0.0.1:{b.port}")
    follow = None
    connect = None
    try:
        admin_key = read_key(data / "keys" / "admin.key")
        alice_key = SigningKey.generate()
        await ca.register_identity(
            "admin", admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN, bytes(alice_key.verify_key)
        )
        await ca.register_identity(
            "admin", admin_key, "bot", common_pb2.IDENTITY_KIND_AGENT, bytes(SigningKey.generate().verify_key)
        )
        alice = await ca.open_session("alice", alice_key)
        await ca.execute(
            alice.sign(
                alice.command("grp_f", "mission_create", builders.mission_create("alice", "bot", clock.now()))
            )
        )
        conv = (await ca.group_state("grp_f")).mission.planning_conversation_id

        def post(text: str) -> common_pb2.SignedEnvelope:
            return alice.sign(
                alice.command("grp_f", "message_post", builders.message(conv, text), membership_epoch=1)
            )

        # At the owner: the stream is woken by the owner's own appends and goes on through idle re-reads.
        as_mesh = MeshServiceChannel(
            ca.channel, (data / "keys" / "mesh.token").read_bytes().strip()
        )  # internal contract
        follow = glpb_grpc.GroupLogServiceStub(as_mesh).FollowGroup(
            glpb.FollowGroupRequest(group_id="grp_f", member_id="alice")
        )
        assert (await follow.read()).started.head_sequence == 5
        assert [e.sequence for e in (await follow.read()).batch.entries] == [1, 2, 3, 4, 5]
        await asyncio.sleep(1.0)  # several idle re-reads
        await ca.execute(post("from a"))
        async with asyncio.timeout(10):
            assert [e.sequence for e in (await follow.read()).batch.entries] == [6]
        # The same member through a's gateway, caught up at 6.
        connect = gpb_grpc.GatewayServiceStub(ca.channel).Connect()
        await connect.write(
            gpb.ConnectRequest(frame=gpb.ClientFrame(hello=hello_frame(alice, clock, f"127.0.0.1:{a.port}")))
        )
        assert (await connect.read()).frame.WhichOneof("frame") == "welcome"
        subscribe = gpb.SubscribeFrame(subscription_id="s", group_id="grp_f", initial_credits=100)
        await connect.write(gpb.ConnectRequest(frame=gpb.ClientFrame(subscribe=subscribe)))
        frames = await frames_until(connect, 6)
        assert [f.WhichOneof("frame") for f in frames] == ["flow", "event"]

        # a goes quiet past its lease and b takes the Group over.
        clock.advance(seconds=31)
        assert (await cb.execute(post("b owns it now"))).group_revision == 7
        async with asyncio.timeout(10):
            assert [e.sequence for e in (await follow.read()).batch.entries] == [7]  # served first (MW-16-01)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await follow.read()
        rejection = rejection_from_rpc_error(info.value)
        assert rejection is not None and rejection.reason == R.REJECTION_REASON_NOT_OWNER, info.value
        assert (rejection.metadata["owner"], rejection.metadata["owner_address"]) == (
            "auth-b",
            f"127.0.0.1:{b.port}",
        )
        # The gateway followed the Group again from 7 (here at a, its only Authority address): the
        # agent gets 7 and then 8 on the same subscription, with no ERROR frame in between.
        assert (await cb.execute(post("and writes on"))).group_revision == 8
        frames = await frames_until(connect, 8)
        assert [f.WhichOneof("frame") for f in frames] == ["event"] * len(frames), frames
        assert [(f.event.first_sequence, f.event.last_sequence) for f in frames] in (
            [(7, 7), (8, 8)],
            [(7, 8)],
        )
    finally:
        for call in (follow, connect):
            if call is not None:
                call.cancel()
        await ca.channel.close()
        await cb.channel.close()
        await a.stop(grace=1)
        await b.stop(grace=1)


def hello_frame(signer: SessionSigner, clock: ManualClock, audience: str) -> gpb.HelloFrame:
    proof = gpb.HelloProof(
        agent_id=signer.identity_id,
        session_epoch=signer.session_epoch,
        issued_at=to_timestamp(clock.now()),
        nonce=os.urandom(16),
        audience=audience,
    )
    envelope = sign_envelope(
        proof.SerializeToString(),
        HELLO_PROOF_TYPE,
        signer.key,
        session_key_id(signer.identity_id, signer.session_epoch),
    )
    return gpb.HelloFrame(agent_id=signer.identity_id, session_epoch=signer.session_epoch, proof=envelope)


async def frames_until(connect: Any, sequence: int) -> list[gpb.ServerFrame]:
    """The frames a Connect stream answers until an EVENT reaching ``sequence`` or an ERROR (bounded)."""
    frames: list[gpb.ServerFrame] = []
    async with asyncio.timeout(10):
        while True:
            frames.append((await connect.read()).frame)
            last = frames[-1]
            if last.WhichOneof("frame") == "error" or (
                last.WhichOneof("frame") == "event" and last.event.last_sequence >= sequence
            ):
                return frames
