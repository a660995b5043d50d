"""What the MissionOwner approves (GetMissionReview, issue 38): a pure function of the folded Group
state and the Group's events up to its head.

The state says what is current: WorkItem states, which Evidence belongs to each WorkItem's current
submission and review, usage, blockers, ambiguities, the DAG. The events add what the fold does not
keep: the submission's summary, submitter and time, each publication's producer, lease, manifest
digest and provenance sources, and Evidence records whole. Nothing here is reported by an agent, so
the answer is the same on every replica; the servicer only reads, authorizes and adds session keys.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from missionweave.kernel.errors import R, Rejected
from missionweave.v1 import authority_service_pb2 as pb
from missionweave.v1 import common_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.state import SIX, GroupState, WorkItemState
from missionweave_server.services.authority.visibility import sees_work_item

Answer = pb.MissionReviewAnswer
Blocker = pb.MissionReviewBlockerKind
WS = wp.WorkItemState

# The payloads the review reads; the servicer keeps only these of the Group's log.
PAYLOADS = frozenset(
    {
        "mission_submitted",
        "mission_approved",
        "mission_changes_requested",
        "work_started",
        "artifact_published",
        "work_submitted",
        "evidence_recorded",
        "work_result_accepted",
        "work_failed",
    }
)


@dataclass
class ReviewLog:
    """The facts of the Group's log the review needs, indexed in one pass (``index``)."""

    submissions: dict[str, event_pb2.Event] = field(default_factory=dict)  # mission.submitted by id
    answers: dict[str, event_pb2.Event] = field(default_factory=dict)  # submission id -> its answer
    sessions: dict[str, int] = field(default_factory=dict)  # execution lease id -> session epoch
    publications: dict[str, list[event_pb2.Event]] = field(default_factory=dict)  # by WorkItem
    by_digest: dict[str, list[event_pb2.Event]] = field(default_factory=dict)  # by BLAKE3 hex
    work_submissions: dict[str, event_pb2.Event] = field(default_factory=dict)  # work.submitted by id
    # work.submitted events by the BLAKE3 hex of each Artifact they name (D161: a deliverable need
    # not be published first; its submission says which WorkItem and producer it is of).
    handed_in: dict[str, list[event_pb2.Event]] = field(default_factory=dict)
    # Per WorkItem, the Evidence records since its latest submission, by id (a later record with the
    # same id replaces an earlier one, as the fold does).
    evidence: dict[str, dict[str, wp.Evidence]] = field(default_factory=dict)
    accepted: dict[str, str] = field(default_factory=dict)  # WorkItem -> work.result_accepted id
    failures: dict[str, wp.WorkFailed] = field(default_factory=dict)  # WorkItem -> latest failure


def index(events: Iterable[event_pb2.Event]) -> ReviewLog:
    log = ReviewLog()
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "mission_submitted":
            log.submissions[event.event_id] = event
        elif kind in ("mission_approved", "mission_changes_requested"):
            log.answers[getattr(event, kind).submission_event_id] = event
        elif kind == "work_started":
            log.sessions[event.work_started.lease.lease_id] = event.work_started.lease.session_epoch
        elif kind == "artifact_published":
            published = event.artifact_published
            log.publications.setdefault(published.work_item_id, []).append(event)
            log.by_digest.setdefault(published.artifact.digest.hex, []).append(event)
        elif kind == "work_submitted":
            log.work_submissions[event.event_id] = event
            submitted = event.work_submitted
            for ref in submitted.artifacts:
                log.handed_in.setdefault(ref.digest.hex, []).append(event)
            log.evidence[submitted.work_item_id] = {e.evidence_id: e for e in submitted.evidence}
        elif kind == "evidence_recorded":
            e = event.evidence_recorded.evidence
            log.evidence.setdefault(event.evidence_recorded.work_item_id, {})[e.evidence_id] = e
        elif kind == "work_result_accepted":
            log.accepted[event.work_result_accepted.work_item_id] = event.event_id
        elif kind == "work_failed":
            log.failures[event.work_failed.work_item_id] = event.work_failed
    return log


