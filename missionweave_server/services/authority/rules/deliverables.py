"""D161: a deliverable or an Evidence record names only Artifacts that exist (MW-13.1-03/05).

A submission (``work.submit``, ``mission.submit_for_approval``) or an Evidence record
(``work.submit``, ``work.record_evidence``, ``work.fail``) is accepted only if every Artifact it
names is held by the artifact store, at the size named, and is either

* an Artifact this Group already recorded within the command's scope (published under a lease,
  submitted by a WorkItem, approved in a child Mission, or an input its contract names) — each was
  checked against the store when it was recorded, or
* described by a manifest the actor signed for this Group naming this Mission and the WorkItem the
  command is about, verified by the store at upload. For the Mission's own submission the manifest
  may name any WorkItem (a Coordinator's summary of a child Mission names the parent's WorkItem it
  answers): the Coordinator signed it for this Mission and Group.

For a WorkItem the scope is the WorkItem itself, the WorkItems it depends on (transitively, through
``depends_on`` and its contract's inputs) and its contract's input Artifacts: an upstream output may
be passed through unchanged. For the Mission's submission and for Evidence it is the whole Group.
Artifacts from another Group enter through a child Mission's approval or through a manifest the
actor signs for this Group (the same bytes, the foreign digest as a source).

Pure: the shell asks the store (``ctx.held``); the rule decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, work_pb2
from missionweave_server.services.authority.rules.common import (
    DecisionContext,
    R,
    check_artifact_refs,
    invalid,
    mission_of,
)
from missionweave_server.services.authority.state import GroupState, WorkItemState


def require_held(
    state: GroupState,
    command: command_pb2.Command,
    ctx: DecisionContext,
    refs: Sequence[common_pb2.ArtifactRef],
    field: str,
    *,
    deliverables_of: WorkItemState | None = None,
    evidence_about: WorkItemState | None = None,
) -> None:
    """Refuses the first Artifact of ``refs`` that does not exist as D161 requires. With
    ``deliverables_of`` the refs are that WorkItem's deliverables (its scope, manifests naming it);
    with ``evidence_about`` they are Evidence about it (the Group's scope, manifests naming it); with
    neither, the Mission's deliverables (the Group's scope, manifests naming any WorkItem)."""
    check_artifact_refs(refs, field)
    if not refs:
        return
    mission_id = mission_of(state).mission_id
    recorded: set[str] | None = None  # computed only when a manifest does not settle it
    about = deliverables_of or evidence_about
    # The WorkItem a manifest must name: the one the refs are about (any, for the Mission's own).
    names = {about.work_item_id} if about is not None else None
    for i, ref in enumerate(refs):
        digest = ref.digest
        where = f"{field}[{i}]"
        held = ctx.held.get(digest.hex)
        if held is None:
            raise Rejected(
                R.REJECTION_REASON_NOT_FOUND,
                f"{where}: blake3:{digest.hex} is not stored; upload it with its manifest first",
                field=where,
                check="not_stored",
            )
        if digest.size_bytes != held.size_bytes:
            raise invalid(
                f"{where}.digest.size_bytes",
                f"blake3:{digest.hex} is {held.size_bytes} bytes, not {digest.size_bytes}",
            )
        if any(
            m.mission_id == mission_id and (names is None or m.work_item_id in names) for m in held.manifests
        ):
            continue
        if recorded is None:
            recorded = recorded_artifacts(state, deliverables_of)
        if digest.hex in recorded:
            continue
        scope = f"WorkItem {deliverables_of.work_item_id} and its inputs" if deliverables_of else "this Group"
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"{where}: blake3:{digest.hex} is stored, but no manifest {command.actor_id} signed names this Mission"
            + (f" and WorkItem {deliverables_of.work_item_id}" if deliverables_of else "")
            + f", and it is not an Artifact of {scope}",
            field=where,
            check="no_manifest",
        )


def require_evidence_held(
    state: GroupState,
    command: command_pb2.Command,
    ctx: DecisionContext,
    evidence: Sequence[work_pb2.Evidence],
    field: str,
    item: WorkItemState,
) -> None:
    """``require_held`` for the Artifacts each Evidence record about ``item`` references."""
    for j, record in enumerate(evidence):
        require_held(state, command, ctx, record.artifacts, f"{field}[{j}].artifacts", evidence_about=item)


def recorded_artifacts(state: GroupState, scope: WorkItemState | None) -> set[str]:
    """The Artifacts this Group recorded within ``scope`` (None: every WorkItem), by BLAKE3 hex."""
    items = state.work_items.values() if scope is None else _upstream(state, scope)
    recorded: set[str] = set()
    for item in items:
        recorded.update(h for h, _ in item.published_artifacts)
        recorded.update(h for h, _ in item.submitted_artifacts)
        recorded.update(_input_artifacts(item.contract))
    return recorded


def _upstream(state: GroupState, item: WorkItemState) -> list[WorkItemState]:
    """``item`` and every WorkItem it depends on, transitively (dependencies and contract inputs)."""
    seen: dict[str, WorkItemState] = {}
    todo = [item.work_item_id]
    while todo:
        current = state.work_items.get(todo.pop())
        if current is None or current.work_item_id in seen:
            continue
        seen[current.work_item_id] = current
        todo.extend(current.depends_on)
        todo.extend(i.from_work_item_id for i in _inputs(current.contract) if i.from_work_item_id)
    return list(seen.values())


def _inputs(contract: work_pb2.WorkContract | None) -> Iterable[work_pb2.WorkInput]:
    return contract.inputs if contract is not None else ()


def _input_artifacts(contract: work_pb2.WorkContract | None) -> Iterable[str]:
    return (i.artifact.digest.hex for i in _inputs(contract) if i.HasField("artifact"))


def evidence_refs(evidence: Iterable[work_pb2.Evidence]) -> tuple[common_pb2.ArtifactRef, ...]:
    """Every Artifact a list of Evidence records references, in order (for ``named_digests``)."""
    return tuple(ref for e in evidence for ref in e.artifacts)
