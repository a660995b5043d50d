"""Contract truth (issue 17 item 7): what the comments of authority_service.proto, command.proto,
event.proto and auth.proto, and docs/errors.md, promise a client, each checked through the public
gRPC API. Every test's docstring names the comment it holds to; promises that other modules
already test are not repeated here (tests/test_grpc_authority.py, test_read_models.py,
test_read_authorization.py, test_grpc_batch.py, test_key_continuity.py, test_gateway*.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import blake3
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import DOMAIN
from missionweave.kernel.signing import COMMAND_TYPE, session_key_id, sign_envelope
from missionweave.sdk.client import MeshClient, decode_events
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import common_pb2, conversation_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.edge.status import CODES
from missionweave_server.services.authority.ingress import GroupIngressLimiter
from tests import builders
from tests.conftest import World, register
from tests.test_grpc_authority import db_image
from tests.test_missions import G, as_member, create
from tests.test_read_authorization import STATE, check_of, handmade_proof
from tests.test_read_models import reason_of
from tests.test_work_items import setup

R = common_pb2.RejectionReason
PROTOS = Path(__file__).resolve().parent.parent / "protos" / "missionweave" / "v1"


async def refusal(call: object) -> tuple[grpc.StatusCode, common_pb2.Rejection]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    rejection = rejection_of(err.value)
    return err.value.code(), rejection


def rejection_of(err: grpc.aio.AioRpcError) -> common_pb2.Rejection:
    from missionweave.kernel.rejections import rejection_from_rpc_error

    rejection = rejection_from_rpc_error(err)
    assert rejection is not None, err
    return rejection


async def posts(w: World, conversation_id: str, count: int) -> None:
    """``count`` Messages in G by the owner, in batches (the fastest way to a long log), past the
    per-Group ingress rate (in-process meshes only)."""
    w.mesh.authority.ingress = GroupIngressLimiter(0, 0)  # type: ignore[attr-defined]
    for start in range(0, count, 512):
        envelopes = [
            w.signed(
                w.owner, G, "message_post", builders.message(conversation_id, f"m{n}"), membership_epoch=1
            )
            for n in range(start, min(count, start + 512))
        ]
        answers = await w.client.execute_batch(envelopes)
        refused = [a for a in answers if not hasattr(a, "events")]
        assert not refused, refused[:3]


async def batches(client: MeshClient, **request: object) -> list[apb.ReadEventsResponse]:
    return [b async for b in client.authority.ReadEvents(apb.ReadEventsRequest(group_id=G, **request))]  # type: ignore[arg-type]


# ------------------------------------------------------------------ errors.md: codes and details


def test_errors_md_names_the_codes_of_peer_unavailable_and_data_corrupted() -> None:
    """docs/errors.md: "PEER_UNAVAILABLE (gRPC UNAVAILABLE)", "DATA_CORRUPTED (gRPC DATA_LOSS)"; every
    other reason's code against its common.proto comment: tests/test_contract_services.py."""
    assert CODES[R.REJECTION_REASON_PEER_UNAVAILABLE] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert CODES[R.REJECTION_REASON_DATA_CORRUPTED] == grpc.StatusCode.DATA_LOSS.value[0]


