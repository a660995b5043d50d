"""The Coordinator's placer end to end through the gateway, against real Workers: candidates read
from Memberships, Agent Cards and presence, ranked, offered one at a time (or to a bounded set when
urgent) with their selection criteria, moving on after a decline or an expiry (MW-10.3-03, -04,
-10, -11)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest

from missionweave.kernel import ids
from missionweave.kernel.clock import from_timestamp
from missionweave.sdk.agent import Agent
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.sdk.offering import NoEligibleCandidate, Placement, place
from missionweave.sdk.placement import RULE_CAPABILITY
from missionweave.sdk.worker import Slot, WorkerRuntime, WorkResult
from missionweave.v1 import agent_card_pb2 as acpb
from missionweave.v1 import common_pb2, event_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.conftest import World, register
from tests.test_agent_sdk import connect
from tests.test_missions import G, create

PY = membership_pb2.Capability(capability_id="code.python", version="3.11")
PY_312 = membership_pb2.Capability(capability_id="code.python", version="3.12.0")
TTL = timedelta(seconds=2)  # short offers: an expiry test waits for one in real time
MARGIN = timedelta(milliseconds=300)


def contract(w: World) -> wp.WorkContract:
    c = builders.contract(w.clock.now())
    c.required_capabilities.append(PY)
    return c


async def worker(
    w: World, name: str, *, free: int | None, capabilities: tuple[membership_pb2.Capability, ...] = (PY_312,)
) -> SessionSigner:
    """A Worker of G with a card declaring ``capabilities`` and, unless ``free`` is None, fresh
    presence with that many free slots (which orders the ranking: more free slots first)."""
    signer = (
        w.worker
        if name == "worker-bot"
        else await register(w.client, w.keys["admin"], name, common_pb2.IDENTITY_KIND_AGENT)
    )
    grant = membership_pb2.MembershipGrant(
        member_id=name, role=membership_pb2.MEMBER_ROLE_WORKER, capabilities=[PY_312]
    )
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    async with MeshClient(w.target, reader=signer) as mesh:
        await mesh.publish_agent_card(
            acpb.AgentCard(card_version="1.0.0", max_concurrency=4, capabilities=capabilities)
        )
        if free is not None:
            await mesh.report_presence(acpb.PRESENCE_AVAILABILITY_AVAILABLE, free_slots=free, ttl_ms=600_000)
    return signer


async def authorize(w: World, work_item_id: str = "wi-1") -> wp.WorkContract:
    body = wp.WorkAuthorize(
        work_item_id=work_item_id, title="task", contract=contract(w), coordinator_epoch=1
    )
    await w.run(w.coordinator, G, "work_authorize", body, membership_epoch=2)
    return body.contract


@asynccontextmanager
async def accepting(w: World, signer: SessionSigner, tmp_path: Path) -> AsyncIterator[WorkerRuntime]:
    """A real Worker runtime: admission control through its scheduler, then accept."""

    async def handle(slot: Slot) -> WorkResult:
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="done")

    async with connect(w, signer.identity_id, signer.key, tmp_path) as agent:
        runtime = WorkerRuntime(agent, handle)
        await runtime.serve([G])
        try:
            yield runtime
        finally:
            await runtime.close()


@asynccontextmanager
async def declining(w: World, signer: SessionSigner, tmp_path: Path) -> AsyncIterator[Agent]:
    """A Worker that declines every offer naming it, for want of capacity."""
    async with connect(w, signer.identity_id, signer.key, tmp_path) as agent:

        async def on_event(event: event_pb2.Event) -> None:
            if (
                event.WhichOneof("payload") == "work_offered"
                and agent.identity_id in event.work_offered.candidate_ids
            ):
                offered = event.work_offered
                decline = wp.StructuredDecline(reason=wp.DECLINE_REASON_CAPACITY)
                body = wp.WorkDeclineOffer(
                    work_item_id=offered.work_item_id, offer_id=offered.offer_id, decline=decline
                )
                await agent.execute(G, "work_decline_offer", body)

        await agent.subscribe(G, on_event)
        yield agent


@asynccontextmanager
async def coordinator(w: World, tmp_path: Path) -> AsyncIterator[Agent]:
    """The Coordinator's agent. Its new session fences w.coordinator's (the commands before it go
    first) and it renews its Coordinator lease from that session, as a restarted Coordinator does."""
    async with connect(w, "coord-bot", w.coordinator.key, tmp_path) as agent:
        await agent.execute(
            G,
            "mission_renew_coordinator_lease",
            mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        )
        yield agent


async def log(w: World) -> list[event_pb2.Event]:
    return [e async for e in w.client.read_events(G)]


def of(events: list[event_pb2.Event], kind: str) -> list[event_pb2.Event]:
    return [e for e in events if e.WhichOneof("payload") == kind]


def assert_structured(criteria: wp.SelectionCriteria, candidate: str) -> None:
    """MW-10.3-10/11: every item of the record is a field, and its texts are ids, not reasoning."""
    assert criteria.candidate_id == candidate and criteria.rank >= 1
    assert [c.capability_id for c in criteria.matched_capabilities] == ["code.python"]
    assert criteria.authorization_eligible and criteria.authorization_basis
    assert RULE_CAPABILITY in criteria.applied_policy_rules
    assert all(ids.is_valid(t) for t in [*criteria.applied_policy_rules, *criteria.authorization_basis])


@pytest.mark.req("MW-10.3-03", "MW-10.3-10", "MW-10.3-11")
async def test_the_top_ranked_worker_declines_and_the_next_one_accepts(world: World, tmp_path: Path) -> None:
    w = world
    await create(w, lease_seconds=3600)
    busy = await worker(w, "worker-busy", free=3)  # ranked first, declines
    able = await worker(w, "worker-bot", free=1)
    work = await authorize(w)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(declining(w, busy, tmp_path))
        await stack.enter_async_context(accepting(w, able, tmp_path))
        agent = await stack.enter_async_context(coordinator(w, tmp_path))
        async with asyncio.timeout(30):
            placed: Placement = await place(
                agent, G, "wi-1", work, offer_ttl=timedelta(seconds=30), margin=MARGIN
            )
    assert placed.accepted_by == "worker-bot" and placed.ownership_epoch == 1
    assert [(o.candidate_ids, o.ended) for o in placed.offers] == [
        (("worker-busy",), "declined"),
        (("worker-bot",), "accepted"),
    ]
    assert placed.offers[0].declines["worker-busy"].reason == wp.DECLINE_REASON_CAPACITY
    events = await log(w)
    offered, declined = of(events, "work_offered"), of(events, "work_offer_declined")
    # One offer at a time: the second only after the first was declined.
    assert [list(e.work_offered.candidate_ids) for e in offered] == [["worker-busy"], ["worker-bot"]]
    assert offered[0].sequence < declined[0].sequence < offered[1].sequence
    for e, name, rank in zip(offered, ["worker-busy", "worker-bot"], [1, 2], strict=True):
        [criteria] = e.work_offered.selection_criteria
        assert_structured(criteria, name)
        assert criteria.rank == rank
    [accepted] = of(events, "work_offer_accepted")
    assert (
        accepted.work_offer_accepted.selection_criteria
        == placed.criteria
        == offered[1].work_offered.selection_criteria[0]
    )


@pytest.mark.req("MW-10.3-03")
async def test_an_offer_left_to_expire_moves_on_to_the_next_worker_after_its_expiry(
    world: World, tmp_path: Path
) -> None:
    w = world
    await create(w, lease_seconds=3600)
    await worker(w, "worker-silent", free=3)  # ranked first, never answers
    able = await worker(w, "worker-bot", free=1)
    work = await authorize(w)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(accepting(w, able, tmp_path))
        agent = await stack.enter_async_context(coordinator(w, tmp_path))
        async with asyncio.timeout(30):
            placed = await place(agent, G, "wi-1", work, offer_ttl=TTL, margin=MARGIN, clock=w.clock)
    assert [(o.candidate_ids, o.ended) for o in placed.offers] == [
        (("worker-silent",), "expired"),
        (("worker-bot",), "accepted"),
    ]
    assert placed.accepted_by == "worker-bot"
    first, second = of(await log(w), "work_offered")
    # Not withdrawn early: the next offer was recorded only once the first had expired.
    assert from_timestamp(second.recorded_at) >= from_timestamp(first.work_offered.expires_at)
    assert list(second.work_offered.candidate_ids) == ["worker-bot"]


@pytest.mark.req("MW-10.3-04", "MW-10.3-10")
async def test_urgent_placement_offers_a_bounded_set_at_once(world: World, tmp_path: Path) -> None:
    w = world
    await create(w, lease_seconds=3600)
    await worker(w, "worker-silent", free=4)
    able = await worker(w, "worker-bot", free=3)
    await worker(w, "worker-third", free=1)  # outside a set of two
    work = await authorize(w)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(accepting(w, able, tmp_path))
        agent = await stack.enter_async_context(coordinator(w, tmp_path))
        async with asyncio.timeout(30):
            placed = await place(
                agent,
                G,
                "wi-1",
                work,
                urgent=True,
                urgent_size=2,
                offer_ttl=timedelta(seconds=30),
                margin=MARGIN,
            )
        with pytest.raises(ValueError):  # beyond the Authority's bound
            await place(agent, G, "wi-1", work, urgent=True, urgent_size=9)
    [offer] = placed.offers
    assert offer.candidate_ids == ("worker-silent", "worker-bot") and offer.ended == "accepted"
    assert placed.accepted_by == "worker-bot"
    events = await log(w)
    [offered] = of(events, "work_offered")
    assert [c.candidate_id for c in offered.work_offered.selection_criteria] == [
        "worker-silent",
        "worker-bot",
    ]
    for criteria in offered.work_offered.selection_criteria:
        assert_structured(criteria, criteria.candidate_id)
    [withdrawn] = of(events, "work_offers_withdrawn")  # the other candidate's chance ends with the win
    assert withdrawn.work_offers_withdrawn.reason == wp.OFFER_WITHDRAWAL_REASON_ACCEPTED_ELSEWHERE


async def test_no_eligible_candidate_is_a_clear_error_and_nothing_is_offered(
    world: World, tmp_path: Path
) -> None:
    w = world
    await create(w, lease_seconds=3600)
    await worker(
        w,
        "worker-old",
        free=2,
        capabilities=(membership_pb2.Capability(capability_id="code.python", version="3.10.0"),),
    )
    await worker(w, "worker-bot", free=None)  # never reported presence
    work = await authorize(w)
    async with coordinator(w, tmp_path) as agent:
        with pytest.raises(NoEligibleCandidate) as info:
            await place(agent, G, "wi-1", work)
    message = str(info.value)
    assert "worker-old: missing code.python >= 3.11" in message
    assert "worker-bot: no fresh presence with a free slot" in message
    assert {r.candidate.agent_id for r in info.value.ranked} == {"worker-old", "worker-bot"}
    assert not of(await log(w), "work_offered")
