"""Nobody reads, lists or operates without proving who they are, and each reads only what its
Memberships allow (issue 13 items 1, 2 and 8; docs/security.md; decisions D64-D66).

The authorization matrix is data: every RPC that needs a proven caller, against every kind of
caller, with the exact outcome, run over the public gRPC API in both topologies. The leak test
plants markers where a Worker may not look and scans what every read path gives it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from missionweave.internal.v1 import (
    group_log_pb2,
    group_log_pb2_grpc,
    identities_pb2,
    identities_pb2_grpc,
    publications_pb2,
    publications_pb2_grpc,
)
from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import COMMAND_TYPE, session_key_id, sign_envelope
from missionweave.kernel.transport import open_channel
from missionweave.sdk.client import (
    MeshClient,
    SessionSigner,
    agent_card_envelope,
    blob_digest,
    open_session_envelope,
    register_identity_envelope,
)
from missionweave.sdk.credentials import call_proof
from missionweave.v1 import (
    agent_card_pb2,
    artifact_service_pb2,
    auth_pb2,
    authority_service_pb2,
    common_pb2,
    conversation_pb2,
    membership_pb2,
    membership_service_pb2,
    scheduling_service_pb2,
    scheduling_service_pb2_grpc,
)
from missionweave.v1 import gateway_service_pb2 as gpb
from missionweave.v1 import gateway_service_pb2_grpc as gpb_grpc
from missionweave.v1 import work_pb2 as wp
from missionweave_server.edge.callers import (
    CALL_PROOF_METADATA,
    CALL_PROOF_TYPE,
    MESH_TOKEN_METADATA,
    access_of,
)
from missionweave_server.services.artifacts.publications import PublicationServicer
from missionweave_server.services.artifacts.service import ArtifactServicer
from missionweave_server.services.authority.group_log import GroupLogServicer
from missionweave_server.services.authority.servicer import AuthorityServicer
from missionweave_server.services.gateway.service import GatewayServicer
from missionweave_server.services.membership.directory import IdentityDirectoryServicer
from missionweave_server.services.membership.servicer import MembershipServicer
from missionweave_server.services.scheduling.servicer import SchedulingServicer
from tests import builders
from tests.conftest import World, register
from tests.test_artifact_authorization import manifest_in
from tests.test_gateway import Stream, hello
from tests.test_missions import G, as_member, create
from tests.test_work_items import Flow

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
            assert access_of(getattr(servicer, method.name)) is not None, (
                f"{name}.{method.name} states no rule"
            )


# ------------------------------------------------------------------ the cast


async def cast(w: World) -> dict[str, MeshClient]:
    """One client per kind of caller, each proving its own identity (anonymous proves nothing)."""
    await create(w)
    await as_member(w, G, w.worker)
    outsider = await register(w.client, w.keys["admin"], "outsider-bot", common_pb2.IDENTITY_KIND_AGENT)
    other = await register(w.client, w.keys["admin"], "elsewhere-bot", common_pb2.IDENTITY_KIND_AGENT)
    await w.run(
        w.owner, OTHER, "mission_create", builders.mission_create("alice", "elsewhere-bot", w.clock.now())
    )
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


def row(
    anonymous: str, non_member: str, other: str, worker: str, coordinator: str, owner: str, admin: str
) -> dict[str, str]:
    return dict(zip(ROLES, (anonymous, non_member, other, worker, coordinator, owner, admin), strict=True))


MEMBERS_ONLY = row(UNAUTH, NOT_MEMBER, NOT_MEMBER, OK, OK, OK, OK)


class Props:
    """What the matrix's calls act on, made once per run: the snapshot, a blob G's manifest cites,
    each caller's Membership epoch in G."""

    def __init__(
        self,
        w: World,
        state: authority_service_pb2.GroupState,
        snapshot: common_pb2.Digest,
        blob: common_pb2.Digest,
    ) -> None:
        self.w, self.snapshot, self.blob = w, snapshot, blob
        self.planning = state.mission.planning_conversation_id
        self.epochs = {m.member_id: m.membership_epoch for m in state.memberships if m.active}


async def props(w: World, clients: dict[str, MeshClient]) -> Props:
    taken = await clients["admin"].authority.TakeSnapshot(
        authority_service_pb2.TakeSnapshotRequest(group_id=G)
    )
    await clients["worker"].publish_agent_card(
        agent_card_pb2.AgentCard(card_version="0.1.0", max_concurrency=2)
    )
    source, data = b"the source G's manifests cite", b"a blob made from it"
    await clients["coordinator"].upload(source, manifest_in(w, w.coordinator, source))
    await clients["coordinator"].upload(
        data, manifest_in(w, w.coordinator, data, sources=(blob_digest(source),))
    )
    return Props(w, await clients["admin"].group_state(G), taken.digest, blob_digest(data))


