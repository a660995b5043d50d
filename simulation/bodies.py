"""Realistic command bodies for the simulated actors (the same shapes tests/builders.py builds).

Only protobuf construction: no decisions. Times come from the simulated clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.extensions import BOUNDED_OFFLINE_EXECUTION
from missionweave.v1 import common_pb2, conversation_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp

# A WorkItem's budget: small enough that a few renewals with usage reach it (budget refusals happen).
WORK_TOKENS = 500
MISSION_TOKENS = 3_000  # five WorkItems hold 2,500 of it (D162), delegated ones the rest
CRITERION = "balances"
COORDINATOR_LEASE_S, COORDINATOR_RENEW_BEFORE_S = 6, 3
GRANT_TOKENS = 300  # a delegation grant's token cap: two delegated WorkItems of half of it each
OFFLINE_GRACE_S = 10  # bounded offline execution (MW-11.5-07): progress buffered this long after the lease


def mission_create(owner: str, coordinator: str, now: datetime) -> mission_pb2.MissionCreate:
    definition = mission_pb2.MissionDefinition(
        title="Ship the quarterly report",
        objective="Produce the Q3 report with verified figures",
        definition_of_done=[
            mission_pb2.CompletionCriterion(
                criterion_id="dod-1", description="figures reconcile", evidence_method="test", required=True
            )
        ],
        deadline=to_timestamp(now + timedelta(days=3)),
        budget=common_pb2.ResourceVector(currency="EUR", tokens=MISSION_TOKENS, tool_calls=500),
        risk_policy=mission_pb2.RiskPolicy(risk_class=mission_pb2.RISK_CLASS_LOW),
        owner_id=owner,
    )
    create = mission_pb2.MissionCreate(definition=definition, coordinator_id=coordinator)
    create.coordinator_renewal.CopyFrom(coordinator_renewal())
    return create


def coordinator_renewal() -> mission_pb2.RenewalPolicy:
    """A short Coordinator lease: a Coordinator cut off for a few seconds lapses and is replaced."""
    policy = mission_pb2.RenewalPolicy()
    policy.lease_duration.FromSeconds(COORDINATOR_LEASE_S)
    policy.renew_before.FromSeconds(COORDINATOR_RENEW_BEFORE_S)
    return policy


def membership_grant(member: str, role: int) -> membership_pb2.MembershipGrant:
    return membership_pb2.MembershipGrant(member_id=member, role=role)  # type: ignore[arg-type]


def work_authorize(work_item_id: str, now: datetime, coordinator_epoch: int) -> wp.WorkAuthorize:
    contract = wp.WorkContract(
        goal=f"Reconcile part {work_item_id}",
        deliverables=[
            wp.Deliverable(deliverable_id="report", description="reconciled ledger", required=True)
        ],
        acceptance_criteria=[
            wp.AcceptanceCriterion(
                criterion_id=CRITERION,
                description="all balances match",
                required_evidence_methods=[wp.EVIDENCE_METHOD_TEST],
                deliverable_ids=["report"],
                required=True,
            )
        ],
        deadline=to_timestamp(now + timedelta(days=1)),
        urgency=wp.WORK_URGENCY_LOW,
        business_impact=wp.BUSINESS_IMPACT_LOW,
        budget=common_pb2.ResourceVector(currency="EUR", tokens=WORK_TOKENS, tool_calls=50),
        retry_policy=wp.RetryPolicy(max_attempts=20),  # restarts and checkpoints each start one
        time_policy=wp.TimePolicy(),
        cost_policy=wp.CostPolicy(),
        risk_class=mission_pb2.RISK_CLASS_LOW,
    )
    # Short leases: a partitioned or paused Worker outlives its lease, and the WorkItem changes hands.
    contract.time_policy.execution_lease_duration.FromSeconds(5)
    contract.time_policy.start_deadline.FromSeconds(5)
    contract.time_policy.offline_grace_period.FromSeconds(OFFLINE_GRACE_S)
    return wp.WorkAuthorize(
        work_item_id=work_item_id, title=work_item_id, contract=contract, coordinator_epoch=coordinator_epoch
    )


def work_offer(
    work_item_id: str,
    offer_id: str,
    candidates: list[str],
    now: datetime,
    coordinator_epoch: int,
    expires_at: datetime | None = None,
) -> wp.WorkOffer:
    return wp.WorkOffer(
        work_item_id=work_item_id,
        offer_id=offer_id,
        candidate_ids=candidates,
        coordinator_epoch=coordinator_epoch,
        expires_at=to_timestamp(expires_at or now + timedelta(seconds=60)),
        selection_criteria=[
            wp.SelectionCriteria(
                candidate_id=c,
                authorization_eligible=True,
                authorization_basis=["membership:worker"],
                applied_policy_rules=["policy:least-loaded"],
                rank=i + 1,
            )
            for i, c in enumerate(candidates)
        ],
    )


def artifact_ref(digest_hex: str) -> common_pb2.ArtifactRef:
    ref = common_pb2.ArtifactRef()
    ref.digest.CopyFrom(common_pb2.Digest(algorithm="blake3", hex=digest_hex))
    return ref


def evidence(evidence_id: str) -> wp.Evidence:
    return wp.Evidence(
        evidence_id=evidence_id,
        criterion_id=CRITERION,
        method=wp.EVIDENCE_METHOD_TEST,
        result=wp.EVIDENCE_RESULT_PASS,
        summary="all balances match",
    )


def work_submit(
    work_item_id: str, lease_id: str, epoch: int, digest_hex: str, evidence_id: str
) -> wp.WorkSubmit:
    return wp.WorkSubmit(
        work_item_id=work_item_id,
        lease_id=lease_id,
        ownership_epoch=epoch,
        contract_revision=1,
        artifacts=[artifact_ref(digest_hex)],
        evidence=[evidence(evidence_id)],
    )


def conversation_open(conversation_id: str, participants: list[str]) -> conversation_pb2.ConversationOpen:
    return conversation_pb2.ConversationOpen(
        conversation_id=conversation_id,
        kind=conversation_pb2.CONVERSATION_KIND_RESTRICTED,
        title="pricing, restricted",
        participant_ids=participants,
    )


def message_post(conversation_id: str, message_id: str, text: str) -> conversation_pb2.MessagePost:
    return conversation_pb2.MessagePost(
        conversation_id=conversation_id,
        message_id=message_id,
        content=conversation_pb2.MessageContent(text=text),
    )


def offline_binding(
    agent: str,
    group_id: str,
    item_conversation: str,
    work_item_id: str,
    session: int,
    epoch: int,
    lease_id: str,
    lease_expires: datetime,
    disconnected: datetime,
    buffered: datetime,
    usage: common_pb2.ResourceVector,
) -> common_pb2.ExtensionBinding:
    """The critical bounded-offline-execution binding of a buffered command (MW-11.5-08)."""
    binding = wp.BoundedOfflineExecutionBinding(
        agent_id=agent,
        group_id=group_id,
        work_item_id=work_item_id,
        original_session_epoch=session,
        ownership_epoch=epoch,
        historical_lease_id=lease_id,
        disconnected_at=to_timestamp(disconnected),
        buffered_at=to_timestamp(buffered),
        grace_deadline=to_timestamp(lease_expires + timedelta(seconds=OFFLINE_GRACE_S)),
        historical_lease_expires_at=to_timestamp(lease_expires),
        usage_delta=usage,
        conversation_id=item_conversation,
    )
    return common_pb2.ExtensionBinding(
        urn=BOUNDED_OFFLINE_EXECUTION, critical=True, data=binding.SerializeToString()
    )


def delegation_grant(
    grantee: str, target: str, now: datetime, coordinator_epoch: int
) -> membership_pb2.MembershipGrantDelegation:
    """A work delegate's grant under one WorkItem (MW-9.1-05), capped below that WorkItem's budget."""
    return membership_pb2.MembershipGrantDelegation(
        grantee_id=grantee,
        target_work_item_id=target,
        allowed_capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.11")],
        caps=common_pb2.ResourceVector(currency="EUR", tokens=GRANT_TOKENS, tool_calls=20),
        max_descendant_depth=1,
        expires_at=to_timestamp(now + timedelta(hours=1)),
        coordinator_epoch=coordinator_epoch,
    )


def delegated_work(work_item_id: str, parent: str, grant_id: str, now: datetime) -> wp.WorkAuthorize:
    """A WorkItem a work delegate authorizes under its grant (coordinator epoch 0: the grant speaks)."""
    body = work_authorize(work_item_id, now, 0)
    body.parent_work_item_id, body.grant_id = parent, grant_id
    body.contract.budget.tokens, body.contract.budget.tool_calls = GRANT_TOKENS // 2, 5
    return body
