"""Nobody reads, lists or operates without proving who they are, and each reads only what its
Memberships allow (issue 13 items 1, 2 and 8; docs/security.md; decisions D64-D66).

The authorization matrix is data: every RPC that needs a proven caller, against every kind of
caller, with the exact outcome, run over the public gRPC API in both topologies. The leak test
plants markers where a Worker may not look and scans what every read path gives it."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from artifactstore.publications import PublicationServicer
from artifactstore.service import ArtifactServicer
from gateway.service import GatewayServicer
from missionweave.clock import SystemClock, to_timestamp
from missionweave.internal.v1 import (
    group_log_pb2,
    group_log_pb2_grpc,
    identities_pb2,
    identities_pb2_grpc,
    publications_pb2,
    publications_pb2_grpc,
)
from missionweave.rpc.callers import CALL_PROOF_METADATA, CALL_PROOF_TYPE, MESH_TOKEN_METADATA, access_of
from missionweave.rpc.channels import open_channel
from missionweave.rpc.status import rejection_from_rpc_error
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.sdk.credentials import call_proof
from missionweave.signing import session_key_id, sign_envelope
from missionweave.v1 import (
    artifact_service_pb2,
    auth_pb2,
    authority_service_pb2,
    common_pb2,
    conversation_pb2,
    membership_service_pb2,
    scheduling_service_pb2,
)
from services.authority.group_log import GroupLogServicer
from services.authority.servicer import AuthorityServicer
from services.membership.directory import IdentityDirectoryServicer
from services.membership.servicer import MembershipServicer
from services.scheduling.servicer import SchedulingServicer
from tests import builders
from tests.conftest import World, register
from tests.test_missions import G, as_member, create

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

R = common_pb2.RejectionReason
CK = conversation_pb2.ConversationKind
OTHER = "grp_elsewhere"
SECRET = "conv_secret"

SERVICERS = [
    (authority_service_pb2, "AuthorityService", AuthorityServicer),
    (group_log_pb2, "GroupLogService", GroupLogServicer),
    (membership_service_pb2, "MembershipService", MembershipServicer),
    (identities_pb2, "IdentityDirectoryService", IdentityDirectoryServicer),
    (artifact_service_pb2, "ArtifactService", ArtifactServicer),
    (publications_pb2, "PublicationService", PublicationServicer),
    (scheduling_service_pb2, "SchedulingService", SchedulingServicer),
]


def test_every_rpc_of_every_service_states_who_may_call_it() -> None:
    """A new RPC cannot be left open by omission: each one declares its Access rule."""
    from missionweave.v1 import gateway_service_pb2

    for module, name, servicer in [*SERVICERS, (gateway_service_pb2, "GatewayService", GatewayServicer)]:
        for method in module.DESCRIPTOR.services_by_name[name].methods:
            assert access_of(getattr(servicer, method.name)) is not None, f"{name}.{method.name} states no rule"


# ------------------------------------------------------------------ the cast


async def cast(w: World) -> dict[str, MeshClient]:
    """One client per kind of caller, each proving its own identity (anonymous proves nothing)."""
    await create(w)
    await as_member(w, G, w.worker)
    outsider = await register(w.client, w.keys["admin"], "outsider-bot", common_pb2.IDENTITY_KIND_AGENT)
    other = await register(w.client, w.keys["admin"], "elsewhere-bot", common_pb2.IDENTITY_KIND_AGENT)
    await w.run(w.owner, OTHER, "mission_create", builders.mission_create("alice", "elsewhere-bot", w.clock.now()))
    signers: dict[str, SessionSigner | None] = {
        "anonymous": None,
        "non_member": outsider,
        "other_group_member": other,
        "worker": w.worker,
        "coordinator": w.coordinator,
        "owner": w.owner,
        "admin": w.admin,
    }
    return {role: MeshClient(w.target, reader=signer) for role, signer in signers.items()}


ROLES = ["anonymous", "non_member", "other_group_member", "worker", "coordinator", "owner", "admin"]
OK = "OK"
UNAUTH = "UNAUTHENTICATED"
NOT_MEMBER = "NOT_A_MEMBER"
DENIED = "PERMISSION_DENIED"
UNIMPLEMENTED = "COMMAND_NOT_IMPLEMENTED"


def row(anonymous: str, non_member: str, other: str, worker: str, coordinator: str, owner: str, admin: str) -> dict[str, str]:
    return dict(zip(ROLES, (anonymous, non_member, other, worker, coordinator, owner, admin), strict=True))


MEMBERS_ONLY = row(UNAUTH, NOT_MEMBER, NOT_MEMBER, OK, OK, OK, OK)


async def _read_events(c: MeshClient) -> object:
    return [e async for e in c.read_events(G)]


CALLS: dict[str, tuple[Callable[[MeshClient], Awaitable[object]], dict[str, str]]] = {
    "AuthorityService.ReadEvents": (_read_events, MEMBERS_ONLY),
    "AuthorityService.GetGroupState": (lambda c: c.group_state(G), MEMBERS_ONLY),
    "AuthorityService.GetSignedGroupSummary": (lambda c: c.signed_group_summary(G), MEMBERS_ONLY),
    "AuthorityService.GetMissionProgress": (
        lambda c: c.authority.GetMissionProgress(authority_service_pb2.GetMissionProgressRequest(group_id=G)),
        MEMBERS_ONLY,
    ),
    "AuthorityService.GetContextPackage": (
        lambda c: c.authority.GetContextPackage(
            authority_service_pb2.GetContextPackageRequest(group_id=G, recipient_ids=["worker-bot"])
        ),
        row(UNAUTH, NOT_MEMBER, NOT_MEMBER, DENIED, OK, DENIED, OK),
    ),
    "AuthorityService.TakeSnapshot": (
        lambda c: c.authority.TakeSnapshot(authority_service_pb2.TakeSnapshotRequest(group_id=G)),
        row(UNAUTH, DENIED, DENIED, DENIED, DENIED, DENIED, OK),
    ),
    "AuthorityService.GetAuthorityKey": (lambda c: c.authority_key(), row(OK, OK, OK, OK, OK, OK, OK)),
    "MembershipService.GetIdentity": (
        lambda c: c.membership.GetIdentity(membership_service_pb2.GetIdentityRequest(identity_id="alice")),
        row(UNAUTH, OK, OK, OK, OK, OK, OK),
    ),
    "MembershipService.ListMemberships": (
        lambda c: c.membership.ListMemberships(membership_service_pb2.ListMembershipsRequest(group_id=G)),
        MEMBERS_ONLY,
    ),
    "ArtifactService.Stat": (
        lambda c: c.artifacts.Stat(
            artifact_service_pb2.StatRequest(digest=common_pb2.Digest(algorithm="blake3", hex="a" * 64, size_bytes=1))
        ),
        row(UNAUTH, "NOT_FOUND", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND"),
    ),
    # Per-blob rules (holders, Group references, quota): tests/test_artifact_authorization.py.
    "ArtifactService.Upload": (lambda c: c.upload(b"every identity may upload its own bytes"), row(UNAUTH, OK, OK, OK, OK, OK, OK)),
    "ArtifactService.Download": (
        lambda c: c.download(common_pb2.Digest(algorithm="blake3", hex="a" * 64, size_bytes=1)),
        row(UNAUTH, "NOT_FOUND", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND"),
    ),
    "ArtifactService.FindMissing": (
        lambda c: c.artifacts.FindMissing(
            artifact_service_pb2.FindMissingRequest(digests=[common_pb2.Digest(algorithm="blake3", hex="a" * 64, size_bytes=1)])
        ),
        row(UNAUTH, OK, OK, OK, OK, OK, OK),
    ),
    "SchedulingService.GetQueue": (
        lambda c: scheduling_stub(c).GetQueue(scheduling_service_pb2.GetQueueRequest()),
        row(UNAUTH, UNIMPLEMENTED, UNIMPLEMENTED, UNIMPLEMENTED, UNIMPLEMENTED, UNIMPLEMENTED, UNIMPLEMENTED),
    ),
}


def scheduling_stub(c: MeshClient) -> Any:
    from missionweave.v1 import scheduling_service_pb2_grpc

    return scheduling_service_pb2_grpc.SchedulingServiceStub(c.channel)


async def outcome(call: Awaitable[object]) -> str:
    try:
        await call
    except grpc.aio.AioRpcError as err:
        rejection = rejection_from_rpc_error(err)
        assert rejection is not None, f"an unstructured refusal: {err.code().name} {err.details()}"
        return R.Name(rejection.reason).removeprefix("REJECTION_REASON_")
    return OK


@pytest.mark.req("MW-8-05", "MW-8-07", "MW-9-05")
async def test_the_authorization_matrix_holds_for_every_rpc_and_caller(world: World) -> None:
    """Every RPC x {anonymous, non-member, member of another Group, Worker, Coordinator,
    MissionOwner, Organization admin}: allowed, or the exact refusal; no unauthorized success."""
    clients = await cast(world)
    try:
        wrong = []
        for rpc, (call, expected) in CALLS.items():
            for role in ROLES:
                got = await outcome(call(clients[role]))
                if got != expected[role]:
                    wrong.append(f"{rpc} as {role}: {got}, expected {expected[role]}")
        assert not wrong, "\n".join(wrong)
    finally:
        for client in clients.values():
            await client.channel.close()


@pytest.mark.req("MW-8-05")
async def test_a_non_member_cannot_tell_a_missing_group_from_a_closed_one(world: World) -> None:
    clients = await cast(world)
    try:
        for group in (G, "grp_never_created"):
            assert await outcome(clients["non_member"].group_state(group)) == NOT_MEMBER
        assert await outcome(clients["admin"].group_state("grp_never_created")) == "GROUP_NOT_FOUND"
    finally:
        for client in clients.values():
            await client.channel.close()


# ------------------------------------------------------------------ internal contracts


INTERNAL_CALLS: dict[str, Callable[[grpc.aio.Channel, tuple[tuple[str, str], ...]], Awaitable[object]]] = {
    "GroupLogService.FetchEvents": lambda ch, md: group_log_pb2_grpc.GroupLogServiceStub(ch).FetchEvents(
        group_log_pb2.FetchEventsRequest(group_id=G, member_id="alice"), metadata=md
    ),
    "IdentityDirectoryService.GetIdentities": lambda ch, md: identities_pb2_grpc.IdentityDirectoryServiceStub(
        ch
    ).GetIdentities(identities_pb2.GetIdentitiesRequest(identity_ids=["alice"]), metadata=md),
    "PublicationService.FindPublication": lambda ch, md: publications_pb2_grpc.PublicationServiceStub(
        ch
    ).FindPublication(publications_pb2.FindPublicationRequest(group_id=G), metadata=md),
}


def _service_addresses(w: World) -> dict[str, str]:
    """Where each internal contract is served: the one address, or each service's own port (split)."""
    peers = getattr(w.mesh, "peer_addresses", None)
    if peers:
        return {
            "GroupLogService.FetchEvents": peers["authority"].split(",")[0],
            "IdentityDirectoryService.GetIdentities": peers["membership"],
            "PublicationService.FindPublication": peers["artifacts"],
        }
    return dict.fromkeys(INTERNAL_CALLS, w.target)


