"""WorkItems (spec 10, 11.3, 11.4): contracts, the state machine MW-10.2-T01..T14/T18, offers and
ownership, fenced execution leases, dependencies and six-dimension budgets.

One module per section of the lifecycle, each ending with the declarations of its command kinds;
``common``, ``contract``, ``leases`` and ``usage`` hold the rules they share.
"""

from __future__ import annotations

from missionweave_server.services.authority.rules.work import (
    artifacts,
    ending,
    execution,
    offers,
    preemption,
    proposals,
    review,
    start,
)

KINDS = (
    *proposals.KINDS,
    *offers.KINDS,
    *start.KINDS,
    *execution.KINDS,
    *review.KINDS,
    *ending.KINDS,
    *preemption.KINDS,
    *artifacts.KINDS,
)

__all__ = ["KINDS"]
