"""Work contracts from a few fields (MW-10.1-01), checked locally before anything is sent.

A ``WorkContract`` has some twenty fields, every one of which the Authority requires (prose never
replaces one, MW-10.1-07). ``work_contract`` builds a complete one from what differs between
WorkItems: the goal, the deliverables, the acceptance criteria with the Evidence each requires, and
the budget; everything else has a default the Authority accepts (a deadline a day ahead, normal
urgency, medium impact, three attempts, low risk, the Authority's lease durations)::

    contract = work_contract(
        "Reconcile the Q3 ledger",
        deliverables={"report": "the reconciled ledger"},
        criteria={"balances": "every balance matches the bank statement"},
        evidence={"balances": ["test"]},          # criteria not named here require a review
        budget=Budget(tokens=10_000, tool_calls=50, financial="1.50", currency="EUR"),
        depends_on=["extract"],
    )

``validate`` runs the same checks on any contract. Both raise ``ContractError``, whose ``field``
names what is missing or inconsistent (``criteria.balances.evidence``, ``budget.tokens``, ...).
The checks are those of the Authority's contract rules plus a few consistency checks the Authority
does not make (a criterion naming a deliverable the contract lacks, an input from a WorkItem it
does not depend on, an id given twice), so a refused contract is refused here, before sending.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from google.protobuf.duration_pb2 import Duration

from missionweave.kernel import ids
from missionweave.kernel.clock import SystemClock, from_timestamp, to_timestamp
from missionweave.v1 import common_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp

DEFAULT_DEADLINE = timedelta(days=1)
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_EVIDENCE = ("review",)  # what a criterion requires when nobody says otherwise
MAX_GOAL, MAX_IMPACT_NOTE, MAX_NOTES = 4096, 256, 16 * 1024
MIN_LEASE, MAX_LEASE = timedelta(seconds=1), timedelta(hours=24)  # the Authority's bounds on set durations
MICROS = 1_000_000
# The six budget dimensions, in the proto's order (every ResourceVector field but the currency).
DIMENSIONS = tuple(f.name for f in common_pb2.ResourceVector.DESCRIPTOR.fields if f.name != "currency")
_DIGEST = re.compile(r"^blake3:([0-9a-f]{64})(?::(\d+))?$")


# ISO 4217's "no currency": checks a financial budget before the Mission's currency is known.
STAND_IN_CURRENCY = "XXX"


class ContractError(ValueError):
    """A contract that cannot be built or would be refused; ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


def enum_names(enum: Any, prefix: str) -> dict[str, int]:
    """``WORK_URGENCY_HIGH`` -> ``{"high": 3}``; ``EVIDENCE_METHOD_BUSINESS_RULE`` -> ``business-rule``."""
    return {
        name.removeprefix(prefix).lower().replace("_", "-"): number
        for name, number in enum.items()
        if not name.endswith("_UNSPECIFIED")
    }


URGENCIES = enum_names(wp.WorkUrgency, "WORK_URGENCY_")
IMPACTS = enum_names(wp.BusinessImpact, "BUSINESS_IMPACT_")
RISKS = enum_names(mission_pb2.RiskClass, "RISK_CLASS_")
EVIDENCE_METHODS = enum_names(wp.EvidenceMethod, "EVIDENCE_METHOD_")
DEPENDENCY_POLICIES = enum_names(wp.DependencyPolicyKind, "DEPENDENCY_POLICY_KIND_")


def name_of(names: Mapping[str, int], value: int) -> str:
    """The name ``enum_names`` gives ``value`` (its number when it has none)."""
    return next((n for n, v in names.items() if v == value), str(value))


def choice(names: Mapping[str, int], value: str | int, field: str) -> int:
    """``value`` as one of ``names`` (a name in any case, ``_`` or ``-``, or a known number)."""
    if isinstance(value, int) and not isinstance(value, bool) and value in names.values():
        return value
    key = str(value).strip().lower().replace("_", "-")
    if key not in names:
        raise ContractError(field, f"{value!r} is not one of {', '.join(names)}")
    return names[key]


# ------------------------------------------------------------------ the parts


@dataclass(frozen=True)
class Deliverable:
    deliverable_id: str
    description: str
    media_type: str = ""
    required: bool = True
    schema_uri: str = ""  # a well-known schema name (never fetched as identity)
    schema_version: str = ""


@dataclass(frozen=True)
class Criterion:
    """An acceptance criterion and the Evidence methods it requires (MW-13.2-02)."""

    criterion_id: str
    description: str
    evidence: Sequence[str | int] = DEFAULT_EVIDENCE
    deliverables: Sequence[str] = ()  # empty: the WorkItem as a whole
    required: bool = True
    independent_review: bool = False
    method_extensions: Sequence[str] = ()  # the namespaced codes an "other" method accepts


