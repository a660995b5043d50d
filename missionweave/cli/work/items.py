"""What the acting ``mwp work`` commands share about the WorkItem they name: reading it together with
the Group state (``looked_up``; NOT_FOUND from the server when the Group holds none), and turning
``CRITERION[=SUMMARY]`` flags into Evidence records about it and its submission, each criterion
checked against the contract and recorded by default in the first method the criterion requires.
"""

from __future__ import annotations

import argparse

from missionweave.cli.common import Actor, GroupState, UsageError
from missionweave.sdk.contracts import EVIDENCE_METHODS
from missionweave.v1 import work_pb2 as wp


async def looked_up(actor: Actor, args: argparse.Namespace) -> tuple[GroupState, wp.WorkItem]:
    """The Group state and the WorkItem (NOT_FOUND from the server when the Group holds none)."""
    return await actor.state(args.group), await actor.mesh.work_item(args.group, args.work_item)


def evidence_records(
    item: wp.WorkItem,
    given: list[tuple[str, str]],
    result: int,
    method: str | None,
    flag: str,
    submission: str = "",
) -> list[wp.Evidence]:
    """One Evidence record per ``CRITERION[=SUMMARY]`` about the WorkItem (and its submission), by
    default in the first method the criterion requires."""
    criteria = {c.criterion_id: c for c in item.contract.acceptance_criteria}
    out = []
    for criterion_id, summary in given:
        criterion = criteria.get(criterion_id)
        if criterion is None:
            raise UsageError(
                f"{flag} {criterion_id}: the contract of {item.work_item_id} has no acceptance criterion "
                f"{criterion_id!r} (it has {', '.join(criteria) or 'none'})"
            )
        how = (
            EVIDENCE_METHODS[method]
            if method
            else (list(criterion.required_evidence_methods) or [wp.EVIDENCE_METHOD_REVIEW])[0]
        )
        out.append(
            wp.Evidence(
                subject=wp.EvidenceSubject(work_item_id=item.work_item_id, submission_event_id=submission),
                criterion_id=criterion_id,
                criterion=criterion.description,
                method=how,  # type: ignore[arg-type]
                result=result,  # type: ignore[arg-type]
                summary=summary,
            )
        )
    return out
