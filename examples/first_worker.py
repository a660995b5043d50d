"""Your first Worker (docs/getting-started-python.md).

For each WorkItem offered to it, it writes a note restating the contract, stores the note as an
Artifact (uploaded with a provenance manifest signed under the execution lease) and submits it with
one Evidence per acceptance criterion. `mwp worker run --config examples/first_worker.toml` runs it:
the SDK's Worker runtime accepts the offer, starts the work under a lease, renews the lease while
`handle` runs, and submits what it returns.
"""

from missionweave.sdk.worker import Slot, WorkResult


async def handle(slot: Slot) -> WorkResult:
    criteria = slot.contract.acceptance_criteria
    lines = [f"# {slot.work_item_id}", "", f"Goal: {slot.contract.goal}", ""]
    lines += [f"- {c.criterion_id}: {c.description}" for c in criteria]
    note = "\n".join(lines) + "\n"
    ref = await slot.put(note.encode(), media_type="text/markdown")
    evidence = [
        slot.evidence(c, passed=f"- {c.criterion_id}:" in note, summary="the note restates it", artifact=ref)
        for c in criteria
    ]
    return WorkResult(evidence=evidence, summary=f"a note of {len(note)} bytes")
