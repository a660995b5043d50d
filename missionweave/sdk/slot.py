"""What a Worker runtime's handler works with and hands back (missionweave/sdk/worker.py runs it):
its :class:`Slot`, isolated from every other slot (MW-11.1-15), and the outcomes it returns,
:class:`WorkResult`, :class:`Failed`, :class:`Paused` and :class:`Blocked`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.sdk.agent import Agent
from missionweave.sdk.artifacts import Content
from missionweave.sdk.offline import SlotChannel
from missionweave.sdk.slot_artifacts import SlotArtifacts, SlotInput
from missionweave.v1 import common_pb2, conversation_pb2
from missionweave.v1 import work_pb2 as wp


@dataclass(frozen=True)
class WorkResult:
    """What a handler hands back: its Evidence (MW-13.2-02) and a summary. The submission's
    Artifacts are the deliverables it stored through its slot (:meth:`Slot.put`), then any others
    it names here (each must exist as D161 requires: an upstream output passed through, say)."""

    evidence: Sequence[wp.Evidence]
    artifacts: Sequence[common_pb2.ArtifactRef] = ()
    summary: str = ""
    usage: common_pb2.ResourceVector | None = None  # consumed since the last report (MW-11.5-12)


@dataclass(frozen=True)
class Failed:
    """What a handler hands back when the work failed (worker-reported ``work.fail``, MW-10.2-T13).
    TRANSIENT lets the Authority retry it within the contract's retry policy (MW-11.4-08): the
    scheduler places the next attempt once its backoff has passed."""

    kind: int  # a wp.WorkFailureKind
    reason: str
    evidence: Sequence[wp.Evidence] = ()
    usage: common_pb2.ResourceVector | None = None


@dataclass(frozen=True)
class Slot:
    """One isolated slot's work: everything a handler may use, and nothing of any other slot."""

    slot_id: str
    group_id: str
    work_item_id: str
    ownership_epoch: int
    lease_id: str
    contract: wp.WorkContract
    token: wp.CapabilityToken | None
    budget: common_pb2.ResourceVector
    resume_from_checkpoint_id: str
    # Set when the Coordinator or the scheduler asks this work to pause at a safe point (MW-11.3-12).
    preemption_requested: asyncio.Event = field(default_factory=asyncio.Event)
    # Where this slot's reports go: online under its lease, or the offline buffer (MW-11.5-04).
    channel: SlotChannel | None = None
    # Its inputs and the outputs it stores, under its lease (missionweave/sdk/slot_artifacts.py).
    artifacts: SlotArtifacts | None = None
    # How the Coordinator resolved this work's latest block (``work.unblock``'s resolution), when
    # this start follows one under the same ownership; empty otherwise. A handler that returned
    # :class:`Blocked` continues from its checkpoint with this answer.
    unblocked_with: str = ""
    # The sequence of that ``work.unblocked`` event (0: none): tells one unblock from another.
    unblocked_at: int = 0

    @property
    def inputs(self) -> tuple[SlotInput, ...]:
        """The contract's input Artifacts and those of the WorkItems it depends on."""
        return self._artifacts().inputs

    async def read(self, what: SlotInput | common_pb2.ArtifactRef) -> bytes:
        """An input's bytes, verified against its digest (MW-13.1-05)."""
        return await self._artifacts().read(what)

    async def put(
        self,
        content: Content,
        *,
        media_type: str = "application/octet-stream",
        deliverable: bool = True,
        sources: Sequence[common_pb2.ArtifactRef] | None = None,
        schema_id: str = "none",
    ) -> common_pb2.ArtifactRef:
        """Stores an output (bytes, a file path or a stream) with a manifest signed under this
        slot's lease; deliverables go into the submission, ``deliverable=False`` is for Evidence.
        Its sources are every input unless ``sources`` names them (the provenance edges)."""
        return await self._artifacts().put(
            content, media_type=media_type, deliverable=deliverable, sources=sources, schema_id=schema_id
        )

    def _artifacts(self) -> SlotArtifacts:
        if self.artifacts is None:
            raise RuntimeError("this slot has no artifact store")
        return self.artifacts

    def evidence(
        self,
        criterion: wp.AcceptanceCriterion,
        *,
        passed: bool,
        summary: str,
        artifact: common_pb2.ArtifactRef | None = None,
    ) -> wp.Evidence:
        """The Evidence for one acceptance criterion of this slot's contract (MW-13.2-02): by the
        first method the criterion requires (a test when it names none), about ``artifact`` when
        given, with an id derived from the WorkItem and criterion so a retried submission repeats it."""
        methods = criterion.required_evidence_methods
        return wp.Evidence(
            evidence_id=f"ev-{self.work_item_id}-{criterion.criterion_id}",
            subject=wp.EvidenceSubject(work_item_id=self.work_item_id, artifact=artifact),
            criterion_id=criterion.criterion_id,
            criterion=criterion.description,
            method=methods[0] if methods else wp.EVIDENCE_METHOD_TEST,
            result=wp.EVIDENCE_RESULT_PASS if passed else wp.EVIDENCE_RESULT_FAIL,
            produced_at=to_timestamp(SystemClock().now()),
            summary=summary,
        )

    def idempotency_key(self, operation_id: str) -> str:
        """The stable key of one external side effect of this work under this ownership (MW-16-13)."""
        return Agent.idempotency_key(self.group_id, self.work_item_id, self.ownership_epoch, operation_id)

    def side_effect(self, operation_id: str) -> str:
        """Authorizes one high-risk, irreversible or externally visible action now and returns its
        idempotency key. Raises :class:`~missionweave.sdk.offline.OfflineForbidden` unless the lease
        and its capability token are currently valid, which needs the Group service: never while
        offline or not yet reconciled, never past the lease's expiry (MW-11.5-05, OP-20)."""
        if self.channel is None:
            raise RuntimeError("this slot has no channel to its Group")
        self.channel.authorize()
        return self.idempotency_key(operation_id)

    async def report_progress(
        self, report: wp.ProgressReport, usage: common_pb2.ResourceVector | None = None
    ) -> bool:
        """Structured progress under this slot's lease (MW-11.4-01), with the usage since the last
        report. Offline it is buffered with its binding (reversible work only, within the grace):
        returns whether it reached the Group now (False: buffered)."""
        if self.channel is None:
            raise RuntimeError("this slot has no channel to its Group")
        delta = usage or common_pb2.ResourceVector()
        body = wp.WorkReportProgress(
            work_item_id=self.work_item_id,
            lease_id=self.lease_id,
            ownership_epoch=self.ownership_epoch,
            report=report,
            usage_delta=delta,
        )
        return await self.channel.send("work_report_progress", body, delta) is not None

    async def post_message(self, text: str, *, topic: str = "") -> bool:
        """A Message in this WorkItem's own Conversation (MW-9-02), e.g. an ambiguity or a note for
        the Coordinator. Offline it is buffered like a report, bound to this Conversation
        (MW-11.5-10): returns whether it reached the Group now (False: buffered)."""
        if self.channel is None:
            raise RuntimeError("this slot has no channel to its Group")
        body = conversation_pb2.MessagePost(
            conversation_id=self.channel.conversation_id,
            content=conversation_pb2.MessageContent(text=text),
            topic=topic,
        )
        return await self.channel.send("message_post", body, common_pb2.ResourceVector()) is not None