@dataclass(frozen=True)
class Input:
    """An input by content (``artifact``) or the output of a WorkItem this one depends on."""

    name: str
    artifact: str | common_pb2.ArtifactRef | None = None  # "blake3:<hex>[:<size>]"
    from_work_item: str = ""
    from_deliverable: str = ""
    description: str = ""
    media_type: str = ""


@dataclass(frozen=True)
class Budget:
    """The six dimensions (a dimension left at 0 allows nothing in it, OP-02); ``financial`` in
    units of ``currency`` (``"1.50"``), exact to the micro-unit."""

    financial: Decimal | str | int = 0
    currency: str = ""
    tokens: int = 0
    tool_calls: int = 0
    compute_ms: int = 0
    wall_clock_ms: int = 0
    side_effects: int = 0

    def vector(self, field: str = "budget") -> common_pb2.ResourceVector:
        values = {d: whole(getattr(self, d), f"{field}.{d}") for d in DIMENSIONS if d != "financial_micros"}
        return common_pb2.ResourceVector(
            currency=self.currency.upper(),
            financial_micros=micros(self.financial, f"{field}.financial"),
            **values,
        )


def whole(value: object, field: str) -> int:
    """A whole number >= 0 (budget dimensions are unsigned)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ContractError(field, f"a whole number >= 0, not {value!r}")
    return value


def micros(amount: Decimal | str | int | float, field: str) -> int:
    """``"1.50"`` -> 1_500_000: an amount >= 0 with at most six decimals (floats go through their repr)."""
    if isinstance(amount, bool):
        raise ContractError(field, f'an amount such as "1.50", not {amount!r}')
    try:
        value = Decimal(repr(amount) if isinstance(amount, float) else str(amount).strip())
    except InvalidOperation:
        raise ContractError(field, f'an amount such as "1.50", not {amount!r}') from None
    scaled = value * MICROS
    if not value.is_finite() or value < 0 or scaled != scaled.to_integral_value():
        raise ContractError(field, f"an amount >= 0 with at most six decimals, not {amount!r}")
    return int(scaled)


def budget_vector(
    budget: Budget | common_pb2.ResourceVector | Mapping[str, Any], field: str = "budget"
) -> common_pb2.ResourceVector:
    """A ResourceVector from a Budget, a ResourceVector or a mapping of dimension names
    (``financial`` or ``financial_micros``, ``tokens``, ... , ``currency``)."""
    if isinstance(budget, common_pb2.ResourceVector):
        return budget
    if isinstance(budget, Budget):
        return budget.vector(field)
    values = dict(budget)
    unknown = set(values) - {"financial", "financial_micros", "currency", *DIMENSIONS}
    if unknown:
        raise ContractError(
            f"{field}.{sorted(unknown)[0]}",
            f"not a budget dimension (one of financial, {', '.join(DIMENSIONS[1:])})",
        )
    if "financial_micros" in values:
        if "financial" in values:
            raise ContractError(f"{field}.financial", "give financial or financial_micros, not both")
        values["financial"] = (
            Decimal(whole(values.pop("financial_micros"), f"{field}.financial_micros")) / MICROS
        )
    currency = values.pop("currency", "")
    if not isinstance(currency, str):
        raise ContractError(f"{field}.currency", f"an ISO 4217 code, not {currency!r}")
    return Budget(currency=currency, **values).vector(field)


def artifact_ref(
    value: str | common_pb2.ArtifactRef, field: str, media_type: str = ""
) -> common_pb2.ArtifactRef:
    """``blake3:<64 lowercase hex>[:<size>]`` -> ArtifactRef (Artifacts are named by content, MW-13.1-06)."""
    if isinstance(value, common_pb2.ArtifactRef):
        return value
    match = _DIGEST.match(str(value).strip())
    if match is None:
        raise ContractError(field, f"{value!r} is not blake3:<64 lowercase hex>[:<size>]")
    digest = common_pb2.Digest(algorithm="blake3", hex=match[1], size_bytes=int(match[2] or 0))
    return common_pb2.ArtifactRef(digest=digest, media_type=media_type)


def capability(value: str | membership_pb2.Capability, field: str) -> membership_pb2.Capability:
    """``code.python=3.0`` (or ``code.python@3.0``) -> Capability."""
    if isinstance(value, membership_pb2.Capability):
        return value
    name, _, version = str(value).replace("@", "=", 1).partition("=")
    if not name.strip() or not version.strip():
        raise ContractError(field, f"{value!r} is not ID=VERSION, e.g. code.python=3.0")
    return membership_pb2.Capability(capability_id=name.strip(), version=version.strip())


def duration(value: timedelta | None, field: str) -> Duration | None:
    if value is None:
        return None
    if not MIN_LEASE <= value <= MAX_LEASE:
        raise ContractError(field, "must lie within 1 s .. 24 h")
    out = Duration()
    out.FromTimedelta(value)
    return out


# ------------------------------------------------------------------ the builder


def _deliverables(given: Mapping[str, str] | Iterable[Deliverable]) -> list[wp.Deliverable]:
    parts = [Deliverable(k, v) for k, v in given.items()] if isinstance(given, Mapping) else list(given)
    out = []
    for d in parts:
        proto = wp.Deliverable(
            deliverable_id=d.deliverable_id,
            description=d.description,
            media_type=d.media_type,
            required=d.required,
        )
        if d.schema_uri or d.schema_version:
            proto.schema.CopyFrom(wp.SchemaRef(uri=d.schema_uri, version=d.schema_version))
        out.append(proto)
    return out


def _criteria(
    given: Mapping[str, str] | Iterable[Criterion], evidence: Mapping[str, Sequence[str | int]]
) -> list[wp.AcceptanceCriterion]:
    parts = [Criterion(k, v) for k, v in given.items()] if isinstance(given, Mapping) else list(given)
    known = {c.criterion_id for c in parts}
    for name in evidence:
        if name not in known:
            raise ContractError(
                f"evidence.{name}",
                f"no acceptance criterion {name!r} (criteria: {', '.join(sorted(known)) or 'none'})",
            )
    out = []
    for c in parts:
        methods = evidence.get(c.criterion_id, c.evidence)
        where = (
            f"evidence.{c.criterion_id}"
            if c.criterion_id in evidence
            else f"criteria.{c.criterion_id}.evidence"
        )
        if isinstance(methods, str):  # one method named alone
            methods = [methods]
        out.append(
            wp.AcceptanceCriterion(
                criterion_id=c.criterion_id,
                description=c.description,
                required_evidence_methods=[choice(EVIDENCE_METHODS, m, where) for m in methods],  # type: ignore[misc]
                method_extensions=list(c.method_extensions),
                deliverable_ids=list(c.deliverables),
                independent_review_required=c.independent_review,
                required=c.required,
            )
        )
    return out


def _inputs(given: Iterable[Input]) -> list[wp.WorkInput]:
    out = []
    for i in given:
        proto = wp.WorkInput(
            name=i.name,
            from_work_item_id=i.from_work_item,
            from_deliverable_id=i.from_deliverable,
            description=i.description,
        )
        if i.artifact is not None:
            proto.artifact.CopyFrom(artifact_ref(i.artifact, f"inputs.{i.name}.artifact", i.media_type))
        out.append(proto)
    return out


def _deadline(deadline: datetime | timedelta | None, now: datetime) -> datetime:
    if deadline is None:
        return now + DEFAULT_DEADLINE
    if isinstance(deadline, timedelta):
        return now + deadline
    if deadline.tzinfo is None:
        raise ContractError("deadline", "give the time zone (the Authority compares it with its UTC clock)")
    return deadline


def work_contract(
    goal: str,
    *,
    deliverables: Mapping[str, str] | Iterable[Deliverable],
    criteria: Mapping[str, str] | Iterable[Criterion],
    budget: Budget | common_pb2.ResourceVector | Mapping[str, Any],
    evidence: Mapping[str, Sequence[str | int]] | None = None,
    inputs: Iterable[Input] = (),
    depends_on: Iterable[str] = (),
    dependency_policy: str | int = "all-verified",
    min_verified: int = 0,
    capabilities: Iterable[str | membership_pb2.Capability] = (),
    deadline: datetime | timedelta | None = None,
    urgency: str | int = "normal",
    impact: str | int = "medium",
    impact_note: str = "",
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    initial_backoff: timedelta | None = None,
    max_backoff: timedelta | None = None,
    start_deadline: timedelta | None = None,
    execution_lease: timedelta | None = None,
    attempt_time_limit: timedelta | None = None,
    risk: str | int = "low",
    requires_execution_approval: bool = False,
    execution_approvers: Iterable[str] = (),
    permissions: wp.ExecutionPermissions | None = None,
    notes: str = "",
    currency: str | None = None,
    now: datetime | None = None,
) -> wp.WorkContract:
    """A complete, locally validated WorkContract (see the module's docstring). ``deliverables``
    and ``criteria`` map ids to descriptions (or are lists of Deliverable / Criterion for more
    options); ``evidence`` maps a criterion id to the Evidence methods it requires (``test``,
    ``review``, ``schema``, ``business-rule``, ...; default ``review``). ``deadline`` is a time with
    its zone or a span from ``now``. ``currency`` (the Mission budget's) fills in a budget that
    names none and must match one that does."""
    now = now or SystemClock().now()
    vector = budget_vector(budget)
    if currency is not None:
        if not vector.currency:
            vector.currency = currency.upper()
        elif vector.financial_micros and vector.currency != currency.upper():
            raise ContractError(
                "budget.currency", f"the Mission's budget is in {currency.upper()}, not {vector.currency}"
            )
    contract = wp.WorkContract(
        goal=goal,
        deliverables=_deliverables(deliverables),
        acceptance_criteria=_criteria(criteria, evidence or {}),
        inputs=_inputs(inputs),
        depends_on_work_item_ids=list(depends_on),
        required_capabilities=[capability(c, f"capabilities[{i}]") for i, c in enumerate(capabilities)],
        deadline=to_timestamp(_deadline(deadline, now)),
        urgency=choice(URGENCIES, urgency, "urgency"),  # type: ignore[arg-type]
        business_impact=choice(IMPACTS, impact, "impact"),  # type: ignore[arg-type]
        business_impact_note=impact_note,
        budget=vector,
        retry_policy=wp.RetryPolicy(
            max_attempts=max_attempts,
            initial_backoff=duration(initial_backoff, "initial_backoff"),
            max_backoff=duration(max_backoff, "max_backoff"),
        ),
        time_policy=wp.TimePolicy(
            start_deadline=duration(start_deadline, "start_deadline"),
            execution_lease_duration=duration(execution_lease, "execution_lease"),
            attempt_time_limit=duration(attempt_time_limit, "attempt_time_limit"),
        ),
        cost_policy=wp.CostPolicy(),
        risk_class=choice(RISKS, risk, "risk"),  # type: ignore[arg-type]
        requires_execution_approval=requires_execution_approval,
        execution_approver_ids=list(execution_approvers),
        permissions=permissions,
        notes=notes,
    )
    kind = choice(DEPENDENCY_POLICIES, dependency_policy, "dependency_policy")
    if kind != wp.DEPENDENCY_POLICY_KIND_ALL_VERIFIED or min_verified:
        contract.dependency_policy.CopyFrom(wp.DependencyPolicy(kind=kind, min_verified=min_verified))  # type: ignore[arg-type]
    return validate(contract, now=now, currency=currency)


# ------------------------------------------------------------------ validation


def _unique(values: Iterable[str], field: str) -> None:
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ContractError(f"{field}.{v}", "given twice")
        seen.add(v)


def _check_id(value: str, field: str) -> None:
    if not ids.is_valid(value):
        raise ContractError(field, f"{value!r} is not an id (1..128 of A-Z a-z 0-9 . _ : -)")


def _check_parts(contract: wp.WorkContract) -> None:
    if not contract.deliverables:
        raise ContractError("deliverables", "at least one deliverable is required")
    for i, d in enumerate(contract.deliverables):
        _check_id(d.deliverable_id, f"deliverables[{i}].deliverable_id")
        if not d.description.strip():
            raise ContractError(f"deliverables.{d.deliverable_id}.description", "a description is required")
    _unique((d.deliverable_id for d in contract.deliverables), "deliverables")
    if not contract.acceptance_criteria:
        raise ContractError("criteria", "at least one acceptance criterion is required")
    deliverables = {d.deliverable_id for d in contract.deliverables}
    for i, c in enumerate(contract.acceptance_criteria):
        _check_id(c.criterion_id, f"criteria[{i}].criterion_id")
        where = f"criteria.{c.criterion_id}"
        if not c.description.strip():
            raise ContractError(f"{where}.description", "a description is required")
        if not c.required_evidence_methods:
            raise ContractError(f"{where}.evidence", "name the Evidence methods it requires (at least one)")
        if wp.EVIDENCE_METHOD_OTHER in c.required_evidence_methods and not c.method_extensions:
            raise ContractError(
                f"{where}.method_extensions", "the method 'other' needs the namespaced codes it accepts"
            )
        for named in c.deliverable_ids:
            if named not in deliverables:
                raise ContractError(f"{where}.deliverables", f"no deliverable {named!r} in this contract")
    _unique((c.criterion_id for c in contract.acceptance_criteria), "criteria")


def _check_graph(contract: wp.WorkContract) -> None:
    for i, dep in enumerate(contract.depends_on_work_item_ids):
        _check_id(dep, f"depends_on[{i}]")
    _unique(contract.depends_on_work_item_ids, "depends_on")
    depends = set(contract.depends_on_work_item_ids)
    for i, inp in enumerate(contract.inputs):
        where = f"inputs.{inp.name}" if inp.name else f"inputs[{i}]"
        if not inp.name.strip():
            raise ContractError(f"{where}.name", "an input needs a name")
        if inp.HasField("artifact") == bool(inp.from_work_item_id):
            raise ContractError(where, "name an Artifact or the WorkItem that produces it (one of them)")
        if inp.from_work_item_id and inp.from_work_item_id not in depends:
            raise ContractError(f"{where}.from", f"{inp.from_work_item_id} is not among depends_on")
        digest = inp.artifact.digest
        if inp.HasField("artifact") and (
            digest.algorithm != "blake3" or not re.fullmatch(r"[0-9a-f]{64}", digest.hex)
        ):
            raise ContractError(f"{where}.artifact", "a blake3 digest of 64 lowercase hex characters")
    _unique((i.name for i in contract.inputs), "inputs")
    for i, cap in enumerate(contract.required_capabilities):
        if not cap.capability_id or not cap.version:
            raise ContractError(f"capabilities[{i}]", "capability id and version are required")


def _check_budget(budget: common_pb2.ResourceVector, currency: str | None) -> None:
    if budget.financial_micros < 0:
        raise ContractError("budget.financial", "an amount >= 0")
    if budget.financial_micros and not re.fullmatch(r"[A-Z]{3}", budget.currency):
        raise ContractError("budget.currency", "an ISO 4217 code is required for a financial budget")
    if currency and budget.financial_micros and budget.currency != currency.upper():
        raise ContractError("budget.currency", f"must be the Mission budget's currency, {currency.upper()}")


def _check_policies(contract: wp.WorkContract) -> None:
    if contract.retry_policy.max_attempts < 1:
        raise ContractError("max_attempts", "at least one attempt")
    for name in ("initial_backoff", "max_backoff"):
        _check_duration(getattr(contract.retry_policy, name), name)
    if not contract.HasField("time_policy"):
        raise ContractError(
            "time_policy", "a time policy is required (unset durations take the Authority's defaults)"
        )
    for name in (
        "start_deadline",
        "execution_lease_duration",
        "checkpoint_ownership_duration",
        "blocked_lease_duration",
    ):
        _check_duration(getattr(contract.time_policy, name), f"time_policy.{name}")
    if not contract.HasField("cost_policy"):
        raise ContractError("cost_policy", "a cost policy is required (an empty one: only the budget caps)")


def _check_duration(value: Duration, field: str) -> None:
    if (value.seconds or value.nanos) and not MIN_LEASE <= value.ToTimedelta() <= MAX_LEASE:
        raise ContractError(field, "must lie within 1 s .. 24 h")


def validate(
    contract: wp.WorkContract, *, now: datetime | None = None, currency: str | None = None
) -> wp.WorkContract:
    """Every check the Authority makes on a contract that needs no Group state (and the
    consistency checks above), naming the first field that fails; returns the contract."""
    if not 1 <= len(contract.goal) <= MAX_GOAL or not contract.goal.strip():
        raise ContractError("goal", f"a goal of 1..{MAX_GOAL} characters is required")
    _check_parts(contract)
    _check_graph(contract)
    if not contract.HasField("deadline"):
        raise ContractError("deadline", "a deadline is required")
    if from_timestamp(contract.deadline) <= (now or datetime.now(UTC)):
        raise ContractError(
            "deadline", f"{from_timestamp(contract.deadline).isoformat()} is not in the future"
        )
    if not contract.urgency:
        raise ContractError("urgency", f"one of {', '.join(URGENCIES)}")
    if not contract.business_impact:
        raise ContractError("impact", f"one of {', '.join(IMPACTS)}")
    if len(contract.business_impact_note) > MAX_IMPACT_NOTE:
        raise ContractError("impact_note", f"at most {MAX_IMPACT_NOTE} characters")
    if not contract.HasField("budget"):
        raise ContractError("budget", "a budget is required (a dimension at 0 allows nothing in it)")
    _check_budget(contract.budget, currency)
    _check_policies(contract)
    if not contract.risk_class:
        raise ContractError("risk", f"one of {', '.join(RISKS)}")
    if len(contract.notes) > MAX_NOTES:
        raise ContractError("notes", f"at most {MAX_NOTES} characters of prose")
    return contract
