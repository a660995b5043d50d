"""Conversations and Context Packages, for Workers and Coordinators alike: post a Message, read the
Messages of a Conversation (conversation only, never an assignment: MW-9-10..12), and fetch a
Context Package the Authority signed, verified before it is returned."""

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from missionweave.cli.conversation import fold_messages
from missionweave.kernel.signing import verify_signature
from missionweave.sdk.stream_commands import post_message
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import authority_service_pb2
from missionweave_bridges.mcp_server.content import ok
from missionweave_bridges.mcp_server.desk import Desk, first, to_dict, written
from missionweave_bridges.mcp_server.refusals import Refused

GroupId = Annotated[str, Field(description="the Group (one per Mission), e.g. grp_...")]
PURPOSES = {
    "worker-onboarding": apb.CONTEXT_PACKAGE_PURPOSE_WORKER_ONBOARDING,
    "coordinator-handover": apb.CONTEXT_PACKAGE_PURPOSE_COORDINATOR_HANDOVER,
    "subtask": apb.CONTEXT_PACKAGE_PURPOSE_SUBTASK,
}
MAX_MESSAGES = 200


async def conversation_of(desk: Desk, group_id: str, work_item_id: str, conversation_id: str) -> str:
    """The Conversation named, else the WorkItem's own, else the Mission's planning Conversation."""
    if conversation_id:
        return conversation_id
    if work_item_id:
        return (await desk.work_item(group_id, work_item_id)).conversation_id
    return (await desk.state(group_id)).mission.planning_conversation_id


def register(server: MCPServer, desk: Desk) -> None:
    @server.tool(
        name="post_message",
        description="Post a Message in a Conversation: a WorkItem's own (work_item_id), another one "
        "(conversation_id), or by default the Mission's planning Conversation. Messages are conversation, "
        "never assignments: to ask something that blocks your work use block_with_question.",
    )
    async def post_message_tool(
        group_id: GroupId,
        text: Annotated[str, Field(description="the Message (at most 16 KiB)")],
        work_item_id: Annotated[str, Field(description="post in this WorkItem's Conversation")] = "",
        conversation_id: Annotated[str, Field(description="post in this Conversation")] = "",
        reply_to_message_id: Annotated[str, Field(description="the Message answered")] = "",
    ) -> CallToolResult:
        conversation = await conversation_of(desk, group_id, work_item_id, conversation_id)
        body = post_message(conversation, text, reply_to_message_id=reply_to_message_id).body
        result = await desk.execute(group_id, "message_post", body)
        posted = first(result, "message_posted")
        message_id = posted.message_posted.message_id if posted else ""
        return ok(
            f"posted {message_id} in {conversation}",
            {"message_id": message_id, "conversation_id": conversation, **written(result)},
        )

    @server.tool(
        description="Read the Messages of a Conversation (a WorkItem's own with work_item_id, another with "
        "conversation_id, else the planning Conversation), oldest first, each with its author, sequence and "
        "effective text (corrections applied, retracted or redacted content withheld). after_sequence reads only newer ones."
    )
    async def read_messages(
        group_id: GroupId,
        work_item_id: Annotated[str, Field(description="this WorkItem's Conversation")] = "",
        conversation_id: Annotated[str, Field(description="this Conversation")] = "",
        after_sequence: Annotated[int, Field(description="only Messages after this sequence", ge=0)] = 0,
    ) -> CallToolResult:
        conversation = await conversation_of(desk, group_id, work_item_id, conversation_id)
        chains, _ = fold_messages(await desk.events(group_id))
        messages: list[dict[str, Any]] = []
        for chain in chains.values():
            if chain.message.conversation_id != conversation or chain.posted.sequence <= after_sequence:
                continue
            status, content, _ = chain.effective()
            messages.append(
                {
                    "message_id": chain.message.message_id,
                    "author_id": chain.posted.actor_id,
                    "sequence": chain.posted.sequence,
                    "reply_to_message_id": chain.message.reply_to_message_id,
                    "topic": chain.message.topic,
                    "status": status,
                    "text": content.text if content is not None else None,
                }
            )
        messages = messages[-MAX_MESSAGES:]
        lines = [f"{m['author_id']} (#{m['sequence']}): {m['text']}" for m in messages]
        return ok(
            "\n".join([f"{len(messages)} Message(s) in {conversation}", *lines]),
            {"conversation_id": conversation, "messages": messages},
        )

    @server.tool(
        description="Fetch the Context Package the Authority signs for you about some WorkItems: the decisions, "
        "constraints, open questions, Artifacts and event ranges you need to work on them (e.g. as a late "
        "joiner). Its signature is verified against the Authority key before it is returned."
    )
    async def get_context_package(
        group_id: GroupId,
        work_item_ids: Annotated[list[str], Field(description="the WorkItems it covers")],
        purpose: Annotated[str, Field(description=f"one of {', '.join(PURPOSES)}")] = "worker-onboarding",
    ) -> CallToolResult:
        if purpose not in PURPOSES:
            raise Refused("INVALID_ARGUMENT", f"unknown purpose {purpose!r}", metadata={"field": "purpose"})
        request = authority_service_pb2.GetContextPackageRequest(
            group_id=group_id,
            work_item_ids=work_item_ids,
            purpose=PURPOSES[purpose],
            recipient_ids=[desk.me],  # type: ignore[arg-type]
        )
        response = await desk.call(desk.mesh.authority.GetContextPackage(request))
        envelope = response.package
        key_id, public_key = await desk.call(desk.mesh.authority_key())
        index = next((i for i, s in enumerate(envelope.signatures) if s.key_id == key_id), None)
        if index is None or not verify_signature(envelope, public_key, index):
            raise Refused("NOT_VERIFIED", "the Context Package does not verify against the Authority key")
        package = apb.ContextPackage.FromString(envelope.payload)
        data = {"verified": True, "authority_key_id": key_id, "package": to_dict(package)}
        text = (
            f"Context Package {package.context_package_id} v{package.version}: {len(package.decisions)} decision(s), "
            f"{len(package.constraints)} constraint(s), {len(package.open_questions)} open question(s), "
            f"{len(package.artifacts)} Artifact(s)"
        )
        return ok(text, data)
