"""What an A2A task is on the MissionWeave side, and how a Group's events become A2A task events.

Pure: no I/O. A task id names a Mission (its Group), a WorkItem, or a work proposal made through the
endpoint (docs/bridge-a2a-server.md has the tables). A ``Tracker`` folds the Group's verified events,
in sequence order, into the task's A2A state and artifacts, and says for each event which A2A events
(status or artifact updates) it stands for; GetTask, SubscribeToTask and the streaming send all use
the same fold, so a snapshot at sequence N followed by the updates after N is exactly what a
subscriber from 0 would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from a2a.types import a2a_pb2 as a2a
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from missionweave.v1 import common_pb2, event_pb2, mission_pb2, work_pb2

TS = a2a.TaskState
WS = work_pb2.WorkItemState
MS = mission_pb2.MissionState

Kind = Literal["mission", "workitem", "proposal"]

# Metadata keys every event and snapshot carries (strings: a Struct number is a double).
CURSOR = "mwp.cursor"
SNAPSHOT = "mwp.snapshot"
CURSOR_TOO_OLD = "mwp.cursor_too_old"
REQUESTED_CURSOR = "mwp.requested_cursor"

TERMINAL = frozenset(
    {TS.TASK_STATE_COMPLETED, TS.TASK_STATE_FAILED, TS.TASK_STATE_CANCELED, TS.TASK_STATE_REJECTED}
)

# MWP WorkItem state -> A2A task state (docs/bridge-a2a-server.md "States").
WORK_ITEM_STATES: dict[Any, Any] = {
    WS.WORK_ITEM_STATE_OPEN: TS.TASK_STATE_SUBMITTED,
    WS.WORK_ITEM_STATE_OFFERED: TS.TASK_STATE_SUBMITTED,
    WS.WORK_ITEM_STATE_QUEUED: TS.TASK_STATE_SUBMITTED,
    WS.WORK_ITEM_STATE_ACTIVE: TS.TASK_STATE_WORKING,
    WS.WORK_ITEM_STATE_SUBMITTED: TS.TASK_STATE_WORKING,
    WS.WORK_ITEM_STATE_BLOCKED: TS.TASK_STATE_INPUT_REQUIRED,
    WS.WORK_ITEM_STATE_VERIFIED: TS.TASK_STATE_COMPLETED,
    WS.WORK_ITEM_STATE_FAILED: TS.TASK_STATE_FAILED,
    WS.WORK_ITEM_STATE_CANCELLED: TS.TASK_STATE_CANCELED,
}

# MWP Mission state -> A2A task state.
MISSION_STATES: dict[Any, Any] = {
    MS.MISSION_STATE_ACTIVE: TS.TASK_STATE_WORKING,
    # The MissionOwner's decision is the input the Mission waits for.
    MS.MISSION_STATE_AWAITING_APPROVAL: TS.TASK_STATE_INPUT_REQUIRED,
    MS.MISSION_STATE_APPROVED: TS.TASK_STATE_COMPLETED,
    MS.MISSION_STATE_CANCELLED: TS.TASK_STATE_CANCELED,
    MS.MISSION_STATE_FAILED: TS.TASK_STATE_FAILED,
}

# The WorkItem state each event leaves its WorkItem in (the Authority's fold, rules/work/*).
_WORK_EVENT_STATES: dict[Any, Any] = {
    "work_authorized": WS.WORK_ITEM_STATE_OPEN,
    "work_offered": WS.WORK_ITEM_STATE_OFFERED,
    "work_offer_accepted": WS.WORK_ITEM_STATE_QUEUED,
    "work_started": WS.WORK_ITEM_STATE_ACTIVE,
    "work_checkpointed": WS.WORK_ITEM_STATE_QUEUED,
    "work_blocked": WS.WORK_ITEM_STATE_BLOCKED,
    "work_submitted": WS.WORK_ITEM_STATE_SUBMITTED,
    "work_result_accepted": WS.WORK_ITEM_STATE_VERIFIED,
    "work_failed": WS.WORK_ITEM_STATE_FAILED,
    "work_cancelled": WS.WORK_ITEM_STATE_CANCELLED,
}

_MISSION_EVENT_STATES: dict[Any, Any] = {
    "mission_created": MS.MISSION_STATE_ACTIVE,
    "mission_submitted": MS.MISSION_STATE_AWAITING_APPROVAL,
    "mission_changes_requested": MS.MISSION_STATE_ACTIVE,
    "mission_approved": MS.MISSION_STATE_APPROVED,
    "mission_cancelled": MS.MISSION_STATE_CANCELLED,
    "mission_failed": MS.MISSION_STATE_FAILED,
}

# Events of a WorkItem that tell an A2A client nothing it can act on: no update is sent for them
# (the cursor of the next update still covers them).
_QUIET = frozenset({"work_lease_renewed", "resource_usage_recorded", "execution_approval_granted"})


class BadTaskId(ValueError):
    pass


@dataclass(frozen=True)
class TaskRef:
    kind: Kind
    group_id: str
    item_id: str = ""

    @property
    def task_id(self) -> str:
        return (
            f"mission:{self.group_id}"
            if self.kind == "mission"
            else f"{self.kind}:{self.group_id}/{self.item_id}"
        )

    @staticmethod
    def parse(task_id: str) -> TaskRef:
        kind, _, rest = task_id.partition(":")
        if kind == "mission" and rest and "/" not in rest:
            return TaskRef("mission", rest)
        group_id, _, item_id = rest.partition("/")
        if kind in ("workitem", "proposal") and group_id and item_id and "/" not in item_id:
            return TaskRef(kind, group_id, item_id)  # type: ignore[arg-type]
        raise BadTaskId(
            f"{task_id!r} is not a task of this endpoint (mission:<group>, workitem:<group>/<id>, proposal:<group>/<id>)"
        )


def work_item_of(event: event_pb2.Event) -> str:
    """The WorkItem an event is about ("" for none)."""
    which = event.WhichOneof("payload")
    if which is None:
        return ""
    payload = getattr(event, which)
    return str(getattr(payload, "work_item_id", ""))


def _metadata(values: dict[str, Any]) -> Struct:
    s = Struct()
    s.update(values)
    return s


def _text_message(event: event_pb2.Event, text: str, task_id: str) -> a2a.Message:
    return a2a.Message(
        message_id=f"{task_id}#{event.sequence}",
        context_id=event.group_id,
        task_id=task_id,
        role=a2a.ROLE_AGENT,
        parts=[a2a.Part(text=text)],
    )


def describe(event: event_pb2.Event) -> str:
    """One line for a person reading the task's history; the machine-readable facts are in metadata."""
    which = event.WhichOneof("payload") or ""
    payload = getattr(event, which) if which else None
    wi = work_item_of(event)
    subject = f"WorkItem {wi}: " if wi else ""
    if which == "work_blocked" and isinstance(payload, work_pb2.WorkBlocked):
        questions = "; ".join(b.description or b.required_resolution for b in payload.blockers)
        return f"{subject}blocked by {event.actor_id}: {questions}"
    if which == "work_failed" and isinstance(payload, work_pb2.WorkFailed):
        return f"{subject}failed ({work_pb2.WorkFailureKind.Name(payload.kind)}): {payload.reason}"
    if which == "work_cancelled" and isinstance(payload, work_pb2.WorkCancelled):
        return f"{subject}cancelled: {payload.reason}"
    if which == "work_submitted" and isinstance(payload, work_pb2.WorkSubmitted):
        return f"{subject}result submitted by {event.actor_id}: {payload.summary}"
    if which == "work_proposed" and isinstance(payload, work_pb2.WorkProposed):
        return f"work proposed by {event.actor_id}: {payload.title}"
    if which == "message_posted":
        return f"{event.actor_id}: {event.message_posted.content.text}"
    if which == "mission_cancelled":
        return f"Mission cancelled: {event.mission_cancelled.reason}"
    return f"{subject}{event.type} by {event.actor_id}"


