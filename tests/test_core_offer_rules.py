"""Offers, acceptance and declines (spec 10.2 rows T03..T05, 10.3) through decide and evolve: the exact
events each command appends, the exact reason of each refusal, and the state later rules read."""

from __future__ import annotations

import copy

import pytest

from missionweave.kernel import ids
from missionweave.v1 import membership_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.common import CardInfo
from missionweave_server.services.authority.state import OfferState, OwnershipState
from tests import builders
from tests.work_rules_fixtures import (
    GROUP,
    PY,
    WS,
    R,
    accept,
    active,
    after,
    at,
    authorize,
    base,
    ctx_at,
    events,
    offer,
    offered,
    queued,
    refused,
    ts,
)

# ---------------------------------------------------------------- work.offer


@pytest.mark.req("MW-10.2-T03", "MW-10.3-02", "MW-10.3-10")
def test_an_offer_appends_one_work_offered_with_every_field_and_reserves_no_owner() -> None:
    state = base()
    body = offer("worker", "w2", context_package=builders.artifact("c"))
    out = events(state, "work_offer", body, "coord")
    assert [e.type for e in out] == ["work.offered"]
    assert out[0].work_offered == wp.WorkOffered(
        work_item_id="wi",
        offer_id="off-1",
        candidate_ids=["worker", "w2"],
        expires_at=body.expires_at,
        contract_revision=1,
        selection_criteria=body.selection_criteria,
        context_package=builders.artifact("c"),
        coordinator_epoch=1,
        previous_state=WS.WORK_ITEM_STATE_OPEN,
    )
    assert not out[0].work_offered.HasField("amended_contract")
    item = after(state, out).work_items["wi"]
    assert item.state == WS.WORK_ITEM_STATE_OFFERED
    assert item.owner is None  # MW-10.3-02: no ownership before acceptance
    assert item.offers == {"off-1": OfferState("off-1", ("worker", "w2"), at(5), 1)}
    assert item.offer_criteria == {"off-1": list(body.selection_criteria)}
    assert item.revision == state.work_items["wi"].revision + 1
    assert after(state, out).last_work_change_sequence == out[0].sequence


@pytest.mark.req("MW-10.2-T03")
def test_an_offer_without_an_id_gets_one_derived_from_the_group_and_command() -> None:
    state = base()
    c = GROUP.command("work_offer", offer(offer_id=""), "coord", state)
    out = decider.decide(state, c, GROUP.ctx)
    assert not isinstance(out, Exception)
    assert out[0].work_offered.offer_id == ids.derived_id("offer", "grp_w", c.command_id)


@pytest.mark.req("MW-10.2-T03")
@pytest.mark.parametrize("offer_id", ["bad id", "x" * 129])
def test_an_offer_id_must_be_valid(offer_id: str) -> None:
    r = refused(base(), "work_offer", offer(offer_id=offer_id), "coord")
    assert r.message == "body.offer_id: a valid id not yet used for this WorkItem"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.offer_id"})


@pytest.mark.req("MW-10.2-T03")
def test_an_offer_id_is_not_reused_for_the_work_item() -> None:
    r = refused(offered(), "work_offer", offer(offer_id="off-1"), "coord")
    assert r.message == "body.offer_id: a valid id not yet used for this WorkItem"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.offer_id"})


@pytest.mark.req("MW-10.2-T03", "OP-11")
def test_a_live_owner_refuses_an_offer_and_its_expiry_lets_it_through_fenced_first() -> None:
    state = queued()  # ownership lease ends at +2 min (start_deadline 120 s)
    r = refused(state, "work_offer", offer(offer_id="off-2", minutes=10), "coord", ctx_at(1.99))
    assert r.message == "wi has a live owner (worker); offers need none (OP-11)"
    assert r.reason == R.REJECTION_REASON_INVALID_TRANSITION
    ctx = ctx_at(2)
    out = events(state, "work_offer", offer("w2", offer_id="off-2", minutes=10), "coord", ctx)
    assert [e.type for e in out] == ["work.lease_revoked", "work.offered"]
    assert out[0].lease_revoked == wp.LeaseRevoked(
        work_item_id="wi",
        lease_kind=wp.WORK_LEASE_KIND_OWNERSHIP,
        ownership_epoch=1,
        agent_id="worker",
        end_kind=wp.LEASE_END_KIND_EXPIRED,
        cause=wp.LEASE_REVOCATION_CAUSE_EXPIRY_FENCED,
        resulting_state=WS.WORK_ITEM_STATE_QUEUED,
    )
    assert out[1].work_offered.previous_state == WS.WORK_ITEM_STATE_QUEUED
    item = after(state, out).work_items["wi"]
    assert (item.state, item.owner, item.lease) == (WS.WORK_ITEM_STATE_OFFERED, None, None)