async def test_internal_contracts_answer_only_services_of_the_mesh(world: World) -> None:
    """A client that reaches an internal port gains nothing: no proof, an agent's own call proof or a
    wrong mesh token are refused; the mesh's token is what its services use."""
    w = world
    await create(w)
    token = w.settings.mesh_token_path.read_bytes().strip().decode()
    for rpc, address in _service_addresses(w).items():
        async with open_channel(address) as channel:
            call = INTERNAL_CALLS[rpc]
            proof = call_proof(w.owner, f"/missionweave.internal.v1.{rpc.replace('.', '/')}", address)
            for metadata in ((), ((CALL_PROOF_METADATA, proof),), ((MESH_TOKEN_METADATA, "0" * 64),)):
                refusal = await outcome(call(channel, metadata))  # type: ignore[arg-type]
                assert refusal == "UNAUTHENTICATED", (rpc, metadata[:1] and metadata[0][0], refusal)
            assert await outcome(call(channel, ((MESH_TOKEN_METADATA, token),))) in (OK, "NOT_A_MEMBER", "INVALID_ARGUMENT")


# ------------------------------------------------------------------ the proof itself


def handmade_proof(signer: SessionSigner, method: str, audience: str, *, key: SigningKey | None = None,
                   issued_offset_s: float = 0.0, nonce: bytes | None = None) -> bytes:
    from datetime import timedelta

    proof = auth_pb2.CallProof(
        identity_id=signer.identity_id,
        session_epoch=signer.session_epoch,
        method=method,
        audience=audience,
        issued_at=to_timestamp(SystemClock().now() + timedelta(seconds=issued_offset_s)),
        nonce=nonce if nonce is not None else os.urandom(16),
    )
    return sign_envelope(
        proof.SerializeToString(), CALL_PROOF_TYPE, key or signer.key, session_key_id(signer.identity_id, signer.session_epoch)
    ).SerializeToString()


