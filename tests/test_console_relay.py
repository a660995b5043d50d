"""The web console's HTTP side through its public surface (missionweave_server/console, docs/console.md):
a live mesh serving its console on 127.0.0.1:0, called with aiohttp's client as a browser would.

What the console itself decides: the Host it answers to (421 otherwise, against DNS rebinding), the
X-MWP-Console header (403), the method allowlist (404, the mesh never called), the body cap (413),
a call proof that is not base64 (400), the security headers on every answer, and the relay's own
robustness (a unary call bounded by UNARY_TIMEOUT_S, a stalled reader dropped after
STREAM_WRITE_TIMEOUT_S, a browser that leaves ending the mesh stream, no call proof ever logged).
What the mesh decides, unchanged through the relay: call proofs (missing, replayed, for another
audience or method), signed commands (a forged signature appends nothing), who reads which Group.
Then `mwp serve`: the console's port taken, --no-console, TLS, the split topology.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import logging
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf.message import Message

from missionweave.kernel.logs import JsonFormatter
from missionweave.kernel.signing import read_key
from missionweave.kernel.transport import ClientTLS
from missionweave.sdk.client import MeshClient, SessionSigner, decode_events, register_identity_envelope
from missionweave.sdk.credentials import call_proof
from missionweave.v1 import (
    authority_service_pb2 as apb,
)
from missionweave.v1 import (
    common_pb2,
    membership_pb2,
    membership_service_pb2,
)
from missionweave_server.config import Settings
from missionweave_server.console import site
from missionweave_server.console.relay import Relay
from missionweave_server.console.site import CONSOLE_HEADER, SECURITY_HEADERS
from missionweave_server.mesh import certs
from missionweave_server.observability import metrics
from tests import builders
from tests.conftest import World, polled, register
from tests.serve_process import logged, read_until, refuses, serve, serve_env, stop, wait_group_gone
from tests.split_mesh import free_port
from tests.test_missions import G, as_member, create

R = common_pb2.RejectionReason
FOUR_MIB = 4 * 1024 * 1024  # the largest request body the console takes, as the mesh its messages
ROOT = Path(__file__).resolve().parent.parent

GET_GROUP_STATE = "/missionweave.v1.AuthorityService/GetGroupState"
READ_EVENTS = "/missionweave.v1.AuthorityService/ReadEvents"
EXECUTE = "/missionweave.v1.AuthorityService/ExecuteCommand"
LIST_MISSIONS = "/missionweave.v1.AuthorityService/ListMissions"
GET_IDENTITY = "/missionweave.v1.MembershipService/GetIdentity"
REGISTER = "/missionweave.v1.MembershipService/RegisterIdentity"


@pytest.fixture
def world_settings() -> dict[str, Any]:
    return {"console_listen": "127.0.0.1:0"}  # the `world` mesh serves its console (conftest.py)


# ------------------------------------------------------------------ the browser's side


@dataclass
class Console:
    """A browser's view of one console: its address and the audience its page signs proofs for."""

    http: aiohttp.ClientSession
    base: str
    audience: str

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    def proof(self, signer: SessionSigner, method: str, audience: str | None = None) -> str:
        """What the page puts in X-MWP-Call-Proof: the SDK's call proof, base64."""
        return base64.b64encode(call_proof(signer, method, audience or self.audience)).decode()

    async def post(
        self,
        method: str,
        body: bytes | Message = b"",
        *,
        proof: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        sent = {CONSOLE_HEADER: "1", **({"X-MWP-Call-Proof": proof} if proof is not None else {})}
        data = body.SerializeToString() if isinstance(body, Message) else body
        return await self.http.post(
            f"{self.base}/rpc{method}", data=data, headers={**sent, **(headers or {})}
        )

    async def read(self, signer: SessionSigner, method: str, request: Message) -> tuple[int, bytes]:
        """A unary call with a fresh proof: the status and the body."""
        async with await self.post(method, request, proof=self.proof(signer, method)) as answer:
            return answer.status, await answer.read()


async def open_console(http: aiohttp.ClientSession, url: str) -> Console:
    base = url.rstrip("/")
    async with http.get(f"{base}/api/config") as answer:
        assert answer.status == 200
        audience = (await answer.json())["audience"]
    return Console(http, base, audience)


@pytest.fixture
async def console(world: World) -> AsyncIterator[Console]:
    mesh: Any = world.mesh
    assert mesh.console is not None
    async with aiohttp.ClientSession() as http:
        yield await open_console(http, mesh.console.url)


@pytest.fixture
def relayed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every method the relay passes to the mesh, in order."""
    seen: list[str] = []
    unary, stream = Relay.unary, Relay.stream

    async def spy_unary(self: Relay, method: str, *args: Any) -> bytes:
        seen.append(method)
        return await unary(self, method, *args)

    def spy_stream(self: Relay, method: str, *args: Any) -> Any:
        seen.append(method)
        return stream(self, method, *args)

    monkeypatch.setattr(Relay, "unary", spy_unary)
    monkeypatch.setattr(Relay, "stream", spy_stream)
    return seen


def rpcs(method: str, code: str | None = None) -> float:
    """mwp_rpcs_total for ``method`` (and ``code``): the calls this process's mesh answered."""
    total = 0.0
    for metric in metrics.RPCS.collect():
        for sample in metric.samples:
            if (
                sample.name == "mwp_rpcs_total"
                and sample.labels["method"] == method
                and code in (None, sample.labels["code"])
            ):
                total += sample.value
    return total


def refusal(body: bytes) -> tuple[str, common_pb2.Rejection]:
    """A JSON refusal's gRPC code and its Rejection."""
    document = json.loads(body)
    rejection = common_pb2.Rejection.FromString(base64.b64decode(document.get("rejection", "")))
    return document["code"], rejection


async def frames(answer: aiohttp.ClientResponse) -> AsyncIterator[tuple[int, bytes]]:
    """A streamed answer's frames, (flag, payload), until the body ends."""
    while True:
        try:
            head = await answer.content.readexactly(5)
        except asyncio.IncompleteReadError as ended:
            assert ended.partial == b"", "a frame cut short"
            return
        flag, length = struct.unpack(">BI", head)
        yield flag, await answer.content.readexactly(length)


def assert_secured(answer: aiohttp.ClientResponse) -> None:
    got = {name: answer.headers.get(name) for name in SECURITY_HEADERS}
    assert got == SECURITY_HEADERS, f"{answer.method} {answer.url.path} -> {answer.status}"


async def mission_with_conversation(w: World) -> str:
    """Group G, alice's Mission; its planning Conversation's id."""
    return (await create(w)).mission.planning_conversation_id


# ------------------------------------------------------------------ what the console decides


async def test_every_answer_carries_the_security_headers(world: World, console: Console) -> None:
    await create(world)
    owner = world.owner
    over_cap = b"\0" * (FOUR_MIB + 1)
    answers = [
        await console.http.get(f"{console.base}/"),
        await console.http.get(f"{console.base}/static/app.js"),
        await console.http.get(f"{console.base}/api/config"),
        await console.http.get(f"{console.base}/static/none.js"),  # aiohttp's own 404
        await console.http.get(f"{console.base}/rpc{GET_GROUP_STATE}"),  # aiohttp's own 405
        await console.http.get(f"{console.base}/", headers={"Host": "evil.example"}),  # 421
        await console.post(GET_GROUP_STATE, headers={CONSOLE_HEADER: "0"}),  # 403
        await console.post("/missionweave.v1.MadeUpService/Nothing"),  # 404
        await console.post(GET_GROUP_STATE, proof="%%"),  # 400
        await console.post(GET_GROUP_STATE, over_cap),  # aiohttp's own 413
        await console.post(GET_GROUP_STATE, apb.GetGroupStateRequest(group_id=G)),  # 401
        await console.post(
            GET_GROUP_STATE,
            apb.GetGroupStateRequest(group_id=G),
            proof=console.proof(owner, GET_GROUP_STATE),
        ),  # 200
        await console.post(
            READ_EVENTS,
            apb.ReadEventsRequest(group_id=G),
            proof=console.proof(owner, READ_EVENTS),
        ),  # 200, streamed
    ]
    statuses = []
    for answer in answers:
        await answer.read()
        assert_secured(answer)
        statuses.append(answer.status)
    assert statuses == [200, 200, 200, 404, 405, 421, 403, 404, 400, 413, 401, 200, 200]


async def test_a_foreign_host_is_refused_421_and_never_reaches_the_relay(
    world: World, console: Console, relayed: list[str]
) -> None:
    await create(world)
    port = console.port
    before = rpcs(GET_GROUP_STATE)
    # What a page on another origin sends once its name resolves to this machine (DNS rebinding).
    for host in (
        "evil.example",
        f"evil.example:{port}",
        f"127.0.0.1.nip.io:{port}",
        f"localhost.evil.example:{port}",
        f"localhost.:{port}",
        f"127.0.0.1:{port + 1}",
        "127.0.0.1",
        f"0.0.0.0:{port}",
    ):
        for answer in (
            await console.http.get(f"{console.base}/", headers={"Host": host}),
            await console.http.get(f"{console.base}/api/config", headers={"Host": host}),
            await console.post(
                GET_GROUP_STATE,
                apb.GetGroupStateRequest(group_id=G),
                proof=console.proof(world.owner, GET_GROUP_STATE),
                headers={"Host": host},
            ),
        ):
            assert answer.status == 421, (host, answer.url.path, answer.status)
            assert "does not answer to host" in (await answer.json())["message"]
    assert relayed == [] and rpcs(GET_GROUP_STATE) == before
    # Its own address answers, spelt any loopback way.
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        async with console.http.get(f"{console.base}/api/config", headers={"Host": host}) as answer:
            assert answer.status == 200, host


async def test_the_console_header_is_required(world: World, console: Console, relayed: list[str]) -> None:
    await create(world)
    for headers in ({CONSOLE_HEADER: "0"}, {CONSOLE_HEADER: ""}, {CONSOLE_HEADER: "true"}):
        answer = await console.post(
            GET_GROUP_STATE,
            apb.GetGroupStateRequest(group_id=G),
            proof=console.proof(world.owner, GET_GROUP_STATE),
            headers=headers,
        )
        assert answer.status == 403
        assert (await answer.json())["code"] == "PERMISSION_DENIED"
    # Without the header at all (what a cross-site form or a simple fetch sends).
    async with console.http.post(
        f"{console.base}/rpc{GET_GROUP_STATE}",
        data=apb.GetGroupStateRequest(group_id=G).SerializeToString(),
        headers={"X-MWP-Call-Proof": console.proof(world.owner, GET_GROUP_STATE)},
    ) as answer:
        assert answer.status == 403
    assert relayed == []


async def test_a_method_outside_the_allowlist_is_404_and_the_mesh_is_never_called(
    world: World, console: Console, relayed: list[str]
) -> None:
    admin = world.admin
    # A request the mesh would carry out if it got it: the administrator registering an identity.
    identity = membership_pb2.Identity(
        identity_id="mallory",
        kind=common_pb2.IDENTITY_KIND_HUMAN,
        public_key=bytes(32),
        display_name="mallory",
    )
    register_request = membership_service_pb2.RegisterIdentityRequest(
        command=register_identity_envelope("admin", world.keys["admin"], identity)
    )
    before = {
        m: rpcs(m) for m in (REGISTER, "/missionweave.internal.v1.IdentityDirectoryService/GetIdentities")
    }
    for method, body in (
        (REGISTER, register_request.SerializeToString()),
        ("/missionweave.internal.v1.IdentityDirectoryService/GetIdentities", b""),
        ("/missionweave.internal.v1.GroupLogService/FollowGroup", b""),
        ("/missionweave.v1.AuthorityService/ExecuteCommandBatch", b""),
        ("/missionweave.v1.GatewayService/Connect", b""),
        ("/missionweave.v1.MadeUpService/DoAnything", b""),
        ("/missionweave.v1.authorityservice/GetGroupState", b""),  # the allowlist is exact
        ("/grpc.health.v1.Health/Check", b""),
    ):
        answer = await console.post(method, body, proof=console.proof(admin, method))
        assert answer.status == 404, method
        assert await answer.json() == {
            "code": "UNIMPLEMENTED",
            "message": f"the console does not relay {method}",
        }
    # Paths that are no relay route at all.
    for path in (
        f"/rpc{GET_GROUP_STATE}/more",
        "/rpc/missionweave.v1.AuthorityService%2FGetGroupState",
        "/rpc/GetGroupState",
    ):
        async with console.http.post(f"{console.base}{path}", headers={CONSOLE_HEADER: "1"}) as answer:
            assert answer.status == 404, path
    assert relayed == []
    assert {m: rpcs(m) for m in before} == before
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await world.client.identity("mallory")
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_body_over_4_mib_is_413_and_a_proof_not_base64_is_400(
    world: World, console: Console, relayed: list[str]
) -> None:
    await create(world)
    proof = console.proof(world.owner, GET_GROUP_STATE)
    answer = await console.post(GET_GROUP_STATE, b"\0" * (FOUR_MIB + 1), proof=proof)
    assert answer.status == 413
    for bad in ("not base64!", proof[:-1], proof + "*", "%%%%"):
        answer = await console.post(GET_GROUP_STATE, apb.GetGroupStateRequest(group_id=G), proof=bad)
        assert answer.status == 400, bad
        assert await answer.json() == {
            "code": "INVALID_ARGUMENT",
            "message": "X-MWP-Call-Proof is not base64",
        }
    assert relayed == []
    # The same proof, well formed, is still unused: the refusals above never reached the mesh.
    answer = await console.post(GET_GROUP_STATE, apb.GetGroupStateRequest(group_id=G), proof=proof)
    assert answer.status == 200


# ------------------------------------------------------------------ what the mesh decides, relayed


async def test_a_read_without_a_call_proof_is_401_unauthenticated(world: World, console: Console) -> None:
    await create(world)
    answer = await console.post(GET_GROUP_STATE, apb.GetGroupStateRequest(group_id=G))
    assert answer.status == 401
    code, rejection = refusal(await answer.read())
    assert code == "UNAUTHENTICATED"
    assert R.Name(rejection.reason) == "REJECTION_REASON_UNAUTHENTICATED"
    assert "needs a call proof" in rejection.message


async def test_a_read_with_a_proof_answers_the_response_and_the_proof_is_used_once(
    world: World, console: Console
) -> None:
    await create(world)
    proof = console.proof(world.owner, GET_GROUP_STATE)
    answer = await console.post(GET_GROUP_STATE, apb.GetGroupStateRequest(group_id=G), proof=proof)
    assert answer.status == 200 and answer.content_type == "application/x-protobuf"
    state = apb.GetGroupStateResponse.FromString(await answer.read()).state
    async with MeshClient(world.target, reader=world.owner) as client:
        assert state == await client.group_state(G)  # what the SDK reads as alice
    assert state.head_sequence >= 1 and state.mission.definition.owner_id == "alice"
    # The very same bytes again: a replay.
    again = await console.post(GET_GROUP_STATE, apb.GetGroupStateRequest(group_id=G), proof=proof)
    assert again.status == 401
    code, rejection = refusal(await again.read())
    assert code == "UNAUTHENTICATED" and R.Name(rejection.reason) == "REJECTION_REASON_UNAUTHENTICATED"
    assert "nonce was already used" in rejection.message


async def test_a_proof_for_another_audience_or_method_is_refused(world: World, console: Console) -> None:
    await create(world)
    request = apb.GetGroupStateRequest(group_id=G)
    cases = {
        # The console's own address is not the mesh's: the page signs for /api/config's audience.
        console.proof(world.owner, GET_GROUP_STATE, f"127.0.0.1:{console.port}"): "audience",
        console.proof(world.owner, GET_GROUP_STATE, "mesh.elsewhere.example:50051"): "audience",
        console.proof(world.owner, "/missionweave.v1.AuthorityService/GetMissionProgress"): "is for",
        console.proof(world.owner, READ_EVENTS): "is for",
    }
    for proof, names in cases.items():
        answer = await console.post(GET_GROUP_STATE, request, proof=proof)
        assert answer.status == 401
        code, rejection = refusal(await answer.read())
        assert code == "UNAUTHENTICATED" and R.Name(rejection.reason) == "REJECTION_REASON_UNAUTHENTICATED"
        assert names in rejection.message, rejection.message


async def test_a_forged_command_is_refused_naming_the_reason_and_appends_nothing(
    world: World, console: Console
) -> None:
    conversation = await mission_with_conversation(world)
    head = (await world.client.group_state(G)).head_sequence
    signed = world.signed(
        world.owner, G, "message_post", builders.message(conversation, "hi"), membership_epoch=1
    )
    forged = common_pb2.SignedEnvelope()
    forged.CopyFrom(signed)
    forged.signatures[0].sig = bytes([signed.signatures[0].sig[0] ^ 1]) + signed.signatures[0].sig[1:]
    answer = await console.post(EXECUTE, apb.ExecuteCommandRequest(command=forged))
    assert answer.status == 401
    code, rejection = refusal(await answer.read())
    assert code == "UNAUTHENTICATED"
    assert R.Name(rejection.reason) == "REJECTION_REASON_SIGNATURE_INVALID", rejection.message
    assert (await world.client.group_state(G)).head_sequence == head
    # The genuine command, through the same relay, is appended.
    answer = await console.post(EXECUTE, apb.ExecuteCommandRequest(command=signed))
    assert answer.status == 200
    result = apb.ExecuteCommandResponse.FromString(await answer.read()).result
    assert [e.message_posted.content.text for e in decode_events(result.events)] == ["hi"]
    assert (await world.client.group_state(G)).head_sequence == head + 1


async def test_a_member_reading_a_group_it_is_not_in_gets_nothing(world: World, console: Console) -> None:
    await create(world)  # G: alice's, the worker is no member
    await create(world, "grp_theirs")
    await as_member(world, "grp_theirs", world.worker)
    worker = world.worker
    status, body = await console.read(
        worker, GET_GROUP_STATE, apb.GetGroupStateRequest(group_id="grp_theirs")
    )
    assert status == 200 and apb.GetGroupStateResponse.FromString(body).state.group_id == "grp_theirs"
    # G exists; the worker learns no more of it than of a Group that does not.
    outcomes = []
    for group in (G, "grp_nowhere"):
        status, body = await console.read(worker, GET_GROUP_STATE, apb.GetGroupStateRequest(group_id=group))
        code, rejection = refusal(body)
        outcomes.append((status, code, R.Name(rejection.reason)))
        assert "mission" not in json.loads(body) and "state" not in json.loads(body)
    assert outcomes == [(403, "PERMISSION_DENIED", "REJECTION_REASON_NOT_A_MEMBER")] * 2
    # Its events: not one message frame, a refusing trailer.
    async with await console.post(
        READ_EVENTS, apb.ReadEventsRequest(group_id=G), proof=console.proof(worker, READ_EVENTS)
    ) as answer:
        assert answer.status == 200
        got = [f async for f in frames(answer)]
    assert [flag for flag, _ in got] == [1]
    assert json.loads(got[0][1])["code"] == "PERMISSION_DENIED"
    # The Mission list names the Group it is in, not G.
    status, body = await console.read(worker, LIST_MISSIONS, apb.ListMissionsRequest())
    assert status == 200
    assert [m.group_id for m in apb.ListMissionsResponse.FromString(body).missions] == ["grp_theirs"]


async def test_read_events_follow_streams_frames_in_order_then_a_trailer(
    world: World, console: Console
) -> None:
    conversation = await mission_with_conversation(world)
    head = (await world.client.group_state(G)).head_sequence
    request = apb.ReadEventsRequest(group_id=G, after_sequence=head, follow=True, limit=3, batch_size=1)
    async with await console.post(
        READ_EVENTS, request, proof=console.proof(world.owner, READ_EVENTS)
    ) as answer:
        assert answer.status == 200 and answer.content_type == "application/x-mwp-frames"
        stream = frames(answer)
        got: list[tuple[int, bytes]] = []
        for text in ("one", "two", "three"):  # each appended while the stream follows
            await world.run(
                world.owner, G, "message_post", builders.message(conversation, text), membership_epoch=1
            )
            got.append(await asyncio.wait_for(anext(stream), 20))
        got += [f async for f in stream]  # the follow ends at `limit`: the trailer, then the end
    flags = [flag for flag, _ in got]
    assert flags == [0, 0, 0, 1]
    batches = [apb.ReadEventsResponse.FromString(payload) for _, payload in got[:3]]
    assert [(b.first_sequence, b.last_sequence) for b in batches] == [(head + i, head + i) for i in (1, 2, 3)]
    texts = [e.message_posted.content.text for b in batches for e in decode_events(b.events)]
    assert texts == ["one", "two", "three"]
    assert json.loads(got[3][1]) == {"ok": True}


async def test_a_follow_ended_by_the_mesh_ends_with_its_refusal_in_the_trailer(
    world: World, console: Console
) -> None:
    await create(world)
    head = (await world.client.group_state(G)).head_sequence
    request = apb.ReadEventsRequest(group_id=G, after_sequence=head, follow=True)
    async with await console.post(
        READ_EVENTS, request, proof=console.proof(world.owner, READ_EVENTS)
    ) as answer:
        assert answer.status == 200
        # A newer session of the same identity ends the follow proven by the older (MW-11.3-09).
        await world.client.open_session("alice", world.owner.key)
        got = [f async for f in frames(answer)]
    assert [flag for flag, _ in got] == [1]
    code, rejection = refusal(got[0][1])
    assert (
        code == "FAILED_PRECONDITION" and R.Name(rejection.reason) == "REJECTION_REASON_SESSION_EPOCH_STALE"
    )


async def test_a_browser_that_leaves_mid_stream_ends_the_mesh_stream(world: World, console: Console) -> None:
    await create(world)
    ended = rpcs(READ_EVENTS)
    request = apb.ReadEventsRequest(group_id=G, follow=True)  # history, then follows a quiet Group
    answer = await console.post(READ_EVENTS, request, proof=console.proof(world.owner, READ_EVENTS))
    flag, _ = await anext(frames(answer))
    assert flag == 0  # the mesh stream is open: its first batch came through
    assert rpcs(READ_EVENTS) == ended
    answer.close()  # the tab goes away; the Group stays quiet
    started = time.monotonic()
    await polled(lambda: _true(rpcs(READ_EVENTS, "CANCELLED") > 0 and rpcs(READ_EVENTS) > ended), limit_s=5)
    assert time.monotonic() - started < 5


async def _true(value: bool) -> bool:
    return value


# ------------------------------------------------------------------ the relay's own robustness


class FakeMesh:
    """A gRPC server in the mesh's place whose calls the test controls: GetGroupState never answers,
    ReadEvents streams 64 KiB messages for ever. Each records that it started and how it ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.ended = asyncio.Event()
        self.sent = 0
        self.server = grpc.aio.server()
        handlers: dict[str, grpc.RpcMethodHandler] = {
            "GetGroupState": grpc.unary_unary_rpc_method_handler(self.never),
            "ReadEvents": grpc.unary_stream_rpc_method_handler(self.endless),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("missionweave.v1.AuthorityService", handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def never(self, request: bytes, context: Any) -> bytes:
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.ended.set()
        raise AssertionError("unreachable")

    async def endless(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        self.started.set()
        try:
            while True:
                self.sent += 1
                yield b"\x01" * 65536
        finally:
            self.ended.set()


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeMesh, str]]:
    """A console relaying to a FakeMesh; its base URL."""
    mesh = FakeMesh()
    await mesh.server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{mesh.port}")
    served = await site.serve_console("127.0.0.1:0", channel, f"127.0.0.1:{mesh.port}")
    try:
        yield mesh, served.url.rstrip("/")
    finally:
        await served.stop()
        await mesh.server.stop(0)


async def test_a_unary_call_the_mesh_does_not_answer_is_bounded(
    fake: tuple[FakeMesh, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mesh, base = fake
    monkeypatch.setattr(site, "UNARY_TIMEOUT_S", 0.5)
    started = time.monotonic()
    async with (
        asyncio.timeout(10),
        aiohttp.ClientSession() as http,
        http.post(f"{base}/rpc{GET_GROUP_STATE}", headers={CONSOLE_HEADER: "1"}) as answer,
    ):
        assert answer.status == 504
        assert (await answer.json())["code"] == "DEADLINE_EXCEEDED"
    assert 0.5 <= time.monotonic() - started < 5
    assert mesh.started.is_set()
    await asyncio.wait_for(mesh.ended.wait(), 5)  # the mesh's call was ended too


async def test_a_stalled_reader_is_dropped_and_its_mesh_stream_ends(
    fake: tuple[FakeMesh, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    mesh, base = fake
    monkeypatch.setattr(site, "STREAM_WRITE_TIMEOUT_S", 0.5)
    caplog.set_level(logging.INFO, "missionweave_server.console")
    port = int(base.rsplit(":", 1)[1])
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a tab that takes almost nothing
    reader.connect(("127.0.0.1", port))
    reader.sendall(
        f"POST /rpc{READ_EVENTS} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{CONSOLE_HEADER}: 1\r\n"
        "Content-Length: 0\r\n\r\n".encode()
    )
    try:
        await asyncio.wait_for(mesh.started.wait(), 10)
        started = time.monotonic()
        await asyncio.wait_for(mesh.ended.wait(), 10)  # the relay stopped taking messages and cancelled
        assert time.monotonic() - started < 10
        sent = mesh.sent
        # ... and the connection is gone: what was buffered, then the end (or a reset).
        reader.setblocking(False)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ConnectionResetError):
            async with asyncio.timeout(10):
                while await loop.sock_recv(reader, 1 << 20):
                    pass
        assert mesh.sent == sent
    finally:
        reader.close()
    assert [(r.levelname, r.getMessage(), fields(r)) for r in caplog.records] == [
        ("INFO", "console call refused", (READ_EVENTS, "BROWSER_STALLED", 200))
    ]


def global_ipv6() -> str | None:
    """An IPv6 address of this machine other than loopback and link-local, if it has one."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            address = ":".join(raw[i : i + 4] for i in range(0, 32, 4))
            if not raw.startswith(("fe80", "0000000000000000000000000000000")):
                return str(ipaddress.ip_address(address))
    return None


async def test_a_console_on_an_ipv6_address_answers_to_it_in_brackets() -> None:
    address = global_ipv6()
    if address is None:
        pytest.skip("this machine has no IPv6 address but loopback and link-local")
    channel = grpc.aio.insecure_channel("127.0.0.1:1")  # never dialled
    served = await site.serve_console(f"[{address}]:0", channel, "127.0.0.1:1")
    try:
        assert served.url == f"http://[{address}]:{served.port}/"
        async with aiohttp.ClientSession() as http, http.get(f"{served.url}api/config") as answer:
            assert answer.status == 200  # Host: [address]:port, as a browser sends it
    finally:
        await served.stop()


async def test_a_console_not_built_says_so_and_relays_on(
    fake: tuple[FakeMesh, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An installation without the page's files (a checkout before `make console`) still starts:
    the page answers 503 saying how to build it, the relay works."""
    mesh, _ = fake
    monkeypatch.setattr(site, "static_dir", lambda: tmp_path / "static")  # no such directory
    monkeypatch.setattr(site, "UNARY_TIMEOUT_S", 0.2)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{mesh.port}")
    served = await site.serve_console("127.0.0.1:0", channel, f"127.0.0.1:{mesh.port}")
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(served.url) as answer:
                assert answer.status == 503 and "run `make console`" in await answer.text()
                assert_secured(answer)
            async with http.get(f"{served.url}static/app.js") as answer:
                assert answer.status == 404
            async with http.post(
                f"{served.url}rpc{GET_GROUP_STATE}", headers={CONSOLE_HEADER: "1"}
            ) as answer:
                assert answer.status == 504  # relayed (the fake mesh never answers)
    finally:
        await served.stop()


def fields(record: logging.LogRecord) -> tuple[str, str, int | None]:
    """A relay line's method, outcome and HTTP status (None on an answered call's line)."""
    return record.__dict__["method"], record.__dict__["outcome"], record.__dict__.get("status")


def _proofs_in(text: str, proofs: list[bytes]) -> list[str]:
    found = []
    for proof in proofs:
        for spelling in (base64.b64encode(proof).decode(), proof.hex(), repr(proof)[2:40]):
            if spelling in text:
                found.append(spelling)
    return found


async def test_the_relay_never_logs_a_call_proof(
    world: World, console: Console, caplog: pytest.LogCaptureFixture
) -> None:
    conversation = await mission_with_conversation(world)
    caplog.set_level(logging.DEBUG)
    owner = world.owner
    proofs: list[bytes] = []

    def proof(method: str, audience: str | None = None) -> str:
        raw = call_proof(owner, method, audience or console.audience)
        proofs.append(raw)
        return base64.b64encode(raw).decode()

    request = apb.GetGroupStateRequest(group_id=G)
    good = proof(GET_GROUP_STATE)
    assert (await console.post(GET_GROUP_STATE, request, proof=good)).status == 200
    assert (await console.post(GET_GROUP_STATE, request, proof=good)).status == 401  # replayed
    assert (await console.post(GET_GROUP_STATE, request, proof=proof(GET_GROUP_STATE, "x:1"))).status == 401
    assert (await console.post(GET_GROUP_STATE, request, proof=proof(READ_EVENTS))).status == 401
    assert (await console.post(GET_GROUP_STATE, request, proof=proof(GET_GROUP_STATE) + "!")).status == 400
    forbidden = await console.post(
        GET_GROUP_STATE, request, proof=proof(GET_GROUP_STATE), headers={CONSOLE_HEADER: ""}
    )
    assert forbidden.status == 403
    assert (await console.post(REGISTER, b"", proof=proof(REGISTER))).status == 404
    followed = rpcs(READ_EVENTS, "CANCELLED")
    async with await console.post(
        READ_EVENTS, apb.ReadEventsRequest(group_id=G, follow=True), proof=proof(READ_EVENTS)
    ) as answer:
        assert (await anext(frames(answer)))[0] == 0
    signed = world.signed(owner, G, "message_post", builders.message(conversation, "x"), membership_epoch=1)
    signed.signatures[0].sig = bytes(64)
    assert (await console.post(EXECUTE, apb.ExecuteCommandRequest(command=signed))).status == 401
    await polled(lambda: _true(rpcs(READ_EVENTS, "CANCELLED") > followed))  # the follow's end is logged too
    formatter = JsonFormatter()
    written = "\n".join(formatter.format(r) + repr(r.__dict__) for r in caplog.records)
    assert len(caplog.records) > 5 and "console call" in written
    assert _proofs_in(written, proofs) == []


async def test_the_relay_logs_one_line_per_refused_call_and_none_at_info_per_answer(
    world: World, console: Console, caplog: pytest.LogCaptureFixture
) -> None:
    await create(world)
    caplog.set_level(logging.DEBUG, "missionweave_server.console")

    def lines() -> list[tuple[str, str, str, int | None]]:  # level, method, outcome, status
        mine = [r for r in caplog.records if r.name == "missionweave_server.console"]
        caplog.clear()
        return [(r.levelname, *fields(r)) for r in mine]

    request = apb.GetGroupStateRequest(group_id=G)
    assert (await console.read(world.owner, GET_GROUP_STATE, request))[0] == 200
    assert lines() == [("DEBUG", GET_GROUP_STATE, "OK", None)]
    assert (await console.post(GET_GROUP_STATE, request)).status == 401
    assert lines() == [("INFO", GET_GROUP_STATE, "UNAUTHENTICATED", 401)]
    assert (await console.post(GET_GROUP_STATE, request, headers={CONSOLE_HEADER: "0"})).status == 403
    assert lines() == [("INFO", GET_GROUP_STATE, "PERMISSION_DENIED", 403)]
    assert (await console.post(REGISTER)).status == 404
    assert lines() == [("INFO", REGISTER, "UNIMPLEMENTED", 404)]
    assert (await console.post(GET_GROUP_STATE, request, proof="!")).status == 400
    assert lines() == [("INFO", GET_GROUP_STATE, "INVALID_ARGUMENT", 400)]
    assert (await console.post(GET_GROUP_STATE, b"\0" * (FOUR_MIB + 1))).status == 413
    assert lines() == [("INFO", GET_GROUP_STATE, "TOO_LARGE", 413)]
    assert (await console.http.get(f"{console.base}/", headers={"Host": "evil.example"})).status == 421
    assert lines() == [("INFO", "/", "MISDIRECTED", 421)]
    async with await console.post(
        READ_EVENTS, apb.ReadEventsRequest(group_id=G), proof=console.proof(world.owner, READ_EVENTS)
    ) as answer:
        assert [f[0] async for f in frames(answer)][-1] == 1
    assert lines() == [("DEBUG", READ_EVENTS, "OK", None)]
    async with await console.post(
        READ_EVENTS,
        apb.ReadEventsRequest(group_id="grp_nowhere"),
        proof=console.proof(world.owner, READ_EVENTS),
    ) as answer:
        assert [f[0] async for f in frames(answer)] == [1]
    assert lines() == [("INFO", READ_EVENTS, "PERMISSION_DENIED", 200)]


# ------------------------------------------------------------------ TLS


def issue_server_certificate(directory: Path, hosts: tuple[str, ...]) -> tuple[Path, Path, Path]:
    """A mesh CA and a server certificate for ``hosts`` (as tests/test_tls.py makes them): the CA
    file, the certificate, its key."""
    ca = certs.new_ca("console test CA")
    ca.write(directory, "ca")
    cert, key = certs.issue(ca, "server", hosts=hosts, service="gateway").write(directory, "server")
    return directory / "ca.crt", cert, key


def tls_mesh_settings(tmp_path: Path, cert: Path, key: Path, ca: Path | None) -> Settings:
    return Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
        grace_seconds=1,
        verify_workers=0,
        tls_cert=cert,
        tls_key=key,
        tls_ca=ca,
        console_listen="127.0.0.1:0",
    )


def served_certificate(port: int, ca: Path) -> bytes:
    """The DER certificate a TLS server on 127.0.0.1:``port`` presents (verified against ``ca``)."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw) as wrapped,
    ):
        presented = wrapped.getpeercert(binary_form=True)
    assert presented is not None
    return presented


def der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


@pytest.mark.parametrize(
    "hosts",
    [
        pytest.param(("127.0.0.1", "localhost"), id="loopback-certificate"),
        # As k8s/make-tls-certs.sh issues the gateway's: cluster names only, no loopback.
        pytest.param(("gateway.missionweave.svc.cluster.local",), id="cluster-name-certificate"),
    ],
)
async def test_the_console_serves_https_with_the_mesh_certificate_and_relays_over_tls(
    tmp_path: Path, hosts: tuple[str, ...]
) -> None:
    from missionweave_server.mesh.server import start

    ca, cert, key = issue_server_certificate(tmp_path / "pki", hosts)
    mesh = await start(tls_mesh_settings(tmp_path, cert, key, ca))
    server_name = "" if "127.0.0.1" in hosts else hosts[0]
    client = MeshClient(f"127.0.0.1:{mesh.port}", ClientTLS(ca, server_name=server_name))
    try:
        assert mesh.console is not None and mesh.console.url.startswith("https://127.0.0.1:")
        assert await asyncio.to_thread(served_certificate, mesh.console.port, ca) == der(cert)
        admin = await client.open_session("admin", read_key(mesh.settings.admin_key_path))
        verified = ssl.create_default_context(cafile=str(ca))
        verified.check_hostname = False  # the certificate names the mesh's host, the test dials 127.0.0.1
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=verified)) as http:
            console = await open_console(http, mesh.console.url)
            status, body = await console.read(
                admin, GET_IDENTITY, membership_service_pb2.GetIdentityRequest(identity_id="admin")
            )
            assert status == 200, body
            assert membership_service_pb2.GetIdentityResponse.FromString(body).identity.identity_id == "admin"
            # Plain HTTP to it is no answer.
            with pytest.raises(aiohttp.ClientError):
                async with http.get(mesh.console.url.replace("https://", "http://") + "api/config") as answer:
                    await answer.read()
    finally:
        await client.channel.close()
        await mesh.stop(grace=0)