@pytest.mark.req("MW-10.2-T03", "MW-11.3-08", "OP-11")
def test_fencing_an_expired_execution_lease_names_the_lease_its_session_and_its_token() -> None:
    state = active()
    lease = state.work_items["wi"].lease
    assert lease is not None
    out = events(state, "work_offer", offer("w2", offer_id="off-2", minutes=10), "coord", ctx_at(3))
    assert out[0].lease_revoked == wp.LeaseRevoked(
        work_item_id="wi",
        lease_kind=wp.WORK_LEASE_KIND_EXECUTION,
        lease_id="lease-1",
        ownership_epoch=1,
        agent_id="worker",
        session_epoch=1,
        end_kind=wp.LEASE_END_KIND_EXPIRED,
        cause=wp.LEASE_REVOCATION_CAUSE_EXPIRY_FENCED,
        resulting_state=WS.WORK_ITEM_STATE_ACTIVE,
        revoked_token_ids=[lease.token_id],
    )
    item = after(state, out).work_items["wi"]
    assert item.lease is None and item.owner is None
    record = item.lease_history["lease-1"]
    assert (record.ended_at, record.end_kind) == (at(3), wp.LEASE_END_KIND_EXPIRED)


@pytest.mark.req("MW-10.3-04")
@pytest.mark.parametrize(
    "candidates", [[], ["worker", "w2", "w3", "m1", "m2", "m3", "m4", "m5", "worker"], ["worker", "worker"]]
)
def test_an_offer_names_one_to_eight_distinct_candidates(candidates: list[str]) -> None:
    body = offer(selection_criteria=[builders.selection(c) for c in dict.fromkeys(candidates)])
    body.ClearField("candidate_ids")
    body.candidate_ids.extend(candidates)
    r = refused(base(), "work_offer", body, "coord")
    assert r.message == "body.candidate_ids: 1..8 distinct candidates"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.candidate_ids"})


@pytest.mark.req("MW-10.3-04")
def test_eight_distinct_candidates_are_a_bounded_set() -> None:
    eight = ("worker", "w2", "w3", "m1", "m2", "m3", "m4", "m5")
    out = events(base(), "work_offer", offer(*eight), "coord")
    assert list(out[0].work_offered.candidate_ids) == list(eight)


def _inactive(state: object, member: str) -> object:
    state = copy.deepcopy(state)
    state.members[member].active = False  # type: ignore[attr-defined]
    return state


@pytest.mark.req("MW-10.3-04", "MW-8-06")
@pytest.mark.parametrize("case", ["stranger", "inactive", "lapsed"])
def test_every_candidate_holds_an_active_membership(case: str) -> None:
    state = base()
    candidate = "w2"
    if case == "stranger":
        candidate = "nobody"
    elif case == "inactive":
        state.members["w2"].active = False
    else:
        state.members["w2"].provisional, state.members["w2"].expires_at = True, at(0)
    r = refused(state, "work_offer", offer("worker", candidate), "coord")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.candidate_ids[1]"})
    assert r.message == f"body.candidate_ids[1]: {candidate} holds no active Membership in this Group"


@pytest.mark.req("MW-10.3-04")
def test_an_observer_is_no_candidate() -> None:
    r = refused(base(), "work_offer", offer("worker", "obs"), "coord")
    assert (
        r.message
        == "body.candidate_ids[1]: obs is a observer; work is offered to roles that may accept it (docs/authorization.md)"
    )
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.candidate_ids[1]"})
    assert "observer" in r.message


@pytest.mark.req("MW-8-06")
def test_an_offer_to_a_provisional_member_expires_no_later_than_its_membership() -> None:
    state = base()
    state.members["w2"].provisional, state.members["w2"].expires_at = True, at(5)
    assert events(state, "work_offer", offer("w2", minutes=5), "coord")
    r = refused(state, "work_offer", offer("w2", minutes=5.5), "coord")
    assert (
        r.message
        == "body.expires_at: an offer to w2 expires no later than its provisional Membership (MW-8-06)"
    )
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.expires_at"})
    state.members["w2"].expires_at = None  # no expiry recorded: nothing to compare
    assert events(state, "work_offer", offer("w2", minutes=5.5), "coord")


def _needs_python(state: object) -> object:
    state.work_items["wi"].contract.required_capabilities.append(PY)  # type: ignore[attr-defined]
    return state


