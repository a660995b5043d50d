"""WorkItems through the public gRPC API: the state machine MW-10.2-T01..T14/T18, offers and
ownership (10.3), dependencies (10.4), fenced execution leases (11.3) and budgets."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.client import SessionSigner, decode_events
from missionweave.v1 import common_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.conftest import World, polled
from tests.test_missions import G, create, mission, refused

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

R = common_pb2.RejectionReason
WS = wp.WorkItemState


class Flow:
    """Drives one Group: the Coordinator plans and offers, workers accept and execute."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.offers = 0

    async def coord(self, kind: str, body: Any) -> Any:
        return await self.w.run(self.w.coordinator, G, kind, body, membership_epoch=2)

    async def as_(self, signer: SessionSigner, kind: str, body: Any) -> Any:
        return await self.w.run(
            signer, G, kind, body, membership_epoch=await self.w.epoch_of(G, signer.identity_id)
        )

    async def authorize(self, work_item_id: str, **contract: Any) -> None:
        body = wp.WorkAuthorize(
            work_item_id=work_item_id,
            title=f"task {work_item_id}",
            contract=builders.contract(self.w.clock.now(), **contract),
            coordinator_epoch=1,
        )
        await self.coord("work_authorize", body)

    def offer_body(
        self, work_item_id: str, *candidates: str, seconds: int = 60, offer_id: str = ""
    ) -> wp.WorkOffer:
        self.offers += 1
        return wp.WorkOffer(
            work_item_id=work_item_id,
            offer_id=offer_id or f"offer-{work_item_id}-{self.offers}",
            candidate_ids=list(candidates),
            expires_at=to_timestamp(self.w.clock.now() + timedelta(seconds=seconds)),
            selection_criteria=[builders.selection(c) for c in candidates],
            coordinator_epoch=1,
        )

    async def offer(self, work_item_id: str, *candidates: str, seconds: int = 60) -> str:
        body = self.offer_body(work_item_id, *candidates, seconds=seconds)
        await self.coord("work_offer", body)
        return body.offer_id

    async def accept(self, signer: SessionSigner, work_item_id: str, offer_id: str, revision: int = 1) -> int:
        result = await self.as_(
            signer,
            "work_accept_offer",
            wp.WorkAcceptOffer(work_item_id=work_item_id, offer_id=offer_id, contract_revision=revision),
        )
        return int(decode_events(result.events)[0].work_offer_accepted.ownership.ownership_epoch)

    async def start(self, signer: SessionSigner, work_item_id: str, epoch: int, lease_id: str) -> None:
        await self.as_(
            signer,
            "work_start",
            wp.WorkStart(work_item_id=work_item_id, ownership_epoch=epoch, lease_id=lease_id),
        )

    async def run_to_submitted(self, signer: SessionSigner, work_item_id: str) -> str:
        offer_id = await self.offer(work_item_id, signer.identity_id)
        epoch = await self.accept(signer, work_item_id, offer_id)
        await self.start(signer, work_item_id, epoch, f"lease-{work_item_id}")
        submitted = await self.as_(
            signer, "work_submit", await self.submission(signer, work_item_id, epoch, f"lease-{work_item_id}")
        )
        return str(decode_events(submitted.events)[0].event_id)

    async def submission(
        self, signer: SessionSigner, work_item_id: str, epoch: int, lease_id: str, **kw: Any
    ) -> wp.WorkSubmit:
        """A submission whose deliverable exists: uploaded with ``signer``'s manifest (D161)."""
        report = await self.w.deliverable(signer, G, work_item_id)
        return self.submit_body(work_item_id, epoch, lease_id, [report], **kw)

    @staticmethod
    def submit_body(
        work_item_id: str,
        epoch: int,
        lease_id: str,
        artifacts: list[common_pb2.ArtifactRef] | None = None,
        **kw: Any,
    ) -> wp.WorkSubmit:
        return wp.WorkSubmit(
            work_item_id=work_item_id,
            lease_id=lease_id,
            ownership_epoch=epoch,
            contract_revision=1,
            artifacts=artifacts or [builders.artifact()],
            evidence=[builders.evidence()],
            summary="done",
            **kw,
        )

    async def item_state(self, work_item_id: str) -> int:
        state = self.w.mesh.authority  # type: ignore[attr-defined]
        group = await state.state(G)
        return int(group.work_items[work_item_id].state)


async def setup(w: World, *workers: SessionSigner) -> Flow:
    await create(w, lease_seconds=3600)
    for signer in workers or (w.worker,):
        grant = membership_pb2.MembershipGrant(
            member_id=signer.identity_id, role=membership_pb2.MEMBER_ROLE_WORKER
        )
        await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    return Flow(w)


