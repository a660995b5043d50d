"""``mwp demo``: one complete small Mission against a running mesh, narrated event by event.

Four fresh identities (a unique suffix per run, so the demo can run again and again) act in-process,
each with its own generated key and session: a human MissionOwner, a Coordinator agent and two
Worker agents. The owner creates a Mission and admits the Workers; the Coordinator plans a DAG of
five WorkItems and offers each one with structured selection criteria once its dependencies are
verified. The Workers are Worker runtimes (``missionweave.sdk.worker``), each an agent on the
gateway: the runtime answers an offer after admission control by the Worker's own scheduler,
places accepted work into its slot, starts it under an execution lease and submits what the demo's
handler made: a real deliverable, which reads the upstream WorkItems' Artifacts through its slot and
is stored through it (uploaded with a manifest signed under the lease, its inputs as sources), and
Evidence for every acceptance criterion; the handler reports usage under the lease. The Coordinator verifies each result. On the way one Worker
is preempted cooperatively (its handler stops at a safe point, the runtime checkpoints and the work
resumes later), one handler saves a draft checkpoint and carries on from it, and one WorkItem fails
transiently and is retried. Finally the Coordinator submits the Mission and the owner approves it.

The timeline is the Group's log as the MissionOwner reads it, each event when it arrived.
``run_demo(mesh, admin_key, target=...)`` is the scenario (the tests run it against an in-process
mesh) and returns the timeline and the derived progress; ``cmd_demo`` is the thin CLI around it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import secrets
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import grpc
from google.protobuf.message import Message
from nacl.signing import SigningKey

from missionweave import ids
from missionweave.cli.common import CliError, add_json_flag, client_tls, emit, enum_label, target, to_dict
from missionweave.cli.progress import render_text
from missionweave.clock import SystemClock, to_timestamp
from missionweave.config import Settings
from missionweave.rpc.channels import ClientTLS
from missionweave.rpc.status import rejection_from_rpc_error
from missionweave.sdk.agent import Agent
from missionweave.sdk.client import MeshClient, SessionSigner, decode_events
from missionweave.sdk.worker import Failed, Paused, Slot, WorkerRuntime, WorkResult
from missionweave.signing import read_key
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import common_pb2, conversation_pb2, event_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp

DEFAULT_TARGET = "127.0.0.1:50051"
WAIT_S = 60.0  # the longest the Coordinator waits for a Worker to act
OFFER_ROUNDS = 5  # offers of one WorkItem to a Worker that keeps declining
REOFFER_DELAY_S = 0.2
_clock = SystemClock()
worker_log = logging.getLogger("missionweave.sdk.worker")

# ------------------------------------------------------------------ the plan


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


# ------------------------------------------------------------------ the timeline


def _label(enum: Any, value: int, prefix: str) -> str:
    return enum_label(enum, value, prefix).lower().replace("_", " ")


def _joined(values: Any) -> str:
    return ", ".join(values)


def _vector(v: common_pb2.ResourceVector) -> str:
    return f"tokens {v.tokens}, tool calls {v.tool_calls}, {v.financial_micros / 1e6:.2f} {v.currency}"


def _digests(refs: Any) -> str:
    return _joined(f"blake3:{r.digest.hex[:12]}… ({r.digest.size_bytes} B)" for r in refs)


def _revoked(p: wp.LeaseRevoked) -> str:
    cause = _label(wp.LeaseRevocationCause, p.cause, "LEASE_REVOCATION_CAUSE_")
    state = _label(wp.WorkItemState, p.resulting_state, "WORK_ITEM_STATE_")
    retry = " for an automatic retry after its backoff" if p.HasField("retry_not_before") else ""
    return f"lease {p.lease_id} revoked ({cause}) -> {state}{retry}"


def _unless_empty(text: str, value: object) -> str:
    """``text`` when ``value`` is set, else nothing."""
    return text if value else ""


_DETAILS: dict[str, Callable[[Any], str]] = {
    "mission_created": lambda p: (
        f'{p.mission_id} "{p.definition.title}", budget {_vector(p.definition.budget)}'
    ),
    "conversation_opened": lambda p: (
        f"{_label(conversation_pb2.ConversationKind, p.kind, 'CONVERSATION_KIND_')} conversation {p.conversation_id}"
    ),
    "membership_granted": lambda p: (
        f"{p.membership.member_id} joins as {_label(membership_pb2.MemberRole, p.membership.role, 'MEMBER_ROLE_')} "
        f"(membership epoch {p.membership.membership_epoch})"
    ),
    "coordinator_lease_granted": lambda p: (
        f"{p.lease.agent_id} coordinates (epoch {p.lease.coordinator_epoch})"
    ),
    "work_authorized": lambda p: (
        f'"{p.title}"'
        + _unless_empty(
            f" after {_joined(p.contract.depends_on_work_item_ids)}", p.contract.depends_on_work_item_ids
        )
    ),
    "work_offered": lambda p: (
        f"offer {p.offer_id} to {_joined(p.candidate_ids)} "
        f"({_joined(p.selection_criteria[0].applied_policy_rules)})"
    ),
    "work_offer_accepted": lambda p: f"{p.agent_id} owns it, ownership epoch {p.ownership.ownership_epoch}",
    "work_offer_declined": lambda p: (
        f"{p.agent_id} declines {p.offer_id} ({_label(wp.DeclineReason, p.decline.reason, 'DECLINE_REASON_')}"
        + _unless_empty(f": {p.decline.detail}", p.decline.detail)
        + ")"
    ),
    "work_offers_withdrawn": lambda p: f"offers {_joined(p.offer_ids)} withdrawn",
    "work_started": lambda p: (
        f"execution lease {p.lease.lease_id}, attempt {p.lease.attempt}"
        + _unless_empty(
            f", resumes from checkpoint {p.resume_from_checkpoint_id}", p.resume_from_checkpoint_id
        )
    ),
    "work_lease_renewed": lambda p: (
        f"lease {p.lease_id} renewed for {p.renewal.expires_at.seconds - p.renewal.renewed_at.seconds} s"
    ),
    "resource_usage_recorded": lambda p: f"used {_vector(p.delta)}",
    "work_preemption_requested": lambda p: (
        f"preemption {p.preemption_request_id} ({_label(wp.PreemptionReason, p.reason, 'PREEMPTION_REASON_')}): "
        "checkpoint at a safe point"
    ),
    "work_checkpointed": lambda p: (
        f"checkpoint {p.checkpoint.checkpoint_id}"
        + _unless_empty(f" answers {p.preemption_request_id}", p.preemption_request_id)
        + " -> queued, slot released"
    ),
    "lease_revoked": _revoked,
    "work_failed": lambda p: (
        f"{_label(wp.WorkFailureKind, p.kind, 'WORK_FAILURE_KIND_')}: {p.reason} "
        f"(evidence {_joined(e.evidence_id for e in p.evidence)})"
    ),
    "work_submitted": lambda p: (
        f"{_digests(p.artifacts)}; evidence {_joined(e.evidence_id for e in p.evidence)}"
    ),
    "work_result_accepted": lambda p: f"verified (submission {p.submission_event_id})",
    "mission_submitted": lambda p: f"revision {p.mission_revision} for approval with {_digests(p.artifacts)}",
    "mission_approved": lambda p: f'approved: "{p.comment}"',
}


def _field(message: Message, *path: str) -> int:
    """An integer field at ``path``, 0 where the message has no such field."""
    value: Any = message
    for name in path:
        if name not in value.DESCRIPTOR.fields_by_name:
            return 0
        value = getattr(value, name)
    return int(value)


@dataclass(frozen=True)
class TimelineEntry:
    """One line of the timeline: a Group event (``sequence`` > 0) or a registration."""

    offset_s: float
    actor: str
    event_type: str
    detail: str
    sequence: int = 0
    work_item_id: str = ""
    ownership_epoch: int = 0
    attempt: int = 0


def entry_of(event: event_pb2.Event, offset_s: float) -> TimelineEntry:
    kind = event.WhichOneof("payload") or ""
    payload = getattr(event, kind) if kind else event
    work_item_id = str(getattr(payload, "work_item_id", ""))
    detail = _DETAILS.get(kind, lambda _: "")(payload)
    return TimelineEntry(
        offset_s=round(offset_s, 3),
        actor=event.actor_id,
        event_type=event.type,
        detail=f"{work_item_id}: {detail}" if work_item_id else detail,
        sequence=event.sequence,
        work_item_id=work_item_id,
        ownership_epoch=_field(payload, "ownership_epoch")
        or _field(payload, "ownership", "ownership_epoch")
        or _field(payload, "lease", "ownership_epoch"),
        attempt=_field(payload, "lease", "attempt") or _field(payload, "attempts"),
    )


@dataclass
class Timeline:
    """The events the demo caused, in order; ``step`` names the command in flight (for a refusal)."""

    entries: list[TimelineEntry] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    step: str = ""

    def offset(self) -> float:
        return time.monotonic() - self.started

    def note(self, actor: str, event_type: str, detail: str) -> None:
        self.entries.append(TimelineEntry(round(self.offset(), 3), actor, event_type, detail))

    def record(self, events: list[event_pb2.Event]) -> None:
        offset = self.offset()
        self.entries += [entry_of(event, offset) for event in events]

    def lines(self) -> list[str]:
        if not self.entries:
            return []
        actor = max(len(e.actor) for e in self.entries)
        kind = max(len(e.event_type) for e in self.entries)
        return [
            f"  {e.offset_s:>+7.2f}s  {e.actor:<{actor}}  {e.event_type:<{kind}}  {e.detail}".rstrip()
            for e in self.entries
        ]


# ------------------------------------------------------------------ the scenario


@dataclass(frozen=True)
class WorkerIdentity:
    """A Worker of the cast: its key only; its Worker runtime's agent opens its session."""

    identity_id: str
    key: SigningKey


