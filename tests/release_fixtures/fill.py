"""Fill a live mesh of a release with every kind of record, through its public API only.

Run by ``regenerate.sh`` with PYTHONPATH at a ``git worktree`` of the release: everything imported
here (``missionweave.*``, ``tests.*``) is that release's code, so this file may use nothing newer
than the oldest release it fills (v0.1.0). Two stages, with an Authority key rotation between them
(done by ``regenerate.sh`` on the stopped mesh):

* ``--stage 1`` registers the identities (throwaway keys derived from their names), and builds:
  a root Mission with WorkItems in every state, a delegation grant, a proposal, Conversations with
  amendments, an offline reconciliation, a child Mission, a finished (approved) Mission with an
  archival snapshot that compacted its log, Artifacts with signed manifests, provenance and
  several holders, an Agent Card, a snapshot and a gateway subscriber's durable cursor. Sessions
  and what was recorded go to ``<work dir>/state.json``.
* ``--stage 2`` (after the rotation, same sessions: nobody opens a new one) adds events signed by
  the new key (an erasure that re-signs an old event, messages, a WorkItem), a second snapshot and
  a second cursor, then writes ``expected.json``: what the upgrade test checks.

Ids are fixed (Groups, commands, WorkItems, offers, leases, messages), so a regenerated fixture
differs from the last one in times, signatures and the Authority keys only.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import blake3
import grpc
from google.protobuf.message import Message
from nacl.signing import SigningKey

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.extensions import BOUNDED_OFFLINE_EXECUTION
from missionweave.kernel.manifest import manifest_digest
from missionweave.kernel.signing import HELLO_PROOF_TYPE, read_key, session_key_id, sign_envelope, write_key
from missionweave.sdk.artifacts import Origin, card_version, put_artifact
from missionweave.sdk.client import MeshClient, SessionSigner, decode_events
from missionweave.v1 import (
    agent_card_pb2,
    artifact_service_pb2,
    authority_service_pb2,
    command_pb2,
    common_pb2,
    conversation_pb2,
    event_pb2,
    membership_pb2,
    mission_pb2,
    subtask_pb2,
)
from missionweave.v1 import gateway_service_pb2 as gpb
from missionweave.v1 import gateway_service_pb2_grpc as gpb_grpc
from missionweave.v1 import work_pb2 as wp
from tests import builders

ROOT, CHILD, DONE = "grp_upgrade_root", "grp_upgrade_child", "grp_upgrade_done"
GROUPS = (ROOT, CHILD, DONE)
HUMAN, AGENT = common_pb2.IDENTITY_KIND_HUMAN, common_pb2.IDENTITY_KIND_AGENT
Role = membership_pb2.MemberRole
IDENTITIES: dict[str, common_pb2.IdentityKind.ValueType] = {
    "alice": HUMAN,  # MissionOwner of the root Missions
    "coord": AGENT,  # their Coordinator; owner of the child Mission
    "worker": AGENT,  # the Worker, with an Agent Card
    "night": AGENT,  # a Worker that reconciles an offline buffer from a second session
    "lead": AGENT,  # a work delegate under a delegation grant
    "child-coord": AGENT,  # the child Mission's Coordinator
    "watcher": AGENT,  # an observer subscribed through the gateway (durable cursors)
    "outsider": AGENT,  # a member of no Group that holds blobs (artifact holders)
}
LEASE_S = 600
GRACE_S = 120
CURSOR_ROOT = 12  # how far the watcher acknowledges the root Group in stage 1


def identity_key(name: str) -> SigningKey:
    """A throwaway test key, the same on every regeneration (the fixture stays reviewable)."""
    return SigningKey(
        hashlib.blake2b(f"missionweave upgrade fixture: {name}".encode(), digest_size=32).digest()
    )


def now() -> datetime:
    return datetime.now(UTC)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def polled(holds: Callable[[], Awaitable[bool]], what: str, limit_s: float = 30.0) -> None:
    """Poll a read until it holds, within a deadline (the relay and the cursor store are asynchronous)."""
    deadline = time.monotonic() + limit_s
    while not await holds():
        if time.monotonic() > deadline:
            raise SystemExit(f"fill: timed out waiting for {what}")
        await asyncio.sleep(0.05)


@dataclass
class Recorded:
    """A command whose exact signed bytes and outcome go into expected.json (the test resends it)."""

    label: str
    group_id: str
    command_id: str
    actor: str
    envelope: bytes
    result: command_pb2.CommandResult


@dataclass
class Artifact:
    ref: common_pb2.ArtifactRef
    holders: set[str]
    sources: list[str] = field(default_factory=list)


class Filler:
    def __init__(self, target: str, work: Path, data_dir: Path) -> None:
        self.target = target
        self.work = work
        self.data_dir = data_dir
        self.signers: dict[str, SessionSigner] = {}
        self.clients: dict[str, MeshClient] = {}
        self.recorded: list[Recorded] = []
        self.artifacts: dict[str, Artifact] = {}
        self.cursors: list[dict[str, Any]] = []
        self.snapshots: list[dict[str, Any]] = []
        self.cards: list[dict[str, Any]] = []
        self.grant_id = ""

    # ------------------------------------------------------------ sessions and clients

    def client(self, name: str) -> MeshClient:
        if name not in self.clients:
            self.clients[name] = MeshClient(self.target, reader=self.signers[name])
        return self.clients[name]

    @property
    def admin(self) -> MeshClient:
        return self.client("admin")

    async def close(self) -> None:
        for c in self.clients.values():
            await c.channel.close()

    def save_state(self) -> None:
        state = {
            "sessions": {n: s.session_epoch for n, s in self.signers.items()},
            "recorded": [
                {
                    "label": r.label,
                    "group_id": r.group_id,
                    "command_id": r.command_id,
                    "actor": r.actor,
                    "envelope": b64(r.envelope),
                    "result": b64(r.result.SerializeToString()),
                }
                for r in self.recorded
            ],
            "artifacts": [
                {"ref": b64(a.ref.SerializeToString()), "holders": sorted(a.holders), "sources": a.sources}
                for a in self.artifacts.values()
            ],
            "cursors": self.cursors,
            "snapshots": self.snapshots,
            "cards": self.cards,
            "grant_id": self.grant_id,
        }
        write_json(self.work / "state.json", state)

    def load_state(self, admin_key: SigningKey) -> None:
        state = json.loads((self.work / "state.json").read_text())
        for name, epoch in state["sessions"].items():
            key = admin_key if name == "admin" else identity_key(name)
            self.signers[name] = SessionSigner(name, int(epoch), key)
        for r in state["recorded"]:
            result = command_pb2.CommandResult.FromString(base64.b64decode(r["result"]))
            envelope = base64.b64decode(r["envelope"])
            self.recorded.append(
                Recorded(r["label"], r["group_id"], r["command_id"], r["actor"], envelope, result)
            )
        for a in state["artifacts"]:
            ref = common_pb2.ArtifactRef.FromString(base64.b64decode(a["ref"]))
            self.artifacts[ref.digest.hex] = Artifact(ref, set(a["holders"]), list(a["sources"]))
        self.cursors, self.snapshots, self.cards = state["cursors"], state["snapshots"], state["cards"]
        self.grant_id = state["grant_id"]

    # ------------------------------------------------------------ commands

    async def run(
        self,
        actor: str,
        group: str,
        kind: str,
        body: Message,
        label: str,
        *,
        record: bool = False,
        extension: wp.BoundedOfflineExecutionBinding | None = None,
    ) -> command_pb2.CommandResult:
        """``body`` signed by ``actor``'s session with a fixed command id (``cmd-<label>``)."""
        signer = self.signers[actor]
        epoch = (
            0
            if kind in ("mission_create", "mission_create_child")
            else await self.admin.membership_epoch(group, actor)
        )
        command = signer.command(group, kind, body, membership_epoch=epoch, command_id=f"cmd-{label}")
        if extension is not None:
            command.extensions.add(
                urn=BOUNDED_OFFLINE_EXECUTION, critical=True, data=extension.SerializeToString()
            )
        envelope = signer.sign(command)
        try:
            result = await self.admin.execute(envelope)
        except grpc.aio.AioRpcError as err:
            raise SystemExit(
                f"fill: {label} ({kind} as {actor} in {group}) refused: {err.details()}"
            ) from None
        if record:
            self.recorded.append(
                Recorded(label, group, command.command_id, actor, envelope.SerializeToString(), result)
            )
        return result

    async def item_state(self, group: str, work_item_id: str) -> int:
        return int((await self.admin.work_item(group, work_item_id)).state)

    # ------------------------------------------------------------ stage 1

    async def register_all(self, admin_key: SigningKey) -> None:
        admin = MeshClient(self.target)
        self.signers["admin"] = await admin.open_session("admin", admin_key)
        self.clients["admin"] = admin
        keys = self.work / "identities"
        keys.mkdir(mode=0o700, exist_ok=True)
        for name, kind in IDENTITIES.items():
            key = identity_key(name)
            path = keys / f"{name}.key"
            if not path.exists():
                write_key(path, key)
            await admin.register_identity("admin", admin_key, name, kind, bytes(key.verify_key))
            client = MeshClient(self.target)
            self.signers[name] = await client.open_session(name, key)
            self.clients[name] = client

    async def publish_card(self) -> None:
        card = agent_card_pb2.AgentCard(
            card_version="1.0.0",
            display_name="upgrade fixture worker",
            max_concurrency=2,
            capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.12.0")],
        )
        answer = await self.client("worker").publish_agent_card(card)
        self.cards.append(
            {
                "agent_id": "worker",
                "card_version": "1.0.0",
                "envelope_blake3": blake3.blake3(answer.published.envelope.SerializeToString()).hexdigest(),
            }
        )

    def contract(self, **overrides: Any) -> wp.WorkContract:
        c = builders.contract(now(), **overrides)
        c.budget.tool_calls = 10  # a dozen WorkItems fit in the Mission's 500 (D162)
        c.time_policy.execution_lease_duration.FromSeconds(LEASE_S)
        c.time_policy.start_deadline.FromSeconds(LEASE_S)
        return c

    async def authorize(
        self, group: str, wi: str, contract: wp.WorkContract | None = None, *, record: bool = False
    ) -> None:
        body = wp.WorkAuthorize(
            work_item_id=wi,
            title=f"upgrade fixture {wi}",
            contract=contract or self.contract(),
            coordinator_epoch=1,
        )
        await self.run("coord", group, "work_authorize", body, f"{wi}-authorize", record=record)

    async def offer(self, group: str, wi: str, to: str) -> str:
        offer_id = f"offer-{wi}"
        body = wp.WorkOffer(
            work_item_id=wi,
            offer_id=offer_id,
            candidate_ids=[to],
            expires_at=to_timestamp(now() + timedelta(hours=1)),
            selection_criteria=[builders.selection(to)],
            coordinator_epoch=1,
        )
        await self.run("coord", group, "work_offer", body, f"{wi}-offer")
        return offer_id

    async def accept(self, group: str, wi: str, who: str) -> int:
        offer_id = await self.offer(group, wi, who)
        body = wp.WorkAcceptOffer(work_item_id=wi, offer_id=offer_id, contract_revision=1)
        result = await self.run(who, group, "work_accept_offer", body, f"{wi}-accept")
        return int(decode_events(result.events)[0].work_offer_accepted.ownership.ownership_epoch)

    async def start(
        self, group: str, wi: str, who: str, *, record: bool = False
    ) -> tuple[int, wp.ExecutionLease]:
        epoch = await self.accept(group, wi, who)
        body = wp.WorkStart(work_item_id=wi, ownership_epoch=epoch, lease_id=f"lease-{wi}")
        result = await self.run(who, group, "work_start", body, f"{wi}-start", record=record)
        return epoch, decode_events(result.events)[0].work_started.lease

    async def upload(
        self,
        who: str,
        group: str,
        wi: str,
        data: bytes,
        media_type: str,
        *,
        lease: wp.ExecutionLease | None = None,
        sources: tuple[common_pb2.ArtifactRef, ...] = (),
    ) -> common_pb2.ArtifactRef:
        """``data`` uploaded by ``who`` with a manifest it signed for the Group's Mission and WorkItem."""
        client = self.client(who)
        mission_id = (await self.admin.group_state(group)).mission.mission_id
        origin = Origin(
            group,
            mission_id,
            wi,
            lease.lease_id if lease else "",
            lease.ownership_epoch if lease else 0,
            await card_version(client, who),
            sources=[s.digest for s in sources],
        )
        ref = await put_artifact(
            client.artifacts, self.signers[who], data, media_type=media_type, origin=origin
        )
        known = self.artifacts.setdefault(ref.digest.hex, Artifact(ref, set()))
        known.holders.add(who)  # it stored the bytes first (no Group it is in referenced them yet)
        known.sources = sorted({*known.sources, *(s.digest.hex for s in sources)})
        return ref

    async def submit(
        self,
        group: str,
        wi: str,
        who: str,
        epoch: int,
        lease: wp.ExecutionLease,
        artifact: common_pb2.ArtifactRef,
        *,
        record: bool = False,
    ) -> str:
        body = wp.WorkSubmit(
            work_item_id=wi,
            lease_id=lease.lease_id,
            ownership_epoch=epoch,
            contract_revision=1,
            artifacts=[artifact],
            evidence=[builders.evidence(f"ev-{wi}")],
            summary=f"{wi} done",
            usage_delta=common_pb2.ResourceVector(currency="EUR", tokens=250, tool_calls=2),
        )
        result = await self.run(who, group, "work_submit", body, f"{wi}-submit", record=record)
        return str(decode_events(result.events)[0].event_id)

    async def root_mission(self) -> None:
        body = builders.mission_create("alice", "coord", now(), title="Upgrade fixture: the root Mission")
        body.coordinator_renewal.lease_duration.FromSeconds(3600)
        await self.run("alice", ROOT, "mission_create", body, "root-create", record=True)
        roles = {
            "worker": Role.MEMBER_ROLE_WORKER,
            "night": Role.MEMBER_ROLE_WORKER,
            "lead": Role.MEMBER_ROLE_WORK_DELEGATE,
            "watcher": Role.MEMBER_ROLE_OBSERVER,
        }
        for member, role in roles.items():
            await self.run(
                "alice",
                ROOT,
                "membership_grant",
                membership_pb2.MembershipGrant(member_id=member, role=role),
                f"root-grant-{member}",
            )

    async def conversations(self) -> None:
        planning = (await self.admin.group_state(ROOT)).mission.planning_conversation_id
        post = builders.message(planning, "Plan: extract, reconcile, report")
        post.message_id = "msg-plan"
        await self.run("alice", ROOT, "message_post", post, "root-msg-plan")
        correction = conversation_pb2.MessageAmend(
            message_id="msg-plan",
            kind=conversation_pb2.MESSAGE_AMENDMENT_KIND_CORRECTION,
            corrected_content=conversation_pb2.MessageContent(text="Plan: extract, reconcile, then report"),
        )
        await self.run("alice", ROOT, "message_amend", correction, "root-msg-plan-correct", record=True)
        reply = builders.message(planning, "On it")
        reply.message_id, reply.reply_to_message_id = "msg-reply", "msg-plan"
        await self.run("coord", ROOT, "message_post", reply, "root-msg-reply")
        retracted = builders.message(planning, "Wrong thread, sorry")
        retracted.message_id = "msg-retracted"
        await self.run("coord", ROOT, "message_post", retracted, "root-msg-retracted")
        retraction = conversation_pb2.MessageAmend(
            message_id="msg-retracted", kind=conversation_pb2.MESSAGE_AMENDMENT_KIND_RETRACTION
        )
        await self.run("coord", ROOT, "message_amend", retraction, "root-msg-retract")
        review = conversation_pb2.ConversationOpen(
            conversation_id="conv-review",
            kind=conversation_pb2.CONVERSATION_KIND_REVIEW,
            title="Review of the figures",
        )
        await self.run("coord", ROOT, "conversation_open", review, "root-conv-review")
        note = builders.message("conv-review", "Figures look right so far")
        note.message_id = "msg-review"
        await self.run("alice", ROOT, "message_post", note, "root-msg-review")
        secret = builders.message(planning, "the staging password is hunter2")
        secret.message_id = "msg-erase"  # erased in stage 2, after the key rotation
        await self.run("alice", ROOT, "message_post", secret, "root-msg-secret")

    async def work_items(self) -> None:
        """One WorkItem in each state the protocol has (docs/workitems.md), plus a proposal."""
        await self.authorize(ROOT, "wi-open", record=True)
        await self.authorize(ROOT, "wi-cancelled")
        await self.run(
            "coord",
            ROOT,
            "work_cancel",
            wp.WorkCancel(work_item_id="wi-cancelled", coordinator_epoch=1, reason="descoped"),
            "wi-cancelled-cancel",
        )
        await self.authorize(ROOT, "wi-offered")
        await self.offer(ROOT, "wi-offered", "worker")
        await self.authorize(ROOT, "wi-queued")
        await self.accept(ROOT, "wi-queued", "worker")
        await self.authorize(ROOT, "wi-active")
        epoch, lease = await self.start(ROOT, "wi-active", "worker", record=True)
        renew = wp.WorkRenewLease(
            work_item_id="wi-active",
            lease_id=lease.lease_id,
            ownership_epoch=epoch,
            usage_delta=common_pb2.ResourceVector(currency="EUR", tokens=100, tool_calls=1),
        )
        await self.run("worker", ROOT, "work_renew_lease", renew, "wi-active-renew")
        await self.authorize(ROOT, "wi-blocked")
        epoch, lease = await self.start(ROOT, "wi-blocked", "worker")
        block = wp.WorkBlock(
            work_item_id="wi-blocked",
            lease_id=lease.lease_id,
            ownership_epoch=epoch,
            checkpoint=wp.Checkpoint(checkpoint_id="ck-blocked"),
            blockers=[
                wp.Blocker(
                    blocker_id="blk-1",
                    kind=wp.BLOCKER_KIND_DEPENDENCY,
                    required_resolution="the ledger export from finance",
                )
            ],
        )
        await self.run("worker", ROOT, "work_block", block, "wi-blocked-block")
        await self.authorize(ROOT, "wi-failed")
        epoch, lease = await self.start(ROOT, "wi-failed", "worker")
        fail = wp.WorkFail(
            work_item_id="wi-failed",
            lease_id=lease.lease_id,
            ownership_epoch=epoch,
            kind=wp.WORK_FAILURE_KIND_PERMANENT,
            reason="the source ledger is missing",
            evidence=[builders.evidence("ev-wi-failed")],
        )
        await self.run("worker", ROOT, "work_fail", fail, "wi-failed-fail")
        await self.authorize(ROOT, "wi-verified")
        epoch, lease = await self.start(ROOT, "wi-verified", "worker")
        figures = await self.upload(
            "worker", ROOT, "wi-verified", b"entity,balance\nEU,1200\nUS,3400\n", "text/csv", lease=lease
        )
        submission = await self.submit(ROOT, "wi-verified", "worker", epoch, lease, figures, record=True)
        accept = wp.WorkAcceptResult(
            work_item_id="wi-verified",
            coordinator_epoch=1,
            submission_event_id=submission,
            comment="matches the ledger",
        )
        await self.run("coord", ROOT, "work_accept_result", accept, "wi-verified-accept-result")
        await self.authorize(ROOT, "wi-submitted")
        epoch, lease = await self.start(ROOT, "wi-submitted", "worker")
        report = await self.upload(
            "worker",
            ROOT,
            "wi-submitted",
            b"# Q3 report\n\nEU 1200, US 3400: total 4600.\n",
            "text/markdown",
            lease=lease,
            sources=(figures,),
        )
        await self.submit(ROOT, "wi-submitted", "worker", epoch, lease, report)
        proposal = wp.WorkPropose(
            proposal_id="prop-extra",
            title="Also check the Q2 figures",
            contract=self.contract(),
            rationale="the auditors asked",
        )
        await self.run("worker", ROOT, "work_propose", proposal, "root-propose")

    async def delegation(self) -> None:
        await self.authorize(ROOT, "wi-scope")
        grant = membership_pb2.MembershipGrantDelegation(
            grantee_id="lead",
            target_work_item_id="wi-scope",
            allowed_capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.0")],
            caps=common_pb2.ResourceVector(
                currency="EUR", financial_micros=2_000_000, tokens=20_000, tool_calls=20
            ),
            max_descendant_depth=2,
            expires_at=to_timestamp(now() + timedelta(hours=2)),
            coordinator_epoch=1,
        )
        result = await self.run(
            "coord", ROOT, "membership_grant_delegation", grant, "root-delegation-grant", record=True
        )
        self.grant_id = decode_events(result.events)[0].delegation_granted.grant.grant_id
        delegated = wp.WorkAuthorize(
            work_item_id="wi-delegated",
            title="upgrade fixture wi-delegated",
            contract=self.contract(),
            parent_work_item_id="wi-scope",
            grant_id=self.grant_id,
        )
        await self.run("lead", ROOT, "work_authorize", delegated, "wi-delegated-authorize")

    async def offline_reconciliation(self, night_key: SigningKey) -> None:
        """night starts wi-offline, loses the service, buffers a progress report and reconnects in a
        new session (which revokes its old lease): the report is reconciled against that lease."""
        contract = self.contract()
        contract.time_policy.offline_grace_period.FromSeconds(GRACE_S)
        await self.authorize(ROOT, "wi-offline", contract)
        _, lease = await self.start(ROOT, "wi-offline", "night")
        started = lease.started_at.ToDatetime().replace(tzinfo=UTC)
        expires = lease.expires_at.ToDatetime().replace(tzinfo=UTC)
        conversation = next(
            c.conversation_id
            for c in (await self.admin.group_state(ROOT)).conversations
            if c.work_item_id == "wi-offline"
        )
        binding = wp.BoundedOfflineExecutionBinding(
            agent_id="night",
            group_id=ROOT,
            work_item_id="wi-offline",
            original_session_epoch=lease.session_epoch,
            ownership_epoch=lease.ownership_epoch,
            historical_lease_id=lease.lease_id,
            disconnected_at=to_timestamp(started),
            buffered_at=to_timestamp(started + timedelta(milliseconds=1)),
            grace_deadline=to_timestamp(expires + timedelta(seconds=GRACE_S)),
            historical_lease_expires_at=lease.expires_at,
            usage_delta=common_pb2.ResourceVector(currency="EUR", tokens=120),
            conversation_id=conversation,
        )
        # The reconnection: a new session fences the old one and revokes its lease (MW-11.3-09).
        night = self.clients["night"]
        self.signers["night"] = await night.open_session("night", night_key)

        async def revoked() -> bool:
            return await self.item_state(ROOT, "wi-offline") == wp.WORK_ITEM_STATE_QUEUED

        await polled(revoked, "the revocation of night's old lease")
        report = wp.WorkReportProgress(
            work_item_id="wi-offline",
            lease_id=lease.lease_id,
            ownership_epoch=lease.ownership_epoch,
            report=wp.ProgressReport(
                phase="offline",
                next_checkpoint=wp.PlannedCheckpoint(description="reconcile the EU ledger"),
                revised_estimate=wp.RevisedEstimate(reason="unchanged"),
            ),
            usage_delta=binding.usage_delta,
        )
        await self.run(
            "night",
            ROOT,
            "work_report_progress",
            report,
            "wi-offline-reconcile",
            record=True,
            extension=binding,
        )

    async def child_mission(self) -> None:
        await self.authorize(ROOT, "wi-parent")
        definition = builders.definition(
            "coord",
            now(),
            title="Upgrade fixture: the child Mission",
            deadline=to_timestamp(now() + timedelta(hours=12)),
            budget=common_pb2.ResourceVector(
                currency="EUR", financial_micros=400_000, tokens=4_000, tool_calls=10
            ),
            risk_policy=mission_pb2.RiskPolicy(
                risk_class=mission_pb2.RISK_CLASS_LOW, execution_approver_ids=["alice"]
            ),
        )
        body = subtask_pb2.MissionCreateChild(
            parent_group_id=ROOT,
            parent_work_item_id="wi-parent",
            definition=definition,
            coordinator_id="child-coord",
            parent_coordinator_epoch=1,
        )
        await self.run("coord", CHILD, "mission_create_child", body, "child-create", record=True)

        async def linked() -> bool:  # the parent's half, appended by the Authority's cross-Group relay
            return await self.item_state(ROOT, "wi-parent") == wp.WORK_ITEM_STATE_BLOCKED

        await polled(linked, "the parent's half of the child link")
        grant = membership_pb2.MembershipGrant(member_id="watcher", role=Role.MEMBER_ROLE_OBSERVER)
        await self.run("coord", CHILD, "membership_grant", grant, "child-grant-watcher")
        planning = (await self.admin.group_state(CHILD)).mission.planning_conversation_id
        post = builders.message(planning, "Starting on the EU ledger")
        post.message_id = "msg-child-start"
        await self.run("child-coord", CHILD, "message_post", post, "child-msg-start")

    async def finished_mission(self) -> None:
        body = builders.mission_create("alice", "coord", now(), title="Upgrade fixture: an approved Mission")
        body.coordinator_renewal.lease_duration.FromSeconds(3600)
        await self.run("alice", DONE, "mission_create", body, "done-create")
        grant = membership_pb2.MembershipGrant(member_id="worker", role=Role.MEMBER_ROLE_WORKER)
        await self.run("alice", DONE, "membership_grant", grant, "done-grant-worker")
        await self.authorize(DONE, "wi-final")
        epoch, lease = await self.start(DONE, "wi-final", "worker")
        final = await self.upload(
            "worker", DONE, "wi-final", b"The approved deliverable\n", "text/plain", lease=lease
        )
        submission = await self.submit(DONE, "wi-final", "worker", epoch, lease, final)
        accept = wp.WorkAcceptResult(
            work_item_id="wi-final", coordinator_epoch=1, submission_event_id=submission
        )
        await self.run("coord", DONE, "work_accept_result", accept, "wi-final-accept-result")
        mission = (await self.admin.group_state(DONE)).mission
        submit = mission_pb2.MissionSubmitForApproval(
            coordinator_epoch=1, mission_revision=mission.revision, summary="all done", artifacts=[final]
        )
        result = await self.run("coord", DONE, "mission_submit_for_approval", submit, "done-submit")
        approve = mission_pb2.MissionApprove(
            submission_event_id=decode_events(result.events)[0].event_id, comment="approved"
        )
        await self.run("alice", DONE, "mission_approve", approve, "done-approve", record=True)

    async def outsider_blobs(self) -> None:
        """A second holder of a stored blob (it proved possession: it reads no Group naming it) and a
        blob only it holds, with no manifest."""
        outsider = self.client("outsider")
        figures = next(a for a in self.artifacts.values() if a.ref.media_type == "text/csv")
        data = b"entity,balance\nEU,1200\nUS,3400\n"
        assert blake3.blake3(data).hexdigest() == figures.ref.digest.hex
        await outsider.upload(data)
        figures.holders.add("outsider")
        private = b"notes only the outsider holds\n"
        answer = await outsider.upload(private)
        ref = common_pb2.ArtifactRef(digest=answer.digest, media_type="application/octet-stream")
        self.artifacts[answer.digest.hex] = Artifact(ref, {"outsider"})

    async def snapshot(self, group: str, *, compact: bool = False, archival: bool = False) -> None:
        taken = await self.admin.authority.TakeSnapshot(
            authority_service_pb2.TakeSnapshotRequest(group_id=group, compact=compact, archival=archival)
        )
        self.snapshots.append(
            {
                "group_id": group,
                "sequence": taken.sequence,
                "digest": taken.digest.hex,
                "archival": archival,
                "compacted": compact,
            }
        )

    # ------------------------------------------------------------ the gateway subscriber

    def hello(self, name: str) -> gpb.HelloFrame:
        signer = self.signers[name]
        proof = gpb.HelloProof(
            agent_id=name,
            session_epoch=signer.session_epoch,
            issued_at=to_timestamp(now()),
            nonce=os.urandom(16),
            audience=self.target,
        )
        envelope = sign_envelope(
            proof.SerializeToString(),
            HELLO_PROOF_TYPE,
            signer.key,
            session_key_id(name, signer.session_epoch),
        )
        return gpb.HelloFrame(agent_id=name, session_epoch=signer.session_epoch, proof=envelope)

    async def stream(self, name: str) -> Any:
        call: Any = gpb_grpc.GatewayServiceStub(self.admin.channel).Connect()
        await call.write(gpb.ConnectRequest(frame=gpb.ClientFrame(hello=self.hello(name))))
        welcome = (await call.read()).frame
        if welcome.WhichOneof("frame") != "welcome":
            raise SystemExit(f"fill: the gateway did not welcome {name}: {welcome}")
        return call

    async def until(self, call: Any, kind: str) -> gpb.ServerFrame:
        while True:
            frame = (await call.read()).frame
            if frame.WhichOneof("frame") == kind:
                return frame
            if frame.WhichOneof("frame") == "error":
                raise SystemExit(f"fill: gateway error: {frame.error}")

    async def stored_cursor(self, name: str, group: str) -> int:
        """The gateway's stored cursor, as SUBSCRIBED at the head reports it (FLOW acked_sequence)."""
        head = (await self.admin.group_state(group)).head_sequence
        call = await self.stream(name)
        sub = gpb.SubscribeFrame(
            subscription_id="probe", group_id=group, after_sequence=head, initial_credits=1
        )
        await call.write(gpb.ConnectRequest(frame=gpb.ClientFrame(subscribe=sub)))
        flow = (await self.until(call, "flow")).flow
        await call.done_writing()
        call.cancel()
        return int(flow.acked_sequence)

    async def acknowledge(self, name: str, group: str, cursor: int) -> None:
        """Subscribe from the start with ``cursor`` credits, take the events and ACK ``cursor``."""
        call = await self.stream(name)
        sub = gpb.SubscribeFrame(
            subscription_id="s1", group_id=group, after_sequence=0, initial_credits=cursor
        )
        await call.write(gpb.ConnectRequest(frame=gpb.ClientFrame(subscribe=sub)))
        delivered = 0
        while delivered < cursor:
            frame = await self.until(call, "event")
            delivered = max(delivered, int(frame.event.last_sequence))
        await call.write(
            gpb.ConnectRequest(
                frame=gpb.ClientFrame(
                    ack=gpb.AckFrame(cursors=[gpb.CursorAck(subscription_id="s1", cursor=cursor)])
                )
            )
        )
        await call.done_writing()
        while await call.read() != grpc.aio.EOF:  # the gateway stores the final ACKs, then ends the stream
            pass

        async def stored() -> bool:
            return await self.stored_cursor(name, group) == cursor

        await polled(stored, f"{name}'s cursor on {group} to be stored")
        self.cursors.append({"agent_id": name, "group_id": group, "cursor": cursor})

    # ------------------------------------------------------------ stage 2

    async def after_rotation(self) -> None:
        erase = conversation_pb2.MessageAmend(
            message_id="msg-erase",
            kind=conversation_pb2.MESSAGE_AMENDMENT_KIND_REDACTION,
            policy_reason="a credential was pasted",
            erasure=conversation_pb2.CONTENT_ERASURE_SECURITY_REDACTION,
        )
        await self.run("alice", ROOT, "message_amend", erase, "root-erase")
        planning = (await self.admin.group_state(ROOT)).mission.planning_conversation_id
        post = builders.message(planning, "Signed by the new Authority key")
        post.message_id = "msg-after-rotation"
        await self.run("coord", ROOT, "message_post", post, "root-msg-after-rotation", record=True)
        await self.authorize(ROOT, "wi-late")
        child_planning = (await self.admin.group_state(CHILD)).mission.planning_conversation_id
        note = builders.message(child_planning, "EU ledger reconciled")
        note.message_id = "msg-child-progress"
        await self.run("child-coord", CHILD, "message_post", note, "child-msg-progress", record=True)
        await self.snapshot(ROOT)
        child_head = (await self.admin.group_state(CHILD)).head_sequence
        await self.acknowledge("watcher", CHILD, child_head - 1)

    # ------------------------------------------------------------ expected.json

    async def expected(self, backend: str, release: str) -> dict[str, Any]:
        key = await self.admin.authority.GetAuthorityKey(authority_service_pb2.GetAuthorityKeyRequest())
        groups: dict[str, Any] = {}
        for group in GROUPS:
            events: list[tuple[common_pb2.SignedEnvelope, event_pb2.Event]] = []
            call = self.admin.authority.ReadEvents(
                authority_service_pb2.ReadEventsRequest(group_id=group, after_sequence=0)
            )
            async for batch in call:
                events.extend(zip(batch.events, decode_events(batch.events), strict=True))
            commands: dict[str, list[int]] = {}
            for _, event in events:
                span = commands.setdefault(event.causing_command_id, [event.sequence, event.sequence])
                span[1] = event.sequence
            state = await self.admin.group_state(group)
            items = await self.admin.work_items(group)
            groups[group] = {
                "events": len(events),
                "head_sequence": state.head_sequence,
                "head_digest": chain_link(*events[-1]).hex(),
                "log_digest": log_digest(e for e, _ in events),
                "event_types": sorted({e.type for _, e in events}),
                "commands": [[command_id, first, last] for command_id, (first, last) in commands.items()],
                "work_items": {i.work_item_id: wp.WorkItemState.Name(i.state) for i in items},
                "mission_state": mission_pb2.MissionState.Name(state.mission.state),
            }
        artifacts = []
        for known in sorted(self.artifacts.values(), key=lambda a: a.ref.digest.hex):
            hex_digest = known.ref.digest.hex
            blob = self.data_dir / "blobs" / hex_digest[:2] / hex_digest[2:4] / hex_digest
            if not blob.is_file():  # the local backend's layout, which regenerate.sh copies into the fixture
                raise SystemExit(f"fill: blob {hex_digest} is not at {blob}")
            manifests = await self.admin.artifacts.GetManifest(
                artifact_service_pb2.GetManifestRequest(digest=known.ref.digest)
            )
            artifacts.append(
                {
                    "digest": known.ref.digest.hex,
                    "size": known.ref.digest.size_bytes,
                    "media_type": known.ref.media_type,
                    "holders": sorted(known.holders),
                    "manifests": sorted(manifest_digest(m) for m in manifests.manifests),
                    "sources": known.sources,
                }
            )
        identities = {
            name: {
                "kind": common_pb2.IdentityKind.Name(kind),
                "key_file": f"identities/{name}.key",
                "session_epoch": self.signers[name].session_epoch,
            }
            for name, kind in IDENTITIES.items()
        }
        identities["admin"] = {
            "kind": "IDENTITY_KIND_HUMAN",
            "key_file": "data/keys/admin.key",
            "session_epoch": self.signers["admin"].session_epoch,
        }
        recorded = []
        for r in self.recorded:
            recorded.append(
                {
                    "label": r.label,
                    "group_id": r.group_id,
                    "command_id": r.command_id,
                    "actor": r.actor,
                    "session_epoch": self.signers[r.actor].session_epoch,
                    "envelope": b64(r.envelope),
                    "group_revision": r.result.group_revision,
                    "events": [
                        {
                            "sequence": e.sequence,
                            "event_id": e.event_id,
                            "type": e.type,
                            "payload_blake3": blake3.blake3(env.payload).hexdigest(),
                        }
                        for env, e in zip(r.result.events, decode_events(r.result.events), strict=True)
                    ],
                }
            )
        return {
            "release": release,
            "backend": backend,
            "generated_at": now().isoformat(timespec="seconds"),
            "authority_keys": [k.key_id for k in key.keys],
            "identities": identities,
            "groups": groups,
            "recorded_commands": recorded,
            "cursors": self.cursors,
            "snapshots": self.snapshots,
            "artifacts": artifacts,
            "agent_cards": self.cards,
            "delegation_grants": [self.grant_id],
        }


