"""How MissionWeave and A2A v1.0 name the same things (docs/bridge-a2a-worker.md has the tables):
the work contract as an A2A message, A2A task states as Worker outcomes, A2A artifacts as
MissionWeave Artifacts, A2A errors as structured failure kinds, an A2A Agent Card as a MissionWeave
one. Pure functions: no I/O, so every rule is tested on its own."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from a2a.client.errors import A2AClientError, A2AClientTimeoutError
from a2a.types import a2a_pb2 as a2a
from a2a.utils import errors as a2a_errors
from google.protobuf import json_format, struct_pb2

from missionweave.v1 import agent_card_pb2, common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp

# An input at most this large, of a text media type, goes inline as a text part; any other goes as
# a file part with its bytes (A2A `raw`) and its media type and name.
INLINE_TEXT_LIMIT = 64 * 1024
TEXT_MEDIA = re.compile(r"^(text/.*|application/(json|xml|toml|yaml|x-yaml)(;.*)?)$")
SEMVER = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")

TERMINAL = frozenset(
    {
        a2a.TASK_STATE_COMPLETED,
        a2a.TASK_STATE_FAILED,
        a2a.TASK_STATE_CANCELED,
        a2a.TASK_STATE_REJECTED,
    }
)
# The A2A task waits for its client: the bridge blocks the WorkItem with the agent's question.
INTERRUPTED = frozenset({a2a.TASK_STATE_INPUT_REQUIRED, a2a.TASK_STATE_AUTH_REQUIRED})


def state_name(state: int) -> str:
    """``input-required`` for TASK_STATE_INPUT_REQUIRED: the spelling of A2A's documents."""
    return a2a.TaskState.Name(state).removeprefix("TASK_STATE_").lower().replace("_", "-")  # type: ignore[arg-type]


@dataclass(frozen=True)
class InputPart:
    """One input Artifact, read and verified, to hand to the A2A agent."""

    name: str
    media_type: str
    data: bytes
    digest_hex: str


def work_message(
    contract: wp.WorkContract,
    inputs: Sequence[InputPart],
    *,
    message_id: str,
    context_id: str,
    title: str = "",
    reference_task_ids: Sequence[str] = (),
) -> a2a.Message:
    """The work contract as the A2A message that starts the task: the goal and acceptance
    criteria as text (what a model-backed agent reads), the same as a data part (what a program
    reads), then one part per input Artifact."""
    lines = [f"# {title}" if title else "# Work", "", contract.goal]
    if contract.acceptance_criteria:
        lines += ["", "## Acceptance criteria"]
        lines += [f"- [{c.criterion_id}] {c.description}" for c in contract.acceptance_criteria]
    if contract.deliverables:
        lines += ["", "## Deliverables"]
        lines += [f"- [{d.deliverable_id}] {d.description}" for d in contract.deliverables]
    if contract.notes:
        lines += ["", "## Notes", contract.notes]
    if contract.HasField("deadline"):
        lines += ["", f"Deadline: {contract.deadline.ToJsonString()}"]
    parts = [a2a.Part(text="\n".join(lines).strip() + "\n")]
    data: dict[str, object] = {
        "goal": contract.goal,
        "contract_revision": int(contract.revision or 1),
        "acceptance_criteria": [
            {"criterion_id": c.criterion_id, "description": c.description, "required": c.required}
            for c in contract.acceptance_criteria
        ],
        "deliverables": [
            {"deliverable_id": d.deliverable_id, "description": d.description} for d in contract.deliverables
        ],
        "inputs": [{"name": i.name, "media_type": i.media_type, "blake3": i.digest_hex} for i in inputs],
    }
    parts.append(
        a2a.Part(data=json_format.ParseDict(data, struct_pb2.Value()), media_type="application/json")
    )
    parts += [input_part(i) for i in inputs]
    return a2a.Message(
        message_id=message_id,
        context_id=context_id,
        role=a2a.ROLE_USER,
        parts=parts,
        reference_task_ids=list(reference_task_ids),
        metadata={"missionweave": {"kind": "work_contract"}},
    )


