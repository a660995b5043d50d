"""The MissionOwner's review (missionweave_server/services/authority/mission_review.py) on the pure core: a Group driven
through decide/evolve, its events kept, and the review derived from both. The critical path, the
budgets, the blockers and the criteria are also checked on hand-made states."""

from __future__ import annotations

from datetime import timedelta

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import authority_service_pb2 as pb
from missionweave.v1 import common_pb2, conversation_pb2, event_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.mission_review import (
    ReviewLog,
    add_session_keys,
    blockers,
    criterion,
    critical_path,
    mission_review,
)
from missionweave_server.services.authority.rules.common import AMBIGUITY_TOPIC, StoredArtifact
from missionweave_server.services.authority.state import SIX, GroupState, IdentityInfo, WorkItemState
from tests import builders
from tests.core_group import CoreGroup, evolved
from tests.mission_fixtures import IDS, NOW

R = common_pb2.RejectionReason
WS = wp.WorkItemState
Answer = pb.MissionReviewAnswer
Kind = pb.MissionReviewBlockerKind
PASS, FAIL = wp.EVIDENCE_RESULT_PASS, wp.EVIDENCE_RESULT_FAIL
IDENTITIES = {**IDS, "helper": IdentityInfo("helper", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1)}
G = CoreGroup("grp_review", decider.DecisionContext(NOW, IDENTITIES), NOW)
# Every dimension its own number, so that a dimension read from the wrong field shows.
MISSION_BUDGET = common_pb2.ResourceVector(
    currency="EUR",
    financial_micros=50_000_000,
    tokens=1_000_000,
    tool_calls=500,
    compute_ms=3_600_000,
    wall_clock_ms=10_000_000,
    side_effects=10,
)
ITEM_BUDGET = common_pb2.ResourceVector(
    currency="EUR",
    financial_micros=1_000_000,
    tokens=10_000,
    tool_calls=50,
    compute_ms=60_000,
    wall_clock_ms=1_000_000,
    side_effects=2,
)


def hexed(name: str) -> str:
    return (name.encode().hex() * 64)[:64]


def ref(name: str, size: int = 100, media_type: str = "") -> common_pb2.ArtifactRef:
    return common_pb2.ArtifactRef(
        digest=common_pb2.Digest(algorithm="blake3", hex=hexed(name), size_bytes=size), media_type=media_type
    )


def usage(wall_clock_ms: int, **dims: int) -> common_pb2.ResourceVector:
    return common_pb2.ResourceVector(currency="EUR", wall_clock_ms=wall_clock_ms, **dims)  # type: ignore[arg-type]