@pytest.mark.req("MW-11.1-13")
def test_a_candidate_whose_card_lacks_a_required_capability_is_refused_with_its_card_named() -> None:
    state = _needs_python(base())
    old = ctx_at(0, cards={"w2": CardInfo("card-7", {"code.python": "3.11"}, 1)})
    r = refused(state, "work_offer", offer("worker", "w2"), "coord", old)
    assert r.message == "w2's Agent Card card-7 does not declare code.python >= 3.12"
    assert r.reason == R.REJECTION_REASON_PRECONDITION_FAILED
    assert r.metadata == {
        "field": "body.candidate_ids[1]",
        "capability": "code.python",
        "card_version": "card-7",
    }
    fine = ctx_at(0, cards={"w2": CardInfo("card-8", {"code.python": "3.12"}, 1)})
    assert events(state, "work_offer", offer("worker", "w2"), "coord", fine)


@pytest.mark.req("MW-11.1-13", "MW-10.1-05")
def test_the_card_check_reads_the_amended_contract_when_there_is_one() -> None:
    amended = builders.contract(at(0), required_capabilities=[PY])
    ctx = ctx_at(0, cards={"worker": CardInfo("card-1", {}, 1)})
    r = refused(base(), "work_offer", offer(amended_contract=amended), "coord", ctx)
    assert r.message == "worker's Agent Card card-1 does not declare code.python >= 3.12"
    assert r.metadata["capability"] == "code.python"


@pytest.mark.req("MW-10.3-10")
def test_each_candidate_has_its_structured_selection_criteria() -> None:
    body = offer("worker", "w2", selection_criteria=[builders.selection("worker")])
    r = refused(base(), "work_offer", body, "coord")
    assert (
        r.message
        == "body.selection_criteria[1]: structured selection criteria for w2 are required (MW-10.3-10)"
    )
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.selection_criteria[1]"},
    )


@pytest.mark.req("MW-10.3-10")
def test_selection_criteria_name_only_candidates() -> None:
    body = offer("worker", selection_criteria=[builders.selection("worker"), builders.selection("w2")])
    r = refused(base(), "work_offer", body, "coord")
    assert r.message == "body.selection_criteria[1].candidate_id: not a candidate of this offer"
    assert r.metadata == {"field": "body.selection_criteria[1].candidate_id"}


@pytest.mark.req("MW-10.3-10")
def test_selection_criteria_name_the_policy_rules_applied() -> None:
    bare = builders.selection("w2")
    del bare.applied_policy_rules[:]
    r = refused(
        base(),
        "work_offer",
        offer("worker", "w2", selection_criteria=[builders.selection("worker"), bare]),
        "coord",
    )
    assert r.message == "body.selection_criteria[1].applied_policy_rules: name the policy rules applied"
    assert r.metadata == {"field": "body.selection_criteria[1].applied_policy_rules"}


@pytest.mark.req("MW-10.3-11")
@pytest.mark.parametrize("where", ["applied_policy_rules", "authorization_basis"])
def test_selection_criteria_hold_rule_ids_never_free_form_reasoning(where: str) -> None:
    prose = builders.selection("w2")
    getattr(prose, where).append("I think w2 is the best because it is fast")
    body = offer("worker", "w2", selection_criteria=[builders.selection("worker"), prose])
    r = refused(base(), "work_offer", body, "coord")
    assert (r.reason, r.metadata) == (
        R.REJECTION_REASON_INVALID_ARGUMENT,
        {"field": "body.selection_criteria[1]"},
    )
    entry = 2 if where == "applied_policy_rules" else 3  # the rules first, then the basis
    assert r.message == (
        f"body.selection_criteria[1]: entry {entry} is not a rule/basis id; selection records hold no free-form"
        " reasoning (MW-10.3-11)"
    )


@pytest.mark.req("MW-10.2-T03", "MW-10.2-T05")
@pytest.mark.parametrize("minutes", [None, 0, -1])
def test_an_offer_expires_in_the_future(minutes: float | None) -> None:
    body = offer(minutes=minutes or 0)
    if minutes is None:
        body.ClearField("expires_at")
    r = refused(base(), "work_offer", body, "coord")
    assert r.message == "body.expires_at: an offer expiry in the future is required"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.expires_at"})


@pytest.mark.req("MW-10.2-T03", "MW-10.3-05")
def test_a_new_offer_supersedes_the_open_one_and_withdraws_it_first() -> None:
    state = offered("worker", "w2")
    out = events(state, "work_offer", offer("w3", offer_id="off-2"), "coord")
    assert [e.type for e in out] == ["work.offers_withdrawn", "work.offered"]
    assert out[0].work_offers_withdrawn == wp.WorkOffersWithdrawn(
        work_item_id="wi",
        offer_ids=["off-1"],
        candidate_ids=["w2", "worker"],
        reason=wp.OFFER_WITHDRAWAL_REASON_SUPERSEDED,
    )
    assert out[1].work_offered.previous_state == WS.WORK_ITEM_STATE_OFFERED
    item = after(state, out).work_items["wi"]
    assert (item.offers["off-1"].open, item.offers["off-2"].open) == (False, True)
    assert item.revision == state.work_items["wi"].revision + 2
    r = refused(after(state, out), "work_accept_offer", accept("off-1"), "worker")
    assert r.message == "offer off-1 was withdrawn (another acceptance won or it was superseded)"
    assert r.reason == R.REJECTION_REASON_INVALID_TRANSITION


