"""Context Packages (spec 13.3): signed, versioned, scoped summaries derived from a Group's state.

A package summarises, it never replaces history: it names the event range it was derived from so a
recipient with a Membership can fetch the events themselves (MW-13.3-01/03). Only the Group's own
content goes in (MW-13.3-05).
"""

from __future__ import annotations

from datetime import datetime

import blake3

from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2, work_pb2
from missionweave_server.services.authority.state import GroupState

R = common_pb2.RejectionReason
CONTEXT_PACKAGE_TYPE = "application/vnd.missionweave.v1.context-package+protobuf"
ACTIVE_STATES = frozenset(
    {
        work_pb2.WORK_ITEM_STATE_OPEN,
        work_pb2.WORK_ITEM_STATE_OFFERED,
        work_pb2.WORK_ITEM_STATE_QUEUED,
        work_pb2.WORK_ITEM_STATE_ACTIVE,
        work_pb2.WORK_ITEM_STATE_BLOCKED,
        work_pb2.WORK_ITEM_STATE_SUBMITTED,
    }
)


def build_context_package(
    state: GroupState,
    *,
    work_item_ids: list[str],
    purpose: int,
    recipient_ids: list[str],
    generator_id: str,
    now: datetime,
    previous: apb.ContextPackage | None = None,
    previous_payload: bytes = b"",
) -> apb.ContextPackage:
    mission = state.mission
    if mission is None:
        raise Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {state.group_id} has no Mission")
    for wid in work_item_ids:
        if wid not in state.work_items:
            raise Rejected(
                R.REJECTION_REASON_NOT_FOUND, f"no WorkItem {wid} in this Group", field="work_item_ids"
            )
    scope = [state.work_items[w] for w in work_item_ids] if work_item_ids else list(state.work_items.values())
    package = apb.ContextPackage(
        context_package_id=previous.context_package_id
        if previous
        else ids.derived_id("ctx", state.group_id, str(state.head_sequence), generator_id),
        version=previous.version + 1 if previous else 1,
        mission_id=mission.mission_id,
        group_id=state.group_id,
        work_item_ids=work_item_ids,
        source_event_ranges=[
            apb.EventRange(group_id=state.group_id, first_sequence=1, last_sequence=state.head_sequence)
        ],
        generator_id=generator_id,
        generated_at=to_timestamp(now),
        signer_key_id=generator_id,
        purpose=purpose,  # type: ignore[arg-type]
        recipient_ids=recipient_ids,
        summary=f"{mission.definition.title}: {len(scope)} WorkItems in scope at Group revision {state.head_sequence}",
    )
    if previous is not None:
        package.previous_version.CopyFrom(
            common_pb2.Digest(
                algorithm="blake3",
                hex=blake3.blake3(previous_payload).hexdigest(),
                size_bytes=len(previous_payload),
            )
        )
    for item in scope:
        for hex_digest, size in item.published_artifacts:
            package.artifacts.add(
                digest=common_pb2.Digest(algorithm="blake3", hex=hex_digest, size_bytes=size)
            )
        state_name = (
            work_pb2.WorkItemState.Name(work_pb2.WorkItemState.ValueType(item.state))
            .removeprefix("WORK_ITEM_STATE_")
            .lower()
        )
        if item.latest_submission_event_id:
            package.decisions.add(
                decision_id=f"{item.work_item_id}:{state_name}",
                summary=f"{item.work_item_id} ({item.title}) is {state_name}",
                event_id=item.latest_submission_event_id,
            )
        if item.state in ACTIVE_STATES:
            package.constraints.add(
                constraint_id=f"{item.work_item_id}:contract-r{item.contract_revision}",
                description=f"{item.work_item_id} follows contract revision {item.contract_revision}: {item.contract.goal}",
            )
        for message_id in sorted(item.open_ambiguities):
            package.open_questions.add(
                question_id=message_id,
                conversation_id=item.conversation_id,
                message_id=message_id,
                question=f"material ambiguity raised on {item.work_item_id}",
            )
    for event_id, what in (
        (mission.latest_submission_event_id, "submitted for approval"),
        (mission.approval_event_id, "approved"),
    ):
        if event_id:
            package.decisions.add(
                decision_id=f"mission:{what.split()[0]}", summary=f"the Mission was {what}", event_id=event_id
            )
    package.constraints.add(
        constraint_id="mission:deadline-budget",
        description=f"Mission deadline {mission.definition.deadline.ToJsonString()}, budget "
        f"{mission.definition.budget.financial_micros / 1e6:.2f} {mission.definition.budget.currency}, "
        f"{mission.definition.budget.tokens} tokens",
    )
    return package