class Group:
    """A Group on the pure core with its log: every accepted decision's events, in order."""

    def __init__(self) -> None:
        self.state: GroupState | None = None
        self.events: list[event_pb2.Event] = []

    def run(
        self, kind: str, body: object, actor: str, ctx: decider.DecisionContext | None = None
    ) -> list[event_pb2.Event]:
        decision = G.decide(self.state, kind, body, actor, ctx)
        assert not isinstance(decision, Rejected), f"{kind} by {actor}: {decision!r}"
        self.state = evolved(self.state, decision)
        self.events.extend(decision)
        return decision

    @property
    def now(self) -> GroupState:
        assert self.state is not None
        return self.state

    def review(self, viewer: str | None = None, submission: str = "") -> pb.GetMissionReviewResponse:
        return mission_review(self.now, self.events, viewer=viewer, submission_event_id=submission)

    def authorize(self, wid: str, *deps: str, criteria: tuple[wp.AcceptanceCriterion, ...] = ()) -> None:
        contract = builders.contract(NOW, depends_on=deps, budget=ITEM_BUDGET)
        contract.acceptance_criteria.extend(criteria)
        body = wp.WorkAuthorize(work_item_id=wid, title=f"task {wid}", contract=contract, coordinator_epoch=1)
        self.run("work_authorize", body, "coord")

    def start(self, wid: str, worker: str = "worker", epoch: int = 1) -> None:
        """Offered, accepted (ownership ``epoch``) and started under lease-<wid>[-<epoch>]."""
        suffix = f"-{epoch}" if epoch > 1 else ""
        offer = wp.WorkOffer(
            work_item_id=wid,
            offer_id=f"off-{wid}{suffix}",
            candidate_ids=[worker],
            coordinator_epoch=1,
            expires_at=to_timestamp(NOW + timedelta(minutes=5)),
            selection_criteria=[builders.selection(worker)],
        )
        self.run("work_offer", offer, "coord")
        accept = wp.WorkAcceptOffer(work_item_id=wid, offer_id=f"off-{wid}{suffix}", contract_revision=1)
        self.run("work_accept_offer", accept, worker)
        self.run(
            "work_start",
            wp.WorkStart(work_item_id=wid, ownership_epoch=epoch, lease_id=f"lease-{wid}{suffix}"),
            worker,
        )

    def publish(
        self, wid: str, artifact: common_pb2.ArtifactRef, *sources: str, worker: str = "worker"
    ) -> event_pb2.Event:
        digest = artifact.digest
        stored = StoredArtifact(
            digest.hex,
            digest.size_bytes,
            hexed(f"manifest of {digest.hex}"),
            worker,
            tuple(hexed(s) for s in sources),
        )
        body = wp.WorkPublishArtifact(
            work_item_id=wid,
            lease_id=f"lease-{wid}",
            ownership_epoch=1,
            artifact=artifact,
            deliverable_id="report",
        )
        ctx = decider.DecisionContext(NOW, IDENTITIES, artifacts={digest.hex: stored})
        return self.run("work_publish_artifact", body, worker, ctx)[0]

    def submit(
        self,
        wid: str,
        *artifacts: common_pb2.ArtifactRef,
        used: common_pb2.ResourceVector | None = None,
        evidence: tuple[wp.Evidence, ...] = (),
        worker: str = "worker",
    ) -> event_pb2.Event:
        body = wp.WorkSubmit(
            work_item_id=wid,
            lease_id=f"lease-{wid}",
            ownership_epoch=1,
            contract_revision=1,
            artifacts=list(artifacts),
            evidence=list(evidence or (builders.evidence(f"ev-{wid}"),)),
            summary=f"{wid} done",
            usage_delta=used,
        )
        return self.run("work_submit", body, worker)[0]

    def accept(self, wid: str, *review: wp.Evidence) -> event_pb2.Event:
        for e in review:
            self.run(
                "work_record_evidence",
                wp.WorkRecordEvidence(work_item_id=wid, evidence=e, coordinator_epoch=1),
                "coord",
            )
        body = wp.WorkAcceptResult(
            work_item_id=wid,
            coordinator_epoch=1,
            submission_event_id=self.now.work_items[wid].latest_submission_event_id,
            review_evidence_ids=[e.evidence_id for e in review],
        )
        return self.run("work_accept_result", body, "coord")[0]

    def submit_mission(
        self, *artifacts: common_pb2.ArtifactRef, summary: str = "all done"
    ) -> event_pb2.Event:
        assert self.now.mission is not None
        body = mission_pb2.MissionSubmitForApproval(
            coordinator_epoch=1,
            mission_revision=self.now.mission.revision,
            artifacts=list(artifacts),
            summary=summary,
        )
        return self.run("mission_submit_for_approval", body, "coord")[0]


def review_evidence(wid: str, criterion_id: str = "balances", result: int = PASS) -> wp.Evidence:
    return wp.Evidence(
        evidence_id=f"rev-{wid}-{criterion_id}",
        criterion_id=criterion_id,
        method=wp.EVIDENCE_METHOD_REVIEW,
        result=result,
        summary="read it through",  # type: ignore[arg-type]
    )


def mission(*workers: str) -> Group:
    g = Group()
    g.run("mission_create", builders.mission_create("alice", "coord", NOW, budget=MISSION_BUDGET), "alice")
    for worker in workers or ("worker",):
        g.run(
            "membership_grant",
            membership_pb2.MembershipGrant(member_id=worker, role=membership_pb2.MEMBER_ROLE_WORKER),
            "alice",
        )
    return g


STYLE = wp.AcceptanceCriterion(
    criterion_id="style",
    description="reads well",
    required_evidence_methods=[wp.EVIDENCE_METHOD_REVIEW],
    required=False,
    independent_review_required=True,
)


def diamond() -> Group:
    """a -> (b, c) -> d, each published, submitted with Evidence, reviewed and accepted; d's output is
    derived from b's and c's; then the Mission is submitted with d's report (named twice) and a's data."""
    g = mission()
    g.authorize("wi-a")
    g.authorize("wi-b", "wi-a")
    g.authorize("wi-c", "wi-a")
    g.authorize("wi-d", "wi-b", "wi-c", criteria=(STYLE,))
    for wid, wall, sources in (("wi-a", 100, ()), ("wi-b", 500, ("b",)), ("wi-c", 200, ("c",))):
        g.start(wid)
        g.publish(wid, ref(wid[-1], media_type="text/csv"), *sources)
        g.submit(
            wid,
            ref(wid[-1]),
            used=usage(wall, tokens=7, tool_calls=3, compute_ms=11, financial_micros=13, side_effects=1),
        )
        g.accept(wid)
    g.start("wi-d")
    g.publish("wi-d", ref("d"), "b", "c")
    extra = wp.Evidence(
        evidence_id="ev-lint",
        criterion_id="lint",
        method=wp.EVIDENCE_METHOD_TEST,
        result=PASS,
        summary="no warnings",
    )
    g.submit(
        "wi-d",
        ref("d", media_type="text/markdown"),
        used=usage(50),
        evidence=(builders.evidence("ev-wi-d"), extra),
    )
    g.accept("wi-d", review_evidence("wi-d"), review_evidence("wi-d", "style"))
    return g


