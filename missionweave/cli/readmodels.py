"""``mwp work list|show``, ``mwp mission list``, ``mwp identity list|show``: the typed read models
(AuthorityService.GetWorkItem / ListWorkItems / ListMissions, MembershipService.ListIdentities /
GetIdentity). Tables by default, one JSON document with --json; every page is fetched."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from missionweave.cli.common import (
    CliError,
    add_json_flag,
    add_reader_flags,
    columns,
    emit,
    enum_label,
    reading,
    reading_command,
    relative,
    to_dict,
    when,
)
from missionweave.sdk.client import MeshClient
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import common_pb2, membership_pb2, mission_pb2, work_pb2

WS = work_pb2.WorkItemState
# --state takes the state's name without its prefix, in lower case: open, offered, queued, ...
STATES = {
    name.removeprefix("WORK_ITEM_STATE_").lower(): number
    for name, number in WS.items()
    if number != WS.WORK_ITEM_STATE_UNSPECIFIED
}


# States a WorkItem revision does not leave (MW-10.2-02): waiting for another one is hopeless.
FINAL = frozenset({WS.WORK_ITEM_STATE_VERIFIED, WS.WORK_ITEM_STATE_CANCELLED})
WAIT_POLL_S = 0.5


def _state(value: int) -> str:
    return enum_label(WS, value, "WORK_ITEM_STATE_")


def _kind(value: int) -> str:
    return enum_label(common_pb2.IdentityKind, value, "IDENTITY_KIND_").lower().replace("_", "-")


def _used(used: common_pb2.ResourceVector, limit: common_pb2.ResourceVector) -> str:
    return f"tokens {used.tokens}/{limit.tokens}, tool calls {used.tool_calls}/{limit.tool_calls}"


# ------------------------------------------------------------------ work


def work_row(item: work_pb2.WorkItem) -> list[str]:
    lease = item.lease.lease_id if item.HasField("lease") else "-"
    return [
        item.work_item_id,
        _state(item.state),
        item.ownership.agent_id or "-",
        str(item.ownership_epoch),
        lease,
        str(item.attempts),
        item.title,
    ]


async def cmd_work_list(args: argparse.Namespace) -> int:
    state = STATES[args.state] if args.state else 0
    async with reading(args) as mesh:
        items = await mesh.work_items(args.group, state=state)
    rows = [
        ["WORK ITEM", "STATE", "OWNER", "EPOCH", "LEASE", "ATTEMPTS", "TITLE"],
        *(work_row(i) for i in items),
    ]
    which = f" in state {args.state}" if args.state else ""
    lines = [
        f"{len(items)} WorkItem{'' if len(items) == 1 else 's'} of {args.group}{which}",
        *columns(rows, "  "),
    ]
    emit(args, lines, {"group_id": args.group, "work_items": [to_dict(i) for i in items]})
    return 0


def render_work_item(item: work_pb2.WorkItem) -> list[str]:
    rows: list[tuple[str, str]] = [
        ("state", _state(item.state)),
        ("revision", f"{item.revision} (contract revision {item.contract.revision})"),
        ("group", f"{item.group_id} (Mission {item.mission_id})"),
        ("conversation", item.conversation_id or "-"),
        ("depends on", ", ".join(item.contract.depends_on_work_item_ids) or "-"),
        ("dependencies", "satisfied" if item.dependencies_satisfied else "NOT satisfied"),
        ("epoch", f"{item.ownership_epoch} (highest ownership epoch granted)"),
    ]
    if item.HasField("ownership"):
        o = item.ownership
        rows.append(
            (
                "owner",
                f"{o.agent_id}, epoch {o.ownership_epoch}, lease expires {when(o.expires_at)} ({relative(o.expires_at)})",
            )
        )
    else:
        rows.append(("owner", "-"))
    if item.HasField("lease"):
        lease = item.lease
        rows.append(
            (
                "lease",
                f"{lease.lease_id} (session {lease.session_epoch}), expires {when(lease.expires_at)} ({relative(lease.expires_at)})",
            )
        )
    else:
        rows.append(("lease", "-"))
    for offer in item.offers:
        rows.append(
            (
                "offer",
                f"{offer.offer_id} to {', '.join(offer.candidate_ids)}, expires {when(offer.expires_at)}",
            )
        )
    rows += [
        ("attempts", str(item.attempts)),
        ("submission", item.submission_event_id or "none"),
        ("evidence", ", ".join(item.evidence_ids) or "none"),
        ("usage", _used(item.usage.budget.used, item.usage.budget.limit)),
    ]
    if item.blockers:
        rows.append(("blocked", "; ".join(b.required_resolution for b in item.blockers)))
    if item.child_mission_id:
        rows.append(("child", item.child_mission_id))
    if item.unresolved_ambiguity_message_ids:
        rows.append(("ambiguities", ", ".join(item.unresolved_ambiguity_message_ids)))
    return [
        f"WorkItem {item.work_item_id}: {item.title!r}",
        *(f"  {label:<14}{value}" for label, value in rows),
    ]


def _digest(ref: common_pb2.ArtifactRef) -> str:
    return f"{ref.digest.algorithm}:{ref.digest.hex}:{ref.digest.size_bytes}"


async def work_records(mesh: MeshClient, group_id: str, work_item_id: str) -> dict[str, list[dict[str, Any]]]:
    """The WorkItem's Artifacts and Evidence records as its events hold them (the read model keeps
    digests and Evidence ids only): what was published, submitted, reviewed, and failure Evidence,
    in log order; each Artifact once, with where it appeared."""
    artifacts: dict[str, dict[str, Any]] = {}
    evidence: list[dict[str, Any]] = []

    def artifact(ref: common_pb2.ArtifactRef, how: str, deliverable: str = "") -> None:
        entry = artifacts.setdefault(
            _digest(ref), {"digest": _digest(ref), "media_type": "", "deliverable_id": "", "appeared": []}
        )
        entry["media_type"] = entry["media_type"] or ref.media_type
        entry["deliverable_id"] = entry["deliverable_id"] or deliverable
        entry["appeared"].append(how)

    def record(e: work_pb2.Evidence, stage: str, event_id: str) -> None:
        evidence.append(
            {
                "evidence_id": e.evidence_id,
                "criterion_id": e.criterion_id,
                "method": enum_label(work_pb2.EvidenceMethod, e.method, "EVIDENCE_METHOD_"),
                "result": enum_label(work_pb2.EvidenceResult, e.result, "EVIDENCE_RESULT_"),
                "producer_id": e.producer_id,
                "summary": e.summary,
                "stage": stage,
                "event_id": event_id,
                "submission_event_id": e.subject.submission_event_id,
                "artifacts": [_digest(a) for a in e.artifacts],
            }
        )

    async for event in mesh.read_events(group_id):
        kind = event.WhichOneof("payload")
        payload: Any = getattr(event, kind) if kind else None
        if payload is None or getattr(payload, "work_item_id", None) != work_item_id:
            continue
        if kind == "artifact_published":
            artifact(payload.artifact, f"published {event.event_id}", payload.deliverable_id)
        elif kind == "work_submitted":
            for ref in payload.artifacts:
                artifact(ref, f"submitted {event.event_id}")
            for e in payload.evidence:
                record(e, "submission", event.event_id)
        elif kind == "evidence_recorded":
            record(payload.evidence, "review", event.event_id)
        elif kind == "work_failed":
            for e in payload.evidence:
                record(e, "failure", event.event_id)
    return {"artifact_records": list(artifacts.values()), "evidence_records": evidence}


def render_records(records: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = ["Artifacts" + ("" if records["artifact_records"] else "  none")]
    for a in records["artifact_records"]:
        extra = [
            x for x in (a["media_type"], a["deliverable_id"] and f"deliverable {a['deliverable_id']}") if x
        ]
        lines.append(f"  {a['digest']}  {'  '.join([*extra, ', '.join(a['appeared'])])}")
    lines.append("Evidence" + ("" if records["evidence_records"] else "  none"))
    rows = [["ID", "CRITERION", "METHOD", "RESULT", "BY", "STAGE", "SUMMARY"]]
    rows += [
        [
            e["evidence_id"],
            e["criterion_id"] or "-",
            e["method"],
            e["result"],
            e["producer_id"],
            e["stage"],
            e["summary"],
        ]
        for e in records["evidence_records"]
    ]
    return lines + (columns(rows, "  ") if records["evidence_records"] else [])


async def cmd_work_show(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        item = await mesh.work_item(args.group, args.work_item)
        records = await work_records(mesh, args.group, args.work_item)
    emit(args, [*render_work_item(item), *render_records(records)], to_dict(item) | records)
    return 0


async def cmd_work_wait(args: argparse.Namespace) -> int:
    """Polls the WorkItem until it is in one of ``--state``; a script's step between commands."""
    wanted = {STATES[s] for s in args.state}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.within
    async with reading(args) as mesh:
        while True:
            item = await mesh.work_item(args.group, args.work_item)
            if item.state in wanted:
                break
            if item.state in FINAL or loop.time() >= deadline:
                why = "it will not change any more" if item.state in FINAL else f"after {args.within:g} s"
                raise CliError(
                    f"{args.work_item} is {_state(item.state).lower()}, not {' or '.join(args.state)}: {why}"
                )
            await asyncio.sleep(WAIT_POLL_S)
    emit(args, [f"{args.work_item} is {_state(item.state).lower()}"], to_dict(item))
    return 0


