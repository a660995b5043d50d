"""Six-dimension budgets and published Artifacts through decide/evolve: usage accumulates against the
WorkItem's, the Mission's, the attempt's and the retries' caps and is refused whole beyond them
(MW-10.1-01, MW-11.4-08, MW-11.5-13, OP-02); Artifacts are published under the current lease,
the log holding the reference and the manifest digest only (MW-11.3-04, MW-13.1-02/03)."""

from __future__ import annotations

import copy

import pytest

from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import kinds
from missionweave_server.services.authority.rules.common import StoredArtifact
from missionweave_server.services.authority.state import ChildLink, GroupState
from tests import builders
from tests.offline_core import LEASE_ID, command, over_committed, started, with_mission, work_contract
from tests.work_execution_fixtures import USAGE, R, at, decide, events, invalid_field, refused, run, vector

SIX = ("financial_micros", "tokens", "tool_calls", "compute_ms", "wall_clock_ms", "side_effects")
BASE = started(with_mission())


def progress(usage: common_pb2.ResourceVector, lease_id: str = LEASE_ID) -> wp.WorkReportProgress:
    return wp.WorkReportProgress(
        work_item_id="wi",
        lease_id=lease_id,
        ownership_epoch=1,
        usage_delta=usage,
        report=wp.ProgressReport(
            phase="p",
            next_checkpoint=wp.PlannedCheckpoint(description="n"),
            revised_estimate=wp.RevisedEstimate(reason="r"),
        ),
    )


def used(state: GroupState, when: float, lease_id: str = LEASE_ID, **dims: int) -> GroupState:
    return run(state, "work_report_progress", progress(vector(**dims), lease_id), at=at(when))


def exceeded(state: GroupState, when: float = 10, lease_id: str = LEASE_ID, **dims: int) -> dict[str, object]:
    rejection = refused(state, "work_report_progress", progress(vector(**dims), lease_id), at=at(when))
    assert rejection.reason == R.REJECTION_REASON_BUDGET_EXCEEDED, rejection
    return dict(rejection.metadata)


@pytest.mark.req("MW-11.5-12", "MW-10.1-01")
def test_usage_accumulates_on_the_work_item_and_the_mission() -> None:
    state = used(used(BASE, 5, tokens=100), 6, tokens=50, tool_calls=2)
    assert state.work_items["wi"].used == dict.fromkeys(SIX, 0) | {"tokens": 150, "tool_calls": 2}
    assert state.work_items["wi"].attempt_used == state.work_items["wi"].used
    assert state.work_items["wi"].retry_used == dict.fromkeys(SIX, 0)  # the first attempt is no retry
    assert state.mission_used == state.work_items["wi"].used
    _, decision = decide(state, "work_report_progress", progress(vector(tokens=1)), at=at(7))
    usage = events(decision)[1]
    assert usage[0] == USAGE
    assert usage[1].work_item_used == vector(tokens=151, tool_calls=2)
    assert usage[1].mission_used == vector(tokens=151, tool_calls=2)


@pytest.mark.req("MW-10.1-01", "MW-11.5-13")
def test_usage_beyond_the_work_items_budget_is_refused_whole() -> None:
    assert exceeded(BASE, tokens=10_001) == {"budget": "work_item", "dimension": "tokens", "limit": "10000"}
    assert used(BASE, 5, tokens=10_000).work_items["wi"].used["tokens"] == 10_000  # the cap itself is within
    state = used(BASE, 5, tokens=100)
    assert exceeded(state, tokens=9_901)["budget"] == "work_item"
    assert used(state, 6, tokens=9_900).work_items["wi"].used["tokens"] == 10_000


@pytest.mark.req("OP-02")
def test_a_dimension_the_contract_leaves_out_permits_no_consumption() -> None:
    assert exceeded(BASE, compute_ms=1) == {"budget": "work_item", "dimension": "compute_ms", "limit": "0"}