# ------------------------------------------------------------------ the submission and its Artifacts


def test_the_review_names_the_submission_and_describes_each_artifact_it_names() -> None:
    g = diamond()
    submitted = g.submit_mission(
        ref("d", media_type="text/markdown"), ref("a"), ref("d"), summary="Q3 report ready"
    )
    review = g.review()
    assert (review.group_id, review.mission_id, review.owner_id) == (
        "grp_review",
        g.now.mission.mission_id,
        "alice",
    )  # type: ignore[union-attr]
    assert review.title == builders.definition("alice", NOW).title
    assert review.mission_state == mission_pb2.MISSION_STATE_AWAITING_APPROVAL
    assert review.group_revision == g.now.head_sequence == g.events[-1].sequence
    s = review.submission
    assert (s.submission_event_id, s.sequence, s.submitted_by) == (
        submitted.event_id,
        submitted.sequence,
        "coord",
    )
    assert s.submitted_at == submitted.recorded_at and s.summary == "Q3 report ready"
    assert (s.mission_revision, s.coordinator_epoch) == (submitted.mission_submitted.mission_revision, 1)
    assert s.latest and s.answer == Answer.MISSION_REVIEW_ANSWER_AWAITING and not s.answer_event_id

    # Each Artifact once, in the submission's order, described by its publication.
    assert [a.artifact.digest.hex for a in review.artifacts] == [hexed("d"), hexed("a")]
    d, a = review.artifacts
    published_d = next(
        e for e in g.events if e.type == "artifact.published" and e.artifact_published.work_item_id == "wi-d"
    )
    assert d.artifact.media_type == "text/markdown"  # the submission's own media type
    assert a.artifact.media_type == "text/csv"  # none named: the publication's
    assert (d.work_item_id, d.publication_event_id, d.published_at) == (
        "wi-d",
        published_d.event_id,
        published_d.recorded_at,
    )
    assert (d.producer_id, d.producer_session_epoch, d.deliverable_id) == ("worker", 1, "report")
    assert d.manifest_digest == published_d.artifact_published.manifest_digest
    assert d.manifest_digest.hex == hexed(f"manifest of {hexed('d')}")
    assert [x.hex for x in d.source_artifacts] == [hexed("b"), hexed("c")]
    assert not a.source_artifacts and a.work_item_id == "wi-a"
    assert all(x.submitted for x in review.artifacts)
    assert not d.producer_session_public_key  # only the servicer looks keys up (add_session_keys)


def test_an_artifact_no_publication_describes_is_described_by_the_submission_that_handed_it_in() -> None:
    g = mission()
    g.authorize("wi-a")
    g.start("wi-a")
    g.submit("wi-a", ref("raw", media_type="text/plain"))
    g.accept("wi-a")
    g.submit_mission(ref("raw"))
    [raw] = g.review().artifacts
    assert raw.artifact.digest.hex == hexed("raw") and raw.submitted
    assert (raw.work_item_id, raw.producer_id, raw.producer_session_epoch) == ("wi-a", "worker", 1)
    assert raw.HasField("published_at") and not raw.publication_event_id and not raw.artifact.media_type
    assert not raw.HasField("manifest_digest") and not raw.source_artifacts  # the store's manifest has them
    [item] = g.review().work_items
    assert [x.artifact.media_type for x in item.artifacts] == ["text/plain"]  # the WorkItem's own reference


