"""A slot's Artifacts: the inputs a WorkItem reads and the outputs it hands in (spec 13.1, D161).

A handler reads its inputs through its slot (the contract's input Artifacts and the Artifacts of the
WorkItems it depends on), each verified against its BLAKE3 digest on read (MW-13.1-05), and stores
its outputs through its slot: bytes, a file or a stream of any size. Each output is uploaded with a
manifest signed under the slot's lease naming the Mission, Group, WorkItem, producer, Agent Card
version and, unless the handler names others, every input as a source, so a DAG's provenance graph
is complete without the handler saying so (MW-13.1-04). The runtime puts the outputs in the
submission.

Idempotent: an output is named by its content, so storing it again after a retry or a crash
uploads nothing new. Offline (MW-11.5-04): an output made while the store is unreachable is signed
at once, kept in a private spool file and uploaded before the submission, which the runtime sends
only after reconnecting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from missionweave.kernel import uploads
from missionweave.sdk.artifacts import (
    NO_AGENT_CARD,
    Content,
    Described,
    Origin,
    file_chunks,
    hash_chunks,
    signed_manifest,
    spool,
)
from missionweave.sdk.client import SessionSigner, blob_digest
from missionweave.sdk.credentials import CALL_PROOF_METADATA, call_proof
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import (
    artifact_service_pb2_grpc,
    authority_service_pb2,
    authority_service_pb2_grpc,
    common_pb2,
    membership_service_pb2,
    membership_service_pb2_grpc,
    work_pb2,
)

log = logging.getLogger(__name__)

# Store errors after which an output is kept for later: the store is unreachable, not refusing.
_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
UPLOAD_TIMEOUT_S = 300.0
CALL_TIMEOUT_S = 10.0
UPLOAD_METHOD = "/missionweave.v1.ArtifactService/Upload"


class InputNotVerified(Exception):
    """The bytes received for an input do not hash to its digest."""


@dataclass(frozen=True)
class SlotInput:
    """One input of a WorkItem: a contract input, or an Artifact of a WorkItem it depends on."""

    name: str  # the contract input's name, or the upstream WorkItem's id
    ref: common_pb2.ArtifactRef
    from_work_item_id: str = ""


class SlotArtifacts:
    """The Artifacts of one slot's work under one lease; it holds nothing of any other slot."""

    def __init__(
        self,
        artifacts_stub: Any,
        signer: Callable[[], SessionSigner],
        origin: Origin,
        inputs: Sequence[SlotInput],
        spool_dir: Path,
        audience: str,
        resolve: Callable[[], Awaitable[tuple[Origin, list[SlotInput]]]] | None = None,
    ) -> None:
        self._stub = artifacts_stub
        self._audience = audience
        # Set when the slot opened while the mesh was unreachable: the origin and inputs are looked
        # up on first use instead.
        self._resolve = resolve
        self._signer = signer
        self._origin = origin
        self._inputs = tuple(inputs)
        self._spool_dir = spool_dir
        self._outputs: dict[str, common_pb2.ArtifactRef] = {}
        self._pending: dict[str, tuple[Path, apb.UploadHeader]] = {}  # outputs not uploaded yet

    async def _resolved(self) -> None:
        if self._resolve is not None:
            self._origin, inputs = await self._resolve()
            self._inputs = tuple(inputs)
            self._resolve = None

    @property
    def inputs(self) -> tuple[SlotInput, ...]:
        """The inputs (empty while the slot opened offline has not looked them up: ``read`` or
        ``put`` does, once the mesh answers)."""
        return self._inputs

    @property
    def outputs(self) -> list[common_pb2.ArtifactRef]:
        """The deliverables stored so far, in the order stored, each once."""
        return list(self._outputs.values())

    async def read(self, what: SlotInput | common_pb2.ArtifactRef) -> bytes:
        """The bytes of an input (or any Artifact the caller may read), verified against its digest."""
        await self._resolved()
        ref = what.ref if isinstance(what, SlotInput) else what
        call = self._stub.Download(apb.DownloadRequest(digest=ref.digest), timeout=UPLOAD_TIMEOUT_S)
        data = b"".join([piece.data async for piece in call])
        if blob_digest(data) != ref.digest:
            raise InputNotVerified(f"the bytes received for blake3:{ref.digest.hex} do not hash to it")
        return data

    async def put(
        self,
        content: Content,
        *,
        media_type: str = "application/octet-stream",
        deliverable: bool = True,
        sources: Iterable[common_pb2.ArtifactRef] | None = None,
        schema_id: str = "none",
    ) -> common_pb2.ArtifactRef:
        """Stores ``content`` as an Artifact of this WorkItem and returns its reference. A
        deliverable goes into the submission; ``deliverable=False`` for Evidence (a test log, a
        report of a check). ``sources``: what it was derived from (default: every input)."""
        await self._resolved()
        derived = [i.ref for i in self._inputs] if sources is None else list(sources)
        origin = replace(
            self._origin,
            sources=list({r.digest.hex: r.digest for r in derived}.values()),
            schema_id=schema_id,
        )
        spool: Path | None = await self._spool(content)
        assert spool is not None
        try:
            # Off the event loop: a large output must not hold up lease renewals of other slots.
            hashes = await asyncio.to_thread(hash_chunks, file_chunks(spool))
            signer = self._signer()
            header = apb.UploadHeader(
                digest=hashes.digest,
                manifest=signed_manifest(Described(hashes, media_type, signer.identity_id, origin), signer),
            )
            ref = common_pb2.ArtifactRef(digest=hashes.digest, media_type=media_type)
            try:
                await self._upload(header, spool)
            except grpc.aio.AioRpcError as err:
                if err.code() not in _UNREACHABLE:
                    raise
                log.info(
                    "blake3:%s kept for upload: the artifact store is unreachable (%s)",
                    hashes.blake3_hex,
                    err.code().name,
                )
                self._pending[hashes.blake3_hex] = (spool, header)
                spool = None  # kept until flush
        finally:
            if spool is not None:
                spool.unlink(missing_ok=True)
        if deliverable:
            self._outputs.setdefault(ref.digest.hex, ref)
        return ref

    async def flush(self) -> None:
        """Uploads the outputs made while the store was unreachable (before the submission)."""
        for hex_, (kept, header) in list(self._pending.items()):
            await self._upload(header, kept)
            kept.unlink(missing_ok=True)
            del self._pending[hex_]

    async def _upload(self, header: apb.UploadHeader, spool: Path) -> None:
        # The agent's channel proves unary and server-streaming calls itself; an upload streams
        # requests, so its proof travels as metadata of the call.
        proof = ((CALL_PROOF_METADATA, call_proof(self._signer(), UPLOAD_METHOD, self._audience)),)
        await uploads.upload(self._stub, header, file_chunks(spool), timeout=UPLOAD_TIMEOUT_S, metadata=proof)

    async def _spool(self, content: Content) -> Path:
        self._spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return await spool(content, self._spool_dir)


