"""A small Python client for the mesh: sign commands, open sessions, execute, read events.

Example::

    async with MeshClient("127.0.0.1:50051") as mesh:
        session = await mesh.open_session("alice", alice_key)
        result = await mesh.execute(session.command(group_id, "message_post", body, membership_epoch=1))

Over TLS (docs/tls.md): ``MeshClient(target, tls=ClientTLS(ca_file=Path("ca.crt")))``, with
``cert_file``/``key_file`` where the server requires client certificates, or ``ClientTLS.from_env()``
for the ``MWP_TLS*`` settings ``mwp`` reads.

The gateway issue extends this into the full agent SDK (streams, cursors, reconnect).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import blake3
import grpc
from google.protobuf.message import Message
from nacl.signing import SigningKey

from missionweave.kernel import codec, ids, uploads
from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.digests import CHUNK_BYTES
from missionweave.kernel.errors import Rejected, from_proto
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import (
    AGENT_CARD_TYPE,
    COMMAND_TYPE,
    GROUP_SUMMARY_TYPE,
    OPEN_SESSION_TYPE,
    REGISTER_IDENTITY_TYPE,
    session_key_id,
    sign_envelope,
    verify_signature,
)
from missionweave.kernel.transport import ClientTLS, open_channel
from missionweave.sdk.credentials import CallProofs
from missionweave.v1 import (
    agent_card_pb2,
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    authority_service_pb2,
    authority_service_pb2_grpc,
    command_pb2,
    common_pb2,
    event_pb2,
    membership_pb2,
    membership_service_pb2,
    membership_service_pb2_grpc,
    subtask_pb2,
    work_pb2,
)

_clock = SystemClock()
T = TypeVar("T")


class CardNotVerified(Exception):
    """A published Agent Card whose envelope does not verify with the session key served with it,
    or whose payload is not the card served."""


class SummaryNotVerified(Exception):
    """A signed Group summary whose Authority signature or payload type does not check out."""


@dataclass(frozen=True)
class VerifiedSummary:
    """A Group summary whose DSSE signature verified against the Authority's public key."""

    state: authority_service_pb2.GroupState
    key_id: str
    envelope: common_pb2.SignedEnvelope


def membership_epoch(state: authority_service_pb2.GroupState, identity_id: str) -> int:
    """``identity_id``'s active Membership epoch in the Group, 0 when it holds none (MW-8-02)."""
    return next((m.membership_epoch for m in state.memberships if m.member_id == identity_id and m.active), 0)


def verify_group_summary(
    envelope: common_pb2.SignedEnvelope, key_id: str, public_key: bytes
) -> VerifiedSummary:
    """Checks the payload type and the Authority's signature *before* parsing the payload."""
    if envelope.payload_type != GROUP_SUMMARY_TYPE:
        raise SummaryNotVerified(f"payload type {envelope.payload_type!r} is not {GROUP_SUMMARY_TYPE!r}")
    index = next((i for i, sig in enumerate(envelope.signatures) if sig.key_id == key_id), None)
    if index is None:
        raise SummaryNotVerified(f"the summary carries no signature by the Authority key {key_id}")
    if not verify_signature(envelope, public_key, index):
        raise SummaryNotVerified(
            f"the summary's signature does not verify against the Authority key {key_id}"
        )
    state = authority_service_pb2.GroupState()
    state.ParseFromString(envelope.payload)
    return VerifiedSummary(state, key_id, envelope)


def register_identity_envelope(
    admin_id: str, admin_key: SigningKey, identity: membership_pb2.Identity, request_id: str | None = None
) -> common_pb2.SignedEnvelope:
    cmd = membership_service_pb2.RegisterIdentityCommand(
        identity=identity,
        admin_id=admin_id,
        issued_at=to_timestamp(_clock.now()),
        request_id=request_id or ids.new_id("req"),
    )
    return sign_envelope(cmd.SerializeToString(), REGISTER_IDENTITY_TYPE, admin_key, f"{admin_id}#identity")


def open_session_envelope(
    identity_id: str, identity_key: SigningKey, session_public_key: bytes
) -> common_pb2.SignedEnvelope:
    cmd = membership_service_pb2.OpenSessionCommand(
        identity_id=identity_id,
        session_public_key=session_public_key,
        issued_at=to_timestamp(_clock.now()),
        nonce=os.urandom(16),
    )
    return sign_envelope(cmd.SerializeToString(), OPEN_SESSION_TYPE, identity_key, f"{identity_id}#identity")


