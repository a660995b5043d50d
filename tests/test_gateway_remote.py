"""The gateway and the Group Authority in different processes (issue 12): an agent's stream is served by
a gateway-only mesh (``Settings(services=("gateway",), peers={"authority": ...})``) whose Authority
runs in another process (``mwp serve --service authority ...``) on the same database. Everything
the gateway needs from the Authority travels over gRPC (GroupLogService, AuthorityService): the
gateway process never reads the Authority's tables, events are pushed (not polled), commands are
forwarded, CURSOR_TOO_OLD carries a reference signed by the Authority, and an Authority that is
down or silent gives the agent a structured error, never a hang."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import blake3
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

import missionweave_server.services.gateway.authority_calls
from missionweave.kernel.clock import OffsetClock
from missionweave.kernel.signing import read_key, verify_signature
from missionweave.kernel.transport import open_channel
from missionweave.sdk.client import MeshClient, decode_events
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc
from missionweave_server.config import Settings
from missionweave_server.mesh.contracts import INTERNAL_SERVICE_NAMES
from missionweave_server.mesh.server import Mesh, start
from missionweave_server.services.authority.store import EventStore
from tests import builders
from tests.conftest import World, register
from tests.split_mesh import free_port
from tests.test_gateway import Stream, connected, hello
from tests.test_missions import G, create

ROOT = Path(__file__).resolve().parent.parent
E = pb.GatewayErrorCode
R = common_pb2.RejectionReason
# What the gateway used to wait, caught up, before re-reading the log when nothing in its own
# process woke it: a pushed event arrives far sooner.
OLD_IDLE_RECHECK_S = 5.0


class AuthorityProcess:
    """``mwp serve`` with the Authority (and membership, artifacts) only, in its own process."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir, self.port = data_dir, port
        self.target = f"127.0.0.1:{port}"
        self.proc: subprocess.Popen[str] | None = None

    async def start(self) -> None:
        env = {
            **os.environ,
            "MWP_DATA_DIR": str(self.data_dir),
            "PYTHONPATH": str(ROOT),
            "MWP_LOG_LEVEL": "warning",
        }
        services = [arg for s in ("authority", "membership", "artifacts") for arg in ("--service", s)]
        self.proc = subprocess.Popen(  # noqa: ASYNC220 (returns at once; the wait below is async)
            [sys.executable, "-m", "missionweave.cli", "serve", *services, "--listen", self.target],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        deadline = time.monotonic() + 30
        async with open_channel(self.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                assert self.proc.poll() is None, "the Authority process exited"
                try:
                    answer = await health.Check(
                        health_pb2.HealthCheckRequest(service=INTERNAL_SERVICE_NAMES["group_log"]), timeout=1
                    )
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                assert time.monotonic() < deadline, "the Authority process did not become healthy"
                await asyncio.sleep(0.1)

    async def stop(self) -> float:
        """SIGTERM, and the seconds until the process exited."""
        proc, started = self.proc, time.monotonic()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 20)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait, 10)
        return time.monotonic() - started


@dataclass
class Split:
    world: World  # client = the Authority process, target = the gateway-only mesh
    authority: AuthorityProcess
    gateway: Mesh


async def gateway_only(data_dir: Path, authority: str, clock: OffsetClock, membership: str = "") -> Mesh:
    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=data_dir,
        services=("gateway",),
        peers={"authority": authority, "membership": membership or authority},
        grace_seconds=1,
        verify_workers=0,
    )
    return await start(settings, clock)