def test_earlier_submissions_carry_their_answers_and_only_the_latest_is_latest() -> None:
    g = mission()
    first = g.submit_mission(summary="v1")
    changes = g.run(
        "mission_request_changes",
        mission_pb2.MissionRequestChanges(submission_event_id=first.event_id, requested_changes="add Q2"),
        "alice",
    )[0]
    g.authorize(
        "wi-late"
    )  # planned after the first submission: an earlier one is shown with today's WorkItems
    assert [w.work_item_id for w in g.review(submission=first.event_id).work_items] == ["wi-late"]
    g.run(
        "work_cancel",
        wp.WorkCancel(work_item_id="wi-late", coordinator_epoch=1, reason="not needed"),
        "coord",
    )
    second = g.submit_mission(summary="v2")
    assert g.review().submission.submission_event_id == second.event_id  # the latest by default
    old = g.review(submission=first.event_id).submission
    assert (old.summary, old.latest) == ("v1", False)
    assert (old.answer, old.answer_event_id) == (
        Answer.MISSION_REVIEW_ANSWER_CHANGES_REQUESTED,
        changes.event_id,
    )
    approved = g.run(
        "mission_approve", mission_pb2.MissionApprove(submission_event_id=second.event_id), "alice"
    )[0]
    now = g.review().submission
    assert (now.latest, now.answer, now.answer_event_id) == (
        True,
        Answer.MISSION_REVIEW_ANSWER_APPROVED,
        approved.event_id,
    )


def test_a_review_before_any_submission_has_none_and_an_unknown_one_is_not_found() -> None:
    g = mission()
    g.authorize("wi-a")
    review = g.review()
    assert not review.HasField("submission") and not review.artifacts
    assert [w.work_item_id for w in review.work_items] == ["wi-a"]
    g.start("wi-a")
    work_submission = g.submit("wi-a", ref("a"))
    for unknown in ("evt_nothing", work_submission.event_id):  # not a mission.submitted event
        with pytest.raises(Rejected) as refused:
            g.review(submission=unknown)
        assert refused.value.reason == R.REJECTION_REASON_NOT_FOUND
        assert refused.value.metadata == {"field": "submission_event_id"}


# ------------------------------------------------------------------ WorkItems


def test_each_work_item_shows_its_artifacts_evidence_per_criterion_and_budget() -> None:
    g = diamond()
    g.submit_mission(ref("d"))
    items = {w.work_item_id: w for w in g.review().work_items}
    assert list(items) == ["wi-a", "wi-b", "wi-c", "wi-d"]  # authorization order
    d = items["wi-d"]
    submitted = g.now.work_items["wi-d"].latest_submission_event_id
    submission = next(e for e in g.events if e.event_id == submitted)
    accepted = next(
        e
        for e in g.events
        if e.type == "work.result_accepted" and e.work_result_accepted.work_item_id == "wi-d"
    )
    assert (d.title, d.state, d.required, d.contract_revision) == (
        "task wi-d",
        WS.WORK_ITEM_STATE_VERIFIED,
        True,
        1,
    )
    assert list(d.depends_on) == ["wi-b", "wi-c"] and not d.owner_id  # a verified WorkItem has no owner
    assert (d.submission_event_id, d.submitted_by, d.submitted_at) == (
        submitted,
        "worker",
        submission.recorded_at,
    )
    assert d.submission_summary == "wi-d done" and d.result_accepted_event_id == accepted.event_id
    [artifact] = d.artifacts
    assert (
        artifact.submitted
        and artifact.work_item_id == "wi-d"
        and artifact.artifact.media_type == "text/markdown"
    )

    by_id = {c.criterion_id: c for c in d.criteria}
    assert list(by_id) == ["balances", "style"]  # the contract's order
    balances, style = by_id["balances"], by_id["style"]
    assert [e.evidence_id for e in balances.evidence] == [
        "ev-wi-d",
        "rev-wi-d-balances",
    ]  # submission first, then review
    assert [e.producer_id for e in balances.evidence] == ["worker", "coord"]
    assert balances.evidence[0].summary == "42 of 42 balances match" and balances.evidence[0].HasField(
        "recorded_at"
    )
    assert (balances.description, balances.required, balances.independent_review_required) == (
        "all balances match",
        True,
        False,
    )
    assert list(balances.required_evidence_methods) == [wp.EVIDENCE_METHOD_TEST]
    assert balances.latest_result == PASS and balances.satisfied
    assert (style.required, style.independent_review_required, style.satisfied) == (False, True, True)
    assert [e.evidence_id for e in d.other_evidence] == ["ev-lint"]  # a criterion the contract does not name

    budget = d.budget
    assert budget.limit == ITEM_BUDGET
    assert budget.used == usage(50)
    b = items["wi-b"].budget.used
    assert (b.financial_micros, b.tokens, b.tool_calls, b.compute_ms, b.wall_clock_ms, b.side_effects) == (
        13,
        7,
        3,
        11,
        500,
        1,
    )
    assert b.currency == "EUR"