def agent_card_envelope(signer: SessionSigner, card: agent_card_pb2.AgentCard) -> common_pb2.SignedEnvelope:
    """``card`` signed for PublishAgentCard by ``signer``'s session key (docs/agent-cards.md)."""
    return sign_envelope(
        card.SerializeToString(),
        AGENT_CARD_TYPE,
        signer.key,
        session_key_id(signer.identity_id, signer.session_epoch),
    )


def verify_agent_card(published: agent_card_pb2.PublishedAgentCard) -> agent_card_pb2.AgentCard:
    """The card of ``published`` once its envelope verifies: the payload type, one signature by
    ``<agent>#session-<epoch>`` with the session key served, and the payload being the card."""
    envelope = published.envelope
    agent = published.card.agent_id
    if envelope.payload_type != AGENT_CARD_TYPE or len(envelope.signatures) != 1:
        raise CardNotVerified(f"the card of {agent} is not one signature over an {AGENT_CARD_TYPE} payload")
    if envelope.signatures[0].key_id != session_key_id(agent, published.session_epoch):
        raise CardNotVerified(
            f"the card of {agent} is signed by {envelope.signatures[0].key_id}, not its session"
        )
    if not verify_signature(envelope, published.session_public_key):
        raise CardNotVerified(f"the card of {agent} does not verify with its session key")
    card = agent_card_pb2.AgentCard.FromString(envelope.payload)
    if card != published.card:
        raise CardNotVerified(f"the card served for {agent} is not the one signed")
    return card


@dataclass
class SessionSigner:
    """Signs commands as one identity's session (key id ``<identity>#session-<epoch>``)."""

    identity_id: str
    session_epoch: int
    key: SigningKey

    def command(
        self,
        group_id: str,
        kind: str,
        body: Message,
        *,
        membership_epoch: int = 0,
        command_id: str | None = None,
        correlation_id: str = "",
        expected_revision: common_pb2.ExpectedRevision | None = None,
    ) -> command_pb2.Command:
        cmd = command_pb2.Command(
            command_id=command_id or ids.new_id("cmd"),
            group_id=group_id,
            actor_id=self.identity_id,
            session_epoch=self.session_epoch,
            membership_epoch=membership_epoch,
            issued_at=to_timestamp(_clock.now()),
            correlation_id=correlation_id,
        )
        if expected_revision is not None:
            cmd.expected_revision.CopyFrom(expected_revision)
        getattr(cmd, kind).CopyFrom(body)
        return cmd

    def sign(self, command: command_pb2.Command) -> common_pb2.SignedEnvelope:
        return sign_envelope(
            command.SerializeToString(),
            COMMAND_TYPE,
            self.key,
            session_key_id(self.identity_id, self.session_epoch),
        )


def blob_digest(data: bytes) -> common_pb2.Digest:
    """The identity of a blob: BLAKE3 and size."""
    return common_pb2.Digest(algorithm="blake3", hex=blake3.blake3(data).hexdigest(), size_bytes=len(data))


def _packed(indices: list[int], cost: Callable[[int], int]) -> list[list[int]]:
    """``indices`` in order, cut into batches whose entries cost at most MAX_BATCH_BYTES together
    (and at most 10,000 entries, the BatchDownload limit)."""
    batches: list[list[int]] = []
    used = 0
    for i in indices:
        size = cost(i) + uploads.BATCH_ENTRY_OVERHEAD
        if not batches or used + size > uploads.MAX_BATCH_BYTES or len(batches[-1]) >= 10_000:
            batches.append([])
            used = 0
        batches[-1].append(i)
        used += size
    return batches


async def _refused_as_value(call: Awaitable[T]) -> T | Rejected:
    """The call's answer, or the Rejected a refusal carried (a transport failure still raises)."""
    try:
        return await call
    except grpc.RpcError as err:
        rejection = rejection_from_rpc_error(err)
        if rejection is None:
            raise
        return from_proto(rejection)


