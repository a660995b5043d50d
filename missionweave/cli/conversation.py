"""``mwp conversation open`` and ``mwp message post|list|amend`` (spec 9, 9.1).

A Message is conversation only and never an assignment (MW-9-10..12): ``message list`` says so in
its header and never renders a Message as work.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from missionweave.cli.common import (
    UsageError,
    acting,
    acting_command,
    add_json_flag,
    add_reader_flags,
    enum_label,
    first_event,
    mission_of,
    reading,
    report,
    to_dict,
    wants_json,
    when,
)
from missionweave.v1 import conversation_pb2, event_pb2

LIST_HEADER = "Messages (conversation only — not assignments)"

CONVERSATION_KINDS = {
    "review": conversation_pb2.CONVERSATION_KIND_REVIEW,
    "restricted": conversation_pb2.CONVERSATION_KIND_RESTRICTED,
}
AMENDMENT_KINDS = {
    "correction": conversation_pb2.MESSAGE_AMENDMENT_KIND_CORRECTION,
    "retraction": conversation_pb2.MESSAGE_AMENDMENT_KIND_RETRACTION,
    "redaction": conversation_pb2.MESSAGE_AMENDMENT_KIND_REDACTION,
}
ERASURES = {
    "security": conversation_pb2.CONTENT_ERASURE_SECURITY_REDACTION,
    "legal": conversation_pb2.CONTENT_ERASURE_LEGAL_DELETION,
}
_AMEND = conversation_pb2.MessageAmendmentKind

# ------------------------------------------------------------------ a Message's amendment chain


@dataclass
class MessageChain:
    """One posted Message and every ``message.amended`` event naming it, in log order."""

    posted: event_pb2.Event
    amendments: list[event_pb2.Event] = field(default_factory=list)

    @property
    def message(self) -> conversation_pb2.MessagePosted:
        return self.posted.message_posted

    def effective(self) -> tuple[str, conversation_pb2.MessageContent | None, str]:
        """(status, effective content or None when withdrawn/masked, redaction reason)."""
        status, reason = "original", ""
        content: conversation_pb2.MessageContent | None = self.message.content
        for event in self.amendments:
            amended = event.message_amended
            if amended.kind == _AMEND.MESSAGE_AMENDMENT_KIND_CORRECTION:
                status, content = "corrected", amended.corrected_content
            elif amended.kind == _AMEND.MESSAGE_AMENDMENT_KIND_RETRACTION:
                status, content = "retracted", None
            elif amended.kind == _AMEND.MESSAGE_AMENDMENT_KIND_REDACTION:
                status, content, reason = "redacted", None, amended.policy_reason
                if amended.erasure:
                    status = "erased"
        return status, content, reason

    def display(self) -> str:
        """The latest effective form for humans; the original of a redaction is never shown."""
        status, content, reason = self.effective()
        if status == "retracted":
            return "[retracted]"
        if status in ("redacted", "erased"):
            return f"[{status}: {reason}]"
        assert content is not None
        text = _content_text(content)
        return f"{text} (corrected)" if status == "corrected" else text

    def document(self) -> dict[str, Any]:
        """The --json line: effective form plus the whole chain (original and amendments)."""
        status, content, reason = self.effective()
        m = self.message
        return {
            "message_id": m.message_id,
            "conversation_id": m.conversation_id,
            "author_id": self.posted.actor_id,
            "sequence": self.posted.sequence,
            "event_id": self.posted.event_id,
            "posted_at": when(self.posted.recorded_at),
            "reply_to_message_id": m.reply_to_message_id,
            "topic": m.topic,
            "nature": "conversation",  # never an assignment (MW-9-12)
            "authority": m.authority,
            "status": status,
            "effective_content": to_dict(content) if content is not None else None,
            "redaction_reason": reason,
            "original_content": to_dict(m.content),
            "amendments": [_amendment_document(e) for e in self.amendments],
        }


def _content_text(content: conversation_pb2.MessageContent) -> str:
    parts = [content.text] if content.text else []
    if content.data_json:
        parts.append(f"data={content.data_json}")
    if content.artifacts:
        parts.append(f"(+{len(content.artifacts)} artifact reference(s))")
    return " ".join(parts) or "(empty)"


def _amendment_document(event: event_pb2.Event) -> dict[str, Any]:
    amended = event.message_amended
    return {
        "event_id": event.event_id,
        "sequence": event.sequence,
        "actor_id": event.actor_id,
        "recorded_at": when(event.recorded_at),
        "kind": enum_label(_AMEND, amended.kind, "MESSAGE_AMENDMENT_KIND_").lower(),
        "corrected_content": to_dict(amended.corrected_content)
        if amended.HasField("corrected_content")
        else None,
        "policy_reason": amended.policy_reason,
        "erasure": enum_label(conversation_pb2.ContentErasure, amended.erasure, "CONTENT_ERASURE_").lower()
        if amended.erasure
        else None,
    }


def fold_messages(events: Iterable[event_pb2.Event]) -> tuple[dict[str, MessageChain], dict[str, str]]:
    """Message chains by id (posting order) and Conversation labels by id, from a Group's events."""
    chains: dict[str, MessageChain] = {}
    labels: dict[str, str] = {}
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "message_posted":
            chains[event.message_posted.message_id] = MessageChain(event)
        elif kind == "message_amended" and event.message_amended.message_id in chains:
            chains[event.message_amended.message_id].amendments.append(event)
        elif kind == "conversation_opened":
            opened = event.conversation_opened
            label = enum_label(conversation_pb2.ConversationKind, opened.kind, "CONVERSATION_KIND_")
            labels[opened.conversation_id] = f"{label} {opened.title!r}" if opened.title else label
    return chains, labels