@pytest.mark.req("MW-10.1-04", "MW-10.1-05")
def test_an_amended_contract_is_a_new_revision_that_voids_open_offers_and_resolves_ambiguities() -> None:
    state = offered()
    state.work_items["wi"].open_ambiguities.add("amb-1")
    amended = builders.contract(at(0), depends_on=("dep",), goal="Reconcile Q3 and Q4")
    state = GROUP.run(state, "work_authorize", authorize("dep"), "coord")
    state.work_items["dep"].state = WS.WORK_ITEM_STATE_VERIFIED
    out = events(state, "work_offer", offer("w2", offer_id="off-2", amended_contract=amended), "coord")
    assert [e.type for e in out] == ["work.offers_withdrawn", "work.offered"]
    assert out[0].work_offers_withdrawn.reason == wp.OFFER_WITHDRAWAL_REASON_CONTRACT_REVISED
    expected = copy.deepcopy(amended)
    expected.revision = 2
    assert out[1].work_offered.amended_contract == expected
    assert out[1].work_offered.contract_revision == 2
    item = after(state, out).work_items["wi"]
    assert (item.contract, item.contract_revision, item.depends_on) == (expected, 2, ("dep",))
    assert item.open_ambiguities == set()
    assert item.offers["off-2"].contract_revision == 2
    # MW-10.1-05: the Worker accepts the new revision, not the old one.
    r = refused(after(state, out), "work_accept_offer", accept("off-2", revision=1), "w2")
    assert r.message == "accept contract revision 2, not 1 (MW-10.1-05)"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_REVISION_MISMATCH, {"current_revision": "2"})


@pytest.mark.req("MW-10.1-01")
def test_an_amended_contract_is_validated_like_an_authorized_one() -> None:
    r = refused(base(), "work_offer", offer(amended_contract=builders.contract(at(0), goal="")), "coord")
    assert r.message == "body.amended_contract.goal: a goal of 1..4096 characters is required"
    assert r.metadata == {"field": "body.amended_contract.goal"}


@pytest.mark.req("MW-10.4-04")
def test_amended_dependencies_that_close_a_cycle_are_refused() -> None:
    state = GROUP.run(
        base(),
        "work_authorize",
        authorize("dep", contract=builders.contract(at(0), depends_on=("wi",))),
        "coord",
    )
    amended = builders.contract(at(0), depends_on=("dep",))
    r = refused(state, "work_offer", offer(amended_contract=amended), "coord")
    assert r.message == "the amended dependencies of wi form a cycle"
    assert r.reason == R.REJECTION_REASON_DEPENDENCY_CYCLE


@pytest.mark.req("MW-10.4-03")
def test_the_current_contract_is_offered_only_once_its_dependencies_are_satisfied() -> None:
    state = GROUP.run(base(), "work_authorize", authorize("dep"), "coord")
    state = GROUP.run(
        state,
        "work_authorize",
        authorize("late", contract=builders.contract(at(0), depends_on=("dep",))),
        "coord",
    )
    r = refused(state, "work_offer", offer(work_item_id="late"), "coord")
    assert (
        r.message
        == "work.offer: the dependencies of late do not satisfy its dependency policy yet (MW-10.4-03)"
    )
    assert r.reason == R.REJECTION_REASON_PRECONDITION_FAILED
    # An amended contract is a new revision: its dependencies are judged when it is accepted.
    amended = builders.contract(at(0), depends_on=("dep",))
    assert events(state, "work_offer", offer(work_item_id="late", amended_contract=amended), "coord")


@pytest.mark.req("MW-10.2-T03", "MW-10.3-04")
def test_an_extension_adds_candidates_to_the_open_offer_and_keeps_their_criteria() -> None:
    state = offered("worker", "w2")
    body = offer("w2", "w3", offer_id="", extends_offer_id="off-1", minutes=7)
    body.selection_criteria[0].rank = 5
    out = events(state, "work_offer", body, "coord")
    assert [e.type for e in out] == ["work.offered"]  # the extended offer is not withdrawn
    p = out[0].work_offered
    assert (p.offer_id, list(p.candidate_ids), p.extends_offer_id) == (
        "off-1",
        ["worker", "w2", "w3"],
        "off-1",
    )
    item = after(state, out).work_items["wi"]
    assert item.offers["off-1"] == OfferState("off-1", ("worker", "w2", "w3"), at(7), 1)
    criteria = {c.candidate_id: c.rank for c in item.offer_criteria["off-1"]}
    assert criteria == {"worker": 1, "w2": 5, "w3": 1}


