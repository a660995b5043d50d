"""The MissionOwner's review (issue 38 part 4) through the public API against a live mesh: a Mission
whose WorkItems upload real Artifacts with signed manifests, publish them under their leases and
submit them with Evidence; then ``AuthorityService.GetMissionReview`` (both topologies) and
``mwp mission review`` (the CLI as a subprocess: checks, --json, --verify-bytes, --approve,
--request-changes)."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from nacl.signing import SigningKey

from missionweave.cli.review import check_manifest
from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.manifest import sign_manifest
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import session_key_id
from missionweave.sdk.client import MeshClient, SessionSigner, blob_digest, decode_events, membership_epoch
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import authority_service_pb2 as pb
from missionweave.v1 import command_pb2, common_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.servicer import AuthorityServicer
from tests import builders
from tests.conftest import World, register
from tests.test_cli_artifact import corrupt
from tests.test_cli_mission import Bench
from tests.test_cli_mission import bench as bench  # the fixture
from tests.test_grpc_authority import db_image

pytestmark = pytest.mark.both_topologies  # the `world` tests also on the split topology (conftest.py)

R = common_pb2.RejectionReason
WS = wp.WorkItemState
Kind = pb.MissionReviewBlockerKind
G = "grp_review"
BUDGET = common_pb2.ResourceVector(
    currency="EUR",
    financial_micros=50_000_000,
    tokens=1_000_000,
    tool_calls=500,
    compute_ms=3_600_000,
    wall_clock_ms=36_000_000,
    side_effects=10,
)
ITEM_BUDGET = common_pb2.ResourceVector(
    currency="EUR",
    financial_micros=5_000_000,
    tokens=100_000,
    tool_calls=50,
    compute_ms=600_000,
    wall_clock_ms=3_600_000,
    side_effects=2,
)
DATA = b"region,q3\nnorth,120\nsouth,95\n" * 40
REPORT = b"# Q3 report\n\nNorth grew, south held.\n" * 30
CHART = b"<svg><rect width='120'/><rect width='95'/></svg>" * 20
NOTE = b"Figures reconciled on the 5th; the chart uses the same extract.\n"


def manifest(
    signer: SessionSigner,
    data: bytes,
    mission_id: str,
    work_item_id: str,
    media_type: str,
    *sources: common_pb2.Digest,
) -> common_pb2.SignedEnvelope:
    """The producer's signed manifest (MW-13.1-03), with its current session's key."""
    m = apb.ArtifactManifest(
        content_digest=blob_digest(data),
        media_type=media_type,
        producer_agent_id=signer.identity_id,
        agent_card_version="1.0.0",
        mission_id=mission_id,
        group_id=G,
        work_item_id=work_item_id,
        source_artifacts=list(sources),
        created_at=to_timestamp(SystemClock().now()),
        classification=apb.DATA_CLASSIFICATION_INTERNAL,
        size_bytes=len(data),
        retrieval_uri="mwp://mesh/review",
        schema=apb.ArtifactSchema(schema_id="none"),
        components=[apb.ComponentVersion(kind=apb.COMPONENT_KIND_TOOL, name="pytest", version="8")],
    )
    return sign_manifest(
        m,
        hashlib.sha256(data).hexdigest(),
        signer.key,
        session_key_id(signer.identity_id, signer.session_epoch),
    )


class Scenario:
    """G's Mission: wi-a extracts the data, wi-b writes the report from it, wi-c draws the chart from
    it; each uploads its output with a signed manifest, publishes it under its lease and submits it
    with Evidence (citing an uploaded test log); the Coordinator reviews and accepts each."""

    def __init__(
        self, target: str, owner: SessionSigner, coordinator: SessionSigner, worker: SessionSigner
    ) -> None:
        self.owner, self.coordinator, self.worker = owner, coordinator, worker
        self.reader = MeshClient(target, reader=owner)
        self.producer = MeshClient(target, reader=worker)  # the worker holds what it uploads
        self.mission_id = ""
        self.uploaded: dict[str, common_pb2.Digest] = {}  # manifest digest of each output, by name
        self.refs: dict[str, common_pb2.ArtifactRef] = {}

    async def close(self) -> None:
        for client in (self.reader, self.producer):
            await client.channel.close()

    async def run(self, signer: SessionSigner, kind: str, body: object) -> command_pb2.CommandResult:
        epoch = (
            0
            if kind == "mission_create"
            else membership_epoch(await self.reader.group_state(G), signer.identity_id)
        )
        return await self.reader.execute(signer.sign(signer.command(G, kind, body, membership_epoch=epoch)))  # type: ignore[arg-type]

    async def plan(self) -> None:
        create = builders.mission_create(
            self.owner.identity_id, self.coordinator.identity_id, SystemClock().now(), budget=BUDGET
        )
        create.coordinator_renewal.lease_duration.FromSeconds(3600)
        await self.run(self.owner, "mission_create", create)
        self.mission_id = (await self.reader.group_state(G)).mission.mission_id
        grant = membership_pb2.MembershipGrant(
            member_id=self.worker.identity_id, role=membership_pb2.MEMBER_ROLE_WORKER
        )
        await self.run(self.owner, "membership_grant", grant)
        for wid, deps in (("wi-a", ()), ("wi-b", ("wi-a",)), ("wi-c", ("wi-a",))):
            contract = builders.contract(SystemClock().now(), depends_on=deps, budget=ITEM_BUDGET)
            body = wp.WorkAuthorize(
                work_item_id=wid, title=f"task {wid}", contract=contract, coordinator_epoch=1
            )
            await self.run(self.coordinator, "work_authorize", body)

    async def start(self, wid: str) -> None:
        offer = wp.WorkOffer(
            work_item_id=wid,
            offer_id=f"offer-{wid}",
            candidate_ids=[self.worker.identity_id],
            coordinator_epoch=1,
            expires_at=to_timestamp(SystemClock().now() + timedelta(minutes=5)),
            selection_criteria=[builders.selection(self.worker.identity_id)],
        )
        await self.run(self.coordinator, "work_offer", offer)
        await self.run(
            self.worker,
            "work_accept_offer",
            wp.WorkAcceptOffer(work_item_id=wid, offer_id=f"offer-{wid}", contract_revision=1),
        )
        await self.run(
            self.worker,
            "work_start",
            wp.WorkStart(work_item_id=wid, ownership_epoch=1, lease_id=f"lease-{wid}"),
        )

    async def upload(
        self, name: str, wid: str, data: bytes, media_type: str, *sources: str
    ) -> common_pb2.ArtifactRef:
        digests = [self.refs[s].digest for s in sources]
        stored = await self.producer.upload(
            data, manifest(self.worker, data, self.mission_id, wid, media_type, *digests)
        )
        self.uploaded[name] = stored.manifest_digest
        self.refs[name] = common_pb2.ArtifactRef(digest=blob_digest(data), media_type=media_type)
        return self.refs[name]

    async def finish(
        self, wid: str, name: str, data: bytes, media_type: str, *sources: str, wall_clock_ms: int
    ) -> None:
        ref = await self.upload(name, wid, data, media_type, *sources)
        publish = wp.WorkPublishArtifact(
            work_item_id=wid,
            lease_id=f"lease-{wid}",
            ownership_epoch=1,
            artifact=ref,
            deliverable_id="report",
        )
        await self.run(self.worker, "work_publish_artifact", publish)
        log = await self.upload(
            f"log of {name}", wid, f"{wid}: 42 of 42 balances match\n".encode(), "text/plain"
        )
        evidence = wp.Evidence(
            evidence_id=f"ev-{wid}",
            criterion_id="balances",
            method=wp.EVIDENCE_METHOD_TEST,
            result=wp.EVIDENCE_RESULT_PASS,
            summary="42 of 42 balances match",
            artifacts=[log],
        )
        submit = wp.WorkSubmit(
            work_item_id=wid,
            lease_id=f"lease-{wid}",
            ownership_epoch=1,
            contract_revision=1,
            artifacts=[ref],
            evidence=[evidence],
            summary=f"{name} written",
            usage_delta=common_pb2.ResourceVector(
                currency="EUR", wall_clock_ms=wall_clock_ms, tokens=wall_clock_ms // 10
            ),
        )
        submitted = decode_events((await self.run(self.worker, "work_submit", submit)).events)[0].event_id
        review = wp.Evidence(
            evidence_id=f"rev-{wid}",
            criterion_id="balances",
            method=wp.EVIDENCE_METHOD_REVIEW,
            result=wp.EVIDENCE_RESULT_PASS,
            summary="read against the ledger",
        )
        await self.run(
            self.coordinator,
            "work_record_evidence",
            wp.WorkRecordEvidence(work_item_id=wid, evidence=review, coordinator_epoch=1),
        )
        accept = wp.WorkAcceptResult(
            work_item_id=wid,
            coordinator_epoch=1,
            submission_event_id=submitted,
            review_evidence_ids=[f"rev-{wid}"],
        )
        await self.run(self.coordinator, "work_accept_result", accept)

    async def everything(self) -> None:
        """Planned, worked and verified: a first, then b and c from a's data."""
        await self.plan()
        await self.start("wi-a")
        await self.finish("wi-a", "data", DATA, "text/csv", wall_clock_ms=300)
        for wid, name, data, media, wall in (
            ("wi-b", "report", REPORT, "text/markdown", 1200),
            ("wi-c", "chart", CHART, "image/svg+xml", 400),
        ):
            await self.start(wid)
            await self.finish(wid, name, data, media, "data", wall_clock_ms=wall)

    async def cover_note(self, target: str) -> common_pb2.ArtifactRef:
        """An Artifact the Coordinator uploads itself with its manifest, never published under a
        lease: what the review lists bare."""
        coordinator = MeshClient(target, reader=self.coordinator)
        try:
            await coordinator.upload(
                NOTE, manifest(self.coordinator, NOTE, self.mission_id, "wi-b", "text/plain")
            )
        finally:
            await coordinator.channel.close()
        return common_pb2.ArtifactRef(digest=blob_digest(NOTE), media_type="text/plain")

    async def submit(self, summary: str = "Q3 report and chart", *extra: common_pb2.ArtifactRef) -> str:
        mission = (await self.reader.group_state(G)).mission
        body = mission_pb2.MissionSubmitForApproval(
            coordinator_epoch=1,
            mission_revision=mission.revision,
            summary=summary,
            artifacts=[self.refs["report"], self.refs["chart"], *extra],
        )
        return decode_events((await self.run(self.coordinator, "mission_submit_for_approval", body)).events)[
            0
        ].event_id


