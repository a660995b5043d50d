"""`mwp bridge a2a-server` against a live mesh, driven by the a2a-sdk's own client (ClientFactory)
over both of its bindings: gRPC (lf.a2a.v1) and JSON-RPC (docs/bridge-a2a-server.md)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.auth.credentials import CredentialService
from a2a.client.auth.interceptor import AuthInterceptor
from a2a.client.client import Client, ClientCallContext
from a2a.client.errors import A2AClientError
from a2a.types import a2a_pb2 as a2a
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import A2AError, TaskNotCancelableError, TaskNotFoundError
from nacl.signing import SigningKey

from missionweave.kernel.signing import read_key, write_key
from missionweave.sdk.client import decode_events
from missionweave.sdk.event_verification import AuthorityVerifier
from missionweave.v1 import common_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.a2a.server_app import Endpoint, start
from missionweave_bridges.a2a.server_config import ServedIdentity, ServerConfig, hash_token
from tests import builders
from tests.conftest import World, polled
from tests.test_missions import G, create
from tests.test_work_items import Flow

pytestmark = pytest.mark.both_topologies

TS = a2a.TaskState
G2 = "grp_a2a_owned"
BINDINGS = [TransportProtocol.GRPC, TransportProtocol.JSONRPC]


class Token(CredentialService):
    def __init__(self, token: str) -> None:
        self.token = token

    async def get_credentials(
        self, security_scheme_name: str, context: ClientCallContext | None
    ) -> str | None:
        return self.token


class Mesh:
    """The world's mesh with identities the endpoint serves (their keys on disk) and a Group G where
    ann-bot is a Worker; olga owns a second Mission G2."""

    def __init__(self, w: World, tmp: Path) -> None:
        self.w, self.tmp = w, tmp
        self.served: list[ServedIdentity] = []
        self.tokens: dict[str, str] = {}
        self.flow = Flow(w)

    async def identity(self, identity_id: str, kind: int) -> None:
        key = SigningKey.generate()
        await self.w.client.register_identity(
            "admin", self.w.keys["admin"], identity_id, kind, bytes(key.verify_key)
        )
        path = self.tmp / f"{identity_id}.key"
        write_key(path, key)
        token = f"token-of-{identity_id}"
        self.tokens[identity_id] = token
        self.served.append(ServedIdentity(identity_id, path, hash_token(token)))

    async def grant(self, group: str, member: str, by: Any) -> None:
        grant = membership_pb2.MembershipGrant(member_id=member, role=membership_pb2.MEMBER_ROLE_WORKER)
        await self.w.run(by, group, "membership_grant", grant, membership_epoch=1)


@pytest.fixture
async def mesh(world: World, tmp_path: Path) -> Mesh:
    m = Mesh(world, tmp_path)
    await create(world, lease_seconds=3600)
    await m.identity("ann-bot", common_pb2.IDENTITY_KIND_AGENT)
    await m.identity("outsider", common_pb2.IDENTITY_KIND_AGENT)
    await m.identity("olga", common_pb2.IDENTITY_KIND_HUMAN)
    for member in ("worker-bot", "ann-bot"):
        await m.grant(G, member, world.owner)
    return m


class Side:
    """The endpoints a test starts and the A2A clients it opens; all closed at teardown."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.started: list[Endpoint] = []
        self.clients: list[Client] = []

    async def endpoint(self, **options: Any) -> Endpoint:
        config = ServerConfig(
            target=self.mesh.w.target,
            identities=tuple(self.mesh.served),
            grpc_listen="127.0.0.1:0",
            http_listen="127.0.0.1:0",
            **options,
        )
        endpoint = await start(config)
        self.started.append(endpoint)
        return endpoint

    def client(self, endpoint: Endpoint, token: str, binding: str, *, streaming: bool = False) -> Client:
        config = ClientConfig(
            streaming=streaming,
            supported_protocol_bindings=[binding],
            grpc_channel_factory=grpc.aio.insecure_channel,
            httpx_client=httpx.AsyncClient(timeout=30),
        )
        made = ClientFactory(config).create(endpoint.card, interceptors=[AuthInterceptor(Token(token))])
        self.clients.append(made)
        return made

    async def close(self) -> None:
        for made in self.clients:
            await made.close()
        for endpoint in self.started:
            await endpoint.stop(grace=0.5)


