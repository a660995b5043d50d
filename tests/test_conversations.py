"""Conversations and Messages (spec 9, MW-9.1-19..22) through the public gRPC API."""

from __future__ import annotations

import pytest

from missionweave.sdk.client import decode_events
from missionweave.v1 import common_pb2, conversation_pb2, membership_pb2
from tests import builders
from tests.conftest import World
from tests.test_missions import G, as_member, create, refused

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

R = common_pb2.RejectionReason
CK = conversation_pb2.ConversationKind
AK = conversation_pb2.MessageAmendmentKind


async def planning(w: World) -> str:
    return (await create(w)).mission.planning_conversation_id


@pytest.mark.req("MW-9-03", "MW-9-04", "MW-9-05")
async def test_restricted_conversation_is_open_to_participants_owner_and_coordinator_only(
    world: World,
) -> None:
    w = world
    await planning(w)
    await as_member(w, G, w.worker)
    await w.client.register_identity(
        "admin", w.keys["admin"], "reviewer-bot", common_pb2.IDENTITY_KIND_AGENT, bytes(32)
    )
    opened = conversation_pb2.ConversationOpen(
        conversation_id="conv_secret",
        kind=CK.CONVERSATION_KIND_RESTRICTED,
        title="credentials",
        participant_ids=["worker-bot"],
    )
    # Only the owner or the Coordinator open one; a worker cannot.
    await refused(
        w, w.worker, G, "conversation_open", opened, R.REJECTION_REASON_PERMISSION_DENIED, membership_epoch=3
    )
    result = await w.run(w.coordinator, G, "conversation_open", opened, membership_epoch=2)
    event = decode_events(result.events)[0]
    assert event.group_id == G and list(event.conversation_opened.participant_ids) == [
        "worker-bot"
    ]  # MW-9-04
    for signer, epoch in ((w.owner, 1), (w.coordinator, 2), (w.worker, 3)):  # MW-9-05 + participant
        await w.run(
            signer,
            G,
            "message_post",
            builders.message("conv_secret", f"from {signer.identity_id}"),
            membership_epoch=epoch,
        )
    review = conversation_pb2.ConversationOpen(
        conversation_id="conv_review", kind=CK.CONVERSATION_KIND_REVIEW, title="review"
    )
    await w.run(w.owner, G, "conversation_open", review, membership_epoch=1)
    # A member who is not a participant may not post in the restricted one.
    await w.client.register_identity(
        "admin", w.keys["admin"], "observer", common_pb2.IDENTITY_KIND_AGENT, bytes(w.worker.key.verify_key)
    )
    observer = await w.client.open_session("observer", w.worker.key)
    grant = membership_pb2.MembershipGrant(member_id="observer", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    epoch = await w.epoch_of(G, "observer")
    await refused(
        w,
        observer,
        G,
        "message_post",
        builders.message("conv_secret", "let me in"),
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=epoch,
    )
    await w.run(
        observer, G, "message_post", builders.message("conv_review", "looks fine"), membership_epoch=epoch
    )
    state = await w.client.group_state(G)
    summary = {c.conversation_id: c for c in state.conversations}
    assert summary["conv_secret"].message_count == 3 and summary["conv_review"].message_count == 1


@pytest.mark.req("MW-9-03")
async def test_conversation_open_refusals(world: World) -> None:
    w = world
    await planning(w)
    planning_kind = conversation_pb2.ConversationOpen(
        kind=CK.CONVERSATION_KIND_PLANNING, title="second planning"
    )
    await refused(
        w,
        w.owner,
        G,
        "conversation_open",
        planning_kind,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=1,
    )
    stranger = conversation_pb2.ConversationOpen(
        kind=CK.CONVERSATION_KIND_RESTRICTED, title="x", participant_ids=["nobody"]
    )
    await refused(
        w, w.owner, G, "conversation_open", stranger, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=1
    )
    review_with_people = conversation_pb2.ConversationOpen(
        kind=CK.CONVERSATION_KIND_REVIEW, title="x", participant_ids=["worker-bot"]
    )
    await refused(
        w,
        w.owner,
        G,
        "conversation_open",
        review_with_people,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=1,
    )


@pytest.mark.req("MW-9.1-19", "MW-9.1-20", "MW-9.1-21", "MW-9.1-22", "MW-7.4-04", "MW-7.4-05")
async def test_amendments_append_events_citing_the_original_which_stays_unchanged(world: World) -> None:
    w = world
    conv = await planning(w)
    posted = await w.run(
        w.coordinator, G, "message_post", builders.message(conv, "budget is 5k"), membership_epoch=2
    )
    original = decode_events(posted.events)[0]
    message_id = original.message_posted.message_id
    fix = conversation_pb2.MessageAmend(
        message_id=message_id,
        kind=AK.MESSAGE_AMENDMENT_KIND_CORRECTION,
        corrected_content=conversation_pb2.MessageContent(text="budget is 50k"),
    )
    # Only the author corrects.
    await refused(
        w, w.owner, G, "message_amend", fix, R.REJECTION_REASON_PERMISSION_DENIED, membership_epoch=1
    )
    corrected = decode_events(
        (await w.run(w.coordinator, G, "message_amend", fix, membership_epoch=2)).events
    )[0]
    assert corrected.type == "message.amended" and corrected.message_amended.message_id == message_id
    # A redaction needs an auditable policy reason (MW-9.1-21).
    redact = conversation_pb2.MessageAmend(message_id=message_id, kind=AK.MESSAGE_AMENDMENT_KIND_REDACTION)
    await refused(
        w, w.owner, G, "message_amend", redact, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=1
    )
    redact.policy_reason = "contains a customer name"
    await w.run(w.owner, G, "message_amend", redact, membership_epoch=1)
    # Once redacted, it is not corrected again.
    await refused(
        w, w.coordinator, G, "message_amend", fix, R.REJECTION_REASON_INVALID_TRANSITION, membership_epoch=2
    )
    # The chain is intact: the original event is byte-for-byte what was accepted (MW-9.1-19/22).
    events = [e async for e in w.client.read_events(G)]
    first = next(
        e for e in events if e.type == "message.posted" and e.message_posted.message_id == message_id
    )
    assert (
        first.SerializeToString() == original.SerializeToString()
        and first.message_posted.content.text == "budget is 5k"
    )
    chain = [e.message_amended.kind for e in events if e.type == "message.amended"]
    assert chain == [AK.MESSAGE_AMENDMENT_KIND_CORRECTION, AK.MESSAGE_AMENDMENT_KIND_REDACTION]


@pytest.mark.req("MW-9.1-20")
async def test_amending_a_missing_message_or_retracting_twice_is_refused(world: World) -> None:
    w = world
    conv = await planning(w)
    ghost = conversation_pb2.MessageAmend(message_id="msg_ghost", kind=AK.MESSAGE_AMENDMENT_KIND_RETRACTION)
    await refused(w, w.owner, G, "message_amend", ghost, R.REJECTION_REASON_NOT_FOUND, membership_epoch=1)
    posted = await w.run(w.owner, G, "message_post", builders.message(conv, "oops"), membership_epoch=1)
    retract = conversation_pb2.MessageAmend(
        message_id=decode_events(posted.events)[0].message_posted.message_id,
        kind=AK.MESSAGE_AMENDMENT_KIND_RETRACTION,
    )
    await w.run(w.owner, G, "message_amend", retract, membership_epoch=1)
    await refused(
        w, w.owner, G, "message_amend", retract, R.REJECTION_REASON_INVALID_TRANSITION, membership_epoch=1
    )


@pytest.mark.req("MW-9-09", "MW-9-10", "MW-9-13")
async def test_messages_carry_no_authority_and_large_content_points_to_the_artifact_store(
    world: World,
) -> None:
    w = world
    conv = await planning(w)
    await as_member(w, G, w.worker)
    posted = await w.run(
        w.worker, G, "message_post", builders.message(conv, "please deploy now"), membership_epoch=3
    )
    assert decode_events(posted.events)[0].message_posted.authority is False
    rejection = await refused(
        w,
        w.worker,
        G,
        "message_post",
        builders.message(conv, "x" * 20_000),
        R.REJECTION_REASON_TOO_LARGE,
        membership_epoch=3,
    )
    assert "artifact" in rejection.message.lower()