def decode_events(envelopes: Iterable[common_pb2.SignedEnvelope]) -> list[event_pb2.Event]:
    return codec.events_of(envelopes)


class MeshClient:
    """Every public service of a mesh, at its one address. Reads, listings and operator calls carry
    a call proof of ``reader`` (missionweave/v1/auth.proto): the session given here, else the first
    session ``open_session`` opens; ``read_as`` switches it. Signed commands need none."""

    def __init__(
        self, target: str, tls: ClientTLS | None = None, reader: SessionSigner | None = None
    ) -> None:
        self.proofs = CallProofs(target, reader)
        self.channel = open_channel(target, tls, interceptors=self.proofs.interceptors)
        self.authority = authority_service_pb2_grpc.AuthorityServiceStub(self.channel)
        self.membership = membership_service_pb2_grpc.MembershipServiceStub(self.channel)
        self.artifacts = artifact_service_pb2_grpc.ArtifactServiceStub(self.channel)

    async def __aenter__(self) -> MeshClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()

    async def register_identity(
        self,
        admin_id: str,
        admin_key: SigningKey,
        identity_id: str,
        kind: int,
        public_key: bytes,
        display_name: str = "",
    ) -> membership_pb2.Identity:
        identity = membership_pb2.Identity(
            identity_id=identity_id,
            kind=kind,  # type: ignore[arg-type]
            public_key=public_key,
            display_name=display_name or identity_id,
        )
        resp = await self.membership.RegisterIdentity(
            membership_service_pb2.RegisterIdentityRequest(
                command=register_identity_envelope(admin_id, admin_key, identity)
            )
        )
        return resp.identity

    async def open_session(
        self, identity_id: str, identity_key: SigningKey, session_key: SigningKey | None = None
    ) -> SessionSigner:
        session_key = session_key or identity_key
        resp = await self.membership.OpenSession(
            membership_service_pb2.OpenSessionRequest(
                command=open_session_envelope(identity_id, identity_key, bytes(session_key.verify_key))
            )
        )
        signer = SessionSigner(identity_id, resp.session.session_epoch, session_key)
        if self.proofs.signer is None or self.proofs.signer.identity_id == identity_id:
            self.proofs.signer = signer  # a newer session of the reader fences its older proofs
        return signer

    # ---------------------------------------------------------------- Agent Cards and Presence

    def _agent(self, what: str) -> SessionSigner:
        """The reader: cards and Presence are published by the agent itself, proven and signed as it."""
        signer = self.proofs.signer
        if not isinstance(signer, SessionSigner):
            raise ValueError(f"{what} needs the agent's session: open_session(...) or read_as(...) first")
        return signer

    async def publish_agent_card(
        self, card: agent_card_pb2.AgentCard
    ) -> membership_service_pb2.PublishAgentCardResponse:
        """Publish ``card`` (agent_id defaults to the reader) signed by the reader's session key; an
        identical republish answers the stored version (``replayed``). Refusals: docs/agent-cards.md."""
        signer = self._agent("publishing an Agent Card")
        if not card.agent_id:  # a copy: the caller's message is left as it was
            named = agent_card_pb2.AgentCard()
            named.CopyFrom(card)
            named.agent_id = signer.identity_id
            card = named
        return await self.membership.PublishAgentCard(
            membership_service_pb2.PublishAgentCardRequest(card=agent_card_envelope(signer, card))
        )

    async def agent_card(self, agent_id: str, version: str = "") -> agent_card_pb2.PublishedAgentCard:
        """That version of the agent's card (the card in force when ``version`` is empty), verified
        (CardNotVerified otherwise)."""
        resp = await self.membership.GetAgentCard(
            membership_service_pb2.GetAgentCardRequest(agent_id=agent_id, card_version=version)
        )
        verify_agent_card(resp.published)
        return resp.published

    async def agent_card_versions(
        self, agent_id: str, page_size: int = 0
    ) -> list[agent_card_pb2.AgentCardVersion]:
        """Every version of the agent's card, newest first (all pages)."""
        out: list[agent_card_pb2.AgentCardVersion] = []
        token = ""
        while True:
            resp = await self.membership.ListAgentCardVersions(
                membership_service_pb2.ListAgentCardVersionsRequest(
                    agent_id=agent_id, page_size=page_size, page_token=token
                )
            )
            out.extend(resp.versions)
            token = resp.next_page_token
            if not token:
                return out

    async def report_presence(
        self,
        availability: agent_card_pb2.PresenceAvailability.ValueType,
        *,
        free_slots: int,
        in_use_slots: int = 0,
        note: str = "",
        ttl_ms: int = 0,
    ) -> agent_card_pb2.AgentPresence:
        """Report the reader's Presence (capacity within its card's max_concurrency), valid ``ttl_ms``
        (0: 60 s)."""
        signer = self._agent("reporting Presence")
        report = agent_card_pb2.PresenceReport(
            agent_id=signer.identity_id,
            availability=availability,
            free_slots=free_slots,
            in_use_slots=in_use_slots,
            note=note,
            ttl_ms=ttl_ms,
        )
        resp = await self.membership.ReportPresence(
            membership_service_pb2.ReportPresenceRequest(report=report)
        )
        return resp.presence

    async def presence(self, *agent_ids: str) -> list[agent_card_pb2.AgentPresence]:
        """The last report of each agent that has reported, with ``fresh`` by the server's clock."""
        resp = await self.membership.GetPresence(
            membership_service_pb2.GetPresenceRequest(agent_ids=agent_ids)
        )
        return list(resp.presences)

    def read_as(self, signer: SessionSigner | None) -> None:
        """Prove reads and operator calls as ``signer`` from now on (None: as nobody)."""
        self.proofs.signer = signer

    async def execute(self, envelope: common_pb2.SignedEnvelope) -> command_pb2.CommandResult:
        resp = await self.authority.ExecuteCommand(
            authority_service_pb2.ExecuteCommandRequest(command=envelope)
        )
        return resp.result

    async def execute_batch(
        self, envelopes: list[common_pb2.SignedEnvelope]
    ) -> list[command_pb2.CommandResult | Rejected]:
        """Up to 512 commands in one call; each one's outcome in order (a batch is not a transaction)."""
        resp = await self.authority.ExecuteCommandBatch(
            authority_service_pb2.ExecuteCommandBatchRequest(
                commands=[
                    authority_service_pb2.ExecuteCommandStreamRequest(command=e, request_tag=i)
                    for i, e in enumerate(envelopes)
                ]
            )
        )
        return [a.result if a.HasField("result") else from_proto(a.rejection) for a in resp.results]

    async def read_events(
        self, group_id: str, after: int = 0, *, follow: bool = False
    ) -> AsyncIterator[event_pb2.Event]:
        call = self.authority.ReadEvents(
            authority_service_pb2.ReadEventsRequest(group_id=group_id, after_sequence=after, follow=follow)
        )
        async for batch in call:
            for event in decode_events(batch.events):
                yield event

    async def upload(
        self, data: bytes, manifest: common_pb2.SignedEnvelope | None = None, chunk_bytes: int = 1024 * 1024
    ) -> artifact_service_pb2.UploadResponse:
        """Upload ``data`` under its BLAKE3 digest (idempotent), optionally with its signed manifest;
        the bytes go only if the server asks for them (missionweave/kernel/uploads.py)."""
        header = artifact_service_pb2.UploadHeader(digest=blob_digest(data), manifest=manifest)
        return await uploads.upload(self.artifacts, header, uploads.slices(data, chunk_bytes))

    async def upload_many(
        self, blobs: Sequence[bytes], manifests: Sequence[common_pb2.SignedEnvelope | None] = ()
    ) -> list[artifact_service_pb2.UploadResponse | Rejected]:
        """Upload each of ``blobs`` (idempotent; ``manifests[i]``, when given, is blob i's signed
        manifest) in as few BatchUpload calls as its 3 MiB limit allows; a blob over 1 MiB goes by
        Upload. Each blob's outcome in order: its UploadResponse, or the Rejected it was refused
        with (a batch is not a transaction: the others are stored all the same)."""
        entries = [
            artifact_service_pb2.BatchUploadBlob(
                digest=blob_digest(data), data=data, manifest=manifests[i] if i < len(manifests) else None
            )
            for i, data in enumerate(blobs)
        ]
        out: list[artifact_service_pb2.UploadResponse | Rejected | None] = [None] * len(entries)
        small = []
        for i, entry in enumerate(entries):
            if len(entry.data) > CHUNK_BYTES:
                out[i] = await _refused_as_value(
                    self.upload(blobs[i], entry.manifest if entry.HasField("manifest") else None)
                )
            else:
                small.append(i)
        for batch in _packed(small, lambda i: len(blobs[i]) + entries[i].manifest.ByteSize()):
            response = await self.artifacts.BatchUpload(
                artifact_service_pb2.BatchUploadRequest(blobs=[entries[i] for i in batch])
            )
            for i, result in zip(batch, response.results, strict=True):
                out[i] = (
                    from_proto(result.rejection)
                    if result.HasField("rejection")
                    else artifact_service_pb2.UploadResponse(
                        digest=result.digest,
                        already_existed=result.already_existed,
                        manifest_digest=result.manifest_digest,
                    )
                )
        return [o for o in out if o is not None]

    async def download_many(self, digests: Sequence[common_pb2.Digest]) -> list[bytes | Rejected]:
        """The verified bytes of each of ``digests``, in as few BatchDownload calls as its limits
        allow (a blob over 1 MiB by Download); each blob's outcome in order: its bytes, or the
        Rejected it was refused with (NOT_FOUND for a blob absent or not readable by the caller).
        The bytes are re-hashed here: bytes that do not match are a CORRUPTED refusal."""
        out: list[bytes | Rejected | None] = [None] * len(digests)
        small = []
        for i, digest in enumerate(digests):
            if digest.size_bytes > CHUNK_BYTES:
                out[i] = await _refused_as_value(self.download(digest))
            else:
                small.append(i)
        for batch in _packed(small, lambda i: int(digests[i].size_bytes)):
            response = await self.artifacts.BatchDownload(
                artifact_service_pb2.BatchDownloadRequest(digests=[digests[i] for i in batch])
            )
            for i, result in zip(batch, response.results, strict=True):
                out[i] = from_proto(result.rejection) if result.HasField("rejection") else result.data
        for i, got in enumerate(out):
            if isinstance(got, bytes) and blob_digest(got) != digests[i]:
                out[i] = Rejected(
                    common_pb2.REJECTION_REASON_DATA_CORRUPTED,
                    f"the bytes received for blake3:{digests[i].hex} do not hash to it",
                    artifact_error="ARTIFACT_ERROR_CODE_CORRUPTED",
                )
        return [o for o in out if o is not None]

    async def download(self, digest: common_pb2.Digest, offset: int = 0, length: int = 0) -> bytes:
        """The verified bytes (the server holds back the last chunk until the hash matched)."""
        call = self.artifacts.Download(
            artifact_service_pb2.DownloadRequest(digest=digest, offset=offset, length=length)
        )
        return b"".join([piece.data async for piece in call])

    async def group_state(self, group_id: str) -> authority_service_pb2.GroupState:
        resp = await self.authority.GetGroupState(
            authority_service_pb2.GetGroupStateRequest(group_id=group_id)
        )
        return resp.state

    # The epochs every Group-scoped command cites, read from the Group state, so that a script
    # needs no helper of the CLI's (a command citing a stale one is refused, nothing written).

    async def membership_epoch(self, group_id: str, identity_id: str | None = None) -> int:
        """The active Membership epoch of ``identity_id`` (default: the reader) in the Group, 0
        when it holds none (MW-8-02)."""
        who = identity_id or (self.proofs.signer.identity_id if self.proofs.signer else "")
        return membership_epoch(await self.group_state(group_id), who)

    async def coordinator_epoch(self, group_id: str) -> int:
        """The current Coordinator lease's epoch (MW-7.2-03), 0 when the Group has no Mission."""
        return int((await self.group_state(group_id)).mission.coordinator.coordinator_epoch)

    async def execute_as(
        self, signer: SessionSigner, group_id: str, kind: str, body: Message, *, command_id: str | None = None
    ) -> command_pb2.CommandResult:
        """Signs ``body`` as ``signer`` with its current Membership epoch (0 for ``mission_create``,
        which makes the Group) and executes it; a refusal raises grpc.RpcError with the Rejection."""
        epoch = 0 if kind == "mission_create" else await self.membership_epoch(group_id, signer.identity_id)
        command = signer.command(group_id, kind, body, membership_epoch=epoch, command_id=command_id)
        return await self.execute(signer.sign(command))

    async def work_item(self, group_id: str, work_item_id: str) -> work_pb2.WorkItem:
        """One WorkItem's read model: its state, ownership epoch, current lease, submission..."""
        resp = await self.authority.GetWorkItem(
            authority_service_pb2.GetWorkItemRequest(group_id=group_id, work_item_id=work_item_id)
        )
        return resp.work_item

    async def work_items(self, group_id: str, state: int = 0, page_size: int = 0) -> list[work_pb2.WorkItem]:
        """Every WorkItem of the Group (only those in ``state`` when given), by id (all pages)."""
        out: list[work_pb2.WorkItem] = []
        token = ""
        while True:
            resp = await self.authority.ListWorkItems(
                authority_service_pb2.ListWorkItemsRequest(
                    group_id=group_id,
                    state=state,  # type: ignore[arg-type]
                    page_size=page_size,
                    page_token=token,
                )
            )
            out.extend(resp.work_items)
            token = resp.next_page_token
            if not token:
                return out

    async def missions(self, page_size: int = 0) -> list[authority_service_pb2.MissionSummary]:
        """Every Mission the reader may see (an operator: all; others: their Groups'), all pages."""
        out: list[authority_service_pb2.MissionSummary] = []
        token = ""
        while True:
            resp = await self.authority.ListMissions(
                authority_service_pb2.ListMissionsRequest(page_size=page_size, page_token=token)
            )
            out.extend(resp.missions)
            token = resp.next_page_token
            if not token:
                return out

    async def identities(self, page_size: int = 0) -> list[membership_pb2.Identity]:
        """Every registered identity, by id (all pages); operators only."""
        out: list[membership_pb2.Identity] = []
        token = ""
        while True:
            resp = await self.membership.ListIdentities(
                membership_service_pb2.ListIdentitiesRequest(page_size=page_size, page_token=token)
            )
            out.extend(resp.identities)
            token = resp.next_page_token
            if not token:
                return out

    async def identity(self, identity_id: str) -> membership_pb2.Identity:
        resp = await self.membership.GetIdentity(
            membership_service_pb2.GetIdentityRequest(identity_id=identity_id)
        )
        return resp.identity

    async def mission_tree(self, group_id: str) -> list[subtask_pb2.MissionTreeNode]:
        """The Mission tree (MW-14-19), root first in pre-order: all of it for an operator or the
        root MissionOwner, the subtree from ``group_id`` for its MissionOwner or Coordinator."""
        resp = await self.authority.GetMissionTree(subtask_pb2.GetMissionTreeRequest(group_id=group_id))
        return list(resp.nodes)

    async def mission_review(
        self, group_id: str, submission_event_id: str = ""
    ) -> authority_service_pb2.GetMissionReviewResponse:
        """What the MissionOwner approves: the submission (default: the latest) with its Artifacts,
        each WorkItem's Artifacts, Evidence per criterion and budget, blockers, the critical path.
        Manifests and bytes are not checked here: ``mwp mission review`` does that."""
        return await self.authority.GetMissionReview(
            authority_service_pb2.GetMissionReviewRequest(
                group_id=group_id, submission_event_id=submission_event_id
            )
        )

    async def authority_key(self) -> tuple[str, bytes]:
        """The Authority's signing key id and Ed25519 public key."""
        resp = await self.authority.GetAuthorityKey(authority_service_pb2.GetAuthorityKeyRequest())
        return resp.key_id, resp.public_key

    async def signed_group_summary(self, group_id: str) -> common_pb2.SignedEnvelope:
        """The Group's state at its durable head, in a DSSE envelope signed by the Authority (unverified)."""
        resp = await self.authority.GetSignedGroupSummary(
            authority_service_pb2.GetSignedGroupSummaryRequest(group_id=group_id)
        )
        return resp.summary

    async def verified_group_summary(self, group_id: str) -> VerifiedSummary:
        """The signed summary, verified against GetAuthorityKey; raises SummaryNotVerified otherwise."""
        envelope = await self.signed_group_summary(group_id)
        key_id, public_key = await self.authority_key()
        return verify_group_summary(envelope, key_id, public_key)