def input_part(item: InputPart) -> a2a.Part:
    """Small text inline; anything else as a file part carrying its bytes."""
    if len(item.data) <= INLINE_TEXT_LIMIT and TEXT_MEDIA.match(item.media_type):
        try:
            return a2a.Part(text=item.data.decode("utf-8"), filename=item.name, media_type=item.media_type)
        except UnicodeDecodeError:
            pass  # declared text, is not: its bytes go as they are
    return a2a.Part(raw=item.data, filename=item.name, media_type=item.media_type)


def answer_message(text: str, *, message_id: str, task_id: str, context_id: str) -> a2a.Message:
    """The Coordinator's answer to an ``input-required`` task, as the task's next message."""
    return a2a.Message(
        message_id=message_id,
        task_id=task_id,
        context_id=context_id,
        role=a2a.ROLE_USER,
        parts=[a2a.Part(text=text)],
        metadata={"missionweave": {"kind": "unblock_resolution"}},
    )


def message_text(message: a2a.Message) -> str:
    """The text parts of an A2A message (a status message: the agent's question or reason)."""
    return "\n".join(p.text for p in message.parts if p.WhichOneof("content") == "text").strip()


@dataclass(frozen=True)
class ArtifactContent:
    """One A2A artifact flattened to the bytes a MissionWeave Artifact stores."""

    artifact_id: str
    name: str
    media_type: str
    data: bytes


def artifact_content(artifact: a2a.Artifact) -> ArtifactContent | None:
    """An A2A artifact's bytes: one part as it is (text UTF-8, raw bytes, data as JSON); several as
    a JSON document of their parts, in order. A part that is only a URL is not fetched: the bridge
    stores what the agent handed over, nothing it would have to trust a third party for."""
    parts = list(artifact.parts)
    if not parts:
        return None
    name = artifact.name or artifact.artifact_id
    if len(parts) == 1:
        part = parts[0]
        kind = part.WhichOneof("content")
        if kind == "text":
            return ArtifactContent(
                artifact.artifact_id, name, part.media_type or "text/plain", part.text.encode()
            )
        if kind == "raw":
            return ArtifactContent(
                artifact.artifact_id, name, part.media_type or "application/octet-stream", part.raw
            )
    document = json_format.MessageToJson(artifact, sort_keys=True, indent=None).encode()
    return ArtifactContent(artifact.artifact_id, name, "application/vnd.a2a.artifact+json", document)


def evidence_for(
    contract: wp.WorkContract,
    artifacts: Sequence[common_pb2.ArtifactRef],
    *,
    passed: bool,
    summary: str,
    producer_id: str,
) -> list[wp.Evidence]:
    """One Evidence per acceptance criterion (MW-13.2-02), citing the Artifacts the task produced.
    The verdict is the A2A agent's own (its task's terminal state); the method is the criterion's
    first required one (what the Coordinator asked for), else REVIEW, and the summary says whose
    verdict it is, so a reviewer weighs it as a claim of the agent."""
    criteria = list(contract.acceptance_criteria) or [
        wp.AcceptanceCriterion(criterion_id="a2a-task", description="the A2A task ended")
    ]
    out = []
    for c in criteria:
        method = c.required_evidence_methods[0] if c.required_evidence_methods else wp.EVIDENCE_METHOD_REVIEW
        out.append(
            wp.Evidence(
                evidence_id=f"ev-{c.criterion_id}",
                criterion_id=c.criterion_id,
                criterion=c.description,
                method=method,
                result=wp.EVIDENCE_RESULT_PASS if passed else wp.EVIDENCE_RESULT_FAIL,
                producer_id=producer_id,
                artifacts=list(artifacts),
                summary=summary[:4096],
            )
        )
    return out


# ------------------------------------------------------------------ errors


@dataclass(frozen=True)
class Failure:
    """A structured worker-reported failure: a wp.WorkFailureKind and a reason naming the A2A error."""

    kind: int
    reason: str


