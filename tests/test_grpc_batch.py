"""AuthorityService.ExecuteCommandBatch over gRPC (SQLite and PostgreSQL): many signed commands
in one call, each accepted or rejected on its own, answers in request order."""

from __future__ import annotations

import grpc
import pytest
from nacl.signing import SigningKey

from missionweave.kernel.errors import Rejected
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.client import SessionSigner, decode_events
from missionweave.v1 import authority_service_pb2, command_pb2, common_pb2
from missionweave_server.services.authority.servicer import MAX_BATCH_COMMANDS
from tests import builders
from tests.conftest import World
from tests.test_grpc_authority import create_mission, db_image

R = common_pb2.RejectionReason


@pytest.mark.req("MW-9-13")
async def test_a_batch_answers_each_command_in_request_order_and_rejections_write_nothing(
    world: World,
) -> None:
    conv_a = await create_mission(world, "grp_ba")
    conv_b = await create_mission(world, "grp_bb")
    owner = world.owner
    head_a = (await world.client.group_state("grp_ba")).head_sequence
    head_b = (await world.client.group_state("grp_bb")).head_sequence
    earlier = owner.sign(
        owner.command("grp_ba", "message_post", builders.message(conv_a, "earlier"), membership_epoch=1)
    )
    first = await world.client.execute(earlier)
    head_a += 1

    tampered = owner.sign(
        owner.command("grp_ba", "message_post", builders.message(conv_a, "tampered"), membership_epoch=1)
    )
    tampered.payload = tampered.payload.replace(b"tampered", b"TAMPERED")
    forged = SessionSigner("alice", owner.session_epoch, SigningKey.generate()).sign(
        owner.command("grp_bb", "message_post", builders.message(conv_b, "forged"), membership_epoch=1)
    )
    stale = owner.sign(
        owner.command("grp_bb", "message_post", builders.message(conv_b, "stale"), membership_epoch=9)
    )
    batch = [
        owner.sign(
            owner.command("grp_ba", "message_post", builders.message(conv_a, "a1"), membership_epoch=1)
        ),
        tampered,
        owner.sign(
            owner.command("grp_bb", "message_post", builders.message(conv_b, "b1"), membership_epoch=1)
        ),
        earlier,  # an idempotent retry: answered from the log, nothing appended
        forged,
        stale,
        owner.sign(
            owner.command("grp_bb", "message_post", builders.message(conv_b, "b2"), membership_epoch=1)
        ),
    ]
    outcomes = await world.client.execute_batch(batch)

    assert [type(o).__name__ for o in outcomes] == [
        "CommandResult",
        "Rejected",
        "CommandResult",
        "CommandResult",
        "Rejected",
        "Rejected",
        "CommandResult",
    ]
    rejected = [o for o in outcomes if isinstance(o, Rejected)]
    assert [r.reason for r in rejected] == [
        R.REJECTION_REASON_SIGNATURE_INVALID,
        R.REJECTION_REASON_SIGNATURE_INVALID,
        R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE,
    ]
    replayed = outcomes[3]
    assert isinstance(replayed, command_pb2.CommandResult) and replayed.replayed
    assert list(replayed.events) == list(first.events)
    texts = {
        decode_events(o.events)[0].message_posted.content.text
        for o in outcomes
        if isinstance(o, command_pb2.CommandResult) and not o.replayed
    }
    assert texts == {"a1", "b1", "b2"}
    # Exactly the accepted commands were appended, once each.
    after_a = [e.message_posted.content.text async for e in world.client.read_events("grp_ba", after=head_a)]
    after_b = sorted(
        [e.message_posted.content.text async for e in world.client.read_events("grp_bb", after=head_b)]
    )
    assert after_a == ["a1"] and after_b == ["b1", "b2"]

    # The same batch again: every accepted command is a replay now, and the log does not move.
    before = await db_image(world)
    again = await world.client.execute_batch(batch)
    assert [isinstance(o, Rejected) for o in again] == [isinstance(o, Rejected) for o in outcomes]
    assert all(o.replayed for o in again if isinstance(o, command_pb2.CommandResult))
    assert await db_image(world) == before


async def test_request_tags_are_echoed_and_an_empty_batch_is_an_empty_answer(world: World) -> None:
    conv = await create_mission(world, "grp_bt")
    owner = world.owner
    request = authority_service_pb2.ExecuteCommandBatchRequest(
        commands=[
            authority_service_pb2.ExecuteCommandStreamRequest(
                command=owner.sign(
                    owner.command(
                        "grp_bt", "message_post", builders.message(conv, f"t{i}"), membership_epoch=1
                    )
                ),
                request_tag=1000 + i,
            )
            for i in range(5)
        ]
    )
    response = await world.client.authority.ExecuteCommandBatch(request)
    assert [a.request_tag for a in response.results] == [1000, 1001, 1002, 1003, 1004]
    assert all(a.HasField("result") and a.command_id for a in response.results)
    empty = await world.client.authority.ExecuteCommandBatch(
        authority_service_pb2.ExecuteCommandBatchRequest()
    )
    assert list(empty.results) == []


async def test_an_oversized_batch_is_refused_whole_and_writes_nothing(world: World) -> None:
    # Two Groups: one Group admits a burst of 400 commands (MWP_GROUP_BURST), a batch does not lift that.
    convs = {g: await create_mission(world, g) for g in ("grp_bo1", "grp_bo2")}
    owner = world.owner
    before = await db_image(world)
    too_many = [
        owner.sign(owner.command(g, "message_post", builders.message(convs[g], f"m{i}"), membership_epoch=1))
        for i in range(MAX_BATCH_COMMANDS + 1)
        for g in ["grp_bo1" if i % 2 else "grp_bo2"]
    ]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world.client.execute_batch(too_many)
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_TOO_LARGE
    assert rejection.metadata["limit"] == str(MAX_BATCH_COMMANDS)
    assert await db_image(world) == before
    # The largest allowed batch goes through, every command once.
    heads = {g: (await world.client.group_state(g)).head_sequence for g in convs}
    outcomes = await world.client.execute_batch(too_many[:MAX_BATCH_COMMANDS])
    assert all(isinstance(o, command_pb2.CommandResult) and not o.replayed for o in outcomes)
    for g in convs:
        assert (await world.client.group_state(g)).head_sequence == heads[g] + MAX_BATCH_COMMANDS // 2
