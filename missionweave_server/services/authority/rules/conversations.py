"""Conversations and Messages (spec 9, MW-9.1-19..22): complete content, never authority."""

from __future__ import annotations

from collections.abc import Iterable

import blake3

from missionweave.kernel import codec, ids
from missionweave.kernel.errors import Rejected
from missionweave.kernel.eventlog import event_digest
from missionweave.v1 import command_pb2, common_pb2, conversation_pb2, event_pb2
from missionweave_server.services.authority.rules.common import (
    AMBIGUITY_TOPIC,
    MAX_DATA_JSON_BYTES,
    MAX_REFS,
    MAX_TEXT_BYTES,
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    check_artifact_refs,
    invalid,
    is_org_policy,
    mission_of,
    require_reason,
)
from missionweave_server.services.authority.rules.missions.common import require_live
from missionweave_server.services.authority.rules.work.offline import buffered, reconcile
from missionweave_server.services.authority.state import ConversationState, GroupState, MessageState

CK = conversation_pb2.ConversationKind
AK = conversation_pb2.MessageAmendmentKind
CE = conversation_pb2.ContentErasure


def validate_content(content: conversation_pb2.MessageContent, state: GroupState, field: str) -> None:
    """MW-9-06/08/09: complete content; text, structured data and Artifact references, no blobs."""
    if len(content.text.encode("utf-8")) > MAX_TEXT_BYTES:
        raise Rejected(
            R.REJECTION_REASON_TOO_LARGE,
            f"{field}.text exceeds {MAX_TEXT_BYTES} bytes; upload large content to the artifact store and "
            "reference it by hash (MW-9-09)",
            field=f"{field}.text",
            limit=MAX_TEXT_BYTES,
        )
    if len(content.data_json.encode("utf-8")) > MAX_DATA_JSON_BYTES:
        raise Rejected(
            R.REJECTION_REASON_TOO_LARGE,
            f"{field}.data_json exceeds {MAX_DATA_JSON_BYTES} bytes; reference an Artifact instead (MW-9-09)",
            field=f"{field}.data_json",
            limit=MAX_DATA_JSON_BYTES,
        )
    if content.data_json:  # an object, nested at most codec.MAX_JSON_DEPTH deep
        codec.json_object(content.data_json, f"{field}.data_json", max_bytes=MAX_DATA_JSON_BYTES)
    if len(content.artifacts) > MAX_REFS or len(content.mentions) > MAX_REFS:
        raise Rejected(R.REJECTION_REASON_TOO_LARGE, f"at most {MAX_REFS} artifacts and {MAX_REFS} mentions")
    check_artifact_refs(content.artifacts, f"{field}.artifacts")
    for i, mention in enumerate(content.mentions):
        if mention not in state.members:
            raise invalid(f"{field}.mentions[{i}]", f"{mention} is not a member of this Group")
    if not (content.text or content.data_json or content.artifacts):
        raise invalid(field, "a Message needs text, data or Artifact references")


def _is_steward(state: GroupState, actor_id: str) -> bool:
    """The MissionOwner or the current Coordinator (who may always inspect restricted ones, MW-9-05)."""
    mission = mission_of(state)
    lease = mission.coordinator
    return actor_id == mission.owner_id or (lease is not None and actor_id == lease.agent_id)


def _conversation(state: GroupState, conversation_id: str, actor_id: str, field: str) -> ConversationState:
    conversation = state.conversations.get(conversation_id)
    if conversation is None:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no conversation {conversation_id}", field=field)
    if _restricted_from(state, conversation_id, actor_id):
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"{conversation_id} is restricted to its participants, the MissionOwner and the Coordinator (MW-9-05)",
        )
    return conversation


