"""Lookups: what a command's decision consults outside the Authority, and the context it is decided in.

The identities a command names and the Agent Cards in force of the agents it names (Membership's
directory), the artifact it publishes and the blobs it names as deliverables or Evidence (the artifact
store's PublicationService). A peer that does not answer refuses the command PEER_UNAVAILABLE; the
refusal is kept in ``Lookups`` and raised only where the decision needs them, so a replay of the
command is still answered (authority.py looks them up before taking the Group's lock).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import grpc

from missionweave.internal.v1 import publications_pb2
from missionweave.kernel import ids
from missionweave.kernel.errors import Rejected
from missionweave.kernel.manifest import manifest_digest
from missionweave.v1 import agent_card_pb2, command_pb2, common_pb2
from missionweave_server.edge.identities import DirectoryIdentity, IdentityDirectoryClient
from missionweave_server.edge.status import peer_unavailable
from missionweave_server.services.authority import decider, kinds
from missionweave_server.services.authority.rules.common import (
    CardInfo,
    HeldArtifact,
    HeldManifest,
    OrganizationPolicy,
    StoredArtifact,
)
from missionweave_server.services.authority.state import GroupState, IdentityInfo

if TYPE_CHECKING:  # the typed aio stub exists in the generated .pyi only
    from missionweave.internal.v1.publications_pb2_grpc import PublicationServiceAsyncStub

# A peer service's answer is awaited this long before the command is refused PEER_UNAVAILABLE.
PEER_TIMEOUT_S = 5.0
# The most digests one PublicationService.FindArtifacts call takes (publications.proto).
MAX_FIND_ARTIFACTS = 64


@dataclass
class Lookups:
    """What ``look_up`` found for one command (``refused``: why it could not)."""

    identities: dict[str, IdentityInfo]
    artifacts: dict[str, StoredArtifact]
    cards: dict[str, CardInfo]
    held: dict[str, HeldArtifact] = field(default_factory=dict)
    refused: Rejected | None = None


async def look_up(
    command: command_pb2.Command,
    identities: IdentityDirectoryClient,
    publications: PublicationServiceAsyncStub | None,
) -> Lookups:
    """What the decision of ``command`` consults outside the Authority: the identities it names,
    the artifact it publishes, the Agent Cards in force of the agents it names. A refusal
    (a peer unavailable) is kept, and raised where the decision needs them: a replay of the
    command is still answered."""
    try:
        known = {
            i: _identity_info(d)
            for i, d in (await identities.get_many(kinds.referenced_identities(command))).items()
        }
        artifacts = await _published_artifacts(command, publications)
        cards = {
            agent: card_info(published)
            for agent, published in (await identities.agent_cards(kinds.card_holders(command))).items()
        }
        held = await _held_artifacts(command, publications)
    except Rejected as refused:
        return Lookups({}, {}, {}, refused=refused)
    return Lookups(known, artifacts, cards, held)


async def decision_context(
    command: command_pb2.Command,
    envelope: common_pb2.SignedEnvelope | None,
    now: datetime,
    lookups: Lookups,
    state_of: Callable[[str], Awaitable[GroupState | None]],
    policy: OrganizationPolicy,
) -> decider.DecisionContext:
    """What the decision of a signed command consults besides the Group's state (``state_of``: the
    durable state of another Group the command links to)."""
    if lookups.refused is not None:
        raise lookups.refused
    linked = {}
    for linked_id in kinds.linked_groups(command):
        linked_state = await state_of(linked_id)  # durable state of the other Group
        if linked_state is not None:
            linked[linked_id] = linked_state
    return decider.DecisionContext(
        now, lookups.identities, linked, envelope, lookups.artifacts, policy, lookups.cards, lookups.held
    )


async def _published_artifacts(
    command: command_pb2.Command, publications: PublicationServiceAsyncStub | None
) -> dict[str, StoredArtifact]:
    """For work.publish_artifact: the blob must be stored with a manifest its publisher signed
    for this Group and WorkItem (verified by the ArtifactService at upload, MW-13.1-03)."""
    body = kinds.published_artifact(command)
    if body is None:
        return {}
    digest = body.artifact.digest
    if digest.algorithm != "blake3" or not ids.is_valid(digest.hex):
        return {}
    if publications is None:
        raise peer_unavailable("artifacts", "no artifact store is configured")
    request = publications_pb2.FindPublicationRequest(
        content_digest_hex=digest.hex,
        group_id=command.group_id,
        work_item_id=body.work_item_id,
        publisher_id=command.actor_id,
        manifest_digest_hex=manifest_digest(body.manifest) if body.HasField("manifest") else "",
    )
    try:
        found = await publications.FindPublication(request, timeout=PEER_TIMEOUT_S)
    except grpc.RpcError as err:
        raise peer_unavailable("artifacts", err) from None
    if not found.found:
        return {}
    return {
        digest.hex: StoredArtifact(
            digest.hex,
            found.size_bytes,
            found.manifest_digest_hex,
            command.actor_id,
            tuple(found.source_digests_hex),
        )
    }


def _work_item_of(command: command_pb2.Command) -> str:
    """The WorkItem a command is about (its body's ``work_item_id``), "" for one about the Mission:
    D161 wants a manifest naming that WorkItem, so only those are asked for."""
    which = command.WhichOneof("body")
    return str(getattr(getattr(command, which), "work_item_id", "")) if which else ""


async def _held_artifacts(
    command: command_pb2.Command, publications: PublicationServiceAsyncStub | None
) -> dict[str, HeldArtifact]:
    """D161: what the artifact store holds of the blobs the command names as deliverables or
    Evidence, with the manifests its actor signed for this Group. Never accepted unchecked: a
    store that is not configured or does not answer refuses the command PEER_UNAVAILABLE."""
    digests = kinds.named_artifacts(command)
    if not digests:
        return {}
    if publications is None:
        raise peer_unavailable("artifacts", "no artifact store is configured")
    held: dict[str, HeldArtifact] = {}
    for start in range(0, len(digests), MAX_FIND_ARTIFACTS):
        request = publications_pb2.FindArtifactsRequest(
            group_id=command.group_id,
            content_digests_hex=digests[start : start + MAX_FIND_ARTIFACTS],
            producer_id=command.actor_id,
            work_item_id=_work_item_of(command),
        )
        try:
            found = await publications.FindArtifacts(request, timeout=PEER_TIMEOUT_S)
        except grpc.RpcError as err:
            raise peer_unavailable("artifacts", err) from None
        for answer in found.artifacts:
            if answer.stored:
                held[answer.content_digest_hex] = HeldArtifact(
                    answer.size_bytes,
                    tuple(
                        HeldManifest(
                            m.manifest_digest_hex, m.work_item_id, m.mission_id, tuple(m.source_digests_hex)
                        )
                        for m in answer.manifests
                    ),
                )
    return held


def _identity_info(identity: DirectoryIdentity) -> IdentityInfo:
    return IdentityInfo(identity.identity_id, identity.kind, identity.org_admin, identity.session_epoch)


def card_info(published: agent_card_pb2.PublishedAgentCard) -> CardInfo:
    card = published.card
    return CardInfo(
        card.card_version, {c.capability_id: c.version for c in card.capabilities}, card.max_concurrency
    )
