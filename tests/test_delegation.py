"""Delegation grants and just-in-time Worker Memberships end to end (spec 9.1, MW-8-06), over the
public gRPC API and the gateway, in both topologies. The rules themselves are tested on the pure
core (tests/test_core_delegation*.py, tests/test_core_jit_membership.py)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.sdk.client import MeshClient, SessionSigner, decode_events
from missionweave.v1 import authority_service_pb2, common_pb2, membership_pb2
from missionweave.v1 import gateway_service_pb2 as gpb
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.conftest import World, register
from tests.test_gateway import Stream, connected
from tests.test_missions import G, refused
from tests.test_work_items import Flow, setup

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

R = common_pb2.RejectionReason
Role = membership_pb2.MemberRole


async def lead_of(w: World) -> SessionSigner:
    lead = await register(w.client, w.keys["admin"], "lead-bot", common_pb2.IDENTITY_KIND_AGENT)
    grant = membership_pb2.MembershipGrant(member_id="lead-bot", role=Role.MEMBER_ROLE_WORK_DELEGATE)
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    return lead


def grant_body(w: World, **caps: int) -> membership_pb2.MembershipGrantDelegation:
    limits = {"currency": "EUR", "financial_micros": 3_000_000, "tokens": 25_000, "tool_calls": 150, **caps}
    return membership_pb2.MembershipGrantDelegation(
        grantee_id="lead-bot",
        target_work_item_id="root",
        allowed_capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.0")],
        caps=common_pb2.ResourceVector(**limits),  # type: ignore[arg-type]
        max_descendant_depth=2,
        expires_at=to_timestamp(w.clock.now() + timedelta(hours=1)),
        coordinator_epoch=1,
    )


def delegated(
    w: World, work_item_id: str, parent: str, grant_id: str, tokens: int = 10_000
) -> wp.WorkAuthorize:
    contract = builders.contract(w.clock.now())
    contract.budget.tokens = tokens
    return wp.WorkAuthorize(
        work_item_id=work_item_id,
        title=work_item_id,
        contract=contract,
        parent_work_item_id=parent,
        grant_id=grant_id,
    )


async def via_gateway(
    w: World, stream: Stream, signer: SessionSigner, kind: str, body: Any
) -> gpb.ResultFrame:
    """A COMMAND frame on ``stream``, as ``signer`` at its current Membership epoch, and its RESULT."""
    command = w.command(signer, G, kind, body, membership_epoch=await w.epoch_of(G, signer.identity_id))
    await stream.send(command=gpb.CommandFrame(command_id=command.command_id, command=signer.sign(command)))
    answer = (await stream.until("result")).result
    assert answer.command_id == command.command_id
    return answer


async def accepted_via_gateway(
    w: World, stream: Stream, signer: SessionSigner, kind: str, body: Any
) -> list[Any]:
    answer = await via_gateway(w, stream, signer, kind, body)
    assert answer.HasField("result"), answer.rejection
    return decode_events(answer.result.events)


async def refused_via_gateway(
    w: World, stream: Stream, signer: SessionSigner, kind: str, body: Any, reason: int
) -> common_pb2.Rejection:
    """Refused with ``reason``, and nothing written (the Group's head stays where it was)."""
    head = (await w.client.group_state(G)).head_sequence
    answer = await via_gateway(w, stream, signer, kind, body)
    assert answer.HasField("rejection") and R.Name(answer.rejection.reason) == R.Name(reason), answer
    assert (await w.client.group_state(G)).head_sequence == head
    return answer.rejection


async def grants(client: MeshClient) -> dict[str, authority_service_pb2.DelegationGrantStatus]:
    return {g.grant.grant_id: g for g in (await client.group_state(G)).grants}


@pytest.mark.req("MW-9.1-03", "MW-9.1-05", "MW-9.1-06", "MW-9.1-08", "MW-9.1-09", "MW-9.1-11", "MW-9.1-15")
async def test_a_work_delegate_plans_and_offers_a_subtree_within_its_grant(world: World) -> None:
    w = world
    flow: Flow = await setup(w)
    await flow.authorize("root")
    lead = await lead_of(w)
    granted = await flow.coord("membership_grant_delegation", grant_body(w))
    [event] = decode_events(granted.events)
    assert event.type == "membership.delegation.granted"
    grant_id = event.delegation_granted.grant.grant_id
    # Through the gateway, as an agent would: authorize a sub-item linked into the subtree.
    stream = await connected(w, lead)
    await accepted_via_gateway(w, stream, lead, "work_authorize", delegated(w, "sub-1", "root", grant_id))
    await stream.call.done_writing()
    # Offer the new item to a Worker under the grant; the Worker accepts as from anyone.
    epoch = await w.epoch_of(G, "lead-bot")
    offer = flow.offer_body("sub-1", "worker-bot")
    offer.coordinator_epoch, offer.grant_id = 0, grant_id
    await w.run(lead, G, "work_offer", offer, membership_epoch=epoch)
    await flow.accept(w.worker, "sub-1", offer.offer_id)
    status = (await grants(w.client))[grant_id]
    assert (
        status.charged.tokens == 10_000
        and status.remaining.tokens == 15_000
        and list(status.work_item_ids) == ["sub-1"]
    )
    assert status.grant.issuer_id == "coord-bot" and not status.invalid_because
    # Refusals are structured and write nothing.
    outside = await refused(
        w,
        lead,
        G,
        "work_authorize",
        delegated(w, "stray", "", grant_id),
        R.REJECTION_REASON_OUTSIDE_GRANT,
        membership_epoch=epoch,
    )
    assert outside.metadata["check"] == "scope"
    over = await refused(
        w,
        lead,
        G,
        "work_authorize",
        delegated(w, "big", "root", grant_id, tokens=20_000),
        R.REJECTION_REASON_BUDGET_EXCEEDED,
        membership_epoch=epoch,
    )
    assert over.metadata["grant_id"] == grant_id and over.metadata["dimension"] == "tokens"
    theft = await refused(
        w,
        w.worker,
        G,
        "work_authorize",
        delegated(w, "x", "root", grant_id),
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=await w.epoch_of(G, "worker-bot"),
    )
    # A Worker's role never shapes work (MW-9.1-18); another delegate using the grant is not_grantee
    # (tests/test_core_delegation.py).
    assert (theft.metadata["check"], theft.metadata["role"]) == ("role", "worker")
    # The scope root cancelled: the grant ends at once (MW-9.1-15), and the read model says so.
    await flow.coord(
        "work_cancel", wp.WorkCancel(work_item_id="root", coordinator_epoch=1, reason="descoped")
    )
    ended = await refused(
        w,
        lead,
        G,
        "work_authorize",
        delegated(w, "late", "sub-1", grant_id, tokens=1),
        R.REJECTION_REASON_GRANT_INVALID,
        membership_epoch=epoch,
    )
    assert ended.metadata["check"] == "target_finished"
    assert (await grants(w.client))[grant_id].invalid_because == "target_finished"


@pytest.mark.req("MW-9.1-04", "MW-9.1-05")
async def test_a_grant_by_anyone_but_the_current_coordinator_or_without_every_field_writes_nothing(
    world: World,
) -> None:
    w = world
    flow: Flow = await setup(w)
    await flow.authorize("root")
    lead = await lead_of(w)
    await refused(
        w,
        w.owner,
        G,
        "membership_grant_delegation",
        grant_body(w),
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=1,
    )
    await refused(
        w,
        lead,
        G,
        "membership_grant_delegation",
        grant_body(w),
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=await w.epoch_of(G, "lead-bot"),
    )
    no_caps = grant_body(w)
    no_caps.ClearField("caps")
    await refused(
        w,
        w.coordinator,
        G,
        "membership_grant_delegation",
        no_caps,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=2,
    )
    await refused(
        w,
        w.coordinator,
        G,
        "membership_grant_delegation",
        grant_body(w, tokens=10**12),
        R.REJECTION_REASON_BUDGET_EXCEEDED,
        membership_epoch=2,
    )


@pytest.mark.req(
    "MW-9.1-03", "MW-9.1-04", "MW-9.1-06", "MW-9.1-08", "MW-9.1-09", "MW-9.1-11", "MW-9.1-16", "MW-16-01"
)
async def test_a_delegated_flow_runs_entirely_over_the_gateway_stream(world: World) -> None:
    """Grant, delegated authorize of a descendant, delegated offer, the refusals for a target outside
    the subtree and a budget over the cap, revocation, and a refused use after it: every command a
    COMMAND frame on the Coordinator's or the delegate's Connect stream, answered by RESULT."""
    w = world
    flow: Flow = await setup(w)
    await flow.authorize("root")
    await flow.authorize("elsewhere")
    lead = await lead_of(w)
    coord, delegate = await connected(w, w.coordinator), await connected(w, lead)
    [granted] = await accepted_via_gateway(
        w, coord, w.coordinator, "membership_grant_delegation", grant_body(w)
    )
    assert granted.type == "membership.delegation.granted"
    grant_id = granted.delegation_granted.grant.grant_id
    [authorized, *_] = await accepted_via_gateway(
        w, delegate, lead, "work_authorize", delegated(w, "sub-1", "root", grant_id)
    )
    assert authorized.type == "work.authorized" and authorized.work_authorized.grant_id == grant_id
    assert authorized.work_authorized.parent_work_item_id == "root"
    offer = flow.offer_body("sub-1", "worker-bot")
    offer.coordinator_epoch, offer.grant_id = 0, grant_id
    offered = await accepted_via_gateway(w, delegate, lead, "work_offer", offer)
    assert offered[-1].type == "work.offered" and offered[-1].work_offered.grant_id == grant_id
    assert (await grants(w.client))[grant_id].charged.tokens == 10_000
    outside = flow.offer_body("elsewhere", "worker-bot")
    outside.coordinator_epoch, outside.grant_id = 0, grant_id
    stray = await refused_via_gateway(
        w, delegate, lead, "work_offer", outside, R.REJECTION_REASON_OUTSIDE_GRANT
    )
    assert (stray.metadata["check"], stray.metadata["grant_id"]) == ("scope", grant_id)
    big = delegated(w, "big", "sub-1", grant_id, tokens=20_000)  # 10,000 + 20,000 over the cap of 25,000
    over = await refused_via_gateway(
        w, delegate, lead, "work_authorize", big, R.REJECTION_REASON_BUDGET_EXCEEDED
    )
    assert (over.metadata["dimension"], over.metadata["cap"], over.metadata["charged"]) == (
        "tokens",
        "25000",
        "30000",
    )
    revoke = membership_pb2.MembershipRevokeDelegation(grant_id=grant_id, reason="plan changed")
    [revoked] = await accepted_via_gateway(w, coord, w.coordinator, "membership_revoke_delegation", revoke)
    assert revoked.type == "membership.delegation.revoked"
    late = delegated(w, "late", "sub-1", grant_id, tokens=1)
    after = await refused_via_gateway(
        w, delegate, lead, "work_authorize", late, R.REJECTION_REASON_GRANT_INVALID
    )
    assert (after.metadata["check"], after.metadata["grant_id"]) == ("revoked", grant_id)
    assert (await grants(w.client))[grant_id].invalid_because == "revoked"
    for stream in (coord, delegate):
        await stream.call.done_writing()


async def frames_until(stream: Stream, wanted: str, seconds: float = 10) -> list[Any]:
    """Events delivered on ``stream`` until one of type ``wanted``."""
    seen: list[Any] = []
    async with asyncio.timeout(seconds):
        while True:
            frame = await stream.until("event")
            seen.extend(decode_events(frame.event.events))
            if any(e.type == wanted for e in seen):
                return seen


@pytest.mark.req("MW-8-06", "MW-8-07", "MW-8-09")
async def test_a_just_in_time_worker_joins_for_one_offer_and_leaves_when_it_is_done(world: World) -> None:
    """Provisional Membership, an expiring offer and a Context Package for it; the offer accepted
    over the gateway activates the Membership in the same append; it ends with its last obligation."""
    w = world
    flow: Flow = await setup(w)  # worker-bot holds a full Worker Membership; jit-bot joins just in time
    await flow.authorize("wi-1")
    jit = await register(w.client, w.keys["admin"], "jit-bot", common_pb2.IDENTITY_KIND_AGENT)
    expires = w.clock.now() + timedelta(minutes=10)
    provisional = membership_pb2.MembershipGrant(
        member_id="jit-bot", role=Role.MEMBER_ROLE_WORKER, provisional=True, expires_at=to_timestamp(expires)
    )
    await flow.coord("membership_grant", provisional)
    epoch = await w.epoch_of(G, "jit-bot")
    offer = flow.offer_body("wi-1", "jit-bot", seconds=300)
    await flow.coord("work_offer", offer)
    package = await w.client.authority.GetContextPackage(
        authority_service_pb2.GetContextPackageRequest(
            group_id=G, work_item_ids=["wi-1"], recipient_ids=["jit-bot"]
        )
    )
    # The Worker connects: it sees from its grant on, and fetches what the package cites before it.
    stream = await connected(w, jit)
    await stream.send(subscribe=gpb.SubscribeFrame(subscription_id="s", group_id=G, initial_credits=500))
    seen = await frames_until(stream, "work.offered")
    assert min(e.sequence for e in seen) > 1  # not the whole history (MW-8-07)
    await stream.send(
        fetch=gpb.FetchFrame(
            request_id="f",
            group_id=G,
            ranges=[gpb.SequenceRange(first=1, last=2)],
            context_package=package.package,
        )
    )
    fetched = (await stream.until("fetched")).fetched
    assert [e.sequence for e in decode_events(fetched.events)] == [1, 2]  # cited by the package (MW-8-09)
    # Nothing beyond answering the offer while provisional.
    post = builders.message((await w.client.group_state(G)).mission.planning_conversation_id, "hi")
    refusal = (await via_gateway(w, stream, jit, "message_post", post)).rejection
    assert (
        refusal.reason == R.REJECTION_REASON_PERMISSION_DENIED and refusal.metadata["check"] == "provisional"
    )
    accept = wp.WorkAcceptOffer(work_item_id="wi-1", offer_id=offer.offer_id, contract_revision=1)
    await accepted_via_gateway(w, stream, jit, "work_accept_offer", accept)
    types = [e.type for e in await frames_until(stream, "membership.activated")]
    assert types[-2:] == ["work.offer_accepted", "membership.activated"]
    member = next(m for m in (await w.client.group_state(G)).memberships if m.member_id == "jit-bot")
    assert member.active and not member.provisional and member.membership_epoch == epoch
    # Its only obligation ends: so does its Membership, in the same append (one command's events).
    cancelled = await flow.coord(
        "work_cancel", wp.WorkCancel(work_item_id="wi-1", coordinator_epoch=1, reason="descoped")
    )
    last = decode_events(cancelled.events)[-1]
    assert last.type == "membership.ended" and last.membership_ended.member_id == "jit-bot"
    assert last.membership_ended.reason == membership_pb2.MEMBERSHIP_END_REASON_OBLIGATIONS_COMPLETE
    assert not next(m for m in (await w.client.group_state(G)).memberships if m.member_id == "jit-bot").active
    await stream.call.done_writing()
    await refused(
        w,
        jit,
        G,
        "message_post",
        builders.message((await w.client.group_state(G)).mission.planning_conversation_id, "x"),
        R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE,
        membership_epoch=epoch,
    )


@pytest.mark.req("MW-8-06")
async def test_a_provisional_worker_that_never_accepts_lapses_and_reads_nothing_after(world: World) -> None:
    w = world
    flow: Flow = await setup(w)
    await flow.authorize("wi-1")
    jit = await register(w.client, w.keys["admin"], "jit-bot", common_pb2.IDENTITY_KIND_AGENT)
    provisional = membership_pb2.MembershipGrant(
        member_id="jit-bot",
        role=Role.MEMBER_ROLE_WORKER,
        provisional=True,
        expires_at=to_timestamp(w.clock.now() + timedelta(seconds=15)),
    )
    await flow.coord("membership_grant", provisional)
    head = (await w.client.group_state(G)).head_sequence
    reader = MeshClient(w.target, reader=jit)
    try:
        assert (await reader.group_state(G)).head_sequence == head
        w.clock.advance(seconds=16)  # within the call proofs' 30 s of skew
        with pytest.raises(Exception) as info:
            await reader.group_state(G)
        assert "NOT_A_MEMBER" in str(info.value) or "no active Membership" in str(info.value)
    finally:
        await reader.channel.close()
    assert (await w.client.group_state(G)).head_sequence == head  # lapsing appended nothing