@dataclass(frozen=True)
class Paused:
    """What a handler hands back when it stopped at a safe point after ``slot.preemption_requested``:
    the checkpoint to resume from (MW-11.3-12). The runtime records it, returns the slot and the
    WorkItem re-enters its Group's queue; a later placement resumes it from this checkpoint."""

    checkpoint: wp.Checkpoint
    usage: common_pb2.ResourceVector | None = None


@dataclass(frozen=True)
class Blocked:
    """What a handler hands back when it cannot go on without an answer (MW-10.2-T09, MW-11.4-04):
    the runtime posts ``question`` in the WorkItem's Conversation, then records ``work.block`` with
    ``checkpoint`` and one blocker citing that Message, and returns the slot. Ownership is kept for
    the blocked lease; once the Coordinator unblocks, the WorkItem is placed again and the handler
    runs from the checkpoint with the resolution in ``slot.unblocked_with``."""

    question: str
    checkpoint: wp.Checkpoint
    kind: int = wp.BLOCKER_KIND_INFORMATION  # a wp.BlockerKind
    required_resolution: str = "an answer to the question in the WorkItem's Conversation"
    usage: common_pb2.ResourceVector | None = None


Outcome = WorkResult | Paused | Failed | Blocked
Handler = Callable[[Slot], Awaitable[Outcome]]