def _reply_target(state: GroupState, message_id: str, conversation_id: str, actor_id: str) -> None:
    """A reply names a message its author may read, answered alike whether it is hidden or absent
    (no probing a restricted Conversation for its message ids); a reply to a restricted
    Conversation's message stays in it, or the reply would show the id to everyone who reads it."""
    target = state.messages.get(message_id)
    hidden = target is not None and _restricted_from(state, target.conversation_id, actor_id)
    if target is None or hidden:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no message {message_id} to reply to")
    restricted = state.conversations[target.conversation_id].kind == CK.CONVERSATION_KIND_RESTRICTED
    if restricted and target.conversation_id != conversation_id:
        raise invalid(
            "body.message_post.reply_to_message_id",
            "a reply to a message of a restricted Conversation is posted in that Conversation",
        )


def _restricted_from(state: GroupState, conversation_id: str, actor_id: str) -> bool:
    conversation = state.conversations[conversation_id]
    return (
        conversation.kind == CK.CONVERSATION_KIND_RESTRICTED
        and actor_id not in conversation.participant_ids
        and not _is_steward(state, actor_id)
    )


def message_post(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-9-13: any Group member posts; the Message never carries authority (MW-9-10)."""
    assert state is not None
    body = command.message_post
    binding = buffered(command)
    if binding is not None:  # a Message the Worker buffered offline: its WorkItem Conversation only
        reconcile(state, command, ctx, out, binding, conversation_id=body.conversation_id)
    _conversation(state, body.conversation_id, command.actor_id, "conversation_id")
    message_id = (
        body.message_id or f"msg_{ids.suffix(ids.derived_id('x', command.group_id, command.command_id))}"
    )
    if not ids.is_valid(message_id):
        raise invalid("body.message_post.message_id", "not a valid id")
    if message_id in state.messages:
        raise invalid("body.message_post.message_id", "already used in this Group")
    if body.reply_to_message_id:
        _reply_target(state, body.reply_to_message_id, body.conversation_id, command.actor_id)
    if len(body.topic) > 128:
        raise invalid("body.message_post.topic", "at most 128 characters")
    validate_content(body.content, state, "body.message_post.content")
    out.emit(
        "message.posted",
        "message_posted",
        conversation_pb2.MessagePosted(
            message_id=message_id,
            conversation_id=body.conversation_id,
            content=body.content,
            reply_to_message_id=body.reply_to_message_id,
            topic=body.topic,
            authority=False,
        ),
    )


def message_amend(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-9.1-19..21: the Message stays as accepted; a new event cites it (redaction needs a reason)."""
    assert state is not None
    body = command.message_amend
    message = state.messages.get(body.message_id)
    if message is None:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND, f"no message {body.message_id} in this Group", field="message_id"
        )
    _conversation(state, message.conversation_id, command.actor_id, "message_id")
    erased: list[int] = []
    if body.erasure != CE.CONTENT_ERASURE_UNSPECIFIED:
        _check_erasure(state, command, ctx, message)
        erased = message.content_sequences
    else:
        _check_amendment(state, command, ctx, message)
    out.emit(
        "message.amended",
        "message_amended",
        conversation_pb2.MessageAmended(
            message_id=body.message_id,
            kind=body.kind,
            corrected_content=body.corrected_content if body.HasField("corrected_content") else None,
            policy_reason=body.policy_reason,
            erasure=body.erasure,
            erased_sequences=erased,
        ),
    )