def artifact_of(ref: common_pb2.ArtifactRef, *, work_item_id: str, deliverable_id: str = "") -> a2a.Artifact:
    """An MWP Artifact as an A2A artifact naming it by content hash; the bytes go in a ``raw`` part
    when the endpoint inlines them (``with_bytes``), else the ``url`` part is the reference."""
    digest = ref.digest
    name = f"{digest.algorithm}:{digest.hex}"
    meta: dict[str, object] = {
        "mwp.digest": name,
        "mwp.size_bytes": str(digest.size_bytes),
        "mwp.media_type": ref.media_type,
        "mwp.work_item_id": work_item_id,
    }
    if deliverable_id:
        meta["mwp.deliverable_id"] = deliverable_id
    return a2a.Artifact(
        artifact_id=name,
        name=deliverable_id or name,
        parts=[a2a.Part(url=f"mwp://artifacts/{digest.algorithm}/{digest.hex}", media_type=ref.media_type)],
        metadata=_metadata(meta),
    )


def with_bytes(artifact: a2a.Artifact, data: bytes) -> a2a.Artifact:
    out = a2a.Artifact()
    out.CopyFrom(artifact)
    media_type = out.parts[0].media_type
    del out.parts[:]
    out.parts.append(a2a.Part(raw=data, media_type=media_type))
    return out