@pytest.mark.req(
    "MW-10.2-T02",
    "MW-10.2-T03",
    "MW-10.2-T04",
    "MW-10.2-T07",
    "MW-10.2-T08",
    "MW-10.2-T11",
    "MW-10.2-T12",
    "MW-9-02",
    "MW-11.3-02",
    "MW-11.3-03",
    "MW-11.3-04",
    "MW-11.3-05",
    "MW-10.3-06",
    "MW-10.3-10",
)
async def test_full_lifecycle_under_fenced_leases(world: World) -> None:
    w = world
    f = await setup(w)
    authorized = await f.coord(
        "work_authorize",
        wp.WorkAuthorize(
            work_item_id="wi-1",
            title="ledger",
            contract=builders.contract(w.clock.now()),
            coordinator_epoch=1,
        ),
    )
    types = [e.type for e in decode_events(authorized.events)]
    assert types == ["work.authorized", "conversation.opened"]  # MW-9-02: the WorkItem's own Conversation
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_OPEN
    offer_id = await f.offer("wi-1", "worker-bot")
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_OFFERED
    accepted = await f.as_(
        w.worker,
        "work_accept_offer",
        wp.WorkAcceptOffer(work_item_id="wi-1", offer_id=offer_id, contract_revision=1),
    )
    grant = decode_events(accepted.events)[0].work_offer_accepted
    assert grant.ownership.ownership_epoch == 1 and grant.ownership.HasField("start_deadline")  # MW-11.3-02
    assert list(grant.selection_criteria.applied_policy_rules) == [
        "policy:capability-match",
        "policy:least-loaded",
    ]  # MW-10.3-10
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_QUEUED  # MW-10.3-06: a commitment, not execution
    await f.start(w.worker, "wi-1", 1, "lease-a")
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_ACTIVE
    renew = wp.WorkRenewLease(
        work_item_id="wi-1",
        lease_id="lease-a",
        ownership_epoch=1,
        usage_delta=common_pb2.ResourceVector(tokens=100),
    )
    await f.as_(w.worker, "work_renew_lease", renew)
    checkpoint = wp.WorkCheckpoint(
        work_item_id="wi-1",
        lease_id="lease-a",
        ownership_epoch=1,
        checkpoint=wp.Checkpoint(checkpoint_id="ck-1"),
    )
    await f.as_(w.worker, "work_checkpoint", checkpoint)
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_QUEUED  # T08 releases execution
    await f.start(w.worker, "wi-1", 1, "lease-b")
    # MW-11.3-05: the old lease id is stale although the ownership epoch is unchanged.
    await refused(
        w,
        w.worker,
        G,
        "work_renew_lease",
        wp.WorkRenewLease(work_item_id="wi-1", lease_id="lease-a", ownership_epoch=1),
        R.REJECTION_REASON_LEASE_STALE,
        membership_epoch=3,
    )
    await refused(
        w,
        w.worker,
        G,
        "work_submit",
        f.submit_body("wi-1", 1, "lease-a"),
        R.REJECTION_REASON_LEASE_STALE,
        membership_epoch=3,
    )
    report = await w.deliverable(w.worker, G, "wi-1")
    submitted = await f.as_(w.worker, "work_submit", f.submit_body("wi-1", 1, "lease-b", [report]))
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_SUBMITTED
    submission = decode_events(submitted.events)[0].event_id
    await f.coord(
        "work_accept_result",
        wp.WorkAcceptResult(work_item_id="wi-1", coordinator_epoch=1, submission_event_id=submission),
    )
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_VERIFIED
    # MW-7.3-04 against the real graph: with the required work verified, the Mission can be submitted.
    m = await mission(w)
    await f.coord(
        "mission_submit_for_approval",
        mission_pb2.MissionSubmitForApproval(coordinator_epoch=1, mission_revision=m.revision),
    )


@pytest.mark.req("MW-10.3-05", "MW-10.3-02", "MW-10.3-04")
async def test_many_workers_race_for_one_offer_and_exactly_one_wins(world: World) -> None:
    w = world
    signers = []
    for i in range(6):
        key = SigningKey.generate()
        await w.client.register_identity(
            "admin", w.keys["admin"], f"racer-{i}", common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
        )
        signers.append(await w.client.open_session(f"racer-{i}", key))
    f = await setup(w, *signers)
    await f.authorize("wi-race")
    offer_id = await f.offer("wi-race", *(s.identity_id for s in signers))
    assert await f.item_state("wi-race") == WS.WORK_ITEM_STATE_OFFERED  # MW-10.3-02: nobody owns it yet
    epochs = {s.identity_id: await w.epoch_of(G, s.identity_id) for s in signers}
    envelopes = [
        w.signed(
            s,
            G,
            "work_accept_offer",
            wp.WorkAcceptOffer(work_item_id="wi-race", offer_id=offer_id, contract_revision=1),
            membership_epoch=epochs[s.identity_id],
        )
        for s in signers
    ]
    results = await asyncio.gather(*(w.client.execute(e) for e in envelopes), return_exceptions=True)
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1
    for loser in (r for r in results if isinstance(r, grpc.aio.AioRpcError)):
        rejection = rejection_from_rpc_error(loser)
        assert rejection is not None and rejection.reason == R.REJECTION_REASON_INVALID_TRANSITION
    winner_events = decode_events(winners[0].events)
    assert [e.type for e in winner_events] == [
        "work.offer_accepted",
        "work.offers_withdrawn",
    ]  # losers withdrawn atomically
    group = await w.mesh.authority.state(G)  # type: ignore[attr-defined]
    assert group.work_items["wi-race"].owner.ownership_epoch == 1


@pytest.mark.req("MW-10.2-T05", "MW-10.2-05")
async def test_an_expired_offer_cannot_be_accepted_and_appends_nothing(world: World) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    offer_id = await f.offer("wi-1", "worker-bot", seconds=10)
    w.clock.advance(seconds=11)
    accept = wp.WorkAcceptOffer(work_item_id="wi-1", offer_id=offer_id, contract_revision=1)
    await refused(
        w, w.worker, G, "work_accept_offer", accept, R.REJECTION_REASON_OFFER_EXPIRED, membership_epoch=3
    )
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_OFFERED  # T05: still offered
    # A fresh offer extends the chance; the worker then accepts.
    await f.coord("work_offer", f.offer_body("wi-1", "worker-bot", offer_id="offer-2"))
    await f.accept(w.worker, "wi-1", "offer-2")


@pytest.mark.req("MW-10.2-T09", "MW-10.2-T10", "MW-11.4-04")
async def test_block_releases_the_slot_and_unblock_returns_to_the_queue(world: World) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    epoch = await f.accept(w.worker, "wi-1", await f.offer("wi-1", "worker-bot"))
    await f.start(w.worker, "wi-1", epoch, "lease-1")
    no_resolution = wp.WorkBlock(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        checkpoint=wp.Checkpoint(checkpoint_id="ck"),
        blockers=[wp.Blocker(blocker_id="b1", kind=wp.BLOCKER_KIND_DEPENDENCY)],
    )
    await refused(
        w, w.worker, G, "work_block", no_resolution, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )
    no_resolution.blockers[0].required_resolution = "ledger export from finance"
    await f.as_(w.worker, "work_block", no_resolution)
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_BLOCKED
    await f.coord(
        "work_unblock", wp.WorkUnblock(work_item_id="wi-1", coordinator_epoch=1, resolution="export attached")
    )
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_QUEUED  # ownership still live
    await f.start(w.worker, "wi-1", epoch, "lease-2")


