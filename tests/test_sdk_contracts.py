"""``missionweave.sdk.contracts``: a WorkContract from a few fields, with defaults the Authority
accepts, and every local check naming its field; the SDK's epoch look-ups and ``read_key`` of a str."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from missionweave.kernel.clock import from_timestamp
from missionweave.kernel.signing import generate_key, read_key, write_key
from missionweave.sdk.client import decode_events
from missionweave.sdk.contracts import (
    Budget,
    ContractError,
    Criterion,
    Deliverable,
    Input,
    validate,
    work_contract,
)
from missionweave.v1 import membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.test_cli_mission import Bench
from tests.test_cli_mission import bench as bench  # the fixture

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HEX = "ab" * 32


def build(**overrides: Any) -> wp.WorkContract:
    fields: dict[str, Any] = {
        "deliverables": {"report": "the reconciled ledger"},
        "criteria": {"balances": "every balance matches"},
        "budget": Budget(tokens=10_000, tool_calls=50),
        "now": NOW,
    }
    return work_contract(overrides.pop("goal", "Reconcile the Q3 ledger"), **(fields | overrides))


def test_the_defaults_make_a_complete_contract() -> None:
    c = build(
        evidence={"balances": ["test", "review"]},
        depends_on=["extract"],
        inputs=[Input("ledger", from_work_item="extract")],
    )
    assert c.deliverables[0] == wp.Deliverable(
        deliverable_id="report", description="the reconciled ledger", required=True
    )
    (criterion,) = c.acceptance_criteria
    assert list(criterion.required_evidence_methods) == [wp.EVIDENCE_METHOD_TEST, wp.EVIDENCE_METHOD_REVIEW]
    assert criterion.required and not criterion.deliverable_ids
    assert from_timestamp(c.deadline) == NOW + timedelta(days=1)
    assert (c.urgency, c.business_impact, c.risk_class) == (
        wp.WORK_URGENCY_NORMAL,
        wp.BUSINESS_IMPACT_MEDIUM,
        mission_pb2.RISK_CLASS_LOW,
    )
    assert c.retry_policy.max_attempts == 3 and c.HasField("time_policy") and c.HasField("cost_policy")
    assert not c.HasField("dependency_policy")  # all-verified, the protocol's default
    assert c.budget.tokens == 10_000 and c.budget.financial_micros == 0
    # A criterion not named in `evidence` requires a review.
    assert list(build().acceptance_criteria[0].required_evidence_methods) == [wp.EVIDENCE_METHOD_REVIEW]


def test_deadlines_budgets_and_richer_parts() -> None:
    c = build(
        deadline=timedelta(hours=6),
        urgency="HIGH",
        impact="critical",
        risk="medium",
        budget={"financial": "1.25", "tokens": 5, "side_effects": 1},
        currency="eur",
        deliverables=[
            Deliverable(
                "report", "the report", media_type="text/markdown", schema_uri="urn:x", required=False
            )
        ],
        criteria=[
            Criterion(
                "ok",
                "it reads well",
                evidence=("other",),
                method_extensions=("com.example/read",),
                deliverables=("report",),
            )
        ],
        dependency_policy="min-verified",
        min_verified=2,
        depends_on=["a", "b", "c"],
        capabilities=["code.python=3.0", membership_pb2.Capability(capability_id="sql", version="1")],
        inputs=[Input("ledger", artifact=f"blake3:{HEX}:12", media_type="text/csv")],
    )
    assert from_timestamp(c.deadline) == NOW + timedelta(hours=6)
    assert (c.budget.currency, c.budget.financial_micros, c.budget.side_effects) == ("EUR", 1_250_000, 1)
    assert c.deliverables[0].schema.uri == "urn:x" and not c.deliverables[0].required
    assert c.dependency_policy == wp.DependencyPolicy(
        kind=wp.DEPENDENCY_POLICY_KIND_MIN_VERIFIED, min_verified=2
    )
    assert [(x.capability_id, x.version) for x in c.required_capabilities] == [
        ("code.python", "3.0"),
        ("sql", "1"),
    ]
    assert c.inputs[0].artifact.digest.size_bytes == 12 and c.inputs[0].artifact.media_type == "text/csv"
    assert build(budget=Budget(financial=Decimal("0.000001"), currency="EUR")).budget.financial_micros == 1
    assert (
        build(budget={"financial_micros": 2_500_000, "currency": "EUR"}).budget.financial_micros == 2_500_000
    )


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"goal": ""}, "goal"),
        ({"goal": "x" * 4097}, "goal"),
        ({"deliverables": {}}, "deliverables"),
        ({"deliverables": {"bad id!": "x"}}, "deliverables[0].deliverable_id"),
        ({"deliverables": {"report": " "}}, "deliverables.report.description"),
        ({"deliverables": [Deliverable("r", "a"), Deliverable("r", "b")]}, "deliverables.r"),
        ({"criteria": {}}, "criteria"),
        ({"criteria": {"c": ""}}, "criteria.c.description"),
        ({"criteria": [Criterion("c", "a"), Criterion("c", "b")]}, "criteria.c"),
        ({"criteria": [Criterion("c", "a", evidence=())]}, "criteria.c.evidence"),
        ({"criteria": [Criterion("c", "a", deliverables=("nope",))]}, "criteria.c.deliverables"),
        ({"criteria": [Criterion("c", "a", evidence=("other",))]}, "criteria.c.method_extensions"),
        ({"evidence": {"typo": ["test"]}}, "evidence.typo"),
        ({"evidence": {"balances": ["telepathy"]}}, "evidence.balances"),
        ({"inputs": [Input("x", from_work_item="wi-z")]}, "inputs.x.from"),
        (
            {"inputs": [Input("x", artifact=f"blake3:{HEX}", from_work_item="a")], "depends_on": ["a"]},
            "inputs.x",
        ),
        ({"inputs": [Input("x")]}, "inputs.x"),
        ({"inputs": [Input("x", artifact="sha256:abc")]}, "inputs.x.artifact"),
        ({"inputs": [Input("", artifact=f"blake3:{HEX}")]}, "inputs[0].name"),
        (
            {"inputs": [Input("x", artifact=f"blake3:{HEX}"), Input("x", artifact=f"blake3:{HEX}")]},
            "inputs.x",
        ),
        ({"depends_on": ["a", "a"]}, "depends_on.a"),
        ({"depends_on": ["not an id"]}, "depends_on[0]"),
        ({"capabilities": ["python"]}, "capabilities[0]"),
        ({"capabilities": [membership_pb2.Capability(capability_id="python")]}, "capabilities[0]"),
        ({"deadline": NOW - timedelta(seconds=1)}, "deadline"),
        ({"deadline": datetime(2030, 1, 1)}, "deadline"),  # no time zone
        ({"urgency": "soonish"}, "urgency"),
        ({"impact": 0}, "impact"),
        ({"impact_note": "x" * 257}, "impact_note"),
        ({"budget": Budget(tokens=-1)}, "budget.tokens"),
        ({"budget": {"tokens": True}}, "budget.tokens"),
        ({"budget": {"colour": 1}}, "budget.colour"),
        ({"budget": {"financial": "abc"}}, "budget.financial"),
        ({"budget": {"financial": "-1"}}, "budget.financial"),
        ({"budget": {"financial": "0.0000001"}}, "budget.financial"),
        ({"budget": {"financial": "1", "financial_micros": 1}}, "budget.financial"),
        ({"budget": {"financial": "1.00"}}, "budget.currency"),  # a financial budget needs a currency
        ({"budget": {"financial": "1.00", "currency": "USD"}, "currency": "EUR"}, "budget.currency"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"execution_lease": timedelta(milliseconds=500)}, "execution_lease"),
        ({"start_deadline": timedelta(days=2)}, "start_deadline"),
        ({"risk": "extreme"}, "risk"),
        ({"dependency_policy": "most"}, "dependency_policy"),
        ({"notes": "x" * (16 * 1024 + 1)}, "notes"),
    ],
)
def test_a_missing_or_inconsistent_field_is_named(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ContractError) as refused:
        build(**overrides)
    assert refused.value.field == field, str(refused.value)
    assert str(refused.value).startswith(f"{field}: ")


def test_validate_checks_a_contract_built_by_hand() -> None:
    good = builders.contract(NOW)
    assert validate(good, now=NOW) is good
    for name, field in (
        ("time_policy", "time_policy"),
        ("cost_policy", "cost_policy"),
        ("budget", "budget"),
        ("deadline", "deadline"),
    ):
        broken = wp.WorkContract()
        broken.CopyFrom(good)
        broken.ClearField(name)  # type: ignore[arg-type]
        with pytest.raises(ContractError) as refused:
            validate(broken, now=NOW)
        assert refused.value.field == field
    with pytest.raises(ContractError, match=r"time_policy\.blocked_lease_duration"):
        broken = wp.WorkContract()
        broken.CopyFrom(good)
        broken.time_policy.blocked_lease_duration.FromSeconds(25 * 3600)
        validate(broken, now=NOW)
    with pytest.raises(ContractError, match=r"budget\.currency: must be the Mission budget's currency, USD"):
        validate(good, now=NOW, currency="usd")


def test_read_key_takes_a_str_or_a_path(tmp_path: Path) -> None:
    key = generate_key()
    write_key(tmp_path / "k.key", key)
    assert bytes(read_key(str(tmp_path / "k.key"))) == bytes(key) == bytes(read_key(tmp_path / "k.key"))
    with pytest.raises(FileNotFoundError, match="mwp keygen"):
        read_key(str(tmp_path / "missing.key"))


async def test_a_script_authorizes_built_contracts_with_the_sdk_alone(bench: Bench) -> None:
    """What the issue's 60-line script needed internals for: the epochs come from MeshClient, the
    contract from work_contract with its defaults, which the Authority accepts."""
    group, mesh = "grp_sdk_contracts", bench.client
    alice, coord = bench.signers["alice"], bench.signers["coord-bot"]
    await mesh.execute_as(
        alice, group, "mission_create", builders.mission_create("alice", "coord-bot", bench.clock.now())
    )
    assert (
        await mesh.membership_epoch(group, "coord-bot") == 2
        and await mesh.membership_epoch(group, "nobody") == 0
    )
    assert await mesh.coordinator_epoch(group) == 1
    minimal = work_contract(
        "Extract the figures",
        deliverables={"figures": "CSV"},
        criteria={"complete": "every row"},
        budget=Budget(tokens=1000, financial="0.10"),
        currency="EUR",
    )
    body = wp.WorkAuthorize(
        work_item_id="wi-1",
        title="Extract",
        contract=minimal,
        coordinator_epoch=await mesh.coordinator_epoch(group),
    )
    result = await mesh.execute_as(coord, group, "work_authorize", body)
    assert decode_events(result.events)[0].type == "work.authorized"
    item = await mesh.work_item(group, "wi-1")
    assert item.contract.budget.financial_micros == 100_000 and item.contract.revision == 1
