"""Mission creation (MW-7.1-T01, T02): root and follow-up Missions, and ``open_mission``, which
child Missions (rules/children.py) are opened with too."""

from __future__ import annotations

from missionweave.kernel import ids
from missionweave.kernel.clock import from_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, conversation_pb2, event_pb2, mission_pb2
from missionweave_server.services.authority.rules.common import (
    MS,
    CommandKind,
    DecisionContext,
    Emitter,
    Kind,
    R,
    Role,
    identity,
    invalid,
    is_org_policy,
    renewal,
    state_name,
    validate_definition,
)
from missionweave_server.services.authority.rules.missions.common import grant_full_membership, linked_mission
from missionweave_server.services.authority.rules.missions.coordinator import grant_lease, lease_granted
from missionweave_server.services.authority.state import GroupState, IdentityInfo, MissionRecord


def open_mission(
    command: command_pb2.Command,
    ctx: DecisionContext,
    out: Emitter,
    definition: mission_pb2.MissionDefinition,
    coordinator_id: str,
    renewal_policy: mission_pb2.RenewalPolicy,
    kind: mission_pb2.MissionKind.ValueType,
    follows_up_mission_id: str = "",
    parent_mission_id: str = "",
    parent_work_item_id: str = "",
) -> None:
    """MW-7.1-03: one Group, one planning Conversation, owner and Coordinator Memberships, lease."""
    coordinator = identity(ctx, coordinator_id, "body.coordinator_id")
    if coordinator.kind not in (Kind.IDENTITY_KIND_AGENT, Kind.IDENTITY_KIND_HUMAN):
        raise invalid("body.coordinator_id", "the Coordinator must be an agent or a human")
    if coordinator_id == definition.owner_id:
        # MW-7.2-11: the owner reviews the Coordinator's submission; one identity cannot be both.
        raise invalid(
            "body.coordinator_id", "the MissionOwner cannot also be the Coordinator (separation of review)"
        )
    duration, renew_before = renewal(renewal_policy)
    mission_id = f"mis_{ids.suffix(command.group_id)}"
    planning_id = ids.derived_id("conv", command.group_id, "planning")
    out.emit(
        "mission.created",
        "mission_created",
        mission_pb2.MissionCreated(
            mission_id=mission_id,
            kind=kind,
            definition=definition,
            planning_conversation_id=planning_id,
            follows_up_mission_id=follows_up_mission_id,
            parent_mission_id=parent_mission_id,
            parent_work_item_id=parent_work_item_id,
        ),
    )
    out.emit(
        "conversation.opened",
        "conversation_opened",
        conversation_pb2.ConversationOpened(
            conversation_id=planning_id,
            kind=conversation_pb2.CONVERSATION_KIND_PLANNING,
            title=definition.title,
        ),
    )
    # MW-8-05: owner and Coordinator see the whole Group (visibility from sequence 1).
    for epoch, (member_id, role) in enumerate(
        (
            (definition.owner_id, Role.MEMBER_ROLE_MISSION_OWNER),
            (coordinator_id, Role.MEMBER_ROLE_COORDINATOR),
        ),
        start=1,
    ):
        grant_full_membership(out, command.group_id, member_id, role, epoch)
    grant_lease(out, command, ctx, coordinator_id, coordinator, 1, duration, renew_before, reconciled=True)


def _require_human_owner(ctx: DecisionContext, owner_id: str) -> IdentityInfo:
    owner = identity(ctx, owner_id, "body.definition.owner_id")
    if owner.kind != Kind.IDENTITY_KIND_HUMAN:
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT,
            "the MissionOwner of a root Mission must be a human identity (MW-7.1-02)",
            field="body.definition.owner_id",
        )
    return owner


def mission_create(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-T01: a root Mission with one Group, one planning Conversation and a Coordinator lease."""
    body = command.mission_create
    definition = body.definition
    validate_definition(definition, ctx)
    _require_human_owner(ctx, definition.owner_id)
    identity(ctx, command.actor_id, "actor_id")
    if command.actor_id != definition.owner_id and not is_org_policy(ctx, command.actor_id):
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            "mission.create is issued by the human MissionOwner or the Organization control plane (MW-7.1-T01)",
        )
    open_mission(
        command,
        ctx,
        out,
        definition,
        body.coordinator_id,
        body.coordinator_renewal,
        mission_pb2.MISSION_KIND_ROOT,
    )


def mission_create_follow_up(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-7.1-T02 / MW-7.1-08: a new Group linked to an approved Mission, by the same human owner."""
    body = command.mission_create_follow_up
    approved = linked_mission(ctx, body.approved_group_id, body.approved_mission_id, "body.approved_group_id")
    if approved.state != MS.MISSION_STATE_APPROVED:
        raise Rejected(
            R.REJECTION_REASON_PRECONDITION_FAILED,
            f"a follow-up links to an approved Mission; {approved.mission_id} is {state_name(approved.state)}",
        )
    definition = body.definition
    validate_definition(definition, ctx)
    _require_human_owner(ctx, definition.owner_id)
    if definition.owner_id != approved.owner_id:
        raise invalid(
            "body.definition.owner_id", f"a follow-up keeps the MissionOwner {approved.owner_id} (MW-7.1-T02)"
        )
    if command.actor_id != approved.owner_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"mission.create_follow_up is issued by the same human MissionOwner {approved.owner_id} (MW-7.1-T02)",
        )
    open_mission(
        command,
        ctx,
        out,
        definition,
        body.coordinator_id,
        body.coordinator_renewal,
        mission_pb2.MISSION_KIND_FOLLOW_UP,
        follows_up_mission_id=approved.mission_id,
    )


# ---------------------------------------------------------------- evolve rules


def _created(state: GroupState, event: event_pb2.Event) -> None:
    p = event.mission_created
    state.mission = MissionRecord(
        mission_id=p.mission_id,
        kind=p.kind,
        definition=p.definition,
        state=MS.MISSION_STATE_ACTIVE,
        revision=1,
        planning_conversation_id=p.planning_conversation_id,
        created_at=from_timestamp(event.recorded_at),
        follows_up_mission_id=p.follows_up_mission_id,
        parent_mission_id=p.parent_mission_id,
        parent_work_item_id=p.parent_work_item_id,
        root_owner_id=p.definition.owner_id,  # a child's is set by its mission.parent.linked
    )


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "mission_create",
        mission_create,
        {"mission_created": _created, "coordinator_lease_granted": lease_granted},
        creates_group=True,
        references=lambda c: (c.mission_create.definition.owner_id, c.mission_create.coordinator_id),
    ),
    CommandKind(
        "mission_create_follow_up",
        mission_create_follow_up,
        creates_group=True,
        references=lambda c: (
            c.mission_create_follow_up.definition.owner_id,
            c.mission_create_follow_up.coordinator_id,
        ),
        linked_groups=lambda c: (c.mission_create_follow_up.approved_group_id,),
    ),
)