@dataclass(frozen=True)
class Cast:
    owner: SessionSigner
    coordinator: SessionSigner
    worker_a: WorkerIdentity
    worker_b: WorkerIdentity

    def identities(self) -> dict[str, str]:
        return {role: member.identity_id for role, member in vars(self).items()}


ROLES = (
    ("owner", "ada", common_pb2.IDENTITY_KIND_HUMAN, "Ada, the MissionOwner"),
    ("coordinator", "coord", common_pb2.IDENTITY_KIND_AGENT, "the Coordinator agent"),
    ("worker_a", "worker-a", common_pb2.IDENTITY_KIND_AGENT, "Worker agent A"),
    ("worker_b", "worker-b", common_pb2.IDENTITY_KIND_AGENT, "Worker agent B"),
)
WORKER_ROLES = ("worker_a", "worker_b")


async def register_cast(
    mesh: MeshClient, admin_id: str, admin_key: SigningKey, timeline: Timeline, suffix: str
) -> Cast:
    """Registers the four identities (signed by the admin); opens the owner's and the Coordinator's
    sessions (the Workers' agents open their own when they connect)."""
    members: dict[str, SessionSigner | WorkerIdentity] = {}
    for role, name, kind, display in ROLES:
        identity_id, key = f"{name}-{suffix}", SigningKey.generate()
        timeline.step = f"identity registration of {identity_id}"
        await mesh.register_identity(admin_id, admin_key, identity_id, kind, bytes(key.verify_key), display)
        kind_label = _label(common_pb2.IdentityKind, kind, "IDENTITY_KIND_")
        if role in WORKER_ROLES:
            members[role] = WorkerIdentity(identity_id, key)
            detail = f"{identity_id} ({kind_label}, {display}); served by a Worker runtime"
        else:
            signer = await mesh.open_session(identity_id, key)
            members[role] = signer
            detail = f"{identity_id} ({kind_label}, {display}); session epoch {signer.session_epoch} opened"
        timeline.note(admin_id, "identity.registered", detail)
    mesh.read_as(cast(SessionSigner, members["owner"]))  # the demo's reads (state, progress) are the MissionOwner's
    return Cast(**members)  # type: ignore[arg-type]


