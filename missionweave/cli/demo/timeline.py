"""The demo's output as it happens: one ``TimelineEntry`` per Group event the MissionOwner read (or
per identity registered and session opened), each with a one-line detail of what the event says
(``_DETAILS``, by payload), kept in order by ``Timeline``, which also names the command in flight
(``step``) so that a refusal can say how far the demo got.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from missionweave.cli.common import enum_label
from missionweave.v1 import common_pb2, conversation_pb2, event_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp


def spoken_label(enum: Any, value: int, prefix: str) -> str:
    """``enum_label`` in lower case with spaces: ``WORK_ITEM_STATE_ACTIVE`` -> ``active``."""
    return enum_label(enum, value, prefix).lower().replace("_", " ")


def _joined(values: Any) -> str:
    return ", ".join(values)


def _vector(v: common_pb2.ResourceVector) -> str:
    return f"tokens {v.tokens}, tool calls {v.tool_calls}, {v.financial_micros / 1e6:.2f} {v.currency}"


def _digests(refs: Any) -> str:
    return _joined(f"blake3:{r.digest.hex[:12]}… ({r.digest.size_bytes} B)" for r in refs)


def _revoked(p: wp.LeaseRevoked) -> str:
    cause = spoken_label(wp.LeaseRevocationCause, p.cause, "LEASE_REVOCATION_CAUSE_")
    state = spoken_label(wp.WorkItemState, p.resulting_state, "WORK_ITEM_STATE_")
    retry = " for an automatic retry after its backoff" if p.HasField("retry_not_before") else ""
    return f"lease {p.lease_id} revoked ({cause}) -> {state}{retry}"


def _unless_empty(text: str, value: object) -> str:
    """``text`` when ``value`` is set, else nothing."""
    return text if value else ""


_DETAILS: dict[str, Callable[[Any], str]] = {
    "mission_created": lambda p: (
        f'{p.mission_id} "{p.definition.title}", budget {_vector(p.definition.budget)}'
    ),
    "conversation_opened": lambda p: (
        f"{spoken_label(conversation_pb2.ConversationKind, p.kind, 'CONVERSATION_KIND_')} conversation {p.conversation_id}"
    ),
    "membership_granted": lambda p: (
        f"{p.membership.member_id} joins as {spoken_label(membership_pb2.MemberRole, p.membership.role, 'MEMBER_ROLE_')} "
        f"(membership epoch {p.membership.membership_epoch})"
    ),
    "coordinator_lease_granted": lambda p: (
        f"{p.lease.agent_id} coordinates (epoch {p.lease.coordinator_epoch})"
    ),
    "work_authorized": lambda p: (
        f'"{p.title}"'
        + _unless_empty(
            f" after {_joined(p.contract.depends_on_work_item_ids)}", p.contract.depends_on_work_item_ids
        )
    ),
    "work_offered": lambda p: (
        f"offer {p.offer_id} to {_joined(p.candidate_ids)} "
        f"({_joined(p.selection_criteria[0].applied_policy_rules)})"
    ),
    "work_offer_accepted": lambda p: f"{p.agent_id} owns it, ownership epoch {p.ownership.ownership_epoch}",
    "work_offer_declined": lambda p: (
        f"{p.agent_id} declines {p.offer_id} ({spoken_label(wp.DeclineReason, p.decline.reason, 'DECLINE_REASON_')}"
        + _unless_empty(f": {p.decline.detail}", p.decline.detail)
        + ")"
    ),
    "work_offers_withdrawn": lambda p: f"offers {_joined(p.offer_ids)} withdrawn",
    "work_started": lambda p: (
        f"execution lease {p.lease.lease_id}, attempt {p.lease.attempt}"
        + _unless_empty(
            f", resumes from checkpoint {p.resume_from_checkpoint_id}", p.resume_from_checkpoint_id
        )
    ),
    "work_lease_renewed": lambda p: (
        f"lease {p.lease_id} renewed for {p.renewal.expires_at.seconds - p.renewal.renewed_at.seconds} s"
    ),
    "resource_usage_recorded": lambda p: f"used {_vector(p.delta)}",
    "work_preemption_requested": lambda p: (
        f"preemption {p.preemption_request_id} ({spoken_label(wp.PreemptionReason, p.reason, 'PREEMPTION_REASON_')}): "
        "checkpoint at a safe point"
    ),
    "work_checkpointed": lambda p: (
        f"checkpoint {p.checkpoint.checkpoint_id}"
        + _unless_empty(f" answers {p.preemption_request_id}", p.preemption_request_id)
        + " -> queued, slot released"
    ),
    "lease_revoked": _revoked,
    "work_failed": lambda p: (
        f"{spoken_label(wp.WorkFailureKind, p.kind, 'WORK_FAILURE_KIND_')}: {p.reason} "
        f"(evidence {_joined(e.evidence_id for e in p.evidence)})"
    ),
    "work_submitted": lambda p: (
        f"{_digests(p.artifacts)}; evidence {_joined(e.evidence_id for e in p.evidence)}"
    ),
    "work_result_accepted": lambda p: f"verified (submission {p.submission_event_id})",
    "mission_submitted": lambda p: f"revision {p.mission_revision} for approval with {_digests(p.artifacts)}",
    "mission_approved": lambda p: f'approved: "{p.comment}"',
}


def _field(message: Message, *path: str) -> int:
    """An integer field at ``path``, 0 where the message has no such field."""
    value: Any = message
    for name in path:
        if name not in value.DESCRIPTOR.fields_by_name:
            return 0
        value = getattr(value, name)
    return int(value)


@dataclass(frozen=True)
class TimelineEntry:
    """One line of the timeline: a Group event (``sequence`` > 0) or a registration."""

    offset_s: float
    actor: str
    event_type: str
    detail: str
    sequence: int = 0
    work_item_id: str = ""
    ownership_epoch: int = 0
    attempt: int = 0


def entry_of(event: event_pb2.Event, offset_s: float) -> TimelineEntry:
    kind = event.WhichOneof("payload") or ""
    payload = getattr(event, kind) if kind else event
    work_item_id = str(getattr(payload, "work_item_id", ""))
    detail = _DETAILS.get(kind, lambda _: "")(payload)
    return TimelineEntry(
        offset_s=round(offset_s, 3),
        actor=event.actor_id,
        event_type=event.type,
        detail=f"{work_item_id}: {detail}" if work_item_id else detail,
        sequence=event.sequence,
        work_item_id=work_item_id,
        ownership_epoch=_field(payload, "ownership_epoch")
        or _field(payload, "ownership", "ownership_epoch")
        or _field(payload, "lease", "ownership_epoch"),
        attempt=_field(payload, "lease", "attempt") or _field(payload, "attempts"),
    )


@dataclass
class Timeline:
    """The events the demo caused, in order; ``step`` names the command in flight (for a refusal)."""

    entries: list[TimelineEntry] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    step: str = ""

    def offset(self) -> float:
        return time.monotonic() - self.started

    def note(self, actor: str, event_type: str, detail: str) -> None:
        self.entries.append(TimelineEntry(round(self.offset(), 3), actor, event_type, detail))

    def record(self, events: list[event_pb2.Event]) -> None:
        offset = self.offset()
        self.entries += [entry_of(event, offset) for event in events]

    def lines(self) -> list[str]:
        if not self.entries:
            return []
        actor = max(len(e.actor) for e in self.entries)
        kind = max(len(e.event_type) for e in self.entries)
        return [
            f"  {e.offset_s:>+7.2f}s  {e.actor:<{actor}}  {e.event_type:<{kind}}  {e.detail}".rstrip()
            for e in self.entries
        ]
