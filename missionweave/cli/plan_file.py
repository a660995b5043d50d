"""The plan file of ``mwp plan apply|export``: a Mission's WorkItem DAG as TOML (docs/cli.md "Plans").

```toml
version = 1

[defaults]                       # optional: every item takes these unless it sets them
urgency = "normal"
offer_to = ["worker-1"]

[items.extract]                  # the WorkItem id
title = "Extract the figures"
goal = "Extract the Q3 figures from the ledger"     # default: the title
depends_on = []                  # other items, or WorkItems the Group already holds
budget = { tokens = 20000, tool_calls = 40, financial = "0.50" }   # required: what it may spend
deliverables = { figures = "the figures as CSV" }  # default: { result = the goal }
criteria = { complete = "every entity is present" }                # required, at least one
evidence = { complete = ["test"] }                 # the Evidence a criterion requires; default review
```

An item also takes ``parent``, ``dependency_policy`` and ``min_verified``, ``inputs`` (a name to
``"blake3:HEX:SIZE"``, ``"ITEM"`` or ``"ITEM/DELIVERABLE"``, or a table), ``capabilities``
(``["code.python=3.0"]``), ``deadline`` (a time with its zone; default the Mission's),
``urgency``, ``impact``, ``impact_note``, ``risk``, ``max_attempts``,
``requires_execution_approval``, ``execution_approvers``, ``notes``, and ``offer_to``: who a
contract revision is offered to (a revision is a new offer, MW-10.1-04). A deliverable may be a table
(``description``, ``media_type``, ``required``, ``schema_uri``, ``schema_version``), and so may a
criterion (``description``, ``deliverables``, ``required``, ``independent_review``,
``method_extensions``).

Everything is checked here, before anything is sent, and an error names the item and the field
(``items.report.evidence.typo: no acceptance criterion 'typo'``). Two items are compared through
their *description* (``describe``): every field the format carries, defaults filled in, so a
contract written with or without a default reads the same.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from missionweave.cli.common import UsageError, mission_of
from missionweave.cli.delegation import money
from missionweave.kernel import ids
from missionweave.sdk.contracts import (
    DEPENDENCY_POLICIES,
    EVIDENCE_METHODS,
    IMPACTS,
    RISKS,
    STAND_IN_CURRENCY,
    URGENCIES,
    ContractError,
    Criterion,
    Deliverable,
    Input,
    budget_vector,
    name_of,
    work_contract,
)
from missionweave.v1 import authority_service_pb2
from missionweave.v1 import work_pb2 as wp

VERSION = 1
BUDGET_KEYS = ("financial", "tokens", "tool_calls", "compute_ms", "wall_clock_ms", "side_effects")
# Each key an item may have, with its type (a default from the [defaults] table is checked the same).
ITEM_KEYS: dict[str, type | tuple[type, ...]] = {
    "title": str,
    "parent": str,
    "goal": str,
    "depends_on": list,
    "dependency_policy": str,
    "min_verified": int,
    "deliverables": dict,
    "criteria": dict,
    "evidence": dict,
    "inputs": dict,
    "capabilities": list,
    "budget": dict,
    "deadline": (str, datetime),
    "urgency": str,
    "impact": str,
    "impact_note": str,
    "risk": str,
    "max_attempts": int,
    "requires_execution_approval": bool,
    "execution_approvers": list,
    "notes": str,
    "offer_to": list,
}
REQUIRED = ("title", "criteria", "budget")
MISSING: Any = object()
# What a deliverable or criterion table holds when its description is all a plan says of it.
PART_DEFAULTS: dict[str, dict[str, Any]] = {
    "deliverables": {"media_type": "", "required": True, "schema_uri": "", "schema_version": ""},
    "criteria": {"deliverables": [], "required": True, "independent_review": False, "method_extensions": []},
}  # a field one side of a diff does not have


class PlanError(UsageError):
    """A plan that cannot be applied as written (exit 2, nothing sent): ``field`` names the item and key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class MissionFacts:
    """What a plan's defaults come from: the Mission's deadline and its budget's currency."""

    deadline: Timestamp
    currency: str

    @classmethod
    def of(cls, state: authority_service_pb2.GroupState) -> MissionFacts:
        definition = mission_of(state).definition
        return cls(definition.deadline, definition.budget.currency)

    @classmethod
    def stand_in(cls) -> MissionFacts:
        """Checks everything but the deadline's and the currency's defaults before the Group is read."""
        deadline = Timestamp()
        deadline.FromDatetime(datetime.now(UTC) + timedelta(days=1))
        return cls(deadline, STAND_IN_CURRENCY)


