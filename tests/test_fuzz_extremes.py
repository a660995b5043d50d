"""Every numeric and enum field at its extremes, through every public RPC, in both topologies
(issue 40 part 5).

The fields come from the protobuf descriptors (tests/extremes.py): for each RPC a valid baseline
request, authenticated as a real client is (call proofs, commands and other signed payloads signed
by the world's session keys), then each numeric, enum, Duration and Timestamp field reachable in it
(recursively, and inside signed payloads: Commands, HELLO and call proofs, identity, session and
Agent Card requests, re-signed after each change) set to each extreme in turn: 0, -1, its type's
limits, enum values past the last defined and negative, Durations and Timestamps at and past their
limits, counts, offsets and lengths past the end.

Each answer must be structured: never UNKNOWN or INTERNAL, never silence past the deadline, a
refusal carries a Rejection whose reason's documented gRPC code is the status, in-band rejections
carry a reason, and nothing is logged at error level or with a traceback. Afterwards every read of
every Group the run touched still answers (an accepted extreme must not poison what is stored).

Every baseline is accepted (so that each extreme is judged past the first checks), unless it is in
BASELINES_REFUSED with its reason; the run fails on any other refused baseline, and on an entry
whose baseline is accepted again. Each field whose comment says what 0, unset or empty means
(tools/check_contracts.py finds them) and that a client sends is sent so through an accepted
baseline that already holds it, and must not be refused as invalid (MALFORMED, INVALID_ARGUMENT).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from nacl.signing import SigningKey

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.manifest import sign_manifest
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import (
    AGENT_CARD_TYPE,
    OPEN_SESSION_TYPE,
    REGISTER_IDENTITY_TYPE,
    session_key_id,
    sign_envelope,
)
from missionweave.kernel.transport import open_channel
from missionweave.sdk.client import SessionSigner, blob_digest, decode_events
from missionweave.sdk.credentials import CallProofs
from missionweave.v1 import (
    agent_card_pb2,
    artifact_service_pb2,
    auth_pb2,
    authority_service_pb2,
    command_pb2,
    common_pb2,
    conversation_pb2,
    gateway_service_pb2,
    membership_pb2,
    membership_service_pb2,
    mission_pb2,
    scheduling_service_pb2,
    subtask_pb2,
)
from missionweave.v1 import gateway_service_pb2 as gpb
from missionweave.v1 import scheduling_service_pb2_grpc as sch_grpc
from missionweave.v1 import work_pb2 as wp
from missionweave_server.edge.callers import CALL_PROOF_METADATA, CALL_PROOF_TYPE
from tests import builders
from tests.conftest import World, register
from tests.extremes import (
    DURATION,
    TIMESTAMP,
    Outcome,
    Path,
    extremes,
    invoke,
    leaf_paths,
    mutated,
    problem,
    sampled,
)
from tests.test_artifact_authorization import manifest_in
from tests.test_gateway import hello
from tools.check_contracts import documented_at_zero

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

G = "grp_fuzz"
DEADLINE_S = 8.0  # above the longest wait any RPC documents (Admit reads a Group for at most 5 s)
# At most this many extremes per field (chosen deterministically; every field keeps some).
PER_FIELD = int(os.environ.get("MWP_FUZZ_PER_FIELD", "4"))
HELLO_TYPE = "application/vnd.missionweave.v1.hello-proof+protobuf"
LONG = 3600
# Command kinds whose command creates its Group: sent with membership epoch 0 (command.proto).
CREATING = {"mission_create", "mission_create_follow_up", "mission_create_child"}

SERVICES = {
    "AuthorityService": authority_service_pb2,
    "MembershipService": membership_service_pb2,
    "ArtifactService": artifact_service_pb2,
    "SchedulingService": scheduling_service_pb2,
    "GatewayService": gateway_service_pb2,
}


def method(rpc: str) -> MethodDescriptor:
    service, name = rpc.split(".")
    return SERVICES[service].DESCRIPTOR.services_by_name[service].methods_by_name[name]  # type: ignore[no-any-return]


# ------------------------------------------------------------ logs


class ErrorLog(logging.Handler):
    """Records at error level or with a traceback, from anywhere in the process (the split
    topology's services run in this process too)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)

    def take(self) -> list[str]:
        out = [f"{r.levelname} {r.name}: {r.getMessage()[:200]}{_where(r)}" for r in self.records]
        self.records.clear()
        return out


def _where(record: logging.LogRecord) -> str:
    """The exception and the innermost frame of the project that raised it."""
    if not record.exc_info or record.exc_info[1] is None:
        return ""
    err = record.exc_info[1]
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "site-packages" not in f.filename]
    where = f" at {frames[-1].filename.split('/work/main/')[-1]}:{frames[-1].lineno}" if frames else ""
    return f" [{type(err).__name__}: {str(err)[:160]}{where}]"


@pytest.fixture
def error_log() -> Iterator[ErrorLog]:
    handler = ErrorLog()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


# ------------------------------------------------------------ the scene


@dataclass
class Scene:
    """G with its owner, Coordinator and a Worker member; WorkItems made on demand in each state."""

    w: World
    epochs: dict[str, int] = field(default_factory=dict)
    n: int = 0
    groups: set[str] = field(default_factory=set)
    blob: common_pb2.Digest = field(default_factory=common_pb2.Digest)
    snapshot: common_pb2.Digest = field(default_factory=common_pb2.Digest)
    planning: str = ""
    mission_id: str = ""

    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}-{self.n}"

    def now(self) -> Any:
        return self.w.clock.now()

    def ts(self, seconds: int = LONG) -> Any:
        return to_timestamp(self.now() + timedelta(seconds=seconds))

    def definition(self, owner: str = "alice") -> mission_pb2.MissionDefinition:
        budget = common_pb2.ResourceVector(
            currency="EUR", financial_micros=10**12, tokens=10**12, tool_calls=10**9
        )
        return builders.definition(owner, self.now(), budget=budget)

    def renewal(self, lease_s: int = LONG) -> mission_pb2.RenewalPolicy:
        policy = mission_pb2.RenewalPolicy()
        policy.lease_duration.FromSeconds(lease_s)
        policy.renew_before.FromSeconds(min(60, lease_s - 1))
        return policy

    def contract(self) -> wp.WorkContract:
        c = builders.contract(
            self.now(),
            budget=common_pb2.ResourceVector(currency="EUR", financial_micros=10, tokens=10, tool_calls=1),
        )
        c.deadline.CopyFrom(self.ts(2 * LONG))
        c.time_policy.execution_lease_duration.FromSeconds(LONG)
        c.time_policy.start_deadline.FromSeconds(LONG)
        # Every part whose fields are documented at 0 or unset is present, so that each is sent so
        # through an accepted baseline (tools/check_contracts.py lists them).
        c.time_policy.attempt_time_limit.FromSeconds(4 * LONG)
        c.time_policy.offline_grace_period.FromSeconds(60)
        c.retry_policy.initial_backoff.FromSeconds(2)
        c.retry_policy.max_backoff.FromSeconds(60)
        c.retry_policy.backoff_multiplier_milli = 3000
        c.resource_constraints.CopyFrom(
            wp.ResourceConstraints(
                max_memory_bytes=2**30,
                max_cpu_millicores=1000,
                max_accelerators=1,
                max_storage_bytes=2**30,
                max_parallel_slots=1,
            )
        )
        c.dependency_policy.CopyFrom(
            wp.DependencyPolicy(kind=wp.DEPENDENCY_POLICY_KIND_MIN_VERIFIED, min_verified=1)
        )
        return c

    async def run(
        self, signer: SessionSigner, kind: str, body: Message, group: str = G
    ) -> command_pb2.CommandResult:
        epoch = (
            self.epochs.get(signer.identity_id, 0)
            if group == G
            else await self.w.epoch_of(group, signer.identity_id)
        )
        return await patient(lambda: self.w.run(signer, group, kind, body, membership_epoch=epoch))

    async def mission(self, group: str, lease_s: int = LONG) -> None:
        body = mission_pb2.MissionCreate(definition=self.definition(), coordinator_id="coord-bot")
        body.coordinator_renewal.CopyFrom(self.renewal(lease_s))
        await patient(lambda: self.w.run(self.w.owner, group, "mission_create", body))
        self.groups.add(group)

    async def open_item(self) -> str:
        item = self.fresh("wi")
        body = wp.WorkAuthorize(work_item_id=item, title=item, contract=self.contract(), coordinator_epoch=1)
        await self.run(self.w.coordinator, "work_authorize", body)
        return item

    async def offered_item(self) -> tuple[str, str]:
        item = await self.open_item()
        offer = self.fresh("offer")
        body = wp.WorkOffer(
            work_item_id=item,
            offer_id=offer,
            candidate_ids=["worker-bot"],
            expires_at=self.ts(),
            selection_criteria=[builders.selection("worker-bot")],
            coordinator_epoch=1,
        )
        await self.run(self.w.coordinator, "work_offer", body)
        return item, offer

    async def queued_item(self) -> tuple[str, int]:
        item, offer = await self.offered_item()
        result = await self.run(
            self.w.worker,
            "work_accept_offer",
            wp.WorkAcceptOffer(work_item_id=item, offer_id=offer, contract_revision=1),
        )
        return item, int(decode_events(result.events)[0].work_offer_accepted.ownership.ownership_epoch)

    async def approved_group(self) -> tuple[str, str]:
        """A Group of its own whose Mission is approved: (group, mission id)."""
        group = self.fresh("grp_fuzz_approved")
        await self.mission(group)
        m = (await self.w.client.group_state(group)).mission
        submit = mission_pb2.MissionSubmitForApproval(
            coordinator_epoch=1, mission_revision=m.revision, summary="done"
        )
        await self.run(self.w.coordinator, "mission_submit_for_approval", submit, group)
        m = (await self.w.client.group_state(group)).mission
        approve = mission_pb2.MissionApprove(submission_event_id=m.latest_submission_event_id, comment="fine")
        await self.run(self.w.owner, "mission_approve", approve, group)
        return group, m.mission_id

    async def lapsed_group(self) -> str:
        """A Group of its own whose Coordinator lease has lapsed (the clock moves past its 5 s; the
        scene's other leases last an hour)."""
        group = self.fresh("grp_fuzz_lapsed")
        await self.mission(group, lease_s=5)
        self.w.clock.advance(seconds=6)
        return group

    async def deliverable(self, item: str) -> common_pb2.ArtifactRef:
        """A blob the Worker uploaded with its manifest for this Mission and WorkItem (D161)."""
        data = f"fuzz: deliverable of {item}".encode()
        manifest = artifact_service_pb2.ArtifactManifest(
            content_digest=blob_digest(data),
            media_type="text/plain",
            producer_agent_id="worker-bot",
            agent_card_version="1.0.0",
            mission_id=self.mission_id,
            group_id=G,
            work_item_id=item,
            created_at=to_timestamp(self.now()),
            classification=artifact_service_pb2.DATA_CLASSIFICATION_INTERNAL,
            size_bytes=len(data),
            retrieval_uri="mwp://mesh/fuzz",
            schema=artifact_service_pb2.ArtifactSchema(schema_id="none"),
            components=[
                artifact_service_pb2.ComponentVersion(
                    kind=artifact_service_pb2.COMPONENT_KIND_TOOL, name="fuzz", version="1.0.0"
                )
            ],
        )
        worker = self.w.worker
        envelope = sign_manifest(
            manifest,
            hashlib.sha256(data).hexdigest(),
            worker.key,
            session_key_id(worker.identity_id, worker.session_epoch),
        )
        client = _reader(self.w, worker)
        try:
            await client.upload(data, envelope)
        finally:
            await client.channel.close()
        return common_pb2.ArtifactRef(digest=blob_digest(data), media_type="text/plain")

    async def active_item(self) -> tuple[str, int, str]:
        item, epoch = await self.queued_item()
        lease = self.fresh("lease")
        await self.run(
            self.w.worker,
            "work_start",
            wp.WorkStart(work_item_id=item, ownership_epoch=epoch, lease_id=lease),
        )
        return item, epoch, lease


