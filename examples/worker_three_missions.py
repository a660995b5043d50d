"""A Worker serving three Missions at once with one handler (the SDK's Worker runtime)::

    .venv/bin/python examples/worker_three_missions.py --as worker-1 --key worker-1.key \\
        --group GROUP_A --group GROUP_B --group GROUP_C

or, with the same handler, through the CLI: ``mwp worker run --config examples/worker.toml``.

``missionweave.sdk.worker.WorkerRuntime`` does the protocol: it keeps one queue per Group in the
Worker's own scheduler, answers each offer after admission control, places admitted WorkItems into
the declared slots in the scheduler's order across the three Groups, starts them under an
execution lease (renewed while the handler works) and submits what the handler returns.

The handler writes a *worksheet* for its WorkItem from the contract alone: one section per
acceptance criterion (the goal, what the criterion asks, the deliverables it covers and the
evidence methods it requires), one step at a time. Between steps is its safe point: when the
Coordinator or the scheduler asked for preemption (``slot.preemption_requested``) it stops there and
returns ``Paused(checkpoint)`` naming the steps done; placed again, it resumes from that checkpoint
without redoing them. Finished, it stores the worksheet through its slot (uploaded with a manifest
signed under its lease, D161) and returns one Evidence per criterion: a check, made on the worksheet itself, that its section names every
deliverable the criterion covers. See examples/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence

from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.sdk.agent import Agent, ClientTLS
from missionweave.sdk.worker import Paused, Slot, WorkerRuntime, WorkResult
from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp

log = logging.getLogger("worker-example")
_clock = SystemClock()

# How long one step of work takes; a step ends at a safe point. Tests shorten it.
STEP_SECONDS = 0.3

# The sections written so far, by checkpoint id. A real Worker keeps this where its next placement
# can read it (a file, an Artifact); in memory it survives a preemption, not a restart, which is
# enough here because the worksheet is rebuilt deterministically from the contract when lost.
_checkpoints: dict[str, list[str]] = {}


def section(contract: wp.WorkContract, criterion: wp.AcceptanceCriterion) -> str:
    """One worksheet section: everything the criterion asks, in the contract's own terms."""
    methods = ", ".join(
        wp.EvidenceMethod.Name(m).removeprefix("EVIDENCE_METHOD_").lower()
        for m in criterion.required_evidence_methods
    )
    deliverables = {d.deliverable_id: d.description for d in contract.deliverables}
    covered = [f"- {d}: {deliverables.get(d, '(not in the contract)')}" for d in criterion.deliverable_ids]
    return "\n".join(
        [
            f"## {criterion.criterion_id}",
            f"Goal: {contract.goal}",
            f"Checks: {criterion.description}",
            f"Evidence by: {methods or 'any method'}",
            "Covers:",
            *(covered or ["- (no deliverable named)"]),
            "",
        ]
    )


def check(text: str, criterion: wp.AcceptanceCriterion) -> bool:
    """Whether the worksheet's section for ``criterion`` names every deliverable it covers."""
    start = text.find(f"## {criterion.criterion_id}\n")
    if start < 0:
        return False
    end = text.find("\n## ", start + 1)
    body = text[start : end if end >= 0 else len(text)]
    return all(f"- {d}:" in body for d in criterion.deliverable_ids)


def worksheet_evidence(slot: Slot, text: str, ref: common_pb2.ArtifactRef) -> list[wp.Evidence]:
    evidence = []
    for criterion in slot.contract.acceptance_criteria:
        passed = check(text, criterion)
        method = (
            criterion.required_evidence_methods[0]
            if criterion.required_evidence_methods
            else wp.EVIDENCE_METHOD_TEST
        )
        evidence.append(
            wp.Evidence(
                evidence_id=f"ev-{slot.work_item_id}-{criterion.criterion_id}",
                subject=wp.EvidenceSubject(work_item_id=slot.work_item_id, artifact=ref),
                criterion_id=criterion.criterion_id,
                criterion=criterion.description,
                method=method,
                result=wp.EVIDENCE_RESULT_PASS if passed else wp.EVIDENCE_RESULT_FAIL,
                produced_at=to_timestamp(_clock.now()),
                summary=f"the worksheet section {criterion.criterion_id} {'names' if passed else 'misses'} "
                f"the deliverables {', '.join(criterion.deliverable_ids) or '(none)'}",
            )
        )
    return evidence


async def handle(slot: Slot) -> WorkResult | Paused:
    """Writes the worksheet step by step; pauses at a safe point when asked to; submits it."""
    criteria = list(slot.contract.acceptance_criteria)
    sections = list(_checkpoints.get(slot.resume_from_checkpoint_id, []))
    if slot.resume_from_checkpoint_id:
        log.info(
            "%s/%s: resuming from %s with %d of %d sections",
            slot.group_id,
            slot.work_item_id,
            slot.resume_from_checkpoint_id,
            len(sections),
            len(criteria),
        )
    while len(sections) < len(criteria):
        if slot.preemption_requested.is_set():  # the safe point: nothing half-written
            checkpoint_id = f"ck-{slot.lease_id}-{len(sections)}"
            _checkpoints[checkpoint_id] = sections
            done = [f"section:{c.criterion_id}" for c in criteria[: len(sections)]]
            checkpoint = wp.Checkpoint(
                checkpoint_id=checkpoint_id, completed_operation_ids=done, taken_at=to_timestamp(_clock.now())
            )
            return Paused(checkpoint)
        sections.append(section(slot.contract, criteria[len(sections)]))
        # The step's work time, cut short by a preemption request so the safe point comes sooner.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(slot.preemption_requested.wait(), STEP_SECONDS)
    text = f"# Worksheet for {slot.work_item_id}\n\n" + "\n".join(sections)
    content = text.encode()
    # Stored through the slot: uploaded with a manifest signed under this lease, its inputs as sources.
    ref = await slot.put(content, media_type="text/markdown")
    return WorkResult(
        evidence=worksheet_evidence(slot, text, ref),
        summary=f"worksheet for {slot.work_item_id}: {len(sections)} section(s), {len(content)} bytes",
    )


async def serve(agent: Agent, group_ids: Sequence[str]) -> WorkerRuntime:
    """A runtime serving ``group_ids`` with :func:`handle`; ``await runtime.close()`` stops it."""
    runtime = WorkerRuntime(agent, handle)
    await runtime.serve(group_ids)
    return runtime


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the gateway (default 127.0.0.1:50051)")
    parser.add_argument("--as", dest="identity", required=True, help="the Worker identity, e.g. worker-1")
    parser.add_argument("--key", required=True, help="its key file (from `mwp keygen`)")
    parser.add_argument(
        "--group", action="append", required=True, help="a Group to serve (repeat: three Missions)"
    )
    parser.add_argument(
        "--state", default=".worker-state", help="session and cursor files (default .worker-state)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not on Windows
            loop.add_signal_handler(sig, stop.set)
    async with Agent.connect(
        args.target, args.identity, args.key, cursor_dir=args.state, tls=ClientTLS.from_env()
    ) as agent:
        runtime = await serve(agent, args.group)
        log.info("serving %s as %s; Ctrl-C stops", ", ".join(args.group), args.identity)
        logged = 0
        try:
            while not stop.is_set():
                waiting = asyncio.ensure_future(runtime.submitted(logged + 1))
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
                for pending in (waiting, stopping):
                    pending.cancel()
                for group_id, work_item_id in runtime.completed[logged:]:
                    log.info("%s/%s: submitted", group_id, work_item_id)
                logged = len(runtime.completed)
        finally:
            await runtime.close()


if __name__ == "__main__":
    asyncio.run(main())