@pytest.mark.req("MW-10.2-T03")
def test_only_an_open_offer_is_extended() -> None:
    r = refused(offered(), "work_offer", offer("w2", offer_id="", extends_offer_id="off-9"), "coord")
    assert r.message == "no open offer off-9 to extend"
    assert r.reason == R.REJECTION_REASON_NOT_FOUND
    state = offered()
    state.work_items["wi"].offers["off-1"].open = False
    r = refused(state, "work_offer", offer("w2", offer_id="", extends_offer_id="off-1"), "coord")
    assert r.message == "no open offer off-1 to extend"
    assert r.reason == R.REJECTION_REASON_NOT_FOUND


@pytest.mark.req("MW-10.3-04")
def test_an_extension_stays_within_eight_candidates() -> None:
    state = offered("worker", "w2", "w3", "m1", "m2")
    extra = ("m3", "m4", "m5")
    assert events(state, "work_offer", offer(*extra, offer_id="", extends_offer_id="off-1"), "coord")
    state.members["m6"] = copy.deepcopy(state.members["m5"])
    state.members["m6"].member_id = "m6"
    r = refused(state, "work_offer", offer(*extra, "m6", offer_id="", extends_offer_id="off-1"), "coord")
    assert r.message == "body.candidate_ids: the extended offer would have more than 8 candidates"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.candidate_ids"})


@pytest.mark.req("MW-10.2-T03")
def test_a_re_offer_after_a_failure_clears_the_old_owner_and_lease() -> None:
    state = queued()
    item = state.work_items["wi"]
    item.state, item.owner = WS.WORK_ITEM_STATE_FAILED, None
    out = events(state, "work_offer", offer("w2", offer_id="off-2"), "coord")
    assert [e.type for e in out] == ["work.offered"]
    assert out[0].work_offered.previous_state == WS.WORK_ITEM_STATE_FAILED
    assert after(state, out).work_items["wi"].state == WS.WORK_ITEM_STATE_OFFERED


# ---------------------------------------------------------------- work.accept_offer


@pytest.mark.req("MW-10.2-T04", "MW-10.3-05", "MW-11.3-02", "MW-10.3-10")
def test_the_first_acceptance_wins_a_new_ownership_epoch_and_withdraws_every_other_offer() -> None:
    state = offered("worker", "w2")
    out = events(state, "work_accept_offer", accept(schedule=wp.ScheduleDisclosure()), "w2")
    assert [e.type for e in out] == ["work.offer_accepted", "work.offers_withdrawn"]
    assert out[0].work_offer_accepted == wp.WorkOfferAccepted(
        work_item_id="wi",
        offer_id="off-1",
        agent_id="w2",
        ownership=wp.OwnershipGrant(
            work_item_id="wi",
            agent_id="w2",
            ownership_epoch=1,
            granted_at=ts(0),
            start_deadline=ts(2),
            lease_kind=wp.WORK_LEASE_KIND_OWNERSHIP,
            expires_at=ts(2),
            offer_id="off-1",
            contract_revision=1,
        ),
        selection_criteria=builders.selection("w2"),
        schedule=wp.ScheduleDisclosure(),
    )
    assert out[1].work_offers_withdrawn == wp.WorkOffersWithdrawn(
        work_item_id="wi",
        offer_ids=["off-1"],
        candidate_ids=["w2", "worker"],
        reason=wp.OFFER_WITHDRAWAL_REASON_ACCEPTED_ELSEWHERE,
        winning_offer_id="off-1",
    )
    item = after(state, out).work_items["wi"]
    assert item.state == WS.WORK_ITEM_STATE_QUEUED
    assert item.owner == OwnershipState("w2", 1, at(2), at(2), "off-1")
    assert (item.last_ownership_epoch, item.offers["off-1"].open) == (1, False)
    assert item.revision == state.work_items["wi"].revision + 2
    r = refused(after(state, out), "work_accept_offer", accept(), "worker")
    assert r.message == "offer off-1 was withdrawn (another acceptance won or it was superseded)"
    assert r.reason == R.REJECTION_REASON_INVALID_TRANSITION  # the loser's offer is gone