async def test_a_rejection_carries_its_reason_as_error_info_and_writes_nothing(world: World) -> None:
    """authority_service.proto AuthorityService: "every rejection is a gRPC status whose
    google.rpc.Status details hold a missionweave.v1.Rejection (stable reason) and a
    google.rpc.ErrorInfo (reason without prefix, domain "missionweave.v1"). A rejected command
    writes nothing." (docs/errors.md "Where to find it")."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    before = await db_image(w)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await w.run(w.owner, G, "message_post", builders.message(conv), membership_epoch=7)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    status = rpc_status.from_call(err.value)  # type: ignore[arg-type]
    assert status is not None
    rejection, info = common_pb2.Rejection(), error_details_pb2.ErrorInfo()
    kinds = []
    for detail in status.details:
        for message in (rejection, info):
            if detail.Is(message.DESCRIPTOR):
                detail.Unpack(message)
                kinds.append(type(message).__name__)
    assert kinds == ["Rejection", "ErrorInfo"]
    assert rejection.reason == R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE
    assert (info.reason, info.domain) == ("MEMBERSHIP_EPOCH_STALE", DOMAIN) and DOMAIN == "missionweave.v1"
    assert dict(info.metadata) == dict(rejection.metadata)
    assert await db_image(w) == before


# ------------------------------------------------------------------ ExecuteCommandStream / Batch


@pytest.mark.topologies("single", "split-sharded")
async def test_stream_and_batch_answers_name_the_command_id_even_of_a_rejected_command(world: World) -> None:
    """authority_service.proto ExecuteCommandStreamResponse.command_id: "whenever the payload
    parses as a Command (a rejected one's too); empty otherwise: then match by request_tag"; and
    ExecuteCommandStream: "match by command_id". (A rejection used to come back without its id.)"""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    stale = w.owner.command(G, "message_post", builders.message(conv), membership_epoch=7)
    good = w.owner.command(G, "message_post", builders.message(conv), membership_epoch=1)
    garbage = sign_envelope(
        b"\xff\xff\xff", COMMAND_TYPE, w.owner.key, session_key_id("alice", w.owner.session_epoch)
    )
    requests = [
        apb.ExecuteCommandStreamRequest(command=w.owner.sign(stale), request_tag=1),
        apb.ExecuteCommandStreamRequest(command=w.owner.sign(good), request_tag=2),
        apb.ExecuteCommandStreamRequest(command=garbage, request_tag=3),
    ]

    async def sent() -> AsyncIterator[apb.ExecuteCommandStreamRequest]:
        for request in requests:
            yield request

    streamed = [a async for a in w.client.authority.ExecuteCommandStream(sent())]
    batched = (
        await w.client.authority.ExecuteCommandBatch(apb.ExecuteCommandBatchRequest(commands=requests))
    ).results
    for answers in (sorted(streamed, key=lambda a: a.request_tag), list(batched)):
        got = [(a.request_tag, a.command_id, a.WhichOneof("outcome")) for a in answers]
        assert got == [
            (1, stale.command_id, "rejection"),
            (2, good.command_id, "result"),
            (3, "", "rejection"),
        ], got


# ------------------------------------------------------------------ ReadEvents


async def test_read_events_pages_after_a_sequence_in_batches_up_to_a_limit(world: World) -> None:
    """authority_service.proto ReadEventsRequest: after_sequence "strictly greater (0 = from the
    start)", batch_size "default 256, max 1024", limit "0 = no limit"; ReadEventsResponse
    first/last_sequence (contiguous batches, the next starts after the last) and head_sequence."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    await posts(w, conv, 1030)
    head = (await w.client.group_state(G)).head_sequence
    assert head == 1035
    default = await batches(w.client)
    assert [(b.first_sequence, b.last_sequence) for b in default[:2]] == [(1, 256), (257, 512)]
    assert [len(b.events) for b in default] == [256, 256, 256, 256, 11]
    assert {b.head_sequence for b in default} == {head}
    assert [e.sequence for b in default for e in decode_events(b.events)] == list(range(1, head + 1))
    capped = await batches(w.client, batch_size=5000)
    assert [len(b.events) for b in capped] == [1024, 11]
    after = await batches(w.client, after_sequence=1030, batch_size=2)
    assert [[e.sequence for e in decode_events(b.events)] for b in after] == [
        [1031, 1032],
        [1033, 1034],
        [1035],
    ]
    limited = await batches(w.client, after_sequence=10, batch_size=2, limit=5)
    assert [(b.first_sequence, b.last_sequence) for b in limited] == [(11, 12), (13, 14), (15, 15)]
    assert await batches(w.client, after_sequence=head) == []


