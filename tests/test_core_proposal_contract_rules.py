"""Proposals, authorized WorkItems and their contracts (spec 10.1, 10.2 rows T01/T02, 10.4) through
decide and evolve: exact events and refusals, each contract field checked, dependency policies and
cycles."""

from __future__ import annotations

from datetime import timedelta

import pytest
from google.protobuf.duration_pb2 import Duration

from missionweave.kernel import ids
from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2, conversation_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState, ProposalState, WorkItemState
from tests import builders
from tests.work_rules_fixtures import (
    CTX,
    GROUP,
    NOW,
    WS,
    R,
    after,
    at,
    authorize,
    base,
    events,
    offer,
    refused,
)


def propose(**overrides: object) -> wp.WorkPropose:
    body = wp.WorkPropose(proposal_id="prop-1", title="Split the ledger work", rationale="two ledgers")
    return builders.with_overrides(body, overrides)


# ---------------------------------------------------------------- work.propose


@pytest.mark.req("MW-10.2-T01", "MW-9-13")
def test_any_member_proposes_and_no_work_item_exists_yet() -> None:
    state = base()
    body = propose(contract=builders.contract(NOW), parent_work_item_id="wi")
    out = events(state, "work_propose", body, "w3")
    assert [e.type for e in out] == ["work.proposed"]
    assert out[0].work_proposed == wp.WorkProposed(
        proposal_id="prop-1",
        title=body.title,
        contract=body.contract,
        parent_work_item_id="wi",
        rationale="two ledgers",
    )
    later = after(state, out)
    assert later.proposals["prop-1"] == ProposalState("prop-1", "w3")
    assert later.work_items.keys() == state.work_items.keys()


@pytest.mark.req("MW-10.2-T01")
def test_a_proposal_without_an_id_gets_one_derived_and_ids_are_not_reused() -> None:
    state = base()
    c = GROUP.command("work_propose", propose(proposal_id=""), "worker", state)
    out = decider.decide(state, c, CTX)
    assert not isinstance(out, Rejected)
    assert out[0].work_proposed.proposal_id == ids.derived_id("prop", "grp_w", c.command_id)
    proposed = GROUP.run(state, "work_propose", propose(), "worker")
    for bad in ("prop-1", "no spaces"):
        r = refused(proposed, "work_propose", propose(proposal_id=bad), "worker")
        assert r.message == "body.proposal_id: a valid id not yet used in this Group"
        assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.proposal_id"})


@pytest.mark.req("MW-10.2-T01")
@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"title": ""}, "body.title"),
        ({"title": "x" * 201}, "body.title"),
        ({"rationale": "x" * 4097}, "body.rationale"),
    ],
)
def test_a_proposal_has_a_bounded_title_and_rationale(fields: dict[str, str], field: str) -> None:
    r = refused(base(), "work_propose", propose(**fields), "worker")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": field})
    said = "1..200 characters required" if field == "body.title" else "at most 4096 characters"
    assert r.message == f"{field}: {said}"


@pytest.mark.req("MW-10.2-T01")
def test_bounds_are_inclusive() -> None:
    assert events(base(), "work_propose", propose(title="x", rationale="x" * 4096), "worker")
    assert events(base(), "work_propose", propose(title="x" * 200), "worker")


@pytest.mark.req("MW-10.2-T01")
def test_a_proposals_parent_exists() -> None:
    r = refused(base(), "work_propose", propose(parent_work_item_id="nope"), "worker")
    assert r.message == "no WorkItem 'nope' in this Group"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_NOT_FOUND, {"field": "work_item_id"})


@pytest.mark.req("MW-10.2-T01", "MW-7.1-06")
@pytest.mark.parametrize("kind", ["work_propose", "work_authorize"])
def test_nothing_is_proposed_or_authorized_in_a_terminal_mission(kind: str) -> None:
    state = base()
    state.mission.state = mission_pb2.MISSION_STATE_FAILED  # type: ignore[union-attr]
    body = propose() if kind == "work_propose" else authorize("wi2")
    assert refused(state, kind, body, "coord").reason == R.REJECTION_REASON_TERMINAL_STATE


# ---------------------------------------------------------------- work.authorize