@pytest.fixture
async def side(mesh: Mesh) -> AsyncIterator[Side]:
    s = Side(mesh)
    yield s
    await s.close()


async def _holds(value: bool) -> bool:
    return value


def proposal(message_id: str, text: str, group: str = G) -> a2a.SendMessageRequest:
    return a2a.SendMessageRequest(
        message=a2a.Message(
            message_id=message_id, context_id=group, role=a2a.ROLE_USER, parts=[a2a.Part(text=text)]
        )
    )


async def sent(c: Client, request: a2a.SendMessageRequest) -> a2a.Task:
    responses = [r async for r in c.send_message(request)]
    assert len(responses) == 1 and responses[0].HasField("task"), responses
    return responses[0].task


def cursor_of(response: a2a.StreamResponse) -> str:
    which = response.WhichOneof("payload")
    assert which is not None
    return str(getattr(response, which).metadata.fields["mwp.cursor"].string_value)


def position(cursor: str) -> tuple[int, float]:
    """A cursor's place in the stream: ``N:K`` (part K of sequence N) comes before ``N``."""
    sequence, _, part = cursor.partition(":")
    return int(sequence), float(part) if part else float("inf")


def event_id_of(response: a2a.StreamResponse) -> str:
    which = response.WhichOneof("payload")
    assert which in ("status_update", "artifact_update"), response
    return str(getattr(response, which).metadata.fields["mwp.event_id"].string_value)


async def proposed_events(w: World) -> list[Any]:
    return [e for e in [e async for e in w.client.read_events(G)] if e.type == "work.proposed"]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_message_proposes_work_once_per_message_id(
    world: World, mesh: Mesh, side: Side, binding: str
) -> None:
    endpoint = await side.endpoint()
    ann = side.client(endpoint, mesh.tokens["ann-bot"], binding)
    task = await sent(ann, proposal("msg-1", "Reconcile the Q4 ledger\nthe bank changed its export format"))
    assert task.id.startswith(f"proposal:{G}/prop_") and task.context_id == G
    assert task.status.state == TS.TASK_STATE_SUBMITTED
    recorded = await proposed_events(world)
    assert [(e.actor_id, e.work_proposed.title, e.work_proposed.contract.goal) for e in recorded] == [
        ("ann-bot", "Reconcile the Q4 ledger", "Reconcile the Q4 ledger\nthe bank changed its export format")
    ]
    assert task.id.endswith(recorded[0].work_proposed.proposal_id)
    # The same message again: the same task, and still one command in the log.
    again = await sent(ann, proposal("msg-1", "Reconcile the Q4 ledger\nthe bank changed its export format"))
    assert again.id == task.id
    assert len(await proposed_events(world)) == 1
    # Another message id is another proposal.
    other = await sent(ann, proposal("msg-2", "Archive the Q3 statements"))
    assert other.id != task.id and len(await proposed_events(world)) == 2
    # GetTask reads it back, with the Group sequence it reflects as its cursor.
    got = await ann.get_task(a2a.GetTaskRequest(id=task.id))
    assert got.status.state == TS.TASK_STATE_SUBMITTED
    assert int(got.metadata.fields["mwp.cursor"].string_value) >= recorded[0].sequence

    # Streamed: the proposal's task first, then, live, the Coordinator authorizing it as a WorkItem,
    # after which the task is that WorkItem's.
    streaming = side.client(endpoint, mesh.tokens["ann-bot"], binding, streaming=True)
    stream = streaming.send_message(proposal("msg-3", "Draft the audit letter"))
    opened = await anext(stream)
    assert opened.HasField("task") and opened.task.status.state == TS.TASK_STATE_SUBMITTED
    proposal_id = opened.task.id.rpartition("/")[2]
    await mesh.flow.coord(
        "work_authorize",
        wp.WorkAuthorize(
            work_item_id="wi-audit",
            title="audit letter",
            contract=builders.contract(world.clock.now()),
            proposal_id=proposal_id,
            coordinator_epoch=1,
        ),
    )
    authorized = await anext(stream)
    await stream.aclose()
    assert authorized.status_update.task_id == opened.task.id
    assert authorized.status_update.metadata.fields["mwp.work_item_id"].string_value == "wi-audit"
    assert authorized.status_update.metadata.fields["mwp.state"].string_value == "WORK_ITEM_STATE_OPEN"
    await mesh.flow.offer("wi-audit", "worker-bot")
    now = await ann.get_task(a2a.GetTaskRequest(id=opened.task.id))
    assert now.metadata.fields["mwp.state"].string_value == "WORK_ITEM_STATE_OFFERED"


