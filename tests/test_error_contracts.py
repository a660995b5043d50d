"""The contract's refusals agree with themselves (issue 40 part 5): tools/check_contracts.py as a test.

common.proto's RejectionReason comments, every comment of the public protos that pairs a reason (or
an Artifact error code) with a gRPC code, docs/errors.md (its reason table, its prose and its status
tables) and the implementation's mapping (missionweave_server/edge/status.py) must name the same code for
each refusal. Each check is also shown to fire on a copy of a source with a planted disagreement.
"""

from __future__ import annotations

import grpc
import pytest

from missionweave.v1 import common_pb2
from tools.check_contracts import (
    Sources,
    check,
    iter_zero_numeric,
    load_sources,
    raised_artifact_errors,
    reason_table,
)

R = common_pb2.RejectionReason


@pytest.fixture(scope="module")
def sources() -> Sources:
    return load_sources()


def test_the_reasons_their_codes_and_every_pairing_agree(sources: Sources) -> None:
    report = check(sources)
    assert not report.findings, "the contract disagrees with itself:\n" + "\n".join(report.findings)
    # The check read something: the pairings in RPC comments and the document, every reason.
    assert len(report.pairings) >= 15
    assert {"PEER_UNAVAILABLE", "UNKNOWN_IDENTITY", "NOT_A_MEMBER", "MALFORMED"} <= {
        p.reason for p in report.pairings
    }
    assert any("rpc missionweave.v1.MembershipService.GetIdentity" in p.where for p in report.pairings)
    assert raised_artifact_errors(sources.python)["RANGE_NOT_SATISFIABLE"] == {"INVALID_ARGUMENT"}


def test_the_document_table_is_the_implementations(sources: Sources) -> None:
    """docs/errors.md carries `--table`'s output verbatim."""
    assert reason_table(sources) in sources.doc