@pytest.mark.req("MW-10.2-T04")
def test_a_sole_candidate_accepting_the_only_offer_needs_no_withdrawal() -> None:
    state = offered()
    out = events(state, "work_accept_offer", accept(), "worker")
    assert [e.type for e in out] == ["work.offer_accepted"]
    assert not out[0].work_offer_accepted.HasField("schedule")
    assert out[0].work_offer_accepted.agent_card_version == ""
    item = after(state, out).work_items["wi"]
    assert (item.state, item.offers["off-1"].open) == (WS.WORK_ITEM_STATE_QUEUED, False)


@pytest.mark.req("MW-10.3-05")
def test_other_open_offers_are_withdrawn_with_the_accepted_one() -> None:
    state = offered()
    state.work_items["wi"].offers["off-0"] = OfferState("off-0", ("w3",), at(5), 1)
    out = events(state, "work_accept_offer", accept(), "worker")
    assert out[1].work_offers_withdrawn == wp.WorkOffersWithdrawn(
        work_item_id="wi",
        offer_ids=["off-0", "off-1"],
        candidate_ids=["w3", "worker"],
        reason=wp.OFFER_WITHDRAWAL_REASON_ACCEPTED_ELSEWHERE,
        winning_offer_id="off-1",
    )
    item = after(state, out).work_items["wi"]
    assert not item.offers["off-0"].open


@pytest.mark.req("MW-10.3-05", "MW-11.3-02")
def test_a_later_acceptance_wins_the_next_ownership_epoch() -> None:
    state = queued()
    state.work_items["wi"].owner = None
    state = GROUP.run(state, "work_offer", offer("w2", offer_id="off-2"), "coord")
    out = events(state, "work_accept_offer", accept("off-2"), "w2")
    assert out[0].work_offer_accepted.ownership.ownership_epoch == 2
    item = after(state, out).work_items["wi"]
    assert (item.owner.ownership_epoch if item.owner else 0, item.last_ownership_epoch) == (2, 2)


@pytest.mark.req("MW-11.3-02")
def test_the_ownership_lease_defaults_to_ten_minutes_without_a_start_deadline() -> None:
    state = offered()
    state.work_items["wi"].contract.time_policy.ClearField("start_deadline")
    grant = events(state, "work_accept_offer", accept(), "worker")[0].work_offer_accepted.ownership
    assert (grant.start_deadline, grant.expires_at) == (ts(10), ts(10))


@pytest.mark.req("MW-10.2-T04")
def test_acceptance_of_an_unknown_offer_is_not_found() -> None:
    r = refused(offered(), "work_accept_offer", accept("off-9"), "worker")
    assert (r.reason, r.message) == (R.REJECTION_REASON_NOT_FOUND, "no offer off-9 for wi")


@pytest.mark.req("MW-10.2-T04")
def test_only_a_candidate_accepts() -> None:
    r = refused(offered(), "work_accept_offer", accept(), "w2")
    assert r.message == "w2 is not a candidate of off-1"
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED


@pytest.mark.req("MW-10.2-T05")
def test_an_expired_offer_is_not_accepted_and_expiry_appends_nothing() -> None:
    state = offered()
    assert events(state, "work_accept_offer", accept(), "worker", ctx_at(4.99))
    r = refused(state, "work_accept_offer", accept(), "worker", ctx_at(5))
    assert r.message == "offer off-1 expired at 2026-06-01T12:05:00+00:00"
    assert r.reason == R.REJECTION_REASON_OFFER_EXPIRED
    assert state.work_items["wi"].state == WS.WORK_ITEM_STATE_OFFERED


@pytest.mark.req("MW-10.2-T04")
def test_an_open_offer_of_a_work_item_no_longer_offered_is_not_accepted() -> None:
    state = offered()
    state.work_items["wi"].state = WS.WORK_ITEM_STATE_BLOCKED
    r = refused(state, "work_accept_offer", accept(), "worker")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_INVALID_TRANSITION,
        "work.accept_offer is not allowed from blocked (MW-10.2-05)",
    )


@pytest.mark.req("MW-10.1-05")
def test_acceptance_names_the_current_contract_revision() -> None:
    r = refused(offered(), "work_accept_offer", accept(revision=2), "worker")
    assert r.message == "accept contract revision 1, not 2 (MW-10.1-05)"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_REVISION_MISMATCH, {"current_revision": "1"})


@pytest.mark.req("MW-10.1-03")
def test_no_acceptance_while_a_material_ambiguity_is_open() -> None:
    state = offered()
    state.work_items["wi"].open_ambiguities.add("amb-1")
    r = refused(state, "work_accept_offer", accept(), "worker")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_PRECONDITION_FAILED,
        "material ambiguities are unresolved (amb-1); the Coordinator amends the contract or replaces the WorkItem first (MW-10.1-03/04)",
    )