async def test_a_resent_message_after_an_endpoint_restart_is_the_same_task(
    world: World, mesh: Mesh, side: Side
) -> None:
    first = await side.endpoint()
    task = await sent(
        side.client(first, mesh.tokens["ann-bot"], BINDINGS[0]), proposal("msg-r", "Rotate the keys")
    )
    await first.stop(grace=0.5)
    # A new process opens a new session: the Authority sees another fingerprint under the command
    # id and refuses COMMAND_ID_REUSED; the endpoint recognises its own proposal in the log.
    second = await side.endpoint()
    ann = side.client(second, mesh.tokens["ann-bot"], BINDINGS[0])
    assert (await sent(ann, proposal("msg-r", "Rotate the keys"))).id == task.id
    assert len(await proposed_events(world)) == 1
    # The same message id with other content is the client's mistake, not a resend.
    with pytest.raises(A2AError, match="COMMAND_ID_REUSED"):
        await sent(ann, proposal("msg-r", "Something else entirely"))


async def drive_to_verified(w: World, f: Flow, work_item_id: str) -> None:
    offer_id = await f.offer(work_item_id, "worker-bot")
    epoch = await f.accept(w.worker, work_item_id, offer_id)
    await f.start(w.worker, work_item_id, epoch, f"lease-{work_item_id}")
    submitted = await f.as_(
        w.worker, "work_submit", await f.submission(w.worker, work_item_id, epoch, f"lease-{work_item_id}")
    )
    submission = decode_events(submitted.events)[0].event_id
    await f.coord(
        "work_accept_result",
        wp.WorkAcceptResult(work_item_id=work_item_id, coordinator_epoch=1, submission_event_id=submission),
    )