T = TypeVar("T")


def overloaded(outcome: Outcome) -> float | None:
    """The delay an OVERLOADED refusal asks for (a Group's command rate: the run sends faster), or None."""
    rejection = outcome.rejection
    if rejection is None or rejection.reason != common_pb2.REJECTION_REASON_OVERLOADED:
        return None
    return int(rejection.metadata.get("retry_after_ms", "50")) / 1000


async def patient(call: Callable[[], Awaitable[T]]) -> T:
    """A set-up command, sent again while its Group is over its command rate."""
    for _ in range(50):
        try:
            return await call()
        except grpc.aio.AioRpcError as err:
            delay = overloaded(Outcome(err.code(), rejection=rejection_from_rpc_error(err)))
            if delay is None:
                raise
            await asyncio.sleep(delay)
    return await call()


async def scene(w: World) -> Scene:
    s = Scene(w)
    await s.mission(G)
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await patient(lambda: w.run(w.owner, G, "membership_grant", grant, membership_epoch=1))
    # A work_delegate member, the grantee of membership.grant_delegation (MW-9.1-02).
    await register(w.client, w.keys["admin"], "delegate-bot", common_pb2.IDENTITY_KIND_AGENT)
    delegate = membership_pb2.MembershipGrant(
        member_id="delegate-bot", role=membership_pb2.MEMBER_ROLE_WORK_DELEGATE
    )
    await patient(lambda: w.run(w.owner, G, "membership_grant", delegate, membership_epoch=1))
    for signer in (w.owner, w.coordinator, w.worker):
        s.epochs[signer.identity_id] = await w.epoch_of(G, signer.identity_id)
    state = await w.client.group_state(G)
    s.planning, s.mission_id = state.mission.planning_conversation_id, state.mission.mission_id
    worker = _reader(w, w.worker)
    try:
        # Slots enough for NextSlot's fuzzing to place work and ReleaseSlot's baselines still to find a free one.
        await worker.publish_agent_card(agent_card_pb2.AgentCard(card_version="1.0.0", max_concurrency=64))
    finally:
        await worker.channel.close()
    coordinator = _reader(w, w.coordinator)
    try:
        source = b"fuzz: the source"
        await coordinator.upload(source, manifest_in(w, w.coordinator, source, group=G))
        s.blob = blob_digest(source)
    finally:
        await coordinator.channel.close()
    admin = _reader(w, w.admin)
    try:
        taken = await admin.authority.TakeSnapshot(authority_service_pb2.TakeSnapshotRequest(group_id=G))
        s.snapshot = taken.digest
    finally:
        await admin.channel.close()
    return s


def _reader(w: World, signer: SessionSigner) -> Any:
    from missionweave.sdk.client import MeshClient

    return MeshClient(w.target, reader=signer)


# ------------------------------------------------------------ targets

Send = Callable[[Message], Awaitable[Outcome]]


@dataclass
class Target:
    """One RPC's baseline: the message fuzzed (the request, or a payload signed inside it), how it
    is sent, and how a new baseline is made once an accepted extreme used the old one up."""

    rpc: str
    what: str
    prepare: Callable[[], Awaitable[Message]]
    send: Send
    renew_on_accept: bool = False
    may_time_out: Callable[[Path | None, Any], bool] = lambda path, value: False
    skip: Callable[[Path], bool] = lambda path: False
    per_field: dict[str, int] = field(default_factory=dict)  # fewer extremes for a slow field


@dataclass
class Channels:
    w: World
    by_signer: dict[str, grpc.aio.Channel] = field(default_factory=dict)
    plain: grpc.aio.Channel | None = None

    def of(self, signer: SessionSigner | None) -> grpc.aio.Channel:
        if signer is None:
            if self.plain is None:
                self.plain = open_channel(self.w.target)
            return self.plain
        if signer.identity_id not in self.by_signer:
            self.by_signer[signer.identity_id] = open_channel(
                self.w.target, interceptors=CallProofs(self.w.target, signer).interceptors
            )
        return self.by_signer[signer.identity_id]

    async def close(self) -> None:
        for channel in [*self.by_signer.values(), *([self.plain] if self.plain else [])]:
            await channel.close()


def request_target(
    c: Channels, rpc: str, signer: SessionSigner | None, build: Callable[[], Message], **kw: Any
) -> Target:
    m = method(rpc)

    async def prepare() -> Message:
        return build()

    async def send(request: Message) -> Outcome:
        return await invoke(c.of(signer), m, [request], deadline_s=DEADLINE_S)

    return Target(rpc, m.input_type.name, prepare, send, **kw)


# ---- commands


@dataclass
class CommandBase:
    signer: SessionSigner
    group: str
    kind: str
    body: Message
    fresh: Callable[[command_pb2.Command], None] = lambda c: None


