"""The Worker's tools for finding and watching work: list_work (call it first), show_work_item,
wait_for_offer and follow_work_item (MCP tasks when the client supports them). Reads only, each
proven as the identity and shown as the mesh lets that identity see it."""

import time
from datetime import UTC, datetime
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from missionweave.sdk.client import blob_digest
from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.mcp_server.content import INLINE_LIMIT, OutputLog, digest_text, inputs_of, ok
from missionweave_bridges.mcp_server.desk import Desk, poll_until, state_name, to_dict

GroupId = Annotated[
    str, Field(description="the Group (one per Mission) the WorkItem belongs to, e.g. grp_...")
]
WorkItemId = Annotated[str, Field(description="the WorkItem's id, as list_work shows it")]
OWNED = (
    wp.WORK_ITEM_STATE_QUEUED,
    wp.WORK_ITEM_STATE_ACTIVE,
    wp.WORK_ITEM_STATE_BLOCKED,
    wp.WORK_ITEM_STATE_SUBMITTED,
)
MAX_WAIT_S = 3600.0


def item_summary(group_id: str, item: wp.WorkItem, me: str) -> dict[str, Any]:
    now = datetime.now(UTC)
    offers = [
        o
        for o in item.offers
        if me in o.candidate_ids
        and me not in o.declined_by
        and (not o.HasField("expires_at") or o.expires_at.ToDatetime(tzinfo=UTC) > now)
    ]
    return {
        "group_id": group_id,
        "work_item_id": item.work_item_id,
        "title": item.title,
        "state": state_name(item.state),
        "goal": item.contract.goal,
        "deadline": item.contract.deadline.ToJsonString() if item.contract.HasField("deadline") else None,
        "offer_ids": [o.offer_id for o in offers],
        "owner_id": item.ownership.agent_id,
        "ownership_epoch": item.ownership.ownership_epoch,
    }


