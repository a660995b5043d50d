"""``mwp work ...``: the WorkItem commands a Coordinator, a reviewer or a Worker issues by hand
(spec 10, 11.3, 11.4, 13.2). ``list`` and ``show`` are in readmodels.py, the DAG view in workdag.py.

Everything the Group already knows is looked up rather than asked for: the Membership and
Coordinator epochs, the Mission's deadline and currency, the open offer, the ownership epoch and the
current lease, the latest submission, the method a criterion requires. A flag that is malformed or
names what the contract lacks (a criterion, a dependency) is refused before anything is sent (exit 2).

The package, by what the commands do: offer.py (authorize, offer, extend), review.py
(accept-result, evidence, request-changes, reject), control.py (fail, cancel, unblock) and
execution.py (a Worker's accept, decline, start, renew, submit, block); contract.py holds the work
contract's flags, arguments.py the argument types, items.py the WorkItem look-up and Evidence
records they share. ``register`` (here) adds the commands and ``tree``.
"""

from __future__ import annotations

import argparse

from missionweave.cli.common import (
    acting_command,
    add_coordinator_epoch_flag,
    add_expiry_flags,
    emit,
    natural,
    reading,
    reading_command,
)
from missionweave.cli.delegation import cap
from missionweave.cli.mission import artifact_ref
from missionweave.cli.work.arguments import id_text, id_value
from missionweave.cli.work.contract import add_contract_flags
from missionweave.cli.work.control import FAILURE_KINDS, cmd_cancel, cmd_fail, cmd_unblock
from missionweave.cli.work.execution import (
    BLOCKER_KINDS,
    DECLINE_REASONS,
    cmd_accept,
    cmd_block,
    cmd_decline,
    cmd_renew,
    cmd_start,
    cmd_submit,
)
from missionweave.cli.work.offer import cmd_authorize, cmd_extend, cmd_offer
from missionweave.cli.work.review import cmd_accept_result, cmd_evidence, cmd_reject, cmd_request_changes
from missionweave.cli.workdag import tree_document, tree_lines
from missionweave.sdk.contracts import EVIDENCE_METHODS