@pytest.mark.req("MW-10.2-T10", "MW-10.2-T03", "MW-11.5-01", "MW-11.5-03")
async def test_unblock_after_ownership_expired_reopens_and_a_reoffer_fences_the_stale_owner(
    world: World,
) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    epoch = await f.accept(w.worker, "wi-1", await f.offer("wi-1", "worker-bot"))
    await f.start(w.worker, "wi-1", epoch, "lease-1")
    block = wp.WorkBlock(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        checkpoint=wp.Checkpoint(checkpoint_id="ck"),
        blockers=[wp.Blocker(blocker_id="b1", kind=wp.BLOCKER_KIND_DEPENDENCY, required_resolution="input")],
    )
    block.requested_blocked_duration.FromSeconds(30)
    await f.as_(w.worker, "work_block", block)
    w.clock.advance(seconds=31)
    await f.coord(
        "work_unblock", wp.WorkUnblock(work_item_id="wi-1", coordinator_epoch=1, resolution="input arrived")
    )
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_OPEN
    second = await f.accept(w.worker, "wi-1", await f.offer("wi-1", "worker-bot"))
    assert second == epoch + 1  # a higher ownership epoch (MW-11.5-01)
    # MW-11.5-03: a late result from the stale ownership can never complete the WorkItem.
    late = Flow.submit_body("wi-1", epoch, "lease-1")
    await refused(
        w, w.worker, G, "work_submit", late, R.REJECTION_REASON_INVALID_TRANSITION, membership_epoch=3
    )
    await f.start(w.worker, "wi-1", second, "lease-2")
    await refused(
        w, w.worker, G, "work_submit", late, R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE, membership_epoch=3
    )


@pytest.mark.req("MW-10.2-T13", "MW-10.2-03", "MW-10.2-T14", "MW-10.2-02")
async def test_fail_needs_evidence_returns_control_and_cancel_is_terminal(world: World) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    epoch = await f.accept(w.worker, "wi-1", await f.offer("wi-1", "worker-bot"))
    await f.start(w.worker, "wi-1", epoch, "lease-1")
    fail = wp.WorkFail(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        kind=wp.WORK_FAILURE_KIND_PERMANENT,
        reason="source missing",
    )
    await refused(
        w, w.worker, G, "work_fail", fail, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )  # no Evidence
    fail.evidence.append(builders.evidence("ev-fail"))
    await f.as_(w.worker, "work_fail", fail)
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_FAILED
    # MW-10.2-03: `failed` is left only through a new work.offer.
    await refused(
        w,
        w.coordinator,
        G,
        "work_unblock",
        wp.WorkUnblock(work_item_id="wi-1", coordinator_epoch=1, resolution="x"),
        R.REJECTION_REASON_INVALID_TRANSITION,
        membership_epoch=2,
    )
    await f.offer("wi-1", "worker-bot")
    await f.coord("work_cancel", wp.WorkCancel(work_item_id="wi-1", coordinator_epoch=1, reason="descoped"))
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_CANCELLED
    await refused(
        w,
        w.coordinator,
        G,
        "work_offer",
        f.offer_body("wi-1", "worker-bot", offer_id="again"),
        R.REJECTION_REASON_TERMINAL_STATE,
        membership_epoch=2,
    )


@pytest.mark.req("MW-10.2-T18")
async def test_mission_cancellation_reaches_every_unfinished_work_item(world: World) -> None:
    w = world
    f = await setup(w)
    for wid in ("wi-1", "wi-2", "wi-3"):
        await f.authorize(wid)
    await f.run_to_submitted(w.worker, "wi-1")
    await f.offer("wi-2", "worker-bot")
    result = await w.run(
        w.owner, G, "mission_cancel", mission_pb2.MissionCancel(reason="budget cut"), membership_epoch=1
    )
    types = [e.type for e in decode_events(result.events)]
    assert types[0] == "mission.cancelled" and types.count("work.cancelled") == 3
    for wid in ("wi-1", "wi-2", "wi-3"):
        assert await f.item_state(wid) == WS.WORK_ITEM_STATE_CANCELLED


@pytest.mark.req("MW-10.4-04", "MW-10.4-03", "MW-10.4-01")
async def test_dependencies_gate_eligibility_and_cycles_are_rejected(world: World) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-a")
    await f.authorize("wi-b", depends_on=("wi-a",))
    await refused(
        w,
        w.coordinator,
        G,
        "work_offer",
        f.offer_body("wi-b", "worker-bot"),
        R.REJECTION_REASON_PRECONDITION_FAILED,
        membership_epoch=2,
    )
    cyclic = f.offer_body("wi-a", "worker-bot", offer_id="cyc")
    cyclic.amended_contract.CopyFrom(builders.contract(w.clock.now(), depends_on=("wi-b",)))
    await refused(
        w, w.coordinator, G, "work_offer", cyclic, R.REJECTION_REASON_DEPENDENCY_CYCLE, membership_epoch=2
    )
    submission = await f.run_to_submitted(w.worker, "wi-a")
    await f.coord(
        "work_accept_result",
        wp.WorkAcceptResult(work_item_id="wi-a", coordinator_epoch=1, submission_event_id=submission),
    )
    await f.offer("wi-b", "worker-bot")  # now eligible


@pytest.mark.req("MW-10.1-01", "MW-10.1-07")
async def test_contract_fields_are_required_and_prose_never_replaces_them(world: World) -> None:
    w = world
    await setup(w)
    prose_only = wp.WorkContract(
        goal="Reconcile the ledger",
        notes="deliver a reconciled ledger; tests must pass; budget 1 EUR; due tomorrow",
    )
    body = wp.WorkAuthorize(work_item_id="wi-x", title="x", contract=prose_only, coordinator_epoch=1)
    await refused(
        w, w.coordinator, G, "work_authorize", body, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=2
    )
    for field in (
        "deliverables",
        "acceptance_criteria",
        "deadline",
        "budget",
        "retry_policy",
        "time_policy",
        "cost_policy",
    ):
        broken = builders.contract(w.clock.now())
        broken.ClearField(field)
        body = wp.WorkAuthorize(work_item_id="wi-x", title="x", contract=broken, coordinator_epoch=1)
        rejection = await refused(
            w,
            w.coordinator,
            G,
            "work_authorize",
            body,
            R.REJECTION_REASON_INVALID_ARGUMENT,
            membership_epoch=2,
        )
        assert field in rejection.message, (field, rejection.message)


