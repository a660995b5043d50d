"""Test data builders: valid commands that individual tests then break one field at a time."""

from __future__ import annotations

from datetime import datetime, timedelta

from missionweave.clock import to_timestamp
from missionweave.v1 import common_pb2, conversation_pb2, mission_pb2


def definition(owner: str, now: datetime, **overrides: object) -> mission_pb2.MissionDefinition:
    d = mission_pb2.MissionDefinition(
        title="Ship the quarterly report",
        objective="Produce the Q3 report with verified figures",
        definition_of_done=[
            mission_pb2.CompletionCriterion(
                criterion_id="dod-1", description="figures reconcile with ledger", evidence_method="test", required=True
            )
        ],
        deadline=to_timestamp(now + timedelta(days=3)),
        budget=common_pb2.ResourceVector(currency="EUR", financial_micros=50_000_000, tokens=1_000_000, tool_calls=500),
        risk_policy=mission_pb2.RiskPolicy(risk_class=mission_pb2.RISK_CLASS_LOW),
        owner_id=owner,
    )
    for key, value in overrides.items():
        if value is None:
            d.ClearField(key)
        elif hasattr(value, "DESCRIPTOR"):
            getattr(d, key).CopyFrom(value)
        else:
            setattr(d, key, value)
    return d


def mission_create(owner: str, coordinator_id: str, now: datetime, **overrides: object) -> mission_pb2.MissionCreate:
    return mission_pb2.MissionCreate(definition=definition(owner, now, **overrides), coordinator_id=coordinator_id)


def message(conversation_id: str, text: str = "hello", **content: object) -> conversation_pb2.MessagePost:
    return conversation_pb2.MessagePost(
        conversation_id=conversation_id, content=conversation_pb2.MessageContent(text=text, **content)  # type: ignore[arg-type]
    )