@pytest.mark.req("MW-10.2-T02", "MW-9-02", "MW-10.1-01")
def test_authorizing_creates_the_work_item_at_revision_one_with_its_conversation() -> None:
    state = GROUP.run(base(), "work_propose", propose(), "worker")
    body = authorize(
        "wi2", proposal_id="prop-1", parent_work_item_id="wi", contract=builders.contract(NOW, revision=7)
    )
    out = events(state, "work_authorize", body, "coord")
    assert [e.type for e in out] == ["work.authorized", "conversation.opened"]
    contract = builders.contract(NOW, revision=1)
    conversation_id = ids.derived_id("conv", "grp_w", "wi2")
    assert out[0].work_authorized == wp.WorkAuthorized(
        work_item_id="wi2",
        title="title wi2",
        contract=contract,
        proposal_id="prop-1",
        parent_work_item_id="wi",
        conversation_id=conversation_id,
        coordinator_epoch=1,
    )
    assert out[1].conversation_opened == conversation_pb2.ConversationOpened(
        conversation_id=conversation_id,
        kind=conversation_pb2.CONVERSATION_KIND_WORK_ITEM,
        work_item_id="wi2",
        title="title wi2",
    )
    later = after(state, out)
    assert later.work_items["wi2"] == WorkItemState(
        work_item_id="wi2",
        state=WS.WORK_ITEM_STATE_OPEN,
        title="title wi2",
        contract=contract,
        contract_revision=1,
        conversation_id=conversation_id,
        parent_work_item_id="wi",
        depends_on=(),
        created_sequence=out[0].sequence,
    )
    assert later.last_work_change_sequence == out[0].sequence
    assert not later.proposals["prop-1"].open


@pytest.mark.req("MW-10.2-T02", "MW-10.4-03")
def test_an_authorized_work_item_records_its_dependencies() -> None:
    state = base()
    out = events(
        state,
        "work_authorize",
        authorize("wi2", contract=builders.contract(NOW, depends_on=("wi",))),
        "coord",
    )
    assert after(state, out).work_items["wi2"].depends_on == ("wi",)


@pytest.mark.req("MW-10.2-T02")
def test_an_authorization_without_an_id_gets_one_derived_and_ids_are_not_reused() -> None:
    state = base()
    c = GROUP.command("work_authorize", authorize(""), "coord", state)
    out = decider.decide(state, c, CTX)
    assert not isinstance(out, Rejected)
    assert out[0].work_authorized.work_item_id == ids.derived_id("wi", "grp_w", c.command_id)
    for bad in ("wi", "no spaces"):
        r = refused(state, "work_authorize", authorize(bad), "coord")
        assert r.message == "body.work_item_id: a valid id not yet used in this Group"
        assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.work_item_id"})


@pytest.mark.req("MW-10.2-T02")
@pytest.mark.parametrize("title", ["", "x" * 201])
def test_an_authorized_title_has_one_to_two_hundred_characters(title: str) -> None:
    r = refused(base(), "work_authorize", authorize("wi2", title=title), "coord")
    assert r.message == "body.title: 1..200 characters required"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": "body.title"})
    assert events(base(), "work_authorize", authorize("wi2", title="x" * 200), "coord")
    assert events(base(), "work_authorize", authorize("wi3", title="x"), "coord")


@pytest.mark.req("MW-10.2-T02")
def test_only_an_open_proposal_is_authorized() -> None:
    r = refused(base(), "work_authorize", authorize("wi2", proposal_id="prop-9"), "coord")
    assert (r.reason, r.message) == (R.REJECTION_REASON_NOT_FOUND, "no open proposal prop-9")
    state = GROUP.run(base(), "work_propose", propose(), "worker")
    state = GROUP.run(state, "work_authorize", authorize("wi2", proposal_id="prop-1"), "coord")
    r = refused(state, "work_authorize", authorize("wi3", proposal_id="prop-1"), "coord")
    assert (r.reason, r.message) == (R.REJECTION_REASON_NOT_FOUND, "no open proposal prop-1")


@pytest.mark.req("MW-10.2-T02")
def test_an_authorized_parent_exists() -> None:
    r = refused(base(), "work_authorize", authorize("wi2", parent_work_item_id="nope"), "coord")
    assert r.message == "no WorkItem 'nope' in this Group"
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_NOT_FOUND, {"field": "work_item_id"})


@pytest.mark.req("MW-9.1-18")
def test_a_worker_authorizes_nothing() -> None:
    r = refused(base(), "work_authorize", authorize("wi2"), "worker")
    assert (r.reason, r.message) == (
        R.REJECTION_REASON_PERMISSION_DENIED,
        "a worker may not issue work.authorize; it is issued by: mission_owner, coordinator, work_delegate (docs/authorization.md)",
    )


# ---------------------------------------------------------------- the contract (MW-10.1-01/07)


def _seconds(n: float) -> Duration:
    d = Duration()
    d.FromTimedelta(timedelta(seconds=n))
    return d