def command_targets(s: Scene, c: Channels) -> list[Target]:
    w = s.w
    owner, coord, worker = w.owner, w.coordinator, w.worker
    targets: list[Target] = []

    def add(kind: str, make: Callable[[], Awaitable[CommandBase]], renew: bool = False) -> None:
        base: dict[str, CommandBase] = {}

        async def prepare() -> Message:
            b = await make()
            base["b"] = b
            epoch = s.epochs.get(b.signer.identity_id, 0) if b.group == G else 0
            if b.group not in (G,) and b.kind != "mission_create" and b.group in s.groups:
                epoch = await w.epoch_of(b.group, b.signer.identity_id)
            if (
                b.kind in CREATING
            ):  # the command creates its Group (a fresh id at each send): no Membership yet
                epoch = 0
            return w.command(b.signer, b.group, b.kind, b.body, membership_epoch=epoch)

        async def send(command: Message) -> Outcome:
            b = base["b"]
            assert isinstance(command, command_pb2.Command)
            command.command_id = s.fresh("cmd")
            b.fresh(command)
            return await execute(c, b.signer.sign(command))

        # The envelope's own fields (epochs, issued_at, expected revision) are fuzzed on message_post.
        def skip(path: Path) -> bool:
            return kind != "message_post" and path.fields[0].containing_oneof is None

        targets.append(
            Target(
                "AuthorityService.ExecuteCommand",
                f"Command.{kind}",
                prepare,
                send,
                renew_on_accept=renew,
                skip=skip,
            )
        )

    def base(
        signer: SessionSigner,
        kind: str,
        body: Message,
        group: str = G,
        fresh: Callable[[command_pb2.Command], None] | None = None,
    ) -> Callable[[], Awaitable[CommandBase]]:
        async def make() -> CommandBase:
            return CommandBase(signer, group, kind, body, fresh or (lambda c: None))

        return make

    def new_group(command: command_pb2.Command) -> None:
        command.group_id = s.fresh("grp_fuzz_new")

    # Envelope fields (session and membership epochs, issued_at, expected revision) on a plain post.
    async def post() -> CommandBase:
        return CommandBase(coord, G, "message_post", builders.message(s.planning, "hello"))

    add("message_post", post)
    create = mission_pb2.MissionCreate(
        definition=s.definition(), coordinator_id="coord-bot", coordinator_renewal=s.renewal()
    )
    add("mission_create", base(owner, "mission_create", create, fresh=new_group))

    async def follow_up() -> CommandBase:
        approved_group, approved_mission = await s.approved_group()
        body = mission_pb2.MissionCreateFollowUp(
            approved_mission_id=approved_mission,
            approved_group_id=approved_group,
            definition=s.definition(),
            coordinator_id="coord-bot",
            coordinator_renewal=s.renewal(),
            reason="more",
        )
        return CommandBase(owner, "grp_unused", "mission_create_follow_up", body, new_group)

    add("mission_create_follow_up", follow_up, renew=True)

    async def child() -> CommandBase:
        item = await s.open_item()
        definition = s.definition("coord-bot")
        definition.budget.CopyFrom(
            common_pb2.ResourceVector(currency="EUR", financial_micros=1, tokens=1, tool_calls=1)
        )
        definition.deadline.CopyFrom(s.ts(LONG))
        definition.risk_policy.execution_approver_ids.append("alice")  # the parent's approvers (MW-14-04)
        body = subtask_pb2.MissionCreateChild(
            parent_mission_id=s.mission_id,
            parent_group_id=G,
            parent_work_item_id=item,
            definition=definition,
            coordinator_id="worker-bot",
            coordinator_renewal=s.renewal(),
            parent_coordinator_epoch=1,
        )
        return CommandBase(coord, "grp_unused", "mission_create_child", body, new_group)

    add("mission_create_child", child, renew=True)

    async def own_group(
        kind: str, signer: SessionSigner, body: Callable[[str], Awaitable[Message]]
    ) -> CommandBase:
        group = s.fresh("grp_fuzz_own")
        await s.mission(group)
        return CommandBase(signer, group, kind, await body(group))

    async def submission(group: str) -> Message:
        m = (await w.client.group_state(group)).mission
        return mission_pb2.MissionSubmitForApproval(
            coordinator_epoch=1, mission_revision=m.revision, summary="done"
        )

    add(
        "mission_submit_for_approval",
        lambda: own_group("mission_submit_for_approval", coord, submission),
        renew=True,
    )

    async def terminate(group: str) -> Message:
        return mission_pb2.MissionTerminate(coordinator_epoch=1, reason="stop")

    add("mission_terminate", lambda: own_group("mission_terminate", coord, terminate), renew=True)
    add(
        "mission_renew_coordinator_lease",
        base(
            coord,
            "mission_renew_coordinator_lease",
            mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=1),
        ),
    )

    async def replace() -> CommandBase:
        body = mission_pb2.MissionReplaceCoordinator(
            coordinator_id="worker-bot", replaced_coordinator_epoch=1, coordinator_renewal=s.renewal()
        )
        return CommandBase(owner, await s.lapsed_group(), "mission_replace_coordinator", body)

    add("mission_replace_coordinator", replace, renew=True)

    async def acknowledge() -> CommandBase:
        group = await s.lapsed_group()
        replace = mission_pb2.MissionReplaceCoordinator(
            coordinator_id="worker-bot", replaced_coordinator_epoch=1, coordinator_renewal=s.renewal()
        )
        await s.run(owner, "mission_replace_coordinator", replace, group)
        head = (await w.client.group_state(group)).head_sequence
        return CommandBase(
            worker,
            group,
            "mission_acknowledge_reconciliation",
            mission_pb2.MissionAcknowledgeReconciliation(coordinator_epoch=2, group_revision=head),
        )

    add("mission_acknowledge_reconciliation", acknowledge, renew=True)

    async def depth() -> CommandBase:
        item = await s.open_item()
        body = subtask_pb2.MissionApproveChildDepth(parent_work_item_id=item, max_depth=3, reason="deep")
        return CommandBase(owner, G, "mission_approve_child_depth", body)

    add("mission_approve_child_depth", depth, renew=True)

    async def transfer() -> CommandBase:  # the owner of both Groups (MW-13.3-07)
        target = s.fresh("grp_fuzz_target")
        await s.mission(target)
        body = mission_pb2.MissionAuthorizeContextTransfer(
            target_group_id=target, work_item_ids=[await s.open_item()], reason="share"
        )
        return CommandBase(owner, G, "mission_authorize_context_transfer", body)

    add("mission_authorize_context_transfer", transfer, renew=True)

    async def propose() -> CommandBase:
        body = wp.WorkPropose(proposal_id="p", title="a proposal", contract=s.contract(), rationale="why")

        def fresh(command: command_pb2.Command) -> None:
            if (
                command.work_propose.proposal_id
            ):  # empty: derived from the Group and command ids (the field's documented 0)
                command.work_propose.proposal_id = s.fresh("prop")

        return CommandBase(worker, G, "work_propose", body, fresh)

    add("work_propose", propose)

    async def authorize() -> CommandBase:
        body = wp.WorkAuthorize(
            work_item_id="wi", title="an item", contract=s.contract(), coordinator_epoch=1
        )

        def fresh(command: command_pb2.Command) -> None:
            if (
                command.work_authorize.work_item_id
            ):  # empty: derived from the Group and command ids (the field's documented 0)
                command.work_authorize.work_item_id = s.fresh("wi-auth")

        return CommandBase(coord, G, "work_authorize", body, fresh)

    add("work_authorize", authorize)

    async def offer() -> CommandBase:
        item = await s.open_item()
        body = wp.WorkOffer(
            work_item_id=item,
            offer_id="o",
            candidate_ids=["worker-bot"],
            expires_at=s.ts(),
            selection_criteria=[builders.selection("worker-bot")],
            coordinator_epoch=1,
        )

        def fresh(command: command_pb2.Command) -> None:
            if (
                command.work_offer.offer_id
            ):  # empty: derived from the Group and command ids (the field's documented 0)
                command.work_offer.offer_id = s.fresh("offer")

        return CommandBase(coord, G, "work_offer", body, fresh)

    add("work_offer", offer, renew=True)

    async def accept() -> CommandBase:
        item, offer_id = await s.offered_item()
        return CommandBase(
            worker,
            G,
            "work_accept_offer",
            wp.WorkAcceptOffer(work_item_id=item, offer_id=offer_id, contract_revision=1),
        )

    add("work_accept_offer", accept, renew=True)

    async def decline() -> CommandBase:
        item, offer_id = await s.offered_item()
        body = wp.WorkDeclineOffer(
            work_item_id=item,
            offer_id=offer_id,
            decline=wp.StructuredDecline(reason=wp.DECLINE_REASON_CAPACITY),
        )
        return CommandBase(worker, G, "work_decline_offer", body)

    add("work_decline_offer", decline, renew=True)

    async def start() -> CommandBase:
        item, epoch = await s.queued_item()
        body = wp.WorkStart(work_item_id=item, ownership_epoch=epoch, lease_id="l")
        body.requested_duration.FromSeconds(60)

        def fresh(command: command_pb2.Command) -> None:
            if (
                command.work_start.lease_id
            ):  # empty: derived from the Group and command ids (the field's documented 0)
                command.work_start.lease_id = s.fresh("lease")

        return CommandBase(worker, G, "work_start", body, fresh)

    add("work_start", start, renew=True)

    def under_lease(
        kind: str, signer: SessionSigner, build: Callable[[str, int, str], Message], renew: bool = False
    ) -> None:
        async def make() -> CommandBase:
            item, epoch, lease = await s.active_item()
            return CommandBase(signer, G, kind, build(item, epoch, lease))

        add(kind, make, renew=renew)

    def renew_lease(item: str, epoch: int, lease: str) -> Message:
        body = wp.WorkRenewLease(
            work_item_id=item,
            lease_id=lease,
            ownership_epoch=epoch,
            usage_delta=common_pb2.ResourceVector(currency="EUR", tokens=1),
        )
        body.requested_duration.FromSeconds(60)
        return body

    under_lease("work_renew_lease", worker, renew_lease)
    under_lease(
        "work_checkpoint",
        worker,
        lambda item, epoch, lease: wp.WorkCheckpoint(
            work_item_id=item,
            lease_id=lease,
            ownership_epoch=epoch,
            checkpoint=wp.Checkpoint(checkpoint_id="cp", taken_at=s.ts(0), progress=progress(s)),
            usage_delta=common_pb2.ResourceVector(currency="EUR", tokens=1),
        ),
    )
    under_lease(
        "work_report_progress",
        worker,
        lambda item, epoch, lease: wp.WorkReportProgress(
            work_item_id=item,
            lease_id=lease,
            ownership_epoch=epoch,
            report=progress(s),
            schedule=wp.ScheduleDisclosure(
                start_window_begin=s.ts(0),
                start_window_end=s.ts(60),
                estimated_completion=s.ts(600),
                computed_at=s.ts(0),
            ),
        ),
    )
    under_lease("work_block", worker, lambda item, epoch, lease: blocking(item, epoch, lease), renew=True)
    under_lease(
        "work_request_preemption",
        coord,
        lambda item, epoch, lease: wp.WorkRequestPreemption(
            work_item_id=item,
            preemption_request_id="pre",
            lease_id=lease,
            reason=wp.PREEMPTION_REASON_PRIORITY,
            checkpoint_by=s.ts(60),
            coordinator_epoch=1,
            ownership_epoch=epoch,
        ),
        renew=True,
    )

    async def submit() -> CommandBase:
        item, epoch, lease = await s.active_item()
        body = wp.WorkSubmit(
            work_item_id=item,
            lease_id=lease,
            ownership_epoch=epoch,
            contract_revision=1,
            artifacts=[await s.deliverable(item)],
            evidence=[builders.evidence()],
            summary="done",
        )
        return CommandBase(worker, G, "work_submit", body)

    add("work_submit", submit, renew=True)
    under_lease(
        "work_fail",
        worker,
        lambda item, epoch, lease: wp.WorkFail(
            work_item_id=item,
            lease_id=lease,
            ownership_epoch=epoch,
            kind=wp.WORK_FAILURE_KIND_PERMANENT,
            evidence=[builders.evidence()],
            reason="broke",
        ),
        renew=True,
    )

    async def submitted() -> tuple[str, str]:
        """A submitted WorkItem and its `work.submitted` event id."""
        item, epoch, lease = await s.active_item()
        submit = wp.WorkSubmit(
            work_item_id=item,
            lease_id=lease,
            ownership_epoch=epoch,
            contract_revision=1,
            artifacts=[await s.deliverable(item)],
            evidence=[builders.evidence()],
            summary="done",
        )
        events = decode_events((await s.run(worker, "work_submit", submit)).events)
        return item, next(e for e in events if e.type == "work.submitted").event_id

    async def record_evidence() -> CommandBase:  # review Evidence: the Coordinator, on a submitted WorkItem
        item, _ = await submitted()
        body = wp.WorkRecordEvidence(work_item_id=item, evidence=builders.evidence("ev"), coordinator_epoch=1)

        def fresh(command: command_pb2.Command) -> None:
            command.work_record_evidence.evidence.evidence_id = s.fresh("ev")

        return CommandBase(coord, G, "work_record_evidence", body, fresh)

    add("work_record_evidence", record_evidence)

    async def publish() -> CommandBase:
        item, epoch, lease = await s.active_item()
        body = wp.WorkPublishArtifact(
            work_item_id=item,
            lease_id=lease,
            ownership_epoch=epoch,
            artifact=await s.deliverable(item),
            deliverable_id="report",
        )
        return CommandBase(worker, G, "work_publish_artifact", body)

    add("work_publish_artifact", publish)

    async def unblock() -> CommandBase:  # a blocked WorkItem
        item, epoch, lease = await s.active_item()
        await s.run(worker, "work_block", blocking(item, epoch, lease))
        body = wp.WorkUnblock(
            work_item_id=item, resolution="resolved", coordinator_epoch=1, ownership_epoch=epoch
        )
        return CommandBase(coord, G, "work_unblock", body)

    add("work_unblock", unblock, renew=True)

    async def on_open(kind: str, signer: SessionSigner, build: Callable[[str], Message]) -> CommandBase:
        return CommandBase(signer, G, kind, build(await s.open_item()))

    add(
        "work_cancel",
        lambda: on_open(
            "work_cancel",
            coord,
            lambda item: wp.WorkCancel(work_item_id=item, coordinator_epoch=1, reason="no"),
        ),
        renew=True,
    )

    async def accept_result() -> CommandBase:  # a submitted WorkItem, its submission named
        item, event_id = await submitted()
        body = wp.WorkAcceptResult(work_item_id=item, coordinator_epoch=1, submission_event_id=event_id)
        return CommandBase(coord, G, "work_accept_result", body)

    add("work_accept_result", accept_result, renew=True)

    async def approve_execution() -> CommandBase:  # a queued WorkItem (work/start.py)
        item, epoch = await s.queued_item()
        body = wp.ApprovalGrantExecution(
            work_item_id=item, contract_revision=1, ownership_epoch=epoch, expires_at=s.ts()
        )
        return CommandBase(owner, G, "approval_grant_execution", body)

    add("approval_grant_execution", approve_execution, renew=True)
    add(
        "membership_grant_delegation",
        lambda: on_open(
            "membership_grant_delegation",
            coord,
            lambda item: membership_pb2.MembershipGrantDelegation(
                grantee_id="delegate-bot",
                target_work_item_id=item,
                caps=common_pb2.ResourceVector(currency="EUR", tokens=1),
                max_descendant_depth=1,
                allowed_capabilities=[membership_pb2.Capability(capability_id="fuzz", version="1.0.0")],
                expires_at=s.ts(),
                coordinator_epoch=1,
            ),
        ),
        renew=True,
    )

    async def grant() -> CommandBase:
        spare = s.fresh("spare-bot")
        await register(w.client, w.keys["admin"], spare, common_pb2.IDENTITY_KIND_AGENT)
        body = membership_pb2.MembershipGrant(
            member_id=spare,
            role=membership_pb2.MEMBER_ROLE_WORKER,
            visibility_start_sequence=1,
            expires_at=s.ts(),
        )
        return CommandBase(owner, G, "membership_grant", body)

    add("membership_grant", grant, renew=True)

    async def amend() -> CommandBase:
        result = await s.run(coord, "message_post", builders.message(s.planning, "to amend"))
        message_id = decode_events(result.events)[0].message_posted.message_id
        body = conversation_pb2.MessageAmend(
            message_id=message_id,
            kind=conversation_pb2.MESSAGE_AMENDMENT_KIND_CORRECTION,
            corrected_content=conversation_pb2.MessageContent(text="amended"),
        )
        return CommandBase(coord, G, "message_amend", body)

    add("message_amend", amend, renew=True)

    async def conversation() -> CommandBase:
        body = conversation_pb2.ConversationOpen(
            conversation_id="c",
            kind=conversation_pb2.CONVERSATION_KIND_RESTRICTED,
            title="side",
            participant_ids=["coord-bot", "alice"],
        )

        def fresh(command: command_pb2.Command) -> None:
            if (
                command.conversation_open.conversation_id
            ):  # empty: derived from the Group and command ids (the field's documented 0)
                command.conversation_open.conversation_id = s.fresh("conv")

        return CommandBase(coord, G, "conversation_open", body, fresh)

    add("conversation_open", conversation)
    return targets


