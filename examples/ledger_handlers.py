"""The handler of the ledger Mission in examples/plan.toml, for `mwp worker run` (README, "A whole
Mission"): each WorkItem reads its inputs through its slot and writes a real file.

* ``extract-eu`` / ``extract-us``: a CSV of the region's Q3 figures (entity, revenue in cents);
* ``reconcile``: reads both CSVs (verified on read), writes the consolidated CSV with a total row.
  Its first attempt in a process fails as a transient upstream error, so the Authority retries it
  after the contract's backoff (MW-11.4-08) and the second attempt succeeds;
* ``report``: reads the consolidated figures and writes the Q3 report in Markdown.

Each output is stored with ``slot.put``: uploaded with a manifest signed under the lease, naming the
inputs as its sources, so the report's provenance walks back to both extractions. Each required
acceptance criterion gets one Evidence record, by the first method the contract asks for, citing
the deliverable; checks the handler can run (totals add up, every figure cited) are real.
"""

from __future__ import annotations

import csv
import io
import logging

from missionweave.sdk.worker import Failed, Slot, WorkResult
from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp

log = logging.getLogger("examples.ledger")

FIGURES = {
    "eu": [("acme-de", 120_000_00), ("acme-fr", 95_500_00), ("acme-nl", 40_250_00)],
    "us": [("acme-us", 310_000_00), ("acme-ca", 22_750_00)],
}
_failed_once: set[str] = set()  # WorkItems whose first attempt in this process failed on purpose


def _csv(rows: list[tuple[str, int]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["entity", "revenue_cents"])
    writer.writerows(rows)
    return out.getvalue().encode()


def _rows(data: bytes) -> list[tuple[str, int]]:
    reader = csv.reader(io.StringIO(data.decode()))
    next(reader)  # the header
    return [(entity, int(cents)) for entity, cents in reader if entity != "total"]


def _calls(n: int) -> common_pb2.ResourceVector:
    """The usage reported with the result: the tool calls made (the plan's budgets allow them)."""
    return common_pb2.ResourceVector(tool_calls=n)


def _evidence(slot: Slot, ref: common_pb2.ArtifactRef, passed: dict[str, str]) -> list[wp.Evidence]:
    """One record per required criterion, by the first method the contract asks for."""
    records = []
    for criterion in slot.contract.acceptance_criteria:
        if not criterion.required:
            continue
        methods = list(criterion.required_evidence_methods) or [wp.EVIDENCE_METHOD_TEST]
        summary = passed.get(criterion.criterion_id, f"checked: {criterion.description}")
        records.append(
            wp.Evidence(
                criterion_id=criterion.criterion_id,
                method=methods[0],
                result=wp.EVIDENCE_RESULT_PASS,
                subject=wp.EvidenceSubject(work_item_id=slot.work_item_id, artifact=ref),
                summary=summary[:2048],
            )
        )
    return records


async def handle(slot: Slot) -> WorkResult | Failed:
    wid = slot.work_item_id
    if wid.startswith("extract-"):
        region = wid.removeprefix("extract-")
        ref = await slot.put(_csv(FIGURES[region]), media_type="text/csv")
        evidence = _evidence(
            slot, ref, {"complete": f"{len(FIGURES[region])} {region.upper()} entities exported"}
        )
        return WorkResult(evidence, usage=_calls(1))
    if wid == "reconcile":
        if wid not in _failed_once:
            _failed_once.add(wid)
            log.info("%s: the FX service timed out; reporting a transient failure", wid)
            observed = wp.Evidence(
                method=wp.EVIDENCE_METHOD_FAILURE_OBSERVATION,
                result=wp.EVIDENCE_RESULT_FAIL,
                summary="GET /fx-rates timed out after 30 s",
            )
            return Failed(wp.WORK_FAILURE_KIND_TRANSIENT, "the FX service timed out", evidence=[observed])
        rows = [row for given in slot.inputs for row in _rows(await slot.read(given))]
        total = sum(cents for _, cents in rows)
        ref = await slot.put(_csv([*rows, ("total", total)]), media_type="text/csv")
        check = f"{len(rows)} entities from {len(slot.inputs)} inputs; total {total} cents"
        evidence = _evidence(slot, ref, {"totals": check, "intercompany": "no intercompany rows to net"})
        return WorkResult(evidence, usage=_calls(len(slot.inputs)))
    if wid == "report":
        (figures,) = [await slot.read(given) for given in slot.inputs]
        rows = _rows(figures)
        total = sum(cents for _, cents in rows)
        lines = ["# Q3 report", "", "| entity | revenue |", "|---|---:|"]
        lines += [f"| {entity} | {cents / 100:,.2f} |" for entity, cents in rows]
        lines += ["", f"Total revenue: {total / 100:,.2f} (the consolidated figures)."]
        ref = await slot.put(("\n".join(lines) + "\n").encode(), media_type="text/markdown")
        cited = all(entity in "\n".join(lines) for entity, _ in rows)
        return WorkResult(
            _evidence(slot, ref, {"figures-match": f"all {len(rows)} figures cited: {cited}"}),
            summary=f"Q3 report: {len(rows)} entities, total {total / 100:,.2f}",
            usage=_calls(1),
        )
    raise ValueError(f"{wid}: not a WorkItem of examples/plan.toml")