async def test_the_gateway_console_as_kubernetes_configures_it(tmp_path: Path) -> None:
    """k8s/base/gateway.yaml's console settings with the gateway certificate k8s/make-tls-certs.sh makes
    (cluster names only): HTTPS, the Host names it lists (localhost for a port-forward), a relayed
    read; another Host is refused."""
    yaml = pytest.importorskip("yaml")
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    from missionweave_server.mesh.server import start

    manifests = list(yaml.safe_load_all((ROOT / "k8s" / "base" / "gateway.yaml").read_text()))
    deployment = next(d for d in manifests if d and d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MWP_CONSOLE_LISTEN"] == "0.0.0.0:50080"
    out = tmp_path / "k8s-tls"
    await asyncio.to_thread(
        subprocess.run,
        ["bash", str(ROOT / "k8s" / "make-tls-certs.sh"), str(out)],
        check=True,
        capture_output=True,
    )
    port = free_port()  # for 50080, one per machine
    settings = tls_mesh_settings(tmp_path, out / "gateway.crt", out / "gateway.key", out / "ca.crt")
    settings.listen = "0.0.0.0:0"
    settings.console_listen = env["MWP_CONSOLE_LISTEN"].replace(":50080", f":{port}")
    settings.console_hosts = tuple(
        h.replace(":50080", f":{port}") for h in env["MWP_CONSOLE_HOSTS"].split(",")
    )
    mesh = await start(settings)
    name = "gateway.missionweave.svc.cluster.local"
    client = MeshClient(f"127.0.0.1:{mesh.port}", ClientTLS(out / "ca.crt", server_name=name))
    try:
        assert await asyncio.to_thread(served_certificate, port, out / "ca.crt") == der(out / "gateway.crt")
        admin = await client.open_session("admin", read_key(mesh.settings.admin_key_path))
        verified = ssl.create_default_context(cafile=str(out / "ca.crt"))
        verified.check_hostname = False  # as a browser told to trust the name it was port-forwarded to
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=verified)) as http:
            base = f"https://127.0.0.1:{port}"
            for host, status in (
                (f"localhost:{port}", 200),
                (f"{name}:{port}", 200),
                (f"evil.example:{port}", 421),
            ):
                async with http.get(f"{base}/api/config", headers={"Host": host}) as answer:
                    assert answer.status == status, host
            console = await open_console(http, base)
            assert console.audience == f"127.0.0.1:{mesh.port}"
            status_, body = await console.read(
                admin, GET_IDENTITY, membership_service_pb2.GetIdentityRequest(identity_id="admin")
            )
            assert status_ == 200, body
    finally:
        await client.channel.close()
        await mesh.stop(grace=0)