def blocking(item: str, epoch: int, lease: str) -> wp.WorkBlock:
    """A block: a checkpoint plus a blocked lease (MW-10.2-T09), each blocker with its resolution."""
    return wp.WorkBlock(
        work_item_id=item,
        lease_id=lease,
        ownership_epoch=epoch,
        checkpoint=wp.Checkpoint(checkpoint_id=f"ck-{item}", completed_operation_ids=["op-1"]),
        blockers=[
            wp.Blocker(
                blocker_id="b",
                kind=wp.BLOCKER_KIND_DEPENDENCY,
                description="waiting",
                required_resolution="wait",
            )
        ],
    )


def progress(s: Scene) -> wp.ProgressReport:
    """A report with what MW-11.4-01 requires: phase, next checkpoint and revised estimate."""
    return wp.ProgressReport(
        phase="half way",
        next_checkpoint=wp.PlannedCheckpoint(description="next", expected_at=s.ts(60)),
        revised_estimate=wp.RevisedEstimate(
            estimated_completion=s.ts(600), confidence=wp.ESTIMATE_CONFIDENCE_MEDIUM, reason="on track"
        ),
    )


async def execute(c: Channels, envelope: common_pb2.SignedEnvelope) -> Outcome:
    return await invoke(
        c.of(None),
        method("AuthorityService.ExecuteCommand"),
        [authority_service_pb2.ExecuteCommandRequest(command=envelope)],
        deadline_s=DEADLINE_S,
    )


# ---- requests, and the signed payloads inside them