# ------------------------------------------------------------------ missions


def mission_document(m: apb.MissionSummary) -> dict[str, Any]:
    return to_dict(m) | {
        "state": enum_label(mission_pb2.MissionState, m.state, "MISSION_STATE_"),
        "kind": enum_label(mission_pb2.MissionKind, m.kind, "MISSION_KIND_"),
    }


async def cmd_mission_list(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        missions = await mesh.missions()
    rows = [["GROUP", "MISSION", "STATE", "OWNER", "COORDINATOR", "DEADLINE", "USAGE", "TITLE"]]
    for m in missions:
        deadline = when(m.deadline) if m.HasField("deadline") else "-"
        rows.append(
            [
                m.group_id,
                m.mission_id,
                enum_label(mission_pb2.MissionState, m.state, "MISSION_STATE_"),
                m.owner_id,
                m.coordinator_id or "-",
                deadline,
                _used(m.used, m.budget),
                m.title,
            ]
        )
    lines = [
        f"{len(missions)} Mission{'' if len(missions) == 1 else 's'} visible to {args.actor}",
        *columns(rows, "  "),
    ]
    emit(args, lines, {"missions": [mission_document(m) for m in missions]})
    return 0


# ------------------------------------------------------------------ identities


def identity_document(i: membership_pb2.Identity) -> dict[str, Any]:
    return {
        "identity_id": i.identity_id,
        "kind": _kind(i.kind),
        "display_name": i.display_name,
        "public_key": i.public_key.hex(),
        "org_admin": i.org_admin,
        "session_epoch": i.session_epoch,
        "registered_at": when(i.registered_at),
    }


async def cmd_identity_list(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        identities = await mesh.identities()
    rows = [["IDENTITY", "KIND", "ADMIN", "SESSION", "REGISTERED", "NAME"]]
    for i in identities:
        rows.append(
            [
                i.identity_id,
                _kind(i.kind),
                "yes" if i.org_admin else "no",
                str(i.session_epoch),
                when(i.registered_at),
                i.display_name,
            ]
        )
    lines = [f"{len(identities)} identit{'y' if len(identities) == 1 else 'ies'}", *columns(rows, "  ")]
    emit(args, lines, {"identities": [identity_document(i) for i in identities]})
    return 0


async def cmd_identity_show(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        identity = await mesh.identity(args.identity_id)
    d = identity_document(identity)
    lines = [f"Identity {d['identity_id']}", *(f"  {k:<15}{v}" for k, v in d.items() if k != "identity_id")]
    emit(args, lines, d)
    return 0


# ------------------------------------------------------------------ parsers


def register_work(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    """``mwp work list|show``; returns ``mwp work``'s subcommands, which cli/work/ completes."""
    work = sub.add_parser(
        "work", help="WorkItems: authorize, offer, review, ..., list, show, tree"
    ).add_subparsers(dest="sub", required=True)
    ls = reading_command(work.add_parser("list", help="a Group's WorkItems: state, owner, epoch, lease"))
    ls.add_argument("--state", choices=list(STATES), help="only WorkItems in this state")
    ls.set_defaults(func=cmd_work_list)
    sh = reading_command(
        work.add_parser("show", help="one WorkItem: ownership, lease, submission, usage, Artifacts, Evidence")
    )
    sh.add_argument("work_item", metavar="WORK_ITEM")
    sh.set_defaults(func=cmd_work_show)
    wt = reading_command(
        work.add_parser("wait", help="wait until a WorkItem reaches a state (exit 1 if it cannot or in time)")
    )
    wt.add_argument("work_item", metavar="WORK_ITEM")
    wt.add_argument(
        "--state",
        action="append",
        choices=list(STATES),
        required=True,
        help="a state to wait for (repeatable)",
    )
    wt.add_argument(
        "--within", type=float, default=300.0, metavar="SECONDS", help="give up after this long (default 300)"
    )
    wt.set_defaults(func=cmd_work_wait)
    return work


def add_mission_list(mis: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ls = mis.add_parser("list", help="the Missions you may see (an operator: all)")
    add_json_flag(ls)
    add_reader_flags(ls)
    ls.set_defaults(func=cmd_mission_list)


def add_identity_commands(ident: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ls = ident.add_parser("list", help="every registered identity (operators only)")
    add_json_flag(ls)
    add_reader_flags(ls)
    ls.set_defaults(func=cmd_identity_list)
    sh = ident.add_parser("show", help="one identity: kind, key, session epoch")
    sh.add_argument("identity_id", metavar="ID")
    add_json_flag(sh)
    add_reader_flags(sh)
    sh.set_defaults(func=cmd_identity_show)