@pytest.mark.req("MW-10.1-01", "MW-11.5-13")
def test_usage_beyond_the_missions_budget_is_refused() -> None:
    state = over_committed(started(with_mission()), tokens=500)
    assert exceeded(state, tokens=501) == {"budget": "mission", "dimension": "tokens", "limit": "500"}
    state = used(state, 5, tokens=400)
    assert exceeded(state, tokens=101)["budget"] == "mission"
    assert used(state, 6, tokens=100).mission_used["tokens"] == 500
    held = copy.deepcopy(state)
    held.reserved["tokens"] = 50  # carved out for a child Mission
    assert exceeded(held, tokens=51)["budget"] == "mission"


@pytest.mark.req("MW-10.1-01")
def test_a_running_child_missions_budget_is_held_back_from_the_work_item() -> None:
    state = copy.deepcopy(BASE)
    reserved = dict.fromkeys(SIX, 0) | {"tokens": 9_000}
    state.work_items["wi"].children.append(ChildLink("mis_child", "grp_child", reserved, mandatory=False))
    assert exceeded(state, tokens=1_001)["budget"] == "work_item"
    assert used(state, 5, tokens=1_000).work_items["wi"].used["tokens"] == 1_000


def _retried(contract: wp.WorkContract, first_tokens: int = 0) -> tuple[GroupState, GroupState]:
    """The first attempt (after ``first_tokens``) and the second, after a transient failure."""
    first = started(with_mission(), contract=contract)
    if first_tokens:
        first = used(first, 5, tokens=first_tokens)
    fail = wp.WorkFail(
        work_item_id="wi",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        kind=wp.WORK_FAILURE_KIND_TRANSIENT,
        evidence=[builders.evidence()],
        reason="flaky",
    )
    second = run(first, "work_fail", fail, at=at(10))
    return first, run(
        second,
        "work_start",
        wp.WorkStart(work_item_id="wi", ownership_epoch=1, lease_id="lease-2"),
        at=at(20),
    )


@pytest.mark.req("MW-11.4-08")
def test_the_per_attempt_cap_bounds_each_attempt_anew() -> None:
    contract = work_contract()
    contract.cost_policy.per_attempt_limit.CopyFrom(vector(tokens=200))
    first, second = _retried(contract, first_tokens=150)
    assert exceeded(first, tokens=51) == {"budget": "attempt", "dimension": "tokens", "limit": "200"}
    assert used(first, 6, tokens=50).work_items["wi"].attempt_used["tokens"] == 200
    assert second.work_items["wi"].attempt_used["tokens"] == 0
    assert exceeded(second, 30, "lease-2", tokens=201)["budget"] == "attempt"
    after = used(second, 30, "lease-2", tokens=200)
    assert (after.work_items["wi"].used["tokens"], after.work_items["wi"].attempt_used["tokens"]) == (
        350,
        200,
    )


@pytest.mark.req("MW-11.4-08")
def test_the_retry_cap_bounds_what_all_retries_use_together() -> None:
    contract = work_contract()
    contract.cost_policy.retry_limit.CopyFrom(vector(tokens=100))
    first, second = _retried(contract)
    assert (
        used(first, 5, tokens=150).work_items["wi"].retry_used["tokens"] == 0
    )  # the first attempt is no retry
    state = used(second, 30, "lease-2", tokens=60)
    assert state.work_items["wi"].retry_used["tokens"] == 60
    assert exceeded(state, 31, "lease-2", tokens=41) == {
        "budget": "retries",
        "dimension": "tokens",
        "limit": "100",
    }
    assert used(state, 31, "lease-2", tokens=40).work_items["wi"].retry_used["tokens"] == 100


@pytest.mark.req("MW-10.1-01")
def test_usage_is_never_negative_and_money_is_in_the_budgets_currency() -> None:
    def field(usage: common_pb2.ResourceVector) -> str:
        return invalid_field(refused(BASE, "work_report_progress", progress(usage), at=at(10)))

    assert field(vector(financial_micros=-1)) == "body.usage_delta"
    assert field(common_pb2.ResourceVector(currency="USD", financial_micros=5)) == "body.usage_delta.currency"
    for fine in (
        common_pb2.ResourceVector(currency="USD", tokens=5),
        common_pb2.ResourceVector(financial_micros=5),
    ):
        _, decision = decide(BASE, "work_report_progress", progress(fine), at=at(10))
        assert events(decision)[1][1].delta == fine


