"""Artifact authorization (issue 13 item 3; docs/artifacts-storage.md "Authorization and quota",
decision D72), over the public gRPC API.

Uploads by proven identities within a per-identity quota (refused on the header alone, nothing
kept); a full disk refuses and leaves nothing partial; reads (Download, Stat, FindMissing,
GetManifest, QueryProvenance) for operators, for the blob's holders, and for active members of a
Group whose manifest references it; anyone else gets the answer a missing blob gets. Knowing a hash
is not possession: a non-holder uploading an existing digest must stream bytes that hash to it."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import func, select

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.manifest import sign_manifest
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import session_key_id
from missionweave.sdk.client import MeshClient, SessionSigner, blob_digest
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2, membership_pb2
from missionweave_server.services.artifacts import local
from missionweave_server.services.artifacts.blobstore import storage_full
from missionweave_server.services.artifacts.schema import upload_reservations
from tests import builders
from tests.conftest import World, register
from tests.test_missions import G, as_member, create

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

R = common_pb2.RejectionReason
OTHER = "grp_elsewhere"
KiB = 1024
MiB = 1024 * KiB


# ------------------------------------------------------------------ the cast


class Cast:
    """One client per caller, each proving its own identity."""

    def __init__(self, w: World, signers: dict[str, SessionSigner | None]) -> None:
        self.signers = signers
        self.clients = {role: MeshClient(w.target, reader=s) for role, s in signers.items()}

    def __getitem__(self, role: str) -> MeshClient:
        return self.clients[role]

    async def close(self) -> None:
        for client in self.clients.values():
            await client.channel.close()


@pytest.fixture
async def cast(world: World) -> AsyncIterator[Cast]:
    """Group G: alice (owner), coord-bot (Coordinator), worker-bot (Worker); Group OTHER: its
    Coordinator elsewhere-bot; outsider-bot is in no Group; admin is the Organization administrator."""
    w = world
    await create(w)
    await as_member(w, G, w.worker)
    outsider = await register(w.client, w.keys["admin"], "outsider-bot", common_pb2.IDENTITY_KIND_AGENT)
    other = await register(w.client, w.keys["admin"], "elsewhere-bot", common_pb2.IDENTITY_KIND_AGENT)
    await w.run(
        w.owner, OTHER, "mission_create", builders.mission_create("alice", "elsewhere-bot", w.clock.now())
    )
    c = Cast(
        w,
        {
            "anonymous": None,
            "worker": w.worker,
            "coordinator": w.coordinator,
            "outsider": outsider,
            "other_group": other,
            "admin": w.admin,
        },
    )
    try:
        yield c
    finally:
        await c.close()


def manifest_in(
    w: World, signer: SessionSigner, data: bytes, group: str = G, sources: tuple[common_pb2.Digest, ...] = ()
) -> common_pb2.SignedEnvelope:
    """A manifest ``signer`` signs for ``data``, naming ``group`` (what makes it readable there)."""
    manifest = apb.ArtifactManifest(
        content_digest=blob_digest(data),
        media_type="text/csv",
        producer_agent_id=signer.identity_id,
        agent_card_version="1.0.0",
        mission_id="mis_lifecycle",
        group_id=group,
        work_item_id="wi-1",
        source_artifacts=list(sources),
        created_at=to_timestamp(w.clock.now()),
        classification=apb.DATA_CLASSIFICATION_INTERNAL,
        size_bytes=len(data),
        retrieval_uri="mwp://mesh/anything",
        schema=apb.ArtifactSchema(schema_id="none"),
        components=[apb.ComponentVersion(kind=apb.COMPONENT_KIND_TOOL, name="pandas", version="2.2.3")],
    )
    sha = hashlib.sha256(data).hexdigest()
    return sign_manifest(manifest, sha, signer.key, session_key_id(signer.identity_id, signer.session_epoch))


async def refusal(call: Awaitable[object]) -> tuple[str, str, str]:
    """(status code, Rejection reason, artifact_error) of a refused call."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None, info.value
    return info.value.code().name, R.Name(rejection.reason), rejection.metadata.get("artifact_error", "")


async def refused_with(call: Awaitable[object]) -> common_pb2.Rejection:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None, info.value
    return rejection