@pytest.mark.req("MW-10.1-05", "MW-10.1-02", "MW-10.1-03", "MW-10.1-04")
async def test_ambiguity_blocks_acceptance_until_an_amended_contract_needs_reacceptance(world: World) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    offer_id = await f.offer("wi-1", "worker-bot")
    group = await w.mesh.authority.state(G)  # type: ignore[attr-defined]
    conv = group.work_items["wi-1"].conversation_id
    question = builders.message(conv, "Which ledger: EU or global?")
    question.topic = "ambiguity"
    await f.as_(w.worker, "message_post", question)
    accept = wp.WorkAcceptOffer(work_item_id="wi-1", offer_id=offer_id, contract_revision=1)
    await refused(
        w,
        w.worker,
        G,
        "work_accept_offer",
        accept,
        R.REJECTION_REASON_PRECONDITION_FAILED,
        membership_epoch=3,
    )
    amended = f.offer_body("wi-1", "worker-bot", offer_id="offer-amended")
    amended.amended_contract.CopyFrom(builders.contract(w.clock.now(), goal="Reconcile the EU ledger"))
    await f.coord("work_offer", amended)
    stale = wp.WorkAcceptOffer(work_item_id="wi-1", offer_id="offer-amended", contract_revision=1)
    await refused(
        w, w.worker, G, "work_accept_offer", stale, R.REJECTION_REASON_REVISION_MISMATCH, membership_epoch=3
    )
    await f.accept(w.worker, "wi-1", "offer-amended", revision=2)


@pytest.mark.req("MW-10.3-11", "MW-10.3-10")
async def test_selection_criteria_are_structured_and_hold_no_reasoning(world: World) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    missing = f.offer_body("wi-1", "worker-bot")
    del missing.selection_criteria[:]
    await refused(
        w, w.coordinator, G, "work_offer", missing, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=2
    )
    chatty = f.offer_body("wi-1", "worker-bot")
    chatty.selection_criteria[0].applied_policy_rules.append(
        "I think this worker seems best because it was fast last time"
    )
    await refused(
        w, w.coordinator, G, "work_offer", chatty, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=2
    )


@pytest.mark.req("MW-11.5-12")
async def test_usage_over_a_budget_is_refused_whole(world: World) -> None:
    """Budgets: a renewal whose usage exceeds the WorkItem's cap (or uses an uncapped dimension) writes nothing."""
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    epoch = await f.accept(w.worker, "wi-1", await f.offer("wi-1", "worker-bot"))
    await f.start(w.worker, "wi-1", epoch, "lease-1")
    over = wp.WorkRenewLease(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        usage_delta=common_pb2.ResourceVector(tokens=10_001),
    )
    await refused(
        w, w.worker, G, "work_renew_lease", over, R.REJECTION_REASON_BUDGET_EXCEEDED, membership_epoch=3
    )
    uncapped = wp.WorkRenewLease(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        usage_delta=common_pb2.ResourceVector(side_effects=1),
    )
    await refused(
        w, w.worker, G, "work_renew_lease", uncapped, R.REJECTION_REASON_BUDGET_EXCEEDED, membership_epoch=3
    )
    ok = wp.WorkRenewLease(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        usage_delta=common_pb2.ResourceVector(tokens=10_000),
    )
    renewed = decode_events((await f.as_(w.worker, "work_renew_lease", ok)).events)
    # MW-11.5-12: the charge is its own event, under the name the spec gives it, in the same append.
    [charged] = [e for e in renewed if e.WhichOneof("payload") == "resource_usage_recorded"]
    assert charged.type == "ext.missionweaveprotocol.core.resource_usage_recorded"
    assert (
        charged.resource_usage_recorded.delta.tokens == 10_000
        and len({e.causing_command_id for e in renewed}) == 1
    )
    one_more = wp.WorkRenewLease(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        usage_delta=common_pb2.ResourceVector(tokens=1),
    )
    await refused(
        w, w.worker, G, "work_renew_lease", one_more, R.REJECTION_REASON_BUDGET_EXCEEDED, membership_epoch=3
    )


@pytest.mark.req("MW-7.2-11", "MW-7.1-13", "MW-7.1-14")
async def test_owner_override_is_audited_and_the_coordinator_never_reviews_its_own_work(world: World) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    # MW-7.1-13: the owner's direct assignment is an explicit, audited override with a reason...
    override = f.offer_body("wi-1", "worker-bot", offer_id="direct")
    override.emergency_override = True
    await refused(
        w, w.owner, G, "work_offer", override, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=1
    )
    override.override_reason = "incident: the Coordinator is unresponsive"
    offered = await w.run(w.owner, G, "work_offer", override, membership_epoch=1)
    event = decode_events(offered.events)[0].work_offered
    assert event.emergency_override and event.override_reason
    # ...and still passes the Worker's rules (MW-7.1-14): an expired offer is refused like any other.
    w.clock.advance(seconds=61)
    accept = wp.WorkAcceptOffer(work_item_id="wi-1", offer_id="direct", contract_revision=1)
    await refused(
        w, w.worker, G, "work_accept_offer", accept, R.REJECTION_REASON_OFFER_EXPIRED, membership_epoch=3
    )
    # MW-7.2-11: the Coordinator executed a WorkItem itself; it cannot accept its own result.
    coord_epoch = 2
    await f.authorize("wi-self")
    offer = f.offer_body("wi-self", "coord-bot")
    await w.run(w.coordinator, G, "work_offer", offer, membership_epoch=coord_epoch)
    accepted = await w.run(
        w.coordinator,
        G,
        "work_accept_offer",
        wp.WorkAcceptOffer(work_item_id="wi-self", offer_id=offer.offer_id, contract_revision=1),
        membership_epoch=coord_epoch,
    )
    epoch = decode_events(accepted.events)[0].work_offer_accepted.ownership.ownership_epoch
    await w.run(
        w.coordinator,
        G,
        "work_start",
        wp.WorkStart(work_item_id="wi-self", ownership_epoch=epoch, lease_id="self-lease"),
        membership_epoch=coord_epoch,
    )
    submitted = await w.run(
        w.coordinator,
        G,
        "work_submit",
        Flow.submit_body("wi-self", epoch, "self-lease", [await w.deliverable(w.coordinator, G, "wi-self")]),
        membership_epoch=coord_epoch,
    )
    submission = decode_events(submitted.events)[0].event_id
    review = wp.WorkAcceptResult(work_item_id="wi-self", coordinator_epoch=1, submission_event_id=submission)
    await refused(
        w,
        w.coordinator,
        G,
        "work_accept_result",
        review,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=coord_epoch,
    )
    await w.run(w.owner, G, "work_accept_result", review, membership_epoch=1)
    assert await f.item_state("wi-self") == WS.WORK_ITEM_STATE_VERIFIED