class GroupWatch:
    """Follows the Group's log as the MissionOwner: every event goes to the timeline as it arrives,
    and the Coordinator waits here for what the Workers' runtimes did."""

    def __init__(self, mesh: MeshClient, group_id: str, timeline: Timeline) -> None:
        self.mesh, self.group_id, self.timeline = mesh, group_id, timeline
        self.events: list[event_pb2.Event] = []
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name=f"demo-watch-{self.group_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _follow(self) -> None:
        try:
            async for event in self.mesh.read_events(self.group_id, follow=True):
                self.timeline.record([event])
                async with self._changed:
                    self.events.append(event)
                    self._changed.notify_all()
        finally:
            async with self._changed:  # a waiter learns that nothing more will come
                self._changed.notify_all()

    async def wait_for(self, payload: str, work_item_id: str = "", *, skip: int = 0) -> event_pb2.Event:
        """The ``skip``-th (from 0) event carrying ``payload`` for ``work_item_id``, once it arrived."""
        return await self.first_of((payload,), work_item_id, skip=skip)

    async def first_of(
        self, payloads: tuple[str, ...], work_item_id: str = "", offer_id: str = "", *, skip: int = 0
    ) -> event_pb2.Event:
        """The ``skip``-th (from 0) event carrying one of ``payloads`` for ``work_item_id`` (and
        ``offer_id``, where given), once it arrived."""
        payload = " or ".join(payloads)
        self.timeline.step = f"waiting for {payload} of {work_item_id or self.group_id}"

        def about(e: event_pb2.Event) -> bool:
            kind = e.WhichOneof("payload") or ""
            if kind not in payloads:
                return False
            body = getattr(e, kind)
            return (not work_item_id or getattr(body, "work_item_id", "") == work_item_id) and (
                not offer_id or getattr(body, "offer_id", "") == offer_id
            )

        def matching() -> list[event_pb2.Event]:
            return [e for e in self.events if about(e)]

        def ready() -> bool:
            return len(matching()) > skip or (self._task is not None and self._task.done())

        try:
            async with asyncio.timeout(WAIT_S), self._changed:
                await self._changed.wait_for(ready)
        except TimeoutError:
            raise CliError(f"the demo waited {WAIT_S:.0f} s for {payload} of {work_item_id}") from None
        found = matching()
        if len(found) > skip:
            return found[skip]
        assert self._task is not None
        self._task.result()  # the stream failed: its error
        raise CliError(f"the Group's event stream ended before {payload} of {work_item_id}")