async def refusal(call: object) -> tuple[grpc.StatusCode, common_pb2.Rejection]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None, info.value
    return info.value.code(), rejection


# ------------------------------------------------------------------ the read model (both topologies)


@pytest.mark.req("MW-7.3-01", "MW-7.3-05", "MW-13.1-03", "MW-13.1-04", "MW-13.2-02", "MW-13.2-04")
async def test_the_review_shows_the_submission_its_artifacts_evidence_budget_and_critical_path(
    world: World,
) -> None:
    w = world
    # The worker signs with a session key of its own, not its identity key (as the SDK's Agent does).
    worker = await w.client.open_session("worker-bot", w.worker.key, SigningKey.generate())
    s = Scenario(w.target, w.owner, w.coordinator, worker)
    try:
        await s.plan()
        await s.start("wi-a")
        await s.finish("wi-a", "data", DATA, "text/csv", wall_clock_ms=300)
        await s.start("wi-b")
        # Mid-way: nothing submitted yet, wi-b active and wi-c open stand in the way.
        early = await s.reader.mission_review(G)
        assert not early.HasField("submission") and not early.artifacts
        assert [(b.kind, b.work_item_id, b.state) for b in early.blockers] == [
            (Kind.MISSION_REVIEW_BLOCKER_KIND_NOT_VERIFIED, "wi-b", WS.WORK_ITEM_STATE_ACTIVE),
            (Kind.MISSION_REVIEW_BLOCKER_KIND_NOT_VERIFIED, "wi-c", WS.WORK_ITEM_STATE_OPEN),
        ]
        await s.finish("wi-b", "report", REPORT, "text/markdown", "data", wall_clock_ms=1200)
        await s.start("wi-c")
        await s.finish("wi-c", "chart", CHART, "image/svg+xml", "data", wall_clock_ms=400)
        submission = await s.submit()

        review = await s.reader.mission_review(G)
        head = (await s.reader.group_state(G)).head_sequence
        assert (review.group_id, review.mission_id, review.owner_id, review.group_revision) == (
            G,
            s.mission_id,
            "alice",
            head,
        )
        assert review.mission_state == mission_pb2.MISSION_STATE_AWAITING_APPROVAL
        sub = review.submission
        assert (sub.submission_event_id, sub.submitted_by, sub.summary) == (
            submission,
            "coord-bot",
            "Q3 report and chart",
        )
        assert sub.latest and sub.answer == pb.MISSION_REVIEW_ANSWER_AWAITING
        assert [e.sequence async for e in s.reader.read_events(G) if e.event_id == submission] == [
            sub.sequence
        ]

        assert [a.artifact.digest for a in review.artifacts] == [blob_digest(REPORT), blob_digest(CHART)]
        report, chart = review.artifacts
        assert (report.artifact.media_type, report.work_item_id, report.producer_id) == (
            "text/markdown",
            "wi-b",
            "worker-bot",
        )
        assert (
            report.manifest_digest.hex == s.uploaded["report"].hex
            and chart.manifest_digest.hex == s.uploaded["chart"].hex
        )
        data = common_pb2.Digest(algorithm="blake3", hex=blob_digest(DATA).hex)
        assert list(report.source_artifacts) == [data] == list(chart.source_artifacts)
        assert report.producer_session_epoch == worker.session_epoch
        assert (
            report.producer_session_public_key
            == bytes(worker.key.verify_key)
            != bytes(w.worker.key.verify_key)
        )
        assert report.deliverable_id == "report" and report.submitted and report.publication_event_id

        items = {i.work_item_id: i for i in review.work_items}
        assert list(items) == ["wi-a", "wi-b", "wi-c"] and all(
            i.state == WS.WORK_ITEM_STATE_VERIFIED for i in items.values()
        )
        b = items["wi-b"]
        assert (b.submitted_by, b.submission_summary, list(b.depends_on)) == (
            "worker-bot",
            "report written",
            ["wi-a"],
        )
        [balances] = b.criteria
        assert [(e.evidence_id, e.producer_id) for e in balances.evidence] == [
            ("ev-wi-b", "worker-bot"),
            ("rev-wi-b", "coord-bot"),
        ]
        assert balances.evidence[0].artifacts[0].digest == s.refs["log of report"].digest  # Evidence whole
        assert balances.satisfied and balances.latest_result == wp.EVIDENCE_RESULT_PASS
        assert [a.artifact.digest for a in b.artifacts] == [blob_digest(REPORT)] and b.artifacts[0].submitted
        assert b.budget.limit == ITEM_BUDGET and (b.budget.used.wall_clock_ms, b.budget.used.tokens) == (
            1200,
            120,
        )
        assert review.budget.limit == BUDGET and review.budget.used.wall_clock_ms == 300 + 1200 + 400
        assert review.budget.used.tokens == 190
        assert (
            list(review.critical_path.work_item_ids) == ["wi-a", "wi-b"]
            and review.critical_path.wall_clock_ms == 1500
        )
        assert [i.work_item_id for i in review.work_items if i.on_critical_path] == ["wi-a", "wi-b"]
        assert not review.blockers

        # The Coordinator, the worker (it took part in every WorkItem) and an administrator read it too.
        for signer in (w.coordinator, worker, w.admin):
            other = MeshClient(w.target, reader=signer)
            try:
                assert await other.mission_review(G, submission) == review
            finally:
                await other.channel.close()

        # What `mwp mission review` checks: the manifest the publication recorded, with the session key.
        checked = await check_manifest(s.reader, G, report)
        assert checked.signature == "verified" and checked.manifest_hex == s.uploaded["report"].hex
        assert checked.detail.endswith(
            f"verifies against the session key of worker-bot (session {worker.session_epoch})"
        )
        assert checked.manifest is not None and checked.manifest.work_item_id == "wi-b"
        identity_only = pb.MissionReviewArtifact()
        identity_only.CopyFrom(report)
        identity_only.ClearField("producer_session_public_key")  # falls back to the registered identity key
        failed = await check_manifest(s.reader, G, identity_only)
        assert failed.signature == "FAILED" and "registered identity key of worker-bot" in failed.detail
        wrong = pb.MissionReviewArtifact()
        wrong.CopyFrom(report)
        wrong.manifest_digest.hex = "0" * 64
        missing = await check_manifest(s.reader, G, wrong)
        assert missing.signature == "FAILED" and "serves no manifest" in missing.detail
    finally:
        await s.close()


