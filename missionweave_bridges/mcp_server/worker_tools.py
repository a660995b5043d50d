"""The Worker's tools to take work, do it under a lease and hand it in (finding and watching it:
work_finding_tools.py).

The order a model follows (the server's instructions say it too): list_work (or wait_for_offer) ->
accept_offer -> start_work -> show_work_item / read_input -> report_progress, checkpoint,
store_output ... -> submit_work (or block_with_question, fail_work). Each tool is one signed command
or an authorized read, refused exactly as any other client's (tools return the refusal as a tool
error with its stable reason and a hint; nothing is written).
"""

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.sdk.artifacts import Origin, card_version, put_artifact
from missionweave.sdk.client import blob_digest
from missionweave.sdk.contracts import enum_names
from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.mcp_server.content import (
    INLINE_LIMIT,
    EvidenceIn,
    OutputLog,
    UsageIn,
    content_of,
    digest_text,
    evidence_records,
    inputs_of,
    ok,
    ref_of,
    usage_vector,
)
from missionweave_bridges.mcp_server.desk import Desk, first, written
from missionweave_bridges.mcp_server.leases import LeaseKeeper
from missionweave_bridges.mcp_server.refusals import Refused
from missionweave_bridges.mcp_server.work_finding_tools import GroupId, WorkItemId

FAILURE_KINDS = {"permanent": wp.WORK_FAILURE_KIND_PERMANENT, "transient": wp.WORK_FAILURE_KIND_TRANSIENT}
BLOCKER_KINDS = enum_names(wp.BlockerKind, "BLOCKER_KIND_")
DECLINE_REASONS = enum_names(wp.DeclineReason, "DECLINE_REASON_")
CONFIDENCES = enum_names(wp.EstimateConfidence, "ESTIMATE_CONFIDENCE_")