async def started(f: Flow, w: World, work_item_id: str = "wi-1", lease_id: str = "lease-1") -> int:
    await f.authorize(work_item_id)
    epoch = await f.accept(w.worker, work_item_id, await f.offer(work_item_id, "worker-bot"))
    await f.start(w.worker, work_item_id, epoch, lease_id)
    return epoch


@pytest.mark.req("MW-11.3-09", "MW-11.3-08")
async def test_a_replacement_session_returns_the_work_to_queued_before_the_new_runtime_starts(
    world: World,
) -> None:
    """Opening the replacement session is all it takes: without a command from the agent, the
    Authority revokes the old session's lease and the WorkItem is queued again, its owner unchanged;
    the new runtime then starts it under a new lease with nothing left to revoke."""
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    restarted = await w.client.open_session("worker-bot", w.worker.key)  # the agent's runtime restarted
    assert restarted.session_epoch > w.worker.session_epoch

    async def queued() -> bool:
        return (await w.client.work_item(G, "wi-1")).state == WS.WORK_ITEM_STATE_QUEUED

    await polled(queued, limit_s=10)
    item = await w.client.work_item(G, "wi-1")
    assert (
        item.ownership.agent_id == "worker-bot"
        and item.ownership_epoch == epoch
        and not item.HasField("lease")
    )
    log = [e async for e in w.client.read_events(G)]
    [revoked] = [e for e in log if e.WhichOneof("payload") == "lease_revoked"]
    assert revoked.lease_revoked.cause == wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED
    assert (
        revoked.lease_revoked.lease_id == "lease-1"
        and revoked.lease_revoked.session_epoch == w.worker.session_epoch
    )
    assert revoked.lease_revoked.resulting_state == WS.WORK_ITEM_STATE_QUEUED
    assert revoked.actor_id == "authority"
    renew = wp.WorkRenewLease(work_item_id="wi-1", lease_id="lease-1", ownership_epoch=epoch)
    await refused(
        w, restarted, G, "work_renew_lease", renew, R.REJECTION_REASON_INVALID_TRANSITION, membership_epoch=3
    )
    result = await w.run(
        restarted,
        G,
        "work_start",
        wp.WorkStart(work_item_id="wi-1", ownership_epoch=epoch, lease_id="lease-2"),
        membership_epoch=3,
    )
    events = decode_events(result.events)
    assert [e.type for e in events] == ["work.started"]
    assert events[0].work_started.lease.session_epoch == restarted.session_epoch


@pytest.mark.req("MW-11.3-10", "MW-11.3-11", "MW-11.3-12")
async def test_preemption_is_cooperative_checkpoint_then_requeue(world: World) -> None:
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    request = wp.WorkRequestPreemption(
        work_item_id="wi-1",
        preemption_request_id="pre-1",
        lease_id="lease-1",
        reason=wp.PREEMPTION_REASON_PRIORITY,
        coordinator_epoch=1,
        ownership_epoch=epoch,
    )
    await f.coord("work_request_preemption", request)
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_ACTIVE  # never forcibly interrupted (MW-11.3-11)
    wrong = wp.WorkCheckpoint(
        work_item_id="wi-1", lease_id="lease-1", ownership_epoch=epoch, preemption_request_id="pre-x"
    )
    await refused(w, w.worker, G, "work_checkpoint", wrong, R.REJECTION_REASON_NOT_FOUND, membership_epoch=3)
    safe = wp.WorkCheckpoint(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        preemption_request_id="pre-1",
        checkpoint=wp.Checkpoint(checkpoint_id="ck-safe", completed_operation_ids=["op-1"]),
    )
    await f.as_(w.worker, "work_checkpoint", safe)
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_QUEUED  # slot released, back in the Group queue
    resumed = await f.as_(
        w.worker, "work_start", wp.WorkStart(work_item_id="wi-1", ownership_epoch=epoch, lease_id="lease-2")
    )
    assert decode_events(resumed.events)[0].work_started.resume_from_checkpoint_id == "ck-safe"


@pytest.mark.req("MW-11.3-12", "MW-11.3-04")
async def test_the_owner_records_its_own_schedulers_preemption_request_under_its_lease(world: World) -> None:
    """Step 1 of MW-11.3-12 when the Worker's own scheduler asks: the owner records the request in
    the Group (the audit trail) citing its current lease; a stale lease is refused, and nobody but
    the owner or the Coordinator may ask."""
    w = world
    f = await setup(w)
    epoch = await started(f, w)

    def ask(lease_id: str, request_id: str) -> wp.WorkRequestPreemption:
        return wp.WorkRequestPreemption(
            work_item_id="wi-1",
            preemption_request_id=request_id,
            lease_id=lease_id,
            reason=wp.PREEMPTION_REASON_FAIRNESS,
            ownership_epoch=epoch,
        )

    await refused(
        w,
        w.worker,
        G,
        "work_request_preemption",
        ask("lease-0", "pre-stale"),
        R.REJECTION_REASON_LEASE_STALE,
        membership_epoch=3,
    )
    await refused(
        w,
        w.owner,
        G,
        "work_request_preemption",
        ask("lease-1", "pre-owner"),
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=1,
    )
    result = await f.as_(w.worker, "work_request_preemption", ask("lease-1", "pre-own"))
    requested = decode_events(result.events)[0].work_preemption_requested
    assert (requested.preemption_request_id, requested.requested_by, requested.reason) == (
        "pre-own",
        w.worker.identity_id,
        wp.PREEMPTION_REASON_FAIRNESS,
    )
    assert (
        await f.item_state("wi-1") == WS.WORK_ITEM_STATE_ACTIVE
    )  # a request interrupts nothing (MW-11.3-11)


@pytest.mark.req("MW-11.4-01", "MW-11.4-02")
async def test_progress_reports_are_structured(world: World) -> None:
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    vague = wp.WorkReportProgress(
        work_item_id="wi-1",
        lease_id="lease-1",
        ownership_epoch=epoch,
        report=wp.ProgressReport(phase="working"),
    )
    await refused(
        w, w.worker, G, "work_report_progress", vague, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )
    report = wp.ProgressReport(
        phase="reconciling",
        completed_milestones=[wp.Milestone()],
        next_checkpoint=wp.PlannedCheckpoint(),
        revised_estimate=wp.RevisedEstimate(),
        evidence_ids=["ev-1"],
    )
    good = wp.WorkReportProgress(
        work_item_id="wi-1", lease_id="lease-1", ownership_epoch=epoch, report=report
    )
    result = await f.as_(w.worker, "work_report_progress", good)
    assert decode_events(result.events)[0].work_progress_reported.report.phase == "reconciling"