def proof_target(
    c: Channels,
    rpc: str,
    signer: SessionSigner,
    request: Callable[[], Message],
    before: Callable[[], Awaitable[None]] | None = None,
) -> Target:
    """The call proof of ``rpc`` fuzzed (the request itself is ``request()``): made and signed as
    the SDK makes it, then re-signed after each change. ``before`` readies what the request names."""
    m = method(rpc)
    path = f"/{m.containing_service.full_name}/{m.name}"

    async def prepare() -> Message:
        if before is not None:
            await before()
        return auth_pb2.CallProof(
            identity_id=signer.identity_id,
            session_epoch=signer.session_epoch,
            method=path,
            audience=c.w.target,
            issued_at=to_timestamp(c.w.clock.now()),
        )

    async def send(proof: Message) -> Outcome:
        assert isinstance(proof, auth_pb2.CallProof)
        proof.nonce = os.urandom(16)
        envelope = sign_envelope(
            proof.SerializeToString(),
            CALL_PROOF_TYPE,
            signer.key,
            session_key_id(signer.identity_id, signer.session_epoch),
        )
        return await invoke(
            c.of(None),
            m,
            [request()],
            deadline_s=DEADLINE_S,
            metadata=((CALL_PROOF_METADATA, envelope.SerializeToString()),),
        )

    return Target(rpc, "CallProof", prepare, send)


def signed_target(
    c: Channels,
    rpc: str,
    what: str,
    prepare: Callable[[], Awaitable[Message]],
    wrap: Callable[[Message], list[Message]],
    signer: SessionSigner | None = None,
    **kw: Any,
) -> Target:
    m = method(rpc)

    async def send(payload: Message) -> Outcome:
        return await invoke(c.of(signer), m, wrap(payload), deadline_s=DEADLINE_S)

    return Target(rpc, what, prepare, send, **kw)


def constant(message: Message) -> Callable[[], Awaitable[Message]]:
    async def prepare() -> Message:
        return message

    return prepare


async def request_targets(s: Scene, c: Channels) -> list[Target]:
    w = s.w
    owner, coord, worker, admin = w.owner, w.coordinator, w.worker, w.admin
    a, m, sch = authority_service_pb2, membership_service_pb2, scheduling_service_pb2
    art = artifact_service_pb2
    blob = s.blob
    data = b"fuzz: the source"
    targets = [
        request_target(
            c,
            "AuthorityService.ReadEvents",
            owner,
            lambda: a.ReadEventsRequest(group_id=G, after_sequence=0, batch_size=10, limit=100),
        ),
        request_target(
            c,
            "AuthorityService.ListWorkItems",
            owner,
            lambda: a.ListWorkItemsRequest(group_id=G, page_size=10),
        ),
        request_target(
            c, "AuthorityService.ListMissions", owner, lambda: a.ListMissionsRequest(page_size=10)
        ),
        # No number here: its documented empty submission_event_id (the latest) is what is sent.
        request_target(
            c, "AuthorityService.GetMissionReview", owner, lambda: a.GetMissionReviewRequest(group_id=G)
        ),
        request_target(
            c,
            "AuthorityService.GetContextPackage",
            coord,
            lambda: a.GetContextPackageRequest(
                group_id=G,
                recipient_ids=["worker-bot"],
                purpose=art.CONTEXT_PACKAGE_PURPOSE_WORKER_ONBOARDING,
            ),
        ),
        request_target(
            c, "MembershipService.ListIdentities", admin, lambda: m.ListIdentitiesRequest(page_size=10)
        ),
        request_target(
            c,
            "MembershipService.ListAgentCardVersions",
            owner,
            lambda: m.ListAgentCardVersionsRequest(agent_id="worker-bot", page_size=10),
        ),
        request_target(
            c,
            "MembershipService.ReportPresence",
            worker,
            lambda: m.ReportPresenceRequest(
                report=agent_card_pb2.PresenceReport(
                    agent_id="worker-bot",
                    free_slots=1,
                    in_use_slots=0,
                    ttl_ms=60_000,
                    availability=agent_card_pb2.PRESENCE_AVAILABILITY_AVAILABLE,
                )
            ),
        ),
        request_target(c, "ArtifactService.Stat", coord, lambda: art.StatRequest(digest=blob)),
        request_target(c, "ArtifactService.GetManifest", coord, lambda: art.GetManifestRequest(digest=blob)),
        request_target(
            c,
            "ArtifactService.QueryProvenance",
            coord,
            lambda: art.QueryProvenanceRequest(
                digest=blob, direction=art.PROVENANCE_DIRECTION_ANCESTORS, max_depth=3
            ),
        ),
        request_target(
            c, "ArtifactService.Download", coord, lambda: art.DownloadRequest(digest=blob, offset=1, length=4)
        ),
        request_target(
            c, "ArtifactService.BatchDownload", coord, lambda: art.BatchDownloadRequest(digests=[blob])
        ),
        request_target(
            c, "ArtifactService.FindMissing", coord, lambda: art.FindMissingRequest(digests=[blob])
        ),
        request_target(
            c,
            "ArtifactService.BatchUpload",
            coord,
            lambda: art.BatchUploadRequest(blobs=[art.BatchUploadBlob(digest=blob, data=data)]),
        ),
        signed_target(
            c,
            "ArtifactService.Upload",
            "UploadRequest.header",
            constant(art.UploadRequest(header=art.UploadHeader(digest=blob))),
            lambda header: [header, art.UploadRequest(chunk=art.UploadChunk(offset=0, data=data))],
            coord,
        ),
        signed_target(
            c,
            "ArtifactService.Upload",
            "UploadRequest.chunk",
            constant(art.UploadRequest(chunk=art.UploadChunk(offset=0, data=data))),
            lambda chunk: [art.UploadRequest(header=art.UploadHeader(digest=blob)), chunk],
            coord,
        ),
        request_target(
            c,
            "SchedulingService.NextSlot",
            worker,
            lambda: sch.NextSlotRequest(),
            may_time_out=lambda path, value: isinstance(value, tuple) and value[0] > 0,
        ),
        request_target(
            c,
            "SchedulingService.SetPriority",
            owner,
            lambda: sch.SetPriorityRequest(
                group_id=G,
                source=sch.PRIORITY_SOURCE_MISSION_OWNER,
                worker_id="worker-bot",
                priority_class=sch.PRIORITY_CLASS_ELEVATED,
            ),
        ),
        request_target(
            c,
            "SchedulingService.SetPriority",
            worker,
            lambda: sch.SetPriorityRequest(
                group_id=G, source=sch.PRIORITY_SOURCE_WORKER_OPERATOR, worker_id="worker-bot", group_weight=2
            ),
        ),
        request_target(c, "AuthorityService.GetAuthorityKey", None, lambda: a.GetAuthorityKeyRequest()),
    ]

    async def placed() -> Message:
        """A slot the scheduler just filled with a queued WorkItem of the Worker's."""
        await s.queued_item()
        scheduler = sch_grpc.SchedulingServiceStub(c.of(worker))
        for _ in range(100):  # the scheduler places what it has read of the Group (split: a moment later)
            answer = await scheduler.NextSlot(sch.NextSlotRequest(), timeout=DEADLINE_S)
            if answer.HasField("assignment"):
                break
            await asyncio.sleep(0.05)
        return sch.ReleaseSlotRequest(
            slot_id=answer.assignment.slot_id,
            work_item_id=answer.assignment.work_item_id,
            reason=sch.SLOT_RELEASE_REASON_CHECKPOINTED,
            ended_at_sequence=1,
        )

    targets.append(
        signed_target(
            c,
            "SchedulingService.ReleaseSlot",
            "ReleaseSlotRequest",
            placed,
            lambda r: [r],
            worker,
            renew_on_accept=True,
        )
    )

    async def admit() -> Message:
        item, offer = await s.offered_item()
        return sch.AdmitRequest(
            group_id=G,
            work_item_id=item,
            offer_id=offer,
            contract=s.contract(),
            offer_expires_at=s.ts(),
            dependencies_satisfied=True,
            offered_at_sequence=1,
        )

    # A sequence past the Group's head is waited for, at most 5 s as documented: two values.
    targets.append(
        signed_target(
            c,
            "SchedulingService.Admit",
            "AdmitRequest",
            admit,
            lambda r: [r],
            worker,
            renew_on_accept=True,
            per_field={"offered_at_sequence": 2},
        )
    )

    # Proof-only RPCs: their requests hold no number; the call proof's do.
    item = await s.open_item()
    queued: dict[str, str] = {}

    async def queue() -> None:  # a WorkItem in the Worker's queue (NextSlot's fuzzing may place earlier ones)
        queued["item"], _ = await s.queued_item()
        scheduler = sch_grpc.SchedulingServiceStub(c.of(worker))
        for _ in range(100):  # once the scheduler has read it
            try:
                await scheduler.DiscloseSchedule(
                    sch.DiscloseScheduleRequest(group_id=G, work_item_id=queued["item"]), timeout=DEADLINE_S
                )
                return
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.05)

    for rpc, signer, request in [
        ("AuthorityService.GetGroupState", owner, lambda: a.GetGroupStateRequest(group_id=G)),
        ("AuthorityService.GetSignedGroupSummary", owner, lambda: a.GetSignedGroupSummaryRequest(group_id=G)),
        ("AuthorityService.GetMissionProgress", owner, lambda: a.GetMissionProgressRequest(group_id=G)),
        ("AuthorityService.GetMissionTree", owner, lambda: subtask_pb2.GetMissionTreeRequest(group_id=G)),
        ("AuthorityService.GetWorkItem", owner, lambda: a.GetWorkItemRequest(group_id=G, work_item_id=item)),
        ("AuthorityService.TakeSnapshot", admin, lambda: a.TakeSnapshotRequest(group_id=G)),
        ("AuthorityService.GetMissionReview", owner, lambda: a.GetMissionReviewRequest(group_id=G)),
        ("AuthorityService.ReadEvents", owner, lambda: a.ReadEventsRequest(group_id=G)),
        ("MembershipService.GetIdentity", owner, lambda: m.GetIdentityRequest(identity_id="alice")),
        ("MembershipService.ListMemberships", owner, lambda: m.ListMembershipsRequest(group_id=G)),
        ("MembershipService.GetAgentCard", owner, lambda: m.GetAgentCardRequest(agent_id="worker-bot")),
        ("MembershipService.GetPresence", owner, lambda: m.GetPresenceRequest(agent_ids=["worker-bot"])),
        ("SchedulingService.GetQueue", worker, lambda: sch.GetQueueRequest(group_id=G)),
        ("ArtifactService.Stat", coord, lambda: art.StatRequest(digest=blob)),
    ]:
        targets.append(proof_target(c, rpc, signer, request))
    targets.append(
        proof_target(
            c,
            "SchedulingService.DiscloseSchedule",
            worker,
            lambda: sch.DiscloseScheduleRequest(group_id=G, work_item_id=queued["item"]),
            queue,
        )
    )

    # Signed Organization requests: the payload inside the envelope, re-signed.
    admin_key = w.keys["admin"]

    async def identity() -> Message:
        return m.RegisterIdentityCommand(
            identity=membership_pb2.Identity(
                identity_id="x",
                kind=common_pb2.IDENTITY_KIND_AGENT,
                public_key=bytes(SigningKey.generate().verify_key),
            ),
            admin_id="admin",
            issued_at=to_timestamp(w.clock.now()),
        )

    def register_request(payload: Message) -> list[Message]:
        assert isinstance(payload, m.RegisterIdentityCommand)
        payload.identity.identity_id, payload.request_id = s.fresh("fuzz-id"), s.fresh("req")
        envelope = sign_envelope(
            payload.SerializeToString(), REGISTER_IDENTITY_TYPE, admin_key, "admin#identity"
        )
        return [m.RegisterIdentityRequest(command=envelope)]

    targets.append(
        signed_target(
            c, "MembershipService.RegisterIdentity", "RegisterIdentityCommand", identity, register_request
        )
    )

    session_key = SigningKey.generate()
    await w.client.register_identity(
        "admin", admin_key, "session-bot", common_pb2.IDENTITY_KIND_AGENT, bytes(session_key.verify_key)
    )

    async def session() -> Message:
        return m.OpenSessionCommand(
            identity_id="session-bot",
            session_public_key=bytes(SigningKey.generate().verify_key),
            issued_at=to_timestamp(w.clock.now()),
        )

    def open_request(payload: Message) -> list[Message]:
        assert isinstance(payload, m.OpenSessionCommand)
        payload.nonce = os.urandom(16)
        envelope = sign_envelope(
            payload.SerializeToString(), OPEN_SESSION_TYPE, session_key, "session-bot#identity"
        )
        return [m.OpenSessionRequest(command=envelope)]

    targets.append(
        signed_target(c, "MembershipService.OpenSession", "OpenSessionCommand", session, open_request)
    )

    card_agent = await register(w.client, admin_key, "card-bot", common_pb2.IDENTITY_KIND_AGENT)

    async def card() -> Message:
        return agent_card_pb2.AgentCard(
            agent_id="card-bot",
            card_version="1.0.0",
            max_concurrency=2,
            capabilities=[membership_pb2.Capability(capability_id="fuzz", version="1.0.0")],
        )

    def publish(payload: Message) -> list[Message]:
        assert isinstance(payload, agent_card_pb2.AgentCard)
        payload.card_version = f"1.0.{s.n}"
        s.n += 1
        envelope = sign_envelope(
            payload.SerializeToString(),
            AGENT_CARD_TYPE,
            card_agent.key,
            session_key_id(card_agent.identity_id, card_agent.session_epoch),
        )
        return [m.PublishAgentCardRequest(card=envelope)]

    targets.append(
        signed_target(c, "MembershipService.PublishAgentCard", "AgentCard", card, publish, card_agent)
    )

    # The gateway: GetSnapshot's request and the HELLO proof inside it; Connect's HELLO proof and frames.
    snapshot = s.snapshot

    def hello_proof() -> gpb.HelloProof:
        return gpb.HelloProof(
            agent_id="worker-bot",
            session_epoch=worker.session_epoch,
            issued_at=to_timestamp(w.clock.now()),
            audience=w.target,
        )

    def signed_hello(proof: Message) -> common_pb2.SignedEnvelope:
        assert isinstance(proof, gpb.HelloProof)
        proof.nonce = os.urandom(16)
        return sign_envelope(
            proof.SerializeToString(),
            HELLO_TYPE,
            worker.key,
            session_key_id(worker.identity_id, worker.session_epoch),
        )

    targets.append(
        signed_target(
            c,
            "GatewayService.GetSnapshot",
            "HelloProof",
            lambda: constant(hello_proof())(),
            lambda proof: [gpb.GetSnapshotRequest(group_id=G, digest=snapshot, proof=signed_hello(proof))],
        )
    )

    def snapshot_request(request: Message) -> list[Message]:
        assert isinstance(request, gpb.GetSnapshotRequest)
        request.proof.CopyFrom(hello(w, worker).proof)
        return [request]

    targets.append(
        signed_target(
            c,
            "GatewayService.GetSnapshot",
            "GetSnapshotRequest",
            constant(gpb.GetSnapshotRequest(group_id=G, digest=snapshot)),
            snapshot_request,
        )
    )
    targets.extend(gateway_targets(s, c, hello_proof, signed_hello))
    return targets