class DemoWorker:
    """One Worker of the demo: an agent on the gateway and a WorkerRuntime serving the Group. The
    runtime answers offers after admission control, starts, renews the lease and submits; the
    handler does the demo's scripted work, reporting usage under its lease."""

    def __init__(self, run: MissionRun, identity: WorkerIdentity) -> None:
        self.run, self.identity = run, identity
        self.identity_id = identity.identity_id
        self.agent: Agent | None = None
        self.runtime: WorkerRuntime | None = None
        self.failed: set[str] = set()  # WorkItems whose first attempt already failed

    async def start(self, target: str, tls: ClientTLS | None, state_dir: Path) -> None:
        self.run.timeline.step = f"connecting {self.identity_id}'s Worker runtime to {target}"
        self.agent = await Agent.connect(target, self.identity_id, self.identity.key, cursor_dir=state_dir, tls=tls)
        self.run.timeline.note(
            self.identity_id, "session.opened",
            f"session epoch {self.agent.session.session_epoch} opened by its Worker runtime's agent (gateway HELLO)",
        )
        self.runtime = WorkerRuntime(self.agent, self.handle)
        await self.runtime.serve([self.run.group_id])

    async def close(self) -> None:
        if self.runtime is not None:
            await self.runtime.close()
        if self.agent is not None:
            await self.agent.close()

    async def _execute(self, slot: Slot, kind: str, body: Message) -> list[event_pb2.Event]:
        assert self.agent is not None
        return decode_events((await self.agent.execute(slot.group_id, kind, body)).events)

    async def report_usage(self, slot: Slot, spent: common_pb2.ResourceVector) -> None:
        """A lease renewal carrying the usage so far (the runtime renews on its own schedule too)."""
        body = wp.WorkRenewLease(
            work_item_id=slot.work_item_id, lease_id=slot.lease_id, ownership_epoch=slot.ownership_epoch, usage_delta=spent
        )
        await self._execute(slot, "work_renew_lease", body)

    def checkpoint(self, slot: Slot) -> Paused:
        wid = slot.work_item_id
        return Paused(wp.Checkpoint(
            checkpoint_id=self.run.next_id(f"ck-{wid}"),
            completed_operation_ids=[f"{wid}:part-1"],
            taken_at=to_timestamp(_clock.now()),
        ))

    async def handle(self, slot: Slot) -> WorkResult | Paused | Failed:
        task, wid = TASKS[slot.work_item_id], slot.work_item_id
        resumed = bool(slot.resume_from_checkpoint_id)
        if wid == "extract-us" and not resumed:
            await self.report_usage(slot, usage(2100, 5))
            # Works until the Coordinator asks for the slot back; stops at its next safe point.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.preemption_requested.wait(), WAIT_S)
            if slot.preemption_requested.is_set():
                return self.checkpoint(slot)
        elif wid == "report" and not resumed:
            await self.report_usage(slot, usage(1500, 2))
            return self.checkpoint(slot)  # a draft saved; the next placement carries on from it
        elif wid == "reconcile" and wid not in self.failed:
            self.failed.add(wid)
            await self.report_usage(slot, usage(2500, 7))
            # The Authority retries it after the contract's backoff; the scheduler places the next
            # attempt once that has passed.
            return transient_failure(slot)
        # The deliverable cites each input it read (verified on read); stored through the slot it is
        # uploaded with a manifest signed under this lease naming those inputs as its sources.
        lines = [task.deliverable, task.goal]
        for given in slot.inputs:
            data = await slot.read(given)
            lines.append(f"uses {given.name}: blake3:{given.ref.digest.hex[:12]}... ({len(data)} bytes)")
        ref = await slot.put(("\n".join(lines) + "\n").encode(), media_type="text/markdown")
        return WorkResult(evidence=evidence(task, ref), summary=f"{task.deliverable} ready", usage=FINAL_USAGE[wid])