async def test_tls_without_a_ca_refuses_to_start_the_console(tmp_path: Path) -> None:
    from missionweave_server.mesh.server import start

    _, cert, key = issue_server_certificate(tmp_path / "pki", ("127.0.0.1",))
    with pytest.raises(ValueError) as refused:
        await start(tls_mesh_settings(tmp_path, cert, key, None))
    assert str(refused.value) == (
        "the console (MWP_CONSOLE_LISTEN) dials this mesh over TLS and needs its CA: set MWP_TLS_CA "
        "(and a client certificate where clients must present one), or --console-listen '' for no console"
    )
    assert not (tmp_path / "mw.db").exists()  # refused before anything was opened


# ------------------------------------------------------------------ `mwp serve`


def console_at(line: str) -> bool:
    """The start-up's record of the console's address (JSON logs: no other line on stderr)."""
    return logged("console listening")(line)


def console_urls(lines: list[str]) -> list[str]:
    return [json.loads(line)["url"] for line in lines if console_at(line)]


def test_mwp_serve_with_the_console_port_taken_exits_1_naming_it(tmp_path: Path) -> None:
    listen = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        console_port = taken.getsockname()[1]
        process = subprocess.Popen(
            [sys.executable, "-m", "missionweave.cli", "serve", "--listen", f"127.0.0.1:{listen}",
             "--console-listen", f"127.0.0.1:{console_port}", "--data-dir", str(tmp_path / "data")],
            env=serve_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, start_new_session=True,
        )  # fmt: skip
        _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert err.splitlines() == [
        f"mwp serve: port 127.0.0.1:{console_port} (console) is in use: another server listens there; "
        "give it another address (--console-listen, or --no-console for none)"
    ]
    # Nothing left: no process of its session, its gRPC port free, no database made.
    wait_group_gone(process.pid)
    assert refuses(listen)
    assert not list((tmp_path / "data").glob("*.db*"))