@pytest.mark.req("MW-10.3-07")
def test_no_acceptance_once_the_deadline_has_passed() -> None:
    state = offered()
    state.work_items["wi"].contract.deadline.CopyFrom(ts(3))
    assert events(state, "work_accept_offer", accept(), "worker", ctx_at(2.99))
    r = refused(state, "work_accept_offer", accept(), "worker", ctx_at(3))
    assert r.message == "the deadline of wi has passed"
    assert r.reason == R.REJECTION_REASON_PRECONDITION_FAILED


@pytest.mark.req("MW-10.3-07", "MW-10.4-03")
def test_no_acceptance_before_the_dependencies_are_satisfied() -> None:
    state = GROUP.run(base(), "work_authorize", authorize("dep"), "coord")
    state = GROUP.run(
        state, "work_offer", offer(amended_contract=builders.contract(at(0), depends_on=("dep",))), "coord"
    )
    r = refused(state, "work_accept_offer", accept(revision=2), "worker")
    assert (
        r.message
        == "work.accept_offer: the dependencies of wi do not satisfy its dependency policy yet (MW-10.4-03)"
    )
    assert r.reason == R.REJECTION_REASON_PRECONDITION_FAILED
    state.work_items["dep"].state = WS.WORK_ITEM_STATE_VERIFIED
    assert events(state, "work_accept_offer", accept(revision=2), "worker")


@pytest.mark.req("MW-10.3-07")
def test_the_membership_declares_every_required_capability() -> None:
    state = _needs_python(offered("w3", "worker"))
    r = refused(state, "work_accept_offer", accept(), "w3")
    assert r.message == "w3 lacks capability code.python >= 3.12 in its Membership"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_PRECONDITION_FAILED, {"capability": "code.python"})
    assert events(state, "work_accept_offer", accept(), "worker")


@pytest.mark.req("MW-11.1-13")
def test_the_agent_card_in_force_declares_every_required_capability_and_is_recorded() -> None:
    state = _needs_python(offered())
    old = ctx_at(0, cards={"worker": CardInfo("card-1", {"code.python": "3.11"}, 1)})
    r = refused(state, "work_accept_offer", accept(), "worker", old)
    assert r.message == "worker's Agent Card card-1 does not declare code.python >= 3.12"
    assert r.metadata == {"field": "actor_id", "capability": "code.python", "card_version": "card-1"}
    new = ctx_at(0, cards={"worker": CardInfo("card-2", {"code.python": "3.13"}, 1)})
    out = events(state, "work_accept_offer", accept(), "worker", new)
    assert out[0].work_offer_accepted.agent_card_version == "card-2"


@pytest.mark.req("MW-8-06")
def test_a_provisional_worker_accepting_is_activated_in_the_same_append() -> None:
    state = offered("w2", "worker")
    member = state.members["w2"]
    member.provisional, member.expires_at = True, at(30)
    out = events(state, "work_accept_offer", accept(), "w2")
    assert [e.type for e in out] == ["work.offer_accepted", "membership.activated", "work.offers_withdrawn"]
    assert out[1].membership_activated == membership_pb2.MembershipActivated(
        member_id="w2", membership_epoch=member.membership_epoch, work_item_id="wi", offer_id="off-1"
    )


# ---------------------------------------------------------------- work.decline_offer


def decline(reason: int = wp.DECLINE_REASON_CAPACITY, **fields: object) -> wp.WorkDeclineOffer:
    return wp.WorkDeclineOffer(
        work_item_id="wi",
        offer_id="off-1",
        decline=wp.StructuredDecline(reason=reason, **fields),  # type: ignore[arg-type]
    )


@pytest.mark.req("MW-10.3-08", "MW-10.3-09")
def test_a_decline_records_the_structured_reason_and_changes_nothing_else() -> None:
    state = offered("worker", "w2")
    body = decline(wp.DECLINE_REASON_BUDGET, detail="over budget")
    out = events(state, "work_decline_offer", body, "w2")
    assert [e.type for e in out] == ["work.offer_declined"]
    assert out[0].work_offer_declined == wp.WorkOfferDeclined(
        work_item_id="wi", offer_id="off-1", agent_id="w2", decline=body.decline
    )
    item = after(state, out).work_items["wi"]
    assert (item.state, item.offers["off-1"].open) == (WS.WORK_ITEM_STATE_OFFERED, True)
    assert item.revision == state.work_items["wi"].revision + 1
    assert after(state, out).last_work_change_sequence == out[0].sequence