STATE = "/missionweave.v1.AuthorityService/GetGroupState"


async def check_of(w: World, proof: bytes) -> str:
    async with open_channel(w.target) as channel:
        stub = channel.unary_unary(
            STATE,
            request_serializer=authority_service_pb2.GetGroupStateRequest.SerializeToString,
            response_deserializer=authority_service_pb2.GetGroupStateResponse.FromString,
        )
        try:
            await stub(authority_service_pb2.GetGroupStateRequest(group_id=G), metadata=((CALL_PROOF_METADATA, proof),))
        except grpc.aio.AioRpcError as err:
            rejection = rejection_from_rpc_error(err)
            assert rejection is not None and err.code() == grpc.StatusCode.UNAUTHENTICATED, err
            return rejection.metadata["check"]
    return OK


@pytest.mark.req("MW-11.3-09")
async def test_a_call_proof_is_refused_when_replayed_misdirected_stale_forged_or_fenced(world: World) -> None:
    w = world
    await create(w)
    good = handmade_proof(w.owner, STATE, w.target)
    assert await check_of(w, good) == OK
    assert await check_of(w, good) == "replayed"  # the same nonce again within its window
    assert await check_of(w, handmade_proof(w.owner, "/missionweave.v1.AuthorityService/ReadEvents", w.target)) == "method"
    assert await check_of(w, handmade_proof(w.owner, STATE, "mesh.example.org:443")) == "audience"
    assert await check_of(w, handmade_proof(w.owner, STATE, w.target, issued_offset_s=-45)) == "stale"
    assert await check_of(w, handmade_proof(w.owner, STATE, w.target, issued_offset_s=45)) == "stale"
    assert await check_of(w, handmade_proof(w.owner, STATE, w.target, key=SigningKey.generate())) == "signature"
    assert await check_of(w, handmade_proof(w.owner, STATE, w.target, nonce=b"short")) == "replayed"
    assert await check_of(w, b"\x00garbage") == "malformed"
    # A newer session fences the older one's proofs at once (MW-11.3-09).
    newer = await w.client.open_session("alice", w.owner.key)
    assert await check_of(w, handmade_proof(w.owner, STATE, w.target)) == "session"
    assert await check_of(w, handmade_proof(newer, STATE, w.target)) == OK