async def test_a_non_member_is_refused_and_learns_nothing(world: World) -> None:
    w = world
    s = Scenario(w.target, w.owner, w.coordinator, w.worker)
    outsider = await register(w.client, w.keys["admin"], "outsider-bot", common_pb2.IDENTITY_KIND_AGENT)
    reader = MeshClient(w.target, reader=outsider)
    anonymous = MeshClient(w.target)
    admin = MeshClient(w.target, reader=w.admin)
    try:
        await s.plan()
        await s.start("wi-a")
        await s.finish("wi-a", "data", DATA, "text/csv", wall_clock_ms=10)
        answers = []
        for group in (G, "grp_never_created"):
            code, rejection = await refusal(reader.mission_review(group))
            assert (code, rejection.reason) == (
                grpc.StatusCode.PERMISSION_DENIED,
                R.REJECTION_REASON_NOT_A_MEMBER,
            )
            answers.append(rejection.message.replace(group, "GROUP"))
        assert answers[0] == answers[1]  # an existing Group and a missing one answer alike
        assert "wi-a" not in answers[0] and "task" not in answers[0]
        code, rejection = await refusal(anonymous.mission_review(G))
        assert (code, rejection.reason) == (
            grpc.StatusCode.UNAUTHENTICATED,
            R.REJECTION_REASON_UNAUTHENTICATED,
        )
        # An operator is told the Group does not exist.
        code, rejection = await refusal(admin.mission_review("grp_never_created"))
        assert (code, rejection.reason) == (grpc.StatusCode.NOT_FOUND, R.REJECTION_REASON_GROUP_NOT_FOUND)
    finally:
        for client in (reader, anonymous, admin):
            await client.channel.close()
        await s.close()