@pytest.mark.req("MW-10.3-08")
def test_only_an_open_offer_is_declined_and_only_by_its_candidate() -> None:
    state = offered()
    r = refused(state, "work_decline_offer", decline(), "w2")
    assert (r.reason, r.message) == (R.REJECTION_REASON_PERMISSION_DENIED, "w2 is not a candidate of off-1")
    body = decline()
    body.offer_id = "off-9"
    r = refused(state, "work_decline_offer", body, "worker")
    assert (r.reason, r.message) == (R.REJECTION_REASON_NOT_FOUND, "no open offer off-9")
    state.work_items["wi"].offers["off-1"].open = False
    r = refused(state, "work_decline_offer", decline(), "worker")
    assert (r.reason, r.message) == (R.REJECTION_REASON_NOT_FOUND, "no open offer off-1")


@pytest.mark.req("MW-10.3-09", "OP-15")
@pytest.mark.parametrize(
    ("reason", "fields", "field"),
    [
        (wp.DECLINE_REASON_UNSPECIFIED, {}, "body.decline.reason"),
        (99, {}, "body.decline.reason"),
        (wp.DECLINE_REASON_OTHER, {}, "body.decline.extension_code"),
        (wp.DECLINE_REASON_OTHER, {"extension_code": "busy"}, "body.decline.extension_code"),
        (wp.DECLINE_REASON_OTHER, {"extension_code": "urn:acme:busy now"}, "body.decline.extension_code"),
        (wp.DECLINE_REASON_OTHER, {"extension_code": "xurn:acme:busy"}, "body.decline.extension_code"),
        (wp.DECLINE_REASON_OTHER, {"extension_code": "com.acme/busy/x"}, "body.decline.extension_code"),
        (wp.DECLINE_REASON_CAPACITY, {"extension_code": "urn:acme:busy"}, "body.decline.extension_code"),
        (wp.DECLINE_REASON_CAPACITY, {"detail": "x" * 1025}, "body.decline.detail"),
    ],
)
def test_a_decline_carries_a_standard_reason_or_a_namespaced_extension(
    reason: int, fields: dict[str, str], field: str
) -> None:
    r = refused(offered(), "work_decline_offer", decline(reason, **fields), "worker")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": field})
    if field == "body.decline.extension_code":
        said = (
            'DECLINE_REASON_OTHER names a namespaced code: "urn:<nid>:<code>" or "<reverse-dns>/<code>" (OP-15)'
            if reason == wp.DECLINE_REASON_OTHER
            else "only DECLINE_REASON_OTHER carries an extension code"
        )
    else:
        said = {
            "body.decline.reason": "a structured reason is required (a DeclineReason value)",
            "body.decline.detail": "at most 1024 characters",
        }[field]
    assert r.message == f"{field}: {said}"


@pytest.mark.req("MW-10.3-09", "OP-15")
@pytest.mark.parametrize(
    ("reason", "fields"),
    [
        (wp.DECLINE_REASON_OTHER, {"extension_code": "urn:acme:busy"}),
        (wp.DECLINE_REASON_OTHER, {"extension_code": "urn:a-1:x:y"}),
        (wp.DECLINE_REASON_OTHER, {"extension_code": "com.acme/Busy_2:x"}),
        (wp.DECLINE_REASON_DEADLINE, {"detail": "x" * 1024}),
        *((r, {}) for r in (1, 2, 3, 4, 5, 6)),
    ],
)
def test_standard_and_namespaced_declines_are_accepted(reason: int, fields: dict[str, str]) -> None:
    out = events(offered(), "work_decline_offer", decline(reason, **fields), "worker")
    assert out[0].work_offer_declined.decline == wp.StructuredDecline(reason=reason, **fields)  # type: ignore[arg-type]


@pytest.mark.req("MW-10.2-T03", "MW-10.3-10")
def test_extending_an_offer_with_no_recorded_criteria_records_the_new_ones() -> None:
    state = offered()
    del state.work_items["wi"].offer_criteria["off-1"]  # e.g. a state restored without the criteria index
    out = events(state, "work_offer", offer("w2", offer_id="", extends_offer_id="off-1"), "coord")
    item = after(state, out).work_items["wi"]
    assert item.offer_criteria["off-1"] == [builders.selection("w2")]


@pytest.mark.req("MW-7.1-13", "MW-10.2-T03")
def test_an_emergency_offer_by_the_mission_owner_records_the_override_and_its_reason() -> None:
    body = offer(
        coordinator_epoch=0, emergency_override=True, override_reason="the Coordinator is unreachable"
    )
    p = events(base(), "work_offer", body, "alice")[0].work_offered
    assert (p.emergency_override, p.override_reason, p.coordinator_epoch) == (
        True,
        "the Coordinator is unreachable",
        0,
    )
