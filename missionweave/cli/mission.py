"""``mwp mission ...``: create, show and drive a Mission through its lifecycle (spec 7.1, 7.3)."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from missionweave.cli.common import (
    GroupState,
    acting,
    acting_command,
    add_actor_flags,
    add_coordinator_epoch_flag,
    add_json_flag,
    coordinator_epoch,
    emit,
    enum_label,
    first_event,
    mission_of,
    reading,
    reading_command,
    relative,
    report,
    require,
    when,
)
from missionweave.cli.mission_answers import cmd_approve, cmd_request_changes
from missionweave.cli.mission_definition import add_definition_flags, definition_from_args, renewal_policy
from missionweave.cli.progress import add_progress_parser
from missionweave.kernel import ids
from missionweave.v1 import common_pb2, conversation_pb2, membership_pb2, mission_pb2

_DIGEST = re.compile(r"^(blake3|sha256):([0-9a-f]{64})(?::(\d+))?$")

# ------------------------------------------------------------------ views (shared with `coordinator summary`)


def mission_view(state: GroupState) -> dict[str, Any]:
    """The facts `mission show` prints, as a JSON-ready dict (the --json document)."""
    m = mission_of(state)
    lease = m.coordinator
    return {
        "group_id": state.group_id,
        "head_sequence": state.head_sequence,
        "mission_id": m.mission_id,
        "kind": enum_label(mission_pb2.MissionKind, m.kind, "MISSION_KIND_"),
        "title": m.definition.title,
        "state": enum_label(mission_pb2.MissionState, m.state, "MISSION_STATE_"),
        "revision": m.revision,
        "owner_id": m.definition.owner_id,
        "coordinator": {
            "agent_id": lease.agent_id,
            "coordinator_epoch": lease.coordinator_epoch,
            "expires_at": when(lease.expires_at),
            "reconciled": lease.reconciled,
        },
        "latest_submission_event_id": m.latest_submission_event_id,
        "approval_event_id": m.approval_event_id,
        "approval_revoked": bool(m.approval_revoked_event_id),
        "approval_revoked_event_id": m.approval_revoked_event_id,
        "follows_up_mission_id": m.follows_up_mission_id,
        "follow_up_mission_ids": list(m.follow_up_mission_ids),
        "parent_group_id": m.parent_group_id,
        "parent_work_item_id": m.parent_work_item_id,
        "depth": m.depth,
        "root_owner_id": m.root_owner_id,
        "conversations": [
            {
                "conversation_id": c.conversation_id,
                "kind": enum_label(conversation_pb2.ConversationKind, c.kind, "CONVERSATION_KIND_"),
                "title": c.title,
                "message_count": c.message_count,
                "work_item_id": c.work_item_id,
                "participant_ids": list(c.participant_ids),
            }
            for c in state.conversations
        ],
        "memberships": [
            {
                "member_id": ms.member_id,
                "role": enum_label(membership_pb2.MemberRole, ms.role, "MEMBER_ROLE_"),
                "membership_epoch": ms.membership_epoch,
                "active": ms.active,
                "provisional": ms.provisional,
            }
            for ms in state.memberships
        ],
    }


def _lease_line(state: GroupState) -> str:
    lease = mission_of(state).coordinator
    reconciled = "reconciled" if lease.reconciled else "NOT reconciled"
    expiry = f"{when(lease.expires_at)} ({relative(lease.expires_at)})"
    return f"{lease.agent_id}, epoch {lease.coordinator_epoch}, lease expires {expiry}, {reconciled}"


def render_mission(state: GroupState) -> list[str]:
    """`mission show`'s human output."""
    v = mission_view(state)
    revoked = f"yes ({v['approval_revoked_event_id']})" if v["approval_revoked"] else "no"
    rows = [
        ("group", f"{v['group_id']} (head sequence {v['head_sequence']})"),
        ("state", v["state"]),
        ("revision", str(v["revision"])),
        ("owner", v["owner_id"]),
        ("coordinator", _lease_line(state)),
        ("submission", v["latest_submission_event_id"] or "none"),
        ("approval", v["approval_event_id"] or "none"),
        ("revoked", revoked),
        ("follow-ups", ", ".join(v["follow_up_mission_ids"]) or "none"),
    ]
    if v["follows_up_mission_id"]:
        rows.append(("follows up", v["follows_up_mission_id"]))
    if v["parent_group_id"]:
        rows.append(
            (
                "child of",
                f"{v['parent_work_item_id']} in {v['parent_group_id']} (depth {v['depth']}, root owner {v['root_owner_id']})",
            )
        )
    lines = [f"Mission {v['mission_id']}: {v['title']!r} ({v['kind']})"]
    lines += [f"  {label:<13}{value}" for label, value in rows]
    lines.append("Conversations")
    for c in v["conversations"]:
        extra = f"  participants: {', '.join(c['participant_ids'])}" if c["participant_ids"] else ""
        count = f"{c['message_count']} message" + ("" if c["message_count"] == 1 else "s")
        lines.append(f"  {c['conversation_id']}  {c['kind']}  {c['title']!r}  {count}{extra}")
    lines.append("Memberships")
    for ms in v["memberships"]:
        status = "active" if ms["active"] else "ended"
        lines.append(f"  {ms['member_id']:<20} {ms['role']:<15} epoch {ms['membership_epoch']}  {status}")
    return lines