def mission_review(
    state: GroupState,
    events: Iterable[event_pb2.Event],
    *,
    viewer: str | None = None,
    submission_event_id: str = "",
) -> pb.GetMissionReviewResponse:
    """The review of ``submission_event_id`` (empty: the latest submission, if any) as ``viewer``
    (None: an operator, everything) may see it (D124: the WorkItems of its view). NOT_FOUND when the
    id names no ``mission.submitted`` event of the Group."""
    mission = state.mission
    assert mission is not None
    log = index(events)
    items = [item for item in state.work_items.values() if sees_work_item(state, viewer, item)]
    seen = {item.work_item_id for item in items}
    path, wall_clock_ms = critical_path(state, seen)
    out = pb.GetMissionReviewResponse(
        group_id=state.group_id,
        mission_id=mission.mission_id,
        title=mission.definition.title,
        mission_state=mission.state,  # type: ignore[arg-type]
        owner_id=mission.owner_id,
        group_revision=state.head_sequence,
        budget=budget(mission.definition.budget, state.mission_used),
        critical_path=pb.MissionReviewCriticalPath(work_item_ids=path, wall_clock_ms=wall_clock_ms),
    )
    wanted = submission_event_id or mission.latest_submission_event_id
    if wanted:
        submitted = log.submissions.get(wanted)
        if submitted is None:
            raise Rejected(
                R.REJECTION_REASON_NOT_FOUND,
                f"{state.group_id} holds no Mission submission {wanted!r}",
                field="submission_event_id",
            )
        out.submission.CopyFrom(_submission(submitted, mission.latest_submission_event_id, log))
        for ref in _each_once(submitted.mission_submitted.artifacts):
            publication = _latest_publication(log, ref.digest.hex, seen)
            handed_in = _latest_submission(log, ref.digest.hex, seen)
            out.artifacts.append(_artifact(ref, publication, log, submitted=True, handed_in=handed_in))
    on_path = set(path)
    out.work_items.extend(_work_item(item, log, seen, item.work_item_id in on_path) for item in items)
    out.blockers.extend(blocker for item in items for blocker in blockers(item, log))
    return out


# ------------------------------------------------------------------ the submission and its Artifacts


def _submission(event: event_pb2.Event, latest_id: str, log: ReviewLog) -> pb.MissionReviewSubmission:
    p = event.mission_submitted
    answer = log.answers.get(event.event_id)
    kind = answer.WhichOneof("payload") if answer is not None else None
    return pb.MissionReviewSubmission(
        submission_event_id=event.event_id,
        sequence=event.sequence,
        submitted_by=event.actor_id,
        submitted_at=event.recorded_at,
        summary=p.summary,
        mission_revision=p.mission_revision,
        coordinator_epoch=p.coordinator_epoch,
        latest=event.event_id == latest_id,
        answer={
            None: Answer.MISSION_REVIEW_ANSWER_AWAITING,
            "mission_approved": Answer.MISSION_REVIEW_ANSWER_APPROVED,
            "mission_changes_requested": Answer.MISSION_REVIEW_ANSWER_CHANGES_REQUESTED,
        }[kind],
        answer_event_id=answer.event_id if answer is not None else "",
    )


def _each_once(refs: Iterable[common_pb2.ArtifactRef]) -> list[common_pb2.ArtifactRef]:
    """The first reference to each digest, in order."""
    first: dict[str, common_pb2.ArtifactRef] = {}
    for ref in refs:
        first.setdefault(ref.digest.hex, ref)
    return list(first.values())


def _latest_publication(log: ReviewLog, hex_digest: str, seen: set[str]) -> event_pb2.Event | None:
    """The Group's latest publication of the digest by a WorkItem the reader sees."""
    visible = [e for e in log.by_digest.get(hex_digest, ()) if e.artifact_published.work_item_id in seen]
    return visible[-1] if visible else None


def _latest_submission(log: ReviewLog, hex_digest: str, seen: set[str]) -> event_pb2.Event | None:
    """The latest work.submitted naming the digest, of a WorkItem the reader sees."""
    visible = [e for e in log.handed_in.get(hex_digest, ()) if e.work_submitted.work_item_id in seen]
    return visible[-1] if visible else None


def _artifact(
    ref: common_pb2.ArtifactRef,
    publication: event_pb2.Event | None,
    log: ReviewLog,
    *,
    submitted: bool,
    handed_in: event_pb2.Event | None = None,
) -> pb.MissionReviewArtifact:
    """An Artifact as its publication describes it, else as the submission that handed it in names
    it (its WorkItem and producer; the manifest is the store's to show)."""
    out = pb.MissionReviewArtifact(artifact=ref, submitted=submitted)
    if publication is None:
        if handed_in is not None:
            out.work_item_id = handed_in.work_submitted.work_item_id
            out.producer_id = handed_in.actor_id
            out.producer_session_epoch = log.sessions.get(handed_in.work_submitted.lease_id, 0)
            out.published_at.CopyFrom(handed_in.recorded_at)
        return out
    p = publication.artifact_published
    out.artifact.media_type = ref.media_type or p.artifact.media_type
    out.work_item_id = p.work_item_id
    out.publication_event_id = publication.event_id
    out.published_at.CopyFrom(publication.recorded_at)
    out.producer_id = publication.actor_id
    out.producer_session_epoch = log.sessions.get(p.lease_id, 0)
    out.manifest_digest.CopyFrom(p.manifest_digest)
    out.source_artifacts.extend(p.source_artifacts)
    out.deliverable_id = p.deliverable_id
    return out