def _broken(name: str) -> tuple[wp.WorkContract, str]:
    """A contract with one field broken, and the field the refusal names."""
    c = builders.contract(NOW)
    f = "body.contract"
    match name:
        case "no goal":
            c.goal = ""
            return c, f"{f}.goal"
        case "long goal":
            c.goal = "g" * 4097
            return c, f"{f}.goal"
        case "no deliverables":
            del c.deliverables[:]
            return c, f"{f}.deliverables"
        case "deliverable id":
            c.deliverables.add(deliverable_id="bad id", description="d")
            return c, f"{f}.deliverables[1]"
        case "deliverable description":
            c.deliverables.add(deliverable_id="d2")
            return c, f"{f}.deliverables[1]"
        case "no criteria":
            del c.acceptance_criteria[:]
            return c, f"{f}.acceptance_criteria"
        case "criterion id":
            c.acceptance_criteria.add(criterion_id="", description="d", required_evidence_methods=[1])
            return c, f"{f}.acceptance_criteria[1]"
        case "criterion description":
            c.acceptance_criteria.add(criterion_id="c2", required_evidence_methods=[1])
            return c, f"{f}.acceptance_criteria[1]"
        case "criterion methods":
            c.acceptance_criteria.add(criterion_id="c2", description="d")
            return c, f"{f}.acceptance_criteria[1]"
        case "capability id":
            c.required_capabilities.add(version="1")
            return c, f"{f}.required_capabilities[0]"
        case "capability version":
            c.required_capabilities.add(capability_id="code.python")
            return c, f"{f}.required_capabilities[0]"
        case "no deadline":
            c.ClearField("deadline")
            return c, f"{f}.deadline"
        case "past deadline":
            c.deadline.FromDatetime(NOW)
            return c, f"{f}.deadline"
        case "no urgency":
            c.urgency = 0
            return c, f"{f}.urgency"
        case "no impact":
            c.business_impact = 0
            return c, f"{f}.urgency"
        case "long impact note":
            c.business_impact_note = "n" * 257
            return c, f"{f}.business_impact_note"
        case "no budget":
            c.ClearField("budget")
            return c, f"{f}.budget"
        case "currency code":
            c.budget.currency = "EURO"
            return c, f"{f}.budget.currency"
        case "other currency":
            c.budget.currency = "USD"
            return c, f"{f}.budget.currency"
        case "no retry policy":
            c.ClearField("retry_policy")
            return c, f"{f}.retry_policy.max_attempts"
        case "no attempts":
            c.retry_policy.max_attempts = 0
            return c, f"{f}.retry_policy.max_attempts"
        case "no time policy":
            c.ClearField("time_policy")
            return c, f"{f}.time_policy"
        case "no cost policy":
            c.ClearField("cost_policy")
            return c, f"{f}.cost_policy"
        case "no risk class":
            c.risk_class = 0
            return c, f"{f}.risk_class"
        case "long notes":
            c.notes = "n" * (16 * 1024 + 1)
            return c, f"{f}.notes"
    for policy in (
        "start_deadline",
        "execution_lease_duration",
        "checkpoint_ownership_duration",
        "blocked_lease_duration",
    ):
        if name == policy:
            getattr(c.time_policy, policy).CopyFrom(_seconds(0.5))
            return c, f"{f}.time_policy.{policy}"
    raise AssertionError(name)


BROKEN = [
    "no goal",
    "long goal",
    "no deliverables",
    "deliverable id",
    "deliverable description",
    "no criteria",
    "criterion id",
    "criterion description",
    "criterion methods",
    "capability id",
    "capability version",
    "no deadline",
    "past deadline",
    "no urgency",
    "no impact",
    "long impact note",
    "no budget",
    "currency code",
    "other currency",
    "no retry policy",
    "no attempts",
    "no time policy",
    "no cost policy",
    "no risk class",
    "long notes",
    "start_deadline",
    "execution_lease_duration",
    "checkpoint_ownership_duration",
    "blocked_lease_duration",
]


# What each refusal says (Rejection.message after "<field>: ").
_SAID = {
    "goal": "a goal of 1..4096 characters is required",
    "deliverables": "at least one deliverable is required",
    "deliverable id": "deliverable_id and description are required",
    "deliverable description": "deliverable_id and description are required",
    "acceptance_criteria": "at least one acceptance criterion is required",
    "criterion id": "criterion_id, description and the required Evidence methods",
    "criterion description": "criterion_id, description and the required Evidence methods",
    "criterion methods": "criterion_id, description and the required Evidence methods",
    "required_capabilities": "capability id and version are required",
    "deadline": "a deadline in the future is required",
    "urgency": "urgency and business impact are required",
    "business_impact_note": "at most 256 characters",
    "budget": "a budget is required (omitted dimensions permit no use, OP-02)",
    "currency code": "an ISO 4217 code is required for a financial budget",
    "other currency": "must be the Mission budget's currency",
    "retry_policy.max_attempts": "a retry policy with at least one attempt is required",
    "time_policy": "a time policy (start deadline, lease durations) is required",
    "cost_policy": "a cost policy is required",
    "risk_class": "a risk classification is required",
    "notes": "at most 16 KiB of prose",
}
for _policy in (
    "start_deadline",
    "execution_lease_duration",
    "checkpoint_ownership_duration",
    "blocked_lease_duration",
):
    _SAID[_policy] = "must lie within 1 s .. 24 h"


