"""The demo's two Workers (``DemoWorker``): each an agent on the gateway serving the Group through a
``WorkerRuntime``, whose handler does the demo's scripted work: it is preempted cooperatively once
(extract-us), saves a draft checkpoint and carries on from it (report), fails transiently once
(reconcile, ``transient_failure``), and otherwise reads its inputs through its slot, stores a
deliverable citing them and submits it with Evidence and its usage (``FINAL_USAGE``).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from google.protobuf.message import Message

from missionweave.cli.demo.cast import WorkerIdentity
from missionweave.cli.demo.plan import TASKS, evidence, usage
from missionweave.cli.demo.watch import WAIT_S
from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.transport import ClientTLS
from missionweave.sdk.agent import Agent
from missionweave.sdk.client import decode_events
from missionweave.sdk.worker import Failed, Paused, Slot, WorkerRuntime, WorkResult
from missionweave.v1 import common_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp

if TYPE_CHECKING:
    from missionweave.cli.demo.scenario import MissionRun

_clock = SystemClock()


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
        self.agent = await Agent.connect(
            target, self.identity_id, self.identity.key, cursor_dir=state_dir, tls=tls
        )
        self.run.timeline.note(
            self.identity_id,
            "session.opened",
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
            work_item_id=slot.work_item_id,
            lease_id=slot.lease_id,
            ownership_epoch=slot.ownership_epoch,
            usage_delta=spent,
        )
        await self._execute(slot, "work_renew_lease", body)

    def checkpoint(self, slot: Slot) -> Paused:
        wid = slot.work_item_id
        return Paused(
            wp.Checkpoint(
                checkpoint_id=self.run.next_id(f"ck-{wid}"),
                completed_operation_ids=[f"{wid}:part-1"],
                taken_at=to_timestamp(_clock.now()),
            )
        )

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
        return WorkResult(
            evidence=evidence(task, ref), summary=f"{task.deliverable} ready", usage=FINAL_USAGE[wid]
        )


def transient_failure(slot: Slot) -> Failed:
    """A transient failure with Evidence (the runtime reports it under the slot's lease)."""
    observed = wp.Evidence(
        evidence_id=f"ev-{slot.work_item_id}-timeout",
        method=wp.EVIDENCE_METHOD_FAILURE_OBSERVATION,
        result=wp.EVIDENCE_RESULT_FAIL,
        summary="GET /fx-rates timed out after 30 s, three times",
    )
    return Failed(
        kind=wp.WORK_FAILURE_KIND_TRANSIENT,
        reason="the FX-rate service timed out",
        evidence=[observed],
        usage=usage(300, 3),
    )


# The usage each WorkItem's last (submitting) run reports.
FINAL_USAGE = {
    "extract-eu": usage(2900, 7),
    "extract-us": usage(900, 2),
    "review-controls": usage(1700, 8),
    "reconcile": usage(2200, 6),
    "report": usage(1300, 3),
}
