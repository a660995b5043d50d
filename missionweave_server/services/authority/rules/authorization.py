"""Authorization as data (issue 14): which Group role may issue which command kind, under which
condition, and whether Organization policy may issue it without a Membership (MW-8-04, D21).

The decider consults ``TABLE`` right after the Membership checks and before the kind's handler: an
actor whose role the row does not name is refused PERMISSION_DENIED (``check`` = ``role``) and
nothing is written. The conditions name what the handler checks beyond the role (epochs, leases,
grants, ownership); they are data for the docs (docs/authorization.md is rendered from here), the
handler remains the one place that checks each of them. Pure: no I/O.

``python -m missionweave_server.services.authority.rules.authorization --markdown`` prints docs/authorization.md.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from missionweave.kernel.errors import Rejected
from missionweave_server.services.authority.rules.common import R, Role, spec_name


class Condition(Enum):
    """What the handler checks beyond the role; the value is the description the docs show."""

    MEMBER = "any active member: a proposal creates no obligation for anyone (MW-9.1-17)"
    PARTICIPANT = (
        "any active member; in a restricted Conversation only its participants, the MissionOwner and "
        "the Coordinator (MW-9-05)"
    )
    MESSAGE_AUTHOR = (
        "the Message's author: a correction, retraction or redaction (a member acting for Organization "
        "policy may also redact and erase)"
    )
    STEWARD_REDACTION = (
        "the MissionOwner or the current Coordinator: a redaction with a policy reason (MW-9.1-21)"
    )
    OWNER_ERASURE = (
        "the MissionOwner: an erasure from history (security redaction, legal deletion) with a reason"
    )
    OWNER = "the MissionOwner"
    OWNER_OF_BOTH = "the MissionOwner of this Mission and of the target Mission"
    EMERGENCY_OVERRIDE = (
        "the MissionOwner's emergency override: `emergency_override` with an `override_reason`, recorded "
        "in the event (audited); the Worker's rules still apply (MW-7.1-14)"
    )
    OWNER_REVIEWS_COORDINATOR_OUTPUT = (
        "the MissionOwner, for a result the Coordinator submitted itself (MW-7.2-11)"
    )
    COORDINATOR_EPOCH = (
        "the current Coordinator epoch with its live lease, from the lease's session, reconciled after "
        "a replacement (MW-7.2-03/06/08)"
    )
    COORDINATOR_EPOCH_UNRECONCILED = (
        "the current Coordinator epoch with its live lease, from the lease's session; reconciliation "
        "not required"
    )
    COORDINATOR_RENEWAL = (
        "the current Coordinator epoch before its lease lapses (renewing binds it to the session)"
    )
    COORDINATOR_REVIEW = (
        "the current Coordinator epoch, never the sole reviewer of its own output (MW-7.2-11)"
    )
    LIVE_COORDINATOR = "the current Coordinator while its lease is live"
    CURRENT_COORDINATOR = "the holder of the current Coordinator lease"
    DELEGATION_GRANT = (
        "a usable delegation grant it holds (`grant_id`): valid now, within its subtree, capabilities, "
        "caps and depth (MW-9.1-03..16)"
    )
    OFFER_CANDIDATE = "a candidate of the open offer"
    WORK_OWNER = "the WorkItem's owner at its current ownership epoch, within its ownership lease"
    WORK_OWNER_UNDER_LEASE = (
        "the WorkItem's owner at its ownership epoch, citing the current execution lease from the "
        "lease's session (MW-11.3-04/05)"
    )
    WORK_OWNER_REPORTING = (
        "the WorkItem's owner at its ownership epoch: citing the current execution lease from the lease's "
        "session while active (MW-11.3-04/05), no lease while queued or blocked (a changed schedule, MW-11.2-01)"
    )
    EXECUTION_APPROVER = "an execution approver the contract names, else one the Mission's risk policy names, else the MissionOwner (OP-14)"
    REVIEWER = "a reviewer member: review Evidence on a submitted WorkItem (MW-13.2-03)"
    ORGANIZATION = (
        "Organization policy (a control-plane identity or an Organization administrator), without a "
        "Membership (membership epoch 0) or with one (MW-8-04)"
    )
    NAMED_OWNER = "the human MissionOwner the definition names (MW-7.1-02)"
    SAME_OWNER = "the human MissionOwner of the approved Mission"
    PARENT_COORDINATOR = (
        "the parent Mission's current Coordinator epoch with its live lease, reconciled, naming itself the "
        "child's MissionOwner (MW-14-09); the child stays within the parent WorkItem (MW-14-04)"
    )
    ROOT_OWNER_APPROVAL = (
        "the tree's root MissionOwner (a reviewer of a child Mission), where the child's risk policy requires "
        "its approval before the MissionOwner's (MW-14-10)"
    )

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Rule:
    """Who may issue one command kind. Each role (MemberRole) maps to the conditions under which it
    may (any one suffices); a role that is absent may not."""

    roles: Mapping[int, tuple[Condition, ...]]
    # Organization policy may issue it, with or without a Membership (MW-8-04).
    organization: tuple[Condition, ...] = ()
    # An identity without a Membership: only kinds that create their Group (there is none to join yet).
    outsider: tuple[Condition, ...] = ()
    spec: tuple[str, ...] = ()


C = Condition
OWNER: int = Role.MEMBER_ROLE_MISSION_OWNER
COORD: int = Role.MEMBER_ROLE_COORDINATOR
WORKER: int = Role.MEMBER_ROLE_WORKER
REVIEWER: int = Role.MEMBER_ROLE_REVIEWER
DELEGATE: int = Role.MEMBER_ROLE_WORK_DELEGATE
OBSERVER: int = Role.MEMBER_ROLE_OBSERVER
ROLES = (OWNER, COORD, WORKER, REVIEWER, DELEGATE, OBSERVER)
# Observers hold read access only: they issue nothing.
PARTICIPANTS = (OWNER, COORD, WORKER, REVIEWER, DELEGATE)
# Who may hold ownership of a WorkItem: Workers; work_delegates, which are Workers that may also use
# a grant (a member holds one Membership per Group, so a lead that plans a subtree can still do part
# of it); and the Coordinator for coordination-native and fallback work (MW-7.2-10). Offers go to
# them; only they act as a WorkItem's owner.
EXECUTORS = (WORKER, DELEGATE, COORD)


def _each(roles: tuple[int, ...], *conditions: Condition) -> dict[int, tuple[Condition, ...]]:
    return {role: conditions for role in roles}


def _steering(*spec: str) -> Rule:
    """work.authorize and work.offer: the three sources of the authority to shape work (MW-9.1-01)."""
    return Rule(
        {COORD: (C.COORDINATOR_EPOCH,), OWNER: (C.EMERGENCY_OVERRIDE,), DELEGATE: (C.DELEGATION_GRANT,)},
        spec=(*spec, "MW-9.1-01", "MW-9.1-02", "MW-9.1-03", "MW-9.1-18", "MW-7.1-13", "MW-7.2-03"),
    )


def _under_lease(*spec: str) -> Rule:
    return Rule(_each(EXECUTORS, C.WORK_OWNER_UNDER_LEASE), spec=(*spec, "MW-11.3-04", "MW-11.3-05"))


_OWNER = {OWNER: (C.OWNER,)}
_STEWARDS = {OWNER: (C.OWNER,), COORD: (C.LIVE_COORDINATOR,)}

TABLE: Mapping[str, Rule] = {
    # ------------------------------------------------------------ mission.* (spec 7)
    "mission_create": Rule({}, (C.ORGANIZATION,), (C.NAMED_OWNER,), ("MW-7.1-T01", "MW-7.1-02", "MW-8-04")),
    "mission_create_follow_up": Rule({}, outsider=(C.SAME_OWNER,), spec=("MW-7.1-T02", "MW-7.1-08")),
    "mission_create_child": Rule(
        {}, outsider=(C.PARENT_COORDINATOR,), spec=("MW-7.1-T03", "MW-10.2-T15", "MW-14-04", "MW-14-09")
    ),
    "mission_approve_child_depth": Rule(_OWNER, (C.ORGANIZATION,), spec=("MW-14-06",)),
    "mission_submit_for_approval": Rule(
        {COORD: (C.COORDINATOR_EPOCH,)}, spec=("MW-7.1-T04", "MW-7.2-03", "MW-7.3-05")
    ),
    "mission_request_changes": Rule(_OWNER, spec=("MW-7.1-T05", "MW-7.3-06")),
    "mission_approve": Rule(
        {OWNER: (C.OWNER,), REVIEWER: (C.ROOT_OWNER_APPROVAL,)}, spec=("MW-7.1-T06", "MW-7.3-06", "MW-14-10")
    ),
    "mission_revoke_approval": Rule(_OWNER, spec=("MW-7.1-08", "MW-7.1-09")),
    "mission_cancel": Rule(_OWNER, (C.ORGANIZATION,), spec=("MW-7.1-T07", "MW-7.1-11", "MW-8-04")),
    "mission_terminate": Rule(
        {COORD: (C.COORDINATOR_EPOCH_UNRECONCILED,)}, (C.ORGANIZATION,), spec=("MW-7.1-T08", "MW-8-04")
    ),
    "mission_renew_coordinator_lease": Rule(
        {COORD: (C.COORDINATOR_RENEWAL,)}, spec=("MW-7.2-02", "MW-7.2-06")
    ),
    "mission_replace_coordinator": Rule(_OWNER, (C.ORGANIZATION,), spec=("MW-7.2-04", "MW-8-04")),
    "mission_acknowledge_reconciliation": Rule(
        {COORD: (C.COORDINATOR_EPOCH_UNRECONCILED,)}, spec=("MW-7.2-08",)
    ),
    "mission_issue_directive": Rule(_OWNER, spec=("MW-7.1-12",)),
    "mission_authorize_context_transfer": Rule(
        {OWNER: (C.OWNER_OF_BOTH,)}, spec=("MW-13.3-05", "MW-13.3-07")
    ),
    # ------------------------------------------------------------ work.* and approval.* (spec 10, 11)
    "work_propose": Rule(_each(PARTICIPANTS, C.MEMBER), spec=("MW-10.2-T01", "MW-9-13", "MW-9.1-17")),
    "work_authorize": _steering("MW-10.2-T02", "MW-9.1-09"),
    "work_offer": _steering("MW-10.2-T03", "MW-9.1-08", "MW-10.3-04", "MW-7.1-14"),
    "work_accept_offer": Rule(
        _each(EXECUTORS, C.OFFER_CANDIDATE), spec=("MW-10.2-T04", "MW-10.3-05", "MW-7.2-10")
    ),
    "work_decline_offer": Rule(_each(EXECUTORS, C.OFFER_CANDIDATE), spec=("MW-10.3-08", "MW-10.3-09")),
    "approval_grant_execution": Rule(_each((OWNER, REVIEWER), C.EXECUTION_APPROVER), spec=("MW-10.2-T06",)),
    "work_start": Rule(_each(EXECUTORS, C.WORK_OWNER), spec=("MW-10.2-T07", "MW-11.3-02", "MW-11.3-03")),
    "work_renew_lease": _under_lease(),
    "work_checkpoint": _under_lease("MW-10.2-T08"),
    "work_block": _under_lease("MW-10.2-T09", "MW-11.4-04"),
    "work_unblock": Rule({COORD: (C.COORDINATOR_EPOCH,)}, spec=("MW-10.2-T10", "MW-11.4-06")),
    "work_submit": _under_lease("MW-10.2-T11", "MW-13.2-02"),
    "work_accept_result": Rule(
        {COORD: (C.COORDINATOR_REVIEW,), OWNER: (C.OWNER_REVIEWS_COORDINATOR_OUTPUT,)},
        spec=("MW-10.2-T12", "MW-7.2-03", "MW-7.2-11"),
    ),
    "work_fail": Rule(
        {
            WORKER: (C.WORK_OWNER_UNDER_LEASE,),
            DELEGATE: (C.WORK_OWNER_UNDER_LEASE,),
            COORD: (C.COORDINATOR_EPOCH, C.WORK_OWNER_UNDER_LEASE),
        },
        spec=("MW-10.2-T13", "MW-10.2-03", "MW-11.3-04"),
    ),
    "work_cancel": Rule({COORD: (C.COORDINATOR_EPOCH,)}, spec=("MW-10.2-T14",)),
    "work_report_progress": Rule(
        _each(EXECUTORS, C.WORK_OWNER_REPORTING),
        spec=("MW-11.4-01", "MW-11.2-01", "MW-11.3-04", "MW-11.3-05"),
    ),
    "work_publish_artifact": _under_lease("MW-13.1-02"),
    "work_record_evidence": Rule(
        {COORD: (C.COORDINATOR_EPOCH,), REVIEWER: (C.REVIEWER,)}, spec=("MW-13.2-03",)
    ),
    "work_request_preemption": Rule(
        {
            WORKER: (C.WORK_OWNER_UNDER_LEASE,),
            DELEGATE: (C.WORK_OWNER_UNDER_LEASE,),
            COORD: (C.COORDINATOR_EPOCH, C.WORK_OWNER_UNDER_LEASE),
        },
        spec=("MW-11.3-12",),
    ),
    # ------------------------------------------------------------ membership.* (spec 8, 9.1)
    "membership_grant": Rule(_STEWARDS, spec=("MW-8-01", "MW-8-06")),
    "membership_revoke": Rule(_STEWARDS, spec=("MW-8-03",)),
    "membership_grant_delegation": Rule({COORD: (C.COORDINATOR_EPOCH,)}, spec=("MW-9.1-04", "MW-9.1-05")),
    "membership_revoke_delegation": Rule(_STEWARDS),  # an explicit early end; the spec names none
    # ------------------------------------------------------------ message.* (spec 9)
    "message_post": Rule(_each(PARTICIPANTS, C.PARTICIPANT), spec=("MW-9-13", "MW-9-05", "MW-9-10")),
    "message_amend": Rule(
        {
            **_each((WORKER, REVIEWER, DELEGATE), C.MESSAGE_AUTHOR),
            COORD: (C.MESSAGE_AUTHOR, C.STEWARD_REDACTION),
            OWNER: (C.MESSAGE_AUTHOR, C.STEWARD_REDACTION, C.OWNER_ERASURE),
        },
        spec=("MW-9.1-19", "MW-9.1-20", "MW-9.1-21", "MW-7.4-04"),
    ),
    "conversation_open": Rule(
        {OWNER: (C.OWNER,), COORD: (C.CURRENT_COORDINATOR,)}, spec=("MW-9-03", "MW-9-04")
    ),
}


def role_label(role: int) -> str:
    """``worker`` for MEMBER_ROLE_WORKER."""
    return Role.Name(Role.ValueType(role)).removeprefix("MEMBER_ROLE_").lower()


def may_issue(body: str, role: int) -> bool:
    """Whether a member of ``role`` may issue the kind (its handler still checks the condition)."""
    return role in TABLE[body].roles


def may_act_for_organization(body: str) -> bool:
    """Whether Organization policy may issue the kind, also without a Membership (MW-8-04)."""
    return bool(TABLE[body].organization)


def check_role(body: str, role: int, *, organization: bool) -> None:
    """The gate: the actor's role may issue the kind, or the actor acts for Organization policy
    where the row admits it (an administrator holding a Membership keeps that authority)."""
    rule = TABLE[body]
    if role in rule.roles or (organization and rule.organization):
        return
    name, label = spec_name(body), role_label(role)
    allowed = [role_label(r) for r in ROLES if r in rule.roles] + (
        ["Organization policy"] if rule.organization else []
    )
    raise Rejected(
        R.REJECTION_REASON_PERMISSION_DENIED,
        f"a {label} may not issue {name}; it is issued by: {', '.join(allowed) or 'no member'} (docs/authorization.md)",
        check="role",
        role=label,
        command=name,
    )


# ---------------------------------------------------------------- docs/authorization.md

_HEADER = """\
# Authorization: which role may issue which command

