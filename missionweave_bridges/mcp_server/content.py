"""What tools share: results (short text plus structured content), Evidence and usage inputs, the
Artifacts a WorkItem reads (its contract inputs and its dependencies' outputs) and those stored
through this server under a lease (the default deliverables of a submission)."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from missionweave.sdk.contracts import EVIDENCE_METHODS
from missionweave.sdk.files import read_json, write_json_atomic
from missionweave.v1 import common_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.mcp_server.desk import Desk
from missionweave_bridges.mcp_server.refusals import Refused

_DIGEST = re.compile(r"^blake3:([0-9a-f]{64}):(\d+)$")
INLINE_LIMIT = 256 * 1024  # bytes read_input returns inline; larger inputs are described, not sent


def ok(text: str, data: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def digest_text(digest: common_pb2.Digest) -> str:
    return f"blake3:{digest.hex}:{digest.size_bytes}"


def ref_of(text: str, field: str) -> common_pb2.ArtifactRef:
    match = _DIGEST.match(text.strip())
    if match is None:
        raise Refused(
            "INVALID_ARGUMENT",
            f"{field}: {text!r} is not an Artifact reference blake3:<64 hex>:<size> (store_output returns one)",
            metadata={"field": field},
        )
    return common_pb2.ArtifactRef(
        digest=common_pb2.Digest(algorithm="blake3", hex=match[1], size_bytes=int(match[2]))
    )


class EvidenceIn(BaseModel):
    """One piece of Evidence about one acceptance criterion."""

    criterion_id: str = Field(description="the acceptance criterion's id (show_work_item lists them)")
    summary: str = Field(description="a short factual statement of what was checked and what was found")
    artifacts: list[str] = Field(
        default=[], description="Artifacts that show it, as store_output returned them (blake3:<hex>:<size>)"
    )
    method: str | None = Field(
        default=None,
        description=f"how it was checked: one of {', '.join(EVIDENCE_METHODS)} "
        "(default: the first method the criterion requires)",
    )


class UsageIn(BaseModel):
    """Resources used since the last report (each a whole number; money in the Mission's currency)."""

    tokens: int = 0
    tool_calls: int = 0
    financial_micros: int = Field(default=0, description="money in millionths of the Mission's currency unit")


def usage_vector(usage: UsageIn | None, currency: str) -> common_pb2.ResourceVector:
    if usage is None:
        return common_pb2.ResourceVector()
    return common_pb2.ResourceVector(
        currency=currency if usage.financial_micros else "",
        tokens=usage.tokens,
        tool_calls=usage.tool_calls,
        financial_micros=usage.financial_micros,
    )


def evidence_records(
    item: wp.WorkItem, given: list[EvidenceIn], result: int, submission: str = ""
) -> list[wp.Evidence]:
    criteria = {c.criterion_id: c for c in item.contract.acceptance_criteria}
    out = []
    for e in given:
        criterion = criteria.get(e.criterion_id)
        if criterion is None:
            raise Refused(
                "UNKNOWN_CRITERION",
                f"the contract of {item.work_item_id} has no acceptance criterion {e.criterion_id!r}",
                metadata={"criteria": ",".join(criteria)},
            )
        if e.method is not None and e.method not in EVIDENCE_METHODS:
            raise Refused(
                "INVALID_ARGUMENT", f"unknown Evidence method {e.method!r}", metadata={"field": "method"}
            )
        method = (
            EVIDENCE_METHODS[e.method]
            if e.method
            else (list(criterion.required_evidence_methods) or [wp.EVIDENCE_METHOD_REVIEW])[0]
        )
        out.append(
            wp.Evidence(
                subject=wp.EvidenceSubject(work_item_id=item.work_item_id, submission_event_id=submission),
                criterion_id=e.criterion_id,
                criterion=criterion.description,
                method=method,  # type: ignore[arg-type]
                result=result,  # type: ignore[arg-type]
                summary=e.summary,
                artifacts=[ref_of(a, "evidence.artifacts") for a in e.artifacts],
            )
        )
    return out


@dataclass(frozen=True)
class Input:
    name: str
    ref: common_pb2.ArtifactRef
    from_work_item_id: str = ""


async def inputs_of(desk: Desk, group_id: str, item: wp.WorkItem) -> list[Input]:
    """The contract's input Artifacts, then the Artifacts of every WorkItem it depends on that this
    identity may read (as the Worker runtime's slots see them, docs/sdk.md "Inputs and outputs")."""
    out: list[Input] = []
    upstream: dict[str, str] = {}
    for given in item.contract.inputs:
        if given.HasField("artifact"):
            out.append(Input(given.name, given.artifact))
        elif given.from_work_item_id:
            upstream.setdefault(given.from_work_item_id, given.name)
    for dependency in item.contract.depends_on_work_item_ids:
        upstream.setdefault(dependency, dependency)
    for work_item_id, name in upstream.items():
        try:
            other = await desk.work_item(group_id, work_item_id)
        except Refused:
            continue  # joined after it was created (D124): not readable, contributes nothing
        out.extend(Input(name, ref, work_item_id) for ref in other.artifacts)
    return out


def content_of(text: str, base64_: str, path: str, files: list[Path]) -> bytes | Path:
    """Exactly one of ``text``, ``base64_`` or ``path`` (a file under one of ``files``)."""
    given = [x for x in (text, base64_, path) if x]
    if len(given) != 1:
        raise Refused("BAD_CONTENT", "give exactly one of text, base64 or path")
    if text:
        return text.encode()
    if base64_:
        try:
            return base64.b64decode(base64_, validate=True)
        except ValueError:
            raise Refused(
                "INVALID_ARGUMENT", "base64 is not valid base64", metadata={"field": "base64"}
            ) from None
    resolved = Path(path).expanduser().resolve()
    if not any(resolved.is_relative_to(root) for root in files) or not resolved.is_file():
        raise Refused(
            "PATH_NOT_ALLOWED",
            f"{path} is not a file under an allowed directory ({', '.join(map(str, files)) or 'none: see --files'})",
            metadata={"field": "path"},
        )
    return resolved


class OutputLog:
    """The deliverables stored through this server, per (Group, WorkItem, lease), in
    ``<state dir>/outputs.json``: a submission names them unless told otherwise, also after a restart."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.outputs: dict[str, list[str]] = dict((read_json(path) or {}).get("outputs", {}))

    @staticmethod
    def key(group_id: str, work_item_id: str, lease_id: str) -> str:
        return f"{group_id}/{work_item_id}/{lease_id}"

    def add(self, key: str, ref: common_pb2.ArtifactRef) -> None:
        text = digest_text(ref.digest)
        if text not in self.outputs.setdefault(key, []):
            self.outputs[key].append(text)
            write_json_atomic(self.path, {"outputs": self.outputs})

    def of(self, key: str) -> list[str]:
        return list(self.outputs.get(key, []))