async def missing(client: MeshClient, *digests: common_pb2.Digest) -> list[str]:
    found = await client.artifacts.FindMissing(apb.FindMissingRequest(digests=list(digests)))
    return [d.hex for d in found.missing_digests]


def stat(client: MeshClient, digest: common_pb2.Digest) -> Awaitable[apb.StatResponse]:
    return client.artifacts.Stat(apb.StatRequest(digest=digest))  # type: ignore[no-any-return]


async def upload_raw(
    client: MeshClient,
    digest: common_pb2.Digest,
    data: bytes | None,
    manifest: common_pb2.SignedEnvelope | None = None,
) -> apb.UploadResponse:
    """An upload of ``digest`` sending ``data`` (None: the header alone, then half-close)."""

    async def requests() -> AsyncIterator[apb.UploadRequest]:
        yield apb.UploadRequest(header=apb.UploadHeader(digest=digest, manifest=manifest))
        for offset in range(0, len(data or b""), MiB):
            yield apb.UploadRequest(
                chunk=apb.UploadChunk(offset=offset, data=(data or b"")[offset : offset + MiB])
            )

    return await client.artifacts.Upload(requests())  # type: ignore[no-any-return]


def stored_files(w: World) -> list[Path]:
    """Every file under the local backend's blobs/ directory (committed blobs and temporaries)."""
    root = Path(w.mesh.blobstore.root)  # type: ignore[attr-defined]
    return sorted(p for p in root.rglob("*") if p.is_file())


def as_missing(rejection: common_pb2.Rejection, digest: common_pb2.Digest) -> tuple[int, str, str]:
    """A NOT_FOUND answer with the digest taken out, to compare with another digest's."""
    return (
        rejection.reason,
        rejection.metadata.get("artifact_error", ""),
        rejection.message.replace(digest.hex, "<hex>"),
    )


# ------------------------------------------------------------------ tests


async def test_anonymous_callers_are_refused_by_every_artifact_rpc(world: World, cast: Cast) -> None:
    """No call proof, no artifact: Download included (the server registers its own pre-serialising
    handler for it, which must apply the same rule)."""
    data = b"anonymous must not read this"
    await cast["worker"].upload(data)
    digest = blob_digest(data)
    anon = cast["anonymous"]
    calls: list[Awaitable[object]] = [
        anon.upload(b"anonymous bytes"),
        anon.download(digest),
        stat(anon, digest),
        anon.artifacts.FindMissing(apb.FindMissingRequest(digests=[digest])),
        anon.artifacts.GetManifest(apb.GetManifestRequest(digest=digest)),
        anon.artifacts.QueryProvenance(apb.QueryProvenanceRequest(digest=digest)),
    ]
    for call in calls:
        code, reason, _ = await refusal(call)
        assert (code, reason) == ("UNAUTHENTICATED", "REJECTION_REASON_UNAUTHENTICATED")
    assert blob_digest(b"anonymous bytes").hex in await missing(
        cast["admin"], blob_digest(b"anonymous bytes")
    )