CONNECT_LISTEN_S = 0.3


def gateway_targets(
    s: Scene,
    c: Channels,
    hello_proof: Callable[[], gpb.HelloProof],
    signed_hello: Callable[[Message], common_pb2.SignedEnvelope],
) -> list[Target]:
    """Connect: the HELLO (its frame and its proof), then one frame of each kind after a valid HELLO.
    A stream follows for as long as it is open: each is read for a moment, then cancelled."""
    w = s.w
    worker = w.worker
    connect = method("GatewayService.Connect")

    async def stream(frames: list[gpb.ClientFrame]) -> Outcome:
        call = c.of(None).stream_stream(
            "/missionweave.v1.GatewayService/Connect",
            request_serializer=gpb.ConnectRequest.SerializeToString,
            response_deserializer=gpb.ConnectResponse.FromString,
        )(timeout=DEADLINE_S)
        out = Outcome(grpc.StatusCode.OK)
        try:
            for frame in frames:
                await call.write(gpb.ConnectRequest(frame=frame))
            async with asyncio.timeout(CONNECT_LISTEN_S):
                while True:
                    answer = await call.read()
                    if answer is grpc.aio.EOF:
                        break
                    out.responses.append(answer)
        except TimeoutError:
            call.cancel()
            return out
        except grpc.aio.AioRpcError:
            pass
        code = await call.code()
        if code != grpc.StatusCode.OK:
            out.code, out.details = code, await call.details() or ""
            try:
                await call
            except grpc.aio.AioRpcError as err:
                out.rejection = rejection_from_rpc_error(err)
        return out

    def valid_hello() -> gpb.HelloFrame:
        return hello(w, worker)

    async def hello_frame(frame: Message) -> Outcome:
        assert isinstance(frame, gpb.ClientFrame)
        frame.hello.proof.CopyFrom(signed_hello(hello_proof()))
        return await stream([frame])

    async def proof_in_hello(proof: Message) -> Outcome:
        frame = gpb.HelloFrame(
            agent_id="worker-bot", session_epoch=worker.session_epoch, proof=signed_hello(proof)
        )
        return await stream([gpb.ClientFrame(hello=frame)])

    async def after_hello(frame: Message) -> Outcome:
        assert isinstance(frame, gpb.ClientFrame)
        return await stream([gpb.ClientFrame(hello=valid_hello()), frame])

    async def after_subscribe(frame: Message) -> Outcome:  # an ACK names an open subscription
        assert isinstance(frame, gpb.ClientFrame)
        return await stream([gpb.ClientFrame(hello=valid_hello()), subscribe, frame])

    lasting = {"may_time_out": lambda path, value: True}
    targets = [
        Target(
            connect.full_name.removeprefix("missionweave.v1."),
            "HelloFrame",
            constant(
                gpb.ClientFrame(
                    hello=gpb.HelloFrame(agent_id="worker-bot", session_epoch=worker.session_epoch)
                )
            ),
            hello_frame,
            **lasting,
        ),  # type: ignore[arg-type]
        Target(
            "GatewayService.Connect",
            "HelloProof",
            lambda: constant(hello_proof())(),
            proof_in_hello,
            **lasting,
        ),  # type: ignore[arg-type]
    ]
    subscribe = gpb.ClientFrame(
        subscribe=gpb.SubscribeFrame(
            subscription_id="s",
            group_id=G,
            after_sequence=0,
            initial_credits=10,
            filter=gpb.AttentionFilter(mode=gpb.ATTENTION_MODE_ALL),
        )
    )
    for what, frame, send in [
        ("SubscribeFrame", subscribe, after_hello),
        (
            "AckFrame",
            gpb.ClientFrame(
                ack=gpb.AckFrame(
                    cursors=[gpb.CursorAck(subscription_id="s", group_id=G, cursor=1, credits=1)]
                )
            ),
            after_subscribe,
        ),
        (
            "FetchFrame",
            gpb.ClientFrame(
                fetch=gpb.FetchFrame(request_id="f", group_id=G, ranges=[gpb.SequenceRange(first=1, last=2)])
            ),
            after_hello,
        ),
    ]:
        targets.append(Target("GatewayService.Connect", what, constant(frame), send, **lasting))  # type: ignore[arg-type]
    return targets


