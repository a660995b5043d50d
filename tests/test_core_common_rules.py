"""Pure core: the checks every command shares (rules/common.py) through decider.decide/evolve: the
envelope of every event (deterministic ids, sequences, times, causation), the Membership epoch
(MW-8-02/03) and expected-revision checks (MW-10.2-05, OP-10), the machine-readable Mission
definition (MW-7.1-01), the Coordinator lease's renewal policy (MW-7.2-02) and Organization policy
acting without a Membership (MW-8-04)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from google.protobuf.duration_pb2 import Duration

from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import common_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.state import GroupState, IdentityInfo
from tests import builders
from tests.steward_fixtures import BASE, CTX, GROUP, GROUP_ID, IDS, NOW, PLANNING, rejection

RK = common_pb2.RevisionKind
DEF = "body.definition"


def create(
    actor: str = "alice",
    coordinator: str = "coord",
    renewal: mission_pb2.RenewalPolicy | None = None,
    **definition: object,
) -> object:
    body = builders.mission_create("alice", coordinator, NOW, **definition)
    if renewal is not None:
        body.coordinator_renewal.CopyFrom(renewal)
    return GROUP.decide(None, "mission_create", body, actor)


def invalid_field(decision: object) -> str:
    reason, metadata = rejection(decision)
    assert reason == "INVALID_ARGUMENT", decision
    return metadata["field"]


# ---------------------------------------------------------------- the envelope of every event


@pytest.mark.req("MW-7.1-03")
def test_every_event_derives_its_id_from_group_command_and_index_and_carries_its_cause() -> None:
    command = GROUP.command("mission_create", builders.mission_create("alice", "coord", NOW), "alice", None)
    command.correlation_id = "corr-1"
    decision = decider.decide(None, command, CTX)
    assert isinstance(decision, list) and len(decision) == 5
    for index, event in enumerate(decision):
        assert (event.event_id, event.group_id, event.sequence, event.recorded_at) == (
            ids.derived_id("evt", GROUP_ID, command.command_id, str(index)),
            GROUP_ID,
            index + 1,
            to_timestamp(NOW),
        )
        assert (event.causing_command_id, event.correlation_id, event.actor_id) == (
            command.command_id,
            "corr-1",
            "alice",
        )
    later = decider.decide(
        BASE, GROUP.command("message_post", builders.message(PLANNING), "alice", BASE), CTX
    )
    assert isinstance(later, list) and later[0].sequence == BASE.head_sequence + 1


# ---------------------------------------------------------------- Membership epochs (MW-8-02/03)


@pytest.mark.req("MW-8-02", "MW-8-03")
def test_the_membership_epoch_is_the_current_one_of_an_active_member() -> None:
    command = GROUP.command("message_post", builders.message(PLANNING), "rev", BASE)
    assert isinstance(decider.decide(BASE, command, CTX), list)
    command.membership_epoch = 5
    assert rejection(decider.decide(BASE, command, CTX)) == ("MEMBERSHIP_EPOCH_STALE", {"current_epoch": "4"})
    command.membership_epoch = 4
    command.actor_id = "ghost"
    assert rejection(decider.decide(BASE, command, CTX)) == ("NOT_A_MEMBER", {})


# ---------------------------------------------------------------- expected revisions (MW-10.2-05, OP-10)


def with_expected(state: GroupState, kind: int, revision: int, aggregate_id: str = "") -> object:
    command = GROUP.command("message_post", builders.message(PLANNING), "alice", state)
    command.expected_revision.CopyFrom(
        common_pb2.ExpectedRevision(kind=kind, aggregate_id=aggregate_id, revision=revision)
    )  # type: ignore[arg-type]
    return decider.decide(state, command, CTX)


@pytest.mark.req("MW-10.2-05")
def test_an_expected_group_revision_is_the_head_sequence() -> None:
    assert isinstance(with_expected(BASE, RK.REVISION_KIND_GROUP, BASE.head_sequence), list)
    assert rejection(with_expected(BASE, RK.REVISION_KIND_GROUP, BASE.head_sequence - 1)) == (
        "REVISION_MISMATCH",
        {"current_revision": str(BASE.head_sequence)},
    )


@pytest.mark.req("MW-10.2-05")
def test_an_expected_mission_revision_names_this_mission_or_none() -> None:
    mission = BASE.mission
    assert mission is not None
    for aggregate_id in ("", mission.mission_id):
        assert isinstance(with_expected(BASE, RK.REVISION_KIND_MISSION, mission.revision, aggregate_id), list)
        assert rejection(
            with_expected(BASE, RK.REVISION_KIND_MISSION, mission.revision + 1, aggregate_id)
        ) == ("REVISION_MISMATCH", {"current_revision": str(mission.revision)})
    assert rejection(with_expected(BASE, RK.REVISION_KIND_MISSION, mission.revision, "mis_other")) == (
        "NOT_FOUND",
        {},
    )


@pytest.mark.req("MW-10.2-05")
def test_an_expected_work_item_or_contract_revision_names_a_work_item_of_the_group() -> None:
    contract = builders.contract(NOW)
    state = GROUP.run(
        BASE,
        "work_authorize",
        wp.WorkAuthorize(work_item_id="wi", title="wi", contract=contract, coordinator_epoch=1),
        "coord",
    )
    assert (state.work_items["wi"].revision, state.work_items["wi"].contract_revision) == (1, 1)
    for kind in (RK.REVISION_KIND_WORK_ITEM, RK.REVISION_KIND_WORK_CONTRACT):
        assert isinstance(with_expected(state, kind, 1, "wi"), list)
        assert rejection(with_expected(state, kind, 3, "wi")) == (
            "REVISION_MISMATCH",
            {"current_revision": "1"},
        )
    for kind in (RK.REVISION_KIND_WORK_ITEM, RK.REVISION_KIND_WORK_CONTRACT):
        assert rejection(with_expected(state, kind, 1, "wj")) == ("NOT_FOUND", {})
    assert rejection(with_expected(state, RK.REVISION_KIND_UNSPECIFIED, 1, "wi")) == ("NOT_FOUND", {})


# ---------------------------------------------------------------- the Mission definition (MW-7.1-01)


def criterion(criterion_id: str = "dod-1", description: str = "d") -> mission_pb2.CompletionCriterion:
    return mission_pb2.CompletionCriterion(
        criterion_id=criterion_id, description=description, evidence_method="test", required=True
    )


@pytest.mark.req("MW-7.1-01")
@pytest.mark.parametrize(
    ("definition", "field"),
    [
        ({"title": ""}, f"{DEF}.title"),
        ({"title": "t" * 201}, f"{DEF}.title"),
        ({"objective": ""}, f"{DEF}.objective"),
        ({"objective": "o" * 4097}, f"{DEF}.objective"),
        ({"definition_of_done": []}, f"{DEF}.definition_of_done"),
        ({"definition_of_done": [criterion(), criterion("")]}, f"{DEF}.definition_of_done[1].criterion_id"),
        ({"definition_of_done": [criterion("bad id!")]}, f"{DEF}.definition_of_done[0].criterion_id"),
        ({"definition_of_done": [criterion(), criterion()]}, f"{DEF}.definition_of_done[1].criterion_id"),
        (
            {"definition_of_done": [criterion("a"), criterion("b", "")]},
            f"{DEF}.definition_of_done[1].description",
        ),
        ({"deadline": None}, f"{DEF}.deadline"),
        ({"deadline": to_timestamp(NOW)}, f"{DEF}.deadline"),
        ({"budget": None}, f"{DEF}.budget"),
        (
            {"budget": common_pb2.ResourceVector(currency="EUR", financial_micros=-1)},
            f"{DEF}.budget.financial_micros",
        ),
        ({"budget": common_pb2.ResourceVector(financial_micros=1)}, f"{DEF}.budget.currency"),
        ({"budget": common_pb2.ResourceVector(currency="eur", financial_micros=1)}, f"{DEF}.budget.currency"),
        (
            {"budget": common_pb2.ResourceVector(currency="EURO", financial_micros=1)},
            f"{DEF}.budget.currency",
        ),
        ({"budget": common_pb2.ResourceVector(currency="EÜ", financial_micros=1)}, f"{DEF}.budget.currency"),
        ({"risk_policy": None}, f"{DEF}.risk_policy.risk_class"),
        ({"risk_policy": mission_pb2.RiskPolicy()}, f"{DEF}.risk_policy.risk_class"),
        ({"notes": "n" * 16385}, f"{DEF}.notes"),
    ],
)
def test_each_item_of_the_definition_is_a_bounded_machine_readable_field(
    definition: dict[str, object], field: str
) -> None:
    assert invalid_field(create(**definition)) == field


@pytest.mark.req("MW-7.1-01")
def test_a_definition_at_its_limits_is_accepted() -> None:
    limits = {
        "title": "t" * 200,
        "objective": "o" * 4096,
        "notes": "n" * 16384,
        "deadline": to_timestamp(NOW + timedelta(microseconds=1)),
        "definition_of_done": [criterion("a"), criterion("b")],
        "budget": common_pb2.ResourceVector(tokens=1),  # no financial budget: no currency needed
    }
    decision = create(**limits)
    assert isinstance(decision, list)
    assert decision[0].mission_created.definition == builders.definition("alice", NOW, **limits)


# ---------------------------------------------------------------- the Coordinator lease's renewal policy (MW-7.2-02)


def lease_policy(decision: object) -> tuple[timedelta, timedelta, object]:
    assert isinstance(decision, list)
    lease = decision[-1].coordinator_lease_granted.lease
    policy = lease.renewal_policy
    return policy.lease_duration.ToTimedelta(), policy.renew_before.ToTimedelta(), lease.expires_at


def renewal(duration: timedelta | None = None, before: timedelta | None = None) -> mission_pb2.RenewalPolicy:
    policy = mission_pb2.RenewalPolicy()
    if duration is not None:
        policy.lease_duration.CopyFrom(Duration(seconds=int(duration.total_seconds())))
    if before is not None:
        policy.renew_before.CopyFrom(Duration(seconds=int(before.total_seconds())))
    return policy


@pytest.mark.req("MW-7.2-02")
def test_the_lease_defaults_to_five_minutes_renewed_one_minute_before() -> None:
    assert lease_policy(create()) == (
        timedelta(minutes=5),
        timedelta(minutes=1),
        to_timestamp(NOW + timedelta(minutes=5)),
    )
    # Without renew_before: a minute, or a fifth of a short lease.
    assert lease_policy(create(renewal=renewal(timedelta(seconds=10))))[:2] == (
        timedelta(seconds=10),
        timedelta(seconds=2),
    )
    assert lease_policy(create(renewal=renewal(timedelta(hours=1))))[:2] == (
        timedelta(hours=1),
        timedelta(minutes=1),
    )
    assert lease_policy(create(renewal=renewal(before=timedelta(seconds=30))))[:2] == (
        timedelta(minutes=5),
        timedelta(seconds=30),
    )


@pytest.mark.req("MW-7.2-02")
def test_the_lease_lies_within_5_s_and_24_h_and_is_renewed_before_it_lapses() -> None:
    for ok in (timedelta(seconds=5), timedelta(hours=24)):
        assert lease_policy(create(renewal=renewal(ok)))[0] == ok
    for bad in (timedelta(seconds=4), timedelta(hours=24, seconds=1)):
        assert invalid_field(create(renewal=renewal(bad))) == "body.coordinator_renewal.lease_duration"
    assert lease_policy(create(renewal=renewal(timedelta(minutes=1), timedelta(0))))[1] == timedelta(0)
    assert (
        invalid_field(create(renewal=renewal(timedelta(minutes=1), timedelta(minutes=1))))
        == "body.coordinator_renewal.renew_before"
    )
    assert (
        invalid_field(create(renewal=renewal(timedelta(minutes=1), timedelta(seconds=-1))))
        == "body.coordinator_renewal.renew_before"
    )


# ---------------------------------------------------------------- identities and Organization policy (MW-8-04)


@pytest.mark.req("MW-7.1-02")
def test_the_coordinator_is_a_registered_identity() -> None:
    assert invalid_field(create(coordinator="")) == "body.coordinator_id"
    assert rejection(create(coordinator="ghost")) == ("UNKNOWN_IDENTITY", {"field": "body.coordinator_id"})


@pytest.mark.req("MW-8-04")
@pytest.mark.parametrize("actor", ["ops", "admin"])
def test_organization_policy_creates_and_cancels_with_or_without_a_membership(actor: str) -> None:
    """ops holds no Membership (epoch 0); admin holds a Worker's, which cannot cancel by itself."""
    assert isinstance(create(actor), list)
    decision = GROUP.decide(BASE, "mission_cancel", mission_pb2.MissionCancel(reason="policy"), actor)
    assert isinstance(decision, list)
    assert [(e.type, e.actor_id) for e in decision] == [("mission.cancelled", actor)]


@pytest.mark.req("MW-8-04")
def test_organization_policy_without_a_membership_sends_epoch_0_and_others_are_not_members() -> None:
    command = GROUP.command("mission_cancel", mission_pb2.MissionCancel(reason="policy"), "ops", BASE)
    command.membership_epoch = 1
    assert invalid_field(decider.decide(BASE, command, CTX)) == "membership_epoch"
    outsider = decider.DecisionContext(
        NOW, {**IDS, "ops": IdentityInfo("ops", common_pb2.IDENTITY_KIND_AGENT)}
    )
    command.membership_epoch = 0
    assert rejection(decider.decide(BASE, command, outsider)) == ("NOT_A_MEMBER", {})
    assert rejection(create("worker")) == ("PERMISSION_DENIED", {})