async def test_mwp_serve_no_console_serves_none(tmp_path: Path) -> None:
    console_port = free_port()
    process = await serve(
        "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "data"), "--no-console",
        env=serve_env(MWP_CONSOLE_LISTEN=f"127.0.0.1:{console_port}"),  # what --no-console overrides
    )  # fmt: skip
    try:
        lines = await read_until(process, logged("mesh listening"))  # the console would be up by now
        assert not any(console_at(line) or "console listening" in line for line in lines)
        assert refuses(console_port)
    finally:
        await stop(process)
    await asyncio.to_thread(wait_group_gone, process.pid)


async def test_mwp_serve_tls_auto_serves_the_console_over_https(tmp_path: Path) -> None:
    data = tmp_path / "data"
    listen, console_port = free_port(), free_port()
    process = await serve(
        "--tls-auto", "--listen", f"127.0.0.1:{listen}", "--console-listen", f"127.0.0.1:{console_port}",
        "--data-dir", str(data), env=serve_env(),
    )  # fmt: skip
    try:
        lines = await read_until(process, console_at)
        assert console_urls(lines) == [f"https://127.0.0.1:{console_port}/"]
        ca = certs.tls_dir(data) / "ca.crt"
        assert await asyncio.to_thread(served_certificate, console_port, ca) == der(
            certs.tls_dir(data) / "server.crt"
        )
        async with MeshClient(f"127.0.0.1:{listen}", ClientTLS(ca)) as client:
            admin = await client.open_session("admin", read_key(data / "keys" / "admin.key"))
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(ca)))
        ) as http:
            console = await open_console(http, f"https://127.0.0.1:{console_port}/")
            status, body = await console.read(
                admin, GET_IDENTITY, membership_service_pb2.GetIdentityRequest(identity_id="admin")
            )
            assert status == 200, body
    finally:
        await stop(process)
    await asyncio.to_thread(wait_group_gone, process.pid)


