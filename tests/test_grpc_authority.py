"""AuthorityService end to end over gRPC against a real server on a free port (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from nacl.signing import SigningKey
from sqlalchemy import select

from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import COMMAND_TYPE, EVENT_TYPE, sign_envelope, verify_signature
from missionweave.sdk.client import SessionSigner, decode_events
from missionweave.v1 import authority_service_pb2, command_pb2, common_pb2
from missionweave_server.services.authority.schema import commands, events, groups
from missionweave_server.services.authority.views import group_state_proto
from tests import builders
from tests.conftest import World

R = common_pb2.RejectionReason
now = SystemClock().now


async def create_mission(w: World, group_id: str = "grp_e2e") -> str:
    body = builders.mission_create("alice", "coord-bot", now())
    await w.client.execute(w.owner.sign(w.owner.command(group_id, "mission_create", body)))
    state = await w.client.group_state(group_id)
    return state.mission.planning_conversation_id


async def db_image(w: World) -> tuple[list[tuple[object, ...]], ...]:
    """Every stored row of the authority tables, to prove a rejection wrote nothing."""
    engine = w.mesh.engine  # type: ignore[attr-defined]
    async with engine.connect() as conn:
        out = []
        for table in (groups, events, commands):
            rows = await conn.execute(select(table).order_by(*table.primary_key.columns))
            out.append([tuple(r) for r in rows])
    return tuple(out)


async def expect_rejection(
    w: World, envelope: common_pb2.SignedEnvelope, reason: int
) -> common_pb2.Rejection:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await w.client.execute(envelope)
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None, f"no structured rejection in {info.value}"
    assert R.Name(rejection.reason) == R.Name(reason), rejection.message
    return rejection


@pytest.mark.req("MW-7.1-T01", "MW-9-13", "MW-9-10")
async def test_mission_create_and_message_post_end_to_end(world: World) -> None:
    conv = await create_mission(world)
    post = world.owner.command(
        "grp_e2e", "message_post", builders.message(conv, "kick-off"), membership_epoch=1
    )
    result = await world.client.execute(world.owner.sign(post))
    assert result.group_revision == 6 and not result.replayed
    (event,) = decode_events(result.events)
    assert event.type == "message.posted" and event.message_posted.authority is False
    assert event.causing_command_id == post.command_id and event.actor_id == "alice"
    types = [e.type async for e in world.client.read_events("grp_e2e")]
    assert types == [
        "mission.created",
        "conversation.opened",
        "membership.granted",
        "membership.granted",
        "mission.coordinator_lease.granted",
        "message.posted",
    ]


async def test_events_are_signed_by_the_authority(world: World) -> None:
    await create_mission(world)
    key = await world.client.authority.GetAuthorityKey(authority_service_pb2.GetAuthorityKeyRequest())
    call = world.client.authority.ReadEvents(authority_service_pb2.ReadEventsRequest(group_id="grp_e2e"))
    envelopes = [env async for batch in call for env in batch.events]
    assert len(envelopes) == 5
    for env in envelopes:
        assert env.payload_type == EVENT_TYPE and env.signatures[0].key_id == key.key_id
        assert verify_signature(env, key.public_key)
        forged = common_pb2.SignedEnvelope()
        forged.CopyFrom(env)
        forged.payload = env.payload + b"\x00"
        assert not verify_signature(forged, key.public_key)


async def test_retried_command_returns_original_result_and_appends_nothing(world: World) -> None:
    """ARCHITECTURE principle 6: a retry with the same command id is idempotent."""
    conv = await create_mission(world)
    post = world.owner.command("grp_e2e", "message_post", builders.message(conv), membership_epoch=1)
    first = await world.client.execute(world.owner.sign(post))
    before = await db_image(world)
    # A retry may be re-signed with a new issue time: still the same command.
    post.issued_at.CopyFrom(to_timestamp(now() + timedelta(seconds=1)))
    again = await world.client.execute(world.owner.sign(post))
    assert again.replayed and again.group_revision == first.group_revision
    assert list(again.events) == list(first.events)
    assert await db_image(world) == before
    # The creation command itself is idempotent too.
    create = world.owner.command(
        "grp_x", "mission_create", builders.mission_create("alice", "coord-bot", now())
    )
    a = await world.client.execute(world.owner.sign(create))
    b = await world.client.execute(world.owner.sign(create))
    assert b.replayed and list(a.events) == list(b.events)


async def test_bad_input_gets_distinct_reasons_and_writes_nothing(world: World) -> None:
    """Every bad input: a distinct structured reason, a byte-identical log, a server still up."""
    conv = await create_mission(world)
    owner = world.owner
    good = owner.command("grp_e2e", "message_post", builders.message(conv), membership_epoch=1)
    await world.client.execute(owner.sign(good))
    before = await db_image(world)
    seen: set[int] = set()

    async def check(envelope: common_pb2.SignedEnvelope, reason: int) -> None:
        await expect_rejection(world, envelope, reason)
        assert await db_image(world) == before
        seen.add(reason)

    key_id = f"alice#session-{owner.session_epoch}"
    # Malformed protobuf payload (validly signed garbage).
    await check(
        sign_envelope(b"\xff\xff\xff\xff", COMMAND_TYPE, owner.key, key_id), R.REJECTION_REASON_MALFORMED
    )
    # Unknown command kind: a body field number this server does not know.
    unknown = command_pb2.Command()
    unknown.CopyFrom(good)
    unknown.command_id = "cmd_unknown"
    unknown.ClearField("body")
    payload = unknown.SerializeToString() + bytes([0xA2, 0x0F, 0x00])  # field 500, length 0
    await check(
        sign_envelope(payload, COMMAND_TYPE, owner.key, key_id), R.REJECTION_REASON_UNKNOWN_COMMAND_KIND
    )
    # Missing and wrong signatures.
    fresh = owner.command("grp_e2e", "message_post", builders.message(conv, "again"), membership_epoch=1)
    unsigned = owner.sign(fresh)
    del unsigned.signatures[:]
    await check(unsigned, R.REJECTION_REASON_SIGNATURE_MISSING)
    forger = SessionSigner("alice", owner.session_epoch, SigningKey.generate())
    await check(forger.sign(fresh), R.REJECTION_REASON_SIGNATURE_INVALID)
    tampered = owner.sign(fresh)
    tampered.payload = tampered.payload.replace(b"again", b"AGAIN")
    await check(tampered, R.REJECTION_REASON_SIGNATURE_INVALID)
    # Unknown agent.
    await check(
        SessionSigner("mallory", 1, SigningKey.generate()).sign(fresh), R.REJECTION_REASON_UNKNOWN_IDENTITY
    )
    # Wrong membership epoch.
    stale_member = owner.command("grp_e2e", "message_post", builders.message(conv), membership_epoch=7)
    await check(owner.sign(stale_member), R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE)
    # Wrong expected revision.
    wrong_rev = owner.command(
        "grp_e2e",
        "message_post",
        builders.message(conv),
        membership_epoch=1,
        expected_revision=common_pb2.ExpectedRevision(kind=common_pb2.REVISION_KIND_GROUP, revision=3),
    )
    await check(owner.sign(wrong_rev), R.REJECTION_REASON_REVISION_MISMATCH)
    # Oversized command (under the transport limit, over the command limit).
    huge = owner.command("grp_e2e", "message_post", builders.message(conv, "x" * 300_000), membership_epoch=1)
    await check(owner.sign(huge), R.REJECTION_REASON_TOO_LARGE)
    # Duplicate command id with a different body.
    reused = owner.command(
        "grp_e2e",
        "message_post",
        builders.message(conv, "different"),
        membership_epoch=1,
        command_id=good.command_id,
    )
    await check(owner.sign(reused), R.REJECTION_REASON_COMMAND_ID_REUSED)
    # Replay outside the window.
    old = owner.command("grp_e2e", "message_post", builders.message(conv), membership_epoch=1)
    old.issued_at.CopyFrom(to_timestamp(now() - timedelta(minutes=30)))
    await check(owner.sign(old), R.REJECTION_REASON_CLOCK_SKEW)
    # A child Mission of a parent Group that does not exist.
    child = owner.command("grp_e2e_child", "mission_create_child", command_pb2.Command().mission_create_child)
    await check(owner.sign(child), R.REJECTION_REASON_NOT_FOUND)
    assert len(seen) == 11  # twelve cases, two of them forged signatures
    # The service stays up and keeps accepting good commands.
    ok = await world.client.execute(
        owner.sign(owner.command("grp_e2e", "message_post", builders.message(conv), membership_epoch=1))
    )
    assert ok.group_revision == 7


async def test_stale_session_epoch_is_fenced(world: World) -> None:
    """A new session raises the epoch and fences the old one (session epoch kind)."""
    conv = await create_mission(world)
    old = world.owner
    post = old.command("grp_e2e", "message_post", builders.message(conv), membership_epoch=1)
    new = await world.client.open_session("alice", old.key)
    assert new.session_epoch == old.session_epoch + 1
    before = await db_image(world)
    r = await expect_rejection(world, old.sign(post), R.REJECTION_REASON_SESSION_EPOCH_STALE)
    assert r.metadata["current_epoch"] == str(new.session_epoch)
    assert await db_image(world) == before
    ok = await world.client.execute(
        new.sign(new.command("grp_e2e", "message_post", builders.message(conv), membership_epoch=1))
    )
    assert ok.group_revision == 6


async def test_transport_limit_is_enforced_and_server_survives(world: World) -> None:
    conv = await create_mission(world)
    huge = world.owner.command(
        "grp_e2e", "message_post", builders.message(conv, "x" * (5 * 1024 * 1024)), membership_epoch=1
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world.client.execute(world.owner.sign(huge))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    state = await world.client.group_state("grp_e2e")
    assert state.head_sequence == 5


@pytest.mark.req("MW-7.1-04")
async def test_replay_of_the_stored_log_equals_live_state(world: World) -> None:
    """Folding the stored log from scratch yields exactly the state the live Authority holds."""
    conv = await create_mission(world)
    from missionweave.v1 import membership_pb2

    coord = world.coordinator
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await world.client.execute(
        coord.sign(coord.command("grp_e2e", "membership_grant", grant, membership_epoch=2))
    )
    for i in range(20):
        actor = world.worker if i % 2 else world.owner
        epoch = 3 if i % 2 else 1
        await world.client.execute(
            actor.sign(
                actor.command(
                    "grp_e2e", "message_post", builders.message(conv, f"m{i}"), membership_epoch=epoch
                )
            )
        )
    authority = world.mesh.authority  # type: ignore[attr-defined]
    live = await authority.state("grp_e2e")
    replayed = await authority.fold("grp_e2e")
    assert replayed == live
    assert group_state_proto(replayed) == (await world.client.group_state("grp_e2e"))
    assert live.head_sequence == 26


async def test_many_clients_many_groups_no_gap_no_duplicate(world: World) -> None:
    """Concurrent appends to many Groups: contiguous sequences, unique events, nothing lost."""
    group_ids = [f"grp_c{i}" for i in range(8)]
    convs = await asyncio.gather(*(create_mission(world, g) for g in group_ids))
    per_client = 6

    async def client(n: int) -> None:
        for j in range(per_client):
            g = n % len(group_ids)
            cmd = world.owner.command(
                group_ids[g], "message_post", builders.message(convs[g], f"{n}-{j}"), membership_epoch=1
            )
            await world.client.execute(world.owner.sign(cmd))

    await asyncio.gather(*(client(n) for n in range(32)))
    total = 0
    for g in group_ids:
        seqs, event_ids = [], set()
        async for event in world.client.read_events(g):
            seqs.append(event.sequence)
            event_ids.add(event.event_id)
        assert seqs == list(range(1, len(seqs) + 1))
        assert len(event_ids) == len(seqs)
        total += len(seqs) - 5
    assert total == 32 * per_client
    assert world.mesh.store.batches < world.mesh.store.appends  # type: ignore[attr-defined]


@pytest.mark.topologies("single", "split-sharded")
async def test_streamed_command_path(world: World) -> None:
    """Over two Authority shards (split-sharded) the front door routes the stream's commands to the
    Group's shard on a stream of its own (rpc/shards.py); the answers are the same."""
    conv = await create_mission(world)
    envelopes = [
        world.owner.sign(
            world.owner.command("grp_e2e", "message_post", builders.message(conv, str(i)), membership_epoch=1)
        )
        for i in range(50)
    ]
    envelopes.append(
        world.owner.sign(
            world.owner.command("grp_e2e", "message_post", builders.message(conv), membership_epoch=9)
        )
    )

    async def requests():  # type: ignore[no-untyped-def]
        for tag, env in enumerate(envelopes):
            yield authority_service_pb2.ExecuteCommandStreamRequest(command=env, request_tag=tag)

    answers = [a async for a in world.client.authority.ExecuteCommandStream(requests())]
    assert len(answers) == 51
    outcomes = {a.request_tag: a.WhichOneof("outcome") for a in answers}
    assert outcomes[50] == "rejection"
    assert sum(1 for o in outcomes.values() if o == "result") == 50
    rejection = next(a.rejection for a in answers if a.request_tag == 50)
    assert rejection.reason == R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE
    assert (await world.client.group_state("grp_e2e")).head_sequence == 55