Call = Callable[[MeshClient, Props], Awaitable[object]]


def signer_of(c: MeshClient) -> SessionSigner | None:
    return c.proofs.signer


def post(c: MeshClient, p: Props) -> common_pb2.SignedEnvelope:
    """A message to G's planning Conversation, signed by the caller (anonymous: signed by nobody)."""
    conversation = p.planning
    signer = signer_of(c)
    if signer is None:
        unsigned = p.w.owner.command(
            G, "message_post", builders.message(conversation, "anonymous"), membership_epoch=1
        )
        return common_pb2.SignedEnvelope(payload=unsigned.SerializeToString(), payload_type=COMMAND_TYPE)
    epoch = p.epochs.get(signer.identity_id, 0)
    return signer.sign(
        signer.command(G, "message_post", builders.message(conversation, "hello"), membership_epoch=epoch)
    )


async def _command_stream(c: MeshClient, p: Props) -> object:
    async def one() -> AsyncIterator[authority_service_pb2.ExecuteCommandStreamRequest]:
        yield authority_service_pb2.ExecuteCommandStreamRequest(command=post(c, p), request_tag=1)

    answers = [a async for a in c.authority.ExecuteCommandStream(one())]
    return (
        R.Name(answers[0].rejection.reason).removeprefix("REJECTION_REASON_")
        if answers[0].HasField("rejection")
        else OK
    )


async def _command_batch(c: MeshClient, p: Props) -> object:
    [answer] = await c.execute_batch([post(c, p)])
    return R.Name(answer.reason).removeprefix("REJECTION_REASON_") if isinstance(answer, Rejected) else OK


def _hello_proof(c: MeshClient, p: Props) -> common_pb2.SignedEnvelope | None:
    signer = signer_of(c)
    return None if signer is None else hello(p.w, signer).proof


async def _subscribe(c: MeshClient, p: Props) -> object:
    """HELLO, then SUBSCRIBE to G: its first event, or the ERROR frame's code."""
    stream = Stream(p.w, c.channel)
    try:
        signer = signer_of(c)
        frame = hello(p.w, signer) if signer else gpb.HelloFrame(agent_id="nobody")
        await stream.send(hello=frame)
        first = await stream.recv()
        if first.WhichOneof("frame") == "welcome":
            await stream.send(
                subscribe=gpb.SubscribeFrame(subscription_id="s", group_id=G, initial_credits=10)
            )
            first = await stream.until_any("event", "error")
        if first.WhichOneof("frame") == "error":
            return gpb.GatewayErrorCode.Name(first.error.code).removeprefix("GATEWAY_ERROR_CODE_")
        return OK
    finally:
        stream.call.cancel()


async def _snapshot(c: MeshClient, p: Props) -> object:
    request = gpb.GetSnapshotRequest(group_id=G, digest=p.snapshot, proof=_hello_proof(c, p))
    return await gpb_grpc.GatewayServiceStub(c.channel).GetSnapshot(request)


def _open_session_as_alice(c: MeshClient, p: Props) -> Awaitable[object]:
    """Opening a session for alice, signed with the caller's own key: only alice's key can."""
    signer = signer_of(c)
    key = signer.key if signer else SigningKey.generate()
    envelope = open_session_envelope("alice", key, bytes(SigningKey.generate().verify_key))
    return c.membership.OpenSession(membership_service_pb2.OpenSessionRequest(command=envelope))  # type: ignore[no-any-return]


def _register(c: MeshClient, p: Props) -> Awaitable[object]:
    """Registering a new identity, as the caller: only an Organization administrator may."""
    signer = signer_of(c)
    identity = membership_pb2.Identity(
        identity_id=f"new-{os.urandom(4).hex()}",
        kind=common_pb2.IDENTITY_KIND_AGENT,
        public_key=bytes(SigningKey.generate().verify_key),
    )
    admin_id = signer.identity_id if signer else "admin"
    envelope = register_identity_envelope(admin_id, signer.key if signer else SigningKey.generate(), identity)
    return c.membership.RegisterIdentity(membership_service_pb2.RegisterIdentityRequest(command=envelope))  # type: ignore[no-any-return]