async def test_a_members_read_counts_withheld_sequences_toward_the_limit(world: World) -> None:
    """authority_service.proto ReadEventsRequest.limit: "for a member, withheld ones count too";
    ReadEventsResponse: nothing before the visibility start, nothing of a restricted Conversation
    it is not party to, and the absent sequences of [first_sequence, last_sequence] are withheld."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    await as_member(w, G, w.worker)
    start = (await w.client.group_state(G)).head_sequence  # the grant: the worker's first event
    opened = conversation_pb2.ConversationOpen(
        conversation_id="conv_private",
        kind=conversation_pb2.CONVERSATION_KIND_RESTRICTED,
        title="t",
        participant_ids=[],
    )
    await w.run(w.coordinator, G, "conversation_open", opened, membership_epoch=2)
    await w.run(
        w.coordinator, G, "message_post", builders.message("conv_private", "secret"), membership_epoch=2
    )
    await w.run(w.owner, G, "message_post", builders.message(conv, "for everyone"), membership_epoch=1)
    async with MeshClient(w.target, reader=w.worker) as mine:
        (whole,) = await batches(mine)
        assert (whole.first_sequence, whole.last_sequence) == (start, start + 3)
        assert [e.sequence for e in decode_events(whole.events)] == [start, start + 3]
        (limited,) = await batches(mine, limit=3)  # three sequences read, two of them withheld
        assert (limited.first_sequence, limited.last_sequence) == (start, start + 2)
        assert [e.sequence for e in decode_events(limited.events)] == [start]


async def test_read_events_tells_a_non_member_nothing_and_an_operator_of_a_missing_group(
    world: World,
) -> None:
    """authority_service.proto ReadEvents: "anyone else gets PERMISSION_DENIED / NOT_A_MEMBER,
    whether or not the Group exists"; an operator asking for a missing Group gets GROUP_NOT_FOUND
    (as GetWorkItem says; the same for GetWorkItem itself)."""
    w = world
    await create(w)
    outsider = await register(w.client, w.keys["admin"], "outsider-bot", common_pb2.IDENTITY_KIND_AGENT)
    async with MeshClient(w.target, reader=outsider) as them:
        for group in (G, "grp_never_created"):
            call = them.authority.ReadEvents(apb.ReadEventsRequest(group_id=group))
            code, rejection = await refusal(_drain(call))
            assert (code, rejection.reason) == (
                grpc.StatusCode.PERMISSION_DENIED,
                R.REJECTION_REASON_NOT_A_MEMBER,
            )
    code, rejection = await refusal(
        _drain(w.client.authority.ReadEvents(apb.ReadEventsRequest(group_id="grp_never_created")))
    )
    assert (code, rejection.reason) == (grpc.StatusCode.NOT_FOUND, R.REJECTION_REASON_GROUP_NOT_FOUND)
    missing = w.client.authority.GetWorkItem(
        apb.GetWorkItemRequest(group_id="grp_never_created", work_item_id="wi-1")
    )
    assert await reason_of(missing) == (grpc.StatusCode.NOT_FOUND, R.REJECTION_REASON_GROUP_NOT_FOUND)


async def _drain(call: object) -> None:
    async for _ in call:  # type: ignore[attr-defined]
        pass


# ------------------------------------------------------------------ lists and state


async def test_list_work_items_pages_default_to_100_and_refusals_name_their_field(world: World) -> None:
    """authority_service.proto ListWorkItemsRequest.page_size "1..1000, 0 means 100 (more than 1000:
    INVALID_ARGUMENT, metadata `field` "page_size", `limit`)", page_token "(one this service did not
    issue: INVALID_ARGUMENT, metadata `field` "page_token")"; the same words in ListMissionsRequest."""
    w = world
    await setup(w)
    small = builders.contract(w.clock.now())  # 101 of them fit in the Mission's budget (D162)
    small.budget.CopyFrom(common_pb2.ResourceVector(currency="EUR", tokens=100, tool_calls=1))
    envelopes = [
        w.signed(
            w.coordinator,
            G,
            "work_authorize",
            wp.WorkAuthorize(work_item_id=f"wi-{n:03d}", title="t", contract=small, coordinator_epoch=1),
            membership_epoch=2,
        )
        for n in range(101)
    ]
    assert all(hasattr(a, "events") for a in await w.client.execute_batch(envelopes))
    first = await w.client.authority.ListWorkItems(apb.ListWorkItemsRequest(group_id=G))
    assert [i.work_item_id for i in first.work_items] == [
        f"wi-{n:03d}" for n in range(100)
    ] and first.next_page_token
    rest = await w.client.authority.ListWorkItems(
        apb.ListWorkItemsRequest(group_id=G, page_token=first.next_page_token)
    )
    assert [i.work_item_id for i in rest.work_items] == ["wi-100"] and not rest.next_page_token
    for call in (
        w.client.authority.ListWorkItems(apb.ListWorkItemsRequest(group_id=G, page_size=1001)),
        w.client.authority.ListMissions(apb.ListMissionsRequest(page_size=1001)),
    ):
        code, rejection = await refusal(call)
        assert (code, rejection.reason) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            R.REJECTION_REASON_INVALID_ARGUMENT,
        )
        assert dict(rejection.metadata) == {"field": "page_size", "limit": "1000"}
    for call in (
        w.client.authority.ListWorkItems(apb.ListWorkItemsRequest(group_id=G, page_token="junk")),
        w.client.authority.ListMissions(apb.ListMissionsRequest(page_token="junk")),
    ):
        code, rejection = await refusal(call)
        assert (
            rejection.reason == R.REJECTION_REASON_INVALID_ARGUMENT
            and rejection.metadata["field"] == "page_token"
        )