def transient_failure(slot: Slot) -> Failed:
    """A transient failure with Evidence (the runtime reports it under the slot's lease)."""
    observed = wp.Evidence(
        evidence_id=f"ev-{slot.work_item_id}-timeout",
        method=wp.EVIDENCE_METHOD_FAILURE_OBSERVATION,
        result=wp.EVIDENCE_RESULT_FAIL,
        summary="GET /fx-rates timed out after 30 s, three times",
    )
    return Failed(
        kind=wp.WORK_FAILURE_KIND_TRANSIENT, reason="the FX-rate service timed out", evidence=[observed], usage=usage(300, 3)
    )


# The usage each WorkItem's last (submitting) run reports.
FINAL_USAGE = {
    "extract-eu": usage(2900, 7),
    "extract-us": usage(900, 2),
    "review-controls": usage(1700, 8),
    "reconcile": usage(2200, 6),
    "report": usage(1300, 3),
}


class MissionRun:
    """Drives one Group: the owner's and the Coordinator's commands signed by their own sessions;
    the Workers are Worker runtimes reacting to what the Coordinator does."""

    def __init__(self, mesh: MeshClient, cast: Cast, timeline: Timeline) -> None:
        self.mesh, self.cast, self.timeline = mesh, cast, timeline
        self.group_id = ids.new_id("grp")
        self.mission_id = ""
        self.coordinator_epoch = 0
        self.epochs: dict[str, int] = {}  # Membership epochs, learnt from membership.granted
        self._ids: Counter[str] = Counter()
        self.watch = GroupWatch(mesh, self.group_id, timeline)
        self.workers = {role: DemoWorker(self, getattr(cast, role)) for role in WORKER_ROLES}
        self._verified: Counter[str] = Counter()

    def next_id(self, prefix: str) -> str:
        self._ids[prefix] += 1
        return f"{prefix}-{self._ids[prefix]}"

    async def execute(self, signer: SessionSigner, kind: str, body: Message) -> list[event_pb2.Event]:
        self.timeline.step = f"{kind} by {signer.identity_id}"
        command = signer.command(
            self.group_id, kind, body, membership_epoch=self.epochs.get(signer.identity_id, 0)
        )
        events = decode_events((await self.mesh.execute(signer.sign(command))).events)
        for event in events:
            self._learn(event)
        return events

    def _learn(self, event: event_pb2.Event) -> None:
        kind = event.WhichOneof("payload")
        if kind == "membership_granted":
            self.epochs[event.membership_granted.membership.member_id] = (
                event.membership_granted.membership.membership_epoch
            )
        elif kind == "coordinator_lease_granted":
            self.coordinator_epoch = event.coordinator_lease_granted.lease.coordinator_epoch
        elif kind == "mission_created":
            self.mission_id = event.mission_created.mission_id

    async def coordinate(self, kind: str, body: Message) -> list[event_pb2.Event]:
        return await self.execute(self.cast.coordinator, kind, body)

    # -------------------------------------------------------------- the Mission

    async def create_mission(self) -> None:
        owner = self.cast.owner
        body = mission_pb2.MissionCreate(
            definition=definition(owner.identity_id), coordinator_id=self.cast.coordinator.identity_id
        )
        await self.execute(owner, "mission_create", body)
        self.watch.start()
        for role in WORKER_ROLES:
            grant = membership_pb2.MembershipGrant(
                member_id=self.workers[role].identity_id, role=membership_pb2.MEMBER_ROLE_WORKER
            )
            await self.execute(owner, "membership_grant", grant)

    async def start_workers(self, target: str, tls: ClientTLS | None, state_dir: Path) -> None:
        for worker in self.workers.values():
            await worker.start(target, tls, state_dir)

    async def close(self) -> None:
        for worker in self.workers.values():
            await worker.close()
        await self.watch.stop()

    async def plan(self) -> None:
        for task in PLAN:
            body = wp.WorkAuthorize(
                work_item_id=task.work_item_id,
                title=task.title,
                contract=contract(task),
                coordinator_epoch=self.coordinator_epoch,
            )
            await self.coordinate("work_authorize", body)

    async def complete(self, deliverable: Task) -> None:
        """The Coordinator submits the Mission revision with its deliverable; the owner approves it."""
        revision = (await self.mesh.group_state(self.group_id)).mission.revision
        # What the verified WorkItem handed in, exactly as the store holds it (D161).
        delivered = (await self.mesh.work_item(self.group_id, deliverable.work_item_id)).artifacts
        body = mission_pb2.MissionSubmitForApproval(
            coordinator_epoch=self.coordinator_epoch,
            mission_revision=revision,
            artifacts=list(delivered),
            summary="Q3 ledgers reconciled; the report cites every figure",
        )
        submitted = await self.coordinate("mission_submit_for_approval", body)
        approve = mission_pb2.MissionApprove(
            submission_event_id=_event(submitted, "mission_submitted").event_id,
            comment="Figures check out. Ship it.",
        )
        await self.execute(self.cast.owner, "mission_approve", approve)
        await self.watch.wait_for("mission_approved")  # the timeline ends with it

    async def progress(self) -> apb.GetMissionProgressResponse:
        return await self.mesh.authority.GetMissionProgress(
            apb.GetMissionProgressRequest(group_id=self.group_id)
        )

    async def item_state(self, work_item_id: str) -> int:
        progress = await self.progress()
        return next(item.state for item in progress.work_items if item.work_item_id == work_item_id)

    # -------------------------------------------------------------- the Coordinator's part

    async def offer(self, task: Task, role: str) -> str:
        worker = self.workers[role].identity_id
        offer_id = self.next_id(f"offer-{task.work_item_id}")
        body = wp.WorkOffer(
            work_item_id=task.work_item_id,
            offer_id=offer_id,
            candidate_ids=[worker],
            expires_at=to_timestamp(_clock.now() + timedelta(minutes=5)),
            selection_criteria=[selection(worker, self.epochs[worker])],
            coordinator_epoch=self.coordinator_epoch,
        )
        await self.coordinate("work_offer", body)
        return offer_id

    async def assign(self, task: Task, role: str) -> None:
        """Offers ``task`` to the Worker until its runtime accepts: a Worker's admission control may
        decline (its scheduler had not yet read the offer, its queue was full, ...), and a
        Coordinator answers a decline with another offer (MW-10.3-03)."""
        for _ in range(OFFER_ROUNDS):
            offer_id = await self.offer(task, role)
            answer = await self.watch.first_of(("work_offer_accepted", "work_offer_declined"), task.work_item_id, offer_id)
            if answer.WhichOneof("payload") == "work_offer_accepted":
                return
            await asyncio.sleep(REOFFER_DELAY_S)
        raise CliError(f"{self.workers[role].identity_id} declined {task.work_item_id} {OFFER_ROUNDS} times")

    async def preempt(self, started: wp.WorkStarted) -> None:
        """Cooperative preemption (MW-11.3-10..12): the request interrupts nothing; the Worker's
        handler stops at its next safe point and its runtime checkpoints citing the request, which
        re-queues the WorkItem."""
        body = wp.WorkRequestPreemption(
            work_item_id=started.work_item_id,
            preemption_request_id=f"pre-{started.work_item_id}",
            lease_id=started.lease.lease_id,
            reason=wp.PREEMPTION_REASON_PRIORITY,
            checkpoint_by=to_timestamp(_clock.now() + timedelta(seconds=30)),
            coordinator_epoch=self.coordinator_epoch,
            ownership_epoch=started.lease.ownership_epoch,
        )
        await self.coordinate("work_request_preemption", body)

    async def verify(self, task: Task) -> None:
        """Waits for the Worker's next submission of ``task`` and accepts the result."""
        wid = task.work_item_id
        submitted = await self.watch.wait_for("work_submitted", wid, skip=self._verified[wid])
        self._verified[wid] += 1
        review = wp.WorkAcceptResult(
            work_item_id=wid, coordinator_epoch=self.coordinator_epoch, submission_event_id=submitted.event_id
        )
        await self.coordinate("work_accept_result", review)

    async def retry(self, task: Task, role: str) -> None:
        """Follows the server after the Worker's failure: a `failed` WorkItem is offered again (a new
        ownership epoch); one the Authority re-queued itself (automatic retry) its Worker's runtime
        starts again once the backoff is over, with nothing for the Coordinator to do."""
        wid = task.work_item_id
        failure = await self.first_failure(wid)
        if failure.WhichOneof("payload") == "lease_revoked":
            return
        state = await self.item_state(wid)
        if state != wp.WORK_ITEM_STATE_FAILED:
            label = enum_label(wp.WorkItemState, state, "WORK_ITEM_STATE_")
            raise CliError(f"after the failure {wid} is {label}; the demo does not know how to retry it")
        await self.assign(task, role)

    async def first_failure(self, work_item_id: str) -> event_pb2.Event:
        """The failure's event: work.failed, or the revocation that queued an automatic retry."""
        self.timeline.step = f"waiting for the failure of {work_item_id}"
        failed = asyncio.ensure_future(self.watch.wait_for("work_failed", work_item_id))
        revoked = asyncio.ensure_future(self.watch.wait_for("lease_revoked", work_item_id))
        done, pending = await asyncio.wait({failed, revoked}, return_when=asyncio.FIRST_COMPLETED)
        for waiting in pending:
            waiting.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return done.pop().result()


