"""Inputs and outputs of the Worker's global scheduler policy (spec 11.1, docs/scheduling.md).

Plain Python on purpose: the policy has no protobuf or gRPC dependency. The enum values equal
those of `scheduling_service.proto` (PriorityClass, PrioritySource) and `work.proto` (WorkUrgency,
BusinessImpact), so the servicer maps them one to one; `Assignment` maps onto SlotAssignment and
its OrderingFactors, `QueuedView` onto QueueEntry. Times are seconds on the caller's clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class PriorityClass(IntEnum):
    """Organization priority class (MW-11.1-11), set by policy or the MissionOwner (MW-11.1-09)."""

    BACKGROUND = 1
    STANDARD = 2
    ELEVATED = 3
    URGENT = 4


# Highest first: the order in which the fair path looks at classes.
CLASSES_DOWN = (
    PriorityClass.URGENT,
    PriorityClass.ELEVATED,
    PriorityClass.STANDARD,
    PriorityClass.BACKGROUND,
)
# Rank of an item started by aging (above every class): starving work is never preempted for
# class precedence, and never preempts other aged work (no thrashing).
AGED_RANK = 5


class Source(IntEnum):
    """Who asks for a change. The first three are the proto's PrioritySource values."""

    ORGANIZATION_POLICY = 1
    MISSION_OWNER = 2
    WORKER_OPERATOR = 3
    # Not in the proto, where a Coordinator is never a valid source: here it may set the
    # within-Group inputs it owns (urgency, deadline, business impact, MW-11.1-07) and nothing else.
    COORDINATOR = 9


# Who may change what (MW-11.1-08, MW-11.1-09): cross-Group share moves only with the class
# (Organization policy, MissionOwner) and the Group weight and quota (Worker operator, Organization).
MAY_SET_CLASS = frozenset({Source.ORGANIZATION_POLICY, Source.MISSION_OWNER})
MAY_SET_GROUP = frozenset({Source.ORGANIZATION_POLICY, Source.WORKER_OPERATOR})
MAY_SET_INPUTS = frozenset({Source.ORGANIZATION_POLICY, Source.MISSION_OWNER, Source.COORDINATOR})


class NotPermitted(PermissionError):
    """The source may not make this change (MW-11.1-08)."""


@dataclass(frozen=True)
class Params:
    """Policy parameters; the defaults are documented in docs/scheduling.md."""

    slots: int  # declared isolated slots (Agent Card maximum concurrency, MW-11.1-13)
    aging_horizon: float = 600.0  # H: a flow waiting this long is served before any class
    service_time_bound: float = 3600.0  # T_max: the assumption behind the bound, not used to decide
    service_estimate: float = 60.0  # charged at start when an item declares none; corrected at release
    default_weight: int = 1
    default_quota: int | None = None  # None: a Group may use every slot

    def __post_init__(self) -> None:
        if (
            self.slots < 1
            or self.aging_horizon <= 0
            or self.service_time_bound <= 0
            or self.service_estimate <= 0
        ):
            raise ValueError("slots, aging_horizon, service_time_bound and service_estimate must be positive")

    def wait_bound(self, waiting_flows: int) -> float:
        """The longest a flow (Group x class) waits for a slot while it continuously has an eligible
        item and quota to spare, when `waiting_flows` flows (itself included) were waiting as it
        began: H + ceil(F / S) * T_max (docs/scheduling.md, "The bound")."""
        return self.aging_horizon + math.ceil(max(waiting_flows, 1) / self.slots) * self.service_time_bound


@dataclass(frozen=True)
class Assignment:
    """A placement into a free slot (SlotAssignment with its OrderingFactors)."""

    slot_id: str
    group_id: str
    work_item_id: str
    priority_class: PriorityClass
    deadline: float | None
    waiting_time: float  # since it (last) entered the queue
    urgency: int
    business_impact: int
    group_weight: int
    group_quota_remaining: int  # after this placement
    aged: bool  # chosen by aging (its flow waited past H) rather than by the fair path


@dataclass(frozen=True)
class Preemption:
    """A recommendation: ask this slot to checkpoint and pause cooperatively (MW-11.3-12)."""

    slot_id: str
    work_item_id: str
    group_id: str
    for_rank: int  # the rank of the waiting work it makes room for (AGED_RANK = starving)


@dataclass(frozen=True)
class QueuedView:
    """One queued WorkItem as its own Group sees it (QueueEntry); never a global position."""

    work_item_id: str
    group_position: int  # 1 = next among this Group's eligible items
    eligible: bool
    ineligible_reason: str
    priority_class: PriorityClass
    deadline: float | None
    urgency: int
    business_impact: int
    enqueued_at: float


@dataclass(frozen=True)
class Call:
    """One recorded call: the policy's state is a function of the sequence of calls (replay)."""

    method: str
    kwargs: tuple[tuple[str, Any], ...]