async def _manifests(c: MeshClient, p: Props) -> object:
    found = await c.artifacts.GetManifest(artifact_service_pb2.GetManifestRequest(digest=p.blob))
    return OK if found.manifests else EMPTY


async def _provenance(c: MeshClient, p: Props) -> object:
    query = artifact_service_pb2.QueryProvenanceRequest(
        digest=p.blob, direction=artifact_service_pb2.PROVENANCE_DIRECTION_ANCESTORS
    )
    graph = await c.artifacts.QueryProvenance(query)
    return OK if graph.edges else EMPTY


async def _find_missing(c: MeshClient, p: Props) -> object:
    found = await c.artifacts.FindMissing(artifact_service_pb2.FindMissingRequest(digests=[p.blob]))
    return "REPORTED_MISSING" if found.missing_digests else OK


async def _batch_download(c: MeshClient, p: Props) -> object:
    """The blob's own outcome inside the batch (the call itself succeeds for any proven caller)."""
    found = await c.artifacts.BatchDownload(artifact_service_pb2.BatchDownloadRequest(digests=[p.blob]))
    refused = found.results[0].rejection if found.results[0].HasField("rejection") else None
    return OK if refused is None else R.Name(refused.reason).removeprefix("REJECTION_REASON_")


async def _batch_upload(c: MeshClient, p: Props) -> object:
    data = b"every identity may upload its own bytes, in a batch too"
    blob = artifact_service_pb2.BatchUploadBlob(digest=blob_digest(data), data=data)
    sent = await c.artifacts.BatchUpload(artifact_service_pb2.BatchUploadRequest(blobs=[blob]))
    refused = sent.results[0].rejection if sent.results[0].HasField("rejection") else None
    return OK if refused is None else R.Name(refused.reason).removeprefix("REJECTION_REASON_")


def scheduling(rpc: str, request: Any) -> Call:
    def call(c: MeshClient, p: Props) -> Awaitable[object]:
        return getattr(scheduling_service_pb2_grpc.SchedulingServiceStub(c.channel), rpc)(request)  # type: ignore[no-any-return]

    return call


async def _read_events(c: MeshClient, p: Props) -> object:
    return [e async for e in c.read_events(G)]


def _publish_own_card(c: MeshClient, p: Props) -> Awaitable[object]:
    """The caller publishes its own card, signed by its session (anonymous: by nobody's)."""
    signer = signer_of(c) or SessionSigner("nobody-bot", 1, SigningKey.generate())
    card = agent_card_pb2.AgentCard(agent_id=signer.identity_id, card_version="1.0.0", max_concurrency=1)
    return c.membership.PublishAgentCard(  # type: ignore[no-any-return]
        membership_service_pb2.PublishAgentCardRequest(card=agent_card_envelope(signer, card))
    )


def _report_worker_presence(c: MeshClient, p: Props) -> Awaitable[object]:
    """Presence of worker-bot (which has a card): only worker-bot itself may report it."""
    report = agent_card_pb2.PresenceReport(
        agent_id="worker-bot", free_slots=1, availability=agent_card_pb2.PRESENCE_AVAILABILITY_AVAILABLE
    )
    return c.membership.ReportPresence(membership_service_pb2.ReportPresenceRequest(report=report))  # type: ignore[no-any-return]


SIG = "SIGNATURE_INVALID"
EMPTY = "EMPTY"  # answered, with nothing the caller may not see in it
BLOB_READERS = row(UNAUTH, "NOT_FOUND", "NOT_FOUND", OK, OK, OK, OK)
POSTERS = row("SIGNATURE_MISSING", NOT_MEMBER, NOT_MEMBER, OK, OK, OK, NOT_MEMBER)
# Each caller reaches its own scheduler only, which follows a Group as that caller's member view.
OWN_SCHEDULER = row(UNAUTH, NOT_MEMBER, NOT_MEMBER, OK, OK, OK, NOT_MEMBER)
sched = scheduling_service_pb2