async def test_an_unknown_submission_is_not_found_and_malformed_ids_are_invalid_writing_nothing(
    world: World,
) -> None:
    w = world
    s = Scenario(w.target, w.owner, w.coordinator, w.worker)
    outsider = await register(w.client, w.keys["admin"], "outsider-bot", common_pb2.IDENTITY_KIND_AGENT)
    stranger = MeshClient(w.target, reader=outsider)
    try:
        await s.plan()
        before = await db_image(w)
        for reader in (s.reader, stranger):  # nothing to protect in a malformed Group id: answered to anyone
            code, rejection = await refusal(reader.mission_review("not a group id!"))
            assert (code, rejection.reason, dict(rejection.metadata)) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                R.REJECTION_REASON_INVALID_ARGUMENT,
                {"field": "group_id"},
            )
        code, rejection = await refusal(s.reader.mission_review("", ""))
        assert rejection.metadata["field"] == "group_id"
        code, rejection = await refusal(s.reader.mission_review(G, "evt with spaces"))
        assert (code, rejection.reason, dict(rejection.metadata)) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            R.REJECTION_REASON_INVALID_ARGUMENT,
            {"field": "submission_event_id"},
        )
        code, rejection = await refusal(s.reader.mission_review(G, "evt_0123456789abcdef0123456789"))
        assert (code, rejection.reason, dict(rejection.metadata)) == (
            grpc.StatusCode.NOT_FOUND,
            R.REJECTION_REASON_NOT_FOUND,
            {"field": "submission_event_id"},
        )
        # A non-member learns nothing, not even whether its submission id is well formed.
        code, rejection = await refusal(stranger.mission_review(G, "evt with spaces"))
        assert rejection.reason == R.REJECTION_REASON_NOT_A_MEMBER
        assert await db_image(w) == before
    finally:
        await stranger.channel.close()
        await s.close()


