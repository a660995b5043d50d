"""The Coordinator's placer: reads the candidates from the mesh, ranks them (``placement.rank``) and
offers a WorkItem until a Worker accepts (MW-10.3-03, -04, -10, -11).

Sequential (the default): one offer at a time, to the highest-ranked eligible Worker not yet tried,
each carrying that Worker's structured selection criteria; after a decline, or once the offer's
expiry has passed, the next one. Urgent (``urgent=True``): the best ``urgent_size`` eligible Workers
(at most ``URGENT_SET_MAX``) in one offer; the first acceptance wins (the Authority withdraws the
rest, MW-10.3-05), and when every one declines or the offer expires, the next set.

The outcome of an offer is read from the Group's log, from the ``work.offered`` event on
(``ReadEvents`` with ``follow``), so an answer appended before the placer starts waiting is seen
too. The Authority appends nothing when an offer expires (MW-10.2-T05): the placer judges expiry
by its clock, waiting until ``expires_at`` plus ``margin`` (clock skew and delivery) and no longer.

Usage::

    async with Agent.connect(target, "coord", "coord.key", cursor_dir="state") as agent:
        placed = await place(agent, "grp_...", "wi-1", contract)
        print(placed.accepted_by, [(o.offer_id, o.ended) for o in placed.offers])
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

import grpc

from missionweave.kernel.clock import Clock, SystemClock, from_timestamp, to_timestamp
from missionweave.sdk.agent import Agent, AuthorityVerifier, CommandRejected
from missionweave.sdk.client import CardNotVerified, decode_events, verify_agent_card
from missionweave.sdk.placement import (
    URGENT_SET_MAX,
    Candidate,
    Ranked,
    offer_body,
    rank,
    sequential,
    urgent_set,
)
from missionweave.v1 import (
    agent_card_pb2,
    authority_service_pb2,
    authority_service_pb2_grpc,
    common_pb2,
    event_pb2,
    membership_pb2,
    membership_service_pb2,
    membership_service_pb2_grpc,
)
from missionweave.v1 import work_pb2 as wp

__all__ = [
    "NoEligibleCandidate",
    "NotPlaced",
    "OfferMade",
    "OfferTracker",
    "Placement",
    "PlacementError",
    "gather_candidates",
    "ineligibility",
    "place",
]

log = logging.getLogger(__name__)

OfferEnd = Literal["accepted", "declined", "expired", "withdrawn"]
PRESENCE_BATCH = 256  # GetPresence answers at most this many agents per call
POLL_S = 0.25  # how often a wait re-reads the clock: a clock moved forward ends it promptly
RECONNECT_S = 0.2


@dataclass(frozen=True)
class OfferMade:
    """One ``work.offer`` the placer sent and how it ended."""

    offer_id: str
    candidate_ids: tuple[str, ...]
    criteria: tuple[wp.SelectionCriteria, ...]  # as recorded in the offer, one per candidate
    sequence: int  # of its ``work.offered`` event
    expires_at: datetime
    ended: OfferEnd
    declines: Mapping[str, wp.StructuredDecline] = field(default_factory=dict)
    accepted_by: str = ""


@dataclass(frozen=True)
class Placement:
    """A WorkItem accepted by ``accepted_by`` under ``ownership_epoch``, and every offer it took."""

    group_id: str
    work_item_id: str
    accepted_by: str
    ownership_epoch: int
    criteria: wp.SelectionCriteria  # the winner's, as the Authority recorded it with the assignment
    offers: tuple[OfferMade, ...]
    ranked: tuple[Ranked, ...]


class PlacementError(Exception):
    """The WorkItem could not be placed."""


class NoEligibleCandidate(PlacementError):
    """No candidate is eligible; nothing was offered. ``ranked`` says why for each one."""

    def __init__(self, work_item_id: str, ranked: Sequence[Ranked]) -> None:
        self.ranked = tuple(ranked)
        why = (
            "; ".join(f"{r.candidate.agent_id}: {ineligibility(r)}" for r in ranked)
            or "no Worker in the Group"
        )
        super().__init__(f"no eligible candidate for {work_item_id} ({why})")


class NotPlaced(PlacementError):
    """Every eligible candidate was offered the WorkItem and none accepted, or its offer was withdrawn
    by someone else (``offers[-1].ended == "withdrawn"``)."""

    def __init__(self, work_item_id: str, offers: Sequence[OfferMade], ranked: Sequence[Ranked]) -> None:
        self.offers = tuple(offers)
        self.ranked = tuple(ranked)
        ends = ", ".join(f"{o.offer_id} to {'+'.join(o.candidate_ids)}: {o.ended}" for o in offers)
        super().__init__(f"{work_item_id} was not accepted ({ends})")


def ineligibility(r: Ranked) -> str:
    """Why a ranked candidate is not eligible, from what ``rank`` recorded ("" when it is)."""
    c = r.criteria
    if r.eligible:
        return ""
    if not c.authorization_eligible:
        return "no active Membership"
    if r.candidate.card is None:
        return "no Agent Card in force"
    if c.missing_capabilities:
        return "missing " + ", ".join(f"{m.capability_id} >= {m.version}" for m in c.missing_capabilities)
    return "no fresh presence with a free slot"


# ---------------------------------------------------------------- reading the candidates


async def gather_candidates(
    agent: Agent,
    group_id: str,
    *,
    expected_costs: Mapping[str, common_pb2.ResourceVector] | None = None,
    reliability: Mapping[str, Sequence[wp.ReliabilityRecord]] | None = None,
    clock: Clock | None = None,
) -> list[Candidate]:
    """The Group's Workers as candidates: every active Worker Membership (a lapsed provisional one
    left out), its Agent Card in force (verified; None when it has none) and its last presence
    report (``fresh`` by the server's clock). Expected cost and reliability Evidence are what the
    caller knows, by agent id."""
    now = (clock or SystemClock()).now()
    state = await _group_state(agent, group_id)
    members = [
        m
        for m in state.memberships
        if m.active
        and m.role == membership_pb2.MEMBER_ROLE_WORKER
        and m.member_id != agent.identity_id
        and not (m.provisional and m.HasField("expires_at") and from_timestamp(m.expires_at) <= now)
    ]
    stub = membership_service_pb2_grpc.MembershipServiceStub(agent.channel)
    ids = [m.member_id for m in members]
    presences: dict[str, agent_card_pb2.AgentPresence] = {}
    for i in range(0, len(ids), PRESENCE_BATCH):
        answer = await stub.GetPresence(
            membership_service_pb2.GetPresenceRequest(agent_ids=ids[i : i + PRESENCE_BATCH])
        )
        presences.update((p.agent_id, p) for p in answer.presences)
    costs, records = expected_costs or {}, reliability or {}
    out = []
    for m in members:
        out.append(
            Candidate(
                agent_id=m.member_id,
                membership_epoch=m.membership_epoch,
                card=await _card_in_force(stub, m.member_id),
                presence=presences.get(m.member_id),
                expected_cost=costs.get(m.member_id, common_pb2.ResourceVector()),
                reliability=tuple(records.get(m.member_id, ())),
            )
        )
    return out


async def _group_state(agent: Agent, group_id: str) -> authority_service_pb2.GroupState:
    stub = authority_service_pb2_grpc.AuthorityServiceStub(agent.channel)
    return (await stub.GetGroupState(authority_service_pb2.GetGroupStateRequest(group_id=group_id))).state


async def _card_in_force(
    stub: membership_service_pb2_grpc.MembershipServiceAsyncStub, agent_id: str
) -> agent_card_pb2.AgentCard | None:
    try:
        answer = await stub.GetAgentCard(membership_service_pb2.GetAgentCardRequest(agent_id=agent_id))
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise
    try:
        return verify_agent_card(answer.published)
    except CardNotVerified:
        log.warning("the Agent Card of %s does not verify; it is ranked as having none", agent_id)
        return None


# ---------------------------------------------------------------- offering


async def place(
    agent: Agent,
    group_id: str,
    work_item_id: str,
    contract: wp.WorkContract,
    *,
    candidates: Sequence[Candidate] | None = None,
    expected_costs: Mapping[str, common_pb2.ResourceVector] | None = None,
    reliability: Mapping[str, Sequence[wp.ReliabilityRecord]] | None = None,
    urgent: bool = False,
    urgent_size: int = URGENT_SET_MAX,
    offer_ttl: timedelta = timedelta(seconds=60),
    margin: timedelta = timedelta(seconds=2),
    coordinator_epoch: int | None = None,
    clock: Clock | None = None,
) -> Placement:
    """Offer ``work_item_id`` (whose current contract is ``contract``) until a Worker accepts.

    ``candidates`` defaults to :func:`gather_candidates` (with ``expected_costs`` and
    ``reliability``). Each offer expires ``offer_ttl`` after it is sent; its outcome is awaited at
    most until then plus ``margin``. ``coordinator_epoch`` defaults to the Mission's current one.
    Raises :class:`NoEligibleCandidate` before offering anything when no candidate is eligible,
    :class:`NotPlaced` when every eligible one declined or let its offer expire (or the offer was
    withdrawn by another command), and ``CommandRejected`` when the Authority refuses an offer.
    """
    clock = clock or SystemClock()
    if urgent and not 1 <= urgent_size <= URGENT_SET_MAX:
        raise ValueError(f"an urgent candidate set has 1..{URGENT_SET_MAX} candidates")
    if candidates is None:
        candidates = await gather_candidates(
            agent, group_id, expected_costs=expected_costs, reliability=reliability, clock=clock
        )
    ranked = rank(contract, candidates)
    if not any(r.eligible for r in ranked):
        raise NoEligibleCandidate(work_item_id, ranked)
    if coordinator_epoch is None:
        coordinator_epoch = (await _group_state(agent, group_id)).mission.coordinator.coordinator_epoch
    reader = _LogReader(agent, group_id, clock)
    offers: list[OfferMade] = []
    tried: set[str] = set()
    while True:
        if urgent:
            chosen = urgent_set([r for r in ranked if r.candidate.agent_id not in tried], urgent_size)
        else:
            first = sequential(ranked, tried)
            chosen = [first] if first is not None else []
        if not chosen:
            raise NotPlaced(work_item_id, offers, ranked)
        tried.update(r.candidate.agent_id for r in chosen)
        expires = clock.now() + offer_ttl
        body = offer_body(work_item_id, chosen, to_timestamp(expires), coordinator_epoch=coordinator_epoch)
        try:
            result = await agent.execute(group_id, "work_offer", body)
        except CommandRejected:
            # Refused because the previous offer was accepted after all (its answer came later than
            # the margin): that acceptance is the outcome.
            late = await reader.accepted_late(work_item_id, offers[-1]) if offers else None
            if late is None:
                raise
            offers[-1] = late[0]
            return _placed(group_id, work_item_id, late[1], offers, ranked)
        [offered] = [e for e in decode_events(result.events) if e.WhichOneof("payload") == "work_offered"]
        made = OfferMade(
            offer_id=offered.work_offered.offer_id,
            candidate_ids=tuple(offered.work_offered.candidate_ids),
            criteria=tuple(offered.work_offered.selection_criteria),
            sequence=offered.sequence,
            expires_at=from_timestamp(offered.work_offered.expires_at),
            ended="expired",
        )
        ended, accepted = await reader.outcome(work_item_id, made, made.expires_at + margin)
        offers.append(ended)
        log.info(
            "%s/%s: offer %s to %s %s",
            group_id,
            work_item_id,
            made.offer_id,
            list(made.candidate_ids),
            ended.ended,
        )
        if accepted is not None:
            return _placed(group_id, work_item_id, accepted, offers, ranked)
        if ended.ended == "withdrawn":
            raise NotPlaced(work_item_id, offers, ranked)


def _placed(
    group_id: str,
    work_item_id: str,
    accepted: wp.WorkOfferAccepted,
    offers: list[OfferMade],
    ranked: list[Ranked],
) -> Placement:
    return Placement(
        group_id=group_id,
        work_item_id=work_item_id,
        accepted_by=accepted.agent_id,
        ownership_epoch=accepted.ownership.ownership_epoch,
        criteria=accepted.selection_criteria,
        offers=tuple(offers),
        ranked=tuple(ranked),
    )


class _LogReader:
    """Reads a Group's log from an offer on, verified against the Authority's key."""

    def __init__(self, agent: Agent, group_id: str, clock: Clock) -> None:
        self.stub = authority_service_pb2_grpc.AuthorityServiceStub(agent.channel)
        self.group_id = group_id
        self.clock = clock
        self._verifier: AuthorityVerifier | None = None

    async def verifier(self) -> AuthorityVerifier:
        if self._verifier is None:
            key = await self.stub.GetAuthorityKey(authority_service_pb2.GetAuthorityKeyRequest())
            self._verifier = AuthorityVerifier(
                key.key_id, key.public_key, {k.key_id: k.public_key for k in key.keys}
            )
        return self._verifier

    async def outcome(
        self, work_item_id: str, offer: OfferMade, deadline: datetime
    ) -> tuple[OfferMade, wp.WorkOfferAccepted | None]:
        """How ``offer`` ended, waiting until ``deadline`` (by the clock) at the latest."""
        verifier = await self.verifier()
        queue: asyncio.Queue[event_pb2.Event | BaseException] = asyncio.Queue()
        pump = asyncio.create_task(self._follow(offer.sequence, verifier, queue, deadline))
        tracker = OfferTracker(work_item_id, offer)
        try:
            while tracker.ended is None:
                left = (deadline - self.clock.now()).total_seconds()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(queue.get(), min(left, POLL_S))
                except TimeoutError:
                    continue
                if isinstance(item, BaseException):
                    raise item
                tracker.see(item)
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        return tracker.result()

    async def accepted_late(
        self, work_item_id: str, offer: OfferMade
    ) -> tuple[OfferMade, wp.WorkOfferAccepted] | None:
        """The acceptance of ``offer`` in the log as it is now, if there is one."""
        verifier = await self.verifier()
        tracker = OfferTracker(work_item_id, offer)
        request = authority_service_pb2.ReadEventsRequest(
            group_id=self.group_id, after_sequence=offer.sequence
        )
        async for batch in self.stub.ReadEvents(request):
            for envelope in batch.events:
                tracker.see(verifier.event(envelope))
        made, accepted = tracker.result()
        return (made, accepted) if accepted is not None else None

    async def _follow(
        self,
        after: int,
        verifier: AuthorityVerifier,
        queue: asyncio.Queue[event_pb2.Event | BaseException],
        deadline: datetime,
    ) -> None:
        """Everything after ``after``, as it is appended; a dropped stream is reopened where it broke."""
        while True:
            request = authority_service_pb2.ReadEventsRequest(
                group_id=self.group_id, after_sequence=after, follow=True
            )
            call = self.stub.ReadEvents(request)
            try:
                async for batch in call:
                    for envelope in batch.events:
                        event = verifier.event(envelope)
                        after = max(after, event.sequence)
                        queue.put_nowait(event)
                    after = max(after, batch.last_sequence)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or self.clock.now() >= deadline:
                    queue.put_nowait(err)
                    return
                log.info(
                    "%s: the log stream broke (%s); reopening after %d", self.group_id, err.details(), after
                )
            except Exception as err:  # a signature that does not verify ends the wait with it
                queue.put_nowait(err)
                return
            finally:
                call.cancel()
            await asyncio.sleep(RECONNECT_S)


class OfferTracker:
    """Folds the Group's events after an offer into how it ended: accepted by one candidate, declined
    by every one, or withdrawn; still ``None`` while open (an expiry appends nothing)."""

    def __init__(self, work_item_id: str, offer: OfferMade) -> None:
        self.work_item_id = work_item_id
        self.offer = offer
        self.declines: dict[str, wp.StructuredDecline] = {}
        self.accepted: wp.WorkOfferAccepted | None = None
        self.ended: OfferEnd | None = None

    def see(self, event: event_pb2.Event) -> None:
        if self.ended is not None:
            return
        kind = event.WhichOneof("payload")
        if kind == "work_offer_accepted":
            p = event.work_offer_accepted
            if p.work_item_id == self.work_item_id and p.offer_id == self.offer.offer_id:
                self.accepted, self.ended = p, "accepted"
        elif kind == "work_offer_declined":
            d = event.work_offer_declined
            if d.work_item_id == self.work_item_id and d.offer_id == self.offer.offer_id:
                self.declines[d.agent_id] = d.decline
                if set(self.offer.candidate_ids) <= set(self.declines):
                    self.ended = "declined"
        elif kind == "work_offers_withdrawn":
            w = event.work_offers_withdrawn
            if w.work_item_id == self.work_item_id and self.offer.offer_id in w.offer_ids:
                self.ended = "withdrawn"

    def result(self) -> tuple[OfferMade, wp.WorkOfferAccepted | None]:
        made = OfferMade(
            offer_id=self.offer.offer_id,
            candidate_ids=self.offer.candidate_ids,
            criteria=self.offer.criteria,
            sequence=self.offer.sequence,
            expires_at=self.offer.expires_at,
            ended=self.ended or "expired",
            declines=dict(self.declines),
            accepted_by=self.accepted.agent_id if self.accepted is not None else "",
        )
        return made, self.accepted
