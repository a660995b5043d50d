"""MW-10.2-T01, T02: proposals, and authorized WorkItems with their Conversations."""

from __future__ import annotations

from missionweave.kernel import ids
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, conversation_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import (
    MAX_REASON_CHARS,
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    invalid,
    mission_of,
)
from missionweave_server.services.authority.rules.delegation import charge, check_delegated_authorize
from missionweave_server.services.authority.rules.missions.common import require_live
from missionweave_server.services.authority.rules.work.common import OPEN, require_steering, work_item
from missionweave_server.services.authority.rules.work.contract import validate_contract
from missionweave_server.services.authority.rules.work.usage import check_fits_mission
from missionweave_server.services.authority.state import GroupState, ProposalState, WorkItemState


def work_propose(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T01 / MW-9-13 / MW-9.1-17: any Group member proposes; no WorkItem exists yet."""
    assert state is not None
    body = command.work_propose
    require_live(mission_of(state), "work.propose")
    proposal_id = body.proposal_id or ids.derived_id("prop", command.group_id, command.command_id)
    if not ids.is_valid(proposal_id) or proposal_id in state.proposals:
        raise invalid("body.proposal_id", "a valid id not yet used in this Group")
    if not 1 <= len(body.title) <= 200:
        raise invalid("body.title", "1..200 characters required")
    if len(body.rationale) > MAX_REASON_CHARS:
        raise invalid("body.rationale", f"at most {MAX_REASON_CHARS} characters")
    if body.parent_work_item_id:
        work_item(state, body.parent_work_item_id)
    out.emit(
        "work.proposed",
        "work_proposed",
        wp.WorkProposed(
            proposal_id=proposal_id,
            title=body.title,
            contract=body.contract,
            parent_work_item_id=body.parent_work_item_id,
            rationale=body.rationale,
        ),
    )


def work_authorize(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-10.2-T02 / MW-9-02: the Coordinator (or the owner's override) creates the WorkItem and its Conversation."""
    assert state is not None
    body = command.work_authorize
    grant = require_steering(state, command, ctx, body, "work.authorize")
    work_item_id = body.work_item_id or ids.derived_id("wi", command.group_id, command.command_id)
    if not ids.is_valid(work_item_id) or work_item_id in state.work_items:
        raise invalid("body.work_item_id", "a valid id not yet used in this Group")
    if not 1 <= len(body.title) <= 200:
        raise invalid("body.title", "1..200 characters required")
    if body.proposal_id:
        proposal = state.proposals.get(body.proposal_id)
        if proposal is None or not proposal.open:
            raise Rejected(R.REJECTION_REASON_NOT_FOUND, f"no open proposal {body.proposal_id}")
    if body.parent_work_item_id:
        work_item(state, body.parent_work_item_id)
    validate_contract(body.contract, state, ctx, "body.contract")
    check_fits_mission(state, work_item_id, body.contract.budget, "body.contract.budget")
    if grant is not None:
        check_delegated_authorize(state, ctx, grant, body, work_item_id)
    conversation_id = ids.derived_id("conv", command.group_id, work_item_id)
    contract = wp.WorkContract()
    contract.CopyFrom(body.contract)
    contract.revision = 1
    out.emit(
        "work.authorized",
        "work_authorized",
        wp.WorkAuthorized(
            work_item_id=work_item_id,
            title=body.title,
            contract=contract,
            proposal_id=body.proposal_id,
            parent_work_item_id=body.parent_work_item_id,
            conversation_id=conversation_id,
            coordinator_epoch=body.coordinator_epoch,
            grant_id=body.grant_id,
            emergency_override=body.emergency_override,
            override_reason=body.override_reason,
        ),
    )
    out.emit(
        "conversation.opened",
        "conversation_opened",
        conversation_pb2.ConversationOpened(
            conversation_id=conversation_id,
            kind=conversation_pb2.CONVERSATION_KIND_WORK_ITEM,
            work_item_id=work_item_id,
            title=body.title,
        ),
    )


# ---------------------------------------------------------------- evolve rules


def _proposed(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_proposed
    state.proposals[p.proposal_id] = ProposalState(p.proposal_id, event.actor_id)


def _authorized(state: GroupState, event: event_pb2.Event) -> None:
    p = event.work_authorized
    contract = wp.WorkContract()
    contract.CopyFrom(p.contract)
    state.work_items[p.work_item_id] = WorkItemState(
        work_item_id=p.work_item_id,
        state=OPEN,
        title=p.title,
        contract=contract,
        contract_revision=contract.revision or 1,
        conversation_id=p.conversation_id,
        parent_work_item_id=p.parent_work_item_id,
        depends_on=tuple(contract.depends_on_work_item_ids),
        created_sequence=event.sequence,
    )
    state.last_work_change_sequence = event.sequence
    if p.grant_id:
        charge(state, p.grant_id, p.work_item_id, p.contract.budget)
    if p.proposal_id in state.proposals:
        state.proposals[p.proposal_id].open = False


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind("work_propose", work_propose, {"work_proposed": _proposed}),
    CommandKind("work_authorize", work_authorize, {"work_authorized": _authorized}),
)
