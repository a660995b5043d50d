"""Security redaction and legal deletion (MW-7.4-04/05): a tombstone is appended, the content leaves
stored history (online and archive tiers), and no event id or sequence changes."""

from __future__ import annotations

import blake3
import pytest
from sqlalchemy import select

from missionweave.kernel.signing import verify_signature
from missionweave.sdk.client import decode_events
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import common_pb2, conversation_pb2
from missionweave_server.services.authority.schema import events, events_archive
from tests import builders
from tests.conftest import World
from tests.test_missions import G, create, refused

R = common_pb2.RejectionReason
AK = conversation_pb2.MessageAmendmentKind
CE = conversation_pb2.ContentErasure
SECRET = "hunter2-the-password"


def erase(
    message_id: str,
    erasure: int = CE.CONTENT_ERASURE_LEGAL_DELETION,
    reason: str = "GDPR art. 17 request #41",
) -> conversation_pb2.MessageAmend:
    return conversation_pb2.MessageAmend(
        message_id=message_id,
        kind=AK.MESSAGE_AMENDMENT_KIND_REDACTION,
        erasure=erasure,
        policy_reason=reason,  # type: ignore[arg-type]
    )


async def stored_envelopes(w: World) -> dict[int, bytes]:
    async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
        rows = []
        for tier in (events, events_archive):
            rows += (
                await conn.execute(select(tier.c.seq, tier.c.envelope).where(tier.c.group_id == G))
            ).all()
    return {int(seq): bytes(env) for seq, env in rows}


async def audit_log(w: World) -> list[common_pb2.SignedEnvelope]:
    return [
        e async for r in w.client.authority.ReadEvents(apb.ReadEventsRequest(group_id=G)) for e in r.events
    ]


@pytest.mark.req("MW-7.4-04", "MW-7.4-05", "MW-7.4-01")
async def test_an_erasure_appends_a_tombstone_and_removes_the_content_from_both_tiers(world: World) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    posted = decode_events(
        (
            await w.run(w.coordinator, G, "message_post", builders.message(conv, SECRET), membership_epoch=2)
        ).events
    )[0]
    fix = conversation_pb2.MessageAmend(
        message_id=posted.message_posted.message_id,
        kind=AK.MESSAGE_AMENDMENT_KIND_CORRECTION,
        corrected_content=conversation_pb2.MessageContent(text=SECRET + " (corrected)"),
    )
    corrected = decode_events(
        (await w.run(w.coordinator, G, "message_amend", fix, membership_epoch=2)).events
    )[0]
    await w.client.authority.TakeSnapshot(
        apb.TakeSnapshotRequest(group_id=G, compact=True)
    )  # both now archived
    later = decode_events(
        (
            await w.run(
                w.owner, G, "message_post", builders.message(conv, SECRET + " again"), membership_epoch=1
            )
        ).events
    )[0]
    before = await stored_envelopes(w)
    identities = [(e.sequence, e.event_id, e.type) for e in decode_events(await audit_log(w))]

    tombstones = []
    for target in (posted, later):
        result = await w.run(
            w.owner, G, "message_amend", erase(target.message_posted.message_id), membership_epoch=1
        )
        tombstones.append(decode_events(result.events)[0])
    first, second = tombstones
    assert (
        first.type == "message.amended" and first.message_amended.erasure == CE.CONTENT_ERASURE_LEGAL_DELETION
    )
    assert list(first.message_amended.erased_sequences) == [posted.sequence, corrected.sequence]
    assert list(second.message_amended.erased_sequences) == [later.sequence]
    assert first.message_amended.policy_reason  # auditable: who (actor), when, why

    after = await stored_envelopes(w)
    assert all(SECRET.encode() not in envelope for envelope in after.values())  # gone from both tiers
    log = await audit_log(w)
    # MW-7.4-05: the same ids and sequences, only the tombstones appended after them.
    assert [(e.sequence, e.event_id, e.type) for e in decode_events(log)][: len(identities)] == identities
    _, authority_key = await w.client.authority_key()
    erased = {posted.sequence: first, corrected.sequence: first, later.sequence: second}
    for envelope, event in zip(log, decode_events(log), strict=True):
        assert verify_signature(envelope, authority_key)
        if event.sequence in erased:
            marker = event.redaction
            assert marker.tombstone_event_id == erased[event.sequence].event_id
            assert marker.tombstone_sequence == erased[event.sequence].sequence
            assert marker.original_envelope_digest.hex == blake3.blake3(before[event.sequence]).hexdigest()
            assert not event.message_posted.HasField("content") and not event.message_amended.HasField(
                "corrected_content"
            )
        else:
            assert not event.HasField("redaction") and after[event.sequence] == before.get(
                event.sequence, after[event.sequence]
            )
    # The Group's state is what it was: replaying the rewritten log gives the live state.
    authority = w.mesh.authority  # type: ignore[attr-defined]
    assert await authority.fold(G) == await authority.state(G)