Update = a2a.TaskStatusUpdateEvent | a2a.TaskArtifactUpdateEvent


@dataclass
class Tracker:
    """One task's fold over its Group's events (the member's view the identity may read)."""

    ref: TaskRef
    exists: bool = False
    state: int = TS.TASK_STATE_SUBMITTED
    mwp_state: str = ""
    last_message: a2a.Message | None = None
    last_timestamp: Timestamp | None = None
    artifacts: dict[str, a2a.Artifact] = field(default_factory=dict)
    work_item_id: str = ""
    conversation_id: str = ""
    proposal: work_pb2.WorkProposed | None = None
    proposer_id: str = ""

    def __post_init__(self) -> None:
        if self.ref.kind == "mission":
            # A member whose view starts after mission.created still sees a running Mission.
            self.state, self.mwp_state = TS.TASK_STATE_WORKING, MS.Name(MS.MISSION_STATE_ACTIVE)
        elif self.ref.kind == "workitem":
            self.work_item_id = self.ref.item_id

    @property
    def terminal(self) -> bool:
        return self.exists and self.state in TERMINAL

    def apply(self, event: event_pb2.Event) -> list[Update]:
        """Fold ``event`` (the next of the Group, verified); the A2A events it stands for."""
        which = event.WhichOneof("payload") or ""
        if self.ref.kind == "mission":
            self.exists = True
            return self._mission(event, which)
        if self.ref.kind == "proposal" and not self.work_item_id:
            return self._proposal(event, which)
        return self._work_item(event, which)

    def _status(self, event: event_pb2.Event, text: str, extra: dict[str, object] | None = None) -> Update:
        message = _text_message(event, text, self.ref.task_id)
        self.last_message, self.last_timestamp = message, event.recorded_at
        meta: dict[str, object] = {
            CURSOR: str(event.sequence),
            "mwp.event_id": event.event_id,
            "mwp.event_type": event.type,
            "mwp.actor_id": event.actor_id,
            "mwp.state": self.mwp_state,
            **(extra or {}),
        }
        if self.work_item_id:
            meta["mwp.work_item_id"] = self.work_item_id
        return a2a.TaskStatusUpdateEvent(
            task_id=self.ref.task_id,
            context_id=self.ref.group_id,
            status=a2a.TaskStatus(state=self.state, message=message, timestamp=event.recorded_at),  # type: ignore[arg-type]
            metadata=_metadata(meta),
        )

    def _artifact(self, event: event_pb2.Event, artifact: a2a.Artifact) -> Update:
        self.artifacts[artifact.artifact_id] = artifact
        return a2a.TaskArtifactUpdateEvent(
            task_id=self.ref.task_id,
            context_id=self.ref.group_id,
            artifact=artifact,
            last_chunk=True,
            metadata=_metadata(
                {CURSOR: str(event.sequence), "mwp.event_id": event.event_id, "mwp.event_type": event.type}
            ),
        )

    def _mission(self, event: event_pb2.Event, which: str) -> list[Update]:
        if which in _MISSION_EVENT_STATES:
            mission_state = _MISSION_EVENT_STATES[which]
            self.state, self.mwp_state = MISSION_STATES[mission_state], MS.Name(mission_state)
            return [self._status(event, describe(event))]
        if which == "artifact_published":
            published = event.artifact_published
            return [
                self._artifact(
                    event,
                    artifact_of(
                        published.artifact,
                        work_item_id=published.work_item_id,
                        deliverable_id=published.deliverable_id,
                    ),
                )
            ]
        wi = work_item_of(event)
        if which == "work_proposed" or (wi and _work_state(event, which) is not None):
            extra: dict[str, object] = {}
            if wi:
                extra = {"mwp.work_item_id": wi, "mwp.work_item_state": WS.Name(_work_state(event, which))}
            return [*self._submitted(event, which), self._status(event, describe(event), extra)]
        return []

    def _proposal(self, event: event_pb2.Event, which: str) -> list[Update]:
        if which == "work_proposed" and event.work_proposed.proposal_id == self.ref.item_id:
            self.exists, self.proposal, self.proposer_id = True, event.work_proposed, event.actor_id
            self.state, self.mwp_state = TS.TASK_STATE_SUBMITTED, "PROPOSED"
            return [self._status(event, describe(event))]
        if not self.exists:
            return []
        if which == "work_authorized" and event.work_authorized.proposal_id == self.ref.item_id:
            self.work_item_id = event.work_authorized.work_item_id
            return self._work_item(event, which)
        # A Mission that ends with the proposal never authorized: it was not taken up.
        if which in ("mission_approved", "mission_failed"):
            self.state, self.mwp_state = TS.TASK_STATE_REJECTED, "NOT_AUTHORIZED"
            return [self._status(event, f"the Mission ended ({event.type}) without authorizing the proposal")]
        if which == "mission_cancelled":
            self.state, self.mwp_state = TS.TASK_STATE_CANCELED, "NOT_AUTHORIZED"
            return [self._status(event, describe(event))]
        return []

    def _work_item(self, event: event_pb2.Event, which: str) -> list[Update]:
        if which == "message_posted":
            if self.exists and event.message_posted.conversation_id == self.conversation_id:
                return [self._status(event, describe(event))]
            return []
        if work_item_of(event) != self.work_item_id or not self.work_item_id:
            return []
        if which == "work_authorized":
            self.exists, self.conversation_id = True, event.work_authorized.conversation_id
        if not self.exists:
            return []
        if which == "artifact_published":
            published = event.artifact_published
            return [
                self._artifact(
                    event,
                    artifact_of(
                        published.artifact,
                        work_item_id=published.work_item_id,
                        deliverable_id=published.deliverable_id,
                    ),
                )
            ]
        new_state = _work_state(event, which)
        if new_state is not None:
            self.state, self.mwp_state = WORK_ITEM_STATES[new_state], WS.Name(new_state)
        elif which in _QUIET:
            return []
        return [*self._submitted(event, which), self._status(event, describe(event))]

    def _submitted(self, event: event_pb2.Event, which: str) -> list[Update]:
        """A submission's deliverables (not published before) as artifact updates, ahead of its status."""
        if which != "work_submitted":
            return []
        return [
            self._artifact(event, artifact_of(ref, work_item_id=event.work_submitted.work_item_id))
            for ref in event.work_submitted.artifacts
            if f"{ref.digest.algorithm}:{ref.digest.hex}" not in self.artifacts
        ]

    def task(self, cursor: int, **flags: object) -> a2a.Task:
        meta: dict[str, object] = {CURSOR: str(cursor), "mwp.state": self.mwp_state, **flags}
        if self.work_item_id:
            meta["mwp.work_item_id"] = self.work_item_id
        status = a2a.TaskStatus(state=self.state)  # type: ignore[arg-type]
        if self.last_message is not None:
            status.message.CopyFrom(self.last_message)
        if self.last_timestamp is not None:
            status.timestamp.CopyFrom(self.last_timestamp)
        return a2a.Task(
            id=self.ref.task_id,
            context_id=self.ref.group_id,
            status=status,
            artifacts=list(self.artifacts.values()),
            metadata=_metadata(meta),
        )


def _work_state(event: event_pb2.Event, which: str) -> Any:
    if which in _WORK_EVENT_STATES:
        return _WORK_EVENT_STATES[which]
    if which == "work_unblocked" and event.work_unblocked.next_state:
        return int(event.work_unblocked.next_state)
    if which == "lease_revoked" and event.lease_revoked.resulting_state:
        return int(event.lease_revoked.resulting_state)
    return None
