"""D161 through decide: a submission or an Evidence record names only Artifacts the artifact store
holds, at their size, described by a manifest the actor signed for this Mission (and WorkItem), or
already recorded by this Group within the command's scope. The store's answer is ``ctx.held``."""

from __future__ import annotations

import copy

import pytest

from missionweave.v1 import common_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.common import HeldArtifact, HeldManifest
from missionweave_server.services.authority.rules.deliverables import recorded_artifacts
from missionweave_server.services.authority.state import GroupState, WorkItemState
from tests import builders
from tests.core_group import evolved
from tests.offline_core import IDS, LEASE_ID, command, started, with_mission, work_contract
from tests.work_execution_fixtures import at

A, B, C = "a" * 64, "b" * 64, "c" * 64
MISSION = with_mission()
assert MISSION.mission is not None
MISSION_ID = MISSION.mission.mission_id
BASE = started(MISSION)


def ref(hex_: str, size: int = 10) -> common_pb2.ArtifactRef:
    return common_pb2.ArtifactRef(digest=common_pb2.Digest(algorithm="blake3", hex=hex_, size_bytes=size))


def manifest(work_item_id: str = "wi", mission_id: str = MISSION_ID) -> HeldManifest:
    return HeldManifest("f" * 64, work_item_id, mission_id)


def held(hex_: str, size: int = 10, *manifests: HeldManifest) -> dict[str, HeldArtifact]:
    return {hex_: HeldArtifact(size, manifests)}


def submit(
    *artifacts: common_pb2.ArtifactRef, evidence_refs: tuple[common_pb2.ArtifactRef, ...] = ()
) -> wp.WorkSubmit:
    evidence = builders.evidence()
    evidence.artifacts.extend(evidence_refs)
    return wp.WorkSubmit(
        work_item_id="wi",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        contract_revision=1,
        artifacts=list(artifacts),
        evidence=[evidence],
    )


def decide(
    state: GroupState, kind: str, body: object, actor: str, store: dict[str, HeldArtifact]
) -> decider.Decision:
    before = copy.deepcopy(state)
    decision = decider.decide(
        state, command(state, kind, body, actor, at=at(20)), decider.DecisionContext(at(20), IDS, held=store)
    )
    assert state == before
    return decision


def refusal(decision: decider.Decision) -> tuple[str, str, str]:
    assert isinstance(decision, Exception), decision
    return decision.reason_name, decision.metadata.get("field", ""), decision.metadata.get("check", "")  # type: ignore[attr-defined]


@pytest.mark.req("MW-13.1-03")
def test_a_deliverable_the_store_does_not_hold_is_refused_and_nothing_is_written() -> None:
    assert refusal(decide(BASE, "work_submit", submit(ref(A)), "worker", {})) == (
        "NOT_FOUND",
        "body.artifacts[0]",
        "not_stored",
    )


def test_a_deliverable_named_with_another_size_than_stored_is_refused() -> None:
    decision = decide(BASE, "work_submit", submit(ref(A, 11)), "worker", held(A, 10, manifest()))
    assert refusal(decision) == ("INVALID_ARGUMENT", "body.artifacts[0].digest.size_bytes", "")


@pytest.mark.parametrize(
    "wrong",
    [manifest(work_item_id="other"), manifest(mission_id="mis_other"), None],
    ids=["work_item", "mission", "none"],
)
def test_a_stored_deliverable_needs_the_actors_manifest_for_this_mission_and_work_item(
    wrong: HeldManifest | None,
) -> None:
    store = held(A, 10, *([wrong] if wrong else []))
    assert refusal(decide(BASE, "work_submit", submit(ref(A)), "worker", store)) == (
        "NOT_FOUND",
        "body.artifacts[0]",
        "no_manifest",
    )


def test_a_deliverable_with_its_manifest_is_accepted_and_recorded_for_the_work_item() -> None:
    decision = decide(BASE, "work_submit", submit(ref(A)), "worker", held(A, 10, manifest()))
    after = evolved(BASE, decision)
    assert after.work_items["wi"].submitted_artifacts == ((A, 10),)
    assert A in recorded_artifacts(after, None)


def test_evidence_naming_an_artifact_that_is_not_held_refuses_the_submission() -> None:
    store = held(A, 10, manifest())
    decision = decide(BASE, "work_submit", submit(ref(A), evidence_refs=(ref(B),)), "worker", store)
    assert refusal(decision) == ("NOT_FOUND", "body.evidence[0].artifacts[0]", "not_stored")
    store |= held(B, 10, manifest())  # a test log the Worker signed for this WorkItem
    assert not isinstance(
        decide(BASE, "work_submit", submit(ref(A), evidence_refs=(ref(B),)), "worker", store), Exception
    )


