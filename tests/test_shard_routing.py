"""Commands reach their Group's owning Authority shard (issue 12, item 2): placement by rendezvous
hash, a NOT_OWNER answer retried at the owner it names, a shard that is down skipped."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_status import rpc_status

from missionweave.kernel.errors import R, Rejected
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.transport import open_channel
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import authority_service_pb2_grpc as apb_grpc
from missionweave.v1 import command_pb2, common_pb2
from missionweave.v1 import gateway_service_pb2 as gpb
from missionweave_server.edge.local import LocalChannel
from missionweave_server.edge.shards import ShardedChannel, group_of, rendezvous
from missionweave_server.edge.status import rejections_as_status, to_status
from missionweave_server.mesh.front_door import _fail
from missionweave_server.services.gateway.authority_calls import refusal

AUTHORITY = apb.DESCRIPTOR.services_by_name["AuthorityService"].full_name
SHARDS = ["shard-a:1", "shard-b:1", "shard-c:1"]  # names only: every call stays in this process


def command(group_id: str, command_id: str = "cmd-1") -> common_pb2.SignedEnvelope:
    payload = command_pb2.Command(group_id=group_id, command_id=command_id).SerializeToString()
    return common_pb2.SignedEnvelope(payload=payload)


class Mesh:
    """Fake shards: each owns the Groups in ``owned`` and answers NOT_OWNER for the others."""

    def __init__(
        self,
        owners: dict[str, str],
        down: set[str] = frozenset(),  # type: ignore[assignment]
        hung: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> None:
        self.owners, self.down, self.calls, self.batches = owners, down, Counter[str](), Counter[str]()
        self.hung = hung  # shards that take a call and never answer (a stopped process)
        self.channels = {address: self._shard(address) for address in SHARDS}

    def _shard(self, address: str) -> LocalChannel:
        mesh = self

        def decide(request: apb.ExecuteCommandRequest) -> apb.ExecuteCommandResponse:
            group = group_of(request)
            mesh.calls[address] += 1
            owner = mesh.owners.get(group, address)
            if owner != address:
                raise Rejected(
                    R.REJECTION_REASON_NOT_OWNER,
                    f"{group} is owned elsewhere",
                    owner="x",
                    owner_address=owner,
                )
            cid = command_pb2.Command.FromString(request.command.payload).command_id
            return apb.ExecuteCommandResponse(
                result=command_pb2.CommandResult(command_id=cid, group_id=group)
            )

        @rejections_as_status
        class Shard(apb_grpc.AuthorityServiceServicer):
            async def ExecuteCommand(
                self, request: apb.ExecuteCommandRequest, context: grpc.aio.ServicerContext
            ) -> apb.ExecuteCommandResponse:
                if address in mesh.hung:
                    mesh.calls[address] += 1
                    await asyncio.Event().wait()
                return decide(request)

            async def ExecuteCommandBatch(
                self, request: apb.ExecuteCommandBatchRequest, context: grpc.aio.ServicerContext
            ) -> apb.ExecuteCommandBatchResponse:
                mesh.batches[address] += 1
                out = apb.ExecuteCommandBatchResponse()
                for item in request.commands:
                    answer = out.results.add(request_tag=item.request_tag)
                    try:
                        answer.result.CopyFrom(decide(apb.ExecuteCommandRequest(command=item.command)).result)
                    except Rejected as rejected:
                        answer.rejection.CopyFrom(rejected.to_proto())
                return out

            async def ReadEvents(
                self, request: apb.ReadEventsRequest, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[apb.ReadEventsResponse]:
                mesh.calls[address] += 1
                yield apb.ReadEventsResponse(head_sequence=SHARDS.index(address))

        channel = LocalChannel()
        channel.register(AUTHORITY, Shard())
        return channel

    def channel_for(self, address: str) -> object:
        if address in self.down:
            return open_channel("127.0.0.1:9")  # nobody listens: UNAVAILABLE
        return self.channels[address]


def test_rendezvous_placement_is_stable_and_spreads_groups() -> None:
    spread = Counter(rendezvous(f"grp_{i}", SHARDS)[0] for i in range(3000))
    assert set(spread) == set(SHARDS) and min(spread.values()) > 800
    assert rendezvous("grp_7", SHARDS) == rendezvous("grp_7", list(reversed(SHARDS)))
    # Losing a shard moves only the Groups it held.
    moved = [
        g
        for g in (f"grp_{i}" for i in range(300))
        if rendezvous(g, SHARDS)[0] != SHARDS[2] and rendezvous(g, SHARDS[:2])[0] != rendezvous(g, SHARDS)[0]
    ]
    assert moved == []


async def test_a_command_goes_to_the_hashed_shard_when_nobody_else_owns_its_group() -> None:
    mesh = Mesh({})
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for))
    answer = await stub.ExecuteCommand(apb.ExecuteCommandRequest(command=command("grp_a")))
    assert answer.result.group_id == "grp_a"
    assert mesh.calls == Counter({rendezvous("grp_a", SHARDS)[0]: 1})


async def test_not_owner_is_retried_at_the_owner_it_names_and_the_placement_remembered() -> None:
    preferred, _, owner = rendezvous("grp_b", SHARDS)  # the owner is last in the hash order
    mesh = Mesh({"grp_b": owner})
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for))
    await stub.ExecuteCommand(apb.ExecuteCommandRequest(command=command("grp_b")))
    assert mesh.calls == Counter({preferred: 1, owner: 1})
    await stub.ExecuteCommand(apb.ExecuteCommandRequest(command=command("grp_b", "cmd-2")))
    assert mesh.calls[owner] == 2 and mesh.calls[preferred] == 1  # straight to the owner now


async def test_a_shard_that_is_down_is_skipped_for_the_next_in_the_groups_order() -> None:
    order = rendezvous("grp_c", SHARDS)
    mesh = Mesh({}, down={order[0]})
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for))
    answer = await stub.ExecuteCommand(apb.ExecuteCommandRequest(command=command("grp_c")))
    assert answer.result.group_id == "grp_c" and mesh.calls == Counter({order[1]: 1})


async def test_when_every_shard_is_down_the_caller_gets_unavailable() -> None:
    mesh = Mesh({}, down=set(SHARDS))
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ExecuteCommand(apb.ExecuteCommandRequest(command=command("grp_d")))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def assert_no_shard_address(err: grpc.aio.AioRpcError) -> common_pb2.Rejection:
    """The caller's PEER_UNAVAILABLE: retryable, with a retry hint, and naming no shard."""
    rejection = rejection_from_rpc_error(err)
    assert err.code() == grpc.StatusCode.UNAVAILABLE and rejection is not None
    assert rejection.reason == R.REJECTION_REASON_PEER_UNAVAILABLE, rejection
    assert int(rejection.metadata["retry_after_ms"]) > 0
    shown = [err.details() or "", rejection.message, *rejection.metadata.values()]
    assert not [text for text in shown for shard in SHARDS if shard.split(":")[0] in text], shown
    return rejection