@pytest.mark.topologies("single")  # reaches into the Authority of the one process
async def test_the_log_is_read_through_the_states_head_and_never_past_it(world: World) -> None:
    """Events appended after the state was read stay out of the review derived from it."""
    w = world
    s = Scenario(w.target, w.owner, w.coordinator, w.worker)
    try:
        await s.plan()
        servicer = AuthorityServicer(w.mesh.authority)  # type: ignore[attr-defined]
        log = [e async for e in s.reader.read_events(G)]
        last = next(e for e in reversed(log) if e.type == "work.authorized")  # wi-c's
        read = await servicer._events_up_to(G, last.sequence - 1, frozenset({"work_authorized"}))
        assert [e.work_authorized.work_item_id for e in read] == ["wi-a", "wi-b"]
    finally:
        await s.close()


# ------------------------------------------------------------------ `mwp mission review` (the CLI)


async def scenario(bench: Bench) -> Scenario:
    s = Scenario(
        bench.target, bench.signers["alice"], bench.signers["coord-bot"], bench.signers["worker-bot"]
    )
    await s.everything()
    return s


def digest_text(digest: common_pb2.Digest) -> str:
    return f"blake3:{digest.hex}:{digest.size_bytes}"


@pytest.mark.req("MW-13.1-05", "MW-7.3-06")
async def test_mwp_mission_review_shows_what_is_approved_checked_then_answers_it(bench: Bench) -> None:
    s = await scenario(bench)
    try:
        before = await bench.mwp("mission", "review", "--group", G, "--approve", expect=1)
        assert before.stdout.startswith("Mission mis_") and "No submission yet" in before.stdout
        assert (
            "has no submission to answer yet" in before.stderr and (await bench.show(G))["state"] == "ACTIVE"
        )
        first = await s.submit("v1")
        shown = (await bench.mwp("mission", "review", "--group", G)).stdout
        lines = shown.splitlines()
        assert f"Submission {first} (latest, awaiting)" in shown and "  summary: v1" in shown
        assert "Artifacts (2): manifest signatures verified 2 of 2" in shown
        row = next(
            line for line in lines if blob_digest(REPORT).hex in line and "text/markdown" in line
        ).split()
        assert row[:2] == ["\u2713", f"blake3:{blob_digest(REPORT).hex}"]
        assert row[2:6] == [str(len(REPORT)), "text/markdown", "worker-bot", "wi-b"]
        assert row[6] == f"blake3:{blob_digest(DATA).hex[:12]}\u2026"  # derived from a's data
        assert "  wi-b 'task wi-b' VERIFIED, submitted by worker-bot: 'report written'" in lines
        assert "    \u2713 balances (required): PASS" in lines
        assert any(
            line.split() == ["PASS", "REVIEW", "by", "coord-bot", "read", "against", "the", "ledger"]
            for line in lines
        )
        assert "Blockers: none" in lines
        mission_row = next(line for line in lines if line.startswith("  Mission ")).split()
        assert mission_row[1:4] == ["0.00/50.00", "EUR", "190/1000000"] and mission_row[6] == "1900/36000000"
        assert "Critical path (by wall-clock used, 1500 ms): wi-a -> wi-b" in lines

        doc = (await bench.mwp("mission", "review", "--group", G, "--json")).json()
        assert doc["verified"] is True and doc["decision"] is None
        assert doc["review"]["submission"]["submission_event_id"] == first
        assert [c["signature"] for c in doc["artifact_checks"]] == ["verified", "verified"]
        assert doc["artifact_checks"][0]["manifest_digest"] == f"blake3:{s.uploaded['report'].hex}"
        assert doc["artifact_checks"][0]["bytes"] is None

        rehashed = (await bench.mwp("mission", "review", "--group", G, "--verify-bytes", "--json")).json()
        assert [c["bytes"]["status"] for c in rehashed["artifact_checks"]] == ["OK", "OK"]
        assert (
            "bytes re-hashed and matching 2 of 2"
            in (await bench.mwp("mission", "review", "--group", G, "--verify-bytes")).stdout
        )

        outsider = await bench.mwp("mission", "review", "--group", G, *bench.as_("relief-bot"), expect=1)
        assert "NOT_A_MEMBER" in outsider.stderr and not outsider.stdout
        not_owner = await bench.mwp(
            "mission", "review", "--group", G, "--approve", *bench.as_("worker-bot"), expect=1
        )
        assert "refused: PERMISSION_DENIED" in not_owner.stderr
        malformed = await bench.mwp("mission", "review", "--group", "not a group!", expect=1)
        assert "INVALID_ARGUMENT" in malformed.stderr
        await bench.mwp("mission", "review", "--group", G, "--approve", "--request-changes", "x", expect=2)

        sent_back = await bench.mwp(
            "mission", "review", "--group", G, "--request-changes", "add the Q2 comparison"
        )
        assert f"requested changes to submission {first}" in sent_back.stdout
        assert (await bench.show(G))["state"] == "ACTIVE"
        second = await s.submit("v2", await s.cover_note(bench.target))
        old = (await bench.mwp("mission", "review", "--group", G, "--submission", first)).stdout
        assert f"Submission {first} (NOT the latest, changes requested" in old
        shown = (await bench.mwp("mission", "review", "--group", G)).stdout
        note = next(line for line in shown.splitlines() if blob_digest(NOTE).hex in line).split()
        # No publication describes it: its manifest names the producer and the media type.
        assert note[:1] + note[2:] == ["\u2713", str(len(NOTE)), "text/plain", "coord-bot", "-", "-"]
        approved = (
            await bench.mwp("mission", "review", "--group", G, "--approve", "--comment", "ship it", "--json")
        ).json()
        assert (
            approved["review"]["submission"]["submission_event_id"] == second
        )  # one document: review and answer
        assert [c["signature"] for c in approved["artifact_checks"]] == ["verified"] * 3
        assert "manifest_digest" not in approved["review"]["artifacts"][2]
        assert [e["type"] for e in approved["decision"]["events"]] == ["mission.approved"]
        assert approved["decision"]["events"][0]["mission_approved"]["submission_event_id"] == second
        final = await bench.show(G)
        assert final["state"] == "APPROVED" and final["approval_event_id"]
        done = (await bench.mwp("mission", "review", "--group", G)).stdout
        assert "(latest, approved (" in done
    finally:
        await s.close()