def artifact_ref(text: str) -> common_pb2.ArtifactRef:
    """``blake3:<64 hex>[:<size bytes>]`` -> ArtifactRef (an argparse type: bad input exits 2)."""
    match = _DIGEST.match(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not ALGORITHM:HEX[:SIZE] with a 64-character hex digest"
        )
    algorithm, hex_digest, size = match.groups()
    return common_pb2.ArtifactRef(
        digest=common_pb2.Digest(algorithm=algorithm, hex=hex_digest, size_bytes=int(size or 0))
    )


def json_object(text: str) -> str:
    """An argparse type: the text must be a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON: {err}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return text


# ------------------------------------------------------------------ commands


async def cmd_show(args: argparse.Namespace) -> int:
    async with reading(args) as mesh:
        state = await mesh.group_state(args.group)
    emit(args, render_mission(state), mission_view(state))
    return 0


async def cmd_create(args: argparse.Namespace) -> int:
    group_id = args.group or ids.new_id("grp")
    body = mission_pb2.MissionCreate(
        definition=definition_from_args(args, args.owner or args.actor),
        coordinator_id=args.coordinator,
        coordinator_renewal=renewal_policy(args.lease_seconds),
    )
    async with acting(args) as actor:
        result = await actor.execute(group_id, "mission_create", body, creating=True)
    return report(
        args,
        result,
        f"mission created in group {group_id}",
        last_line=group_id,
        extra={"new_group_id": group_id},
    )


async def cmd_submit(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        state = await actor.state(args.group)
        artifacts = list(args.artifact or [])
        for work_item_id in args.artifacts_of or []:
            artifacts += (await actor.mesh.work_item(args.group, work_item_id)).artifacts
        body = mission_pb2.MissionSubmitForApproval(
            coordinator_epoch=coordinator_epoch(args, state),
            mission_revision=args.revision if args.revision is not None else mission_of(state).revision,
            artifacts=list({a.digest.hex: a for a in artifacts}.values()),
            summary=args.summary,
        )
        result = await actor.execute(args.group, "mission_submit_for_approval", body)
    submitted = first_event(result, "mission_submitted")
    submission = submitted.event_id if submitted else ""
    headline = f"submitted mission revision {body.mission_revision} for approval: submission {submission}"
    return report(args, result, headline, last_line=submission, extra={"submission_event_id": submission})


async def cmd_cancel(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        result = await actor.execute(
            args.group, "mission_cancel", mission_pb2.MissionCancel(reason=args.reason)
        )
    return report(args, result, "mission cancelled")


async def cmd_terminate(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        epoch = coordinator_epoch(args, await actor.state(args.group))
        body = mission_pb2.MissionTerminate(coordinator_epoch=epoch, reason=args.reason)
        result = await actor.execute(args.group, "mission_terminate", body)
    return report(args, result, "mission terminated (failed)")


async def cmd_follow_up(args: argparse.Namespace) -> int:
    group_id = args.group or ids.new_id("grp")
    async with acting(args) as actor:
        approved = mission_of(await actor.state(args.approved_group))
        body = mission_pb2.MissionCreateFollowUp(
            approved_mission_id=approved.mission_id,
            approved_group_id=args.approved_group,
            definition=definition_from_args(args, args.owner or approved.definition.owner_id),
            coordinator_id=args.coordinator,
            coordinator_renewal=renewal_policy(args.lease_seconds),
            reason=args.reason,
        )
        result = await actor.execute(group_id, "mission_create_follow_up", body, creating=True)
    headline = f"follow-up of {approved.mission_id} created in group {group_id}"
    return report(args, result, headline, last_line=group_id, extra={"new_group_id": group_id})


async def cmd_revoke_approval(args: argparse.Namespace) -> int:
    async with acting(args) as actor:
        approval = args.approval or require(
            mission_of(await actor.state(args.group)).approval_event_id,
            "the Mission has no approval",
            "--approval",
        )
        follow_up = mission_of(await actor.state(args.follow_up_group))
        body = mission_pb2.MissionRevokeApproval(
            approval_event_id=approval,
            reason=args.reason,
            follow_up_mission_id=follow_up.mission_id,
            follow_up_group_id=args.follow_up_group,
        )
        result = await actor.execute(args.group, "mission_revoke_approval", body)
    headline = f"approval {approval} revoked; remediation continues in {follow_up.mission_id} (the Mission stays approved)"
    return report(args, result, headline)


async def cmd_directive(args: argparse.Namespace) -> int:
    body = mission_pb2.MissionIssueDirective(
        directive=args.directive, parameters_json=args.parameters_json or ""
    )
    async with acting(args) as actor:
        result = await actor.execute(args.group, "mission_issue_directive", body)
    return report(args, result, "directive issued to the Coordinator")


# ------------------------------------------------------------------ parser


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    mis = sub.add_parser("mission", help="Missions: create, show, submit, approve, ...").add_subparsers(
        dest="sub", required=True
    )

    add_progress_parser(mis)
    from missionweave.cli.readmodels import add_mission_list

    add_mission_list(mis)
    from missionweave.cli import subtask  # it builds on this module's definition flags

    subtask.add_parsers(mis)
    from missionweave.cli.review import add_review_parser

    add_review_parser(mis)

    s = reading_command(
        mis.add_parser("show", help="a Mission's state, lease, submission, Conversations and Memberships")
    )
    s.set_defaults(func=cmd_show)

    c = mis.add_parser("create", help="create a root Mission (you are the human owner)")
    add_actor_flags(c)
    add_definition_flags(c)
    c.add_argument("--owner", help="owner id when acting via the control plane")
    c.add_argument("--group", help="group id to use (default: a new one)")
    add_json_flag(c)
    c.set_defaults(func=cmd_create)

    sm = acting_command(mis.add_parser("submit", help="submit the Mission for approval (Coordinator)"))
    sm.add_argument("--artifact", action="append", type=artifact_ref, help="blake3:<hex>:<size> (repeatable)")
    sm.add_argument(
        "--artifacts-of",
        action="append",
        metavar="WORK_ITEM",
        help="every Artifact that WorkItem handed in (repeatable; after the --artifact ones)",
    )
    sm.add_argument("--summary", required=True, help="a non-authoritative summary for the owner")
    sm.add_argument("--revision", type=int, help="the Mission revision submitted (default: the current one)")
    add_coordinator_epoch_flag(sm)
    sm.set_defaults(func=cmd_submit)

    a = acting_command(mis.add_parser("approve", help="approve the latest submission (MissionOwner)"))
    a.add_argument("--submission", help="submission event id (default: the latest submission)")
    a.add_argument("--comment")
    a.set_defaults(func=cmd_approve)

    rc = acting_command(mis.add_parser("request-changes", help="send a submission back (MissionOwner)"))
    rc.add_argument("--changes", required=True, help="what must change")
    rc.add_argument("--submission", help="submission event id (default: the latest submission)")
    rc.set_defaults(func=cmd_request_changes)

    ca = acting_command(mis.add_parser("cancel", help="cancel the Mission (MissionOwner)"))
    ca.add_argument("--reason", required=True)
    ca.set_defaults(func=cmd_cancel)

    t = acting_command(mis.add_parser("terminate", help="terminate the Mission as failed (Coordinator)"))
    t.add_argument("--reason", required=True)
    add_coordinator_epoch_flag(t)
    t.set_defaults(func=cmd_terminate)

    f = mis.add_parser(
        "follow-up", help="create a follow-up Mission linked to an approved one (MissionOwner)"
    )
    add_actor_flags(f)
    f.add_argument("--approved-group", required=True, help="the approved Mission's Group")
    add_definition_flags(f)
    f.add_argument("--reason", default="", help='"correction", "revocation", "remediation" or free text')
    f.add_argument("--owner", help="owner id (default: the approved Mission's owner)")
    f.add_argument("--group", help="the new Group's id (default: a new one)")
    add_json_flag(f)
    f.set_defaults(func=cmd_follow_up)

    rv = acting_command(
        mis.add_parser(
            "revoke-approval", help="record a revocation, remediated by a follow-up (MissionOwner)"
        ),
        "the approved Mission's Group",
    )
    rv.add_argument("--reason", required=True)
    rv.add_argument("--follow-up-group", required=True, help="the follow-up Mission's Group")
    rv.add_argument("--approval", help="approval event id (default: the Mission's approval)")
    rv.set_defaults(func=cmd_revoke_approval)

    d = acting_command(
        mis.add_parser("directive", help="issue a directive to the Coordinator (MissionOwner)")
    )
    d.add_argument("--directive", required=True)
    d.add_argument("--parameters-json", type=json_object, help="structured parameters as a JSON object")
    d.set_defaults(func=cmd_directive)