async def test_a_group_whose_owner_is_down_is_peer_unavailable_with_a_retry_hint_and_no_address() -> None:
    """The owner does not answer and the others name it (its lease has not lapsed): the caller is
    told to retry, never where the owner lives."""
    order = rendezvous("grp_down", SHARDS)
    mesh = Mesh({"grp_down": order[0]}, down={order[0]})
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ExecuteCommand(apb.ExecuteCommandRequest(command=command("grp_down")))
    assert "grp_down" in assert_no_shard_address(info.value).message


async def test_a_group_no_shard_takes_is_peer_unavailable_and_not_the_last_not_owner() -> None:
    """Every shard says another owns the Group and names none it could reach: the last NOT_OWNER
    (an internal address) is not passed on."""
    mesh = Mesh({"grp_between": ""})
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ExecuteCommand(apb.ExecuteCommandRequest(command=command("grp_between")))
    assert_no_shard_address(info.value)
    assert mesh.calls == Counter(dict.fromkeys(SHARDS, 1))


async def test_a_batched_or_streamed_command_whose_owner_is_down_is_answered_peer_unavailable_in_band() -> (
    None
):
    order = rendezvous("grp_down", SHARDS)
    mesh = Mesh({"grp_down": order[0]}, down={order[0]})
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for))
    batch = apb.ExecuteCommandBatchRequest(
        commands=[apb.ExecuteCommandStreamRequest(request_tag=1, command=command("grp_down"))]
    )
    (answer,) = (await stub.ExecuteCommandBatch(batch)).results
    assert answer.rejection.reason == R.REJECTION_REASON_PEER_UNAVAILABLE
    assert "retry_after_ms" in answer.rejection.metadata
    assert not any(shard.split(":")[0] in answer.rejection.message for shard in SHARDS)