class SlotArtifactDesk:
    """What a Worker runtime needs to give each slot its Artifacts: the Group's Mission, the agent's
    Agent Card version and each WorkItem's inputs, read through the public contracts as the agent."""

    def __init__(
        self, channel: grpc.aio.Channel, signer: Callable[[], SessionSigner], spool_dir: Path, audience: str
    ) -> None:
        self._audience = audience
        self._artifacts = artifact_service_pb2_grpc.ArtifactServiceStub(channel)
        self._authority = authority_service_pb2_grpc.AuthorityServiceStub(channel)
        self._membership = membership_service_pb2_grpc.MembershipServiceStub(channel)
        self._signer = signer
        self._spool_dir = spool_dir
        self._missions: dict[str, str] = {}
        self._card_version = ""

    async def open(
        self,
        group_id: str,
        work_item_id: str,
        lease_id: str,
        ownership_epoch: int,
        contract: work_pb2.WorkContract,
    ) -> SlotArtifacts:
        """The slot's Artifacts; looked up now, or on first use when the mesh does not answer now
        (reversible work goes on offline, MW-11.5-04)."""

        async def resolve() -> tuple[Origin, list[SlotInput]]:
            return await self._origin(group_id, work_item_id, lease_id, ownership_epoch), await self._inputs(
                group_id, contract
            )

        try:
            origin, inputs = await resolve()
        except grpc.aio.AioRpcError as err:
            if err.code() not in _UNREACHABLE:
                raise
            log.info(
                "%s/%s: the slot's inputs are looked up later: %s", group_id, work_item_id, err.code().name
            )
            placeholder = Origin(
                group_id, self._missions.get(group_id, ""), work_item_id, lease_id, ownership_epoch
            )
            return SlotArtifacts(
                self._artifacts,
                self._signer,
                placeholder,
                [],
                self._spool_dir,
                self._audience,
                resolve=resolve,
            )
        return SlotArtifacts(self._artifacts, self._signer, origin, inputs, self._spool_dir, self._audience)

    async def _origin(self, group_id: str, work_item_id: str, lease_id: str, ownership_epoch: int) -> Origin:
        return Origin(
            group_id=group_id,
            mission_id=await self._mission_of(group_id),
            work_item_id=work_item_id,
            lease_id=lease_id,
            ownership_epoch=ownership_epoch,
            agent_card_version=await self._card(),
        )

    async def _mission_of(self, group_id: str) -> str:
        if group_id not in self._missions:
            response = await self._authority.GetGroupState(
                authority_service_pb2.GetGroupStateRequest(group_id=group_id), timeout=CALL_TIMEOUT_S
            )
            self._missions[group_id] = response.state.mission.mission_id
        return self._missions[group_id]

    async def _card(self) -> str:
        if not self._card_version:
            agent_id = self._signer().identity_id
            try:
                response = await self._membership.GetAgentCard(
                    membership_service_pb2.GetAgentCardRequest(agent_id=agent_id), timeout=CALL_TIMEOUT_S
                )
                self._card_version = response.published.card.card_version or NO_AGENT_CARD
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                self._card_version = NO_AGENT_CARD
        return self._card_version

    async def _inputs(self, group_id: str, contract: work_pb2.WorkContract) -> list[SlotInput]:
        """The contract's inputs (by content, or by the WorkItem that produces them), then the
        Artifacts of every other WorkItem it depends on. An upstream WorkItem the agent may not
        read (it joined the Group after that WorkItem was created, D124) contributes nothing."""
        inputs: list[SlotInput] = []
        upstream: dict[str, str] = {}  # WorkItem id -> the name its Artifacts go by
        for given in contract.inputs:
            if given.HasField("artifact"):
                inputs.append(SlotInput(given.name, given.artifact))
            elif given.from_work_item_id:
                upstream.setdefault(given.from_work_item_id, given.name)
        for dependency in contract.depends_on_work_item_ids:
            upstream.setdefault(dependency, dependency)
        for work_item_id, name in upstream.items():
            try:
                response = await self._authority.GetWorkItem(
                    authority_service_pb2.GetWorkItemRequest(group_id=group_id, work_item_id=work_item_id),
                    timeout=CALL_TIMEOUT_S,
                )
            except grpc.aio.AioRpcError as err:
                log.warning(
                    "%s/%s: its Artifacts are not readable here: %s", group_id, work_item_id, err.details()
                )
                continue
            inputs.extend(SlotInput(name, ref, work_item_id) for ref in response.work_item.artifacts)
        return inputs