@pytest.mark.req("MW-13.1-01", "MW-13.1-05", "MW-13.3-05")
async def test_a_blob_is_read_by_its_holder_and_by_members_of_a_group_that_references_it(
    world: World, cast: Cast
) -> None:
    """The uploader reads its blob; another identity gets exactly the answer a missing blob gets
    until a manifest for a Group it is an active member of references the blob; members of other
    Groups never; an operator always; a Membership that ends ends the access."""
    w = world
    data = os.urandom(300 * KiB)
    digest = blob_digest(data)
    never = blob_digest(os.urandom(300 * KiB))  # same size, never stored
    assert not (await cast["worker"].upload(data)).already_existed
    assert await cast["worker"].download(digest) == data
    assert (await stat(cast["worker"], digest)).digest == digest

    async def cannot_read(role: str) -> None:
        client = cast[role]
        for d in (digest, never):
            assert await refusal(client.download(d)) == (
                "NOT_FOUND",
                "REJECTION_REASON_NOT_FOUND",
                "ARTIFACT_ERROR_CODE_NOT_FOUND",
            )
        # Indistinguishable from a blob that is not stored: same reason, code and message.
        assert as_missing(await refused_with(client.download(digest)), digest) == as_missing(
            await refused_with(client.download(never)), never
        )
        assert as_missing(await refused_with(stat(client, digest)), digest) == as_missing(
            await refused_with(stat(client, never)), never
        )
        assert await missing(client, digest, never) == [digest.hex, never.hex]
        assert not (await client.artifacts.GetManifest(apb.GetManifestRequest(digest=digest))).manifests

    for role in ("coordinator", "outsider", "other_group"):
        await cannot_read(role)
    assert await cast["admin"].download(digest) == data  # an operator reads all

    # The worker (a holder) references it from Group G: G's members now read it, nobody else.
    again = await cast["worker"].upload(data, manifest_in(w, w.worker, data))
    assert again.already_existed and again.manifest_digest.hex
    assert await cast["coordinator"].download(digest) == data
    assert (await stat(cast["coordinator"], digest)).manifest_count == 1
    assert await missing(cast["coordinator"], digest, never) == [never.hex]
    for role in ("outsider", "other_group"):
        await cannot_read(role)

    # Access through the Group lasts as long as the Membership.
    await as_member(w, G, cast.signers["outsider"])  # type: ignore[arg-type]
    assert await cast["outsider"].download(digest) == data
    revoke = membership_pb2.MembershipRevoke(member_id="outsider-bot", reason="done")
    await w.run(w.owner, G, "membership_revoke", revoke, membership_epoch=1)
    await cannot_read("outsider")
    assert await cast["worker"].download(digest) == data  # its holder keeps it


async def test_knowing_a_hash_grants_nothing_an_upload_must_prove_possession(
    world: World, cast: Cast
) -> None:
    """A non-holder uploading an existing digest without its bytes, or with other bytes, is refused
    exactly as for a digest nobody stored, and gains no access; with the right bytes it becomes a
    holder and the blob is still stored once."""
    w = world
    data = os.urandom(200 * KiB)
    digest = blob_digest(data)
    never = blob_digest(os.urandom(200 * KiB))
    await cast["worker"].upload(data)
    files = stored_files(w)
    outsider = cast["outsider"]
    for d in (digest, never):  # the header alone: the same refusal whether or not it is stored
        assert await refusal(upload_raw(outsider, d, None)) == (
            "INVALID_ARGUMENT",
            "REJECTION_REASON_INVALID_ARGUMENT",
            "ARTIFACT_ERROR_CODE_INCOMPLETE_UPLOAD",
        )
    wrong = os.urandom(len(data))
    for d in (digest, never):
        assert await refusal(upload_raw(outsider, d, wrong)) == (
            "INVALID_ARGUMENT",
            "REJECTION_REASON_DIGEST_MISMATCH",
            "ARTIFACT_ERROR_CODE_DIGEST_MISMATCH",
        )
    # A manifest riding on a refused upload is not recorded either (it would open the blob to a Group).
    with_manifest = manifest_in(w, cast.signers["outsider"], data, group=OTHER)  # type: ignore[arg-type]
    await refusal(upload_raw(outsider, digest, None, with_manifest))
    assert await refusal(outsider.download(digest)) == (
        "NOT_FOUND",
        "REJECTION_REASON_NOT_FOUND",
        "ARTIFACT_ERROR_CODE_NOT_FOUND",
    )
    assert await missing(cast["other_group"], digest) == [digest.hex]
    assert stored_files(w) == files  # nothing new, no temporary left

    proved = await outsider.upload(data)
    assert not proved.already_existed  # answered as for a first upload: no sign of the other holder
    assert await outsider.download(digest) == data
    assert stored_files(w) == files  # verified, not stored twice