# ------------------------------------------------------------------ the leak test


MARKERS = {
    "restricted": "MARK-restricted-7f3a",
    "before_visibility": "MARK-early-91c2",
    "other_group": "MARK-elsewhere-4d8e",
}


@pytest.mark.req("MW-8-07", "MW-9-05")
async def test_no_read_path_shows_a_worker_what_it_may_not_see(world: World) -> None:
    """Markers planted before the Worker's visibility start, in a restricted Conversation it is not
    party to, and in another Group never reach it through any read; the owner sees the restricted
    one (so the scan would find a marker that leaked)."""
    w = world
    planning = (await create(w)).mission.planning_conversation_id
    await w.run(w.owner, G, "message_post", builders.message(planning, MARKERS["before_visibility"]), membership_epoch=1)
    opened = conversation_pb2.ConversationOpen(
        conversation_id=SECRET, kind=CK.CONVERSATION_KIND_RESTRICTED, title=MARKERS["restricted"], participant_ids=["coord-bot"]
    )
    await w.run(w.coordinator, G, "conversation_open", opened, membership_epoch=2)
    await w.run(w.coordinator, G, "message_post", builders.message(SECRET, MARKERS["restricted"]), membership_epoch=2)
    await as_member(w, G, w.worker)
    await w.run(w.owner, G, "message_post", builders.message(planning, "visible to the worker"), membership_epoch=1)
    await w.run(w.owner, OTHER, "mission_create", builders.mission_create("alice", "coord-bot", w.clock.now()))
    other_planning = (await w.client.group_state(OTHER)).mission.planning_conversation_id
    await w.run(w.owner, OTHER, "message_post", builders.message(other_planning, MARKERS["other_group"]), membership_epoch=1)

    async def everything(client: MeshClient) -> bytes:
        seen = b""
        for group in (G, OTHER):
            reads: list[Callable[[str], Awaitable[Any]]] = [
                lambda g: _collect(client, g),
                client.group_state,
                client.signed_group_summary,
                lambda g: client.authority.GetMissionProgress(authority_service_pb2.GetMissionProgressRequest(group_id=g)),
                lambda g: client.membership.ListMemberships(membership_service_pb2.ListMembershipsRequest(group_id=g)),
            ]
            for read in reads:
                try:
                    answer = await read(group)
                except grpc.aio.AioRpcError as err:
                    seen += (err.details() or "").encode()
                    continue
                seen += answer if isinstance(answer, bytes) else answer.SerializeToString()  # type: ignore[union-attr]
        return seen

    worker = MeshClient(w.target, reader=w.worker)
    owner = MeshClient(w.target, reader=w.owner)
    try:
        seen = await everything(worker)
        assert b"visible to the worker" in seen  # the scan does see what the worker may read
        leaked = [name for name, marker in MARKERS.items() if marker.encode() in seen]
        assert not leaked, f"the worker read {leaked}"
        owners = await everything(owner)
        assert MARKERS["restricted"].encode() in owners and MARKERS["before_visibility"].encode() in owners
    finally:
        await worker.channel.close()
        await owner.channel.close()


async def _collect(client: MeshClient, group: str) -> bytes:
    call = client.authority.ReadEvents(authority_service_pb2.ReadEventsRequest(group_id=group))
    return b"".join([batch.SerializeToString() async for batch in call])