def _event(events: list[event_pb2.Event], payload: str) -> event_pb2.Event:
    """The first of ``events`` carrying ``payload`` (an Event oneof field name)."""
    return next(e for e in events if e.WhichOneof("payload") == payload)


async def play(run: MissionRun, target: str, tls: ClientTLS | None, state_dir: Path) -> None:
    """The story: see the module docstring. The Coordinator acts; the Workers' runtimes react."""
    await run.create_mission()
    await run.start_workers(target, tls, state_dir)
    await run.plan()
    await run.assign(TASKS["extract-eu"], "worker_a")
    await run.assign(TASKS["extract-us"], "worker_b")
    started = await run.watch.wait_for("work_started", "extract-us")
    # The urgent review needs Worker B: the Coordinator has it accepted, then preempts B's extraction.
    await run.assign(TASKS["review-controls"], "worker_b")
    await run.preempt(started.work_started)
    for wid in ("review-controls", "extract-us", "extract-eu"):
        await run.verify(TASKS[wid])
    # Both extractions are verified, so the reconciliation may be offered; it fails once.
    await run.assign(TASKS["reconcile"], "worker_a")
    await run.retry(TASKS["reconcile"], "worker_a")
    await run.verify(TASKS["reconcile"])
    await run.assign(TASKS["report"], "worker_b")  # its Worker saves a draft checkpoint on the way
    await run.verify(TASKS["report"])
    await run.complete(TASKS["report"])