@pytest.mark.req("MW-7.4-04")
async def test_erasure_refusals_write_nothing(world: World) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    posted = decode_events(
        (
            await w.run(w.coordinator, G, "message_post", builders.message(conv, SECRET), membership_epoch=2)
        ).events
    )[0]
    message_id = posted.message_posted.message_id
    # Only the MissionOwner (or Organization policy) erases; not the author, not the Coordinator.
    await refused(
        w,
        w.coordinator,
        G,
        "message_amend",
        erase(message_id),
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=2,
    )
    await refused(
        w,
        w.owner,
        G,
        "message_amend",
        erase(message_id, reason=" "),
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=1,
    )
    correction = erase(message_id)
    correction.kind = AK.MESSAGE_AMENDMENT_KIND_CORRECTION
    await refused(
        w, w.owner, G, "message_amend", correction, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=1
    )
    unknown = erase(message_id)
    unknown.erasure = 7  # type: ignore[assignment]
    await refused(
        w, w.owner, G, "message_amend", unknown, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=1
    )
    # A masking redaction first, then the erasure: allowed, the content was still in the log.
    mask = conversation_pb2.MessageAmend(
        message_id=message_id, kind=AK.MESSAGE_AMENDMENT_KIND_REDACTION, policy_reason="leaked secret"
    )
    await w.run(w.owner, G, "message_amend", mask, membership_epoch=1)
    await w.run(
        w.owner,
        G,
        "message_amend",
        erase(message_id, CE.CONTENT_ERASURE_SECURITY_REDACTION),
        membership_epoch=1,
    )
    await refused(
        w,
        w.owner,
        G,
        "message_amend",
        erase(message_id),
        R.REJECTION_REASON_INVALID_TRANSITION,
        membership_epoch=1,
    )


@pytest.mark.req("MW-7.4-04")
async def test_after_an_erasure_the_gateway_replays_the_erased_copies(world: World) -> None:
    """Subscribers replaying after an erasure get the rewritten events, never a copy kept in memory."""
    from missionweave.v1 import gateway_service_pb2 as gpb
    from tests.test_gateway import connected

    w = world
    conv = (await create(w)).mission.planning_conversation_id
    posted = decode_events(
        (
            await w.run(w.coordinator, G, "message_post", builders.message(conv, SECRET), membership_epoch=2)
        ).events
    )[0]
    live = await connected(w, w.owner)  # a follower that has seen the original
    await live.send(subscribe=gpb.SubscribeFrame(subscription_id="live", group_id=G, initial_credits=1_000))
    assert SECRET.encode() in b"".join(e.payload for e in (await live.until("event")).event.events)
    await w.run(w.owner, G, "message_amend", erase(posted.message_posted.message_id), membership_epoch=1)
    again = await connected(w, w.owner)
    await again.send(
        subscribe=gpb.SubscribeFrame(subscription_id="replay", group_id=G, initial_credits=1_000)
    )
    replayed = (await again.until("event")).event
    assert replayed.first_sequence == 1 and posted.sequence <= replayed.last_sequence
    assert all(SECRET.encode() not in e.payload for e in replayed.events)