async def test_read_events_follow_and_unknown_group(world: World) -> None:
    conv = await create_mission(world)
    call = world.client.authority.ReadEvents(
        authority_service_pb2.ReadEventsRequest(group_id="grp_e2e", after_sequence=5, follow=True)
    )

    async def first_batch() -> list[int]:
        async for batch in call:
            return [e.sequence for e in decode_events(batch.events)]
        return []

    reader = asyncio.create_task(first_batch())
    await asyncio.sleep(0.1)
    await world.client.execute(
        world.owner.sign(
            world.owner.command("grp_e2e", "message_post", builders.message(conv), membership_epoch=1)
        )
    )
    assert await asyncio.wait_for(reader, 5) == [6]
    call.cancel()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in world.client.read_events("grp_nope"):
            pass
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_health_reports_every_service_and_reflection_lists_them(world: World) -> None:
    from missionweave_server.mesh.server import SERVICE_NAMES

    health = health_pb2_grpc.HealthStub(world.client.channel)
    for name in SERVICE_NAMES.values():
        resp = await health.Check(health_pb2.HealthCheckRequest(service=name))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING, name
    refl = reflection_pb2_grpc.ServerReflectionStub(world.client.channel)

    async def ask():  # type: ignore[no-untyped-def]
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        yield reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="missionweave.v1.AuthorityService"
        )

    # v1alpha, and v1 (same messages under another package name: what current tools ask first).
    v1 = world.client.channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    for call in (refl.ServerReflectionInfo(ask()), v1(ask())):
        responses = [r async for r in call]
        listed = {s.name for s in responses[0].list_services_response.service}
        assert (
            set(SERVICE_NAMES.values())
            | {"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}
            <= listed
        )
        fd = descriptor_pb2.FileDescriptorProto.FromString(
            responses[1].file_descriptor_response.file_descriptor_proto[0]
        )
        assert fd.package == "missionweave.v1"


async def test_the_scheduling_service_serves_and_refuses_an_incomplete_request_structured(
    world: World,
) -> None:
    """It used to answer UNIMPLEMENTED to everything while its health said SERVING (issue 15)."""
    from missionweave.v1 import scheduling_service_pb2, scheduling_service_pb2_grpc

    stub = scheduling_service_pb2_grpc.SchedulingServiceStub(world.client.channel)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetQueue(scheduling_service_pb2.GetQueueRequest())
    rejection = rejection_from_rpc_error(info.value)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and rejection is not None
    assert rejection.metadata["field"] == "group_id"


def test_every_rejection_reason_maps_to_a_grpc_code() -> None:
    """A reason without a mapping would reach clients as UNKNOWN (docs/errors.md promises a code each)."""
    from missionweave_server.edge.status import CODES

    reasons = {v for v in R.values() if v != R.REJECTION_REASON_UNSPECIFIED}
    assert {R.Name(v) for v in reasons - set(CODES)} == set()  # type: ignore[arg-type]
