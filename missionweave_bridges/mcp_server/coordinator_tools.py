"""The Coordinator's tools: plan (authorize WorkItems with complete contracts), offer, review a
submission (accept, or request changes and offer it again), and answer a blocked WorkItem's
question. Each cites the Coordinator epoch in force, read from the Group at the call: a replaced
Coordinator is refused (COORDINATOR_EPOCH_STALE), as any client would be."""

from datetime import timedelta
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult
from pydantic import BaseModel, Field

from missionweave.cli.conversation import fold_messages
from missionweave.cli.errors import CliError
from missionweave.cli.work.offer import selection
from missionweave.kernel import ids
from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.sdk.contracts import ContractError, Criterion, work_contract
from missionweave.sdk.stream_commands import post_message
from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.mcp_server.content import EvidenceIn, evidence_records, ok
from missionweave_bridges.mcp_server.desk import Desk, first, written
from missionweave_bridges.mcp_server.refusals import Refused

GroupId = Annotated[str, Field(description="the Mission's Group, e.g. grp_...")]
WorkItemId = Annotated[str, Field(description="the WorkItem's id")]


def selected(
    state: Any, contract: wp.WorkContract, candidates: list[str], field: str
) -> list[wp.SelectionCriteria]:
    """The selection criteria each candidate's offer records; a candidate without an active
    Membership is refused here, before anything is sent."""
    try:
        return selection(state, contract, candidates, field)
    except CliError as err:
        raise Refused("INVALID_ARGUMENT", str(err), metadata={"field": field}) from None


async def question_of(desk: Desk, group_id: str, item: wp.WorkItem) -> str:
    """The Message that asked the blocker's question: the WorkItem read model keeps only each
    blocker's required resolution, so the owner's latest Message of its Conversation saying it."""
    asked = {b.required_resolution for b in item.blockers}
    chains, _ = fold_messages(await desk.events(group_id))
    found = [
        c.message.message_id
        for c in chains.values()
        if c.message.conversation_id == item.conversation_id
        and c.posted.actor_id == item.ownership.agent_id
        and c.message.content.text in asked
    ]
    return found[-1] if found else ""


class CriterionIn(BaseModel):
    criterion_id: str = Field(description="a short id, e.g. 'balances'")
    description: str = Field(description="what must hold, checkable")
    evidence_methods: list[str] = Field(
        default=["review"], description="how it is shown: test, review, schema, ..."
    )


class PlannedItem(BaseModel):
    """One WorkItem of a plan: a complete work contract, built from what differs between WorkItems."""

    title: str = Field(description="a short title")
    goal: str = Field(description="what the Worker must achieve")
    deliverables: dict[str, str] = Field(description="deliverable id -> what it is")
    criteria: list[CriterionIn] = Field(description="the acceptance criteria, each checkable")
    work_item_id: str = Field(default="", description="its id (default: a new one)")
    depends_on: list[str] = Field(
        default=[], description="WorkItems whose outputs it needs (authorize them first)"
    )
    tokens: int = Field(default=10_000, description="token budget")
    tool_calls: int = Field(default=100, description="tool-call budget")
    deadline_hours: float = Field(default=24, description="deadline, hours from now")
    capabilities: list[str] = Field(default=[], description="required capabilities, ID=VERSION")


