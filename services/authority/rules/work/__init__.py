"""WorkItems (spec 10, 11.3, 11.4): contracts, the state machine MW-10.2-T01..T14/T18, offers and
ownership, fenced execution leases, dependencies and six-dimension budgets.

One module per section of the lifecycle; ``common`` holds what they share.
"""

from __future__ import annotations

from services.authority.rules.common import Applier, Handler
from services.authority.rules.work import (
    artifacts,
    ending,
    execution,
    leases,
    offers,
    preemption,
    proposals,
    review,
    start,
    usage,
)
from services.authority.rules.work.ending import propagate_mission_end

_FAMILY = (proposals, offers, start, execution, review, ending, preemption, artifacts, leases, usage)
HANDLERS: dict[str, Handler] = {k: v for m in _FAMILY for k, v in getattr(m, "HANDLERS", {}).items()}
APPLIERS: dict[str, Applier] = {k: v for m in _FAMILY for k, v in getattr(m, "APPLIERS", {}).items()}

__all__ = ["APPLIERS", "HANDLERS", "propagate_mission_end"]