ANSWER_S = 0.3  # the router's answer deadline in these tests


async def test_a_shard_that_gives_no_answer_is_skipped_and_then_tried_last() -> None:
    """A hung shard (alive to TCP, answering nothing) costs a call the answer deadline, not the
    caller's whole deadline; the next calls try it last while it stays silent."""
    order = rendezvous("grp_hung", SHARDS)
    mesh = Mesh({}, hung={order[0]})
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for, answer_s=ANSWER_S))
    answer = await stub.ExecuteCommand(apb.ExecuteCommandRequest(command=command("grp_hung")), timeout=30)
    assert answer.result.group_id == "grp_hung"
    assert mesh.calls == Counter({order[0]: 1, order[1]: 1})
    # Another Group the hung shard is placed first for: straight to its next shard.
    other = next(g for g in (f"grp_{i}" for i in range(100)) if rendezvous(g, SHARDS)[0] == order[0])
    started = asyncio.get_running_loop().time()
    await stub.ExecuteCommand(apb.ExecuteCommandRequest(command=command(other)), timeout=30)
    assert asyncio.get_running_loop().time() - started < ANSWER_S
    assert mesh.calls[order[0]] == 1


async def test_a_group_whose_owner_gives_no_answer_is_peer_unavailable_then_answered_once_it_moved() -> None:
    order = rendezvous("grp_stopped", SHARDS)
    mesh = Mesh({"grp_stopped": order[0]}, hung={order[0]})
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for, answer_s=ANSWER_S))
    request = apb.ExecuteCommandRequest(command=command("grp_stopped"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ExecuteCommand(request, timeout=30)
    assert_no_shard_address(info.value)
    # The others still name it (its lease holds): refused at once, without waiting on it again.
    started = asyncio.get_running_loop().time()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ExecuteCommand(request, timeout=30)
    assert_no_shard_address(info.value)
    assert asyncio.get_running_loop().time() - started < ANSWER_S and mesh.calls[order[0]] == 1
    mesh.owners["grp_stopped"] = order[1]  # its lease lapsed: the next shard took the Group over
    answer = await stub.ExecuteCommand(request, timeout=30)
    assert answer.result.group_id == "grp_stopped" and mesh.calls[order[0]] == 1


async def test_the_callers_own_deadline_is_deadline_exceeded_not_a_silent_shard() -> None:
    order = rendezvous("grp_hurry", SHARDS)
    mesh = Mesh({}, hung={order[0]})
    channel = ShardedChannel(SHARDS, mesh.channel_for, answer_s=5.0)
    stub = apb_grpc.AuthorityServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ExecuteCommand(apb.ExecuteCommandRequest(command=command("grp_hurry")), timeout=0.2)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert channel.order("grp_hurry")[0] == order[0]  # not marked silent for the caller's hurry


def not_owner_error() -> grpc.aio.AioRpcError:
    """A shard's NOT_OWNER as a routed follow ends with it (the Group moved under the stream)."""
    moved = Rejected(
        R.REJECTION_REASON_NOT_OWNER, "owned by shard-b at shard-b:1", owner="b", owner_address="shard-b:1"
    )
    status = rpc_status.to_status(to_status(moved))
    return grpc.aio.AioRpcError(
        status.code, grpc.aio.Metadata(), grpc.aio.Metadata(*status.trailing_metadata), details=status.details
    )


class Aborted(Exception):
    pass


class RecordingContext:
    """The part of a servicer context the front door's failure path uses."""

    status: Any = None

    async def abort_with_status(self, status: Any) -> None:
        self.status = status
        raise Aborted

    async def abort(self, code: grpc.StatusCode, details: str, trailing: Any) -> None:
        self.status = (code, details, trailing)
        raise Aborted


async def test_the_front_door_answers_a_shards_not_owner_as_peer_unavailable() -> None:
    context = RecordingContext()
    with pytest.raises(Aborted):
        await _fail(context, "authority", not_owner_error())  # type: ignore[arg-type]
    err = grpc.aio.AioRpcError(
        context.status.code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*context.status.trailing_metadata),
        details=context.status.details,
    )
    assert_no_shard_address(err)


def test_the_gateway_answers_a_shards_not_owner_as_authority_unavailable_naming_no_shard() -> None:
    refused = refusal(not_owner_error())
    assert refused.code == gpb.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE
    assert refused.rejection.reason == R.REJECTION_REASON_PEER_UNAVAILABLE
    assert int(refused.rejection.metadata["retry_after_ms"]) > 0
    assert "shard-b" not in refused.rejection.message and "owner_address" not in refused.rejection.metadata


async def test_a_batch_is_split_over_the_shards_and_answered_in_request_order() -> None:
    mesh = Mesh({})
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for))
    groups = [f"grp_{i}" for i in range(12)]
    request = apb.ExecuteCommandBatchRequest(
        commands=[
            apb.ExecuteCommandStreamRequest(request_tag=i, command=command(g, f"cmd-{i}"))
            for i, g in enumerate(groups)
        ]
    )
    answer = await stub.ExecuteCommandBatch(request)
    assert [r.request_tag for r in answer.results] == list(range(12))
    assert [r.result.group_id for r in answer.results] == groups
    assert len([a for a in mesh.calls if mesh.calls[a]]) >= 2
    assert (
        sum(mesh.batches.values()) == len(mesh.batches) == len({rendezvous(g, SHARDS)[0] for g in groups})
    )  # one call per shard