<!-- Generated from missionweave_server/services/authority/rules/authorization.py by
`python -m missionweave_server.services.authority.rules.authorization --markdown > docs/authorization.md`;
tests/test_core_authorization.py fails when this file and the table differ. -->

Every Group-scoped command passes, in this order: the Membership checks (a current Membership
epoch, MW-8-02/03; a provisional Membership answers its offer only, MW-8-06), then this table (a
role it does not name is refused `PERMISSION_DENIED` with metadata `check` = `role`, `role` and
`command`, before anything else is looked at), then the kind's own rules, which check the
condition named in the cell (epochs, leases, grants, ownership, candidates) with their own
rejection reasons. Organization policy (a control-plane identity or an Organization administrator)
issues the kinds of its column without a Membership, with membership epoch 0 (MW-8-04, D21); any
other identity without a Membership is refused `NOT_A_MEMBER`. The kinds that create their Group
have no members yet: the column "no Membership" says who creates it.

Observers hold read access only and issue nothing. Only Workers, and the Coordinator for
coordination-native and fallback work (MW-7.2-10), are offered work and act as a WorkItem's owner;
`work.offer` refuses candidates whose role could not accept. A Message carries no authority
(MW-9-10): acting on one takes the command it describes, issued by a role this table allows.

`tests/test_core_authorization.py` checks every role (and an Organization administrator and a
registered identity without a Membership) against every command kind, in a state where the command
is valid for an allowed actor: each allowed cell is accepted under each of its conditions, every
other cell is refused as above, and each condition, broken once, gives its exact refusal.
"""


def _cell(conditions: tuple[Condition, ...]) -> str:
    return ", ".join(f"`{c.label}`" for c in conditions) if conditions else "-"


def markdown() -> str:
    """docs/authorization.md: the table, then what each condition means."""
    head = ["command", *(role_label(r) for r in ROLES), "Organization policy", "no Membership", "spec"]
    lines = [_HEADER, "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for body, rule in TABLE.items():
        cells = [f"`{spec_name(body)}`", *(_cell(rule.roles.get(r, ())) for r in ROLES)]
        cells += [_cell(rule.organization), _cell(rule.outsider), ", ".join(rule.spec) or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Conditions", "", "| condition | the handler checks |", "|---|---|"]
    lines += [f"| `{c.label}` | {c.value} |" for c in Condition]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m missionweave_server.services.authority.rules.authorization --markdown")
    sys.stdout.write(markdown())