def render_messages(chains: Iterable[MessageChain], labels: dict[str, str]) -> list[str]:
    lines = [LIST_HEADER]
    current = None
    for chain in chains:
        m = chain.message
        if m.conversation_id != current:
            current = m.conversation_id
            lines.append(f"Conversation {current} ({labels.get(current, 'unknown kind')})")
        reply = f" (reply to {m.reply_to_message_id})" if m.reply_to_message_id else ""
        lines.append(
            f"  #{chain.posted.sequence} {m.message_id} {chain.posted.actor_id}{reply}: {chain.display()}"
        )
    if len(lines) == 1:
        lines.append("  (no messages)")
    return lines


# ------------------------------------------------------------------ commands


async def cmd_message_list(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        chains, labels = fold_messages([e async for e in mesh.read_events(args.group)])
    selected = sorted(
        (
            c
            for c in chains.values()
            if not args.conversation or c.message.conversation_id == args.conversation
        ),
        key=lambda c: (c.message.conversation_id, c.posted.sequence),
    )
    if wants_json(args):
        for chain in selected:
            print(json.dumps(chain.document(), sort_keys=True))
    else:
        print("\n".join(render_messages(selected, labels)))
    return 0


async def cmd_message_post(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        conversation = args.conversation or mission_of(await actor.state(args.group)).planning_conversation_id
        body = conversation_pb2.MessagePost(
            conversation_id=conversation,
            content=conversation_pb2.MessageContent(text=args.text),
            reply_to_message_id=args.reply_to or "",
        )
        result = await actor.execute(args.group, "message_post", body)
    posted = first_event(result, "message_posted")
    message_id = posted.message_posted.message_id if posted else ""
    headline = f"posted message {message_id} in {conversation} at sequence {result.group_revision}"
    return report(args, result, headline, last_line=message_id, extra={"message_id": message_id})


def _amendment(args: argparse.Namespace) -> conversation_pb2.MessageAmend:
    body = conversation_pb2.MessageAmend(
        message_id=args.message, kind=AMENDMENT_KINDS[args.kind], policy_reason=args.reason or ""
    )
    if args.kind == "correction":
        if not args.text:
            raise UsageError("a correction needs --text (the corrected content)")
        body.corrected_content.text = args.text
    elif args.text:
        raise UsageError(f"--text applies to corrections only, not a {args.kind}")
    if args.kind == "redaction" and not args.reason:
        raise UsageError("a redaction needs --reason (the auditable policy reason, MW-9.1-21)")
    if args.erase:
        if args.kind != "redaction":
            raise UsageError("--erase goes with --kind redaction")
        body.erasure = ERASURES[args.erase]
    return body


async def cmd_message_amend(args: argparse.Namespace) -> int:
    body = _amendment(args)
    async with acting(args) as actor:
        result = await actor.execute(args.group, "message_amend", body)
    if args.erase:
        headline = (
            f"content of message {args.message} erased from history ({args.erase}); the tombstone records it"
        )
    else:
        headline = f"{args.kind} of message {args.message} recorded; the original stays in history"
    return report(args, result, headline)


async def cmd_conversation_open(args: argparse.Namespace) -> int:
    body = conversation_pb2.ConversationOpen(
        conversation_id=args.id or "",
        kind=CONVERSATION_KINDS[args.kind],
        title=args.title,
        participant_ids=args.participant or [],
        linked_conversation_id=args.linked or "",
    )
    async with acting(args) as actor:
        result = await actor.execute(args.group, "conversation_open", body)
    opened = first_event(result, "conversation_opened")
    conversation = opened.conversation_opened.conversation_id if opened else ""
    headline = f"{args.kind} Conversation {conversation} opened"
    return report(args, result, headline, last_line=conversation, extra={"conversation_id": conversation})


# ------------------------------------------------------------------ parser


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    conv = sub.add_parser("conversation", help="Conversations").add_subparsers(dest="sub", required=True)
    o = acting_command(
        conv.add_parser("open", help="open a review or restricted Conversation (owner/Coordinator)")
    )
    o.add_argument("--kind", choices=sorted(CONVERSATION_KINDS), required=True)
    o.add_argument("--title", required=True)
    o.add_argument("--participant", action="append", help="restricted only: a member allowed in (repeatable)")
    o.add_argument("--id", help="Conversation id (default: derived by the server)")
    o.add_argument("--linked", help="the Conversation this one was split from")
    o.set_defaults(func=cmd_conversation_open)

    msg = sub.add_parser("message", help="Messages (conversation only, never assignments)").add_subparsers(
        dest="sub", required=True
    )
    p = acting_command(msg.add_parser("post", help="post a Message (never an assignment)"))
    p.add_argument("--conversation", help="default: the planning Conversation")
    p.add_argument("--text", required=True)
    p.add_argument("--reply-to", help="the Message this replies to")
    p.set_defaults(func=cmd_message_post)

    ls = msg.add_parser("list", help="every Message in its latest effective form")
    ls.add_argument("--group", required=True)
    ls.add_argument("--conversation", help="only this Conversation")
    add_json_flag(ls, "machine output: one JSON document per Message (JSON lines)")
    add_reader_flags(ls)
    ls.set_defaults(func=cmd_message_list)

    a = acting_command(
        msg.add_parser("amend", help="correct, retract or redact a Message (the original stays)")
    )
    a.add_argument("--message", required=True, help="the Message id")
    a.add_argument("--kind", choices=sorted(AMENDMENT_KINDS), required=True)
    a.add_argument("--text", help="correction only: the corrected text")
    a.add_argument("--reason", help="the policy reason (required for a redaction)")
    a.add_argument(
        "--erase",
        choices=sorted(ERASURES),
        help="redaction only: also erase the content from stored history (MissionOwner; MW-7.4-04)",
    )
    a.set_defaults(func=cmd_message_amend)