def stream_targets(s: Scene, c: Channels) -> list[Target]:
    """ExecuteCommandStream and ExecuteCommandBatch: the request tag, and the command envelope's own
    fields (epochs, issued_at, expected revision) answered in band."""
    w = s.w
    a = authority_service_pb2

    def envelope(command: command_pb2.Command | None = None) -> common_pb2.SignedEnvelope:
        if command is None:
            command = w.command(
                w.coordinator,
                G,
                "message_post",
                builders.message(s.planning, "hi"),
                membership_epoch=s.epochs["coord-bot"],
            )
        command.command_id = s.fresh("cmd")
        return w.coordinator.sign(command)

    async def a_command() -> Message:
        return w.command(
            w.coordinator,
            G,
            "message_post",
            builders.message(s.planning, "hi"),
            membership_epoch=s.epochs["coord-bot"],
        )

    def in_stream(request: Message) -> list[Message]:
        assert isinstance(request, a.ExecuteCommandStreamRequest)
        request.command.CopyFrom(envelope())
        return [request]

    def in_batch(request: Message) -> list[Message]:
        assert isinstance(request, a.ExecuteCommandBatchRequest)
        for one in request.commands:
            one.command.CopyFrom(envelope())
        return [request]

    return [
        signed_target(
            c,
            "AuthorityService.ExecuteCommandStream",
            "ExecuteCommandStreamRequest",
            constant(a.ExecuteCommandStreamRequest(request_tag=1)),
            in_stream,
        ),
        signed_target(
            c,
            "AuthorityService.ExecuteCommandBatch",
            "ExecuteCommandBatchRequest",
            constant(a.ExecuteCommandBatchRequest(commands=[a.ExecuteCommandStreamRequest(request_tag=1)])),
            in_batch,
        ),
        signed_target(
            c,
            "AuthorityService.ExecuteCommandStream",
            "Command",
            a_command,
            lambda command: [a.ExecuteCommandStreamRequest(command=envelope(command), request_tag=7)],  # type: ignore[arg-type]
            skip=lambda path: path.fields[0].containing_oneof is not None,
        ),
        signed_target(
            c,
            "AuthorityService.ExecuteCommandBatch",
            "Command",
            a_command,
            lambda command: [
                a.ExecuteCommandBatchRequest(
                    commands=[
                        a.ExecuteCommandStreamRequest(  # type: ignore[arg-type]
                            command=envelope(command), request_tag=7
                        )
                    ]
                )
            ],
            skip=lambda path: path.fields[0].containing_oneof is not None,
        ),
    ]


# ------------------------------------------------------------ the run


@dataclass
class ZeroCase:
    """One field documented at 0 (or unset) sent so: ``judged`` when its target's baseline was accepted."""

    case: str
    judged: bool
    outcome: Outcome


@dataclass
class Run:
    zero: dict[str, str] = field(
        default_factory=dict
    )  # field full name -> its comment (tools/check_contracts.py)
    zeros: dict[str, list[ZeroCase]] = field(default_factory=dict)
    cases: int = 0
    per_rpc: dict[str, int] = field(default_factory=dict)
    fields: set[str] = field(default_factory=set)
    accepted: int = 0
    baselines_refused: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    kinds: dict[str, list[str]] = field(default_factory=dict)

    def fail(self, case: str, issue: str | None, logged: list[str]) -> None:
        """One failing case, filed under what failed (the exception and where it was raised)."""
        text = f"{case}: {issue or ''} {logged}"
        self.failures.append(text)
        where = [
            re.sub(r"\[(\w+): .* at ", r"[\1 at ", line[line.rindex(" [") :])
            for line in logged
            if " [" in line
        ]
        key = where[0] if where else re.sub(r"-?\d{3,}", "N", (issue or "")[:90])
        self.kinds.setdefault(key, []).append(case)

    def summary(self) -> str:
        lines = [f"{len(self.failures)} failing cases, {len(self.kinds)} kinds:"]
        for key, cases in sorted(self.kinds.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"- {key}\n    {len(cases)} cases, e.g. {'; '.join(cases[:3])}")
        return "\n".join(lines)


async def send_patiently(target: Target, message: Message) -> Outcome:
    """One case, sent again while its Group is over its command rate (the run sends faster)."""
    outcome = await target.send(_copy(message))
    for _ in range(50):
        delay = overloaded(outcome)
        if delay is None:
            break
        await asyncio.sleep(delay)
        outcome = await target.send(_copy(message))
    return outcome


def zero_cases(leaf: Any, comment: str) -> list[tuple[str, Any]]:
    """What "0" is for a field documented at 0 or unset: 0, or for a Duration or Timestamp the
    field unset (and a zero value when the comment names 0 itself)."""
    if leaf.message_type is None:
        return [("zero", 0.0 if leaf.type in (leaf.TYPE_FLOAT, leaf.TYPE_DOUBLE) else 0)]
    out: list[tuple[str, Any]] = []
    if re.search(r"\bunset\b", comment, re.IGNORECASE):
        out.append(("unset", None))
    if re.search(r"(?<![\w.])0\s*(=|means|or|for)", comment):
        out.append(("zero", (0, 0)))
    return out


async def fuzz(target: Target, log: ErrorLog, run: Run) -> None:
    label = f"{target.rpc} [{target.what}]"
    baseline = await target.prepare()
    first = await send_patiently(target, baseline)
    issue = problem(first, may_time_out=target.may_time_out(None, None))
    if issue or log.records:
        run.fail(f"{label} <- the baseline", issue, log.take())
    if not first.accepted:
        reason = first.rejection or (first.inband() or [None])[0]
        run.baselines_refused.append(
            f"{label}: {first.code.name} {reason and common_pb2.RejectionReason.Name(reason.reason)}"
            f" {reason and reason.message[:160]} {reason and dict(reason.metadata)}"
        )
    elif target.renew_on_accept:
        baseline = await target.prepare()
    for path in leaf_paths(baseline):
        if target.skip(path):
            continue
        run.fields.add(f"{target.what}.{path.name}")
        keep = target.per_field.get(path.name, PER_FIELD)
        cases = sampled(extremes(path.leaf), f"{target.what}/{path.name}", keep)
        documented = run.zero.get(path.leaf.full_name)
        at_zero = zero_cases(path.leaf, documented) if documented is not None else []
        cases += [c for c in at_zero if c not in cases]  # a field documented at 0 is always sent 0
        for name, value in cases:
            case = mutated(baseline, path, value)
            outcome = await send_patiently(target, case)
            if (
                name,
                value,
            ) in at_zero:  # judged where the baseline is accepted and already holds the field's message
                run.zeros.setdefault(path.leaf.full_name, []).append(
                    ZeroCase(
                        f"{label} {path.name} = {name}", first.accepted and holds(baseline, path), outcome
                    )
                )
            run.cases += 1
            run.per_rpc[target.rpc] = run.per_rpc.get(target.rpc, 0) + 1
            issue = problem(outcome, may_time_out=target.may_time_out(path, value))
            logged = log.take()
            if issue or logged:
                run.fail(f"{label} {path.name} = {name} {value!r}", issue, logged)
            if outcome.accepted:
                run.accepted += 1
                if target.renew_on_accept:
                    baseline = await target.prepare()
    # Strings, lists and messages documented as meaning something empty or unset: sent so.
    for path in empty_paths(baseline, run.zero):
        if target.skip(path):
            continue
        # Where a message on the way is unset, the field is empty already: the baseline says it.
        outcome = await send_patiently(
            target, mutated(baseline, path, None) if holds(baseline, path) else baseline
        )
        run.cases += 1
        run.zeros.setdefault(path.leaf.full_name, []).append(
            ZeroCase(f"{label} {path.name} = empty", first.accepted, outcome)
        )
        issue = problem(outcome, may_time_out=target.may_time_out(path, None))
        logged = log.take()
        if issue or logged:
            run.fail(f"{label} {path.name} = empty", issue, logged)
        if outcome.accepted and target.renew_on_accept:
            baseline = await target.prepare()