async def test_an_approval_is_refused_while_an_artifact_fails_its_checks(
    bench: Bench, tmp_path: Path
) -> None:
    s = await scenario(bench)
    try:
        await s.submit()
        corrupt(tmp_path / "data", blob_digest(CHART).hex)
        # The signature still verifies: only the bytes show the damage.
        assert "verified 2 of 2" in (await bench.mwp("mission", "review", "--group", G)).stdout
        refused = await bench.mwp("mission", "review", "--group", G, "--verify-bytes", "--approve", expect=1)
        assert "bytes re-hashed and matching 1 of 2" in refused.stdout
        assert f"\u2717 {digest_text(blob_digest(CHART))}: bytes CORRUPTED" in refused.stdout
        assert "not approved: 1 of 2 Artifacts failed verification" in refused.stderr
        assert (await bench.show(G))["state"] == "AWAITING_APPROVAL"
        doc = (
            await bench.mwp("mission", "review", "--group", G, "--verify-bytes", "--json", expect=1)
        ).json()
        assert doc["verified"] is False and doc["decision"] is None
        assert [c["bytes"]["status"] for c in doc["artifact_checks"]] == ["OK", "CORRUPTED"]
        await bench.mwp(
            "mission", "review", "--group", G, "--verify-bytes", "--request-changes", "the chart is damaged"
        )
        assert (await bench.show(G))["state"] == "ACTIVE"
    finally:
        await s.close()