async def test_a_batched_command_its_shard_does_not_own_is_sent_again_to_the_owner() -> None:
    preferred, _, owner = rendezvous("grp_k", SHARDS)
    mesh = Mesh({"grp_k": owner}, down=set())
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for))
    request = apb.ExecuteCommandBatchRequest(
        commands=[apb.ExecuteCommandStreamRequest(request_tag=1, command=command("grp_k", "k1"))]
    )
    answer = await stub.ExecuteCommandBatch(request)
    assert (
        answer.results[0].result.group_id == "grp_k"
        and mesh.calls[owner] == 1
        and mesh.batches[preferred] == 1
    )


async def test_a_batch_through_the_front_door_as_raw_bytes_is_routed_the_same() -> None:
    mesh = Mesh({})
    channel = ShardedChannel(SHARDS, mesh.channel_for)
    call = channel.unary_unary("/missionweave.v1.AuthorityService/ExecuteCommand")
    raw = await call(apb.ExecuteCommandRequest(command=command("grp_e")).SerializeToString())
    assert apb.ExecuteCommandResponse.FromString(raw).result.group_id == "grp_e"
    assert mesh.calls == Counter({rendezvous("grp_e", SHARDS)[0]: 1})


async def test_a_stream_of_commands_is_routed_command_by_command() -> None:
    mesh = Mesh({"grp_f": SHARDS[0]})
    channel = ShardedChannel(SHARDS, mesh.channel_for)

    async def requests() -> AsyncIterator[apb.ExecuteCommandStreamRequest]:
        for i, group in enumerate(["grp_f", "grp_g", "grp_h"]):
            yield apb.ExecuteCommandStreamRequest(request_tag=i, command=command(group, f"c{i}"))

    stream = channel.stream_stream("/missionweave.v1.AuthorityService/ExecuteCommandStream")(requests())
    answers = {a.request_tag: a.result.group_id async for a in stream}
    assert answers == {0: "grp_f", 1: "grp_g", 2: "grp_h"}