@dataclass
class PlanItem:
    work_item_id: str
    title: str
    parent: str
    contract: wp.WorkContract
    offer_to: list[str]


# ------------------------------------------------------------------ reading


def read(path: Path) -> dict[str, Any]:
    """The TOML document; an unreadable or invalid file is a PlanError naming it."""
    try:
        with path.open("rb") as f:
            document = tomllib.load(f)
    except OSError as err:
        raise PlanError(str(path), f"cannot read it: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise PlanError(str(path), f"not valid TOML: {err}") from None
    unknown = sorted(set(document) - {"version", "defaults", "items"})
    if unknown:
        raise PlanError(unknown[0], "unknown top-level key (a plan has version, defaults and items)")
    if document.get("version", VERSION) != VERSION:
        raise PlanError("version", f"this mwp reads plan version {VERSION}")
    if not isinstance(document.get("items"), dict) or not document["items"]:
        raise PlanError("items", "a plan has at least one item: [items.ID]")
    return document


def _typed(value: Any, kind: type | tuple[type, ...], field: str) -> Any:
    if (isinstance(value, bool) and kind is int) or not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        expected = {
            "str": "a string",
            "int": "a whole number",
            "list": "a list",
            "dict": "a table",
            "bool": "true or false",
        }
        raise PlanError(field, f"expected {expected.get(names, names)}, not {value!r}")
    return value


def _strings(value: Any, field: str) -> list[str]:
    return [_typed(v, str, f"{field}[{i}]") for i, v in enumerate(_typed(value, list, field))]


def _table(value: Any, keys: Mapping[str, type], text_key: str, field: str) -> dict[str, Any]:
    """A string (the ``text_key`` alone) or a table of ``keys``."""
    if isinstance(value, str):
        return {text_key: value}
    table = _typed(value, dict, field)
    for key, v in table.items():
        if key not in keys:
            raise PlanError(f"{field}.{key}", f"unknown key (one of {', '.join(keys)})")
        _typed(v, keys[key], f"{field}.{key}")
    return dict(table)


def _deliverables(value: dict[str, Any], field: str) -> list[Deliverable]:
    keys = {"description": str, "media_type": str, "required": bool, "schema_uri": str, "schema_version": str}
    return [Deliverable(k, **_table(v, keys, "description", f"{field}.{k}")) for k, v in value.items()]


def _criteria(value: dict[str, Any], field: str) -> list[Criterion]:
    keys: dict[str, type] = {
        "description": str,
        "deliverables": list,
        "required": bool,
        "independent_review": bool,
        "method_extensions": list,
    }
    out = []
    for k, v in value.items():
        t = _table(v, keys, "description", f"{field}.{k}")
        for listed in ("deliverables", "method_extensions"):
            if listed in t:
                t[listed] = _strings(t[listed], f"{field}.{k}.{listed}")
        out.append(Criterion(k, t.pop("description", ""), **t))
    return out


def _inputs(value: dict[str, Any], field: str) -> list[Input]:
    keys = {"artifact": str, "media_type": str, "from": str, "deliverable": str, "description": str}
    out = []
    for name, v in value.items():
        if isinstance(v, str):
            t = (
                {"artifact": v}
                if v.startswith("blake3:")
                else dict(zip(("from", "deliverable"), v.split("/", 1), strict=False))
            )
        else:
            t = _table(v, keys, "artifact", f"{field}.{name}")
        out.append(
            Input(
                name,
                artifact=t.get("artifact") or None,
                from_work_item=t.get("from", ""),
                from_deliverable=t.get("deliverable", ""),
                description=t.get("description", ""),
                media_type=t.get("media_type", ""),
            )
        )
    return out


def _deadline(value: str | datetime | None, facts: MissionFacts, field: str) -> Timestamp:
    if value is None:
        return facts.deadline
    deadline = Timestamp()
    try:
        if isinstance(value, datetime):
            if value.tzinfo is None:
                raise ValueError
            deadline.FromDatetime(value.astimezone(UTC))
        else:
            deadline.FromJsonString(value.replace("+00:00", "Z"))
    except ValueError:
        raise PlanError(
            field, f"expected a time with its zone, e.g. 2026-12-20T18:00:00Z, not {value!r}"
        ) from None
    return deadline


def item_of(work_item_id: str, given: dict[str, Any], facts: MissionFacts, now: datetime) -> PlanItem:
    """One item (its [defaults] merged in) as the contract it describes."""
    where = f"items.{work_item_id}"
    if not ids.is_valid(work_item_id):
        raise PlanError(where, "not a WorkItem id (1..128 of A-Z a-z 0-9 . _ : -)")
    for key, value in given.items():
        if key not in ITEM_KEYS:
            raise PlanError(f"{where}.{key}", f"unknown key (an item has {', '.join(ITEM_KEYS)})")
        _typed(value, ITEM_KEYS[key], f"{where}.{key}")
    for key in REQUIRED:
        if key not in given:
            raise PlanError(
                f"{where}.{key}",
                "required" + (" (a plan says what each WorkItem may spend)" if key == "budget" else ""),
            )
    title, goal = given["title"], given.get("goal", given["title"])
    if not 1 <= len(title) <= 200:
        raise PlanError(f"{where}.title", "1..200 characters")
    evidence = {
        k: [v] if isinstance(v, str) else _strings(v, f"{where}.evidence.{k}")
        for k, v in given.get("evidence", {}).items()
    }
    try:
        contract = work_contract(
            goal,
            deliverables=_deliverables(
                given.get("deliverables") or {"result": goal}, f"{where}.deliverables"
            ),
            criteria=_criteria(given["criteria"], f"{where}.criteria"),
            evidence=evidence,
            budget=budget_vector(given["budget"]),
            inputs=_inputs(given.get("inputs", {}), f"{where}.inputs"),
            depends_on=_strings(given.get("depends_on", []), f"{where}.depends_on"),
            dependency_policy=given.get("dependency_policy", "all-verified"),
            min_verified=given.get("min_verified", 0),
            capabilities=_strings(given.get("capabilities", []), f"{where}.capabilities"),
            deadline=_deadline(given.get("deadline"), facts, f"{where}.deadline").ToDatetime(tzinfo=UTC),
            urgency=given.get("urgency", "normal"),
            impact=given.get("impact", "medium"),
            impact_note=given.get("impact_note", ""),
            max_attempts=given.get("max_attempts", 3),
            risk=given.get("risk", "low"),
            requires_execution_approval=given.get("requires_execution_approval", False),
            execution_approvers=_strings(
                given.get("execution_approvers", []), f"{where}.execution_approvers"
            ),
            notes=given.get("notes", ""),
            currency=facts.currency,
            now=now,
        )
    except ContractError as err:
        raise PlanError(f"{where}.{err.field}", err.reason) from None
    contract.deadline.CopyFrom(
        _deadline(given.get("deadline"), facts, f"{where}.deadline")
    )  # exact, to the nanosecond
    for i, dep in enumerate(contract.depends_on_work_item_ids):
        if dep == work_item_id:
            raise PlanError(f"{where}.depends_on[{i}]", "an item cannot depend on itself")
    parent = given.get("parent", "")
    if parent and not ids.is_valid(parent):
        raise PlanError(f"{where}.parent", f"{parent!r} is not a WorkItem id")
    return PlanItem(
        work_item_id, title, parent, contract, _strings(given.get("offer_to", []), f"{where}.offer_to")
    )


def items_of(
    document: dict[str, Any], facts: MissionFacts, now: datetime | None = None
) -> dict[str, PlanItem]:
    """Every item of the plan, in the file's order; the first error is a PlanError."""
    defaults = _typed(document.get("defaults", {}), dict, "defaults")
    for key, value in defaults.items():
        if key not in ITEM_KEYS or key == "title":
            raise PlanError(f"defaults.{key}", "not a key [defaults] can give (any item key but title)")
        _typed(value, ITEM_KEYS[key], f"defaults.{key}")
    now = now or datetime.now(UTC)
    return {
        wid: item_of(wid, {**defaults, **_typed(given, dict, f"items.{wid}")}, facts, now)
        for wid, given in document["items"].items()
    }


# ------------------------------------------------------------------ describing (compare, export)


def describe(title: str, parent: str, contract: wp.WorkContract) -> dict[str, Any]:
    """Every field the format carries, defaults filled in: two contracts the format cannot tell
    apart describe alike (an unset dependency policy is all-verified, a currency beside a zero
    financial budget says nothing, ...)."""
    budget = contract.budget
    policy = contract.dependency_policy
    return {
        "title": title,
        "parent": parent,
        "goal": contract.goal,
        "depends_on": list(contract.depends_on_work_item_ids),
        "dependency_policy": name_of(
            DEPENDENCY_POLICIES, policy.kind or wp.DEPENDENCY_POLICY_KIND_ALL_VERIFIED
        ),
        "min_verified": policy.min_verified,
        "deliverables": {
            d.deliverable_id: {
                "description": d.description,
                "media_type": d.media_type,
                "required": d.required,
                "schema_uri": d.schema.uri,
                "schema_version": d.schema.version,
            }
            for d in contract.deliverables
        },
        "criteria": {
            c.criterion_id: {
                "description": c.description,
                "deliverables": list(c.deliverable_ids),
                "required": c.required,
                "independent_review": c.independent_review_required,
                "method_extensions": list(c.method_extensions),
            }
            for c in contract.acceptance_criteria
        },
        "evidence": {
            c.criterion_id: [name_of(EVIDENCE_METHODS, m) for m in c.required_evidence_methods]
            for c in contract.acceptance_criteria
        },
        "inputs": {
            i.name: {
                "artifact": f"blake3:{i.artifact.digest.hex}:{i.artifact.digest.size_bytes}"
                if i.HasField("artifact")
                else "",
                "media_type": i.artifact.media_type,
                "from": i.from_work_item_id,
                "deliverable": i.from_deliverable_id,
                "description": i.description,
            }
            for i in contract.inputs
        },
        "capabilities": [f"{c.capability_id}={c.version}" for c in contract.required_capabilities],
        "budget": {
            "financial": money(budget.financial_micros, ""),
            **{k: getattr(budget, k) for k in BUDGET_KEYS[1:]},
        },
        "deadline": contract.deadline.ToJsonString(),
        "urgency": name_of(URGENCIES, contract.urgency),
        "impact": name_of(IMPACTS, contract.business_impact),
        "impact_note": contract.business_impact_note,
        "risk": name_of(RISKS, contract.risk_class),
        "max_attempts": contract.retry_policy.max_attempts,
        "requires_execution_approval": contract.requires_execution_approval,
        "execution_approvers": list(contract.execution_approver_ids),
        "notes": contract.notes,
    }


def _compact_table(table: dict[str, Any], text_key: str, defaults: dict[str, Any]) -> str | dict[str, Any]:
    kept = {k: v for k, v in table.items() if k == text_key or v != defaults.get(k)}
    return kept[text_key] if list(kept) == [text_key] else kept


def compact(description: dict[str, Any], facts: MissionFacts) -> dict[str, Any]:
    """``description`` as a person would write it: defaults left out, a deliverable or criterion
    that has only a description written as that string. ``describe`` of what it reads back is
    the same (the export round trip)."""
    d = dict(description)
    out: dict[str, Any] = {"title": d.pop("title")}
    defaults = {
        "parent": "",
        "goal": out["title"],
        "depends_on": [],
        "dependency_policy": "all-verified",
        "min_verified": 0,
        "inputs": {},
        "capabilities": [],
        "deadline": facts.deadline.ToJsonString(),
        "impact_note": "",
        "requires_execution_approval": False,
        "execution_approvers": [],
        "notes": "",
    }
    for key, value in d.items():
        if key in defaults and value == defaults[key]:
            continue
        if key in ("deliverables", "criteria"):
            value = {k: _compact_table(v, "description", PART_DEFAULTS[key]) for k, v in value.items()}
        elif key == "inputs":
            value = {k: _compact_input(v) for k, v in value.items()}
        elif key == "budget":
            value = {k: v for k, v in value.items() if v not in (0, "0.00")}
        out[key] = value
    return out


def _compact_input(table: dict[str, Any]) -> str | dict[str, Any]:
    kept = {k: v for k, v in table.items() if v}
    if list(kept) == ["artifact"]:
        return str(kept["artifact"])
    if set(kept) <= {"from", "deliverable"} and "from" in kept:
        return "/".join(kept[k] for k in ("from", "deliverable") if k in kept)
    return kept


def diff(old: Any, new: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(field, before, after) for each leaf that differs; a key one side lacks is one entry, MISSING on that side."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[tuple[str, Any, Any]] = []
        for key in [*old, *(k for k in new if k not in old)]:
            if key not in new:
                out.append((f"{path}{key}", old[key], MISSING))
            elif key not in old:
                out.append((f"{path}{key}", MISSING, new[key]))
            else:
                out += diff(old[key], new[key], f"{path}{key}.")
        return out
    return [] if old == new else [(path.rstrip("."), old, new)]