async def cmd_tree(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        items = await mesh.work_items(args.group)
    document = tree_document(args.group, items)
    emit(args, tree_lines(document), document)
    return 0


# ------------------------------------------------------------------ parsers


def _work_item(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
    sp.add_argument("work_item", metavar="WORK_ITEM", type=id_value)
    return sp


def _evidence_flags(
    sp: argparse.ArgumentParser, *, passing: bool = False, failing: bool = False, required: bool = False
) -> None:
    if passing:
        sp.add_argument(
            "--evidence-pass",
            action="append",
            type=id_text,
            metavar="CRITERION[=SUMMARY]",
            help="Evidence that the criterion is met (repeatable)",
        )
    if failing:
        sp.add_argument(
            "--evidence-fail",
            action="append",
            type=id_text,
            metavar="CRITERION[=SUMMARY]",
            required=required,
            help="Evidence that the criterion is not met (repeatable)",
        )
    sp.add_argument(
        "--method",
        choices=list(EVIDENCE_METHODS),
        help="the Evidence method [the first one the criterion requires]",
    )


def _offer_flags(sp: argparse.ArgumentParser, *, required: bool = True) -> None:
    sp.add_argument(
        "--to",
        action="append",
        type=id_value,
        required=required,
        metavar="AGENT",
        help="a candidate (repeatable, at most 8); an active member in a role that may accept",
    )


def register(work: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The acting commands and ``tree``, added to ``mwp work`` (whose list and show readmodels.py adds)."""
    a = acting_command(work.add_parser("authorize", help="create a WorkItem with its contract (Coordinator)"))
    a.add_argument(
        "work_item", metavar="WORK_ITEM", nargs="?", type=id_value, help="its id (default: a new one)"
    )
    a.add_argument("--title", required=True, help="a short title (1..200 characters)")
    a.add_argument("--parent", type=id_value, help="the parent WorkItem in the plan tree")
    add_contract_flags(a)
    a.add_argument(
        "--override-reason", help="MissionOwner: authorize as an audited emergency override (MW-7.1-13)"
    )
    add_coordinator_epoch_flag(a)
    a.set_defaults(func=cmd_authorize)

    o = _work_item(
        acting_command(work.add_parser("offer", help="offer a WorkItem to candidates (Coordinator)"))
    )
    _offer_flags(o)
    add_expiry_flags(o, "the offer", required=False)
    o.add_argument("--offer-id", type=id_value, help="the offer's id (default: derived by the Authority)")
    o.add_argument("--override-reason", help="MissionOwner: offer as an audited emergency override")
    add_coordinator_epoch_flag(o)
    o.set_defaults(func=cmd_offer)

    x = _work_item(
        acting_command(work.add_parser("extend", help="add candidates to an open offer (Coordinator)"))
    )
    _offer_flags(x)
    x.add_argument(
        "--offer", type=id_value, help="the offer extended (default: the WorkItem's only open offer)"
    )
    add_expiry_flags(x, "the offer", required=False)
    add_coordinator_epoch_flag(x)
    x.set_defaults(func=cmd_extend)

    ar = _work_item(
        acting_command(
            work.add_parser("accept-result", help="accept the submitted result: verified (Coordinator)")
        )
    )
    _evidence_flags(ar, passing=True)
    ar.add_argument("--submission", help="the submission accepted (default: the latest)")
    ar.add_argument("--comment")
    add_coordinator_epoch_flag(ar)
    ar.set_defaults(func=cmd_accept_result)

    ev = _work_item(
        acting_command(
            work.add_parser("evidence", help="record review Evidence on a submission (reviewer, Coordinator)")
        )
    )
    _evidence_flags(ev, passing=True, failing=True)
    ev.add_argument("--submission", help="the submission reviewed (default: the latest)")
    add_coordinator_epoch_flag(ev)
    ev.set_defaults(func=cmd_evidence)

    for name, func, text in (
        (
            "request-changes",
            cmd_request_changes,
            "reject the submission with Evidence and offer the work again (Coordinator)",
        ),
        ("reject", cmd_reject, "reject the submission with Evidence: the WorkItem fails (Coordinator)"),
    ):
        r = _work_item(acting_command(work.add_parser(name, help=text)))
        _evidence_flags(r, failing=True, required=True)
        r.add_argument("--reason", help="a short factual reason (default: the criteria not met)")
        r.add_argument("--submission", help="the submission rejected (default: the latest)")
        if func is cmd_request_changes:
            _offer_flags(r, required=False)
            add_expiry_flags(r, "the new offer", required=False)
        add_coordinator_epoch_flag(r)
        r.set_defaults(func=func)

    f = _work_item(
        acting_command(
            work.add_parser(
                "fail", help="report a failure with Evidence (Coordinator, or the owner under its lease)"
            )
        )
    )
    f.add_argument("--reason", required=True, help="a short factual reason")
    f.add_argument("--kind", choices=list(FAILURE_KINDS), default="permanent")
    _evidence_flags(f, failing=True)
    f.add_argument(
        "--usage",
        action="append",
        type=cap,
        metavar="DIMENSION=VALUE",
        help="the owner: usage since its last report",
    )
    add_coordinator_epoch_flag(f)
    f.set_defaults(func=cmd_fail)

    c = _work_item(
        acting_command(work.add_parser("cancel", help="cancel an unfinished WorkItem (Coordinator)"))
    )
    c.add_argument("--reason", required=True)
    add_coordinator_epoch_flag(c)
    c.set_defaults(func=cmd_cancel)

    u = _work_item(
        acting_command(work.add_parser("unblock", help="resolve a blocked WorkItem's blockers (Coordinator)"))
    )
    u.add_argument("--resolution", required=True, help="how the blockers were resolved")
    u.add_argument(
        "--blocker", action="append", help="a blocker id resolved (repeatable; every blocker ends either way)"
    )
    add_coordinator_epoch_flag(u)
    u.set_defaults(func=cmd_unblock)

    ac = _work_item(acting_command(work.add_parser("accept", help="accept an offer made to you (Worker)")))
    ac.add_argument("--offer", type=id_value, help="the offer (default: the open offer naming you)")
    ac.set_defaults(func=cmd_accept)

    de = _work_item(acting_command(work.add_parser("decline", help="decline an offer made to you (Worker)")))
    de.add_argument("--offer", type=id_value, help="the offer (default: the open offer naming you)")
    de.add_argument("--reason", choices=list(DECLINE_REASONS), required=True)
    de.add_argument("--code", help="with --reason other: a namespaced code, e.g. com.example/maintenance")
    de.add_argument("--detail", help="a short factual detail")
    de.set_defaults(func=cmd_decline)

    st = _work_item(
        acting_command(work.add_parser("start", help="start a WorkItem you own: an execution lease (Worker)"))
    )
    st.add_argument("--lease-id", type=id_value, help="the lease's id (default: derived by the Authority)")
    st.add_argument("--lease-seconds", type=natural, help="requested lease length (capped by the contract)")
    st.set_defaults(func=cmd_start)

    rn = _work_item(
        acting_command(work.add_parser("renew", help="renew your execution lease, reporting usage (Worker)"))
    )
    rn.add_argument("--lease-seconds", type=natural, help="requested extension (capped by the contract)")
    rn.add_argument(
        "--usage", action="append", type=cap, metavar="DIMENSION=VALUE", help="usage since the last report"
    )
    rn.set_defaults(func=cmd_renew)

    sb = _work_item(
        acting_command(
            work.add_parser("submit", help="submit Artifacts with Evidence per criterion (Worker)")
        )
    )
    sb.add_argument(
        "--artifact",
        action="append",
        type=artifact_ref,
        required=True,
        metavar="blake3:HEX:SIZE",
        help="a result Artifact, stored with its manifest first (mwp artifact put --manifest-for ...)",
    )
    _evidence_flags(sb, passing=True)
    sb.add_argument("--summary", help="a short factual summary for the reviewer")
    sb.add_argument(
        "--usage", action="append", type=cap, metavar="DIMENSION=VALUE", help="usage since the last report"
    )
    sb.set_defaults(func=cmd_submit)

    bl = _work_item(
        acting_command(work.add_parser("block", help="checkpoint and block on what the work needs (Worker)"))
    )
    bl.add_argument("--needs", required=True, help="the resolution required to continue")
    bl.add_argument("--kind", choices=list(BLOCKER_KINDS), default="information")
    bl.add_argument("--description", help="what blocks the work (default: what it needs)")
    bl.add_argument("--blocker-id", type=id_value, help="the blocker's id (default: a new one)")
    bl.add_argument(
        "--usage", action="append", type=cap, metavar="DIMENSION=VALUE", help="usage since the last report"
    )
    bl.set_defaults(func=cmd_block)

    t = reading_command(work.add_parser("tree", help="the WorkItem DAG: states, dependencies, owners"))
    t.set_defaults(func=cmd_tree)