def register(
    server: MCPServer, desk: Desk, keeper: LeaseKeeper, outputs: OutputLog, files: list[Path]
) -> None:
    me = desk.me

    @server.tool(
        description="Accept an offer made to you: you become the WorkItem's owner (it is queued for you). "
        "Next: start_work. Refusals: OFFER_EXPIRED (gone: list_work again), INVALID_TRANSITION (another "
        "candidate won), REVISION_MISMATCH (the contract changed: show_work_item)."
    )
    async def accept_offer(
        group_id: GroupId,
        work_item_id: WorkItemId,
        offer_id: Annotated[str, Field(description="the offer; empty: the open offer naming you")] = "",
    ) -> CallToolResult:
        item = await desk.work_item(group_id, work_item_id)
        offer = offer_id or next((o.offer_id for o in item.offers if me in o.candidate_ids), "")
        if not offer:
            raise Refused("NO_OPEN_OFFER", f"{work_item_id} has no open offer to {me}")
        body = wp.WorkAcceptOffer(
            work_item_id=work_item_id, offer_id=offer, contract_revision=item.contract.revision
        )
        result = await desk.execute_once(group_id, "work_accept_offer", body)
        accepted = first(result, "work_offer_accepted")
        epoch = accepted.work_offer_accepted.ownership.ownership_epoch if accepted else 0
        return ok(
            f"accepted {offer}: you own {work_item_id} at ownership epoch {epoch}; next: start_work",
            {"offer_id": offer, "ownership_epoch": epoch, **written(result)},
        )

    @server.tool(
        description="Decline an offer made to you, with a structured reason (the Coordinator offers it to "
        f"someone else): one of {', '.join(DECLINE_REASONS)}; with 'other', give a namespaced code "
        "(e.g. com.example/maintenance). Declining is better than letting an offer expire."
    )
    async def decline_offer(
        group_id: GroupId,
        work_item_id: WorkItemId,
        reason: Annotated[str, Field(description=f"one of {', '.join(DECLINE_REASONS)}")],
        detail: Annotated[str, Field(description="a short factual detail")] = "",
        code: Annotated[str, Field(description="with reason 'other': a namespaced code")] = "",
        offer_id: Annotated[str, Field(description="the offer; empty: the open offer naming you")] = "",
    ) -> CallToolResult:
        if reason not in DECLINE_REASONS or (reason == "other") != bool(code):
            raise Refused(
                "INVALID_ARGUMENT",
                f"reason is one of {', '.join(DECLINE_REASONS)}; code goes with 'other' only",
                metadata={"field": "reason"},
            )
        item = await desk.work_item(group_id, work_item_id)
        offer = offer_id or next((o.offer_id for o in item.offers if me in o.candidate_ids), "")
        if not offer:
            raise Refused("NO_OPEN_OFFER", f"{work_item_id} has no open offer to {me}")
        decline = wp.StructuredDecline(
            reason=DECLINE_REASONS[reason],  # type: ignore[arg-type]
            extension_code=code,
            detail=detail,
        )
        body = wp.WorkDeclineOffer(work_item_id=work_item_id, offer_id=offer, decline=decline)
        result = await desk.execute_once(group_id, "work_decline_offer", body)
        return ok(
            f"declined offer {offer} of {work_item_id} ({reason})", {"offer_id": offer, **written(result)}
        )

    @server.tool(
        description="Start a WorkItem you own: the mesh grants an execution lease, which this server renews in "
        "the background while you work (you need not renew it). Every later tool on the WorkItem runs under "
        "that lease. To resume after a preemption or restart, pass the checkpoint id show_work_item lists."
    )
    async def start_work(
        group_id: GroupId,
        work_item_id: WorkItemId,
        resume_from_checkpoint_id: Annotated[str, Field(description="resume from this checkpoint")] = "",
    ) -> CallToolResult:
        item = await desk.work_item(group_id, work_item_id)
        if item.ownership.agent_id != me:
            raise Refused("NOT_HELD", f"{me} does not own {work_item_id}: accept an offer first")
        body = wp.WorkStart(
            work_item_id=work_item_id,
            ownership_epoch=item.ownership.ownership_epoch,
            lease_id=ids.new_id("lease"),
            resume_from_checkpoint_id=resume_from_checkpoint_id,
        )
        result = await desk.execute(group_id, "work_start", body)
        keeper.hold(group_id, work_item_id)
        started = first(result, "work_started")
        lease = started.work_started.lease if started else wp.ExecutionLease()
        return ok(
            f"started {work_item_id} under lease {lease.lease_id} (renewed by the server); next: show_work_item, read_input",
            {"lease_id": lease.lease_id, "expires_at": lease.expires_at.ToJsonString(), **written(result)},
        )

    @server.tool(
        description="Read one input of a WorkItem (a contract input or the output of a WorkItem it depends on), "
        "verified against its BLAKE3 content hash before it is returned: text inline, other bytes as base64 "
        f"(up to {INLINE_LIMIT} bytes; larger inputs are described, not returned). Refused INPUT_NOT_VERIFIED "
        "when the bytes do not match their hash: do not use them."
    )
    async def read_input(
        group_id: GroupId,
        work_item_id: WorkItemId,
        name: Annotated[
            str, Field(description="the input's name (show_work_item lists them) or its blake3:<hex>:<size>")
        ],
    ) -> CallToolResult:
        item = await desk.work_item(group_id, work_item_id)
        inputs = await inputs_of(desk, group_id, item)
        chosen = next((i for i in inputs if name in (i.name, digest_text(i.ref.digest))), None)
        if chosen is None:
            raise Refused(
                "UNKNOWN_INPUT",
                f"{work_item_id} has no input {name!r}",
                metadata={"inputs": ",".join(i.name for i in inputs)},
            )
        digest = chosen.ref.digest
        meta = {
            "name": chosen.name,
            "artifact": digest_text(digest),
            "media_type": chosen.ref.media_type,
            "verified": True,
        }
        if digest.size_bytes > INLINE_LIMIT:
            return ok(
                f"{chosen.name} is {digest.size_bytes} bytes: too large to return inline",
                {**meta, "inline": False},
            )
        data = await desk.call(desk.mesh.download(digest))
        if blob_digest(data) != digest:
            raise Refused(
                "INPUT_NOT_VERIFIED", f"the bytes received for {digest_text(digest)} do not hash to it"
            )
        try:
            return ok(data.decode(), {**meta, "inline": True, "text": data.decode()})
        except UnicodeDecodeError:
            encoded = base64.b64encode(data).decode()
            return ok(
                f"{chosen.name}: {len(data)} bytes (base64 in structured content)",
                {**meta, "inline": True, "base64": encoded},
            )

    @server.tool(
        description="Report progress on a WorkItem you hold (a structured report, no percentage): the phase you "
        "are in, milestones completed, what the next checkpoint will be, and usage since your last report."
    )
    async def report_progress(
        group_id: GroupId,
        work_item_id: WorkItemId,
        phase: Annotated[str, Field(description="what you are doing now, e.g. 'reconciling accounts'")],
        milestones: Annotated[
            list[str], Field(description="milestones completed since the last report")
        ] = [],  # noqa: B006
        next_checkpoint: Annotated[str, Field(description="what the next checkpoint will hold")] = "",
        minutes_left: Annotated[
            float | None, Field(description="your estimate of the minutes until you submit", ge=0)
        ] = None,
        confidence: Annotated[str, Field(description="of the estimate: low, medium or high")] = "medium",
        usage: UsageIn | None = None,
    ) -> CallToolResult:
        if confidence not in CONFIDENCES:
            raise Refused(
                "INVALID_ARGUMENT", f"unknown confidence {confidence!r}", metadata={"field": "confidence"}
            )
        state = await desk.state(group_id)
        item = await desk.work_item(group_id, work_item_id)
        lease = desk.held_lease(item)
        estimate = wp.RevisedEstimate(confidence=CONFIDENCES[confidence])  # type: ignore[arg-type]
        if minutes_left is not None:
            estimate.estimated_completion.CopyFrom(
                to_timestamp(datetime.now(UTC) + timedelta(minutes=minutes_left))
            )
        # The mesh requires a phase, the next checkpoint and a revised estimate (MW-11.4-01).
        report = wp.ProgressReport(
            phase=phase,
            completed_milestones=[
                wp.Milestone(milestone_id=ids.new_id("ms"), description=m) for m in milestones
            ],
            next_checkpoint=wp.PlannedCheckpoint(description=next_checkpoint),
            revised_estimate=estimate,
        )
        body = wp.WorkReportProgress(
            work_item_id=work_item_id,
            lease_id=lease.lease_id,
            ownership_epoch=lease.ownership_epoch,
            report=report,
            usage_delta=usage_vector(usage, state.mission.definition.budget.currency),
        )
        result = await desk.execute(group_id, "work_report_progress", body)
        return ok(f"progress reported on {work_item_id}: {phase}", written(result))

    @server.tool(
        description="Record a checkpoint of a WorkItem you hold and pause it: what is done, so the work resumes "
        "from here (after a preemption, a restart, or simply later). The state text, if any, is stored as an "
        "Artifact signed under your lease. The lease ends and the WorkItem is queued for you (you keep the "
        "ownership for the contract's checkpoint period): call start_work with resume_from_checkpoint_id to go "
        "on; show_work_item returns the checkpoint's phase and state. To report progress and keep working, "
        "use report_progress instead."
    )
    async def checkpoint(
        group_id: GroupId,
        work_item_id: WorkItemId,
        phase: Annotated[str, Field(description="what is done so far")],
        state: Annotated[str, Field(description="text needed to resume (notes, intermediate results)")] = "",
        completed_operation_ids: Annotated[
            list[str], Field(description="external operations already done, not to repeat")
        ] = [],  # noqa: B006
        usage: UsageIn | None = None,
    ) -> CallToolResult:
        group = await desk.state(group_id)
        item = await desk.work_item(group_id, work_item_id)
        lease = desk.held_lease(item)
        point = wp.Checkpoint(
            checkpoint_id=ids.new_id("ckpt"),
            progress=wp.ProgressReport(
                phase=phase, next_checkpoint=wp.PlannedCheckpoint(), revised_estimate=wp.RevisedEstimate()
            ),
            completed_operation_ids=completed_operation_ids,
        )
        if state:
            point.state.CopyFrom(await _store(group_id, item, lease, state.encode(), "text/plain"))
        body = wp.WorkCheckpoint(
            work_item_id=work_item_id,
            lease_id=lease.lease_id,
            ownership_epoch=lease.ownership_epoch,
            checkpoint=point,
            usage_delta=usage_vector(usage, group.mission.definition.budget.currency),
        )
        result = await desk.execute(group_id, "work_checkpoint", body)
        return ok(
            f"checkpoint {point.checkpoint_id} of {work_item_id} recorded",
            {"checkpoint_id": point.checkpoint_id, **written(result)},
        )

    @server.tool(
        description="Stop and ask: posts your question in the WorkItem's Conversation, then checkpoints and "
        "blocks the WorkItem on it (the lease ends; you keep the ownership while blocked). The Coordinator "
        "answers with answer_block. Wait for the answer with follow_work_item, read it with show_work_item "
        "(blockers) or read_messages, then start_work again when the WorkItem is queued for you."
    )
    async def block_with_question(
        group_id: GroupId,
        work_item_id: WorkItemId,
        question: Annotated[
            str, Field(description="the question the Coordinator must answer for you to go on")
        ],
        kind: Annotated[
            str, Field(description=f"what is missing: one of {', '.join(BLOCKER_KINDS)}")
        ] = "information",
    ) -> CallToolResult:
        if kind not in BLOCKER_KINDS:
            raise Refused("INVALID_ARGUMENT", f"unknown blocker kind {kind!r}", metadata={"field": "kind"})
        item = await desk.work_item(group_id, work_item_id)
        lease = desk.held_lease(item)
        posted = await desk.execute(
            group_id,
            "message_post",
            _message(item.conversation_id, question, topic="question"),
        )
        message = first(posted, "message_posted")
        message_id = message.message_posted.message_id if message else ""
        blocker = wp.Blocker(
            blocker_id=ids.new_id("blk"),
            kind=BLOCKER_KINDS[kind],  # type: ignore[arg-type]
            description=question,
            required_resolution=question,
            message_id=message_id,
        )
        body = wp.WorkBlock(
            work_item_id=work_item_id,
            lease_id=lease.lease_id,
            ownership_epoch=lease.ownership_epoch,
            checkpoint=wp.Checkpoint(checkpoint_id=ids.new_id("ckpt")),
            blockers=[blocker],
        )
        result = await desk.execute(group_id, "work_block", body)
        return ok(
            f"{work_item_id} is blocked on your question (blocker {blocker.blocker_id}); next: follow_work_item",
            {"blocker_id": blocker.blocker_id, "message_id": message_id, **written(result)},
        )

    async def _store(
        group_id: str, item: wp.WorkItem, lease: wp.ExecutionLease, content: bytes | Path, media_type: str
    ) -> Any:
        state = await desk.state(group_id)
        origin = Origin(
            group_id,
            state.mission.mission_id,
            item.work_item_id,
            lease.lease_id,
            lease.ownership_epoch,
            await desk.call(card_version(desk.mesh, me)),
            sources=[i.ref.digest for i in await inputs_of(desk, group_id, item)],
        )
        return await desk.call(
            put_artifact(
                desk.mesh.artifacts,
                desk.signer,
                content,
                media_type=media_type,
                origin=origin,
                spool_dir=desk.state_dir,
            ),
            limit_s=None,
        )

    @server.tool(
        description="Store an output Artifact of a WorkItem you hold: the content is hashed (BLAKE3), described "
        "by a manifest signed under your lease (Mission, WorkItem, producer, its inputs as sources) and uploaded; "
        "storing the same content again uploads nothing. Give exactly one of text, base64 or path (a file on the "
        "server's machine under a directory allowed with --files; large files run as an MCP task). Returns the "
        "reference (blake3:<hex>:<size>) to cite in submit_work's Evidence. deliverable=false for Evidence only "
        "(a test log): it is then not handed in as a result."
    )
    async def store_output(
        group_id: GroupId,
        work_item_id: WorkItemId,
        media_type: Annotated[str, Field(description="e.g. text/markdown, application/json")] = "text/plain",
        text: Annotated[str, Field(description="the content, as text")] = "",
        base64: Annotated[str, Field(description="the content, base64-encoded bytes")] = "",
        path: Annotated[str, Field(description="a file to store (under a --files directory)")] = "",
        deliverable: Annotated[
            bool, Field(description="a result to hand in (true) or Evidence only (false)")
        ] = True,
    ) -> CallToolResult:
        content = content_of(text, base64, path, files)
        item = await desk.work_item(group_id, work_item_id)
        lease = desk.held_lease(item)
        ref = await _store(group_id, item, lease, content, media_type)
        if deliverable:
            outputs.add(OutputLog.key(group_id, work_item_id, lease.lease_id), ref)
        reference = digest_text(ref.digest)
        return ok(
            f"stored {reference} ({media_type}) for {work_item_id}",
            {"artifact": reference, "media_type": media_type, "deliverable": deliverable},
        )

    @server.tool(
        description="Hand in a WorkItem you hold for review: its result Artifacts and Evidence for every required "
        "acceptance criterion (one entry per criterion: what you checked, citing the Artifacts that show it). "
        "Artifacts default to the deliverables you stored with store_output under this lease. The lease ends; "
        "follow_work_item tells you when the Coordinator has reviewed it."
    )
    async def submit_work(
        group_id: GroupId,
        work_item_id: WorkItemId,
        evidence: Annotated[
            list[EvidenceIn], Field(description="Evidence, one entry per acceptance criterion")
        ],
        summary: Annotated[str, Field(description="a short factual summary for the reviewer")] = "",
        artifacts: Annotated[
            list[str] | None,
            Field(description="the result Artifacts (default: those stored under this lease)"),
        ] = None,
        usage: UsageIn | None = None,
    ) -> CallToolResult:
        state = await desk.state(group_id)
        item = await desk.work_item(group_id, work_item_id)
        lease = desk.held_lease(item)
        records = evidence_records(item, evidence, wp.EVIDENCE_RESULT_PASS)
        covered = {e.criterion_id for e in records}
        missing = [
            c.criterion_id
            for c in item.contract.acceptance_criteria
            if c.required and c.criterion_id not in covered
        ]
        if missing:
            raise Refused(
                "MISSING_EVIDENCE",
                f"no Evidence for {', '.join(missing)}",
                metadata={"criteria": ",".join(missing)},
            )
        names = (
            artifacts
            if artifacts is not None
            else outputs.of(OutputLog.key(group_id, work_item_id, lease.lease_id))
        )
        body = wp.WorkSubmit(
            work_item_id=work_item_id,
            lease_id=lease.lease_id,
            ownership_epoch=lease.ownership_epoch,
            contract_revision=item.contract.revision,
            artifacts=[ref_of(a, "artifacts") for a in names],
            evidence=records,
            summary=summary,
            usage_delta=usage_vector(usage, state.mission.definition.budget.currency),
        )
        result = await desk.execute(group_id, "work_submit", body)
        submitted = first(result, "work_submitted")
        submission = submitted.event_id if submitted else ""
        return ok(
            f"submitted {work_item_id} for review ({len(names)} Artifact(s)): submission {submission}",
            {"submission_event_id": submission, "artifacts": names, **written(result)},
        )

    @server.tool(
        description="Report that you cannot do a WorkItem you hold, with the reason as Evidence. kind=transient: "
        "it may succeed later (it is queued again after the contract's backoff while attempts remain); "
        "permanent: it cannot be done as contracted. Prefer block_with_question when an answer would let you go on."
    )
    async def fail_work(
        group_id: GroupId,
        work_item_id: WorkItemId,
        reason: Annotated[str, Field(description="a short factual reason")],
        kind: Annotated[str, Field(description="transient or permanent")] = "permanent",
    ) -> CallToolResult:
        if kind not in FAILURE_KINDS:
            raise Refused(
                "INVALID_ARGUMENT",
                f"kind is transient or permanent, not {kind!r}",
                metadata={"field": "kind"},
            )
        item = await desk.work_item(group_id, work_item_id)
        lease = desk.held_lease(item)
        body = wp.WorkFail(
            work_item_id=work_item_id,
            lease_id=lease.lease_id,
            ownership_epoch=lease.ownership_epoch,
            kind=FAILURE_KINDS[kind],  # type: ignore[arg-type]
            reason=reason,
            evidence=[
                wp.Evidence(
                    method=wp.EVIDENCE_METHOD_FAILURE_OBSERVATION,
                    result=wp.EVIDENCE_RESULT_FAIL,
                    summary=reason,
                )
            ],
        )
        result = await desk.execute(group_id, "work_fail", body)
        return ok(f"{work_item_id} reported failed ({kind})", written(result))


def _message(conversation_id: str, text: str, *, topic: str = "", reply_to: str = "") -> Any:
    from missionweave.sdk.stream_commands import post_message

    return post_message(conversation_id, text, topic=topic, reply_to_message_id=reply_to).body
