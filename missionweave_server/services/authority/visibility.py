"""What one member may read of a Group's log, and what it wants live (MW-8-07..15, MW-9-05, OP-26).

Decided here, on the Authority side, for the GroupLogService (``group_log.py``): the gateway only
relays the answers. Visibility (restricted Conversations, MW-9-05) is applied first and is not a
filter: it is a right. Attention filters decide only which payloads travel live; filtered sequences
are reported as skipped so the receiver's cursor stays contiguous, and everything stays retrievable
on demand (MW-8-13). A late joiner sees nothing before its visibility start (MW-8-07) unless a
Context Package signed by this Authority cites it for that member (MW-8-08, MW-8-09, MW-13.3-03).

The folded read models (GetGroupState, GetWorkItem, ListWorkItems, GetMissionProgress,
GetSignedGroupSummary, member snapshots) follow the same start (D124): ``sees_work_item`` and
``sees_conversation`` decide what of the state a member is shown, ``may_see`` what of the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from google.protobuf.message import DecodeError

from missionweave.internal.v1.group_log_pb2 import Audience
from missionweave.kernel.errors import Rejected
from missionweave.kernel.signing import verify_signature
from missionweave.v1 import artifact_service_pb2, common_pb2, conversation_pb2, event_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.services.authority.context_package import CONTEXT_PACKAGE_TYPE
from missionweave_server.services.authority.state import (
    ConversationState,
    GrantState,
    GroupState,
    MemberState,
    WorkItemState,
)

R = common_pb2.RejectionReason

CRITICAL_TOPIC = "critical"  # a Message with this topic is a critical announcement
ESCALATION_TOPIC = "escalation"  # a budget or policy escalation a parent Coordinator hears of (MW-14-16)
# What a summary subscriber (e.g. the MissionOwner, MW-8-15) does not receive live.
_NOT_SUMMARY = frozenset(
    {
        "message_posted",
        "message_amended",
        "resource_usage_recorded",
        "work_progress_reported",
        "work_lease_renewed",
        "evidence_recorded",
    }
)


def conversation_of(state: GroupState, event: event_pb2.Event) -> str:
    payload = event.WhichOneof("payload")
    if payload == "message_posted":
        return event.message_posted.conversation_id
    if payload == "message_amended":
        message = state.messages.get(event.message_amended.message_id)
        return message.conversation_id if message else ""
    if payload == "conversation_opened":
        return event.conversation_opened.conversation_id
    return ""


def may_see(state: GroupState, agent_id: str, event: event_pb2.Event, *, cited: bool = False) -> bool:
    """MW-9-05: restricted Conversations reach their participants, the MissionOwner and the current
    Coordinator only. A provisional member (MW-8-06, D124) hears only of the WorkItems it is offered
    and of its own Membership, unless a Context Package made for it cites the event (``cited``)."""
    conversation = state.conversations.get(conversation_of(state, event))
    if not party_to(state, agent_id, conversation):
        return False
    member = state.members.get(agent_id)
    if cited or member is None or not member.provisional:
        return True
    if conversation is not None:
        return sees_conversation(state, agent_id, conversation)
    return _concerns(state, agent_id, event)


def audience(state: GroupState, event: event_pb2.Event, members: MemberSet) -> Audience:
    """Who of the active ``members`` ``may_see`` ``event``, for the SHARED view (D132): every full
    member unless it is in a restricted Conversation (MW-9-05: then the parties only), plus the
    provisional members it concerns. The same rule as ``may_see``, once per event: a full member's
    view depends only on ``party_to``, so only restricted Conversations and provisional members cost
    a check per member."""
    full, provisional = members
    conversation = state.conversations.get(conversation_of(state, event))
    restricted = (
        conversation is not None and conversation.kind == conversation_pb2.CONVERSATION_KIND_RESTRICTED
    )
    if restricted:
        named = [m for m in (*full, *provisional) if may_see(state, m, event)]
    else:
        named = [m for m in provisional if may_see(state, m, event)]
    return Audience(full_members=not restricted, member_ids=named)


MemberSet = tuple[tuple[str, ...], tuple[str, ...]]


def member_set(state: GroupState) -> MemberSet:
    """The active members, full and provisional, in a stable order (the SHARED view's MemberSet)."""
    active = sorted((m for m in state.members.values() if m.active), key=lambda m: m.member_id)
    return (
        tuple(m.member_id for m in active if not m.provisional),
        tuple(m.member_id for m in active if m.provisional),
    )


def _concerns(state: GroupState, agent_id: str, event: event_pb2.Event) -> bool:
    """An event outside any Conversation about a WorkItem ``agent_id`` sees, or its own Membership."""
    payload = event.WhichOneof("payload")
    inner = getattr(event, payload) if payload else None
    if inner is None:
        return False
    if payload == "membership_granted":
        return bool(event.membership_granted.membership.member_id == agent_id)
    if getattr(inner, "member_id", None) == agent_id:
        return True
    item = state.work_items.get(getattr(inner, "work_item_id", ""))
    return item is not None and sees_work_item(state, agent_id, item)


def sees_work_item(state: GroupState, viewer: str | None, item: WorkItemState) -> bool:
    """D124 (MW-8-05..08): everyone (``viewer`` None: an operator) sees a WorkItem it takes part in;
    an active member also those created at or after its visibility start (from sequence 1, as the
    MissionOwner and the Coordinator: all); a provisional member nothing else."""
    if viewer is None:
        return True
    member = state.members.get(viewer)
    if member is None:
        return False
    if takes_part(item, viewer):
        return True
    return not member.provisional and item.created_sequence >= member.visibility_start_sequence


def takes_part(item: WorkItemState, agent_id: str) -> bool:
    """Offered it (any offer, answered or not), owns it, or has held a lease, submitted or produced
    Evidence on it: what it already knows of the WorkItem."""
    return (
        _own(item, agent_id)
        or item.submitted_by == agent_id
        or any(lease.agent_id == agent_id for lease in item.lease_history.values())
        or any(producer == agent_id for _, _, producer in item.evidence.values())
    )


def _own(item: WorkItemState, agent_id: str) -> bool:
    """Owned by ``agent_id``, or offered to it."""
    if item.owner is not None and item.owner.agent_id == agent_id:
        return True
    return any(agent_id in offer.candidate_ids for offer in item.offers.values())


def sees_conversation(state: GroupState, viewer: str | None, conversation: ConversationState) -> bool:
    """D124: a restricted one as ``party_to`` says; a WorkItem's (titled as it) with its WorkItem; a
    Group-wide one by every member but a provisional one, unless it is named a participant."""
    if viewer is None:
        return True
    if not party_to(state, viewer, conversation):
        return False
    item = state.work_items.get(conversation.work_item_id) if conversation.work_item_id else None
    if item is not None:
        return sees_work_item(state, viewer, item)
    member = state.members.get(viewer)
    return member is not None and (not member.provisional or viewer in conversation.participant_ids)


def sees_grant(state: GroupState, viewer: str | None, grant: GrantState) -> bool:
    """D124: its grantee sees a delegation grant; other members (provisional ones never) one that is
    Group-wide or targets a WorkItem they see."""
    if viewer is None or grant.grantee_id == viewer:
        return True
    member = state.members.get(viewer)
    if member is None or member.provisional:
        return False
    target = state.work_items.get(grant.target_work_item_id)
    return not grant.target_work_item_id or (target is not None and sees_work_item(state, viewer, target))


def party_to(state: GroupState, agent_id: str, conversation: ConversationState | None) -> bool:
    """Whether ``agent_id`` may see ``conversation`` (any that is not restricted; a restricted one
    only as a participant, the MissionOwner or the current Coordinator, MW-9-05)."""
    if conversation is None or conversation.kind != conversation_pb2.CONVERSATION_KIND_RESTRICTED:
        return True
    mission = state.mission
    stewards = (
        {mission.owner_id, mission.coordinator.agent_id if mission.coordinator else ""} if mission else set()
    )
    return agent_id in conversation.participant_ids or agent_id in stewards


def wanted(state: GroupState, agent_id: str, event: event_pb2.Event, attention: pb.AttentionFilter) -> bool:
    """Whether ``event`` goes live to ``agent_id`` under ``attention`` (visibility already checked)."""
    mode = attention.mode or pb.ATTENTION_MODE_ALL
    if mode == pb.ATTENTION_MODE_ALL:
        return True
    payload = event.WhichOneof("payload") or ""
    if mode == pb.ATTENTION_MODE_SUMMARY:
        return payload not in _NOT_SUMMARY
    if mode == pb.ATTENTION_MODE_DIGEST:  # MW-14-16/17: a child's facts, not its conversation
        if payload == "message_posted":
            return event.message_posted.topic in (CRITICAL_TOPIC, ESCALATION_TOPIC)
        return payload not in ("message_amended", "work_lease_renewed")
    if attention.event_types and event.type in attention.event_types:
        return True
    conversation_id = conversation_of(state, event)
    if conversation_id and conversation_id in attention.conversation_ids:
        return True
    if attention.own_work_items and _about_own_work(state, agent_id, event, conversation_id):
        return True
    if payload == "message_posted":
        posted = event.message_posted
        if attention.direct_mentions and agent_id in posted.content.mentions:
            return True
        if attention.critical_announcements and posted.topic == CRITICAL_TOPIC:
            return True
        if posted.topic and posted.topic in attention.topics:
            return True
    return bool(attention.critical_announcements and payload.startswith(("mission_", "coordinator_")))


def _about_own_work(state: GroupState, agent_id: str, event: event_pb2.Event, conversation_id: str) -> bool:
    """Its WorkItems: those it owns or is offered, their Conversations and their events."""
    work_item_id = ""
    if conversation_id:
        conversation = state.conversations.get(conversation_id)
        work_item_id = conversation.work_item_id if conversation else ""
    else:
        payload = event.WhichOneof("payload")
        inner = getattr(event, payload) if payload else None
        work_item_id = getattr(inner, "work_item_id", "") if inner is not None else ""
    item = state.work_items.get(work_item_id)
    return item is not None and _own(item, agent_id)


def active_member(
    state: GroupState | None, group_id: str, member_id: str, now: datetime
) -> tuple[GroupState, MemberState]:
    """The Group's state and the member's active Membership in it (a provisional one not lapsed),
    or the structured refusal."""
    if state is None:
        raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {group_id} does not exist")
    member = state.members.get(member_id)
    if member is None or not member.active or member.lapsed(now):
        raise Rejected(
            R.REJECTION_REASON_NOT_A_MEMBER, f"{member_id} holds no active Membership in {group_id}"
        )
    return state, member


def cited_for(
    envelope: common_pb2.SignedEnvelope, authority_key: bytes, group_id: str, member_id: str
) -> set[int]:
    """The sequences a Context Package signed by this Authority cites for ``member_id`` in ``group_id``."""
    if envelope.payload_type != CONTEXT_PACKAGE_TYPE or not verify_signature(envelope, authority_key):
        raise Rejected(
            R.REJECTION_REASON_SIGNATURE_INVALID,
            "the Context Package is not signed by this Authority",
            field="context_package",
        )
    try:
        package = artifact_service_pb2.ContextPackage.FromString(envelope.payload)
    except DecodeError:
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT, "the Context Package does not parse", field="context_package"
        ) from None
    if package.group_id != group_id:
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT,
            f"the Context Package is of Group {package.group_id}, not {group_id}",
            field="context_package",
        )
    if member_id not in package.recipient_ids:
        return set()  # a package made for someone else grants this member nothing
    return {
        seq
        for r in package.source_event_ranges
        if r.group_id in ("", group_id)
        for seq in range(r.first_sequence, r.last_sequence + 1)
    }


def as_ranges(sequences: Iterable[int]) -> list[pb.SequenceRange]:
    """Sorted sequences as maximal inclusive ranges."""
    out: list[pb.SequenceRange] = []
    for seq in sorted(sequences):
        if out and out[-1].last + 1 == seq:
            out[-1].last = seq
        else:
            out.append(pb.SequenceRange(first=seq, last=seq))
    return out
