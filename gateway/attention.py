"""Attention filters for live delivery (MW-8-11..15, OP-26).

Filtering decides only which payloads travel live; filtered sequences are reported as ``skipped`` so
the receiver's cursor stays contiguous, and everything stays retrievable on demand (MW-8-13).
Visibility (restricted Conversations, MW-9-05) is applied first and is not a filter: it is a right.
"""

from __future__ import annotations

from missionweave.v1 import conversation_pb2, event_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from services.authority.state import GroupState

CRITICAL_TOPIC = "critical"  # a Message with this topic is a critical announcement
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


def may_see(state: GroupState, agent_id: str, event: event_pb2.Event) -> bool:
    """MW-9-05: restricted Conversations reach their participants, the MissionOwner and the current
    Coordinator only."""
    conversation = state.conversations.get(conversation_of(state, event))
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
    if item is None:
        return False
    if item.owner is not None and item.owner.agent_id == agent_id:
        return True
    return any(agent_id in offer.candidate_ids for offer in item.offers.values())