def test_only_the_evidence_of_the_current_submission_and_its_review_is_shown() -> None:
    """Failure Evidence of a later attempt (recorded when it is retried) belongs to no submission."""
    g = mission()
    g.authorize("wi-a")
    g.start("wi-a")
    g.submit("wi-a", ref("a"))
    rejected = wp.Evidence(
        criterion_id="balances", method=wp.EVIDENCE_METHOD_REVIEW, result=FAIL, summary="totals off"
    )
    g.run(
        "work_fail",
        wp.WorkFail(
            work_item_id="wi-a",
            coordinator_epoch=1,
            kind=wp.WORK_FAILURE_KIND_REVIEW_REJECTED,
            evidence=[rejected],
            reason="totals off",
        ),
        "coord",
    )
    g.start("wi-a", epoch=2)
    flake = wp.Evidence(
        evidence_id="ev-flake",
        criterion_id="balances",
        method=wp.EVIDENCE_METHOD_FAILURE_OBSERVATION,
        result=FAIL,
        summary="timeout",
    )
    recorded = g.run(
        "work_fail",
        wp.WorkFail(
            work_item_id="wi-a",
            lease_id="lease-wi-a-2",
            ownership_epoch=2,
            kind=wp.WORK_FAILURE_KIND_TRANSIENT,
            evidence=[flake],
            reason="timeout",
        ),
        "worker",
    )
    assert "work.evidence_recorded" in [
        e.type for e in recorded
    ]  # the retried attempt's Evidence is in the log
    [item] = g.review().work_items
    assert item.state == WS.WORK_ITEM_STATE_QUEUED
    assert item.owner_id == "worker" and not item.result_accepted_event_id  # owned again, not verified
    assert [e.evidence_id for c in item.criteria for e in c.evidence] == [
        "ev-wi-a"
    ] and not item.other_evidence


def test_a_new_submission_replaces_the_evidence_of_the_one_before_in_its_own_order() -> None:
    g = mission()
    g.authorize("wi-a")
    g.start("wi-a")
    g.submit("wi-a", ref("a"), evidence=(builders.evidence("ev-1"), builders.evidence("ev-2")))
    rejected = wp.Evidence(
        criterion_id="balances", method=wp.EVIDENCE_METHOD_REVIEW, result=FAIL, summary="totals off"
    )
    g.run(
        "work_fail",
        wp.WorkFail(
            work_item_id="wi-a",
            coordinator_epoch=1,
            kind=wp.WORK_FAILURE_KIND_REVIEW_REJECTED,
            evidence=[rejected],
            reason="totals off",
        ),
        "coord",
    )
    g.start("wi-a", epoch=2)
    again = builders.with_overrides(builders.evidence("ev-2"), {"summary": "43 of 43 balances match"})
    resubmit = wp.WorkSubmit(
        work_item_id="wi-a",
        lease_id="lease-wi-a-2",
        ownership_epoch=2,
        contract_revision=1,
        artifacts=[ref("a2")],
        evidence=[builders.evidence("ev-3"), again],
        summary="second try",
    )
    g.run("work_submit", resubmit, "worker")
    [item] = g.review().work_items
    [balances] = item.criteria
    assert [(e.evidence_id, e.summary) for e in balances.evidence] == [
        ("ev-3", "42 of 42 balances match"),
        ("ev-2", "43 of 43 balances match"),
    ]
    assert item.submission_summary == "second try" and [a.artifact.digest.hex for a in item.artifacts] == [
        hexed("a2")
    ]


def test_the_mission_budget_is_its_caps_and_the_usage_of_all_its_work_items_summed() -> None:
    g = diamond()
    review = g.review()
    assert review.budget.limit == MISSION_BUDGET
    for dim in SIX:
        total = sum(getattr(w.budget.used, dim) for w in review.work_items)
        assert getattr(review.budget.used, dim) == total == g.now.mission_used[dim], dim
    assert review.budget.used.wall_clock_ms == 100 + 500 + 200 + 50
    assert review.budget.used.currency == "EUR"


def test_a_published_artifact_the_submission_does_not_name_is_listed_unsubmitted_and_each_digest_once() -> (
    None
):
    g = mission()
    g.authorize("wi-a")
    g.start("wi-a")
    first = g.publish("wi-a", ref("draft"))
    g.publish("wi-a", ref("final", media_type="text/csv"))
    again = g.publish("wi-a", ref("draft", media_type="text/plain"))  # republished: described by the latest
    g.submit("wi-a", ref("final"))
    [item] = g.review().work_items
    assert [(a.artifact.digest.hex, a.submitted) for a in item.artifacts] == [
        (hexed("draft"), False),
        (hexed("final"), True),
    ]
    assert item.artifacts[0].publication_event_id == again.event_id != first.event_id
    assert item.artifacts[0].artifact.media_type == "text/plain"