async def test_over_quota_is_refused_on_the_header_with_nothing_stored(world: World, cast: Cast) -> None:
    """An identity holds at most MWP_ARTIFACT_QUOTA_BYTES: an upload that would pass it is refused
    QUOTA_EXCEEDED before any byte is received (a client that never sends them is answered), with
    the quota and usage, and nothing is stored; blobs it already holds and operators are not held back."""
    w = world
    servicer: Any = w.mesh.artifacts  # type: ignore[attr-defined]
    servicer.quota_bytes = MiB
    first = os.urandom(600 * KiB)
    second = os.urandom(600 * KiB)
    await cast["worker"].upload(first)
    files = stored_files(w)

    answered = asyncio.Event()

    async def header_then_wait() -> AsyncIterator[apb.UploadRequest]:
        yield apb.UploadRequest(header=apb.UploadHeader(digest=blob_digest(second)))
        await answered.wait()  # sends no byte until answered: only a refusal on the header ends this

    call = cast["worker"].artifacts.Upload(header_then_wait())
    try:
        rejection = await asyncio.wait_for(refused_with(call), 20)
    finally:
        answered.set()
    assert R.Name(rejection.reason) == "REJECTION_REASON_QUOTA_EXCEEDED"
    assert rejection.metadata["artifact_error"] == "ARTIFACT_ERROR_CODE_QUOTA_EXCEEDED"
    assert rejection.metadata["quota_bytes"] == str(MiB) and rejection.metadata["used_bytes"] == str(
        len(first)
    )
    code, reason, _ = await refusal(cast["worker"].upload(second))
    assert (code, reason) == ("RESOURCE_EXHAUSTED", "REJECTION_REASON_QUOTA_EXCEEDED")
    assert await missing(cast["admin"], blob_digest(second)) == [blob_digest(second).hex]
    assert stored_files(w) == files

    assert (await cast["worker"].upload(first)).already_existed  # held already: no new bytes
    assert not (await cast["outsider"].upload(first)).already_existed  # counts against its own quota
    big = os.urandom(2 * MiB)
    await cast["admin"].upload(big)  # operators have no quota
    assert await refusal(cast["outsider"].upload(big)) == (
        "RESOURCE_EXHAUSTED",
        "REJECTION_REASON_QUOTA_EXCEEDED",
        "ARTIFACT_ERROR_CODE_QUOTA_EXCEEDED",
    )
    # Every reservation ended with its upload: refused, held already, or become a holding.
    async with servicer.index.engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(upload_reservations)) == 0


@pytest.mark.parametrize("where", ["write", "commit"])
async def test_a_full_disk_refuses_the_upload_and_leaves_nothing_partial(
    world: World, cast: Cast, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """ENOSPC while writing a chunk, or at the final fsync: QUOTA_EXCEEDED (artifact error
    STORAGE_FULL), the temporary file removed, nothing visible; the same upload succeeds once there
    is room."""
    w = world
    data = os.urandom(3 * MiB + 5)
    digest = blob_digest(data)
    calls = {"n": 0}
    real_write, real_sync = local._Temp.write, local._Temp.sync

    def full_write(self: Any, bufs: list[bytes]) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the first chunk reached the disk, the second finds it full
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, bufs)

    def full_sync(self: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "write":
        monkeypatch.setattr(local._Temp, "write", full_write)
    else:
        monkeypatch.setattr(local._Temp, "sync", full_sync)
    rejection = await refused_with(cast["worker"].upload(data))
    assert R.Name(rejection.reason) == "REJECTION_REASON_QUOTA_EXCEEDED"
    assert rejection.metadata["artifact_error"] == "ARTIFACT_ERROR_CODE_STORAGE_FULL"
    assert rejection.metadata["backend"] == "local"
    await asyncio.sleep(0.2)  # a temp still being closed by its pool thread would show here
    assert stored_files(w) == []  # no temporary, no blob
    assert await missing(cast["admin"], digest) == [digest.hex]
    assert calls["n"] == (2 if where == "write" else 0)

    monkeypatch.setattr(local._Temp, "write", real_write)
    monkeypatch.setattr(local._Temp, "sync", real_sync)
    assert not (await cast["worker"].upload(data)).already_existed
    assert await cast["worker"].download(digest) == data


def test_what_counts_as_a_full_store() -> None:
    """The local disk's ENOSPC/EDQUOT and S3-compatible servers' out-of-space answers, also when
    wrapped (a writer broken by an earlier failed write raises from it); nothing else."""

    class ClientError(Exception):  # botocore's shape: .response["Error"]["Code"]
        def __init__(self, code: str, status: int = 400) -> None:
            super().__init__(code)
            self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}

    assert storage_full(OSError(errno.ENOSPC, "full")) and storage_full(OSError(errno.EDQUOT, "quota"))
    assert storage_full(ClientError("XMinioStorageFull")) and storage_full(ClientError("Other", 507))
    try:
        try:
            raise OSError(errno.ENOSPC, "full")
        except OSError as inner:
            raise RuntimeError("an earlier write failed; abort this upload") from inner
    except RuntimeError as wrapped:
        assert storage_full(wrapped)
    assert not storage_full(OSError(errno.EIO, "io")) and not storage_full(ClientError("AccessDenied", 403))
    assert not storage_full(ValueError("x"))