async def test_split_topology_the_gateway_child_serves_the_console(tmp_path: Path) -> None:
    data = tmp_path / "data"
    listen, console_port = free_port(), free_port()
    process = await serve(
        "--topology", "split", "--listen", f"127.0.0.1:{listen}",
        "--console-listen", f"127.0.0.1:{console_port}", "--data-dir", str(data), env=serve_env(),
    )  # fmt: skip
    try:
        lines = await read_until(process, lambda line: "split topology serving" in line, console_at)
        assert console_urls(lines) == [f"http://127.0.0.1:{console_port}/"]  # the gateway child's, no other
        async with MeshClient(f"127.0.0.1:{listen}") as client:
            admin_key = read_key(data / "keys" / "admin.key")
            owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
            await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
            from missionweave.kernel.clock import SystemClock

            body = builders.mission_create("alice", "coord-bot", SystemClock().now())
            await client.execute(owner.sign(owner.command("grp_split", "mission_create", body)))
        async with aiohttp.ClientSession() as http:
            console = await open_console(http, f"http://127.0.0.1:{console_port}/")
            assert console.audience == f"127.0.0.1:{listen}"  # the relay dials the front door
            status, answer = await console.read(
                owner, GET_GROUP_STATE, apb.GetGroupStateRequest(group_id="grp_split")
            )
            assert status == 200, answer
            assert apb.GetGroupStateResponse.FromString(answer).state.head_sequence >= 1
    finally:
        await stop(process)
    await asyncio.to_thread(wait_group_gone, process.pid)