async def test_last_work_change_sequence_follows_only_work_events(world: World) -> None:
    """authority_service.proto GroupState.last_work_change_sequence: "The Group sequence of the last
    event that changed WorkItem state (0 = none)"."""
    w = world
    f = await setup(w)
    conv = (await w.client.group_state(G)).mission.planning_conversation_id
    assert (await w.client.group_state(G)).last_work_change_sequence == 0
    body = wp.WorkAuthorize(
        work_item_id="wi-1", title="t", contract=builders.contract(w.clock.now()), coordinator_epoch=1
    )
    events = decode_events((await f.coord("work_authorize", body)).events)
    assert [e.type for e in events] == [
        "work.authorized",
        "conversation.opened",
    ]  # the second is no work change
    assert (await w.client.group_state(G)).last_work_change_sequence == events[0].sequence
    await w.run(w.owner, G, "message_post", builders.message(conv), membership_epoch=1)
    state = await w.client.group_state(G)
    assert (
        state.head_sequence == events[1].sequence + 1
        and state.last_work_change_sequence == events[0].sequence
    )


# ------------------------------------------------------------------ command.proto


async def test_ids_are_1_to_128_characters_of_the_id_alphabet(world: World) -> None:
    """command.proto Command.command_id: "1..128 characters of [A-Za-z0-9._:-] (otherwise MALFORMED,
    metadata `field` "command_id")"; group_id and correlation_id likewise (errors.md step 3)."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    body = builders.message(conv)
    ok = await w.run(w.owner, G, "message_post", body, membership_epoch=1, command_id="c" * 127 + ".")
    assert ok.command_id == "c" * 127 + "."
    before = await db_image(w)
    for field, value in (
        ("command_id", "c" * 129),
        ("command_id", "cmd/1"),
        ("command_id", "cmd 1"),
        ("group_id", "g" * 129),
        ("correlation_id", "corr/1"),
    ):
        command = w.owner.command(G, "message_post", body, membership_epoch=1)
        setattr(command, field, value)
        command.issued_at.CopyFrom(to_timestamp(w.clock.now()))
        code, rejection = await refusal(w.client.execute(w.owner.sign(command)))
        assert (rejection.reason, rejection.metadata["field"]) == (R.REJECTION_REASON_MALFORMED, field), (
            field,
            value,
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert await db_image(w) == before


async def test_the_actor_and_its_session_epoch_are_the_signing_sessions(world: World) -> None:
    """command.proto Command.actor_id "must match the signing session's identity", and
    session_epoch; errors.md step 3: "actor and session match the key (SIGNATURE_INVALID)"."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    before = await db_image(w)
    for field, value in (("actor_id", "coord-bot"), ("session_epoch", w.owner.session_epoch + 1)):
        command = w.owner.command(G, "message_post", builders.message(conv), membership_epoch=1)
        setattr(command, field, value)
        code, rejection = await refusal(w.client.execute(w.owner.sign(command)))
        assert (code, rejection.reason) == (
            grpc.StatusCode.UNAUTHENTICATED,
            R.REJECTION_REASON_SIGNATURE_INVALID,
        ), field
    assert await db_image(w) == before