def test_a_submitted_artifact_another_work_item_published_is_described_by_that_publication() -> None:
    g = mission()
    g.authorize("wi-a")
    g.authorize("wi-b", "wi-a")
    g.start("wi-a")
    g.publish("wi-a", ref("data", media_type="text/csv"))
    g.submit("wi-a", ref("data"))
    g.accept("wi-a")
    g.start("wi-b")
    g.submit("wi-b", ref("data"))  # passed through unchanged
    b = g.review().work_items[1]
    [data] = b.artifacts
    assert (data.work_item_id, data.submitted, data.artifact.media_type) == ("wi-a", True, "text/csv")


# ------------------------------------------------------------------ a member's view


def test_a_member_sees_the_work_items_it_takes_part_in_and_no_publication_outside_them() -> None:
    g = mission("worker", "helper")
    g.authorize("wi-a")
    g.start("wi-a")
    g.publish("wi-a", ref("a"))
    g.submit("wi-a", ref("a"), used=usage(900))
    g.accept("wi-a")
    g.authorize("wi-h", "wi-a")
    g.start("wi-h", worker="helper")
    g.submit("wi-h", ref("h"), worker="helper", used=usage(10))
    g.accept("wi-h")
    g.submit_mission(ref("a"), ref("h"))
    # helper joined before wi-a existed, so it sees it too (D124): revoke that by making it late.
    late = g.now
    late.members["helper"].visibility_start_sequence = late.work_items["wi-h"].created_sequence
    review = mission_review(late, g.events, viewer="helper")
    assert [w.work_item_id for w in review.work_items] == ["wi-h"]
    a, h = review.artifacts
    assert (
        a.artifact.digest.hex == hexed("a")
        and not a.publication_event_id
        and not a.producer_id
        and not a.work_item_id
    )
    assert h.artifact.digest.hex == hexed("h")
    assert list(review.critical_path.work_item_ids) == ["wi-h"] and review.critical_path.wall_clock_ms == 10
    assert review.budget.used.wall_clock_ms == 910  # the Mission's whole budget, for every reader
    everything = mission_review(late, g.events)  # an operator
    assert [w.work_item_id for w in everything.work_items] == ["wi-a", "wi-h"]
    assert list(everything.critical_path.work_item_ids) == ["wi-a", "wi-h"]
    assert everything.artifacts[0].producer_id == "worker"
    owner = mission_review(late, g.events, viewer="alice")  # the MissionOwner sees all of it
    assert [w.work_item_id for w in owner.work_items] == ["wi-a", "wi-h"]


# ------------------------------------------------------------------ blockers


def item(wid: str, state: int, **kw: object) -> WorkItemState:
    return WorkItemState(work_item_id=wid, state=state, **kw)  # type: ignore[arg-type]


def test_blockers_name_what_stands_between_the_mission_and_its_approval() -> None:
    log = ReviewLog(failures={"wi-f": wp.WorkFailed(work_item_id="wi-f", reason="the source is gone")})
    cases = [
        (item("wi-v", WS.WORK_ITEM_STATE_VERIFIED), []),
        (item("wi-x", WS.WORK_ITEM_STATE_CANCELLED), []),
        (
            item("wi-b", WS.WORK_ITEM_STATE_BLOCKED, blockers=("the ledger export",)),
            [(Kind.MISSION_REVIEW_BLOCKER_KIND_BLOCKED, ["the ledger export"])],
        ),
        (
            item("wi-f", WS.WORK_ITEM_STATE_FAILED),
            [(Kind.MISSION_REVIEW_BLOCKER_KIND_FAILED, ["the source is gone"])],
        ),
        (item("wi-g", WS.WORK_ITEM_STATE_FAILED), [(Kind.MISSION_REVIEW_BLOCKER_KIND_FAILED, [])]),
    ]
    cases += [
        (item(f"wi-{s}", s), [(Kind.MISSION_REVIEW_BLOCKER_KIND_NOT_VERIFIED, [])])
        for s in (
            WS.WORK_ITEM_STATE_OPEN,
            WS.WORK_ITEM_STATE_OFFERED,
            WS.WORK_ITEM_STATE_QUEUED,
            WS.WORK_ITEM_STATE_ACTIVE,
            WS.WORK_ITEM_STATE_SUBMITTED,
        )
    ]
    ambiguous = item("wi-q", WS.WORK_ITEM_STATE_OFFERED, open_ambiguities={"msg_2", "msg_1"}, required=False)
    cases.append(
        (
            ambiguous,
            [
                (Kind.MISSION_REVIEW_BLOCKER_KIND_NOT_VERIFIED, []),
                (Kind.MISSION_REVIEW_BLOCKER_KIND_AMBIGUITY, ["msg_1", "msg_2"]),
            ],
        )
    )
    for work_item, expected in cases:
        got = blockers(work_item, log)
        assert [(b.kind, list(b.details)) for b in got] == expected, work_item.work_item_id
        assert all(b.work_item_id == work_item.work_item_id and b.state == work_item.state for b in got)
        assert all(b.required == work_item.required for b in got)