def _check_amendment(
    state: GroupState, command: command_pb2.Command, ctx: DecisionContext, message: MessageState
) -> None:
    body = command.message_amend
    if message.latest_amendment in (
        AK.MESSAGE_AMENDMENT_KIND_RETRACTION,
        AK.MESSAGE_AMENDMENT_KIND_REDACTION,
    ):
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION,
            f"message {body.message_id} was {AK.Name(AK.ValueType(message.latest_amendment)).rsplit('_', 1)[-1].lower()}; "
            "post a new Message instead",
        )
    author = command.actor_id == message.author_id
    if body.kind == AK.MESSAGE_AMENDMENT_KIND_CORRECTION:
        if not author:
            raise Rejected(R.REJECTION_REASON_PERMISSION_DENIED, "only the author corrects a Message")
        validate_content(body.corrected_content, state, "body.corrected_content")
    elif body.kind == AK.MESSAGE_AMENDMENT_KIND_RETRACTION:
        if not author:
            raise Rejected(R.REJECTION_REASON_PERMISSION_DENIED, "only the author retracts a Message")
        if body.HasField("corrected_content"):
            raise invalid("body.corrected_content", "a retraction carries no content")
    elif body.kind == AK.MESSAGE_AMENDMENT_KIND_REDACTION:
        if not (author or _is_steward(state, command.actor_id) or is_org_policy(ctx, command.actor_id)):
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED,
                "a redaction is made by the author, the MissionOwner, the Coordinator or Organization policy",
            )
        require_reason(body.policy_reason, "body.policy_reason")  # MW-9.1-21
        if body.HasField("corrected_content"):
            raise invalid("body.corrected_content", "a redaction masks the Message; it carries no content")
    else:
        raise invalid("body.kind", "correction, retraction or redaction")


def _check_erasure(
    state: GroupState, command: command_pb2.Command, ctx: DecisionContext, message: MessageState
) -> None:
    """MW-7.4-04/05: a security redaction or legal deletion appends this tombstone; the shell then
    re-signs the listed events with their content cleared, keeping their ids and sequences. Also
    allowed after a retraction or a masking redaction: the content is still in the log then."""
    body = command.message_amend
    if body.kind != AK.MESSAGE_AMENDMENT_KIND_REDACTION:
        raise invalid("body.erasure", "erasing content is a kind of redaction (kind REDACTION)")
    if body.erasure not in (CE.CONTENT_ERASURE_SECURITY_REDACTION, CE.CONTENT_ERASURE_LEGAL_DELETION):
        raise invalid("body.erasure", "SECURITY_REDACTION or LEGAL_DELETION")
    if not (command.actor_id == mission_of(state).owner_id or is_org_policy(ctx, command.actor_id)):
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "content is erased from history by the MissionOwner or Organization policy",
        )
    require_reason(body.policy_reason, "body.policy_reason")
    if body.HasField("corrected_content"):
        raise invalid("body.corrected_content", "an erasure carries no content")
    if message.erased:
        raise Rejected(
            R.REJECTION_REASON_INVALID_TRANSITION,
            f"the content of message {body.message_id} was already erased",
        )


def erasure_targets(events: Iterable[event_pb2.Event]) -> list[tuple[event_pb2.Event, int]]:
    """MW-7.4-04/05: the stored events the erasure tombstones among ``events`` list, as
    (tombstone, sequence): the shell re-signs each with its content cleared (``erased``)."""
    return [
        (tombstone, sequence)
        for tombstone in events
        if tombstone.WhichOneof("payload") == "message_amended"
        for sequence in tombstone.message_amended.erased_sequences
    ]


def erased(event: event_pb2.Event, tombstone: event_pb2.Event, original_envelope: bytes) -> event_pb2.Event:
    """The stored ``event`` (decoded from ``original_envelope``) with its content cleared and a marker
    naming the tombstone; id, sequence and every other field unchanged. Changes and returns ``event``.

    The marker keeps the original's event digest, which the next event names in its
    ``previous_digest``: the chain verifies across the erasure (docs/integrity.md)."""
    original_digest = bytes(event.redaction.original_event_digest) if event.HasField("redaction") else b""
    if not original_digest:
        original_digest = event_digest(common_pb2.SignedEnvelope.FromString(original_envelope).payload)
    if event.WhichOneof("payload") == "message_posted":
        event.message_posted.ClearField("content")
    else:  # a correction (touching the other payload would switch the oneof)
        event.message_amended.ClearField("corrected_content")
    event.redaction.CopyFrom(
        event_pb2.RedactionMarker(
            tombstone_event_id=tombstone.event_id,
            tombstone_sequence=tombstone.sequence,
            erasure=tombstone.message_amended.erasure,
            original_envelope_digest=common_pb2.Digest(
                algorithm="blake3",
                hex=blake3.blake3(original_envelope).hexdigest(),
                size_bytes=len(original_envelope),
            ),
            original_event_digest=original_digest,
        )
    )
    return event