@pytest.mark.parametrize("binding", BINDINGS)
async def test_following_a_work_item_resumes_from_its_cursor_exactly_once(
    world: World, mesh: Mesh, side: Side, binding: str
) -> None:
    endpoint = await side.endpoint()
    f = mesh.flow
    await f.authorize("wi-1")
    await f.authorize("wi-other")  # another WorkItem of the Group: none of its events are this task's
    task_id = f"workitem:{G}/wi-1"
    ann = side.client(endpoint, mesh.tokens["ann-bot"], binding, streaming=True)
    stream = ann.subscribe(a2a.SubscribeToTaskRequest(id=task_id))
    first = await anext(stream)
    assert first.HasField("task") and first.task.status.state == TS.TASK_STATE_SUBMITTED
    assert first.task.metadata.fields["mwp.snapshot"].bool_value
    start = cursor_of(first)
    offer_id = await f.offer("wi-1", "worker-bot")
    offered = await anext(stream)
    assert offered.status_update.status.state == TS.TASK_STATE_SUBMITTED
    assert offered.status_update.metadata.fields["mwp.state"].string_value == "WORK_ITEM_STATE_OFFERED"
    await stream.aclose()  # the client goes away mid-task
    await f.offer("wi-other", "worker-bot")
    epoch = await f.accept(world.worker, "wi-1", offer_id)
    await f.start(world.worker, "wi-1", epoch, "lease-wi-1")
    submitted = await f.as_(
        world.worker, "work_submit", await f.submission(world.worker, "wi-1", epoch, "lease-wi-1")
    )
    submission = decode_events(submitted.events)[0].event_id

    # Back with the last cursor it processed: every later event once, in order, live to the end.
    resumed: list[a2a.StreamResponse] = []
    context = ClientCallContext(service_parameters={"MWP-Cursor": str(cursor_of(offered))})

    async def follow() -> None:
        async for response in ann.subscribe(a2a.SubscribeToTaskRequest(id=task_id), context=context):
            resumed.append(response)

    follower = asyncio.create_task(follow())
    # The replay reaches the submission first; the verification then arrives live, and ends the stream.
    await polled(
        lambda: _holds(
            any(
                r.HasField("status_update")
                and r.status_update.metadata.fields["mwp.state"].string_value == "WORK_ITEM_STATE_SUBMITTED"
                for r in resumed
            )
        )
    )
    await f.coord(
        "work_accept_result",
        wp.WorkAcceptResult(work_item_id="wi-1", coordinator_epoch=1, submission_event_id=submission),
    )
    await asyncio.wait_for(follower, 20)  # the stream ends at the terminal state
    assert not any(r.HasField("task") for r in resumed)
    states = [
        r.status_update.metadata.fields["mwp.state"].string_value
        for r in resumed
        if r.HasField("status_update")
    ]
    assert states == [
        "WORK_ITEM_STATE_QUEUED",
        "WORK_ITEM_STATE_ACTIVE",
        "WORK_ITEM_STATE_SUBMITTED",
        "WORK_ITEM_STATE_VERIFIED",
    ]
    assert resumed[-1].status_update.status.state == TS.TASK_STATE_COMPLETED
    # The submitted deliverable as an A2A artifact, inline (small) and named by its content hash.
    artifacts = [r.artifact_update.artifact for r in resumed if r.HasField("artifact_update")]
    assert [a.parts[0].raw for a in artifacts] == [b"the report\n"]
    assert artifacts[0].artifact_id.startswith("blake3:")
    cursors = [position(cursor_of(r)) for r in resumed]
    assert cursors == sorted(set(cursors)) and cursors[0] > position(cursor_of(offered))
    # One event became the artifact and the status: a client that stopped between them resumes
    # from the artifact's cursor and gets the status only.
    split = next(r for r in resumed if r.HasField("artifact_update"))
    assert ":" in cursor_of(split)
    rest = [
        r
        async for r in ann.subscribe(
            a2a.SubscribeToTaskRequest(id=task_id),
            context=ClientCallContext(service_parameters={"MWP-Cursor": cursor_of(split)}),
        )
    ]
    assert [event_id_of(r) for r in rest] == [event_id_of(r) for r in resumed[resumed.index(split) + 1 :]]
    assert (
        rest[0].HasField("status_update")
        and rest[0].status_update.metadata.fields["mwp.state"].string_value == "WORK_ITEM_STATE_SUBMITTED"
    )

    # The whole history from the first snapshot's cursor: the two pieces above, nothing more or less.
    replay = [
        r
        async for r in ann.subscribe(
            a2a.SubscribeToTaskRequest(id=task_id),
            context=ClientCallContext(service_parameters={"MWP-Cursor": str(start)}),
        )
    ]
    assert [event_id_of(r) for r in replay] == [event_id_of(offered)] + [event_id_of(r) for r in resumed]
    # A terminal task has nothing left to follow: A2A's answer without a cursor.
    with pytest.raises(A2AError, match="terminal"):
        _ = [r async for r in ann.subscribe(a2a.SubscribeToTaskRequest(id=task_id))]