async def test_a_routed_stream_message_that_does_not_parse_ends_the_stream_malformed_after_the_answers() -> (
    None
):
    """Raw bytes from the front door: the commands before it are answered, then the stream ends
    INVALID_ARGUMENT with a MALFORMED Rejection, as an Authority ends it (it used to wait forever)."""
    mesh = Mesh({})
    channel = ShardedChannel(SHARDS, mesh.channel_for)

    async def requests() -> AsyncIterator[bytes]:
        yield apb.ExecuteCommandStreamRequest(
            request_tag=1, command=command("grp_m", "m1")
        ).SerializeToString()
        yield b"\xff\xff not a message"

    stream = channel.stream_stream("/missionweave.v1.AuthorityService/ExecuteCommandStream")(requests())
    answers: list[bytes] = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async with asyncio.timeout(10):
            async for raw in stream:
                answers.append(raw)
    assert [apb.ExecuteCommandStreamResponse.FromString(a).request_tag for a in answers] == [1]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_MALFORMED


async def test_a_rejection_that_is_not_about_placement_reaches_the_caller_unchanged() -> None:
    mesh = Mesh({})

    @rejections_as_status
    class Refusing(apb_grpc.AuthorityServiceServicer):
        async def ExecuteCommand(
            self, request: apb.ExecuteCommandRequest, context: grpc.aio.ServicerContext
        ) -> apb.ExecuteCommandResponse:
            raise Rejected(R.REJECTION_REASON_LEASE_EXPIRED, "renew first")

    for channel in mesh.channels.values():
        channel.register(AUTHORITY, Refusing())
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ExecuteCommand(apb.ExecuteCommandRequest(command=command("grp_i")))
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_LEASE_EXPIRED


async def test_a_stream_opens_at_the_next_shard_when_the_first_is_down() -> None:
    order = rendezvous("grp_j", SHARDS)
    mesh = Mesh({}, down={order[0]})
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, mesh.channel_for))
    heads = [r.head_sequence async for r in stub.ReadEvents(apb.ReadEventsRequest(group_id="grp_j"))]
    assert heads == [SHARDS.index(order[1])] and mesh.calls == Counter({order[1]: 1})


