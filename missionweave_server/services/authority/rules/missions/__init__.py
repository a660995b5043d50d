"""Mission lifecycle (spec 7.1, table MW-7.1-T01..T08), Coordinator lease (7.2), completion (7.3),
the MissionOwner's directives (MW-7.1-12) and the authorization of context transfers (MW-13.3-05/07).

One module per concern, each ending with the declarations of its command kinds; ``common`` holds
the guards and Membership emitters the concerns, and the other rule families, share.
"""

from __future__ import annotations

from missionweave_server.services.authority.rules.missions import (
    approval,
    context_transfer,
    coordinator,
    creation,
    directives,
    ending,
)

KINDS = (
    *creation.KINDS,
    *approval.KINDS,
    *ending.KINDS,
    *coordinator.KINDS,
    *directives.KINDS,
    *context_transfer.KINDS,
)

__all__ = ["KINDS"]