def test_the_review_lists_the_blockers_of_the_work_items_in_order() -> None:
    g = mission()
    g.authorize("wi-a")
    g.authorize("wi-b")
    conversation = g.now.work_items["wi-b"].conversation_id
    post = conversation_pb2.MessagePost(
        conversation_id=conversation,
        topic=AMBIGUITY_TOPIC,
        content=conversation_pb2.MessageContent(text="which ledger?"),
    )
    message_id = g.run("message_post", post, "worker")[0].message_posted.message_id
    g.start("wi-a")
    g.run(
        "work_fail",
        wp.WorkFail(
            work_item_id="wi-a",
            lease_id="lease-wi-a",
            ownership_epoch=1,
            kind=wp.WORK_FAILURE_KIND_PERMANENT,
            evidence=[wp.Evidence(method=wp.EVIDENCE_METHOD_FAILURE_OBSERVATION, result=FAIL, summary="404")],
            reason="the export is gone",
        ),
        "worker",
    )
    got = [(b.kind, b.work_item_id, list(b.details)) for b in g.review().blockers]
    assert got == [
        (Kind.MISSION_REVIEW_BLOCKER_KIND_FAILED, "wi-a", ["the export is gone"]),
        (Kind.MISSION_REVIEW_BLOCKER_KIND_NOT_VERIFIED, "wi-b", []),
        (Kind.MISSION_REVIEW_BLOCKER_KIND_AMBIGUITY, "wi-b", [message_id]),
    ]


# ------------------------------------------------------------------ criteria


def test_a_criterion_is_satisfied_as_the_accepting_review_judges_it() -> None:
    independent = wp.AcceptanceCriterion(criterion_id="c", required=True, independent_review_required=True)
    plain = wp.AcceptanceCriterion(criterion_id="c", required=True)

    def ev(result: int, producer: str) -> wp.Evidence:
        return wp.Evidence(
            evidence_id=f"e-{producer}-{result}", criterion_id="c", result=result, producer_id=producer
        )  # type: ignore[arg-type]

    other = wp.Evidence(evidence_id="x", criterion_id="other", result=FAIL, producer_id="rev")
    cases = [
        (plain, [], wp.EVIDENCE_RESULT_UNSPECIFIED, False),
        (plain, [ev(PASS, "worker")], PASS, True),
        (plain, [ev(PASS, "worker"), other], PASS, True),  # another criterion's record does not count
        (plain, [ev(PASS, "worker"), ev(FAIL, "rev")], FAIL, False),  # the latest record decides
        (plain, [ev(FAIL, "worker"), ev(PASS, "rev")], PASS, True),
        (independent, [ev(PASS, "worker")], PASS, False),  # only the submitter's own word
        (independent, [ev(PASS, "worker"), ev(PASS, "rev")], PASS, True),
        (independent, [ev(PASS, "rev"), ev(FAIL, "worker")], FAIL, False),
    ]
    for c, records, latest, satisfied in cases:
        got = criterion(c, records, "worker")
        assert (got.latest_result, got.satisfied) == (latest, satisfied), (
            records,
            c.independent_review_required,
        )
        assert [e.criterion_id for e in got.evidence] == ["c"] * len(
            [r for r in records if r.criterion_id == "c"]
        )


# ------------------------------------------------------------------ the critical path


def dag(*edges: tuple[str, tuple[str, ...], int], cancelled: tuple[str, ...] = ()) -> GroupState:
    """WorkItems with their dependencies and wall-clock usage."""
    state = GroupState("grp_dag")
    for wid, deps, wall in edges:
        state.work_items[wid] = item(
            wid,
            WS.WORK_ITEM_STATE_CANCELLED if wid in cancelled else WS.WORK_ITEM_STATE_VERIFIED,
            depends_on=deps,
            used=dict.fromkeys(SIX, 0) | {"wall_clock_ms": wall},
        )
    return state