async def test_issued_at_lies_within_five_minutes_either_way(world: World) -> None:
    """command.proto Command.issued_at: "must lie within the Authority's replay window (default
    +-5 minutes)" (CLOCK_SKEW otherwise, errors.md step 3)."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    for offset_s, accepted in ((-290, True), (290, True), (-310, False), (310, False)):
        command = w.owner.command(G, "message_post", builders.message(conv), membership_epoch=1)
        command.issued_at.CopyFrom(to_timestamp(w.clock.now() + timedelta(seconds=offset_s)))
        if accepted:
            assert (await w.client.execute(w.owner.sign(command))).events
        else:
            code, rejection = await refusal(w.client.execute(w.owner.sign(command)))
            assert (code, rejection.reason) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                R.REJECTION_REASON_CLOCK_SKEW,
            )


async def test_a_result_lists_its_events_in_order_up_to_the_new_head_in_one_chain(world: World) -> None:
    """command.proto CommandResult.events "in sequence order", group_revision "the Group's head
    sequence after the append"; event.proto Event.sequence "1, 2, 3, ... with no gaps",
    previous_digest "BLAKE3-256 of [the predecessor's] payload bytes ... empty at sequence 1",
    causing_command_id and actor_id of a command's events."""
    w = world
    body = builders.mission_create("alice", "coord-bot", w.clock.now())
    command = w.owner.command(G, "mission_create", body)
    result = await w.client.execute(w.owner.sign(command))
    events = decode_events(result.events)
    assert [e.sequence for e in events] == [1, 2, 3, 4, 5] and result.group_revision == 5
    assert {(e.causing_command_id, e.actor_id) for e in events} == {(command.command_id, "alice")}
    conv = (await w.client.group_state(G)).mission.planning_conversation_id
    later = await w.run(w.owner, G, "message_post", builders.message(conv), membership_epoch=1)
    envelopes = [*result.events, *later.events]
    chain = decode_events(envelopes)
    assert chain[0].previous_digest == b""
    for previous, envelope, event in zip(envelopes, envelopes[1:], chain[1:], strict=False):
        assert event.previous_digest == blake3.blake3(previous.payload).digest(), event.sequence
        assert len(event.previous_digest) == 32 and envelope.payload


# ------------------------------------------------------------------ auth.proto


async def test_a_call_proof_nonce_is_16_to_64_bytes(world: World) -> None:
    """auth.proto CallProof.nonce: "16..64 random bytes" (the short side is in
    test_read_authorization.py; here both bounds and the long side)."""
    w = world
    await create(w)
    assert await check_of(w, handmade_proof(w.owner, STATE, w.target, nonce=b"\x01" * 16)) == "OK"
    assert await check_of(w, handmade_proof(w.owner, STATE, w.target, nonce=b"\x02" * 64)) == "OK"
    assert await check_of(w, handmade_proof(w.owner, STATE, w.target, nonce=b"\x03" * 65)) == "replayed"
