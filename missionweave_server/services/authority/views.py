"""Read models: the folded GroupState as the public missionweave.v1.GroupState message, and a
WorkItem as missionweave.v1.WorkItem."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import authority_service_pb2 as pb
from missionweave.v1 import common_pb2, conversation_pb2, membership_pb2, mission_pb2, work_pb2
from missionweave_server.services.authority.rules.delegation import invalidity, remaining
from missionweave_server.services.authority.rules.work.contract import dependencies_satisfied
from missionweave_server.services.authority.rules.work.start import approval_in_force
from missionweave_server.services.authority.state import SIX, GrantState, GroupState, WorkItemState
from missionweave_server.services.authority.visibility import sees_conversation, sees_grant, sees_work_item


def group_state_proto(state: GroupState, viewer: str | None = None) -> pb.GroupState:
    """The whole state, or (``viewer`` named) what that member may see of it (D124): the Mission and
    the Memberships, the Conversations (MW-9-05) and delegation grants it sees, and in a grant's
    accounting only the WorkItems it sees (MW-8-07)."""
    out = pb.GroupState(
        group_id=state.group_id,
        head_sequence=state.head_sequence,
        last_work_change_sequence=state.last_work_change_sequence,
    )
    m = state.mission
    if m is not None:
        mission = mission_pb2.Mission(
            mission_id=m.mission_id,
            group_id=state.group_id,
            kind=m.kind,  # type: ignore[arg-type]
            definition=m.definition,
            state=m.state,  # type: ignore[arg-type]
            revision=m.revision,
            follows_up_mission_id=m.follows_up_mission_id,
            parent_mission_id=m.parent_mission_id,
            parent_work_item_id=m.parent_work_item_id,
            planning_conversation_id=m.planning_conversation_id,
            created_at=to_timestamp(m.created_at),
            latest_submission_event_id=m.latest_submission_event_id,
            approval_event_id=m.approval_event_id,
            approval_revoked_event_id=m.approval_revoked_event_id,
            follow_up_mission_ids=m.follow_up_mission_ids,
            parent_group_id=m.parent_group_id,
            root_owner_id=m.root_owner_id,
            depth=m.depth,
            mandatory=m.mandatory,
            root_owner_approval_event_id=m.root_owner_approval_event_id,
        )
        mission.budget.limit.CopyFrom(m.definition.budget)
        if m.coordinator is not None:
            c = m.coordinator
            lease = mission.coordinator
            lease.agent_id = c.agent_id
            lease.coordinator_epoch = c.coordinator_epoch
            lease.session_epoch = c.session_epoch
            lease.expires_at.CopyFrom(to_timestamp(c.expires_at))
            lease.renewal_policy.lease_duration.FromMilliseconds(int(c.lease_duration_s * 1000))
            lease.renewal_policy.renew_before.FromMilliseconds(int(c.renew_before_s * 1000))
            lease.reconciled = c.reconciled
        out.mission.CopyFrom(mission)
    for member in state.members.values():
        ms = membership_pb2.Membership(
            member_id=member.member_id,
            group_id=state.group_id,
            membership_epoch=member.membership_epoch,
            role=member.role,  # type: ignore[arg-type]
            visibility_start_sequence=member.visibility_start_sequence,
            capabilities=[
                membership_pb2.Capability(capability_id=c, version=v) for c, v in member.capabilities
            ],
            provisional=member.provisional,
            active=member.active,
        )
        if member.expires_at is not None:
            ms.expires_at.CopyFrom(to_timestamp(member.expires_at))
        out.memberships.append(ms)
    out.grants.extend(
        grant_status(state, g, viewer) for g in state.grants.values() if sees_grant(state, viewer, g)
    )
    for conv in state.conversations.values():
        if not sees_conversation(state, viewer, conv):
            continue
        out.conversations.append(
            pb.ConversationSummary(
                conversation_id=conv.conversation_id,
                kind=conv.kind,  # type: ignore[arg-type]
                work_item_id=conv.work_item_id,
                message_count=conv.message_count,
                participant_ids=conv.participant_ids,
                title=conv.title,
            )
        )
    return out


def snapshot_view(snapshot: pb.GroupSnapshot, state: GroupState, viewer: str) -> pb.GroupSnapshot | None:
    """``viewer``'s view of a stored snapshot, as GetGroupState and GetMissionProgress decide it now
    (D124, MW-9-05): the Conversations, grants and WorkItems it does not see left out; None when
    nothing is. A Conversation or grant the current state no longer knows is kept only if it is a
    Conversation that is not restricted."""

    def conversation_seen(summary: pb.ConversationSummary) -> bool:
        conversation = state.conversations.get(summary.conversation_id)
        if conversation is None:
            return summary.kind != conversation_pb2.CONVERSATION_KIND_RESTRICTED
        return sees_conversation(state, viewer, conversation)

    def grant_seen(status: pb.DelegationGrantStatus) -> bool:
        grant = state.grants.get(status.grant.grant_id)
        return grant is not None and sees_grant(state, viewer, grant)

    view = pb.GroupSnapshot()
    view.CopyFrom(snapshot)
    _keep(view.state.conversations, conversation_seen)
    _keep(view.state.grants, grant_seen)
    for status in view.state.grants:
        _keep(status.work_item_ids, lambda wid: _sees(state, viewer, wid))
    _keep(view.progress.work_items, lambda row: _sees(state, viewer, row.work_item_id))
    _keep(view.progress.critical_path, lambda wid: _sees(state, viewer, wid))
    return None if view == snapshot else view


def _sees(state: GroupState, viewer: str | None, work_item_id: str) -> bool:
    if viewer is None:
        return True
    item = state.work_items.get(work_item_id)
    return item is not None and sees_work_item(state, viewer, item)


def _keep(items: Any, keep: Callable[[Any], bool]) -> None:
    """Leave in a repeated field only what ``keep`` admits, in order."""
    kept = [i for i in items if keep(i)]
    if len(kept) != len(items):
        del items[:]
        items.extend(kept)


def grant_status(state: GroupState, grant: GrantState, viewer: str | None = None) -> pb.DelegationGrantStatus:
    """A grant as recorded, with its accounting and whether the state still lets it be used (the
    WorkItems charged to it: those ``viewer`` sees)."""
    invalid = invalidity(state, grant, None)
    return pb.DelegationGrantStatus(
        grant=grant.record,
        charged=common_pb2.ResourceVector(currency=grant.currency, **grant.charged),  # type: ignore[arg-type]
        remaining=common_pb2.ResourceVector(currency=grant.currency, **remaining(grant)),  # type: ignore[arg-type]
        work_item_ids=sorted(
            wid
            for wid, grants in state.item_grants.items()
            if grant.grant_id in grants and _sees(state, viewer, wid)
        ),
        invalid_because=invalid[0] if invalid else "",
    )


# Which lease holds an owned WorkItem: the ownership lease while queued, the execution lease while
# active, the blocked lease while blocked (MW-11.3-02/03, MW-11.4-04).
_LEASE_KIND: dict[int, work_pb2.WorkLeaseKind.ValueType] = {
    work_pb2.WORK_ITEM_STATE_ACTIVE: work_pb2.WORK_LEASE_KIND_EXECUTION,
    work_pb2.WORK_ITEM_STATE_BLOCKED: work_pb2.WORK_LEASE_KIND_BLOCKED,
}


def work_item_proto(state: GroupState, item: WorkItemState, now: datetime) -> work_pb2.WorkItem:
    """A WorkItem's read model (missionweave.v1.WorkItem), from the folded state and the Authority's
    clock (whether an execution approval is still in force): fields the fold does not keep
    (proposal_id, granted_at, renewal history, progress, schedule, timestamps) stay unset, as
    work.proto says."""
    mission = state.mission
    out = work_pb2.WorkItem(
        work_item_id=item.work_item_id,
        group_id=state.group_id,
        mission_id=mission.mission_id if mission is not None else "",
        title=item.title,
        state=item.state,  # type: ignore[arg-type]
        revision=item.revision,
        parent_work_item_id=item.parent_work_item_id,
        conversation_id=item.conversation_id,
        ownership_epoch=item.last_ownership_epoch,
        execution_approved=approval_in_force(item, now),
        submission_event_id=item.latest_submission_event_id,
        attempts=item.attempts,
        unresolved_ambiguity_message_ids=sorted(item.open_ambiguities),
        dependencies_satisfied=dependencies_satisfied(state, item),
    )
    if item.contract is not None:
        out.contract.CopyFrom(item.contract)
        out.contract.revision = item.contract_revision
    for offer in item.offers.values():
        if offer.open:
            out.offers.append(
                work_pb2.WorkOfferRecord(
                    offer_id=offer.offer_id,
                    candidate_ids=offer.candidate_ids,
                    expires_at=to_timestamp(offer.expires_at),
                    contract_revision=offer.contract_revision,
                )
            )
    if item.owner is not None:
        owner = item.owner
        out.ownership.CopyFrom(
            work_pb2.OwnershipGrant(
                work_item_id=item.work_item_id,
                agent_id=owner.agent_id,
                ownership_epoch=owner.ownership_epoch,
                start_deadline=to_timestamp(owner.start_deadline),
                lease_kind=_LEASE_KIND.get(item.state, work_pb2.WORK_LEASE_KIND_OWNERSHIP),
                expires_at=to_timestamp(owner.expires_at),
                offer_id=owner.offer_id,
            )
        )
    if item.lease is not None:
        lease = item.lease
        out.lease.CopyFrom(
            work_pb2.ExecutionLease(
                lease_id=lease.lease_id,
                agent_id=lease.agent_id,
                session_epoch=lease.session_epoch,
                work_item_id=item.work_item_id,
                ownership_epoch=lease.ownership_epoch,
                started_at=to_timestamp(lease.started_at),
                expires_at=to_timestamp(lease.expires_at),
                attempt=item.attempts,
            )
        )
    out.blockers.extend(work_pb2.Blocker(required_resolution=r) for r in item.blockers)
    if item.last_checkpoint_id:
        out.latest_checkpoint.checkpoint_id = item.last_checkpoint_id
    out.artifacts.extend(
        common_pb2.ArtifactRef(digest=common_pb2.Digest(algorithm="blake3", hex=hex_, size_bytes=size))
        for hex_, size in dict.fromkeys((*item.published_artifacts, *item.submitted_artifacts))
    )
    out.evidence_ids.extend(
        dict.fromkeys([*item.submitted_evidence_ids, *item.evidence, *item.accepted_evidence_ids])
    )
    budget = out.usage.budget
    if item.contract is not None:
        budget.limit.CopyFrom(item.contract.budget)
    budget.used.currency = budget.limit.currency
    for dim in SIX:
        setattr(budget.used, dim, item.used.get(dim, 0))
    if item.contract is not None and item.contract.cost_policy.HasField("retry_limit"):
        out.usage.retry_used.CopyFrom(
            common_pb2.ResourceVector(currency=budget.limit.currency, **item.retry_used)  # type: ignore[arg-type]
        )
    if item.children:
        out.child_mission_id = item.children[-1].child_mission_id
    return out


def mission_summary(state: GroupState) -> pb.MissionSummary:
    """A Group's Mission as ListMissions shows it (the state must hold a Mission)."""
    m = state.mission
    assert m is not None
    out = pb.MissionSummary(
        group_id=state.group_id,
        mission_id=m.mission_id,
        title=m.definition.title,
        kind=m.kind,  # type: ignore[arg-type]
        state=m.state,  # type: ignore[arg-type]
        owner_id=m.owner_id,
        coordinator_id=m.coordinator.agent_id if m.coordinator is not None else "",
        group_revision=state.head_sequence,
        parent_group_id=m.parent_group_id,
    )
    if m.definition.HasField("deadline"):
        out.deadline.CopyFrom(m.definition.deadline)
    out.budget.CopyFrom(m.definition.budget)
    out.used.currency = m.definition.budget.currency
    for dim in SIX:
        setattr(out.used, dim, state.mission_used[dim])
    return out