def test_the_critical_path_is_the_chain_that_used_the_most_wall_clock_time() -> None:
    diamond_ = [("a", (), 100), ("b", ("a",), 500), ("c", ("a",), 200), ("d", ("b", "c"), 50)]
    assert critical_path(dag(*diamond_)) == (["a", "b", "d"], 650)
    swapped = [("a", (), 100), ("b", ("a",), 200), ("c", ("a",), 500), ("d", ("b", "c"), 50)]
    assert critical_path(dag(*swapped)) == (["a", "c", "d"], 650)
    # One long-running WorkItem outweighs a longer chain of quick ones.
    assert critical_path(dag(("x", (), 10), ("y", ("x",), 10), ("z", ("y",), 10), ("slow", (), 1000))) == (
        ["slow"],
        1000,
    )


def test_with_no_usage_it_is_the_longest_chain_by_count_and_ties_go_to_the_ids_that_sort_first() -> None:
    assert critical_path(dag(("a", (), 0), ("b", ("a",), 0), ("c", ("b",), 0), ("z", (), 0))) == (
        ["a", "b", "c"],
        0,
    )
    # Equal wall-clock: more WorkItems win.
    assert critical_path(dag(("a", (), 5), ("b", ("a",), 0), ("z", (), 5))) == (["a", "b"], 5)
    # Equal in both: the end that sorts first, and at each step back the dependency that sorts first.
    assert critical_path(dag(("m", (), 0), ("n", (), 0), ("q", ("n", "m"), 0), ("p", ("n", "m"), 0))) == (
        ["m", "p"],
        0,
    )


def test_cancelled_work_items_are_left_out_and_a_deep_chain_is_fine() -> None:
    # Without b the chain a-b-c falls apart: a and c tie, a sorts first.
    assert critical_path(dag(("a", (), 1), ("b", ("a",), 1), ("c", ("b",), 2), cancelled=("b",))) == (
        ["c"],
        2,
    )
    assert critical_path(dag(("a", (), 1), ("b", ("a",), 1), ("c", ("b",), 1), cancelled=("b",))) == (
        ["a"],
        1,
    )
    assert critical_path(dag(("a", (), 1), cancelled=("a",))) == ([], 0)
    assert critical_path(GroupState("grp_empty")) == ([], 0)
    deep = dag(*[(f"w{i:05d}", (f"w{i - 1:05d}",) if i else (), 1) for i in range(5000)])
    path, total = critical_path(deep)
    assert len(path) == 5000 and path[0] == "w00000" and total == 5000


def test_a_reader_gets_the_path_through_the_work_items_it_sees() -> None:
    state = dag(("a", (), 100), ("b", ("a",), 500), ("c", ("b",), 50))
    assert critical_path(state, {"a", "c"}) == (["a", "c"], 150)


def test_the_review_marks_the_critical_path() -> None:
    g = diamond()
    review = g.review()
    assert list(review.critical_path.work_item_ids) == ["wi-a", "wi-b", "wi-d"]
    assert review.critical_path.wall_clock_ms == 100 + 500 + 50
    assert {w.work_item_id for w in review.work_items if w.on_critical_path} == {"wi-a", "wi-b", "wi-d"}


# ------------------------------------------------------------------ session keys


async def test_session_keys_are_looked_up_once_per_session_and_a_failed_look_up_leaves_none() -> None:
    g = diamond()
    g.submit_mission(ref("d"), ref("a"))
    review = g.review()
    asked: list[tuple[str, int]] = []

    async def session_key(identity_id: str, epoch: int) -> bytes | None:
        asked.append((identity_id, epoch))
        return b"k" * 32

    await add_session_keys(review, session_key)
    assert asked == [("worker", 1)]
    published = [a for a in [*review.artifacts, *(a for w in review.work_items for a in w.artifacts)]]
    assert published and all(a.producer_session_public_key == b"k" * 32 for a in published)

    async def unreachable(identity_id: str, epoch: int) -> bytes | None:
        raise Rejected(R.REJECTION_REASON_PEER_UNAVAILABLE, "membership did not answer")

    async def unknown(identity_id: str, epoch: int) -> bytes | None:
        return None

    for lookup in (unreachable, unknown):
        fresh = g.review()
        await add_session_keys(fresh, lookup)
        assert not any(a.producer_session_public_key for a in fresh.artifacts)

    bare = pb.GetMissionReviewResponse(artifacts=[pb.MissionReviewArtifact(artifact=ref("x"))])
    await add_session_keys(bare, session_key)
    assert len(asked) == 1  # nothing published: nothing to look up
