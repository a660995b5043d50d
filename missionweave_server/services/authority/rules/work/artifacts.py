"""MW-11.3-04 / MW-13.1-02/03: Artifacts published under the current execution lease."""

from __future__ import annotations

from missionweave.kernel import ids
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.rules.common import (
    CommandKind,
    DecisionContext,
    Emitter,
    R,
    invalid,
)
from missionweave_server.services.authority.rules.work.common import ACTIVE, require_state, touch, work_item
from missionweave_server.services.authority.rules.work.leases import require_lease
from missionweave_server.services.authority.state import GroupState


def _published(command: command_pb2.Command) -> wp.WorkPublishArtifact | None:
    """Which artifact the shell looks up for the decision (blob, the publisher's manifests for this
    Group and WorkItem): a well-formed BLAKE3 id, else none, and the rule refuses it as not stored."""
    body = command.work_publish_artifact
    digest = body.artifact.digest
    return body if digest.algorithm == "blake3" and ids.is_valid(digest.hex) else None


def work_publish_artifact(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext, out: Emitter
) -> None:
    """MW-11.3-04 / MW-13.1-02/03: publication cites the current lease; the log gets the reference and
    the manifest digest, never the bytes."""
    assert state is not None
    body = command.work_publish_artifact
    item = work_item(state, body.work_item_id)
    require_state(item, (ACTIVE,), "work.publish_artifact")
    require_lease(item, command, ctx, body.lease_id, body.ownership_epoch)
    digest = body.artifact.digest
    stored = ctx.artifacts.get(digest.hex)
    if stored is None or stored.size_bytes != digest.size_bytes:
        raise Rejected(
            R.REJECTION_REASON_NOT_FOUND,
            f"blake3:{digest.hex} ({digest.size_bytes} bytes) is not stored with a manifest signed by "
            f"{command.actor_id}; upload it with its manifest first",
        )
    if body.deliverable_id and body.deliverable_id not in {
        d.deliverable_id for d in item.contract.deliverables
    }:
        raise invalid("body.deliverable_id", f"not a deliverable of {item.work_item_id}")
    out.emit(
        "artifact.published",
        "artifact_published",
        wp.ArtifactPublished(
            work_item_id=item.work_item_id,
            lease_id=body.lease_id,
            ownership_epoch=body.ownership_epoch,
            artifact=body.artifact,
            manifest_digest=common_pb2.Digest(algorithm="blake3", hex=stored.manifest_digest),
            source_artifacts=[common_pb2.Digest(algorithm="blake3", hex=h) for h in stored.source_digests],
            deliverable_id=body.deliverable_id,
        ),
    )


# ---------------------------------------------------------------- evolve rules


def _artifact_published(state: GroupState, event: event_pb2.Event) -> None:
    item = touch(state, event, event.artifact_published.work_item_id)
    digest = event.artifact_published.artifact.digest
    item.published_artifacts += ((digest.hex, int(digest.size_bytes)),)


# ---------------------------------------------------------------- the declarations

KINDS = (
    CommandKind(
        "work_publish_artifact",
        work_publish_artifact,
        {"artifact_published": _artifact_published},
        published_artifact=_published,
    ),
)