async def test_a_cursor_older_than_the_window_gets_a_flagged_snapshot_then_the_tail(
    world: World, mesh: Mesh, side: Side
) -> None:
    endpoint = await side.endpoint(replay_window=2)
    f = mesh.flow
    await f.authorize("wi-1")
    await f.authorize("wi-2")
    ann = side.client(endpoint, mesh.tokens["ann-bot"], BINDINGS[0], streaming=True)
    context = ClientCallContext(service_parameters={"MWP-Cursor": "1"})
    stream = ann.subscribe(a2a.SubscribeToTaskRequest(id=f"mission:{G}"), context=context)
    snapshot = await anext(stream)
    meta = snapshot.task.metadata.fields
    assert meta["mwp.snapshot"].bool_value and meta["mwp.cursor_too_old"].bool_value
    assert meta["mwp.requested_cursor"].string_value == "1"
    assert snapshot.task.status.state == TS.TASK_STATE_WORKING
    head = (await world.client.group_state(G)).head_sequence
    assert cursor_of(snapshot) == str(head)
    await f.offer("wi-2", "worker-bot")
    live = await anext(stream)
    assert cursor_of(live) == str(head + 1)
    assert live.status_update.metadata.fields["mwp.work_item_state"].string_value == "WORK_ITEM_STATE_OFFERED"
    await stream.aclose()
    # Within the window the same request replays instead.
    recent = ann.subscribe(
        a2a.SubscribeToTaskRequest(id=f"mission:{G}"),
        context=ClientCallContext(service_parameters={"MWP-Cursor": str(head)}),
    )
    replayed = await anext(recent)
    assert replayed.HasField("status_update") and cursor_of(replayed) == str(head + 1)
    await recent.aclose()


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_non_member_sees_nothing_and_a_bad_token_is_refused(
    world: World, mesh: Mesh, side: Side, binding: str
) -> None:
    endpoint = await side.endpoint()
    await mesh.flow.authorize("wi-1")
    outsider = side.client(endpoint, mesh.tokens["outsider"], binding)
    for task_id in (f"mission:{G}", f"workitem:{G}/wi-1"):
        with pytest.raises(TaskNotFoundError):
            await outsider.get_task(a2a.GetTaskRequest(id=task_id))
    assert list((await outsider.list_tasks(a2a.ListTasksRequest())).tasks) == []
    with pytest.raises(TaskNotFoundError, match="NOT_A_MEMBER"):
        await sent(outsider, proposal("msg-x", "let me in"))
    assert await proposed_events(world) == []
    # A member lists the Mission and its WorkItem.
    ann = side.client(endpoint, mesh.tokens["ann-bot"], binding)
    listed = await ann.list_tasks(a2a.ListTasksRequest())
    assert [(t.id, t.status.state) for t in listed.tasks] == [
        (f"mission:{G}", TS.TASK_STATE_WORKING),
        (f"workitem:{G}/wi-1", TS.TASK_STATE_SUBMITTED),
    ]
    first_page = await ann.list_tasks(a2a.ListTasksRequest(page_size=1))
    assert [t.id for t in first_page.tasks] == [f"mission:{G}"] and first_page.total_size == 2
    second_page = await ann.list_tasks(
        a2a.ListTasksRequest(page_size=1, page_token=first_page.next_page_token)
    )
    assert [t.id for t in second_page.tasks] == [f"workitem:{G}/wi-1"] and not second_page.next_page_token
    working = await ann.list_tasks(a2a.ListTasksRequest(status=TS.TASK_STATE_WORKING))
    assert [t.id for t in working.tasks] == [f"mission:{G}"]
    # No token or a wrong one: the transport's own refusal (HTTP 401, gRPC UNAUTHENTICATED), before
    # any handler runs; the endpoint's own answer would be an A2A error.
    for token in ("not-a-token", ""):
        stranger = side.client(endpoint, token, binding)
        with pytest.raises(A2AClientError) as refused:
            await stranger.get_task(a2a.GetTaskRequest(id=f"mission:{G}"))
        expected = "401" if binding == TransportProtocol.JSONRPC else "UNAUTHENTICATED"
        assert expected in str(refused.value), refused.value