def empty_paths(message: Message, zero: dict[str, str]) -> list[Path]:
    """The fields of ``zero`` reachable in ``message`` that are no number, enum, Duration or
    Timestamp (those are ``leaf_paths``'): through the oneof member it has set, a repeated field's
    first element, and messages it leaves unset (where the field is empty already)."""
    return list(_empty(message.DESCRIPTOR, message, (), (message.DESCRIPTOR.full_name,), zero))


def _empty(
    descriptor: Any,
    message: Message | None,
    prefix: tuple[Any, ...],
    stack: tuple[str, ...],
    zero: dict[str, str],
) -> Iterator[Path]:
    for f in descriptor.fields:
        oneof = f.containing_oneof
        if oneof is not None and message is not None and message.WhichOneof(oneof.name) not in (None, f.name):
            continue
        timed = f.message_type is not None and f.message_type.full_name in (DURATION, TIMESTAMP)
        numeric = f.message_type is None and f.type not in (f.TYPE_STRING, f.TYPE_BYTES, f.TYPE_BOOL)
        if f.full_name in zero and not numeric and not timed:
            yield Path((*prefix, f))
        if (
            f.message_type is None
            or timed
            or f.message_type.GetOptions().map_entry
            or f.message_type.full_name in stack
        ):
            continue
        child: Message | None = None
        if message is not None:
            value = getattr(message, f.name)
            if f.is_repeated:
                child = value[0] if len(value) else None
            elif message.HasField(f.name):
                child = value
        yield from _empty(f.message_type, child, (*prefix, f), (*stack, f.message_type.full_name), zero)


def holds(message: Message, path: Path) -> bool:
    """Whether every message on ``path`` down to its leaf is set in ``message`` (a mutation there
    creates nothing else, which might be refused for its own missing fields)."""
    current: Any = message
    for f in path.fields[:-1]:
        value = getattr(current, f.name)
        if f.is_repeated:
            if not len(value):
                return False
            current = value[0]
        elif not current.HasField(f.name):
            return False
        else:
            current = value
    return True


def _copy(message: Message) -> Message:
    out = type(message)()
    out.CopyFrom(message)
    return out


async def read_back(s: Scene, c: Channels, log: ErrorLog, run: Run) -> None:
    """Every read of every Group the run touched still answers: nothing accepted poisoned it."""
    a = authority_service_pb2
    admin = c.of(s.w.admin)
    for group in sorted(s.groups | {G}):
        for rpc, request in [
            ("AuthorityService.GetGroupState", a.GetGroupStateRequest(group_id=group)),
            ("AuthorityService.GetSignedGroupSummary", a.GetSignedGroupSummaryRequest(group_id=group)),
            ("AuthorityService.GetMissionProgress", a.GetMissionProgressRequest(group_id=group)),
            ("AuthorityService.GetMissionReview", a.GetMissionReviewRequest(group_id=group)),
            ("AuthorityService.ListWorkItems", a.ListWorkItemsRequest(group_id=group)),
            ("AuthorityService.ReadEvents", a.ReadEventsRequest(group_id=group)),
            ("AuthorityService.GetMissionTree", subtask_pb2.GetMissionTreeRequest(group_id=group)),
        ]:
            outcome = await invoke(admin, method(rpc), [request], deadline_s=DEADLINE_S)
            issue = problem(outcome)
            if issue is None and outcome.code != grpc.StatusCode.OK:
                issue = f"refused a read after the run: {outcome.code.name} {outcome.rejection}"
            logged = log.take()
            if issue or logged:
                run.fail(f"read back {rpc} {group}", issue, logged)
    outcome = await invoke(
        admin, method("AuthorityService.ListMissions"), [a.ListMissionsRequest()], deadline_s=DEADLINE_S
    )
    if outcome.code != grpc.StatusCode.OK:
        run.fail("read back ListMissions", f"{outcome.code.name} {outcome.details}", [])


# Baselines that stay refused, "<rpc> [<what>]" -> why: their extremes are judged on the refusal
# path only (no structured answer may be missing there either). Every other baseline must be
# accepted. Empty: every baseline is valid (issue 40 part 5 made the last twenty valid).
BASELINES_REFUSED: dict[str, str] = {}

# Payloads signed inside requests (their fields reach the server too), besides each RPC's request.
SIGNED_PAYLOADS: list[Any] = [
    command_pb2.Command,
    auth_pb2.CallProof,
    gpb.HelloProof,
    membership_service_pb2.OpenSessionCommand,
    membership_service_pb2.RegisterIdentityCommand,
    agent_card_pb2.AgentCard,
]


def request_side() -> set[str]:
    """Every field a client sends: reachable from an RPC's request message or a signed payload."""
    roots = [
        m.input_type
        for module_name, module in SERVICES.items()
        for m in module.DESCRIPTOR.services_by_name[module_name].methods
    ]
    roots += [payload.DESCRIPTOR for payload in SIGNED_PAYLOADS]
    seen: set[str] = set()
    fields: set[str] = set()
    while roots:
        d = roots.pop()
        if d.full_name in seen:
            continue
        seen.add(d.full_name)
        for f in d.fields:
            fields.add(f.full_name)
            if f.message_type is not None:
                roots.append(f.message_type)
    return fields


def zero_findings(run: Run) -> list[str]:
    """Each field documented at 0 (or unset) that a client sends: sent so through an accepted
    baseline, and never refused as invalid for it (MALFORMED, INVALID_ARGUMENT)."""
    out = []
    sent = request_side()
    for name in sorted(run.zero):
        if name not in sent:
            continue  # output only (a read model's or an event's field)
        cases = run.zeros.get(name, [])
        if not cases:
            out.append(f"{name} is documented at 0 but no target sends it 0: {run.zero[name][:120]}")
        elif not any(c.judged for c in cases):
            out.append(
                f"{name} is sent 0 only through refused baselines or ones without its message ({cases[0].case})"
            )
        for c in cases:
            if not c.judged:
                continue
            refusals = [c.outcome.rejection] if c.outcome.rejection is not None else c.outcome.inband()
            for r in refusals:
                if r.reason in (
                    common_pb2.REJECTION_REASON_MALFORMED,
                    common_pb2.REJECTION_REASON_INVALID_ARGUMENT,
                ):
                    out.append(
                        f"{c.case}: refused {common_pb2.RejectionReason.Name(r.reason)} ({r.message[:160]}), "
                        f"but the field is documented at 0: {run.zero[name][:160]}"
                    )
    return out


def baseline_findings(run: Run) -> list[str]:
    out = []
    refused = {line.split(": ", 1)[0]: line for line in run.baselines_refused}
    for label, line in refused.items():
        if label not in BASELINES_REFUSED:
            out.append(
                f"the baseline is refused (make it valid, or allow it in BASELINES_REFUSED with why): {line}"
            )
    for label in BASELINES_REFUSED:
        if label not in refused:
            out.append(f"{label} is in BASELINES_REFUSED but its baseline is accepted now: remove it")
    return out


def public_rpcs() -> set[str]:
    return {
        f"{name}.{m.name}"
        for name, module in SERVICES.items()
        for m in module.DESCRIPTOR.services_by_name[name].methods
    }


async def test_every_numeric_and_enum_field_at_its_extremes_through_every_rpc(
    world: World, error_log: ErrorLog
) -> None:
    started = time.monotonic()
    s = await scene(world)
    c = Channels(world)
    run = Run(zero={e.name: e.comment for e in documented_at_zero()})
    try:
        targets = command_targets(s, c) + stream_targets(s, c) + await request_targets(s, c)
        assert {t.rpc for t in targets} == public_rpcs(), public_rpcs() ^ {t.rpc for t in targets}
        error_log.take()  # the scene's own set-up
        for target in targets:
            await fuzz(target, error_log, run)
        await read_back(s, c, error_log, run)
    finally:
        await c.close()
    elapsed = time.monotonic() - started
    print(
        f"\nfuzz: {run.cases} cases, {len(run.fields)} fields, {len(run.per_rpc)} RPCs, {run.accepted} accepted, "
        f"{elapsed:.1f} s; baselines refused:\n" + "\n".join(run.baselines_refused)
    )
    zero = zero_findings(run)
    judged = sum(1 for cases in run.zeros.values() if any(c.judged for c in cases))
    unjudged = sorted(name for name in run.zero if not any(c.judged for c in run.zeros.get(name, [])))
    print(
        f"fields documented at 0 sent 0 through an accepted baseline: {judged} of {len(run.zero)}; "
        f"not sent (no client sends them): {unjudged}"
    )
    problems = ([run.summary()] if run.failures else []) + baseline_findings(run) + zero
    if problems:
        pytest.fail("\n".join(problems))