@pytest.mark.req("MW-10.1-01", "MW-10.1-07")
@pytest.mark.parametrize("name", BROKEN)
def test_every_contract_item_is_a_machine_readable_field(name: str) -> None:
    contract, field = _broken(name)
    r = refused(base(), "work_authorize", authorize("wi2", contract=contract), "coord")
    assert (r.reason, r.metadata) == (R.REJECTION_REASON_INVALID_ARGUMENT, {"field": field})
    said = _SAID.get(name) or _SAID[field.removeprefix("body.contract.").split("[")[0]]
    assert r.message == f"{field}: {said}"


@pytest.mark.req("MW-10.1-01", "MW-10.1-06")
def test_a_contract_at_its_bounds_is_accepted() -> None:
    c = builders.contract(NOW, goal="g" * 4096, business_impact_note="n" * 256, notes="n" * 16 * 1024)
    c.required_capabilities.append(membership_pb2.Capability(capability_id="code.python", version="3.12"))
    c.deadline.FromDatetime(at(0.01))
    c.retry_policy.max_attempts = 1
    c.time_policy.start_deadline.CopyFrom(_seconds(1))
    c.time_policy.blocked_lease_duration.CopyFrom(_seconds(24 * 3600))
    c.budget.CopyFrom(common_pb2.ResourceVector(tokens=5))  # no financial budget: no currency needed
    assert events(base(), "work_authorize", authorize("wi2", contract=c), "coord")


@pytest.mark.req("MW-10.4-03")
def test_a_dependency_names_a_work_item_of_the_group() -> None:
    r = refused(
        base(),
        "work_authorize",
        authorize("wi2", contract=builders.contract(NOW, depends_on=("wi", "x"))),
        "coord",
    )
    assert r.message == "body.contract.depends_on_work_item_ids[1]: no WorkItem x"
    assert r.reason == R.REJECTION_REASON_NOT_FOUND
    assert "depends_on_work_item_ids[1]" in r.message


# ---------------------------------------------------------------- dependencies (MW-10.4-03/04)


def _with_deps(states: tuple[int, ...], kind: int = 0, min_verified: int = 0) -> GroupState:
    """``late`` depends on one WorkItem per entry of ``states``, under the given policy."""
    state = base()
    names = []
    for i, value in enumerate(states):
        state = GROUP.run(state, "work_authorize", authorize(f"d{i}"), "coord")
        state.work_items[f"d{i}"].state = value
        names.append(f"d{i}")
    c = builders.contract(NOW, depends_on=tuple(names))
    c.dependency_policy.CopyFrom(wp.DependencyPolicy(kind=kind, min_verified=min_verified))  # type: ignore[arg-type]
    return GROUP.run(state, "work_authorize", authorize("late", contract=c), "coord")


def _eligible(state: GroupState) -> bool:
    decision = GROUP.decide(state, "work_offer", offer(work_item_id="late"), "coord")
    if isinstance(decision, Rejected):
        assert decision.reason == R.REJECTION_REASON_PRECONDITION_FAILED, decision
        return False
    return True


V, C, F, OP = (
    WS.WORK_ITEM_STATE_VERIFIED,
    WS.WORK_ITEM_STATE_CANCELLED,
    WS.WORK_ITEM_STATE_FAILED,
    WS.WORK_ITEM_STATE_OPEN,
)
K = wp.DependencyPolicyKind