async def test_a_stream_ended_with_not_owner_leaves_the_owner_it_names_remembered() -> None:
    """A follow stream whose Group another shard took over ends with NOT_OWNER after what it served:
    the caller gets the answers and the error, and its next call goes to the owner named."""
    order = rendezvous("grp_k", SHARDS)
    owner = order[2]
    calls = Counter[str]()

    def shard(address: str) -> LocalChannel:
        @rejections_as_status
        class Moved(apb_grpc.AuthorityServiceServicer):
            async def ReadEvents(
                self, request: apb.ReadEventsRequest, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[apb.ReadEventsResponse]:
                calls[address] += 1
                yield apb.ReadEventsResponse(head_sequence=SHARDS.index(address))
                if address != owner:
                    raise Rejected(R.REJECTION_REASON_NOT_OWNER, "moved", owner="x", owner_address=owner)

        channel = LocalChannel()
        channel.register(AUTHORITY, Moved())
        return channel

    channels = {address: shard(address) for address in SHARDS}
    stub = apb_grpc.AuthorityServiceStub(ShardedChannel(SHARDS, channels.__getitem__))
    heads: list[int] = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for answer in stub.ReadEvents(apb.ReadEventsRequest(group_id="grp_k")):
            heads.append(answer.head_sequence)
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_NOT_OWNER
    assert heads == [SHARDS.index(order[0])]
    heads = [r.head_sequence async for r in stub.ReadEvents(apb.ReadEventsRequest(group_id="grp_k"))]
    assert heads == [SHARDS.index(owner)] and calls == Counter({order[0]: 1, owner: 1})


class ServedShards:
    """Fake shards served over gRPC (bidirectional streams are not called in process): each owns the
    Groups in ``owners`` (the others answer NOT_OWNER naming the owner); ``breaks_after`` ends a
    shard's command streams UNAVAILABLE after that many answers."""

    def __init__(self, owners: dict[str, int], breaks_after: dict[int, int] | None = None) -> None:
        self.owner_index, self.breaks_after = owners, breaks_after or {}
        self.unary, self.streams, self.streamed = Counter[str](), Counter[str](), Counter[str]()
        self.servers: list[grpc.aio.Server] = []
        self.addresses: list[str] = []
        self.channels: dict[str, grpc.aio.Channel] = {}

    async def start(self, count: int = 3) -> None:
        for index in range(count):
            server = grpc.aio.server()
            port = server.add_insecure_port("127.0.0.1:0")
            self.addresses.append(f"127.0.0.1:{port}")
            apb_grpc.add_AuthorityServiceServicer_to_server(self._shard(index), server)
            await server.start()
            self.servers.append(server)

    async def stop(self) -> None:
        for channel in self.channels.values():
            await channel.close()
        for server in self.servers:
            await server.stop(None)

    def channel_for(self, address: str) -> grpc.aio.Channel:
        if address not in self.channels:
            self.channels[address] = open_channel(address)
        return self.channels[address]

    def _shard(self, index: int) -> apb_grpc.AuthorityServiceServicer:
        shards = self

        def decide(address: str, envelope: common_pb2.SignedEnvelope) -> command_pb2.CommandResult:
            cmd = command_pb2.Command.FromString(envelope.payload)
            owner = shards.addresses[shards.owner_index.get(cmd.group_id, index)]
            if owner != address:
                raise Rejected(
                    R.REJECTION_REASON_NOT_OWNER,
                    f"{cmd.group_id} is owned elsewhere",
                    owner="x",
                    owner_address=owner,
                )
            return command_pb2.CommandResult(command_id=cmd.command_id, group_id=cmd.group_id)

        @rejections_as_status
        class Shard(apb_grpc.AuthorityServiceServicer):
            async def ExecuteCommand(
                self, request: apb.ExecuteCommandRequest, context: grpc.aio.ServicerContext
            ) -> apb.ExecuteCommandResponse:
                address = shards.addresses[index]
                shards.unary[address] += 1
                return apb.ExecuteCommandResponse(result=decide(address, request.command))

            async def ExecuteCommandStream(
                self,
                requests: AsyncIterator[apb.ExecuteCommandStreamRequest],
                context: grpc.aio.ServicerContext,
            ) -> AsyncIterator[apb.ExecuteCommandStreamResponse]:
                address = shards.addresses[index]
                shards.streams[address] += 1
                answered = 0
                async for item in requests:
                    if answered == shards.breaks_after.get(index, -1):
                        await context.abort(grpc.StatusCode.UNAVAILABLE, "shard going away")
                    shards.streamed[address] += 1
                    out = apb.ExecuteCommandStreamResponse(request_tag=item.request_tag)
                    try:
                        out.result.CopyFrom(decide(address, item.command))
                    except Rejected as rejected:
                        out.rejection.CopyFrom(rejected.to_proto())
                    answered += 1
                    yield out

        return Shard()


@pytest.fixture
async def served() -> AsyncIterator[ServedShards]:
    shards = ServedShards({})
    yield shards
    await shards.stop()


async def _run_stream(
    channel: ShardedChannel, items: list[tuple[int, str, str]]
) -> list[apb.ExecuteCommandStreamResponse]:
    async def requests() -> AsyncIterator[apb.ExecuteCommandStreamRequest]:
        for tag, group, command_id in items:
            yield apb.ExecuteCommandStreamRequest(request_tag=tag, command=command(group, command_id))

    stream = channel.stream_stream("/missionweave.v1.AuthorityService/ExecuteCommandStream")(requests())
    async with asyncio.timeout(30):  # a command left unanswered fails the test instead of hanging it
        return [answer async for answer in stream]


async def test_a_routed_stream_sends_each_shard_its_commands_on_one_stream_of_its_own(
    served: ServedShards,
) -> None:
    """No unary call per command: one ExecuteCommandStream per shard used, answers under the caller's
    tags (which need not be unique) and each command answered once."""
    await served.start()
    channel = ShardedChannel(served.addresses, served.channel_for)
    groups = [f"grp_s{i}" for i in range(24)]
    answers = await _run_stream(channel, [(7, g, f"c{i}") for i, g in enumerate(groups)])
    assert sorted(a.result.command_id for a in answers) == sorted(f"c{i}" for i in range(24))
    assert {a.request_tag for a in answers} == {7} and all(
        a.result.group_id == f"grp_s{a.result.command_id[1:]}" for a in answers
    )
    used = {rendezvous(g, served.addresses)[0] for g in groups}
    assert served.streams == Counter({address: 1 for address in used}) and len(used) >= 2
    assert sum(served.unary.values()) == 0 and sum(served.streamed.values()) == 24


async def test_a_streamed_command_its_shard_does_not_own_goes_to_the_owner_and_its_group_follows(
    served: ServedShards,
) -> None:
    await served.start()
    preferred, _, owner = rendezvous("grp_own", served.addresses)
    served.owner_index["grp_own"] = served.addresses.index(owner)
    channel = ShardedChannel(served.addresses, served.channel_for)
    first = await _run_stream(channel, [(1, "grp_own", "o1")])
    assert first[0].result.group_id == "grp_own" and first[0].request_tag == 1
    assert served.streamed[preferred] == 1 and served.unary == Counter(
        {owner: 1}
    )  # NOT_OWNER, then the owner
    later = await _run_stream(channel, [(2, "grp_own", "o2"), (3, "grp_own", "o3")])
    assert {a.result.command_id for a in later} == {"o2", "o3"}
    assert served.streamed[owner] == 2 and served.streamed[preferred] == 1  # straight to the owner's stream


async def test_commands_pending_on_a_shard_stream_that_breaks_are_sent_again_and_answered(
    served: ServedShards,
) -> None:
    """A shard that ends its stream UNAVAILABLE mid-way: the commands it had not answered go again
    through the unary placement (command ids make a repeat harmless); none is lost or answered twice."""
    await served.start()
    groups = [f"grp_b{i}" for i in range(40)]
    first = rendezvous(groups[0], served.addresses)[0]
    served.breaks_after[served.addresses.index(first)] = 3
    channel = ShardedChannel(served.addresses, served.channel_for)
    answers = await _run_stream(channel, [(i, g, f"b{i}") for i, g in enumerate(groups)])
    assert sorted(a.request_tag for a in answers) == list(range(40))
    assert all(
        a.WhichOneof("outcome") == "result" and a.result.command_id == f"b{a.request_tag}" for a in answers
    )
    on_first = [g for g in groups if rendezvous(g, served.addresses)[0] == first]
    assert served.streamed[first] == 3 and served.unary[first] == len(on_first) - 3


async def test_a_shard_that_is_down_gets_no_stream_its_groups_go_to_the_next(served: ServedShards) -> None:
    await served.start()
    down = "127.0.0.1:9"  # nobody listens there
    addresses = [down, *served.addresses]
    channel = ShardedChannel(addresses, served.channel_for)
    groups = [g for g in (f"grp_d{i}" for i in range(60)) if rendezvous(g, addresses)[0] == down][:5]
    answers = await _run_stream(channel, [(i, g, f"d{i}") for i, g in enumerate(groups)])
    assert sorted(a.result.command_id for a in answers) == sorted(f"d{i}" for i in range(len(groups)))
    assert all(a.WhichOneof("outcome") == "result" for a in answers) and len(groups) == 5