# ------------------------------------------------------------------ result and entry point


@dataclass(frozen=True)
class DemoResult:
    group_id: str
    mission_id: str
    identities: dict[str, str]
    timeline: Timeline
    progress: apb.GetMissionProgressResponse

    def inspect_commands(self, target_flag: str = "") -> list[tuple[str, str]]:
        """(command, what it shows) for looking further into the Group."""
        mwp, group = f"mwp {target_flag}".rstrip(), self.group_id
        return [
            (
                f"{mwp} mission progress --group {group} --format dot",
                "the WorkItem DAG for Graphviz (| dot -Tsvg)",
            ),
            (
                f"{mwp} mission show --group {group}",
                "the Mission, its Coordinator lease, Conversations, Memberships",
            ),
            (
                f"{mwp} mission review --group {group} --verify-bytes",
                "what the owner approved: each Artifact verified, Evidence per criterion, budget",
            ),
            (f"{mwp} events --group {group}", "every event of the Group as JSON lines"),
        ]

    def lines(self, target_flag: str = "") -> list[str]:
        return [
            f"mwp demo: Mission {self.mission_id} in group {self.group_id}",
            f"  {STORY}",
            "",
            "Timeline (offset, actor, event, detail)",
            *self.timeline.lines(),
            "",
            "Progress (derived by AuthorityService.GetMissionProgress)",
            *(f"  {line}".rstrip() for line in render_text(self.progress)),
            "",
            f"group {self.group_id}; inspect it further with:",
            *(f"  {command}    # {what}" for command, what in self.inspect_commands(target_flag)),
        ]

    def document(self, target_flag: str = "") -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "mission_id": self.mission_id,
            "identities": self.identities,
            "timeline": [asdict(e) for e in self.timeline.entries],
            "progress": to_dict(self.progress),
            "inspect": [command for command, _ in self.inspect_commands(target_flag)],
        }


