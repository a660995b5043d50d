"""Contract truth (issue 17 item 7): what the comments of membership_service.proto, membership.proto,
agent_card.proto, scheduling_service.proto, conversation.proto and common.proto promise, through
the public gRPC API. Each test names the comment it checks; promises already covered elsewhere
(tests/test_membership_service.py, test_agent_cards.py, test_scheduling_service.py,
test_conversations.py, ...) are not repeated. The artifact store's: test_contract_artifacts.py."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import OPEN_SESSION_TYPE, REGISTER_IDENTITY_TYPE, sign_envelope
from missionweave.sdk.client import (
    MeshClient,
    SessionSigner,
    decode_events,
    open_session_envelope,
    register_identity_envelope,
)
from missionweave.v1 import common_pb2, conversation_pb2, membership_pb2
from missionweave.v1 import membership_service_pb2 as mpb
from missionweave.v1 import scheduling_service_pb2 as sp
from tests import builders
from tests.conftest import World
from tests.test_missions import G, as_member, create, refused
from tests.test_scheduling_service import Schedulers
from tests.test_work_items import setup

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

R = common_pb2.RejectionReason


async def refusal(call: Any) -> common_pb2.Rejection:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    out = rejection_from_rpc_error(info.value)
    assert out is not None, info.value
    return out


def agent(identity_id: str) -> membership_pb2.Identity:
    return membership_pb2.Identity(
        identity_id=identity_id,
        kind=common_pb2.IDENTITY_KIND_AGENT,
        public_key=bytes(SigningKey.generate().verify_key),
    )


# ------------------------------------------------------------------ membership_service.proto


async def test_get_identity_reports_admin_and_session_epoch_and_refuses_the_unknown(world: World) -> None:
    """membership_service.proto: GetIdentity ("an unregistered one is UNKNOWN_IDENTITY", code
    NOT_FOUND); membership.proto: Identity.session_epoch ("0 if it never opened one"; common.proto:
    epochs start at 1), Identity.org_admin, Identity.display_name (at most 256 characters)."""
    w = world
    key = SigningKey.generate()
    await w.client.register_identity(
        "admin", w.keys["admin"], "quiet-bot", common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
    )
    quiet = await w.client.identity("quiet-bot")
    assert (quiet.session_epoch, quiet.org_admin, quiet.HasField("registered_at")) == (0, False, True)
    assert (await w.client.open_session("quiet-bot", key)).session_epoch == 1
    long_name = agent("named-bot")
    long_name.display_name = "n" * 257
    envelope = register_identity_envelope("admin", w.keys["admin"], long_name)
    r = await refusal(w.client.membership.RegisterIdentity(mpb.RegisterIdentityRequest(command=envelope)))
    assert (r.reason, r.metadata["field"], r.metadata["limit"]) == (
        R.REJECTION_REASON_TOO_LARGE,
        "display_name",
        "256",
    )
    long_name.display_name = "n" * 256
    envelope = register_identity_envelope("admin", w.keys["admin"], long_name)
    assert (
        await w.client.membership.RegisterIdentity(mpb.RegisterIdentityRequest(command=envelope))
    ).identity == (await w.client.identity("named-bot"))
    admin = await w.client.identity("admin")
    assert admin.org_admin and admin.session_epoch >= 1
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await w.client.membership.GetIdentity(mpb.GetIdentityRequest(identity_id="nobody-bot"))
    r = rejection_from_rpc_error(info.value)
    assert r is not None and (r.reason, r.metadata["field"]) == (
        R.REJECTION_REASON_UNKNOWN_IDENTITY,
        "identity_id",
    )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


# ------------------------------------------------------------------ common.proto


def test_each_rejection_reason_has_the_grpc_code_its_comment_names() -> None:
    """common.proto: RejectionReason (each value's comment names its gRPC status code)."""
    from missionweave.kernel.errors import Rejected
    from missionweave_server.edge.status import grpc_code

    proto = (Path(__file__).parent.parent / "protos/missionweave/v1/common.proto").read_text()
    block = proto.split("enum RejectionReason {", 1)[1].split("\n}", 1)[0]
    code_names = "|".join(c.name for c in grpc.StatusCode)
    comment: list[str] = []
    checked = 0
    for line in block.splitlines():
        line = line.strip()
        if line.startswith("//"):
            comment.append(line[2:])
            continue
        value = re.match(r"(REJECTION_REASON_\w+) = \d+;", line)
        if value is None or value[1] == "REJECTION_REASON_UNSPECIFIED":
            continue
        named = set(re.findall(rf"(?<![A-Z_])({code_names})(?![A-Z_])", " ".join(comment)))
        comment = []
        code = grpc_code(Rejected(R.Value(value[1]), "x")).name
        assert code in named, (value[1], code, named)
        checked += 1
    assert checked == len(R.values()) - 1
    # UNKNOWN_IDENTITY names both: UNAUTHENTICATED for the signer, NOT_FOUND for a named identity.
    unknown = R.REJECTION_REASON_UNKNOWN_IDENTITY
    assert (grpc_code(Rejected(unknown, "x")), grpc_code(Rejected(unknown, "x", field="f"))) == (
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.NOT_FOUND,
    )


async def test_a_rejection_travels_as_rejection_and_error_info(world: World) -> None:
    """common.proto: RejectionReason ("each appears in a missionweave.v1.Rejection inside
    google.rpc.Status.details and as google.rpc.ErrorInfo.reason (without the REJECTION_REASON_
    prefix, domain missionweave.v1)"); Rejection.metadata is the same in both."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world.client.membership.GetIdentity(mpb.GetIdentityRequest(identity_id="nobody-bot"))
    status = rpc_status.from_call(info.value)  # type: ignore[arg-type]
    assert status is not None
    [rejection] = [d for d in status.details if d.Is(common_pb2.Rejection.DESCRIPTOR)]
    [error_info] = [d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    r, e = common_pb2.Rejection(), error_details_pb2.ErrorInfo()
    rejection.Unpack(r)
    error_info.Unpack(e)
    assert (e.reason, e.domain) == (
        "UNKNOWN_IDENTITY",
        "missionweave.v1",
    ) and r.reason == R.REJECTION_REASON_UNKNOWN_IDENTITY
    assert dict(e.metadata) == dict(r.metadata) == {"field": "identity_id"}


async def test_a_command_naming_an_unregistered_identity_is_not_found(world: World) -> None:
    """common.proto: REJECTION_REASON_UNKNOWN_IDENTITY ("another identity the request names ...
    NOT_FOUND"; the signer: UNAUTHENTICATED)."""
    w = world
    body = builders.mission_create("alice", "ghost-bot", w.clock.now())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await w.run(w.owner, G, "mission_create", body)
    r = rejection_from_rpc_error(info.value)
    assert r is not None and r.reason == R.REJECTION_REASON_UNKNOWN_IDENTITY and r.metadata["field"]
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    stranger = SessionSigner("mallory", 1, SigningKey.generate())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await w.client.execute(stranger.sign(stranger.command(G, "mission_create", body)))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_register_identity_request_id_is_an_idempotency_key_of_one_body(world: World) -> None:
    """membership_service.proto: RegisterIdentityCommand.request_id ("a retry with the same id and
    body returns the original result"): another body under it is COMMAND_ID_REUSED, none MALFORMED."""
    w = world
    first = register_identity_envelope("admin", w.keys["admin"], agent("eve-bot"), request_id="req_eve")
    registered = await w.client.membership.RegisterIdentity(mpb.RegisterIdentityRequest(command=first))
    again = await w.client.membership.RegisterIdentity(mpb.RegisterIdentityRequest(command=first))
    assert again.identity == registered.identity
    other = register_identity_envelope("admin", w.keys["admin"], agent("mallory-bot"), request_id="req_eve")
    r = await refusal(w.client.membership.RegisterIdentity(mpb.RegisterIdentityRequest(command=other)))
    assert r.reason == R.REJECTION_REASON_COMMAND_ID_REUSED
    r = await refusal(w.client.membership.GetIdentity(mpb.GetIdentityRequest(identity_id="mallory-bot")))
    assert r.reason == R.REJECTION_REASON_UNKNOWN_IDENTITY


async def test_organization_commands_are_refused_outside_the_replay_window(world: World) -> None:
    """membership_service.proto: RegisterIdentityCommand.issued_at and OpenSessionCommand.issued_at
    ("must be within the replay window"): CLOCK_SKEW, nothing registered or opened."""
    w = world
    stale = to_timestamp(w.clock.now() - timedelta(minutes=6))
    register = mpb.RegisterIdentityCommand(
        identity=agent("late-bot"), admin_id="admin", issued_at=stale, request_id="req_late"
    )
    envelope = sign_envelope(
        register.SerializeToString(), REGISTER_IDENTITY_TYPE, w.keys["admin"], "admin#identity"
    )
    r = await refusal(w.client.membership.RegisterIdentity(mpb.RegisterIdentityRequest(command=envelope)))
    assert r.reason == R.REJECTION_REASON_CLOCK_SKEW
    key = w.owner.key
    session = mpb.OpenSessionCommand(
        identity_id="alice", session_public_key=bytes(key.verify_key), issued_at=stale, nonce=b"n" * 16
    )
    envelope = sign_envelope(session.SerializeToString(), OPEN_SESSION_TYPE, key, "alice#identity")
    r = await refusal(w.client.membership.OpenSession(mpb.OpenSessionRequest(command=envelope)))
    assert r.reason == R.REJECTION_REASON_CLOCK_SKEW
    assert (await w.client.identity("alice")).session_epoch == w.owner.session_epoch


@pytest.mark.parametrize("nonce", [b"n" * 15, b"n" * 65])
async def test_open_session_nonce_and_key_sizes(world: World, nonce: bytes) -> None:
    """membership_service.proto: OpenSessionCommand.nonce ("16..64 bytes") and
    session_public_key ("32 bytes"): anything else is MALFORMED and opens nothing."""
    w = world
    key = w.owner.key
    for public_key, n in ((bytes(key.verify_key), nonce), (b"short", b"n" * 16)):
        command = mpb.OpenSessionCommand(
            identity_id="alice", session_public_key=public_key, issued_at=to_timestamp(w.clock.now()), nonce=n
        )
        envelope = sign_envelope(command.SerializeToString(), OPEN_SESSION_TYPE, key, "alice#identity")
        r = await refusal(w.client.membership.OpenSession(mpb.OpenSessionRequest(command=envelope)))
        assert r.reason == R.REJECTION_REASON_MALFORMED
    assert (await w.client.identity("alice")).session_epoch == w.owner.session_epoch
    # A valid request opens the next session.
    good = open_session_envelope("alice", key, bytes(key.verify_key))
    assert (await w.client.membership.OpenSession(mpb.OpenSessionRequest(command=good))).session.session_epoch


async def test_list_identities_page_size_bounds(world: World) -> None:
    """membership_service.proto: ListIdentitiesRequest.page_size ("1..1000, 0 means 100; more
    than 1000: INVALID_ARGUMENT, metadata field page_size, limit"); a response lists the page
    ordered by identity_id with an empty next_page_token on the last page."""
    w = world
    r = await refusal(w.client.membership.ListIdentities(mpb.ListIdentitiesRequest(page_size=1001)))
    assert (r.reason, r.metadata["field"], r.metadata["limit"]) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        "page_size",
        "1000",
    )
    every = await w.client.membership.ListIdentities(mpb.ListIdentitiesRequest())
    ids = [i.identity_id for i in every.identities]
    assert ids == sorted(ids) and len(ids) == 4 and not every.next_page_token
    await asyncio.gather(
        *(
            w.client.register_identity(
                "admin", w.keys["admin"], f"bulk-{i:03}", common_pb2.IDENTITY_KIND_AGENT, bytes(32)
            )
            for i in range(97)
        )
    )
    first = await w.client.membership.ListIdentities(mpb.ListIdentitiesRequest())  # 0 means 100
    assert len(first.identities) == 100 and first.next_page_token
    rest = await w.client.membership.ListIdentities(
        mpb.ListIdentitiesRequest(page_token=first.next_page_token)
    )
    assert len(rest.identities) == 1 and not rest.next_page_token


async def test_list_memberships_needs_the_group_and_lists_ended_memberships_too(world: World) -> None:
    """membership_service.proto: ListMemberships (a Group's memberships, ended ones included,
    for operators and active members only; group_id required, member_id alone
    COMMAND_NOT_IMPLEMENTED, neither MALFORMED field group_id)."""
    w = world
    await create(w)
    await as_member(w, G, w.worker)
    revoke = membership_pb2.MembershipRevoke(member_id="worker-bot", reason="done")
    await w.run(w.owner, G, "membership_revoke", revoke, membership_epoch=1)
    listing = mpb.ListMembershipsRequest
    listed = await w.client.membership.ListMemberships(listing(group_id=G))
    assert {(m.member_id, m.active) for m in listed.memberships} == {
        ("alice", True),
        ("coord-bot", True),
        ("worker-bot", False),
    }
    r = await refusal(w.client.membership.ListMemberships(listing()))
    assert (r.reason, r.metadata["field"]) == (R.REJECTION_REASON_MALFORMED, "group_id")
    r = await refusal(w.client.membership.ListMemberships(listing(member_id="alice")))
    assert r.reason == R.REJECTION_REASON_COMMAND_NOT_IMPLEMENTED
    async with MeshClient(w.target, reader=w.worker) as ended:  # its Membership ended: no longer a reader
        r = await refusal(ended.membership.ListMemberships(listing(group_id=G)))
        assert r.reason == R.REJECTION_REASON_NOT_A_MEMBER
        r = await refusal(ended.membership.ListMemberships(listing(group_id="grp_missing")))
        assert r.reason == R.REJECTION_REASON_NOT_A_MEMBER  # a non-operator learns nothing of missing Groups
    async with MeshClient(w.target, reader=w.coordinator) as member:
        mine = await member.membership.ListMemberships(listing(group_id=G, member_id="coord-bot"))
        assert [m.member_id for m in mine.memberships] == ["coord-bot"]


async def test_agent_card_versions_of_nobody_are_none_and_tokens_are_the_lists_own(world: World) -> None:
    """membership_service.proto: ListAgentCardVersionsResponse.versions ("an agent that published
    none (or is not registered) has none") and ListAgentCardVersionsRequest.page_token ("one this
    list did not issue: INVALID_ARGUMENT, metadata field page_token"), as ListIdentities'."""
    w = world
    for agent_id in ("worker-bot", "nobody-bot"):
        listed = await w.client.membership.ListAgentCardVersions(
            mpb.ListAgentCardVersionsRequest(agent_id=agent_id)
        )
        assert not listed.versions and not listed.next_page_token
    identities = await w.client.membership.ListIdentities(mpb.ListIdentitiesRequest(page_size=1))
    for token in (identities.next_page_token, "7"):
        r = await refusal(
            w.client.membership.ListAgentCardVersions(
                mpb.ListAgentCardVersionsRequest(agent_id="worker-bot", page_token=token)
            )
        )
        assert (r.reason, r.metadata["field"]) == (R.REJECTION_REASON_INVALID_ARGUMENT, "page_token")


# ------------------------------------------------------------------ scheduling_service.proto


async def test_set_priority_zero_values_leave_things_unchanged(world: World) -> None:
    """scheduling_service.proto: SetPriorityRequest.priority_class ("UNSPECIFIED = unchanged"),
    group_weight ("0 = unchanged"), work_item_id ("empty = change the Group's weight only"),
    requested_by ("the identity asking": another is PERMISSION_DENIED, field requested_by), an
    unknown class INVALID_ARGUMENT, a WorkItem not queued there NOT_FOUND."""
    w = world
    scheds = Schedulers(w)
    try:
        flow = await setup(w)
        await flow.authorize("wi-1")
        await flow.accept(w.worker, "wi-1", await flow.offer("wi-1", "worker-bot"))
        owner = sp.SetPriorityRequest(
            group_id=G,
            work_item_id="wi-1",
            priority_class=sp.PRIORITY_CLASS_ELEVATED,
            source=sp.PRIORITY_SOURCE_MISSION_OWNER,
            worker_id="worker-bot",
        )
        await scheds["owner"].SetPriority(owner)
        weight = sp.SetPriorityRequest(group_id=G, group_weight=3, source=sp.PRIORITY_SOURCE_WORKER_OPERATOR)
        assert (await scheds["worker"].SetPriority(weight)).queue.weight == 3
        owner.priority_class = sp.PRIORITY_CLASS_UNSPECIFIED
        [entry] = (await scheds["owner"].SetPriority(owner)).queue.entries
        assert entry.ordering.priority_class == sp.PRIORITY_CLASS_ELEVATED
        weight.group_weight = 0  # and no WorkItem: nothing changes
        unchanged = (await scheds["worker"].SetPriority(weight)).queue
        assert (
            unchanged.weight == 3
            and unchanged.entries[0].ordering.priority_class == sp.PRIORITY_CLASS_ELEVATED
        )
        for bad, reason, field in (
            ({"requested_by": "coord-bot"}, R.REJECTION_REASON_PERMISSION_DENIED, "requested_by"),
            (
                {"work_item_id": "wi-nope", "priority_class": sp.PRIORITY_CLASS_URGENT},
                R.REJECTION_REASON_NOT_FOUND,
                "work_item_id",
            ),
            ({"priority_class": 99}, R.REJECTION_REASON_INVALID_ARGUMENT, "priority_class"),
            ({"group_id": ""}, R.REJECTION_REASON_INVALID_ARGUMENT, "group_id"),
        ):
            request = sp.SetPriorityRequest()
            request.CopyFrom(owner)
            for name, value in bad.items():
                setattr(request, name, value)
            r = await refusal(scheds["owner"].SetPriority(request))
            assert (r.reason, r.metadata.get("field")) == (reason, field), (bad, r)
    finally:
        await scheds.close()


async def test_slots_a_named_slot_and_release_refusals(world: World) -> None:
    """scheduling_service.proto: NextSlotRequest.slot_id ("a specific free slot to fill": one not
    free, or unknown, gets no assignment), NextSlotResponse.free_slots / total_slots,
    ReleaseSlotRequest.ended_at_sequence ("not placed again before the scheduler has read the
    Group past it") and ReleaseSlot of a
    slot that does not hold the WorkItem (NOT_FOUND, field slot_id); required fields are
    INVALID_ARGUMENT naming the field (SchedulingService)."""
    w = world
    scheds = Schedulers(w)
    try:
        flow = await setup(w)
        await flow.authorize("wi-1")
        await flow.accept(w.worker, "wi-1", await flow.offer("wi-1", "worker-bot"))
        s = scheds["worker"]
        await s.GetQueue(sp.GetQueueRequest(group_id=G))  # the scheduler follows G from here
        unknown = await s.NextSlot(sp.NextSlotRequest(slot_id="slot-nope"))
        assert not unknown.HasField("assignment") and (unknown.free_slots, unknown.total_slots) == (1, 1)
        placed = await s.NextSlot(sp.NextSlotRequest())
        slot = placed.assignment.slot_id
        assert placed.assignment.work_item_id == "wi-1" and placed.free_slots == 0
        busy = await s.NextSlot(sp.NextSlotRequest(slot_id=slot))
        assert not busy.HasField("assignment") and busy.free_slots == 0
        for request, reason, field in (
            (
                sp.ReleaseSlotRequest(slot_id=slot, work_item_id="wi-other"),
                R.REJECTION_REASON_NOT_FOUND,
                "slot_id",
            ),
            (
                sp.ReleaseSlotRequest(slot_id="slot-nope", work_item_id="wi-1"),
                R.REJECTION_REASON_NOT_FOUND,
                "slot_id",
            ),
            (sp.ReleaseSlotRequest(work_item_id="wi-1"), R.REJECTION_REASON_INVALID_ARGUMENT, "slot_id"),
        ):
            r = await refusal(s.ReleaseSlot(request))
            assert (r.reason, r.metadata.get("field")) == (reason, field), (request, r)
        # The placement ended with an event the scheduler has not read yet: not placed again before.
        head = (await w.client.group_state(G)).head_sequence
        released = sp.ReleaseSlotRequest(
            slot_id=slot,
            work_item_id="wi-1",
            reason=sp.SLOT_RELEASE_REASON_FAILED,
            ended_at_sequence=head + 100,
        )
        assert (await s.ReleaseSlot(released)).free_slots == 1
        after = await s.NextSlot(sp.NextSlotRequest())
        assert not after.HasField("assignment") and after.free_slots == 1
        for call, field in (
            (s.GetQueue(sp.GetQueueRequest()), "group_id"),
            (s.Admit(sp.AdmitRequest(group_id=G)), "work_item_id"),
            (s.DiscloseSchedule(sp.DiscloseScheduleRequest(group_id=G)), "work_item_id"),
        ):
            r = await refusal(call)
            assert (r.reason, r.metadata.get("field")) == (R.REJECTION_REASON_INVALID_ARGUMENT, field)
    finally:
        await scheds.close()


# ------------------------------------------------------------------ conversation.proto


async def test_message_ids_and_content_limits(world: World) -> None:
    """conversation.proto: MessagePost.message_id (client-chosen, or derived by the Authority from
    the Group and command id when empty) and MessageContent's limits and rules: text and
    data_json at most 16 KiB (TOO_LARGE with field, limit), data_json a JSON object, at most 32
    artifact references and 32 mentions, mentions of Group members, some content required."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    owner = {"membership_epoch": 1}
    derived = [
        decode_events(
            (await w.run(w.owner, G, "message_post", builders.message(conv, f"m{i}"), **owner)).events
        )[0]
        for i in range(2)
    ]
    ids = [e.message_posted.message_id for e in derived]
    assert all(re.fullmatch(r"msg_[0-9a-f]{26}", i) for i in ids) and ids[0] != ids[1]
    chosen = builders.message(conv, "mine")
    chosen.message_id = "msg_chosen"
    assert (
        decode_events((await w.run(w.owner, G, "message_post", chosen, **owner)).events)[
            0
        ].message_posted.message_id
        == "msg_chosen"
    )
    reused = await refused(
        w, w.owner, G, "message_post", chosen, R.REJECTION_REASON_INVALID_ARGUMENT, **owner
    )
    assert reused.metadata["field"] == "body.message_post.message_id"
    ref = builders.artifact()
    content = "body.message_post.content"
    for fields, reason, field in (
        (
            {"data_json": '{"k": "' + "v" * 16 * 1024 + '"}'},
            R.REJECTION_REASON_TOO_LARGE,
            f"{content}.data_json",
        ),
        ({"data_json": "[1, 2]"}, R.REJECTION_REASON_INVALID_ARGUMENT, f"{content}.data_json"),
        ({"data_json": "{not json"}, R.REJECTION_REASON_MALFORMED, f"{content}.data_json"),
        ({"artifacts": [ref] * 33}, R.REJECTION_REASON_TOO_LARGE, None),
        ({"mentions": ["alice"] * 33}, R.REJECTION_REASON_TOO_LARGE, None),
        ({"mentions": ["nobody-bot"]}, R.REJECTION_REASON_INVALID_ARGUMENT, f"{content}.mentions[0]"),
    ):
        r = await refused(
            w, w.owner, G, "message_post", builders.message(conv, "x", **fields), reason, **owner
        )
        assert r.metadata.get("field") == field, (fields, r)
    r = await refused(
        w,
        w.owner,
        G,
        "message_post",
        builders.message(conv, "x" * (16 * 1024 + 1)),
        R.REJECTION_REASON_TOO_LARGE,
        **owner,
    )
    assert (r.metadata["field"], r.metadata["limit"]) == (f"{content}.text", str(16 * 1024))
    await refused(
        w,
        w.owner,
        G,
        "message_post",
        builders.message(conv, ""),
        R.REJECTION_REASON_INVALID_ARGUMENT,
        **owner,
    )
    at_limits = builders.message(conv, "é" * (8 * 1024), artifacts=[ref] * 32, mentions=["alice"] * 32)
    await w.run(w.owner, G, "message_post", at_limits, **owner)


async def test_conversation_open_ids_titles_and_links(world: World) -> None:
    """conversation.proto: ConversationOpen.conversation_id ("empty = derived from the command
    id"; a used one refused), title ("1..200 characters"), linked_conversation_id (an unknown
    one is NOT_FOUND), kind (REVIEW or RESTRICTED only; WORK_ITEM refused too)."""
    w = world
    planning = (await create(w)).mission.planning_conversation_id
    owner = {"membership_epoch": 1}
    review = conversation_pb2.ConversationOpen(
        kind=conversation_pb2.CONVERSATION_KIND_REVIEW, title="t" * 200, linked_conversation_id=planning
    )
    opened = decode_events((await w.run(w.owner, G, "conversation_open", review, **owner)).events)[
        0
    ].conversation_opened
    assert (
        re.fullmatch(r"conv_[0-9a-f]{26}", opened.conversation_id)
        and opened.linked_conversation_id == planning
    )
    for bad, reason in (
        ({"title": ""}, R.REJECTION_REASON_INVALID_ARGUMENT),
        ({"title": "t" * 201}, R.REJECTION_REASON_INVALID_ARGUMENT),
        ({"conversation_id": opened.conversation_id}, R.REJECTION_REASON_INVALID_ARGUMENT),
        ({"conversation_id": planning}, R.REJECTION_REASON_INVALID_ARGUMENT),
        ({"linked_conversation_id": "conv_nope"}, R.REJECTION_REASON_NOT_FOUND),
        ({"kind": conversation_pb2.CONVERSATION_KIND_WORK_ITEM}, R.REJECTION_REASON_INVALID_ARGUMENT),
    ):
        body = conversation_pb2.ConversationOpen()
        body.CopyFrom(review)
        for name, value in bad.items():
            setattr(body, name, value)
        await refused(w, w.owner, G, "conversation_open", body, reason, **owner)


async def test_ids_are_1_to_128_characters_of_the_id_alphabet(world: World) -> None:
    """common.proto: the id convention ("every id is 1..128 characters of [A-Za-z0-9._:-]"), for a
    client-chosen Group id and Conversation id."""
    w = world
    longest = "g" * 120 + "._:-AZ09"
    assert len(longest) == 128
    await w.run(
        w.owner, longest, "mission_create", builders.mission_create("alice", "coord-bot", w.clock.now())
    )
    for bad in ("g" * 129, "grp bad", "grp/../x", "grp_é"):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await w.run(
                w.owner, bad, "mission_create", builders.mission_create("alice", "coord-bot", w.clock.now())
            )
        r = rejection_from_rpc_error(info.value)
        assert r is not None and info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (bad, r)
    for conversation_id, ok in (("c" * 128, True), ("c" * 129, False)):
        body = conversation_pb2.ConversationOpen(
            conversation_id=conversation_id, kind=conversation_pb2.CONVERSATION_KIND_REVIEW, title="t"
        )
        if ok:
            await w.run(w.owner, longest, "conversation_open", body, membership_epoch=1)
        else:
            await refused(
                w,
                w.owner,
                longest,
                "conversation_open",
                body,
                R.REJECTION_REASON_INVALID_ARGUMENT,
                membership_epoch=1,
            )


async def test_agent_card_version_and_extension_length_bounds(world: World) -> None:
    """agent_card.proto: AgentCard.card_version ("at most 64 characters": longer is MALFORMED)
    and extensions ("at most 256 characters each": TOO_LARGE naming the entry); at the bounds
    the card is published."""
    from tests.test_agent_cards import card, request

    w = world
    version = "1.0.0-" + "a" * 58
    urn = "urn:x:" + "e" * 250
    assert (len(version), len(urn)) == (64, 256)
    async with MeshClient(w.target, reader=w.worker) as worker:
        for c, reason, field in (
            (card("worker-bot", version + "b"), R.REJECTION_REASON_MALFORMED, "card.card_version"),
            (
                card("worker-bot", version, extensions=[urn + "e"]),
                R.REJECTION_REASON_TOO_LARGE,
                "card.extensions[0]",
            ),
        ):
            r = await refusal(worker.membership.PublishAgentCard(request(w.worker, c)))
            assert (r.reason, r.metadata.get("field")) == (reason, field), r
        published = await worker.membership.PublishAgentCard(
            request(w.worker, card("worker-bot", version, extensions=[urn]))
        )
        assert published.published.card.card_version == version


async def test_queue_entries_come_in_group_order_and_reorder_at_once(world: World) -> None:
    """scheduling_service.proto: GroupQueue.entries ("in this Group's order"),
    QueueEntry.group_position ("1 = next") and SetPriority ("queued work is reordered
    immediately", SetPriorityResponse.queue)."""
    w = world
    scheds = Schedulers(w)
    try:
        flow = await setup(w)
        for wid in ("wi-1", "wi-2"):
            await flow.authorize(wid)
            await flow.accept(w.worker, wid, await flow.offer(wid, "worker-bot"))
        queue = (await scheds["worker"].GetQueue(sp.GetQueueRequest(group_id=G))).queue
        assert [(e.work_item_id, e.group_position) for e in queue.entries] == [("wi-1", 1), ("wi-2", 2)]
        escalate = sp.SetPriorityRequest(
            group_id=G,
            work_item_id="wi-2",
            priority_class=sp.PRIORITY_CLASS_URGENT,
            source=sp.PRIORITY_SOURCE_MISSION_OWNER,
            worker_id="worker-bot",
        )
        changed = (await scheds["owner"].SetPriority(escalate)).queue
        assert [(e.work_item_id, e.group_position) for e in changed.entries] == [("wi-2", 1), ("wi-1", 2)]
        later = (await scheds["worker"].GetQueue(sp.GetQueueRequest(group_id=G))).queue
        assert [e.work_item_id for e in later.entries] == ["wi-2", "wi-1"]
    finally:
        await scheds.close()