def _with_upstream(depends: bool) -> GroupState:
    """``wi`` plus WorkItem ``up`` whose submission named C; ``wi`` depends on it or not."""
    state = copy.deepcopy(BASE)
    state.work_items["up"] = WorkItemState("up", wp.WORK_ITEM_STATE_VERIFIED, submitted_artifacts=((C, 10),))
    if depends:
        state.work_items["wi"].depends_on = ("up",)
    return state


def test_an_upstream_output_is_passed_through_unchanged_but_an_unrelated_one_is_not() -> None:
    store = held(C, 10)  # stored, no manifest of the Worker's
    assert not isinstance(
        decide(_with_upstream(True), "work_submit", submit(ref(C)), "worker", store), Exception
    )
    assert (
        refusal(decide(_with_upstream(False), "work_submit", submit(ref(C)), "worker", store))[2]
        == "no_manifest"
    )


def test_an_input_the_contract_names_is_passed_through() -> None:
    contract = work_contract()
    contract.inputs.add(name="dataset", artifact=ref(B))
    state = started(with_mission(), contract=contract)
    assert not isinstance(decide(state, "work_submit", submit(ref(B)), "worker", held(B)), Exception)


def test_a_recorded_artifact_must_still_be_held() -> None:
    assert (
        refusal(decide(_with_upstream(True), "work_submit", submit(ref(C)), "worker", {}))[2] == "not_stored"
    )


def _verified_with(hex_: str) -> GroupState:
    state = copy.deepcopy(BASE)
    state.work_items["wi"].state = wp.WORK_ITEM_STATE_VERIFIED
    state.work_items["wi"].submitted_artifacts = ((hex_, 10),)
    return state


def _mission_submit(
    state: GroupState, *artifacts: common_pb2.ArtifactRef
) -> mission_pb2.MissionSubmitForApproval:
    assert state.mission is not None
    return mission_pb2.MissionSubmitForApproval(
        coordinator_epoch=1, mission_revision=state.mission.revision, artifacts=list(artifacts)
    )


def test_the_missions_submission_names_artifacts_of_its_work_items_or_the_coordinators_own() -> None:
    state = _verified_with(A)
    assert not isinstance(
        decide(state, "mission_submit_for_approval", _mission_submit(state, ref(A)), "coord", held(A)),
        Exception,
    )
    assert refusal(
        decide(state, "mission_submit_for_approval", _mission_submit(state, ref(B)), "coord", {})
    ) == ("NOT_FOUND", "body.artifacts[0]", "not_stored")
    assert (
        refusal(
            decide(state, "mission_submit_for_approval", _mission_submit(state, ref(B)), "coord", held(B))
        )[2]
        == "no_manifest"
    )
    own = held(
        B, 10, manifest()
    )  # the Coordinator's own summary, signed for this Mission and one of its WorkItems
    assert not isinstance(
        decide(state, "mission_submit_for_approval", _mission_submit(state, ref(B)), "coord", own), Exception
    )
    other_mission = held(B, 10, manifest(mission_id="mis_other"))
    assert (
        refusal(
            decide(
                state, "mission_submit_for_approval", _mission_submit(state, ref(B)), "coord", other_mission
            )
        )[2]
        == "no_manifest"
    )


def test_review_and_failure_evidence_are_held_to_the_same_rule() -> None:
    submitted = evolved(BASE, decide(BASE, "work_submit", submit(ref(A)), "worker", held(A, 10, manifest())))
    review = builders.evidence("rv-1")
    review.artifacts.append(ref(B))
    body = wp.WorkRecordEvidence(work_item_id="wi", evidence=review, coordinator_epoch=1)
    assert refusal(decide(submitted, "work_record_evidence", body, "coord", {})) == (
        "NOT_FOUND",
        "body.evidence.artifacts[0]",
        "not_stored",
    )
    assert not isinstance(
        decide(submitted, "work_record_evidence", body, "coord", held(B, 10, manifest())), Exception
    )
    failure = builders.evidence("f-1")
    failure.artifacts.append(ref(B))
    fail = wp.WorkFail(
        work_item_id="wi",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        kind=wp.WORK_FAILURE_KIND_PERMANENT,
        reason="the data is gone",
        evidence=[failure],
    )
    assert refusal(decide(BASE, "work_fail", fail, "worker", {}))[1:] == (
        "body.evidence[0].artifacts[0]",
        "not_stored",
    )


def test_the_shell_is_asked_about_every_named_blob_once() -> None:
    from missionweave_server.services.authority import kinds

    body = submit(ref(A), ref(A), evidence_refs=(ref(B), ref("X" * 64)))
    assert kinds.named_artifacts(command(BASE, "work_submit", body, "worker")) == (A, B)