async def run_demo(
    mesh: MeshClient,
    admin_key: SigningKey,
    *,
    target: str,
    tls: ClientTLS | None = None,
    admin_id: str = "admin",
    timeline: Timeline | None = None,
) -> DemoResult:
    """Runs the whole scenario against ``mesh``, whose gateway is at ``target`` (where the Workers'
    agents connect); pass a ``timeline`` to keep what happened if a command is refused."""
    timeline = timeline if timeline is not None else Timeline()
    cast = await register_cast(mesh, admin_id, admin_key, timeline, secrets.token_hex(3))
    run = MissionRun(mesh, cast, timeline)
    with tempfile.TemporaryDirectory(prefix="mwp-demo-") as state_dir:  # the agents' sessions and cursors
        try:
            await play(run, target, tls, Path(state_dir))
        finally:
            await run.close()
    return DemoResult(run.group_id, run.mission_id, cast.identities(), timeline, await run.progress())


def _admin_key(args: argparse.Namespace) -> SigningKey:
    path = Path(args.admin_key or Settings.from_env().admin_key_path)
    if not path.exists():
        raise CliError(
            f"no admin key at {path} (a mesh creates it when it first starts: `make run`); see --admin-key"
        )
    return read_key(path)


def _stopped(args: argparse.Namespace, timeline: Timeline, err: grpc.aio.AioRpcError) -> None:
    """A refused command: show how far the demo got (the CLI then prints the structured reason)."""
    rejection = rejection_from_rpc_error(err)
    if rejection is None and err.code() == grpc.StatusCode.UNAVAILABLE:
        return
    document = {
        "completed": False,
        "stopped_at": timeline.step,
        "rejection": to_dict(rejection)
        if rejection is not None
        else {"code": err.code().name, "message": err.details()},
        "timeline": [asdict(e) for e in timeline.entries],
    }
    lines = ["Timeline until the refusal", *timeline.lines()] if timeline.entries else []
    emit(args, [*lines, f"mwp demo stopped at {timeline.step}"], document)


async def cmd_demo(args: argparse.Namespace) -> int:
    admin_key = _admin_key(args)
    address = target(args)
    timeline = Timeline()
    async with MeshClient(address, client_tls(args)) as mesh:
        try:
            result = await run_demo(
                mesh, admin_key, target=address, tls=client_tls(args), admin_id=args.admin_id, timeline=timeline
            )
        except grpc.aio.AioRpcError as err:
            _stopped(args, timeline, err)
            raise
    flag = "" if address == DEFAULT_TARGET else f"--target {address}"
    emit(args, result.lines(flag), {"completed": True, **result.document(flag)})
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser(
        "demo", help="run a complete small Mission against a running mesh (start one with `make run`)"
    )
    # SUPPRESS keeps the global `mwp --target X demo` when `demo --target` is not given.
    d.add_argument(
        "--target",
        default=argparse.SUPPRESS,
        help=f"server address (default $MWP_TARGET or {DEFAULT_TARGET})",
    )
    d.add_argument("--admin-key", help="the Organization admin key (default <data dir>/keys/admin.key)")
    d.add_argument("--admin-id", default="admin", help="the admin identity (default admin)")
    add_json_flag(d, "one JSON document: identities, timeline, progress")
    d.set_defaults(func=cmd_demo, runs_until_stopped=True)