# Each: where to plant it (a proto, "doc", or a Python file), what to replace, with what, and a
# piece of the finding it must produce.
PLANTED = [
    pytest.param(
        "missionweave/v1/common.proto",
        "`expected_revision` does not match the aggregate's current revision. ABORTED.",
        "`expected_revision` does not match the aggregate's current revision. UNAVAILABLE.",
        "common.proto: REVISION_MISMATCH's comment says UNAVAILABLE, the implementation gives ABORTED",
        id="enum comment names another code",
    ),
    pytest.param(
        "missionweave/v1/common.proto",
        "stay acyclic (MW-14-03). FAILED_PRECONDITION.",
        "stay acyclic (MW-14-03).",
        "MISSION_CYCLE's comment names no gRPC code",
        id="enum comment names no code",
    ),
    pytest.param(
        "doc",
        "| `REVISION_MISMATCH` | `ABORTED` |",
        "| `REVISION_MISMATCH` | `FAILED_PRECONDITION` |",
        "REVISION_MISMATCH says FAILED_PRECONDITION, the implementation gives ABORTED",
        id="doc table code",
    ),
    pytest.param(
        "doc",
        "| `MISSION_CYCLE` | `FAILED_PRECONDITION` |\n",
        "",
        "MISSION_CYCLE is missing from 'Every reason and its gRPC code'",
        id="reason missing from the doc",
    ),
    pytest.param(
        "doc",
        "| `MISSION_CYCLE` | `FAILED_PRECONDITION` |",
        "| `MISSION_CYCLES` | `FAILED_PRECONDITION` |",
        "'`MISSION_CYCLES`' is not one RejectionReason",
        id="doc table row names no reason",
    ),
    pytest.param(
        "doc",
        "`PEER_UNAVAILABLE` (gRPC UNAVAILABLE)",
        "`PEER_UNAVAILABLE` (gRPC INTERNAL)",
        "docs/errors.md: pairs PEER_UNAVAILABLE with INTERNAL",
        id="doc prose pairing",
    ),
    pytest.param(
        "doc",
        "| `UNAVAILABLE` with the same Rejection |",
        "| `ABORTED` with the same Rejection |",
        "table under 'Gateway streams (issue 13)': pairs PEER_UNAVAILABLE with ABORTED",
        id="doc status table",
    ),
    pytest.param(
        "doc",
        "| `OFFER_EXPIRED` (nothing",
        "| `OFFER_EXPIRY` (nothing",
        "names OFFER_EXPIRY, which is no RejectionReason",
        id="doc names a reason that does not exist",
    ),
    pytest.param(
        "missionweave/v1/membership_service.proto",
        "// code NOT_FOUND (metadata",
        "// code ALREADY_EXISTS (metadata",
        "rpc missionweave.v1.MembershipService.GetIdentity: pairs UNKNOWN_IDENTITY with ALREADY_EXISTS",
        id="rpc comment pairs a reason with a code never given",
    ),
    pytest.param(
        "missionweave/v1/authority_service.proto",
        "PERMISSION_DENIED / NOT_A_MEMBER",
        "UNAUTHENTICATED / NOT_A_MEMBER",
        "ReadEvents: pairs NOT_A_MEMBER with UNAUTHENTICATED",
        id="rpc comment code / reason",
    ),
    pytest.param(
        "missionweave/v1/authority_service.proto",
        "gets GROUP_NOT_FOUND.",
        "gets GROUP_NOT_FOND.",
        "names GROUP_NOT_FOND, which is no RejectionReason",
        id="rpc comment names a reason that does not exist",
    ),
    pytest.param(
        "missionweave/v1/common.proto",
        "A mismatch is rejected with REJECTION_REASON_REVISION_MISMATCH.",
        "A mismatch is rejected with REJECTION_REASON_REVISION_MISMATCHED.",
        "names REJECTION_REASON_REVISION_MISMATCHED",
        id="full enum name that does not exist",
    ),
    pytest.param(
        "missionweave/v1/artifact_service.proto",
        "No blob with this digest. NOT_FOUND.",
        "No blob with this digest. PERMISSION_DENIED.",
        "ArtifactErrorCode NOT_FOUND: its comment says PERMISSION_DENIED",
        id="artifact error comment",
    ),
    pytest.param(
        "missionweave/v1/artifact_service.proto",
        "(RESOURCE_EXHAUSTED, artifact error TOO_LARGE",
        "(INVALID_ARGUMENT, artifact error TOO_LARGE",
        "pairs artifact error TOO_LARGE with INVALID_ARGUMENT",
        id="comment pairs a code with an artifact error",
    ),
    pytest.param(
        "missionweave_server/services/artifacts/verify.py",
        "R.REJECTION_REASON_DATA_CORRUPTED",
        "R.REJECTION_REASON_NOT_FOUND",
        "ArtifactErrorCode CORRUPTED: its comment says DATA_LOSS, it is raised with DATA_CORRUPTED or NOT_FOUND",
        id="artifact error raised with another reason",
    ),
    pytest.param(
        "missionweave_server/services/artifacts/verify.py",
        "R.REJECTION_REASON_DATA_CORRUPTED",
        "R.REJECTION_REASON_INTERNAL_ERROR",
        "artifact error CORRUPTED is raised with INTERNAL_ERROR, which is no RejectionReason",
        id="artifact error raised with a reason that does not exist",
    ),
]


@pytest.mark.parametrize(("path", "old", "new", "expected"), PLANTED)
def test_a_planted_disagreement_is_found(
    sources: Sources, path: str, old: str, new: str, expected: str
) -> None:
    findings = check(sources.replaced(path, old, new)).findings
    assert any(expected in line for line in findings), "\n".join(findings) or "no finding"


def test_an_implementation_that_changes_a_code_is_found(sources: Sources) -> None:
    def codes(reason: int, metadata: dict[str, str]) -> int:
        if reason == R.Value("REJECTION_REASON_REVISION_MISMATCH"):
            return 9  # FAILED_PRECONDITION
        if reason == R.Value("REJECTION_REASON_MISSION_CYCLE"):
            return 2  # UNKNOWN: left out of CODES
        return sources.codes(reason, metadata)

    findings = check(Sources(sources.protos, sources.doc, codes, sources.python)).findings
    for expected in [
        "common.proto: REVISION_MISMATCH's comment says ABORTED, the implementation gives FAILED_PRECONDITION",
        "'Every reason and its gRPC code': REVISION_MISMATCH says ABORTED, the implementation gives FAILED_PRECONDITION",
        "implementation: MISSION_CYCLE has no gRPC code",
    ]:
        assert any(expected in line for line in findings), (expected, findings)