@pytest.mark.req("MW-10.4-03")
@pytest.mark.parametrize(
    ("states", "kind", "min_verified", "eligible"),
    [
        ((V, V), 0, 0, True),
        ((V, C), 0, 0, False),
        ((V, V), K.DEPENDENCY_POLICY_KIND_ALL_VERIFIED, 0, True),
        ((V, OP), K.DEPENDENCY_POLICY_KIND_ALL_VERIFIED, 0, False),
        ((V, C, F), K.DEPENDENCY_POLICY_KIND_ALL_TERMINAL, 0, True),
        ((V, OP), K.DEPENDENCY_POLICY_KIND_ALL_TERMINAL, 0, False),
        ((C, F), K.DEPENDENCY_POLICY_KIND_ANY_VERIFIED, 0, False),
        ((OP, V), K.DEPENDENCY_POLICY_KIND_ANY_VERIFIED, 0, True),
        (
            (OP, OP),
            K.DEPENDENCY_POLICY_KIND_MIN_VERIFIED,
            0,
            False,
        ),  # at least one, whatever min_verified says
        ((OP, V), K.DEPENDENCY_POLICY_KIND_MIN_VERIFIED, 0, True),
        ((OP, V, V), K.DEPENDENCY_POLICY_KIND_MIN_VERIFIED, 2, True),
        ((OP, V, C), K.DEPENDENCY_POLICY_KIND_MIN_VERIFIED, 2, False),
        ((), K.DEPENDENCY_POLICY_KIND_MIN_VERIFIED, 2, True),  # no dependencies: always eligible
    ],
)
def test_eligibility_follows_the_dependency_policy(
    states: tuple[int, ...], kind: int, min_verified: int, eligible: bool
) -> None:
    assert _eligible(_with_deps(states, kind, min_verified)) is eligible


def _amend(state: GroupState, work_item_id: str, *depends_on: str) -> Rejected | list[object]:
    amended = builders.contract(NOW, depends_on=depends_on)
    decision = GROUP.decide(
        state, "work_offer", offer(work_item_id=work_item_id, amended_contract=amended), "coord"
    )
    return decision if isinstance(decision, Rejected) else list(decision)


@pytest.mark.req("MW-10.4-04")
def test_dependency_cycles_are_rejected_direct_and_transitive() -> None:
    state = base()
    for name, deps in (("a", ("wi",)), ("b", ("a",)), ("c", ("b", "a"))):
        state = GROUP.run(
            state,
            "work_authorize",
            authorize(name, contract=builders.contract(NOW, depends_on=deps)),
            "coord",
        )
    for deps in (("wi",), ("a",), ("c",), ("x0", "c")):
        if "x0" in deps:
            state = GROUP.run(state, "work_authorize", authorize("x0"), "coord")
        r = _amend(state, "wi", *deps)
        assert isinstance(r, Rejected) and r.reason == R.REJECTION_REASON_DEPENDENCY_CYCLE, deps


@pytest.mark.req("MW-10.4-04")
def test_a_shared_ancestor_is_no_cycle() -> None:
    state = base()
    for name, deps in (("root", ()), ("a", ("root",)), ("b", ("root", "a")), ("top", ()), ("wi2", ())):
        state = GROUP.run(
            state,
            "work_authorize",
            authorize(name, contract=builders.contract(NOW, depends_on=deps)),
            "coord",
        )
    for item in ("a", "b", "root"):
        state.work_items[item].state = WS.WORK_ITEM_STATE_VERIFIED
    out = _amend(state, "top", "a", "b", "root")
    assert not isinstance(out, Rejected), out


@pytest.mark.req("MW-10.4-04")
def test_a_repeated_dependency_does_not_hide_a_cycle() -> None:
    state = GROUP.run(base(), "work_authorize", authorize("x0"), "coord")
    state = GROUP.run(
        state, "work_authorize", authorize("a", contract=builders.contract(NOW, depends_on=("wi",))), "coord"
    )
    r = _amend(state, "wi", "a", "x0", "x0")
    assert isinstance(r, Rejected) and r.reason == R.REJECTION_REASON_DEPENDENCY_CYCLE
    assert r.message == "the amended dependencies of wi form a cycle"


@pytest.mark.req("MW-10.4-04")
def test_the_cycle_check_ends_on_a_cycle_elsewhere_and_on_unknown_ids() -> None:
    state = base()
    for name in ("a", "b"):
        state = GROUP.run(state, "work_authorize", authorize(name), "coord")
    state.work_items["a"].depends_on, state.work_items["b"].depends_on = ("b", "ghost"), ("a",)
    assert not isinstance(_amend(state, "wi", "a"), Rejected)


@pytest.mark.req("MW-10.1-01")
def test_a_logged_contract_without_revision_is_revision_one() -> None:
    state = base()
    out = events(state, "work_authorize", authorize("wi2"), "coord")
    out[0].work_authorized.contract.revision = 0
    assert after(state, out).work_items["wi2"].contract_revision == 1


@pytest.mark.req("MW-10.1-01")
def test_a_one_character_goal_is_a_goal() -> None:
    assert events(
        base(), "work_authorize", authorize("wi2", contract=builders.contract(NOW, goal="g")), "coord"
    )