# ------------------------------------------------------------------ WorkItems


def _work_item(
    item: WorkItemState, log: ReviewLog, seen: set[str], on_path: bool
) -> pb.MissionReviewWorkItem:
    out = pb.MissionReviewWorkItem(
        work_item_id=item.work_item_id,
        title=item.title,
        state=item.state,  # type: ignore[arg-type]
        required=item.required,
        depends_on=item.depends_on,
        contract_revision=item.contract_revision,
        owner_id=item.owner.agent_id if item.owner else "",
        result_accepted_event_id=log.accepted.get(item.work_item_id, ""),
        budget=budget(item.contract.budget if item.contract is not None else None, item.used),
        on_critical_path=on_path,
    )
    artifacts: dict[str, pb.MissionReviewArtifact] = {}
    for publication in log.publications.get(item.work_item_id, ()):
        ref = publication.artifact_published.artifact
        artifacts[ref.digest.hex] = _artifact(ref, publication, log, submitted=False)
    submission = log.work_submissions.get(item.latest_submission_event_id)
    if submission is not None:
        out.submission_event_id = submission.event_id
        out.submitted_by = submission.actor_id
        out.submitted_at.CopyFrom(submission.recorded_at)
        out.submission_summary = submission.work_submitted.summary
        for ref in submission.work_submitted.artifacts:
            known = artifacts.get(ref.digest.hex)
            if known is None:
                latest = _latest_publication(log, ref.digest.hex, seen)
                artifacts[ref.digest.hex] = _artifact(ref, latest, log, submitted=True, handed_in=submission)
            else:
                known.submitted = True
                known.artifact.media_type = known.artifact.media_type or ref.media_type
    out.artifacts.extend(artifacts.values())
    records = [e for eid, e in log.evidence.get(item.work_item_id, {}).items() if eid in item.evidence]
    criteria = item.contract.acceptance_criteria if item.contract is not None else ()
    out.criteria.extend(criterion(c, records, item.submitted_by) for c in criteria)
    named = {c.criterion_id for c in criteria}
    out.other_evidence.extend(e for e in records if e.criterion_id not in named)
    return out


def criterion(
    c: wp.AcceptanceCriterion, records: list[wp.Evidence], submitter: str
) -> pb.MissionReviewCriterion:
    """The criterion with its Evidence, judged as ``work.accept_result`` judges it (MW-13.2-03 step
    4, MW-7.2-11): the latest record passes, and an independent review passes where one is required."""
    mine = [e for e in records if e.criterion_id == c.criterion_id]
    latest = mine[-1].result if mine else wp.EVIDENCE_RESULT_UNSPECIFIED
    independent = any(e.result == wp.EVIDENCE_RESULT_PASS and e.producer_id != submitter for e in mine)
    return pb.MissionReviewCriterion(
        criterion_id=c.criterion_id,
        description=c.description,
        required=c.required,
        independent_review_required=c.independent_review_required,
        required_evidence_methods=c.required_evidence_methods,
        evidence=mine,
        latest_result=latest,
        satisfied=latest == wp.EVIDENCE_RESULT_PASS and (independent or not c.independent_review_required),
    )


def blockers(item: WorkItemState, log: ReviewLog) -> list[pb.MissionReviewBlocker]:
    """Why ``item`` stands between the Mission and its approval: its state short of verified (not
    cancelled), then an open material ambiguity."""
    out = []
    if item.state not in (WS.WORK_ITEM_STATE_VERIFIED, WS.WORK_ITEM_STATE_CANCELLED):
        if item.state == WS.WORK_ITEM_STATE_BLOCKED:
            kind, details = Blocker.MISSION_REVIEW_BLOCKER_KIND_BLOCKED, list(item.blockers)
        elif item.state == WS.WORK_ITEM_STATE_FAILED:
            failure = log.failures.get(item.work_item_id)
            kind, details = Blocker.MISSION_REVIEW_BLOCKER_KIND_FAILED, [failure.reason] if failure else []
        else:
            kind, details = Blocker.MISSION_REVIEW_BLOCKER_KIND_NOT_VERIFIED, []
        out.append(_blocker(item, kind, details))
    if item.open_ambiguities:
        out.append(
            _blocker(item, Blocker.MISSION_REVIEW_BLOCKER_KIND_AMBIGUITY, sorted(item.open_ambiguities))
        )
    return out