# ---------------------------------------------------------------- published Artifacts (MW-13.1-02/03)


ART = builders.artifact()
ART.digest.size_bytes = 42
STORED = {"a" * 64: StoredArtifact("a" * 64, 42, "b" * 64, "worker", ("c" * 64,))}


def publish(**kw: object) -> wp.WorkPublishArtifact:
    return wp.WorkPublishArtifact(
        **{  # type: ignore[arg-type]
            "work_item_id": "wi",
            "lease_id": LEASE_ID,
            "ownership_epoch": 1,
            "artifact": ART,
            "deliverable_id": "report",
            **kw,
        }
    )


@pytest.mark.req("MW-11.3-04", "MW-13.1-02", "MW-13.1-03")
def test_an_artifact_is_published_by_reference_with_its_manifest_digest() -> None:
    _, decision = decide(BASE, "work_publish_artifact", publish(), at=at(10), artifacts=STORED)
    expected = wp.ArtifactPublished(
        work_item_id="wi",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        artifact=ART,
        manifest_digest=common_pb2.Digest(algorithm="blake3", hex="b" * 64),
        source_artifacts=[common_pb2.Digest(algorithm="blake3", hex="c" * 64)],
        deliverable_id="report",
    )
    assert events(decision) == [("artifact.published", expected)]
    state = run(BASE, "work_publish_artifact", publish(), at=at(10), artifacts=STORED)
    state = run(state, "work_publish_artifact", publish(deliverable_id=""), at=at(11), artifacts=STORED)
    assert state.work_items["wi"].published_artifacts == (("a" * 64, 42), ("a" * 64, 42))
    assert state.work_items["wi"].revision == BASE.work_items["wi"].revision + 2


@pytest.mark.req("MW-13.1-03")
def test_an_artifact_not_stored_as_cited_or_for_no_deliverable_is_refused() -> None:
    assert refused(BASE, "work_publish_artifact", publish(), at=at(10)).reason == R.REJECTION_REASON_NOT_FOUND
    other_size = {"a" * 64: StoredArtifact("a" * 64, 41, "b" * 64, "worker")}
    assert refused(BASE, "work_publish_artifact", publish(), at=at(10), artifacts=other_size).reason == (
        R.REJECTION_REASON_NOT_FOUND
    )
    rejection = refused(
        BASE, "work_publish_artifact", publish(deliverable_id="memo"), at=at(10), artifacts=STORED
    )
    assert invalid_field(rejection) == "body.deliverable_id"


@pytest.mark.req("MW-11.3-04", "MW-11.3-05")
def test_publication_cites_the_current_lease_of_active_work() -> None:
    stale = refused(BASE, "work_publish_artifact", publish(lease_id="lease-0"), at=at(10), artifacts=STORED)
    assert stale.reason == R.REJECTION_REASON_LEASE_STALE
    queued = run(
        BASE,
        "work_checkpoint",
        wp.WorkCheckpoint(work_item_id="wi", lease_id=LEASE_ID, ownership_epoch=1),
        at=at(5),
    )
    assert refused(queued, "work_publish_artifact", publish(), at=at(10), artifacts=STORED).reason == (
        R.REJECTION_REASON_INVALID_TRANSITION
    )


@pytest.mark.req("MW-13.1-03")
def test_the_shell_looks_up_only_a_well_formed_blake3_artifact() -> None:
    """The kinds registry's lookup (what the shell fetches before deciding), not a rule."""

    def lookup(ref: common_pb2.ArtifactRef) -> object:
        return kinds.published_artifact(
            command(BASE, "work_publish_artifact", publish(artifact=ref), "worker")
        )

    assert lookup(ART) == publish()
    sha = common_pb2.ArtifactRef(digest=common_pb2.Digest(algorithm="sha256", hex="a" * 64))
    bad = common_pb2.ArtifactRef(digest=common_pb2.Digest(algorithm="blake3", hex="not hex"))
    assert (lookup(sha), lookup(bad)) == (None, None)