async def test_find_missing_reports_what_the_caller_may_not_read_as_missing(world: World, cast: Cast) -> None:
    data = os.urandom(100 * KiB)
    digest, never = blob_digest(data), blob_digest(b"never stored")
    await cast["worker"].upload(data)
    assert await missing(cast["worker"], digest, never) == [never.hex]
    assert await missing(cast["admin"], digest, never) == [never.hex]
    for role in ("outsider", "coordinator", "other_group"):
        assert await missing(cast[role], digest, never) == [digest.hex, never.hex], role


@pytest.mark.req("MW-13.1-04", "MW-13.3-05")
async def test_manifests_and_provenance_show_only_what_the_caller_may_read(world: World, cast: Cast) -> None:
    """A private source (no manifest) of an artifact shared in G stays out of G members' provenance
    graph; each Group's members see their own Group's manifests only; an outsider sees no graph."""
    w = world
    raw, derived = b"id,amount\n1,10\n", b"total\n10\n"
    await cast["worker"].upload(raw)  # private to its holder
    in_g = manifest_in(w, w.worker, derived, G, sources=(blob_digest(raw),))
    in_other = manifest_in(w, w.worker, derived, OTHER, sources=(blob_digest(raw),))
    await cast["worker"].upload(derived, in_g)
    await cast["worker"].upload(derived, in_other)

    def ancestors(client: MeshClient) -> Awaitable[apb.QueryProvenanceResponse]:
        return client.artifacts.QueryProvenance(  # type: ignore[no-any-return]
            apb.QueryProvenanceRequest(
                digest=blob_digest(derived), direction=apb.PROVENANCE_DIRECTION_ANCESTORS
            )
        )

    def descendants(client: MeshClient) -> Awaitable[apb.QueryProvenanceResponse]:
        return client.artifacts.QueryProvenance(  # type: ignore[no-any-return]
            apb.QueryProvenanceRequest(
                digest=blob_digest(raw), direction=apb.PROVENANCE_DIRECTION_DESCENDANTS
            )
        )

    async def manifests(client: MeshClient) -> list[common_pb2.SignedEnvelope]:
        return list(
            (
                await client.artifacts.GetManifest(apb.GetManifestRequest(digest=blob_digest(derived)))
            ).manifests
        )

    for role in ("worker", "admin"):  # the holder and an operator see the whole graph
        graph = await ancestors(cast[role])
        assert [n.digest.hex for n in graph.nodes] == [blob_digest(derived).hex, blob_digest(raw).hex]
        assert len(graph.edges) == 2
        assert [n.digest.hex for n in (await descendants(cast[role])).nodes][1:] == [blob_digest(derived).hex]
        assert len(await manifests(cast[role])) == 2
    # G's Coordinator reads the derived artifact and G's manifest, not the private source or OTHER's.
    coordinator = await ancestors(cast["coordinator"])
    assert [n.digest.hex for n in coordinator.nodes] == [blob_digest(derived).hex] and not coordinator.edges
    assert await manifests(cast["coordinator"]) == [in_g]
    assert (await stat(cast["coordinator"], blob_digest(derived))).manifest_count == 1
    assert await manifests(cast["other_group"]) == [in_other]
    # Nothing at all for the outsider, not even from the source it cannot read.
    for query in (ancestors, descendants):
        graph = await query(cast["outsider"])
        assert not graph.nodes and not graph.edges
    assert await manifests(cast["outsider"]) == []
    # The optional Group filter follows only that Group's manifests.
    only_g = await cast["worker"].artifacts.QueryProvenance(
        apb.QueryProvenanceRequest(
            digest=blob_digest(derived), direction=apb.PROVENANCE_DIRECTION_ANCESTORS, group_id=G
        )
    )
    assert (
        len(only_g.edges) == 1
        and only_g.edges[0].manifest_digest.hex
        == (await cast["worker"].upload(derived, in_g)).manifest_digest.hex
    )