@pytest.mark.req("MW-11.2-01", "MW-11.4-01")
async def test_the_owner_of_queued_work_reports_a_changed_schedule_without_a_lease(world: World) -> None:
    """Accepted but not started: the owner publishes its revised schedule through a progress report
    that cites no lease (there is none yet); citing one, or reporting for another's work, is refused."""
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    epoch = await f.accept(w.worker, "wi-1", await f.offer("wi-1", "worker-bot"))
    now = w.clock.now()
    schedule = wp.ScheduleDisclosure(
        work_item_id="wi-1",
        start_window_begin=to_timestamp(now + timedelta(minutes=5)),
        start_window_end=to_timestamp(now + timedelta(minutes=10)),
        computed_at=to_timestamp(now),
        confidence=wp.ESTIMATE_CONFIDENCE_LOW,
        capacity_status=wp.CAPACITY_STATUS_CONSTRAINED,
    )
    report = wp.ProgressReport(
        phase="queued", next_checkpoint=wp.PlannedCheckpoint(), revised_estimate=wp.RevisedEstimate()
    )
    body = wp.WorkReportProgress(work_item_id="wi-1", ownership_epoch=epoch, report=report, schedule=schedule)
    cites = wp.WorkReportProgress()
    cites.CopyFrom(body)
    cites.lease_id = "lease-1"
    await refused(
        w, w.worker, G, "work_report_progress", cites, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )
    stale = wp.WorkReportProgress()
    stale.CopyFrom(body)
    stale.ownership_epoch = epoch + 1
    await refused(
        w,
        w.worker,
        G,
        "work_report_progress",
        stale,
        R.REJECTION_REASON_OWNERSHIP_EPOCH_STALE,
        membership_epoch=3,
    )
    result = await f.as_(w.worker, "work_report_progress", body)
    reported = decode_events(result.events)[0].work_progress_reported
    assert reported.schedule == schedule and not reported.lease_id
    assert await f.item_state("wi-1") == WS.WORK_ITEM_STATE_QUEUED


@pytest.mark.req("MW-7.3-01", "MW-7.3-03", "MW-11.4-02")
async def test_progress_is_derived_from_the_graph_with_a_critical_path_and_no_percentage(
    world: World,
) -> None:
    from missionweave.v1 import authority_service_pb2 as apb

    w = world
    f = await setup(w)
    await f.authorize("wi-a")
    await f.authorize("wi-b", depends_on=("wi-a",))
    await f.authorize("wi-c", depends_on=("wi-b",))
    await f.authorize("wi-side")
    submission = await f.run_to_submitted(w.worker, "wi-a")
    await f.coord(
        "work_accept_result",
        wp.WorkAcceptResult(work_item_id="wi-a", coordinator_epoch=1, submission_event_id=submission),
    )
    epoch = await f.accept(w.worker, "wi-b", await f.offer("wi-b", "worker-bot"))
    await f.start(w.worker, "wi-b", epoch, "lease-b")
    block = wp.WorkBlock(
        work_item_id="wi-b",
        lease_id="lease-b",
        ownership_epoch=epoch,
        checkpoint=wp.Checkpoint(checkpoint_id="ck"),
        blockers=[
            wp.Blocker(blocker_id="b1", kind=wp.BLOCKER_KIND_DEPENDENCY, required_resolution="finance export")
        ],
    )
    await f.as_(w.worker, "work_block", block)
    progress = await w.client.authority.GetMissionProgress(apb.GetMissionProgressRequest(group_id=G))
    assert list(progress.critical_path) == ["wi-b", "wi-c"]
    assert (progress.required_total, progress.required_verified) == (4, 1)
    items = {i.work_item_id: i for i in progress.work_items}
    assert list(items["wi-a"].accepted_evidence_ids) == ["ev-1"]
    assert list(items["wi-b"].blockers) == ["finance export"] and items["wi-b"].on_critical_path
    assert not items["wi-c"].eligible and items["wi-side"].eligible
    assert progress.used.tokens == 0 and progress.budget.tokens > 0
    # MW-7.3-03: the contract has no field for a percentage at all.
    assert not [f for f in apb.GetMissionProgressResponse.DESCRIPTOR.fields if "percent" in f.name]


@pytest.mark.req("MW-11.4-08", "MW-11.4-10")
async def test_transient_failures_retry_with_backoff_until_the_attempt_budget_is_spent(world: World) -> None:
    w = world
    f = await setup(w)
    contract = builders.contract(w.clock.now(), retry_policy=wp.RetryPolicy(max_attempts=2))
    contract.retry_policy.initial_backoff.FromSeconds(30)
    await f.coord(
        "work_authorize",
        wp.WorkAuthorize(work_item_id="wi-r", title="flaky", contract=contract, coordinator_epoch=1),
    )
    epoch = await f.accept(w.worker, "wi-r", await f.offer("wi-r", "worker-bot"))
    await f.start(w.worker, "wi-r", epoch, "lease-1")

    def transient(lease: str) -> wp.WorkFail:
        return wp.WorkFail(
            work_item_id="wi-r",
            lease_id=lease,
            ownership_epoch=epoch,
            kind=wp.WORK_FAILURE_KIND_TRANSIENT,
            evidence=[builders.evidence("ev-timeout")],
            reason="upstream timed out",
        )

    result = await f.as_(w.worker, "work_fail", transient("lease-1"))
    revoked = decode_events(result.events)[-1].lease_revoked
    assert (
        revoked.cause == wp.LEASE_REVOCATION_CAUSE_FAILED
        and revoked.resulting_state == WS.WORK_ITEM_STATE_QUEUED
    )
    kept = [
        e.evidence_recorded.evidence.evidence_id
        for e in decode_events(result.events)
        if e.type == "work.evidence_recorded"
    ]
    assert kept == ["ev-timeout"]  # the failed attempt's Evidence stays in the log
    assert await f.item_state("wi-r") == WS.WORK_ITEM_STATE_QUEUED
    early = wp.WorkStart(work_item_id="wi-r", ownership_epoch=epoch, lease_id="lease-2")
    await refused(
        w, w.worker, G, "work_start", early, R.REJECTION_REASON_PRECONDITION_FAILED, membership_epoch=3
    )
    w.clock.advance(seconds=31)
    await f.start(w.worker, "wi-r", epoch, "lease-2")  # attempt 2 of 2
    final = await f.as_(w.worker, "work_fail", transient("lease-2"))
    failed = decode_events(final.events)[-1].work_failed
    assert failed.kind == wp.WORK_FAILURE_KIND_RETRIES_EXHAUSTED and len(failed.evidence) == 1
    assert await f.item_state("wi-r") == WS.WORK_ITEM_STATE_FAILED


