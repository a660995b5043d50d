"""The plan ``mwp demo`` carries out: the five WorkItems (``Task``, ``PLAN``, ``TASKS``) with their
goals, deliverables, acceptance criteria and dependencies, the one-line ``STORY`` told about them,
the Mission's and each WorkItem's budget, and the messages built from them: the Mission definition,
each complete work contract, the Evidence a Worker submits per criterion, the structured selection
criteria of an offer and the usage a Worker reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.v1 import common_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp

_clock = SystemClock()


@dataclass(frozen=True)
class Task:
    """One WorkItem of the plan: its contract's goal, single deliverable and acceptance criteria."""

    work_item_id: str
    title: str
    goal: str
    deliverable: str
    criteria: tuple[tuple[str, str], ...]
    depends_on: tuple[str, ...] = ()
    urgency: wp.WorkUrgency.ValueType = wp.WORK_URGENCY_NORMAL


PLAN = (
    Task(
        "extract-eu",
        "Extract the EU ledger",
        "Export every Q3 posting of the EU ledger",
        "eu-ledger.csv",
        (("rows-complete", "every EU posting of Q3 is exported"),),
    ),
    Task(
        "extract-us",
        "Extract the US ledger",
        "Export every Q3 posting of the US ledger",
        "us-ledger.csv",
        (("rows-complete", "every US posting of Q3 is exported"),),
    ),
    Task(
        "reconcile",
        "Reconcile the ledgers",
        "Reconcile the EU and US ledgers in EUR",
        "reconciliation.csv",
        (("balances-match", "intercompany balances match"), ("fx-applied", "ECB month-end rates applied")),
        depends_on=("extract-eu", "extract-us"),
    ),
    Task(
        "report",
        "Write the Q3 report",
        "Write the Q3 report from the reconciled figures",
        "q3-report.md",
        (("figures-cited", "every figure cites the reconciliation"),),
        depends_on=("reconcile",),
    ),
    Task(
        "review-controls",
        "Review access controls",
        "Review who can post to the Q3 ledgers",
        "controls-review.md",
        (("no-open-findings", "no unresolved access findings"),),
        urgency=wp.WORK_URGENCY_HIGH,
    ),
)
TASKS = {task.work_item_id: task for task in PLAN}
STORY = (
    "5 WorkItems, 2 Workers (Worker runtimes): extract-us is preempted for the urgent review-controls and resumes from its "
    "checkpoint; reconcile fails transiently once and is retried; the owner approves the result."
)

MISSION_BUDGET = common_pb2.ResourceVector(
    currency="EUR", financial_micros=20_000_000, tokens=150_000, tool_calls=300
)
ITEM_BUDGET = common_pb2.ResourceVector(
    currency="EUR", financial_micros=2_000_000, tokens=20_000, tool_calls=40
)
MICROS_PER_TOKEN = 100


def usage(tokens: int, tool_calls: int) -> common_pb2.ResourceVector:
    """A usage delta; the demo prices a token at 100 micro-EUR."""
    return common_pb2.ResourceVector(
        tokens=tokens, tool_calls=tool_calls, financial_micros=tokens * MICROS_PER_TOKEN, currency="EUR"
    )


def definition(owner_id: str) -> mission_pb2.MissionDefinition:
    done = (
        ("dod-ledgers", "EU and US ledgers reconciled", "test"),
        ("dod-report", "Q3 report approved", "review"),
    )
    return mission_pb2.MissionDefinition(
        title="Close the Q3 books (mwp demo)",
        objective="Reconcile the Q3 EU and US ledgers and report the figures",
        definition_of_done=[
            mission_pb2.CompletionCriterion(
                criterion_id=cid, description=text, evidence_method=method, required=True
            )
            for cid, text, method in done
        ],
        deadline=to_timestamp(_clock.now() + timedelta(days=3)),
        budget=MISSION_BUDGET,
        risk_policy=mission_pb2.RiskPolicy(risk_class=mission_pb2.RISK_CLASS_LOW),
        owner_id=owner_id,
    )


def contract(task: Task) -> wp.WorkContract:
    """A complete work contract (MW-10.1-01): every item a machine-readable field."""
    c = wp.WorkContract(
        goal=task.goal,
        deliverables=[wp.Deliverable(deliverable_id=task.deliverable, description=task.title, required=True)],
        acceptance_criteria=[
            wp.AcceptanceCriterion(
                criterion_id=cid,
                description=text,
                required_evidence_methods=[wp.EVIDENCE_METHOD_TEST],
                deliverable_ids=[task.deliverable],
                required=True,
            )
            for cid, text in task.criteria
        ],
        depends_on_work_item_ids=list(task.depends_on),
        deadline=to_timestamp(_clock.now() + timedelta(days=1)),
        urgency=task.urgency,
        business_impact=wp.BUSINESS_IMPACT_MEDIUM,
        budget=ITEM_BUDGET,
        retry_policy=wp.RetryPolicy(max_attempts=3),
        time_policy=wp.TimePolicy(),
        cost_policy=wp.CostPolicy(),
        risk_class=mission_pb2.RISK_CLASS_LOW,
    )
    c.retry_policy.initial_backoff.FromSeconds(1)
    c.time_policy.start_deadline.FromSeconds(300)
    c.time_policy.execution_lease_duration.FromSeconds(120)
    return c


def evidence(task: Task, ref: common_pb2.ArtifactRef) -> list[wp.Evidence]:
    """One passing test per acceptance criterion, about the submitted Artifact."""
    return [
        wp.Evidence(
            evidence_id=f"ev-{task.work_item_id}-{cid}",
            subject=wp.EvidenceSubject(work_item_id=task.work_item_id, artifact=ref),
            criterion_id=cid,
            criterion=text,
            method=wp.EVIDENCE_METHOD_TEST,
            result=wp.EVIDENCE_RESULT_PASS,
            summary=f"checked: {text}",
        )
        for cid, text in task.criteria
    ]


def selection(candidate_id: str, membership_epoch: int) -> wp.SelectionCriteria:
    """Structured selection criteria (MW-10.3-10/11): rule and fact ids, never free-form reasoning."""
    return wp.SelectionCriteria(
        candidate_id=candidate_id,
        authorization_eligible=True,
        authorization_basis=[f"membership-epoch:{membership_epoch}"],
        applied_policy_rules=["policy:capability-match", "policy:least-loaded"],
        rank=1,
        expected_cost=usage(3000, 8),
    )