def _blocker(item: WorkItemState, kind: int, details: list[str]) -> pb.MissionReviewBlocker:
    return pb.MissionReviewBlocker(
        kind=kind,  # type: ignore[arg-type]
        work_item_id=item.work_item_id,
        state=item.state,  # type: ignore[arg-type]
        required=item.required,
        details=details,
    )


# ------------------------------------------------------------------ budget and critical path


def budget(limit: common_pb2.ResourceVector | None, used: dict[str, int]) -> common_pb2.Budget:
    """Caps and usage in all six dimensions, the usage in the caps' currency."""
    out = common_pb2.Budget()
    if limit is not None:
        out.limit.CopyFrom(limit)
    out.used.CopyFrom(
        common_pb2.ResourceVector(currency=out.limit.currency, **{dim: used[dim] for dim in SIX})
    )  # type: ignore[arg-type]
    return out


def critical_path(state: GroupState, seen: set[str] | None = None) -> tuple[list[str], int]:
    """The dependency chain whose WorkItems used the most wall-clock time in total (cancelled ones
    left out); ties go to more WorkItems, then to the WorkItem ids that sort first, at the end and at
    each step back. Returns the chain (only the WorkItems in ``seen``, when given) and its total."""
    items = {
        wid: item for wid, item in state.work_items.items() if item.state != WS.WORK_ITEM_STATE_CANCELLED
    }
    value: dict[str, tuple[int, int]] = {}  # (wall-clock ms, WorkItems) of the best chain ending here
    previous: dict[str, str] = {}
    for wid in _dependencies_first(items):
        best, via = (0, 0), ""
        for dep in sorted(set(items[wid].depends_on)):
            if dep in value and value[dep] > best:  # strictly better: the first id in order wins ties
                best, via = value[dep], dep
        value[wid] = (best[0] + items[wid].used["wall_clock_ms"], best[1] + 1)
        previous[wid] = via
    if not value:
        return [], 0
    end = min(value, key=lambda wid: (-value[wid][0], -value[wid][1], wid))
    path = [end]
    while previous[path[-1]]:
        path.append(previous[path[-1]])
    path.reverse()
    shown = [wid for wid in path if seen is None or wid in seen]
    return shown, sum(items[wid].used["wall_clock_ms"] for wid in shown)


def _dependencies_first(items: dict[str, WorkItemState]) -> list[str]:
    """The WorkItems in an order where each comes after those it depends on (iterative: a DAG of
    any depth; MW-10.4-04 keeps it acyclic, and an edge closing a cycle would be ignored)."""
    order: list[str] = []
    placed: set[str] = set()
    for root in sorted(items):
        stack = [(root, False)]
        open_: set[str] = set()
        while stack:
            wid, expanded = stack.pop()
            if wid in placed:
                continue
            if expanded:
                placed.add(wid)
                open_.discard(wid)
                order.append(wid)
                continue
            open_.add(wid)
            stack.append((wid, True))
            stack.extend(
                (d, False) for d in items[wid].depends_on if d in items and d not in placed and d not in open_
            )
    return order


# ------------------------------------------------------------------ session keys (the one look-up)


SessionKey = Callable[[str, int], Awaitable[bytes | None]]


async def add_session_keys(review: pb.GetMissionReviewResponse, session_key: SessionKey) -> None:
    """Fills each Artifact's producer session public key, one look-up per session; a session the
    directory does not know, or a directory that does not answer, leaves it empty (the reader then
    verifies with what it trusts instead)."""
    keys: dict[tuple[str, int], bytes] = {}
    for artifact in [*review.artifacts, *(a for item in review.work_items for a in item.artifacts)]:
        session = (artifact.producer_id, int(artifact.producer_session_epoch))
        if not artifact.producer_id or not session[1]:
            continue
        if session not in keys:
            try:
                keys[session] = await session_key(*session) or b""
            except Rejected:
                keys[session] = b""
        artifact.producer_session_public_key = keys[session]