async def test_cancel_is_what_the_identity_may_do(world: World, mesh: Mesh, side: Side) -> None:
    # olga owns a Mission of her own (signed before the endpoint takes her session over).
    olga = await world.client.open_session("olga", read_key(mesh.tmp / "olga.key"))
    await world.run(
        olga, G2, "mission_create", builders.mission_create("olga", "coord-bot", world.clock.now())
    )
    endpoint = await side.endpoint()
    await mesh.flow.authorize("wi-1")
    ann = side.client(endpoint, mesh.tokens["ann-bot"], BINDINGS[0])
    # A Worker may cancel neither a WorkItem (the Coordinator's) nor the Mission (its owner's).
    with pytest.raises(TaskNotCancelableError, match="PERMISSION_DENIED"):
        await ann.cancel_task(a2a.CancelTaskRequest(id=f"workitem:{G}/wi-1"))
    with pytest.raises(TaskNotCancelableError, match="PERMISSION_DENIED"):
        await ann.cancel_task(a2a.CancelTaskRequest(id=f"mission:{G}"))
    assert (await world.client.work_item(G, "wi-1")).state == wp.WORK_ITEM_STATE_OPEN
    # The MissionOwner cancels hers: mission.cancel, signed as olga.
    owner = side.client(endpoint, mesh.tokens["olga"], BINDINGS[1])
    cancelled = await owner.cancel_task(a2a.CancelTaskRequest(id=f"mission:{G2}"))
    assert cancelled.status.state == TS.TASK_STATE_CANCELED
    assert (await world.client.group_state(G2)).mission.state == mission_pb2.MISSION_STATE_CANCELLED
    with pytest.raises(TaskNotCancelableError, match="already"):
        await owner.cancel_task(a2a.CancelTaskRequest(id=f"mission:{G2}"))


async def test_events_that_do_not_verify_are_never_served(world: World, mesh: Mesh, side: Side) -> None:
    endpoint = await side.endpoint()
    ann = side.client(endpoint, mesh.tokens["ann-bot"], BINDINGS[0])
    assert (await ann.get_task(a2a.GetTaskRequest(id=f"mission:{G}"))).status.state == TS.TASK_STATE_WORKING
    # The endpoint checks every event against the Authority key it holds; with another key nothing
    # the mesh sends passes, and the task is refused rather than served unverified.
    impostor = SigningKey.generate()
    endpoint._identities["ann-bot"].verifier = AuthorityVerifier(
        "authority#other", bytes(impostor.verify_key)
    )
    await mesh.flow.authorize("wi-new")  # a new event: what the first answer covered was verified then
    with pytest.raises(A2AError, match="did not verify"):
        await ann.get_task(a2a.GetTaskRequest(id=f"mission:{G}"))


async def test_the_agent_card_declares_the_skills_bindings_and_bearer_security(
    mesh: Mesh, side: Side
) -> None:
    endpoint = await side.endpoint()
    async with httpx.AsyncClient() as http:
        public = await A2ACardResolver(http, f"http://127.0.0.1:{endpoint.http_port}").get_agent_card()
    assert [s.id for s in public.skills] == ["propose-work", "follow-mission", "follow-work-item"]
    assert {i.protocol_binding for i in public.supported_interfaces} == {"GRPC", "JSONRPC"}
    assert public.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert public.capabilities.streaming and public.capabilities.extended_agent_card
    extended = await side.client(endpoint, mesh.tokens["ann-bot"], BINDINGS[0]).get_extended_agent_card(
        a2a.GetExtendedAgentCardRequest()
    )
    assert [s.id for s in extended.skills] == [s.id for s in public.skills]