@pytest.fixture
def no_local_log_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In this (the gateway's) process nothing reads the Authority's tables."""

    def refuse(name: str) -> Any:
        async def read(*_: Any, **__: Any) -> Any:
            raise AssertionError(f"the gateway process called EventStore.{name}")

        return read

    for name in ("read", "read_history", "head", "first_online", "latest_snapshot", "snapshot_by_digest"):
        monkeypatch.setattr(EventStore, name, refuse(name))
    yield


@pytest.fixture
async def split(tmp_path: Path, no_local_log_reads: None) -> AsyncIterator[Split]:
    data = tmp_path / "data"
    authority = AuthorityProcess(data, free_port())
    await authority.start()
    clock = OffsetClock()
    mesh = await gateway_only(data, authority.target, clock)
    client = MeshClient(authority.target)
    try:
        admin_key = read_key(data / "keys" / "admin.key")
        admin = await client.open_session("admin", admin_key)
        owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
        coordinator = await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
        worker = await register(client, admin_key, "worker-bot", common_pb2.IDENTITY_KIND_AGENT)
        world = World(
            mesh,
            client,
            f"127.0.0.1:{mesh.port}",
            admin,
            owner,
            coordinator,
            worker,
            {"admin": admin_key},
            mesh.settings,
            clock,
        )
        yield Split(world, authority, mesh)
    finally:
        await client.channel.close()
        await mesh.stop(grace=1)
        await authority.stop()


async def gateway_stream(s: Split, signer: Any) -> tuple[Stream, grpc.aio.Channel]:
    channel = open_channel(s.world.target)
    return await connected(s.world, signer, channel), channel


async def until_any(stream: Stream, *kinds: str) -> pb.ServerFrame:
    while True:
        frame = await stream.recv()
        if frame.WhichOneof("frame") in kinds:
            return frame


def retry_after_ms(rejection: common_pb2.Rejection) -> int:
    return int(rejection.metadata["retry_after_ms"])


@pytest.mark.req("MW-16-01", "MW-16-10", "MW-8-17")
async def test_a_subscription_is_replayed_and_then_pushed_from_an_authority_in_another_process(
    split: Split,
) -> None:
    s, w = split, split.world
    conv = (await create(w)).mission.planning_conversation_id
    for i in range(3):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"history {i}"), membership_epoch=1)
    head = (await w.client.group_state(G)).head_sequence
    stream, channel = await gateway_stream(s, w.owner)
    try:
        await stream.send(subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G, initial_credits=100))
        assert (await stream.until("flow")).flow.reason == pb.FLOW_REASON_SUBSCRIBED
        replay = (await stream.until("event")).event
        assert (replay.first_sequence, replay.last_sequence, len(replay.events)) == (1, head, head)
        _, public_key = await w.client.authority_key()
        assert all(verify_signature(e, public_key) for e in replay.events)
        # Caught up: each new event is pushed by the Authority's process as soon as it is durable.
        latencies = []
        for i in range(5):
            sent = time.perf_counter()
            await w.run(w.owner, G, "message_post", builders.message(conv, f"live {i}"), membership_epoch=1)
            async with asyncio.timeout(OLD_IDLE_RECHECK_S):
                live = (await stream.until("event")).event
            latencies.append(time.perf_counter() - sent)
            assert [e.message_posted.content.text for e in decode_events(live.events)] == [f"live {i}"]
            await asyncio.sleep(0.2)  # idle at the head between appends
        assert max(latencies) < 1.0, latencies  # the old idle re-check would have taken up to 5 s
        # COMMAND through the gateway reaches the other process; so do its rejections.
        command = w.owner.command(
            G, "message_post", builders.message(conv, "via the gateway"), membership_epoch=1
        )
        await stream.send(
            command=pb.CommandFrame(command_id=command.command_id, command=w.owner.sign(command))
        )
        answers: dict[str, pb.ServerFrame] = {}
        while len(answers) < 2:  # its RESULT, and its event pushed on the subscription (either first)
            frame = await until_any(stream, "result", "event")
            answers[frame.WhichOneof("frame")] = frame
        result = answers["result"].result
        assert result.command_id == command.command_id and result.result.group_revision == head + 6
        assert answers["event"].event.last_sequence == head + 6
        assert (await w.client.group_state(G)).head_sequence == head + 6
        stale = w.owner.command(G, "message_post", builders.message(conv, "x"), membership_epoch=7)
        await stream.send(command=pb.CommandFrame(command_id=stale.command_id, command=w.owner.sign(stale)))
        refused = (await stream.until("result")).result
        assert refused.rejection.reason == R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE
        # A non-member is refused by the Authority (structured), as in one process.
        other, other_channel = await gateway_stream(s, w.worker)
        await other.send(subscribe=pb.SubscribeFrame(subscription_id="x", group_id=G))
        assert (await other.until("error")).error.code == E.GATEWAY_ERROR_CODE_NOT_A_MEMBER
        await other_channel.close()
    finally:
        stream.call.cancel()
        await channel.close()


@pytest.mark.req("MW-16-11", "MW-16-12", "MW-7.4-01")
async def test_cursor_too_old_across_processes_carries_a_reference_signed_by_the_authority(
    split: Split,
) -> None:
    s, w = split, split.world
    conv = (await create(w)).mission.planning_conversation_id
    for i in range(3):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"before {i}"), membership_epoch=1)
    taken = await w.client.authority.TakeSnapshot(apb.TakeSnapshotRequest(group_id=G, compact=True))
    await w.run(w.owner, G, "message_post", builders.message(conv, "after"), membership_epoch=1)
    stream, channel = await gateway_stream(s, w.owner)
    try:
        await stream.send(
            subscribe=pb.SubscribeFrame(
                subscription_id="old", group_id=G, after_sequence=2, initial_credits=100
            )
        )
        too_old = (await stream.until("cursor_too_old")).cursor_too_old
        assert (too_old.requested_after_sequence, too_old.snapshot_sequence) == (2, taken.sequence)
        key_id, public_key = await w.client.authority_key()
        assert too_old.signed_reference.signatures[0].key_id == key_id
        assert verify_signature(too_old.signed_reference, public_key)
        reference = pb.SnapshotReference.FromString(too_old.signed_reference.payload)
        get_snapshot = pb_grpc.GatewayServiceStub(channel).GetSnapshot
        fetched = await get_snapshot(
            pb.GetSnapshotRequest(group_id=G, digest=reference.digest, proof=hello(w, w.owner).proof)
        )
        assert blake3.blake3(fetched.snapshot.payload).hexdigest() == reference.digest.hex
        assert verify_signature(fetched.snapshot, public_key) and verify_signature(
            fetched.signed_reference, public_key
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await get_snapshot(
                pb.GetSnapshotRequest(group_id=G, digest=reference.digest, proof=hello(w, w.worker).proof)
            )
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        await stream.send(
            subscribe=pb.SubscribeFrame(
                subscription_id="new", group_id=G, after_sequence=taken.sequence, initial_credits=100
            )
        )
        resumed = (await stream.until("event")).event
        assert resumed.first_sequence == taken.sequence + 1 and b"after" in resumed.events[0].payload
    finally:
        stream.call.cancel()
        await channel.close()


@pytest.mark.req("MW-16-01", "MW-16-05")
async def test_an_authority_that_goes_down_gives_structured_errors_in_bounded_time_and_comes_back(
    split: Split,
) -> None:
    s, w = split, split.world
    conv = (await create(w)).mission.planning_conversation_id
    stream, channel = await gateway_stream(s, w.owner)
    try:
        await stream.send(subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G, initial_credits=100))
        delivered = (await stream.until("event")).event.last_sequence
        # The Authority process goes away: it ends its follow streams at once (UNAVAILABLE) rather than
        # holding its grace period (10 s) for streams that never end on their own.
        stopping = asyncio.ensure_future(s.authority.stop())
        async with asyncio.timeout(5):
            lost = (await stream.until("error")).error
        assert await stopping < 8
        assert (lost.code, lost.subscription_id, lost.fatal) == (
            E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
            "s",
            False,
        )
        assert retry_after_ms(lost.rejection) > 0
        # While it is down: SUBSCRIBE (the id is free again), COMMAND and GetSnapshot are answered
        # at once with AUTHORITY_UNAVAILABLE / UNAVAILABLE and retry information.
        started = time.monotonic()
        await stream.send(
            subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G, after_sequence=delivered)
        )
        async with asyncio.timeout(15):
            refused = (await stream.until("error")).error
        assert refused.code == E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE and refused.subscription_id == "s"
        command = w.owner.command(G, "message_post", builders.message(conv, "while down"), membership_epoch=1)
        await stream.send(
            command=pb.CommandFrame(command_id=command.command_id, command=w.owner.sign(command))
        )
        async with asyncio.timeout(25):
            unanswered = (await stream.until("error")).error
        assert (
            unanswered.code == E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE
            and unanswered.command_id == command.command_id
        )
        assert retry_after_ms(unanswered.rejection) > 0
        with pytest.raises(grpc.aio.AioRpcError) as down:
            digest = common_pb2.Digest(algorithm="blake3", hex="00" * 32)
            await pb_grpc.GatewayServiceStub(channel).GetSnapshot(
                pb.GetSnapshotRequest(group_id=G, digest=digest, proof=hello(w, w.owner).proof), timeout=25
            )
        assert down.value.code() == grpc.StatusCode.UNAVAILABLE
        status = rpc_status.from_call(down.value)  # type: ignore[arg-type]
        assert status is not None and any(
            d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details
        )
        assert time.monotonic() - started < 30
        # The Authority comes back on the same address: subscribing again resumes from the cursor.
        await s.authority.start()
        await w.client.execute(
            w.signed(w.owner, G, "message_post", builders.message(conv, "back"), membership_epoch=1)
        )
        deadline = time.monotonic() + 30
        while True:
            await stream.send(
                subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G, after_sequence=delivered)
            )
            frame = await until_any(stream, "event", "error")
            if frame.WhichOneof("frame") == "event":
                break
            assert (
                frame.error.code == E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE and time.monotonic() < deadline
            )
            await asyncio.sleep(retry_after_ms(frame.error.rejection) / 1000)
        assert frame.event.first_sequence == delivered + 1
        assert decode_events(frame.event.events)[-1].message_posted.content.text == "back"
    finally:
        stream.call.cancel()
        await channel.close()


async def test_a_silent_authority_is_answered_with_authority_unavailable_not_a_hang(
    split: Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that accepts connections and never answers: the gateway's own bounds end the wait."""
    monkeypatch.setattr(missionweave_server.services.gateway.authority_calls, "PEER_TIMEOUT_S", 0.5)
    monkeypatch.setattr(missionweave_server.services.gateway.authority_calls, "COMMAND_TIMEOUT_S", 0.5)
    w = split.world
    await create(w)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes TCP handshakes; nobody ever speaks HTTP/2
    mesh = await gateway_only(
        w.settings.data_dir,
        f"127.0.0.1:{silent.getsockname()[1]}",
        w.clock,
        membership=split.authority.target,
    )
    channel = open_channel(f"127.0.0.1:{mesh.port}")
    try:
        stream = await connected(
            replace(w, target=f"127.0.0.1:{mesh.port}"), w.owner, channel
        )  # its audience
        started = time.monotonic()
        await stream.send(subscribe=pb.SubscribeFrame(subscription_id="s", group_id=G))
        async with asyncio.timeout(5):
            error = (await stream.until("error")).error
        assert error.code == E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE
        command = w.owner.command(G, "message_post", builders.message("x", "y"), membership_epoch=1)
        await stream.send(
            command=pb.CommandFrame(command_id=command.command_id, command=w.owner.sign(command))
        )
        async with asyncio.timeout(5):
            error = (await stream.until("error")).error
        assert (
            error.code == E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE
            and error.command_id == command.command_id
        )
        assert time.monotonic() - started < 5
        stream.call.cancel()
    finally:
        await channel.close()
        await mesh.stop(grace=1)
        silent.close()