def register(server: MCPServer, desk: Desk) -> None:
    async def coordinator_epoch(group_id: str) -> int:
        return int((await desk.state(group_id)).mission.coordinator.coordinator_epoch)

    @server.tool(
        description="Plan (Coordinator): authorize WorkItems, each with a complete work contract (goal, "
        "deliverables, checkable acceptance criteria, budget, deadline, dependencies), in the order given: "
        "list a WorkItem after those it depends on. Each is open afterwards; next: offer_work. Stops at the "
        "first refusal (the ones before it are authorized: their ids are in the result)."
    )
    async def plan_work(
        group_id: GroupId, items: Annotated[list[PlannedItem], Field(description="the WorkItems")]
    ) -> CallToolResult:
        state = await desk.state(group_id)
        currency = state.mission.definition.budget.currency
        authorized: list[str] = []
        for n, planned in enumerate(items):
            try:
                contract = work_contract(
                    planned.goal,
                    deliverables=planned.deliverables,
                    criteria=[
                        Criterion(c.criterion_id, c.description, tuple(c.evidence_methods))
                        for c in planned.criteria
                    ],
                    budget={"tokens": planned.tokens, "tool_calls": planned.tool_calls, "currency": currency},
                    depends_on=planned.depends_on,
                    capabilities=planned.capabilities,
                    deadline=timedelta(hours=planned.deadline_hours),
                    currency=currency,
                )
            except ContractError as err:
                raise Refused(
                    "INVALID_ARGUMENT",
                    f"items[{n}]: {err}",
                    metadata={"field": f"items[{n}].{err.field}", "authorized": ",".join(authorized)},
                ) from None
            work_item_id = planned.work_item_id or ids.new_id("wi")
            body = wp.WorkAuthorize(
                work_item_id=work_item_id,
                title=planned.title,
                contract=contract,
                coordinator_epoch=state.mission.coordinator.coordinator_epoch,
            )
            await desk.execute(group_id, "work_authorize", body)
            authorized.append(work_item_id)
        return ok(
            f"authorized {len(authorized)} WorkItem(s): {', '.join(authorized)}; next: offer_work",
            {"work_item_ids": authorized},
        )

    @server.tool(
        description="Offer a WorkItem (Coordinator) to named candidates (active members whose role may accept; "
        "several: the first to accept wins). The offer records structured selection criteria per candidate. "
        "Next: follow_work_item until it is queued (accepted) or wait and offer again after it expires."
    )
    async def offer_work(
        group_id: GroupId,
        work_item_id: WorkItemId,
        candidates: Annotated[list[str], Field(description="agent ids, at most 8")],
        expires_in_seconds: Annotated[int, Field(description="how long the offer stands", gt=0)] = 3600,
    ) -> CallToolResult:
        state = await desk.state(group_id)
        item = await desk.work_item(group_id, work_item_id)
        criteria = selected(state, item.contract, candidates, "candidates")
        body = wp.WorkOffer(
            work_item_id=work_item_id,
            candidate_ids=candidates,
            selection_criteria=criteria,
            coordinator_epoch=state.mission.coordinator.coordinator_epoch,
            expires_at=to_timestamp(SystemClock().now() + timedelta(seconds=expires_in_seconds)),
        )
        result = await desk.execute(group_id, "work_offer", body)
        offered = first(result, "work_offered")
        offer_id = offered.work_offered.offer_id if offered else ""
        return ok(
            f"offered {work_item_id} to {', '.join(candidates)}: offer {offer_id}",
            {"offer_id": offer_id, **written(result)},
        )

    @server.tool(
        description="Review a submitted WorkItem (Coordinator). decision=accept: records your passing review "
        "Evidence per criterion and accepts the result (verified). decision=request_changes: records failing "
        "Evidence (what is not met), rejects the submission and offers the work again to its owner (or to "
        "reoffer_to). Read the submission first with show_work_item and read_input/read_messages."
    )
    async def review_submission(
        group_id: GroupId,
        work_item_id: WorkItemId,
        decision: Annotated[str, Field(description="accept or request_changes")],
        findings: Annotated[
            list[EvidenceIn], Field(description="one entry per criterion checked: what you found")
        ],
        comment: Annotated[str, Field(description="a comment for the Worker")] = "",
        reoffer_to: Annotated[
            list[str], Field(description="request_changes: offer to these (default: the owner)")
        ] = [],  # noqa: B006
    ) -> CallToolResult:
        if decision not in ("accept", "request_changes"):
            raise Refused(
                "INVALID_ARGUMENT", "decision is accept or request_changes", metadata={"field": "decision"}
            )
        state = await desk.state(group_id)
        item = await desk.work_item(group_id, work_item_id)
        submission = item.submission_event_id
        epoch = state.mission.coordinator.coordinator_epoch
        if decision == "accept":
            records = evidence_records(item, findings, wp.EVIDENCE_RESULT_PASS, submission)
            recorded: list[str] = []
            for e in records:
                result = await desk.execute_once(
                    group_id,
                    "work_record_evidence",
                    wp.WorkRecordEvidence(work_item_id=work_item_id, evidence=e, coordinator_epoch=epoch),
                )
                event = first(result, "evidence_recorded")
                if event is not None:
                    recorded.append(event.evidence_recorded.evidence.evidence_id)
            body = wp.WorkAcceptResult(
                work_item_id=work_item_id,
                submission_event_id=submission,
                review_evidence_ids=recorded,
                comment=comment,
                coordinator_epoch=epoch,
            )
            result = await desk.execute_once(group_id, "work_accept_result", body)
            return ok(
                f"accepted submission {submission}: {work_item_id} is verified",
                {"review_evidence_ids": recorded, **written(result)},
            )
        records = evidence_records(item, findings, wp.EVIDENCE_RESULT_FAIL, submission)
        to = reoffer_to or [item.ownership.agent_id]
        criteria = selected(state, item.contract, to, "reoffer_to")
        failed = await desk.execute(
            group_id,
            "work_fail",
            wp.WorkFail(
                work_item_id=work_item_id,
                coordinator_epoch=epoch,
                kind=wp.WORK_FAILURE_KIND_REVIEW_REJECTED,
                evidence=records,
                reason=comment or f"changes requested: {', '.join(e.criterion_id for e in records)}",
            ),
        )
        offer = wp.WorkOffer(
            work_item_id=work_item_id,
            candidate_ids=to,
            selection_criteria=criteria,
            coordinator_epoch=epoch,
            expires_at=to_timestamp(SystemClock().now() + timedelta(hours=1)),
        )
        offered = await desk.execute(group_id, "work_offer", offer)
        event = first(offered, "work_offered")
        offer_id = event.work_offered.offer_id if event else ""
        return ok(
            f"changes requested on {work_item_id}; offered again to {', '.join(to)} (offer {offer_id})",
            {"offer_id": offer_id, "rejection": written(failed), **written(offered)},
        )

    @server.tool(
        description="Answer a blocked WorkItem's question (Coordinator): posts the answer in its Conversation, as "
        "a reply to the question, and resolves its blockers with it; the WorkItem is queued again for its "
        "owner (or open again if the ownership lapsed)."
    )
    async def answer_block(
        group_id: GroupId,
        work_item_id: WorkItemId,
        answer: Annotated[str, Field(description="the answer, as the Worker should read it")],
    ) -> CallToolResult:
        state = await desk.state(group_id)
        item = await desk.work_item(group_id, work_item_id)
        if item.state != wp.WORK_ITEM_STATE_BLOCKED or not item.blockers:
            raise Refused("NOT_BLOCKED", f"{work_item_id} is not blocked")
        question = await question_of(desk, group_id, item)
        reply = post_message(item.conversation_id, answer, reply_to_message_id=question, topic="answer").body
        posted = await desk.execute_once(group_id, "message_post", reply)
        body = wp.WorkUnblock(
            work_item_id=work_item_id,
            resolution=answer,
            resolved_blocker_ids=[b.blocker_id for b in item.blockers if b.blocker_id],
            coordinator_epoch=state.mission.coordinator.coordinator_epoch,
        )
        result = await desk.execute_once(group_id, "work_unblock", body)
        event = first(result, "work_unblocked")
        now = (
            wp.WorkItemState.Name(event.work_unblocked.next_state).removeprefix("WORK_ITEM_STATE_").lower()
            if event
            else "?"
        )
        message = first(posted, "message_posted")
        data: dict[str, Any] = {
            "state": now,
            "message_id": message.message_posted.message_id if message else "",
            **written(result),
        }
        return ok(f"answered {work_item_id}: it is {now}", data)