@pytest.mark.topologies("single")
async def test_tls_towards_a2a_clients_on_both_bindings(mesh: Mesh, side: Side, tmp_path: Path) -> None:
    from missionweave_server.mesh import certs

    ca = certs.new_ca("a2a test CA")
    cert, key = certs.issue(ca, "a2a-server", hosts=["127.0.0.1"]).write(tmp_path / "tls", "a2a")
    endpoint = await side.endpoint(tls_cert=cert, tls_key=key)
    assert {
        i.url.split(":")[0] for i in endpoint.card.supported_interfaces if i.protocol_binding == "JSONRPC"
    } == {"https"}
    trusted = ssl.create_default_context(cadata=ca.cert_pem.decode())
    for binding in BINDINGS:
        config = ClientConfig(
            streaming=False,
            supported_protocol_bindings=[binding],
            grpc_channel_factory=lambda url: grpc.aio.secure_channel(
                url, grpc.ssl_channel_credentials(ca.cert_pem)
            ),
            httpx_client=httpx.AsyncClient(verify=trusted, timeout=30),
        )
        tls_client = ClientFactory(config).create(
            endpoint.card, interceptors=[AuthInterceptor(Token(mesh.tokens["ann-bot"]))]
        )
        side.clients.append(tls_client)
        task = await tls_client.get_task(a2a.GetTaskRequest(id=f"mission:{G}"))
        assert task.status.state == TS.TASK_STATE_WORKING
    # Plain text is not served on a TLS endpoint.
    plain = side.client(endpoint, mesh.tokens["ann-bot"], BINDINGS[0])
    with pytest.raises(A2AClientError):
        await plain.get_task(a2a.GetTaskRequest(id=f"mission:{G}"), context=ClientCallContext(timeout=5))


async def test_a_large_artifact_is_a_reference_by_content_hash(world: World, mesh: Mesh, side: Side) -> None:
    endpoint = await side.endpoint(inline_bytes=4)  # the 11-byte report is "large" here
    f = mesh.flow
    await f.authorize("wi-1")
    offer_id = await f.offer("wi-1", "worker-bot")
    epoch = await f.accept(world.worker, "wi-1", offer_id)
    await f.start(world.worker, "wi-1", epoch, "lease-wi-1")
    body = await f.submission(world.worker, "wi-1", epoch, "lease-wi-1")
    await f.as_(world.worker, "work_submit", body)
    ann = side.client(endpoint, mesh.tokens["ann-bot"], BINDINGS[1])
    task = await ann.get_task(a2a.GetTaskRequest(id=f"workitem:{G}/wi-1"))
    assert task.status.state == TS.TASK_STATE_WORKING  # submitted, awaiting review
    (artifact,) = task.artifacts
    digest = body.artifacts[0].digest
    assert artifact.parts[0].url == f"mwp://artifacts/blake3/{digest.hex}" and not artifact.parts[0].raw
    assert artifact.metadata.fields["mwp.digest"].string_value == f"blake3:{digest.hex}"
    assert artifact.metadata.fields["mwp.size_bytes"].string_value == str(digest.size_bytes)


async def test_get_task_reads_only_what_came_since_its_last_answer(
    world: World, mesh: Mesh, side: Side
) -> None:
    """A client polling GetTask costs the events since its previous answer, and still sees every
    change: the second read starts at the first answer's cursor."""
    endpoint = await side.endpoint()
    f = mesh.flow
    await f.authorize("wi-1")
    ann = side.client(endpoint, mesh.tokens["ann-bot"], "JSONRPC")
    handler = endpoint.handler
    reads: list[tuple[str, int]] = []
    original = handler._batches

    def recording(acting: Any, group_id: str, after: int, follow: bool) -> Any:
        reads.append((acting.identity_id, after))
        return original(acting, group_id, after, follow)

    handler._batches = recording  # type: ignore[method-assign]
    task_id = f"workitem:{G}/wi-1"
    first = await ann.get_task(a2a.GetTaskRequest(id=task_id))
    assert first.status.state == TS.TASK_STATE_SUBMITTED
    covered = int(first.metadata.fields["mwp.cursor"].string_value)
    offer_id = await f.offer("wi-1", "worker-bot")
    epoch = await f.accept(world.worker, "wi-1", offer_id)
    await f.start(world.worker, "wi-1", epoch, "lease-wi-1")
    second = await ann.get_task(a2a.GetTaskRequest(id=task_id))
    assert second.status.state == TS.TASK_STATE_WORKING
    assert reads == [("ann-bot", 0), ("ann-bot", covered)]
    # Another identity's fold is its own: the outsider reads from the start, and is refused.
    outsider = side.client(endpoint, mesh.tokens["outsider"], "JSONRPC")
    with pytest.raises(A2AError):
        await outsider.get_task(a2a.GetTaskRequest(id=task_id))
    assert reads[-1] == ("outsider", 0)