def chain_link(envelope: common_pb2.SignedEnvelope, event: event_pb2.Event) -> bytes:
    """What the next event's previous_digest names (docs/integrity.md): BLAKE3 of the payload as
    first signed; an erased event keeps it in its redaction marker."""
    if event.HasField("redaction") and event.redaction.original_event_digest:
        return bytes(event.redaction.original_event_digest)
    return blake3.blake3(envelope.payload).digest()


def log_digest(envelopes: Any) -> str:
    """BLAKE3 over every event's payload, signing key id and signature, in sequence order."""
    h = blake3.blake3()
    for envelope in envelopes:
        h.update(blake3.blake3(envelope.payload).digest())
        for signature in envelope.signatures:
            h.update(signature.key_id.encode() + b"\x00" + signature.sig)
    return h.hexdigest()


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=1) + "\n")


async def stage1(f: Filler, admin_key: SigningKey) -> None:
    await f.register_all(admin_key)
    await f.publish_card()
    await f.root_mission()
    await f.conversations()
    await f.work_items()
    await f.delegation()
    await f.offline_reconciliation(identity_key("night"))
    await f.child_mission()
    await f.finished_mission()
    await f.outsider_blobs()
    await f.snapshot(ROOT)
    await f.snapshot(DONE, compact=True, archival=True)
    await f.acknowledge("watcher", ROOT, CURSOR_ROOT)
    f.save_state()


async def stage2(f: Filler, admin_key: SigningKey, expected: Path, backend: str, release: str) -> None:
    f.load_state(admin_key)
    await f.after_rotation()
    f.save_state()
    document = await f.expected(backend, release)
    write_json(expected, document)


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the mesh, HOST:PORT")
    parser.add_argument("--admin-key", required=True, type=Path, help="the Organization admin's key file")
    parser.add_argument("--data-dir", required=True, type=Path, help="the mesh's data directory")
    parser.add_argument(
        "--work-dir", required=True, type=Path, help="identity keys and state between the stages"
    )
    parser.add_argument("--stage", required=True, type=int, choices=(1, 2))
    parser.add_argument("--expected", type=Path, help="stage 2: where to write expected.json")
    parser.add_argument("--backend", default="sqlite", choices=("sqlite", "postgres"))
    parser.add_argument("--release", default="v0.1.0")
    args = parser.parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    admin_key = read_key(args.admin_key)
    f = Filler(args.target, args.work_dir, args.data_dir)
    try:
        if args.stage == 1:
            await stage1(f, admin_key)
        else:
            if args.expected is None:
                parser.error("--stage 2 needs --expected")
            await stage2(f, admin_key, args.expected, args.backend, args.release)
    finally:
        await f.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
