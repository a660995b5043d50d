"""Conversations and Context Packages: post a Message, read the Messages of a Conversation
(conversation only, never an assignment: MW-9-10..12); a Coordinator has the Authority sign a
Context Package and hands it to a Worker in the WorkItem's Conversation, the Worker reads it,
verified by content hash and by the Authority's signature."""

from typing import Annotated, Any

from google.protobuf.message import DecodeError
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from missionweave.cli.conversation import fold_messages
from missionweave.kernel.signing import verify_signature
from missionweave.sdk.artifacts import Origin, card_version, put_artifact
from missionweave.sdk.client import blob_digest
from missionweave.sdk.stream_commands import post_message
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import authority_service_pb2, common_pb2, conversation_pb2
from missionweave_bridges.mcp_server.content import digest_text, ok, ref_of
from missionweave_bridges.mcp_server.desk import Desk, first, to_dict, written
from missionweave_bridges.mcp_server.refusals import Refused

GroupId = Annotated[str, Field(description="the Group (one per Mission), e.g. grp_...")]
PURPOSES = {
    "worker-onboarding": apb.CONTEXT_PACKAGE_PURPOSE_WORKER_ONBOARDING,
    "coordinator-handover": apb.CONTEXT_PACKAGE_PURPOSE_COORDINATOR_HANDOVER,
    "subtask": apb.CONTEXT_PACKAGE_PURPOSE_SUBTASK,
}
MAX_MESSAGES = 200
CONTEXT_PACKAGE_MEDIA_TYPE = "application/vnd.missionweave.v1.context-package+protobuf"


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
                    "artifacts": [digest_text(a.digest) for a in content.artifacts]
                    if content is not None
                    else [],
                }
            )
        messages = messages[-MAX_MESSAGES:]
        lines = [f"{m['author_id']} (#{m['sequence']}): {m['text']}" for m in messages]
        return ok(
            "\n".join([f"{len(messages)} Message(s) in {conversation}", *lines]),
            {"conversation_id": conversation, "messages": messages},
        )

    async def opened(envelope_bytes: bytes) -> dict[str, Any]:
        """A Context Package envelope, verified against the Authority key before it is parsed."""
        envelope = common_pb2.SignedEnvelope.FromString(envelope_bytes)
        key_id, public_key = await desk.call(desk.mesh.authority_key())
        index = next((i for i, sig in enumerate(envelope.signatures) if sig.key_id == key_id), None)
        if index is None or not verify_signature(envelope, public_key, index):
            raise Refused("NOT_VERIFIED", "the Context Package does not verify against the Authority key")
        package = apb.ContextPackage.FromString(envelope.payload)
        return {"verified": True, "authority_key_id": key_id, "package": to_dict(package)}

    def described(data: dict[str, Any]) -> str:
        p = data["package"]
        return (
            f"Context Package {p.get('context_package_id', '')} v{p.get('version', 0)} (verified): "
            f"{len(p.get('decisions', []))} decision(s), {len(p.get('constraints', []))} constraint(s), "
            f"{len(p.get('open_questions', []))} open question(s), {len(p.get('artifacts', []))} Artifact(s)"
        )

    @server.tool(
        description="Coordinator: have the Authority sign a Context Package about some WorkItems (decisions, "
        "constraints, open questions, Artifacts and the event ranges they come from) for its recipients, e.g. a "
        "Worker joining late. With share_in_work_item, the package is stored as an Artifact and a Message in "
        "that WorkItem's Conversation hands it to the Worker, who reads it with read_context_package."
    )
    async def make_context_package(
        group_id: GroupId,
        work_item_ids: Annotated[
            list[str], Field(description="the WorkItems it covers (empty: the whole Mission)")
        ],
        recipient_ids: Annotated[list[str], Field(description="who it is for: active members or candidates")],
        purpose: Annotated[str, Field(description=f"one of {', '.join(PURPOSES)}")] = "worker-onboarding",
        share_in_work_item: Annotated[
            str, Field(description="hand it over in this WorkItem's Conversation")
        ] = "",
    ) -> CallToolResult:
        if purpose not in PURPOSES:
            raise Refused("INVALID_ARGUMENT", f"unknown purpose {purpose!r}", metadata={"field": "purpose"})
        request = authority_service_pb2.GetContextPackageRequest(
            group_id=group_id,
            work_item_ids=work_item_ids,
            purpose=PURPOSES[purpose],  # type: ignore[arg-type]
            recipient_ids=recipient_ids,
        )
        envelope = (await desk.call(desk.mesh.authority.GetContextPackage(request))).package
        data = await opened(envelope.SerializeToString())
        if share_in_work_item:
            item = await desk.work_item(group_id, share_in_work_item)
            state = await desk.state(group_id)
            origin = Origin(
                group_id,
                state.mission.mission_id,
                share_in_work_item,
                agent_card_version=await desk.call(card_version(desk.mesh, desk.me)),
            )
            ref = await desk.call(
                put_artifact(
                    desk.mesh.artifacts,
                    desk.signer,
                    envelope.SerializeToString(),
                    media_type=CONTEXT_PACKAGE_MEDIA_TYPE,
                    origin=origin,
                )
            )
            text = f"Context Package for {', '.join(recipient_ids)}: read it with read_context_package"
            body = conversation_pb2.MessagePost(
                conversation_id=item.conversation_id,
                content=conversation_pb2.MessageContent(text=text, artifacts=[ref], mentions=recipient_ids),
            )
            result = await desk.execute(group_id, "message_post", body)
            data["shared"] = {"artifact": digest_text(ref.digest), **written(result)}
        return ok(described(data), data)

    @server.tool(
        description="Read a Context Package handed to you (its Artifact reference, from a Message of your "
        "WorkItem's Conversation: read_messages lists the Artifacts of each Message). The bytes are checked "
        "against their content hash and the package against the Authority's signature before it is returned."
    )
    async def read_context_package(
        artifact: Annotated[str, Field(description="the package's Artifact reference, blake3:<hex>:<size>")],
    ) -> CallToolResult:
        ref = ref_of(artifact, "artifact")
        data = await desk.call(desk.mesh.download(ref.digest))
        if blob_digest(data) != ref.digest:
            raise Refused("INPUT_NOT_VERIFIED", f"the bytes received for {artifact} do not hash to it")
        try:
            document = await opened(data)
        except DecodeError:
            raise Refused("NOT_VERIFIED", f"{artifact} is not a signed Context Package") from None
        return ok(described(document), document)