def test_the_fields_documented_at_zero_are_listed(sources: Sources) -> None:
    zero = {e.name for e in check(sources).zero_fields}
    assert {
        "missionweave.v1.ListWorkItemsRequest.page_size",
        "missionweave.v1.ReadEventsRequest.limit",
        "missionweave.v1.DownloadRequest.length",
        "missionweave.v1.SetPriorityRequest.priority_class",
        "missionweave.v1.RetryPolicy.initial_backoff",
        "missionweave.v1.NextSlotRequest.wait",
    } <= zero
    # "0 is refused INVALID_ARGUMENT" is a documented refusal, not a meaning at 0.
    assert "missionweave.v1.RetryPolicy.max_attempts" not in zero
    planted = sources.replaced(
        "missionweave/v1/common.proto",
        "// Model tokens (input plus output).",
        "// Model tokens (input plus output); 0 means none.",
    )
    numeric = {e.name for e in iter_zero_numeric(check(planted))}
    assert "missionweave.v1.ResourceVector.tokens" in numeric
    assert "missionweave.v1.ResourceVector.tokens" not in {e.name for e in iter_zero_numeric(check(sources))}


def test_the_fuzz_fails_on_a_field_refused_at_its_documented_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/test_fuzz_extremes.py's judgement of the zero rule and of refused baselines, on a
    made-up run: a documented 0 refused INVALID_ARGUMENT, one never sent, a refused baseline."""
    from tests import test_fuzz_extremes
    from tests.extremes import Outcome
    from tests.test_fuzz_extremes import Run, ZeroCase, baseline_findings, zero_findings

    page_size = "missionweave.v1.ListWorkItemsRequest.page_size"
    limit = "missionweave.v1.ReadEventsRequest.limit"
    depth = "missionweave.v1.Mission.depth"  # an output: never sent by a client, never required
    refused = Outcome(
        grpc.StatusCode.INVALID_ARGUMENT,
        rejection=common_pb2.Rejection(
            reason=common_pb2.REJECTION_REASON_INVALID_ARGUMENT, message="page_size: 1..1000"
        ),
    )
    run = Run(
        zero={page_size: "0 means 100", limit: "0 = no limit", depth: "0 for a root"},
        zeros={page_size: [ZeroCase("ListWorkItems page_size = zero", True, refused)]},
    )
    findings = zero_findings(run)
    assert any(
        f.startswith("ListWorkItems page_size = zero: refused REJECTION_REASON_INVALID_ARGUMENT")
        for f in findings
    )
    assert any(f.startswith(f"{limit} is documented at 0 but no target sends it 0") for f in findings)
    assert not any(depth in f for f in findings)
    run.zeros = {
        page_size: [ZeroCase("x", True, Outcome(grpc.StatusCode.OK))],
        limit: [ZeroCase("y", False, Outcome(grpc.StatusCode.OK))],
    }
    assert zero_findings(run) == [
        f"{limit} is sent 0 only through refused baselines or ones without its message (y)"
    ]

    run.baselines_refused = ["SchedulingService.ReleaseSlot [ReleaseSlotRequest]: NOT_FOUND ..."]
    assert baseline_findings(run) == [
        "the baseline is refused (make it valid, or allow it in BASELINES_REFUSED with why): "
        "SchedulingService.ReleaseSlot [ReleaseSlotRequest]: NOT_FOUND ..."
    ]
    monkeypatch.setattr(test_fuzz_extremes, "BASELINES_REFUSED", {"GatewayService.Connect [AckFrame]": "why"})
    assert (
        "GatewayService.Connect [AckFrame] is in BASELINES_REFUSED but its baseline is accepted now: remove it"
        in (baseline_findings(run))
    )