@pytest.mark.req("MW-10.2-T01", "MW-10.2-T02", "MW-9.1-17", "MW-9-13")
async def test_any_member_proposes_and_the_coordinator_authorizes_the_proposal(world: World) -> None:
    w = world
    f = await setup(w)
    proposal = wp.WorkPropose(
        proposal_id="prop-1",
        title="also check FX rates",
        contract=builders.contract(w.clock.now()),
        rationale="rates moved",
    )
    proposed = await f.as_(w.worker, "work_propose", proposal)
    assert [e.type for e in decode_events(proposed.events)] == ["work.proposed"]  # no WorkItem exists yet
    group = await w.mesh.authority.state(G)  # type: ignore[attr-defined]
    assert not group.work_items and group.proposals["prop-1"].open
    # A proposal confers no authority: the worker cannot authorize it (MW-9.1-18).
    body = wp.WorkAuthorize(
        work_item_id="wi-fx",
        title="FX check",
        contract=builders.contract(w.clock.now()),
        proposal_id="prop-1",
        coordinator_epoch=1,
    )
    await refused(
        w, w.worker, G, "work_authorize", body, R.REJECTION_REASON_PERMISSION_DENIED, membership_epoch=3
    )
    await f.coord("work_authorize", body)
    group = await w.mesh.authority.state(G)  # type: ignore[attr-defined]
    assert "wi-fx" in group.work_items and not group.proposals["prop-1"].open
    again = wp.WorkAuthorize(
        work_item_id="wi-fx2",
        title="dup",
        contract=builders.contract(w.clock.now()),
        proposal_id="prop-1",
        coordinator_epoch=1,
    )
    await refused(
        w, w.coordinator, G, "work_authorize", again, R.REJECTION_REASON_NOT_FOUND, membership_epoch=2
    )


@pytest.mark.req("MW-10.2-T06")
async def test_execution_approval_gates_the_start(world: World) -> None:
    w = world
    f = await setup(w)
    contract = builders.contract(w.clock.now(), requires_execution_approval=True)
    await f.coord(
        "work_authorize",
        wp.WorkAuthorize(work_item_id="wi-risky", title="deploy", contract=contract, coordinator_epoch=1),
    )
    epoch = await f.accept(w.worker, "wi-risky", await f.offer("wi-risky", "worker-bot"))
    start = wp.WorkStart(work_item_id="wi-risky", ownership_epoch=epoch, lease_id="lease-1")
    await refused(
        w, w.worker, G, "work_start", start, R.REJECTION_REASON_PRECONDITION_FAILED, membership_epoch=3
    )
    grant = wp.ApprovalGrantExecution(work_item_id="wi-risky", contract_revision=1, ownership_epoch=epoch)
    await refused(
        w,
        w.worker,
        G,
        "approval_grant_execution",
        grant,
        R.REJECTION_REASON_PERMISSION_DENIED,
        membership_epoch=3,
    )
    await w.run(
        w.owner, G, "approval_grant_execution", grant, membership_epoch=1
    )  # the owner approves by default
    assert await f.item_state("wi-risky") == WS.WORK_ITEM_STATE_QUEUED  # the grant executes nothing
    await f.as_(w.worker, "work_start", start)


@pytest.mark.req("MW-10.3-09", "MW-10.3-08")
async def test_declines_carry_a_structured_reason(world: World) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    offer_id = await f.offer("wi-1", "worker-bot")
    bare = wp.WorkDeclineOffer(work_item_id="wi-1", offer_id=offer_id)
    await refused(
        w, w.worker, G, "work_decline_offer", bare, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )
    bare.decline.CopyFrom(
        wp.StructuredDecline(reason=wp.DECLINE_REASON_CAPACITY, detail="queue full until 14:00")
    )
    declined = await f.as_(w.worker, "work_decline_offer", bare)
    assert decode_events(declined.events)[0].work_offer_declined.decline.reason == wp.DECLINE_REASON_CAPACITY


@pytest.mark.req("MW-10.3-07")
async def test_acceptance_checks_capability_and_deadline(world: World) -> None:
    """The Authority enforces the admission checks it can see: the accepting Worker's Membership must
    carry every required capability at the required version, and the deadline must not have passed."""
    w = world
    f = await setup(w)
    needs = builders.contract(w.clock.now())
    needs.required_capabilities.add(capability_id="ledger.reconcile", version="2.1")
    needs.deadline.CopyFrom(to_timestamp(w.clock.now() + timedelta(minutes=30)))
    await f.coord(
        "work_authorize",
        wp.WorkAuthorize(work_item_id="wi-cap", title="cap", contract=needs, coordinator_epoch=1),
    )
    offer_id = await f.offer("wi-cap", "worker-bot", seconds=3600)
    accept = wp.WorkAcceptOffer(work_item_id="wi-cap", offer_id=offer_id, contract_revision=1)
    await refused(
        w,
        w.worker,
        G,
        "work_accept_offer",
        accept,
        R.REJECTION_REASON_PRECONDITION_FAILED,
        membership_epoch=3,
    )
    skilled = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    skilled.capabilities.add(capability_id="ledger.reconcile", version="2.3")
    await w.run(w.owner, G, "membership_grant", skilled, membership_epoch=1)
    epoch = await w.epoch_of(G, "worker-bot")
    w.clock.advance(minutes=31)
    await refused(
        w,
        w.worker,
        G,
        "work_accept_offer",
        accept,
        R.REJECTION_REASON_PRECONDITION_FAILED,
        membership_epoch=epoch,
    )
    w.clock.advance(minutes=-31)
    await w.run(w.worker, G, "work_accept_offer", accept, membership_epoch=epoch)