def conversation_open(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-9-03/04/05: review and restricted Conversations inside the Mission's audit boundary."""
    assert state is not None
    body = command.conversation_open
    require_live(mission_of(state), "conversation.open")
    if not _is_steward(state, command.actor_id):
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "review and restricted Conversations are opened by the owner or Coordinator",
        )
    if body.kind not in (CK.CONVERSATION_KIND_REVIEW, CK.CONVERSATION_KIND_RESTRICTED):
        raise invalid(
            "body.kind", "REVIEW or RESTRICTED (planning and WorkItem Conversations open by themselves)"
        )
    if not 1 <= len(body.title) <= 200:
        raise invalid("body.title", "1..200 characters required")
    conversation_id = body.conversation_id or ids.derived_id("conv", command.group_id, command.command_id)
    if not ids.is_valid(conversation_id) or conversation_id in state.conversations:
        raise invalid("body.conversation_id", "a valid id not yet used in this Group")
    if body.participant_ids and body.kind != CK.CONVERSATION_KIND_RESTRICTED:
        raise invalid("body.participant_ids", "only restricted Conversations list participants")
    if len(body.participant_ids) > 256:
        raise invalid("body.participant_ids", "at most 256 participants")
    for i, pid in enumerate(body.participant_ids):
        member = state.members.get(pid)
        if member is None or not member.active:
            raise invalid(f"body.participant_ids[{i}]", f"{pid} holds no active Membership in this Group")
    if body.linked_conversation_id and body.linked_conversation_id not in state.conversations:
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no conversation {body.linked_conversation_id} to link")
    out.emit(
        "conversation.opened",
        "conversation_opened",
        conversation_pb2.ConversationOpened(
            conversation_id=conversation_id,
            kind=body.kind,
            title=body.title,
            participant_ids=sorted(set(body.participant_ids)),
            linked_conversation_id=body.linked_conversation_id,
        ),
    )


# ---------------------------------------------------------------- evolve rules


def _opened(state: GroupState, event: event_pb2.Event) -> None:
    p = event.conversation_opened
    state.conversations[p.conversation_id] = ConversationState(
        conversation_id=p.conversation_id,
        kind=p.kind,
        work_item_id=p.work_item_id,
        title=p.title,
        participant_ids=tuple(p.participant_ids),
        linked_conversation_id=p.linked_conversation_id,
    )


def _posted(state: GroupState, event: event_pb2.Event) -> None:
    p = event.message_posted
    state.messages[p.message_id] = MessageState(
        conversation_id=p.conversation_id, author_id=event.actor_id, content_sequences=[event.sequence]
    )
    conversation = state.conversations[p.conversation_id]
    conversation.message_count += 1
    if p.topic == AMBIGUITY_TOPIC and conversation.work_item_id in state.work_items:
        state.work_items[conversation.work_item_id].open_ambiguities.add(p.message_id)


def _amended(state: GroupState, event: event_pb2.Event) -> None:
    amended = event.message_amended
    message = state.messages[amended.message_id]
    message.latest_amendment = amended.kind
    message.amendments += 1
    if amended.kind == AK.MESSAGE_AMENDMENT_KIND_CORRECTION:
        message.content_sequences.append(event.sequence)
    if amended.erasure != CE.CONTENT_ERASURE_UNSPECIFIED:
        message.erased = True


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind("message_post", message_post, {"message_posted": _posted}, bufferable_offline=True),
    CommandKind(
        "message_amend",
        message_amend,
        {"message_amended": _amended},
        erases=lambda c: c.message_amend.erasure != CE.CONTENT_ERASURE_UNSPECIFIED,
    ),
    CommandKind("conversation_open", conversation_open, {"conversation_opened": _opened}),
)

__all__ = ["KINDS", "erased", "erasure_targets", "validate_content"]