def register(server: MCPServer, desk: Desk, outputs: OutputLog) -> None:
    me = desk.me

    async def offers_and_queue(group_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        offered, queue = [], []
        for group in await desk.groups(group_id):
            for item in await desk.call(desk.mesh.work_items(group)):
                summary = item_summary(group, item, me)
                if item.state == wp.WORK_ITEM_STATE_OFFERED and summary["offer_ids"]:
                    offered.append(summary)
                elif item.state in OWNED and item.ownership.agent_id == me:
                    queue.append(summary)
        return offered, queue

    async def checkpoint_of(group_id: str, item: wp.WorkItem) -> dict[str, Any] | None:
        """The latest checkpoint as recorded (the read model keeps only its id): its phase, completed
        operations and state, the state's text inline when it is small text (verified by hash)."""
        checkpoint_id = item.latest_checkpoint.checkpoint_id
        if not checkpoint_id:
            return None
        recorded = None
        for event in await desk.events(group_id):
            kind = event.WhichOneof("payload")
            if kind in ("work_checkpointed", "work_blocked"):
                point = getattr(event, kind).checkpoint
                if point.checkpoint_id == checkpoint_id:
                    recorded = point
        if recorded is None:
            return {"checkpoint_id": checkpoint_id}
        out: dict[str, Any] = {
            "checkpoint_id": checkpoint_id,
            "phase": recorded.progress.phase,
            "completed_operation_ids": list(recorded.completed_operation_ids),
        }
        if recorded.HasField("state"):
            digest = recorded.state.digest
            out["state_artifact"] = digest_text(digest)
            if digest.size_bytes <= INLINE_LIMIT:
                data = await desk.call(desk.mesh.download(digest))
                if blob_digest(data) == digest:
                    try:
                        out["state_text"] = data.decode()
                    except UnicodeDecodeError:
                        pass
        return out

    @server.tool(
        description="Call this first. Lists the offers made to you (WorkItems you may accept) and your own "
        "queue (WorkItems you own: queued, active, blocked or submitted), in one Group or in every Group you "
        "are a member of. Next: accept_offer for an offer, start_work for a queued item you own."
    )
    async def list_work(
        group_id: Annotated[str, Field(description="one Group only; empty: every Group you belong to")] = "",
    ) -> CallToolResult:
        offered, queue = await offers_and_queue(group_id)
        text = f"{len(offered)} offer(s) to {me}, {len(queue)} WorkItem(s) in {me}'s queue"
        return ok(text, {"agent_id": me, "offers": offered, "queue": queue})

    @server.tool(
        description="Everything about one WorkItem: state, the work contract (goal, deliverables, acceptance "
        "criteria with their ids and required Evidence methods, budget, deadline), its inputs (names to pass "
        "to read_input), your lease if you hold one, blockers and their answers, the latest checkpoint and "
        "submission, and its Conversation id. Call it before working and whenever a tool is refused."
    )
    async def show_work_item(group_id: GroupId, work_item_id: WorkItemId) -> CallToolResult:
        item = await desk.work_item(group_id, work_item_id)
        inputs = await inputs_of(desk, group_id, item)
        held = (
            item.HasField("lease")
            and item.lease.agent_id == me
            and item.lease.session_epoch == desk.signer.session_epoch
            and item.state == wp.WORK_ITEM_STATE_ACTIVE
        )
        data = {
            **item_summary(group_id, item, me),
            "contract_revision": item.contract.revision,
            "contract": to_dict(item.contract),
            "inputs": [
                {
                    "name": i.name,
                    "artifact": digest_text(i.ref.digest),
                    "from_work_item_id": i.from_work_item_id,
                }
                for i in inputs
            ],
            "lease": to_dict(item.lease) if item.HasField("lease") else None,
            "you_hold_the_lease": held,
            "blockers": [to_dict(b) for b in item.blockers],
            "latest_checkpoint": await checkpoint_of(group_id, item),
            "submission_event_id": item.submission_event_id,
            "artifacts": [digest_text(a.digest) for a in item.artifacts],
            "conversation_id": item.conversation_id,
            "stored_outputs": outputs.of(OutputLog.key(group_id, work_item_id, item.lease.lease_id))
            if held
            else [],
        }
        text = f"{work_item_id} is {data['state']}: {item.title} ({len(inputs)} input(s)); lease held by you: {held}"
        return ok(text, data)

    @server.tool(
        description="Wait until an offer names you (an MCP task when your client supports tasks: poll it or list "
        "it again after a reconnect). Returns the offers as list_work does, or none when the time is up."
    )
    async def wait_for_offer(
        group_id: Annotated[str, Field(description="one Group only; empty: every Group you belong to")] = "",
        timeout_seconds: Annotated[
            float, Field(description="how long to wait, at most 3600", gt=0, le=MAX_WAIT_S)
        ] = 300,
    ) -> CallToolResult:
        async def found() -> list[dict[str, Any]] | None:
            offered, _ = await offers_and_queue(group_id)
            return offered or None

        offered = await poll_until(found, timeout_seconds) or []
        return ok(f"{len(offered)} offer(s) to {me}", {"offers": offered, "timed_out": not offered})

    @server.tool(
        description="Wait until a WorkItem changes state (e.g. your blocked WorkItem is answered and queued again, "
        "your submission is reviewed, an offer is accepted): an MCP task when your client supports tasks. "
        "Returns the new state, or the same one when the time is up."
    )
    async def follow_work_item(
        group_id: GroupId,
        work_item_id: WorkItemId,
        from_state: Annotated[str, Field(description="the state you saw (default: its state now)")] = "",
        timeout_seconds: Annotated[
            float, Field(description="how long to wait, at most 3600", gt=0, le=MAX_WAIT_S)
        ] = 300,
    ) -> CallToolResult:
        start = from_state or state_name((await desk.work_item(group_id, work_item_id)).state)
        began = time.monotonic()

        async def changed() -> wp.WorkItem | None:
            item = await desk.work_item(group_id, work_item_id)
            return item if state_name(item.state) != start else None

        item = await poll_until(changed, timeout_seconds)
        now = state_name(item.state) if item else start
        data = {
            "work_item_id": work_item_id,
            "from_state": start,
            "state": now,
            "changed": item is not None,
            "waited_seconds": round(time.monotonic() - began, 1),
            "blockers": [to_dict(b) for b in item.blockers] if item else [],
        }
        return ok(f"{work_item_id}: {start} -> {now}" if item else f"{work_item_id} is still {start}", data)