CALLS: dict[str, tuple[Call, dict[str, str]]] = {
    "AuthorityService.ExecuteCommand": (lambda c, p: c.execute(post(c, p)), POSTERS),
    "AuthorityService.ExecuteCommandStream": (_command_stream, POSTERS),
    "AuthorityService.ExecuteCommandBatch": (_command_batch, POSTERS),
    "AuthorityService.ReadEvents": (_read_events, MEMBERS_ONLY),
    "AuthorityService.GetGroupState": (lambda c, p: c.group_state(G), MEMBERS_ONLY),
    "AuthorityService.GetSignedGroupSummary": (lambda c, p: c.signed_group_summary(G), MEMBERS_ONLY),
    "AuthorityService.GetMissionProgress": (
        lambda c, p: c.authority.GetMissionProgress(
            authority_service_pb2.GetMissionProgressRequest(group_id=G)
        ),
        MEMBERS_ONLY,
    ),
    # G holds no WorkItem: a caller let in is told it is missing, everyone else learns nothing.
    "AuthorityService.GetWorkItem": (
        lambda c, p: c.work_item(G, "wi-none"),
        row(UNAUTH, NOT_MEMBER, NOT_MEMBER, "NOT_FOUND", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND"),
    ),
    "AuthorityService.ListWorkItems": (lambda c, p: c.work_items(G), MEMBERS_ONLY),
    "AuthorityService.GetMissionReview": (lambda c, p: c.mission_review(G), MEMBERS_ONLY),
    "AuthorityService.ListMissions": (lambda c, p: c.missions(), row(UNAUTH, OK, OK, OK, OK, OK, OK)),
    "AuthorityService.GetMissionTree": (
        lambda c, p: c.mission_tree(G),
        row(UNAUTH, NOT_MEMBER, NOT_MEMBER, DENIED, OK, OK, OK),
    ),
    "AuthorityService.GetContextPackage": (
        lambda c, p: c.authority.GetContextPackage(
            authority_service_pb2.GetContextPackageRequest(group_id=G, recipient_ids=["worker-bot"])
        ),
        row(UNAUTH, NOT_MEMBER, NOT_MEMBER, DENIED, OK, DENIED, OK),
    ),
    "AuthorityService.TakeSnapshot": (
        lambda c, p: c.authority.TakeSnapshot(authority_service_pb2.TakeSnapshotRequest(group_id=G)),
        row(UNAUTH, DENIED, DENIED, DENIED, DENIED, DENIED, OK),
    ),
    "AuthorityService.GetAuthorityKey": (lambda c, p: c.authority_key(), row(OK, OK, OK, OK, OK, OK, OK)),
    "GatewayService.Connect": (
        _subscribe,
        row("HELLO_INVALID", "NOT_A_MEMBER", "NOT_A_MEMBER", OK, OK, OK, "NOT_A_MEMBER"),
    ),
    "GatewayService.GetSnapshot": (_snapshot, row(SIG, NOT_MEMBER, NOT_MEMBER, OK, OK, OK, NOT_MEMBER)),
    "MembershipService.GetIdentity": (
        lambda c, p: c.membership.GetIdentity(membership_service_pb2.GetIdentityRequest(identity_id="alice")),
        row(UNAUTH, OK, OK, OK, OK, OK, OK),
    ),
    "MembershipService.ListIdentities": (
        lambda c, p: c.identities(),
        row(UNAUTH, DENIED, DENIED, DENIED, DENIED, DENIED, OK),
    ),
    "MembershipService.ListMemberships": (
        lambda c, p: c.membership.ListMemberships(membership_service_pb2.ListMembershipsRequest(group_id=G)),
        MEMBERS_ONLY,
    ),
    "MembershipService.RegisterIdentity": (
        _register,
        row(SIG, DENIED, DENIED, DENIED, DENIED, DENIED, OK),
    ),
    # Agents publish their own cards; humans (alice, admin) publish none (docs/agent-cards.md).
    "MembershipService.PublishAgentCard": (_publish_own_card, row(UNAUTH, OK, OK, OK, OK, DENIED, DENIED)),
    "MembershipService.GetAgentCard": (
        lambda c, p: c.membership.GetAgentCard(
            membership_service_pb2.GetAgentCardRequest(agent_id="worker-bot")
        ),
        row(UNAUTH, OK, OK, OK, OK, OK, OK),
    ),
    "MembershipService.ListAgentCardVersions": (
        lambda c, p: c.membership.ListAgentCardVersions(
            membership_service_pb2.ListAgentCardVersionsRequest(agent_id="worker-bot")
        ),
        row(UNAUTH, OK, OK, OK, OK, OK, OK),
    ),
    "MembershipService.ReportPresence": (
        _report_worker_presence,
        row(UNAUTH, DENIED, DENIED, OK, DENIED, DENIED, DENIED),
    ),
    "MembershipService.GetPresence": (
        lambda c, p: c.membership.GetPresence(
            membership_service_pb2.GetPresenceRequest(agent_ids=["worker-bot"])
        ),
        row(UNAUTH, OK, OK, OK, OK, OK, OK),
    ),
    "ArtifactService.Stat": (
        lambda c, p: c.artifacts.Stat(artifact_service_pb2.StatRequest(digest=p.blob)),
        BLOB_READERS,
    ),
    "ArtifactService.Download": (lambda c, p: c.download(p.blob), BLOB_READERS),
    "ArtifactService.BatchDownload": (_batch_download, BLOB_READERS),
    "ArtifactService.FindMissing": (
        _find_missing,
        row(UNAUTH, "REPORTED_MISSING", "REPORTED_MISSING", OK, OK, OK, OK),
    ),
    "ArtifactService.GetManifest": (_manifests, row(UNAUTH, EMPTY, EMPTY, OK, OK, OK, OK)),
    "ArtifactService.QueryProvenance": (_provenance, row(UNAUTH, EMPTY, EMPTY, OK, OK, OK, OK)),
    # Per-blob rules (holders, Group references, quota): tests/test_artifact_authorization.py.
    "ArtifactService.Upload": (
        lambda c, p: c.upload(b"every identity may upload its own bytes"),
        row(UNAUTH, OK, OK, OK, OK, OK, OK),
    ),
    "ArtifactService.BatchUpload": (_batch_upload, row(UNAUTH, OK, OK, OK, OK, OK, OK)),
    "SchedulingService.Admit": (
        scheduling("Admit", sched.AdmitRequest(group_id=G, work_item_id="wi-x", offer_id="off-x")),
        OWN_SCHEDULER,
    ),
    "SchedulingService.GetQueue": (scheduling("GetQueue", sched.GetQueueRequest(group_id=G)), OWN_SCHEDULER),
    "SchedulingService.NextSlot": (
        scheduling("NextSlot", sched.NextSlotRequest()),
        row(UNAUTH, OK, OK, OK, OK, OK, OK),
    ),
    "SchedulingService.ReleaseSlot": (
        scheduling("ReleaseSlot", sched.ReleaseSlotRequest(slot_id="slot-0")),
        row(UNAUTH, "NOT_FOUND", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND"),
    ),
    "SchedulingService.DiscloseSchedule": (
        scheduling("DiscloseSchedule", sched.DiscloseScheduleRequest(group_id=G, work_item_id="wi-x")),
        row(UNAUTH, NOT_MEMBER, NOT_MEMBER, "NOT_FOUND", "NOT_FOUND", "NOT_FOUND", NOT_MEMBER),
    ),
    "SchedulingService.SetPriority": (
        scheduling(
            "SetPriority",
            sched.SetPriorityRequest(
                group_id=G,
                source=sched.PRIORITY_SOURCE_MISSION_OWNER,
                worker_id="worker-bot",
                priority_class=sched.PRIORITY_CLASS_ELEVATED,
            ),
        ),
        row(UNAUTH, DENIED, DENIED, DENIED, DENIED, OK, DENIED),
    ),
    # Last: alice's new session fences her older one (MW-11.3-09).
    "MembershipService.OpenSession": (_open_session_as_alice, row(SIG, SIG, SIG, SIG, SIG, OK, SIG)),
}


def test_the_matrix_names_every_public_rpc() -> None:
    """The matrix cannot skip an RPC: each method of each public service has its row."""
    from missionweave.v1 import gateway_service_pb2

    public = [m for m, name, _ in SERVICERS if m.DESCRIPTOR.package == "missionweave.v1"] + [
        gateway_service_pb2
    ]
    named = {
        f"{service.name}.{method.name}"
        for module in public
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert named == set(CALLS), named ^ set(CALLS)


async def outcome(call: Awaitable[object]) -> str:
    try:
        answer = await call
    except grpc.aio.AioRpcError as err:
        rejection = rejection_from_rpc_error(err)
        assert rejection is not None, f"an unstructured refusal: {err.code().name} {err.details()}"
        return R.Name(rejection.reason).removeprefix("REJECTION_REASON_")
    except Rejected as err:
        return R.Name(err.reason).removeprefix("REJECTION_REASON_")
    return answer if isinstance(answer, str) else OK


@pytest.mark.req("MW-8-05", "MW-8-07", "MW-9-05")
async def test_the_authorization_matrix_holds_for_every_rpc_and_caller(world: World) -> None:
    """Every public RPC x {anonymous, non-member, member of another Group, Worker, Coordinator,
    MissionOwner, Organization admin}: allowed, or the exact refusal; no unauthorized success."""
    clients = await cast(world)
    try:
        p = await props(world, clients)
        wrong = []
        for rpc, (call, expected) in CALLS.items():
            for role in ROLES:
                got = await outcome(call(clients[role], p))
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
    "IdentityDirectoryService.GetAgentCards": lambda ch, md: identities_pb2_grpc.IdentityDirectoryServiceStub(
        ch
    ).GetAgentCards(identities_pb2.GetAgentCardsRequest(agent_ids=["worker-bot"]), metadata=md),
}


def _service_addresses(w: World) -> dict[str, str]:
    """Where each internal contract is served: the one address, or each service's own port (split)."""
    peers = getattr(w.mesh, "peer_addresses", None)
    if peers:
        return {
            "GroupLogService.FetchEvents": peers["authority"].split(",")[0],
            "IdentityDirectoryService.GetIdentities": peers["membership"],
            "IdentityDirectoryService.GetAgentCards": peers["membership"],
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
            assert await outcome(call(channel, ((MESH_TOKEN_METADATA, token),))) in (
                OK,
                "NOT_A_MEMBER",
                "INVALID_ARGUMENT",
            )


# ------------------------------------------------------------------ the proof itself


def handmade_proof(
    signer: SessionSigner,
    method: str,
    audience: str,
    *,
    key: SigningKey | None = None,
    issued_offset_s: float = 0.0,
    nonce: bytes | None = None,
) -> bytes:
    proof = auth_pb2.CallProof(
        identity_id=signer.identity_id,
        session_epoch=signer.session_epoch,
        method=method,
        audience=audience,
        issued_at=to_timestamp(SystemClock().now() + timedelta(seconds=issued_offset_s)),
        nonce=nonce if nonce is not None else os.urandom(16),
    )
    return sign_envelope(
        proof.SerializeToString(),
        CALL_PROOF_TYPE,
        key or signer.key,
        session_key_id(signer.identity_id, signer.session_epoch),
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
            await stub(
                authority_service_pb2.GetGroupStateRequest(group_id=G),
                metadata=((CALL_PROOF_METADATA, proof),),
            )
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
    assert (
        await check_of(w, handmade_proof(w.owner, "/missionweave.v1.AuthorityService/ReadEvents", w.target))
        == "method"
    )
    assert await check_of(w, handmade_proof(w.owner, STATE, "mesh.example.org:443")) == "audience"
    assert await check_of(w, handmade_proof(w.owner, STATE, w.target, issued_offset_s=-45)) == "stale"
    assert await check_of(w, handmade_proof(w.owner, STATE, w.target, issued_offset_s=45)) == "stale"
    assert (
        await check_of(w, handmade_proof(w.owner, STATE, w.target, key=SigningKey.generate())) == "signature"
    )
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
    # In the folded state of a WorkItem made (and worked on by another Worker) before the visibility start.
    "early_work_title": "MARK-early-title-2b7e",
    "early_contract": "MARK-early-goal-c41d",
    "early_evidence": "MARK-early-ev-5a90",
}
# In a WorkItem made after every visibility start: the late joiner sees it, a provisional member not.
NOT_PROVISIONAL = "MARK-later-work-e6f3"


async def _plant_work(w: World) -> None:
    """Before the Worker joins: a WorkItem another Worker owns and submits with Evidence. After it
    (and after a provisional member's grant): one for the team, and one offered to the provisional
    member alone."""
    early = await register(w.client, w.keys["admin"], "early-bot", common_pb2.IDENTITY_KIND_AGENT)
    await as_member(w, G, early)
    f = Flow(w)
    contract = builders.contract(w.clock.now(), goal=MARKERS["early_contract"])
    await f.coord(
        "work_authorize",
        wp.WorkAuthorize(
            work_item_id="wi-early", title=MARKERS["early_work_title"], contract=contract, coordinator_epoch=1
        ),
    )
    epoch = await f.accept(early, "wi-early", await f.offer("wi-early", "early-bot"))
    await f.start(early, "wi-early", epoch, "lease-early")
    submission = await f.submission(early, "wi-early", epoch, "lease-early")
    submission.evidence[0].evidence_id = MARKERS["early_evidence"]
    await f.as_(early, "work_submit", submission)
    await as_member(w, G, w.worker)
    jit = membership_pb2.MembershipGrant(
        member_id="jit-bot",
        role=membership_pb2.MEMBER_ROLE_WORKER,
        provisional=True,
        expires_at=to_timestamp(w.clock.now() + timedelta(minutes=30)),
    )
    await w.run(w.coordinator, G, "membership_grant", jit, membership_epoch=2)
    for work_item_id, title in (
        ("wi-late", NOT_PROVISIONAL),
        ("wi-jit", "offered to the provisional member"),
    ):
        body = wp.WorkAuthorize(
            work_item_id=work_item_id,
            title=title,
            contract=builders.contract(w.clock.now()),
            coordinator_epoch=1,
        )
        await f.coord("work_authorize", body)
    await f.offer("wi-jit", "jit-bot")


@pytest.mark.req("MW-8-06", "MW-8-07", "MW-8-08", "MW-9-05")
async def test_no_read_path_shows_a_worker_what_it_may_not_see(world: World) -> None:
    """Markers planted before the Worker's visibility start (in the log and in a WorkItem's title,
    contract and Evidence), in a restricted Conversation it is not party to, and in another Group
    never reach it through any read; a provisional member reads its offer but no other WorkItem
    (D124). The owner sees them all (so the scan would find a marker that leaked)."""
    w = world
    planning = (await create(w)).mission.planning_conversation_id
    jit = await register(w.client, w.keys["admin"], "jit-bot", common_pb2.IDENTITY_KIND_AGENT)
    await w.run(
        w.owner,
        G,
        "message_post",
        builders.message(planning, MARKERS["before_visibility"]),
        membership_epoch=1,
    )
    opened = conversation_pb2.ConversationOpen(
        conversation_id=SECRET,
        kind=CK.CONVERSATION_KIND_RESTRICTED,
        title=MARKERS["restricted"],
        participant_ids=["coord-bot"],
    )
    await w.run(w.coordinator, G, "conversation_open", opened, membership_epoch=2)
    await w.run(
        w.coordinator, G, "message_post", builders.message(SECRET, MARKERS["restricted"]), membership_epoch=2
    )
    await _plant_work(w)  # the Worker joins here
    await w.run(
        w.owner, G, "message_post", builders.message(planning, "visible to the worker"), membership_epoch=1
    )
    await w.run(
        w.owner, OTHER, "mission_create", builders.mission_create("alice", "coord-bot", w.clock.now())
    )
    other_planning = (await w.client.group_state(OTHER)).mission.planning_conversation_id
    await w.run(
        w.owner,
        OTHER,
        "message_post",
        builders.message(other_planning, MARKERS["other_group"]),
        membership_epoch=1,
    )

    coordinator = MeshClient(w.target, reader=w.coordinator)  # OTHER's Coordinator too
    snapshot = (
        await w.client.authority.TakeSnapshot(authority_service_pb2.TakeSnapshotRequest(group_id=G))
    ).digest
    heads = {g: (await w.client.group_state(g)).head_sequence for g in (G, OTHER)}
    secret_blob = MARKERS["other_group"].encode() * 3
    await coordinator.upload(secret_blob, manifest_in(w, w.coordinator, secret_blob, OTHER))
    private_blob = MARKERS["restricted"].encode() * 3
    await coordinator.upload(private_blob)  # held by the Coordinator alone

    async def package_for(recipient: str, work_item_id: str) -> common_pb2.SignedEnvelope:
        """The Context Package of the recipient's WorkItem, as the Coordinator hands it over."""
        request = authority_service_pb2.GetContextPackageRequest(
            group_id=G, recipient_ids=[recipient], work_item_ids=[work_item_id]
        )
        return (await coordinator.authority.GetContextPackage(request)).package

    package = await package_for("worker-bot", "wi-late")

    async def everything(
        client: MeshClient, signer: SessionSigner, package: common_pb2.SignedEnvelope
    ) -> bytes:
        seen = package.SerializeToString()  # what the Coordinator hands the member

        async def scan(read: Awaitable[Any]) -> None:
            nonlocal seen
            try:
                answer = await read
            except grpc.aio.AioRpcError as err:
                seen += (err.details() or "").encode()
                return
            seen += answer if isinstance(answer, bytes) else answer.SerializeToString()

        for group in (G, OTHER):
            await scan(_collect(client, group))
            await scan(client.group_state(group))
            await scan(client.signed_group_summary(group))
            await scan(
                client.authority.GetMissionProgress(
                    authority_service_pb2.GetMissionProgressRequest(group_id=group)
                )
            )
            await scan(
                client.membership.ListMemberships(
                    membership_service_pb2.ListMembershipsRequest(group_id=group)
                )
            )
            await scan(
                client.authority.ListWorkItems(authority_service_pb2.ListWorkItemsRequest(group_id=group))
            )
            await scan(client.mission_review(group))
            for work_item_id in ("wi-early", "wi-late", "wi-jit"):
                await scan(client.work_item(group, work_item_id))
            await scan(
                client.authority.GetContextPackage(
                    authority_service_pb2.GetContextPackageRequest(
                        group_id=group, recipient_ids=[signer.identity_id]
                    )
                )
            )
            await scan(_over_the_gateway(w, client, signer, group, heads[group]))
        await scan(client.authority.ListMissions(authority_service_pb2.ListMissionsRequest()))
        await scan(
            gpb_grpc.GatewayServiceStub(client.channel).GetSnapshot(
                gpb.GetSnapshotRequest(group_id=G, digest=snapshot, proof=hello(w, signer).proof)
            )
        )
        for blob in (secret_blob, private_blob):
            digest = blob_digest(blob)
            await scan(client.download(digest))
            await scan(client.artifacts.Stat(artifact_service_pb2.StatRequest(digest=digest)))
            await scan(client.artifacts.GetManifest(artifact_service_pb2.GetManifestRequest(digest=digest)))
            for direction in (
                artifact_service_pb2.PROVENANCE_DIRECTION_ANCESTORS,
                artifact_service_pb2.PROVENANCE_DIRECTION_DESCENDANTS,
            ):
                await scan(
                    client.artifacts.QueryProvenance(
                        artifact_service_pb2.QueryProvenanceRequest(digest=digest, direction=direction)
                    )
                )
        return seen

    worker = MeshClient(w.target, reader=w.worker)
    owner = MeshClient(w.target, reader=w.owner)
    provisional = MeshClient(w.target, reader=jit)
    try:
        seen = await everything(worker, w.worker, package)
        # the scan does see what the worker may read: the log after its start, a later WorkItem
        assert b"visible to the worker" in seen and NOT_PROVISIONAL.encode() in seen
        leaked = [name for name, marker in MARKERS.items() if marker.encode() in seen]
        assert not leaked, f"the worker read {leaked}"
        offered = await everything(provisional, jit, await package_for("jit-bot", "wi-jit"))
        assert b"offered to the provisional member" in offered
        leaked = [
            name
            for name, marker in [*MARKERS.items(), ("later", NOT_PROVISIONAL)]
            if marker.encode() in offered
        ]
        assert not leaked, f"the provisional member read {leaked}"
        # A Context Package naming the Worker opens the history it cites (MW-8-09), nothing more.
        cited = await _over_the_gateway(w, worker, w.worker, G, heads[G], package)
        assert MARKERS["before_visibility"].encode() in cited
        assert MARKERS["restricted"].encode() not in cited and MARKERS["other_group"].encode() not in cited
        owners = await everything(owner, w.owner, package)
        unseen = [
            name
            for name, marker in MARKERS.items()
            if name != "other_group" and marker.encode() not in owners
        ]
        assert not unseen, f"the owner's scan missed {unseen}"
    finally:
        for client in (worker, owner, coordinator, provisional):
            await client.channel.close()


async def _over_the_gateway(
    w: World,
    client: MeshClient,
    signer: SessionSigner,
    group: str,
    head: int,
    package: common_pb2.SignedEnvelope | None = None,
) -> bytes:
    """What the gateway gives ``signer`` of ``group``: live delivery from the start, FETCH of the
    whole log (with ``package``, as that Context Package allows)."""
    stream = Stream(w, client.channel)
    seen = b""
    try:
        await stream.send(hello=hello(w, signer))
        await stream.until("welcome")
        await stream.send(
            subscribe=gpb.SubscribeFrame(subscription_id="s", group_id=group, initial_credits=1000)
        )
        while True:
            frame = await asyncio.wait_for(stream.until_any("event", "error"), 10)
            seen += frame.SerializeToString()
            if frame.WhichOneof("frame") == "error" or frame.event.last_sequence >= head:
                break
        ask = gpb.FetchFrame(request_id="f", group_id=group, ranges=[gpb.SequenceRange(first=1, last=head)])
        if package is not None:
            ask.context_package.CopyFrom(package)
        await stream.send(fetch=ask)
        seen += (await asyncio.wait_for(stream.until_any("fetched", "error"), 10)).SerializeToString()
    finally:
        stream.call.cancel()
    return seen


async def _collect(client: MeshClient, group: str) -> bytes:
    call = client.authority.ReadEvents(authority_service_pb2.ReadEventsRequest(group_id=group))
    return b"".join([batch.SerializeToString() async for batch in call])