# A2A errors the agent answered with: PERMANENT when resending the same request cannot succeed.
PERMANENT_ERRORS: tuple[type[Exception], ...] = (
    a2a_errors.ContentTypeNotSupportedError,
    a2a_errors.InvalidParamsError,
    a2a_errors.InvalidRequestError,
    a2a_errors.MethodNotFoundError,
    a2a_errors.UnsupportedOperationError,
    a2a_errors.VersionNotSupportedError,
    a2a_errors.ExtensionSupportRequiredError,
    a2a_errors.InvalidAgentResponseError,
    a2a_errors.TaskNotFoundError,
    a2a_errors.TaskNotCancelableError,
    a2a_errors.JSONParseError,
)


def failure_of(err: Exception) -> Failure:
    """An A2A error as a failure kind: the agent's own refusals are PERMANENT; timeouts, transport
    errors and the agent's internal errors TRANSIENT (the contract's retry policy decides)."""
    name = type(err).__name__
    if isinstance(err, PERMANENT_ERRORS):
        return Failure(wp.WORK_FAILURE_KIND_PERMANENT, f"the A2A agent refused: {name}: {err}")
    if isinstance(err, A2AClientTimeoutError):
        return Failure(wp.WORK_FAILURE_KIND_TRANSIENT, f"the A2A agent did not answer in time: {err}")
    if isinstance(err, a2a_errors.InternalError):
        return Failure(wp.WORK_FAILURE_KIND_TRANSIENT, f"the A2A agent failed internally: {err}")
    if isinstance(err, A2AClientError):
        return Failure(wp.WORK_FAILURE_KIND_TRANSIENT, f"the A2A agent could not be reached: {err}")
    return Failure(wp.WORK_FAILURE_KIND_TRANSIENT, f"A2A call failed: {name}: {err}")


def task_failure(task_state: int, reason: str) -> Failure:
    """A terminal A2A state other than completed, as a failure kind."""
    label = state_name(task_state)
    why = reason or "no reason given"
    if task_state == a2a.TASK_STATE_REJECTED:
        return Failure(wp.WORK_FAILURE_KIND_PERMANENT, f"the A2A agent rejected the task: {why}")
    if task_state == a2a.TASK_STATE_CANCELED:
        return Failure(wp.WORK_FAILURE_KIND_PERMANENT, f"the A2A agent canceled the task: {why}")
    return Failure(wp.WORK_FAILURE_KIND_PERMANENT, f"the A2A task ended {label}: {why}")


# ------------------------------------------------------------------ identity and cards


def context_id(group_id: str, work_item_id: str, ownership_epoch: int) -> str:
    """The A2A context of one ownership of one WorkItem: every message and task of it share it, so
    the bridge can find a task again by listing its context (a send it did not see answered)."""
    digest = hashlib.blake2b(f"{group_id}\0{work_item_id}\0{ownership_epoch}".encode(), digest_size=12)
    return "mwp-" + base64.b32encode(digest.digest()).decode().rstrip("=").lower()


def mission_card(
    card: a2a.AgentCard, *, agent_id: str, max_concurrency: int, endpoint: str
) -> agent_card_pb2.AgentCard:
    """The MissionWeave Agent Card of a bridged A2A agent: one capability per A2A skill
    (``a2a.skill.<id>``, at the A2A card's version), its declared slots, where it is reached."""
    version = card.version if SEMVER.match(card.version or "") else "0.0.0"
    skills = sorted({s.id for s in card.skills if s.id})
    return agent_card_pb2.AgentCard(
        agent_id=agent_id,
        card_version=version,
        capabilities=[
            membership_pb2.Capability(capability_id=f"a2a.skill.{s}", version=version) for s in skills[:256]
        ],
        max_concurrency=max_concurrency,
        extensions=["urn:a2a:protocol:v1.0"],
        endpoints=[endpoint[:512]],
        display_name=(card.name or agent_id)[:256],
        description=(card.description or "")[:4096],
    )
