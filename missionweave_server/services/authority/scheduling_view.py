"""The scheduling-metadata view of a Group's events, for the global scheduler (MW-13.3-08, MW-13.3-09).

GroupLogService serves it when FollowGroup asks for FOLLOW_VIEW_SCHEDULING: each event the member
may see is reduced to what scheduling needs, by an allow-list (``KEPT``): the fields are *copied*
into a fresh Event, never cleared from a copy, so a field added to a payload later stays out until
someone names it here. An event whose payload is not listed is not served at all (a skipped entry):
Messages, Conversations, Artifacts, Evidence, progress reports, Mission content.

The allow-list is what missionweave_server/services/scheduling/projection.py reads; a test folds the full events and
the reduced ones into projections and finds them equal (tests/test_scheduler_confidentiality.py).
The reduced event carries no signature (it could not verify): the scheduler trusts the
mesh-authenticated internal channel instead (docs/decisions.md D120).
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import Message

from missionweave.v1 import event_pb2

# The envelope fields the scheduler reads (its fold orders by sequence, ages by recorded_at and
# tells its own declines by actor_id); never the command or correlation ids.
HEADER = ("group_id", "sequence", "recorded_at", "type", "actor_id")

# A WorkContract's scheduling inputs: never its goal, deliverables, acceptance criteria, inputs,
# permissions, notes or policies' texts.
_CONTRACT = (
    "deadline",
    "urgency",
    "business_impact",
    "depends_on_work_item_ids",
    "required_capabilities.capability_id",
    "required_capabilities.version",
    "budget",
    "requires_execution_approval",
)
_OWNERSHIP = ("agent_id", "ownership_epoch", "start_deadline")


def _under(prefix: str, paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(f"{prefix}.{path}" for path in paths)


# Payload -> the field paths kept (dotted; a path ending at a message field keeps it whole, which
# is only done for messages of plain numbers and times: Timestamp, ResourceVector).
KEPT: dict[str, tuple[str, ...]] = {
    "work_authorized": ("work_item_id", *_under("contract", _CONTRACT)),
    "work_offered": (
        "work_item_id",
        "offer_id",
        "candidate_ids",
        "expires_at",
        *_under("amended_contract", _CONTRACT),
    ),
    "work_offers_withdrawn": ("work_item_id", "offer_ids"),
    "work_offer_declined": ("work_item_id", "offer_id"),
    "work_offer_accepted": ("work_item_id", "offer_id", *_under("ownership", _OWNERSHIP)),
    "work_started": ("work_item_id", "lease.lease_id", "lease.session_epoch"),
    "work_checkpointed": ("work_item_id", "checkpoint.checkpoint_id", *_under("ownership", _OWNERSHIP)),
    "work_blocked": ("work_item_id", "checkpoint.checkpoint_id"),
    "work_unblocked": ("work_item_id", "next_state", *_under("ownership", _OWNERSHIP)),
    "work_submitted": ("work_item_id",),
    "work_result_accepted": ("work_item_id",),
    "work_failed": ("work_item_id",),
    "work_cancelled": ("work_item_id",),
    "work_preemption_requested": ("work_item_id", "preemption_request_id"),
    "execution_approval_granted": ("work_item_id",),
    "lease_revoked": ("work_item_id", "resulting_state", "retry_not_before"),
    "subtask_linked": ("work_item_id",),
    "subtask_ended": ("work_item_id", "resulting_state"),
    # Who may raise a Worker's priority in the Group (MW-11.1-09).
    "mission_created": ("definition.owner_id",),
    "mission_owner_replaced": ("owner_id",),
}


def scheduling_event(event: event_pb2.Event) -> event_pb2.Event | None:
    """The event reduced to its scheduling metadata, or None when nothing of it is scheduling's."""
    payload = event.WhichOneof("payload")
    kept = KEPT.get(payload or "")
    if payload is None or kept is None:
        return None
    reduced = event_pb2.Event()
    copy_paths(event, reduced, HEADER)
    copy_paths(event, reduced, _under(payload, kept))
    return reduced


def copy_paths(source: Message, target: Message, paths: Iterable[str]) -> None:
    """Copy the named fields (dotted paths) of ``source`` into ``target``, and nothing else; a
    message on the way is created in ``target`` only where ``source`` has it (presence is kept)."""
    nested: dict[str, list[str]] = {}
    for path in paths:
        head, _, tail = path.partition(".")
        nested.setdefault(head, [])
        if tail:
            nested[head].append(tail)
    for name, rest in nested.items():
        field = source.DESCRIPTOR.fields_by_name[name]
        repeated = bool(field.is_repeated)
        if field.message_type is None:  # a scalar or enum, single or repeated
            if repeated:
                getattr(target, name).extend(getattr(source, name))
            elif not field.has_presence or source.HasField(name):
                setattr(target, name, getattr(source, name))
        elif repeated:
            for item in getattr(source, name):
                copied = getattr(target, name).add()
                if rest:
                    copy_paths(item, copied, rest)
                else:
                    copied.CopyFrom(item)
        elif source.HasField(name):
            inner = getattr(target, name)
            inner.SetInParent()
            if rest:
                copy_paths(getattr(source, name), inner, rest)
            else:
                inner.CopyFrom(getattr(source, name))
