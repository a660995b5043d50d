"""Test data builders: valid commands that individual tests then break one field at a time."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypeVar

from google.protobuf.message import Message

from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import common_pb2, conversation_pb2, mission_pb2, work_pb2

M = TypeVar("M", bound=Message)


def with_overrides(message: M, overrides: dict[str, object]) -> M:
    """Set (or, with None, clear) fields of a valid message so a test can break one at a time."""
    for key, value in overrides.items():
        if value is None:
            message.ClearField(key)
        elif hasattr(value, "DESCRIPTOR"):
            getattr(message, key).CopyFrom(value)
        elif isinstance(value, list):  # a repeated field: replaced whole
            del getattr(message, key)[:]
            getattr(message, key).extend(value)
        else:
            setattr(message, key, value)
    return message


def definition(owner: str, now: datetime, **overrides: object) -> mission_pb2.MissionDefinition:
    d = mission_pb2.MissionDefinition(
        title="Ship the quarterly report",
        objective="Produce the Q3 report with verified figures",
        definition_of_done=[
            mission_pb2.CompletionCriterion(
                criterion_id="dod-1",
                description="figures reconcile with ledger",
                evidence_method="test",
                required=True,
            )
        ],
        deadline=to_timestamp(now + timedelta(days=3)),
        budget=common_pb2.ResourceVector(
            currency="EUR", financial_micros=50_000_000, tokens=1_000_000, tool_calls=500
        ),
        risk_policy=mission_pb2.RiskPolicy(risk_class=mission_pb2.RISK_CLASS_LOW),
        owner_id=owner,
    )
    return with_overrides(d, overrides)


def mission_create(
    owner: str, coordinator_id: str, now: datetime, **overrides: object
) -> mission_pb2.MissionCreate:
    return mission_pb2.MissionCreate(
        definition=definition(owner, now, **overrides), coordinator_id=coordinator_id
    )


def message(conversation_id: str, text: str = "hello", **content: object) -> conversation_pb2.MessagePost:
    return conversation_pb2.MessagePost(
        conversation_id=conversation_id,
        content=conversation_pb2.MessageContent(text=text, **content),  # type: ignore[arg-type]
    )


def contract(
    now: datetime, *, depends_on: tuple[str, ...] = (), **overrides: object
) -> work_pb2.WorkContract:
    """A complete work contract (MW-10.1-01): every item a machine-readable field."""
    c = work_pb2.WorkContract(
        goal="Reconcile the Q3 ledger",
        deliverables=[
            work_pb2.Deliverable(deliverable_id="report", description="reconciled ledger", required=True)
        ],
        acceptance_criteria=[
            work_pb2.AcceptanceCriterion(
                criterion_id="balances",
                description="all balances match",
                required_evidence_methods=[work_pb2.EVIDENCE_METHOD_TEST],
                deliverable_ids=["report"],
                required=True,
            )
        ],
        depends_on_work_item_ids=list(depends_on),
        required_capabilities=[],
        deadline=to_timestamp(now + timedelta(days=1)),
        urgency=work_pb2.WORK_URGENCY_LOW,
        business_impact=work_pb2.BUSINESS_IMPACT_LOW,
        budget=common_pb2.ResourceVector(
            currency="EUR", financial_micros=1_000_000, tokens=10_000, tool_calls=50
        ),
        retry_policy=work_pb2.RetryPolicy(max_attempts=3),
        time_policy=work_pb2.TimePolicy(),
        cost_policy=work_pb2.CostPolicy(),
        risk_class=mission_pb2.RISK_CLASS_LOW,
    )
    c.time_policy.execution_lease_duration.FromSeconds(60)
    c.time_policy.start_deadline.FromSeconds(120)
    return with_overrides(c, overrides)


def evidence(evidence_id: str = "ev-1", criterion_id: str = "balances") -> work_pb2.Evidence:
    return work_pb2.Evidence(
        evidence_id=evidence_id,
        criterion_id=criterion_id,
        method=work_pb2.EVIDENCE_METHOD_TEST,
        result=work_pb2.EVIDENCE_RESULT_PASS,
        summary="42 of 42 balances match",
    )


def artifact(hex_char: str = "a") -> common_pb2.ArtifactRef:
    ref = common_pb2.ArtifactRef()
    ref.digest.CopyFrom(common_pb2.Digest(algorithm="blake3", hex=hex_char * 64))
    return ref


def selection(candidate: str) -> work_pb2.SelectionCriteria:
    return work_pb2.SelectionCriteria(
        candidate_id=candidate,
        authorization_eligible=True,
        authorization_basis=["membership:worker"],
        applied_policy_rules=["policy:capability-match", "policy:least-loaded"],
        rank=1,
    )