@pytest.mark.req("MW-10.2-05")
async def test_commands_against_a_stale_work_item_revision_are_refused(world: World) -> None:
    """Optimistic concurrency on the WorkItem aggregate (OP-10): a command may name the revision it
    read; if the WorkItem moved on since, nothing is written."""
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    group = await w.mesh.authority.state(G)  # type: ignore[attr-defined]
    read = group.work_items["wi-1"].revision
    await f.offer("wi-1", "worker-bot")  # the WorkItem moves on
    stale = common_pb2.ExpectedRevision(
        kind=common_pb2.REVISION_KIND_WORK_ITEM, aggregate_id="wi-1", revision=read
    )
    cancel = wp.WorkCancel(work_item_id="wi-1", coordinator_epoch=1, reason="descoped")
    await refused(
        w,
        w.coordinator,
        G,
        "work_cancel",
        cancel,
        R.REJECTION_REASON_REVISION_MISMATCH,
        membership_epoch=2,
        expected_revision=stale,
    )
    group = await w.mesh.authority.state(G)  # type: ignore[attr-defined]
    fresh = common_pb2.ExpectedRevision(
        kind=common_pb2.REVISION_KIND_WORK_ITEM,
        aggregate_id="wi-1",
        revision=group.work_items["wi-1"].revision,
    )
    await f.w.run(w.coordinator, G, "work_cancel", cancel, membership_epoch=2, expected_revision=fresh)


@pytest.mark.req("MW-11.3-06", "MW-11.3-07", "MW-11.3-08")
async def test_capability_tokens_are_bound_to_the_lease_narrow_rotate_and_end_with_it(world: World) -> None:
    from missionweave_server.services.authority.rules.work.leases import token_valid

    w = world
    f = await setup(w)
    contract = builders.contract(w.clock.now())
    contract.permissions.allowed_tools.extend(["sql.query", "python.exec"])
    contract.permissions.allowed_data.append("db:ledger:read")
    await f.coord(
        "work_authorize",
        wp.WorkAuthorize(work_item_id="wi-t", title="tok", contract=contract, coordinator_epoch=1),
    )
    epoch = await f.accept(w.worker, "wi-t", await f.offer("wi-t", "worker-bot"))
    too_wide = wp.WorkStart(work_item_id="wi-t", ownership_epoch=epoch, lease_id="lease-1")
    too_wide.requested_scope.allowed_tools.append("shell.exec")
    await refused(
        w, w.worker, G, "work_start", too_wide, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )
    start = wp.WorkStart(work_item_id="wi-t", ownership_epoch=epoch, lease_id="lease-1")
    start.requested_scope.allowed_tools.append("sql.query")
    started = decode_events((await f.as_(w.worker, "work_start", start)).events)[0].work_started
    token = started.token
    assert (
        token.lease_id == "lease-1"
        and token.ownership_epoch == epoch
        and list(token.scope.allowed_tools) == ["sql.query"]
    )
    assert token.expires_at == started.lease.expires_at  # never outlives its lease (MW-11.3-07)
    assert token.limit.tokens == contract.budget.tokens
    renew = wp.WorkRenewLease(
        work_item_id="wi-t",
        lease_id="lease-1",
        ownership_epoch=epoch,
        usage_delta=common_pb2.ResourceVector(tokens=400),
    )
    renew.requested_scope.allowed_tools.append("python.exec")  # wider than the current token: refused
    await refused(
        w, w.worker, G, "work_renew_lease", renew, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )
    del renew.requested_scope.allowed_tools[:]
    rotated = decode_events((await f.as_(w.worker, "work_renew_lease", renew)).events)[
        0
    ].work_lease_renewed.token
    assert rotated.replaces_token_id == token.token_id and rotated.lease_id == "lease-1"
    assert (
        list(rotated.scope.allowed_tools) == ["sql.query"]
        and rotated.limit.tokens == contract.budget.tokens - 400
    )
    group = await w.mesh.authority.state(G)  # type: ignore[attr-defined]
    assert token_valid(group, rotated.token_id, w.clock.now()) and not token_valid(
        group, token.token_id, w.clock.now()
    )
    await f.as_(
        w.worker,
        "work_checkpoint",
        wp.WorkCheckpoint(
            work_item_id="wi-t",
            lease_id="lease-1",
            ownership_epoch=epoch,
            checkpoint=wp.Checkpoint(checkpoint_id="ck"),
        ),
    )
    group = await w.mesh.authority.state(G)  # type: ignore[attr-defined]
    assert not token_valid(group, rotated.token_id, w.clock.now())  # released with its lease (MW-11.3-08)


@pytest.mark.req("MW-13.2-02", "MW-13.2-04", "MW-13.2-05")
async def test_submission_needs_evidence_per_criterion_recorded_with_every_field(world: World) -> None:
    w = world
    f = await setup(w)
    epoch = await started(f, w)
    without = Flow.submit_body("wi-1", epoch, "lease-1")
    del without.evidence[:]
    await refused(
        w, w.worker, G, "work_submit", without, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )
    other_criterion = Flow.submit_body("wi-1", epoch, "lease-1")
    other_criterion.evidence[0].criterion_id = "something-else"
    await refused(
        w,
        w.worker,
        G,
        "work_submit",
        other_criterion,
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=3,
    )
    ghost_written = Flow.submit_body("wi-1", epoch, "lease-1")
    ghost_written.evidence[0].producer_id = "coord-bot"
    await refused(
        w, w.worker, G, "work_submit", ghost_written, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )
    essay = Flow.submit_body("wi-1", epoch, "lease-1")
    essay.evidence[0].summary = (
        "First I considered... " * 200
    )  # a thought process is not a result (MW-13.2-05)
    await refused(
        w, w.worker, G, "work_submit", essay, R.REJECTION_REASON_INVALID_ARGUMENT, membership_epoch=3
    )
    good = Flow.submit_body("wi-1", epoch, "lease-1", [await w.deliverable(w.worker, G, "wi-1")])
    log = await w.deliverable(w.worker, G, "wi-1", b"test log: 12 passed\n")
    good.evidence[0].artifacts.append(log)
    submitted = decode_events((await f.as_(w.worker, "work_submit", good)).events)[0].work_submitted
    record = submitted.evidence[0]
    assert record.subject.work_item_id == "wi-1" and record.criterion_id == "balances"
    assert record.method == wp.EVIDENCE_METHOD_TEST and record.result == wp.EVIDENCE_RESULT_PASS
    assert (
        record.producer_id == "worker-bot"
        and record.HasField("produced_at")
        and record.HasField("recorded_at")
    )
    assert record.artifacts[0] == log
    assert not [
        f
        for f in wp.Evidence.DESCRIPTOR.fields
        if any(k in f.name for k in ("reason", "thought", "rationale"))
    ]
