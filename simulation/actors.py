"""The simulated clients: seeded Coordinators, Workers, MissionOwners, delegates, offline Workers
and the readers that follow a Group log through the gateway.

Each decides its next command from a view of the Group (the store's synced fold, as a read model
answers; sometimes a stale copy of it, so that stale epochs and lease ids are sent too), sends it
through the simulated network and waits for the answer. A timeout is an unknown outcome (INFO): the
client retries the same command id, as the SDK does. One client has one operation open at a time,
as ``simulation.history`` requires of a process.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from google.protobuf.message import Message as Proto

from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import command_pb2, common_pb2, conversation_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.state import GroupState, MemberState, WorkItemState
from simulation import bodies
from simulation.clock import SimClock
from simulation.history import History, Kind, Phase
from simulation.messages import (
    Batch,
    CommandReply,
    CommandRequest,
    Entry,
    Fetch,
    Message,
    OpenSession,
    SessionOpened,
    Upload,
    Uploaded,
)
from simulation.stats import Stats
from simulation.store import Store

WS = wp.WorkItemState
MS = mission_pb2.MissionState
TIMEOUT_MS = 600
MAX_ATTEMPTS = 6


@dataclass
class Env:
    """What every client shares: the seeded generator, clock, network, history and directory."""

    rng: random.Random
    clock: SimClock
    send: Callable[[str, str, Message], None]
    history: History
    store: Store  # read models: a client's view is the store's synced fold (GetGroupState)
    authorities: list[str]
    stats: Stats
    trace: Callable[[str], None]
    cut_off: Callable[[str], bool]  # is this client partitioned away (an offline Worker knows)
    acknowledged: dict[tuple[str, str], int] = field(default_factory=dict)  # (group, command id) -> seq
    _request_ids: int = 0

    def request_id(self) -> int:
        self._request_ids += 1
        return self._request_ids


@dataclass
class OpenOp:
    kind: str  # "command", "session", "upload", "read"
    request_id: int
    deadline_ms: int
    target: str
    command: command_pb2.Command | None = None
    attempts: int = 1
    after: int = 0  # read: the cursor read from


class Client:
    def __init__(self, name: str, group_id: str, env: Env) -> None:
        self.name, self.group_id, self.env = name, group_id, env
        self.session = 1
        self.op: OpenOp | None = None
        self.route = env.authorities[int(group_id.rsplit("_", 1)[1]) % len(env.authorities)]
        self._n = 0
        self._stale: GroupState | None = None  # an old view it may act on
        self._stale_head = -1
        self.snapshot_rate = 0.05

    # ------------------------------------------------------------ views and commands

    def view(self) -> GroupState | None:
        """The Group as a read model shows it now; now and then a stale copy (an agent acting on
        what it last saw)."""
        row = self.env.store.row(self.group_id)
        fresh = row.synced_state if row is not None else None
        rng = self.env.rng
        if self._stale is not None and rng.random() < 0.15:
            return self._stale
        if (
            fresh is not None
            and rng.random() < self.snapshot_rate
            and self._stale_head != fresh.head_sequence
        ):
            self._stale, self._stale_head = copy.deepcopy(fresh), fresh.head_sequence
        return fresh

    def membership_epoch(self, state: GroupState | None) -> int:
        member = state.members.get(self.name) if state is not None else None
        return member.membership_epoch if member is not None else 0

    def command(self, state: GroupState | None, kind: str, body: object) -> command_pb2.Command:
        self._n += 1
        c = command_pb2.Command(
            command_id=f"{self.name}.{self._n}",
            group_id=self.group_id,
            actor_id=self.name,
            session_epoch=self.session,
            membership_epoch=self.membership_epoch(state) if kind != "mission_create" else 0,
            issued_at=to_timestamp(self.env.clock.now()),
        )
        getattr(c, kind).CopyFrom(body)
        return c

    def submit(self, command: command_pb2.Command, attempts: int = 1) -> None:
        env = self.env
        rid = env.request_id()
        self.op = OpenOp("command", rid, env.clock.ms + TIMEOUT_MS, self.route, command, attempts)
        env.history.record(
            self.name, Kind.COMMAND, Phase.INVOKE, command.group_id, command_id=command.command_id
        )
        env.trace(
            f"{self.name} -> {self.route} {command.WhichOneof('body')} {command.command_id} try {attempts}"
        )
        env.send(self.name, self.route, CommandRequest(rid, self.name, command))

    def open_session(self) -> None:
        rid = self.env.request_id()
        self.op = OpenOp("session", rid, self.env.clock.ms + TIMEOUT_MS, "membership")
        self.env.send(self.name, "membership", OpenSession(rid, self.name))

    # ------------------------------------------------------------ answers and timeouts

    def tick(self) -> None:
        """Time out the open operation, or decide the next one."""
        op = self.op
        if op is not None:
            if self.env.clock.ms >= op.deadline_ms:
                self._timed_out(op)
            return
        if self.env.rng.random() < self.activity():
            self.act()

    def activity(self) -> float:
        return 0.3

    def act(self) -> None:
        raise NotImplementedError

    def _timed_out(self, op: OpenOp) -> None:
        self.op = None
        if op.kind != "command":
            return
        assert op.command is not None
        env = self.env
        env.history.record(
            self.name, Kind.COMMAND, Phase.INFO, op.command.group_id, command_id=op.command.command_id
        )
        env.trace(f"{self.name} timeout {op.command.command_id}")
        # Another instance may own the Group by now (the one asked may have crashed).
        self.route = env.authorities[(env.authorities.index(self.route) + 1) % len(env.authorities)]
        if op.attempts < MAX_ATTEMPTS and env.rng.random() < 0.9:
            self.submit(op.command, op.attempts + 1)  # the same command id: at most once

    def receive(self, message: Message) -> None:
        op = self.op
        if op is None or getattr(message, "request_id", None) != op.request_id:
            return  # a duplicate, or the answer to an operation that timed out
        self.op = None
        if isinstance(message, CommandReply):
            self._answered(op, message)
        elif isinstance(message, SessionOpened):
            self.session = message.session_epoch
            self.env.trace(f"{self.name} session {self.session}")
        elif isinstance(message, Uploaded):
            self.uploaded(message.digest)

    def _answered(self, op: OpenOp, reply: CommandReply) -> None:
        env, command = self.env, op.command
        assert command is not None
        cid = command.command_id
        if reply.ok:
            env.history.record(
                self.name,
                Kind.COMMAND,
                Phase.OK,
                command.group_id,
                command_id=cid,
                seq=reply.seq,
                shard=reply.shard,
            )
            env.acknowledged.setdefault((command.group_id, cid), reply.seq)
            env.trace(
                f"{self.name} ok {cid} seq {reply.seq}{' replayed' if reply.replayed else ''} by {reply.shard}"
            )
            self.accepted(command)
            return
        env.history.record(
            self.name, Kind.COMMAND, Phase.FAIL, command.group_id, command_id=cid, shard=reply.shard
        )
        env.trace(f"{self.name} refused {cid} {reply.reason} by {reply.shard}")
        if reply.reason == "NOT_OWNER":
            self.route = reply.owner_hint or self.route
            if op.attempts < MAX_ATTEMPTS:
                self.submit(command, op.attempts + 1)
        elif reply.reason == "REJECTION_REASON_SESSION_EPOCH_STALE":
            self.open_session()  # fenced: this runtime was replaced; take a session again
        else:
            self.refused(command, reply.reason)

    def accepted(self, command: command_pb2.Command) -> None:
        """A hook for actors that remember what they did."""

    def uploaded(self, digest: str) -> None:
        """A hook for Workers."""

    def refused(self, command: command_pb2.Command, reason: str) -> None:
        """A hook for actors that react to a refusal."""


def active_member(state: GroupState | None, member_id: str) -> MemberState | None:
    member = state.members.get(member_id) if state is not None else None
    return member if member is not None and member.active else None


class Owner(Client):
    """The MissionOwner (a human): creates the Mission, grants and revokes Memberships, opens the
    restricted Conversation, posts in it, and approves the Mission's result."""

    def __init__(
        self,
        name: str,
        group_id: str,
        env: Env,
        coordinators: tuple[str, str],
        members: Mapping[str, int],
        party: str,
        provisional: str,
    ) -> None:
        super().__init__(name, group_id, env)
        self.coordinators, self.members, self.party, self.provisional = (
            coordinators,
            members,
            party,
            provisional,
        )
        self.restricted = f"cv-restricted-{group_id}"
        self.posted: list[str] = []  # its Messages in the restricted Conversation, as accepted

    def accepted(self, command: command_pb2.Command) -> None:
        if command.WhichOneof("body") == "message_post":
            self.posted.append(command.message_post.message_id)

    def act(self) -> None:
        state, rng = self.view(), self.env.rng
        if state is None:
            self.submit(
                self.command(
                    None,
                    "mission_create",
                    bodies.mission_create(self.name, self.coordinators[0], self.env.clock.now()),
                )
            )
            return
        assert state.mission is not None
        if state.mission.state not in (MS.MISSION_STATE_ACTIVE, MS.MISSION_STATE_AWAITING_APPROVAL):
            return  # ended: nothing more to change
        now = self.env.clock.now()
        for member_id in sorted(self.members):
            member = active_member(state, member_id)
            if member is None or member.lapsed(now):
                grant = bodies.membership_grant(member_id, self.members[member_id])
                if member_id == self.provisional:  # just in time (MW-8-06): until it accepts an offer
                    grant.provisional = True
                    grant.expires_at.CopyFrom(to_timestamp(now + timedelta(seconds=30)))
                self.submit(self.command(state, "membership_grant", grant))
                return
        lease = state.mission.coordinator
        if lease is not None and lease.expires_at <= now and state.mission.state == MS.MISSION_STATE_ACTIVE:
            # MW-7.2-04/05: the lease lapsed; the standby (or the first one again) takes a higher epoch.
            successor = next(c for c in self.coordinators if c != lease.agent_id)
            replace = mission_pb2.MissionReplaceCoordinator(
                coordinator_id=successor,
                replaced_coordinator_epoch=lease.coordinator_epoch,
                coordinator_renewal=bodies.coordinator_renewal(),
            )
            self.submit(self.command(state, "mission_replace_coordinator", replace))
        elif self.restricted not in state.conversations:
            body: Proto = bodies.conversation_open(self.restricted, [self.party])
            self.submit(self.command(state, "conversation_open", body))
        elif state.mission.state == MS.MISSION_STATE_AWAITING_APPROVAL:
            body = mission_pb2.MissionApprove(
                submission_event_id=state.mission.latest_submission_event_id, comment="fine"
            )
            self.submit(self.command(state, "mission_approve", body))
        elif rng.random() < 0.3:
            self._n += 1
            body = bodies.message_post(self.restricted, f"{self.name}.m{self._n}", "the price is 42")
            self.submit(self.command(state, "message_post", body))
        elif rng.random() < 0.2 and self.posted:
            # A correction of something said in the restricted Conversation: as hidden as the post.
            body = conversation_pb2.MessageAmend(
                message_id=rng.choice(self.posted),
                kind=conversation_pb2.MESSAGE_AMENDMENT_KIND_CORRECTION,
                corrected_content=conversation_pb2.MessageContent(text="the price is 43"),
            )
            self.submit(self.command(state, "message_amend", body))
        elif rng.random() < 0.1:
            # A Membership change: a Worker is revoked (re-granted later under a new epoch).
            workers = [
                m
                for m, role in sorted(self.members.items())
                if role == membership_pb2.MEMBER_ROLE_WORKER and m != self.provisional
            ]
            body = membership_pb2.MembershipRevoke(member_id=rng.choice(workers), reason="rotation")
            self.submit(self.command(state, "membership_revoke", body))


class Coordinator(Client):
    """The Mission's Coordinator: authorizes WorkItems, offers them, accepts results, submits the
    Mission and posts in the restricted Conversation."""

    def __init__(
        self, name: str, group_id: str, env: Env, work_items: list[str], workers: list[str], delegate: str
    ) -> None:
        super().__init__(name, group_id, env)
        self.work_items, self.workers, self.delegate = work_items, workers, delegate
        self.restricted = f"cv-restricted-{group_id}"
        self.epoch = 0  # the Coordinator epoch it last held: a replaced one keeps using it

    def activity(self) -> float:
        return 0.5

    def act(self) -> None:
        state, env, rng = self.view(), self.env, self.env.rng
        if state is None or state.mission is None or state.mission.coordinator is None:
            return
        now = env.clock.now()
        lease = state.mission.coordinator
        if lease.agent_id == self.name:
            self.epoch = lease.coordinator_epoch
        if not self.epoch:
            return  # the standby: not appointed (yet)
        if lease.agent_id == self.name and not lease.reconciled:
            # MW-7.2-08: a replacement first acknowledges the state it has read.
            body: Proto = mission_pb2.MissionAcknowledgeReconciliation(
                coordinator_epoch=self.epoch, group_revision=state.head_sequence
            )
            self.submit(self.command(state, "mission_acknowledge_reconciliation", body))
            return
        if state.mission.state not in (MS.MISSION_STATE_ACTIVE, MS.MISSION_STATE_AWAITING_APPROVAL):
            return  # ended: nothing more to coordinate
        if (
            lease.agent_id == self.name
            and (lease.expires_at - now).total_seconds() < bodies.COORDINATOR_RENEW_BEFORE_S
        ):
            self.submit(
                self.command(
                    state,
                    "mission_renew_coordinator_lease",
                    mission_pb2.MissionRenewCoordinatorLease(coordinator_epoch=self.epoch),
                )
            )
            return
        missing = [w for w in self.work_items if w not in state.work_items]
        if missing:
            self.submit(
                self.command(state, "work_authorize", bodies.work_authorize(missing[0], now, self.epoch))
            )
            return
        items = [state.work_items[w] for w in self.work_items]
        live = [g for g in state.grants.values() if not g.revoked and g.grantee_id == self.delegate]
        target = state.work_items[self.work_items[0]]
        if (
            not live
            and target.state not in (WS.WORK_ITEM_STATE_VERIFIED, WS.WORK_ITEM_STATE_CANCELLED)
            and rng.random() < 0.3
        ):
            body = bodies.delegation_grant(self.delegate, target.work_item_id, now, self.epoch)
            self.submit(self.command(state, "membership_grant_delegation", body))
            return
        if live and rng.random() < 0.01:
            revoke = membership_pb2.MembershipRevokeDelegation(grant_id=live[0].grant_id, reason="re-planned")
            self.submit(self.command(state, "membership_revoke_delegation", revoke))
            return
        for item in [state.work_items[w] for w in sorted(state.work_items)]:
            if item.state == WS.WORK_ITEM_STATE_SUBMITTED:
                body = wp.WorkAcceptResult(
                    work_item_id=item.work_item_id,
                    coordinator_epoch=self.epoch,
                    submission_event_id=item.latest_submission_event_id,
                )
                self.submit(self.command(state, "work_accept_result", body))
                return
        running = [i for i in items if i.state in (WS.WORK_ITEM_STATE_QUEUED, WS.WORK_ITEM_STATE_ACTIVE)]
        if running and rng.random() < 0.01:
            # A transient failure (the WorkItem is retried under a new owner) or, rarely, a cancellation.
            item = rng.choice(running)
            if rng.random() < 0.8:
                self._n += 1
                fail = wp.WorkFail(
                    work_item_id=item.work_item_id,
                    coordinator_epoch=self.epoch,
                    kind=wp.WORK_FAILURE_KIND_TRANSIENT,
                    evidence=[bodies.evidence(f"{self.name}.ev{self._n}")],
                    reason="the tool timed out",
                )
                self.submit(self.command(state, "work_fail", fail))
            else:
                cancel = wp.WorkCancel(
                    work_item_id=item.work_item_id, coordinator_epoch=self.epoch, reason="not needed"
                )
                self.submit(self.command(state, "work_cancel", cancel))
            return
        items = [state.work_items[w] for w in sorted(state.work_items)]  # delegated ones too
        # A WorkItem without a live owner (none, or its ownership lapsed unstarted) is offered again.
        offerable = [
            i
            for i in items
            if i.state in (WS.WORK_ITEM_STATE_OPEN, WS.WORK_ITEM_STATE_QUEUED)
            and (i.owner is None or (i.owner.expires_at <= now and i.lease is None))
            and not any(o.open and o.expires_at > now for o in i.offers.values())
        ]
        if offerable:
            item = rng.choice(offerable)
            active = [w for w in self.workers if active_member(state, w)] or self.workers
            candidates = sorted(rng.sample(active, rng.randint(1, min(2, len(active)))))
            self._n += 1
            # MW-8-06: an offer to a provisional member lapses no later than its Membership.
            members = [state.members[c] for c in candidates if c in state.members]
            expiry = min(
                [now + timedelta(seconds=60)]
                + [m.expires_at for m in members if m.provisional and m.expires_at is not None]
            )
            body = bodies.work_offer(
                item.work_item_id, f"{self.name}.o{self._n}", candidates, now, self.epoch, expiry
            )
            self.submit(self.command(state, "work_offer", body))
            return
        if state.mission.state == MS.MISSION_STATE_ACTIVE and all(
            i.state == WS.WORK_ITEM_STATE_VERIFIED for i in items
        ):
            refs = [bodies.artifact_ref(d) for i in items for d, _ in i.submitted_artifacts[:1]]
            body = mission_pb2.MissionSubmitForApproval(
                coordinator_epoch=self.epoch, mission_revision=state.mission.revision, artifacts=refs
            )
            self.submit(self.command(state, "mission_submit_for_approval", body))
        elif rng.random() < 0.2 and self.restricted in state.conversations:
            self._n += 1
            body = bodies.message_post(self.restricted, f"{self.name}.m{self._n}", "margin notes")
            self.submit(self.command(state, "message_post", body))


class Worker(Client):
    """A Worker agent: accepts offers, starts under a lease, renews with usage, checkpoints, uploads
    its result to the artifact store (an upload may be skipped: its submission must then be refused)
    and submits it."""

    def __init__(self, name: str, group_id: str, env: Env) -> None:
        super().__init__(name, group_id, env)
        self.uploads: dict[str, str] = {}  # work item -> the digest of its current result
        self.confirmed: set[str] = set()  # digests the artifact store confirmed

    def activity(self) -> float:
        return 0.5

    def refused(self, command: command_pb2.Command, reason: str) -> None:
        if command.WhichOneof("body") == "work_submit" and reason == "REJECTION_REASON_NOT_FOUND":
            self.uploads.pop(command.work_submit.work_item_id, None)  # not stored: upload it again

    def mine(self, state: GroupState) -> list[WorkItemState]:
        return [state.work_items[w] for w in sorted(state.work_items)]

    def act(self) -> None:
        state, env, rng = self.view(), self.env, self.env.rng
        if active_member(state, self.name) is None or state is None:
            return
        now = env.clock.now()
        for item in self.mine(state):
            for offer in item.offers.values():
                if offer.open and self.name in offer.candidate_ids and offer.expires_at > now:
                    body: Proto = wp.WorkAcceptOffer(
                        work_item_id=item.work_item_id, offer_id=offer.offer_id, contract_revision=1
                    )
                    self.submit(self.command(state, "work_accept_offer", body))
                    return
        for item in self.mine(state):
            owner = item.owner
            if (
                owner is None
                or owner.agent_id != self.name
                or item.state not in (WS.WORK_ITEM_STATE_QUEUED, WS.WORK_ITEM_STATE_ACTIVE)
            ):
                continue
            lease = item.lease
            if lease is None or lease.agent_id != self.name or rng.random() < 0.05:
                self._n += 1
                body = wp.WorkStart(
                    work_item_id=item.work_item_id,
                    ownership_epoch=owner.ownership_epoch,
                    lease_id=f"{self.name}.l{self._n}",
                )
                self.submit(self.command(state, "work_start", body))
                return
            self.under_lease(state, item, lease.lease_id, owner.ownership_epoch)
            return

    def lease_command(
        self, state: GroupState, item: WorkItemState, lease_id: str, epoch: int
    ) -> command_pb2.Command | None:
        """The next command under a running lease: a renewal with usage, a checkpoint or the result."""
        rng, wid = self.env.rng, item.work_item_id
        roll = rng.random()
        if roll < 0.5:
            usage = common_pb2.ResourceVector(tokens=rng.choice([50, 100, 200, 400]))
            body = wp.WorkRenewLease(
                work_item_id=wid, lease_id=lease_id, ownership_epoch=epoch, usage_delta=usage
            )
            return self.command(state, "work_renew_lease", body)
        if roll < 0.65:
            self._n += 1
            checkpoint = wp.WorkCheckpoint(
                work_item_id=wid,
                lease_id=lease_id,
                ownership_epoch=epoch,
                checkpoint=wp.Checkpoint(checkpoint_id=f"{self.name}.ck{self._n}"),
                usage_delta=common_pb2.ResourceVector(tokens=rng.choice([0, 50, 100])),
            )
            return self.command(state, "work_checkpoint", checkpoint)
        digest = self.uploads.get(wid)
        if digest is None:
            return None
        self._n += 1
        submit = bodies.work_submit(wid, lease_id, epoch, digest, f"{self.name}.ev{self._n}")
        submit.usage_delta.tokens = rng.choice([0, 0, 100])
        return self.command(state, "work_submit", submit)

    def under_lease(self, state: GroupState, item: WorkItemState, lease_id: str, epoch: int) -> None:
        rng, wid = self.env.rng, item.work_item_id
        if wid not in self.uploads and rng.random() < 0.5:
            digest = f"{rng.getrandbits(256):064x}"
            self.uploads[wid] = digest
            if rng.random() < 0.1:
                self.env.stats.fault("upload.skipped")  # the agent names a result it never uploaded
                return
            assert state.mission is not None
            rid = self.env.request_id()
            self.op = OpenOp("upload", rid, self.env.clock.ms + TIMEOUT_MS, "artifacts")
            self.env.send(
                self.name, "artifacts", Upload(rid, self.name, digest, wid, state.mission.mission_id)
            )
            return
        command = self.lease_command(state, item, lease_id, epoch)
        if command is not None:
            self.submit(command)


class OfflineWorker(Worker):
    """A Worker that loses the Group service now and then. Meanwhile it keeps working: it buffers
    checkpoints with the bounded-offline-execution binding (MW-11.5-07..13) naming the lease it
    held, and renewals as they were signed. Back online (sometimes from a new session) it sends
    them: the buffered checkpoints rebased onto its current session (MW-11.5-09), the renewals as
    they are or rebased. Whatever has gone stale meanwhile must be refused."""

    def __init__(self, name: str, group_id: str, env: Env) -> None:
        super().__init__(name, group_id, env)
        self.buffer: list[command_pb2.Command] = []
        self.disconnected_ms: int | None = None
        self.snapshot_rate = 0.3  # its last view is what it works from once offline

    def act(self) -> None:
        env = self.env
        if env.cut_off(self.name):
            if self.disconnected_ms is None:
                self.disconnected_ms = env.clock.ms
            self._buffer_one()
            return
        if self.disconnected_ms is not None:
            self.disconnected_ms = None
            if env.rng.random() < 0.5:
                self.open_session()  # the runtime restarted while offline
                return
        if self.buffer:
            command = self.buffer.pop(0)
            if command.extensions or env.rng.random() < 0.5:
                command.session_epoch = self.session  # rebased and signed again
            env.trace(f"{self.name} sends buffered {command.command_id} in session {command.session_epoch}")
            self.submit(command)
            return
        super().act()

    def _timed_out(self, op: OpenOp) -> None:
        if not self.env.cut_off(self.name):
            super()._timed_out(op)
            return
        self.op = None  # offline: its outcome stays unknown; the Worker buffers from now on
        if op.command is not None:
            self.env.history.record(
                self.name, Kind.COMMAND, Phase.INFO, self.group_id, command_id=op.command.command_id
            )

    def _buffer_one(self) -> None:
        """Work on while cut off, from the last view it had (it cannot read the Group now)."""
        env, rng = self.env, self.env.rng
        state = self._stale
        if state is None or len(self.buffer) >= 4 or self.disconnected_ms is None:
            return
        for wid in sorted(state.work_items):
            item = state.work_items[wid]
            lease, owner = item.lease, item.owner
            if lease is None or owner is None or lease.agent_id != self.name:
                continue
            if rng.random() < 0.5:
                command = self.lease_command(state, item, lease.lease_id, owner.ownership_epoch)
                if command is None or command.WhichOneof("body") == "work_submit":
                    return
            else:
                now = env.clock.now()
                usage = common_pb2.ResourceVector(tokens=rng.choice([0, 50, 100]))
                self._n += 1
                body = wp.WorkCheckpoint(
                    work_item_id=wid,
                    lease_id=lease.lease_id,
                    ownership_epoch=owner.ownership_epoch,
                    checkpoint=wp.Checkpoint(checkpoint_id=f"{self.name}.ck{self._n}"),
                    usage_delta=usage,
                )
                command = self.command(state, "work_checkpoint", body)
                command.extensions.append(
                    bodies.offline_binding(
                        self.name,
                        self.group_id,
                        item.conversation_id,
                        wid,
                        lease.session_epoch,
                        owner.ownership_epoch,
                        lease.lease_id,
                        lease.expires_at,
                        now - _ms(env.clock.ms - self.disconnected_ms),
                        now,
                        usage,
                    )
                )
            self.buffer.append(command)
            env.stats.fault("offline.buffered")
            return


def _ms(ms: int) -> timedelta:
    return timedelta(milliseconds=ms)


class Delegate(Client):
    """A work delegate (an agent with the WORK_DELEGATE role): under a live delegation grant it
    authorizes WorkItems below the grant's target and offers them (MW-9.1); it also talks in the
    planning Conversation. It is no party to the restricted Conversation: what is said there must
    never reach it."""

    def __init__(self, name: str, group_id: str, env: Env, workers: list[str]) -> None:
        super().__init__(name, group_id, env)
        self.workers = workers

    def act(self) -> None:
        state, rng, env = self.view(), self.env.rng, self.env
        if active_member(state, self.name) is None or state is None or state.mission is None:
            return
        now = env.clock.now()
        grants = [g for gid, g in sorted(state.grants.items()) if g.grantee_id == self.name and not g.revoked]
        if grants and rng.random() < 0.7:
            grant = grants[-1]
            mine = sorted(w for w in state.work_items if w.startswith(f"{grant.target_work_item_id}.d"))
            if len(mine) < 2:
                wid = f"{grant.target_work_item_id}.d{len(mine) + 1}"
                body: Proto = bodies.delegated_work(wid, grant.target_work_item_id, grant.grant_id, now)
                self.submit(self.command(state, "work_authorize", body))
                return
            for wid in mine:
                item = state.work_items[wid]
                if (
                    item.state in (WS.WORK_ITEM_STATE_OPEN, WS.WORK_ITEM_STATE_QUEUED)
                    and (item.owner is None or (item.owner.expires_at <= now and item.lease is None))
                    and not any(o.open and o.expires_at > now for o in item.offers.values())
                ):
                    self._n += 1
                    offer = bodies.work_offer(
                        wid, f"{self.name}.o{self._n}", [rng.choice(self.workers)], now, 0
                    )
                    offer.grant_id = grant.grant_id
                    self.submit(self.command(state, "work_offer", offer))
                    return
        self._n += 1
        body = bodies.message_post(
            state.mission.planning_conversation_id, f"{self.name}.m{self._n}", "status?"
        )
        self.submit(self.command(state, "message_post", body))


class Reader:
    """A member's reader of the Group log through the gateway (the SDK's follow loop, modeled): it
    asks for what follows its cursor and accepts an answer only if it continues the cursor exactly
    (skipped sequences included); anything else is a gap, and it asks again."""

    def __init__(self, member_id: str, group_id: str, env: Env, trust_batches: bool) -> None:
        self.name = f"{member_id}.reader"
        self.member_id, self.group_id, self.env = member_id, group_id, env
        self.trust_batches = trust_batches
        self.cursor = 0
        self.op: OpenOp | None = None
        self.delivered: list[Entry] = []  # everything accepted, in order (the invariants read it)
        self.starts: list[int] = []  # each effective cursor the gateway declared (visibility start)

    def tick(self) -> None:
        env = self.env
        op = self.op
        if op is not None:
            if env.clock.ms >= op.deadline_ms:
                env.history.record(self.name, Kind.READ, Phase.INFO, self.group_id)
                self.op = None
            return
        if env.rng.random() < 0.3:
            rid = env.request_id()
            self.op = OpenOp("read", rid, env.clock.ms + TIMEOUT_MS, "gateway", after=self.cursor)
            env.history.record(self.name, Kind.READ, Phase.INVOKE, self.group_id, after=self.cursor)
            env.send(self.name, "gateway", Fetch(rid, self.name, self.group_id, self.member_id, self.cursor))

    def receive(self, message: Message) -> None:
        op, env = self.op, self.env
        if op is None or not isinstance(message, Batch) or message.request_id != op.request_id:
            return
        self.op = None
        entries = message.entries
        jumped = message.after > self.cursor
        if jumped:  # the visibility start: the reader was told to begin later
            env.history.record(self.name, Kind.READ, Phase.OK, self.group_id)
            env.history.record(self.name, Kind.READ, Phase.INVOKE, self.group_id, after=message.after)
            self.starts.append(message.after)
            self.cursor = message.after
        expected = list(range(self.cursor + 1, self.cursor + 1 + len(entries)))
        if not self.trust_batches and (message.after != self.cursor or [e.seq for e in entries] != expected):
            env.history.record(self.name, Kind.READ, Phase.FAIL, self.group_id)
            env.stats.note("reader.gap_refused")
            return
        # After a declared start the read was re-invoked at receipt, later than the gateway read the
        # head: that head is not reported (the checker would take it as a stale read).
        head = 0 if self.starts and self.starts[-1] == message.after and jumped else message.head
        env.history.record(
            self.name,
            Kind.READ,
            Phase.OK,
            self.group_id,
            head=head,
            events=tuple((e.seq, e.command_id) for e in entries),
        )
        self.delivered.extend(entries)
        if entries:
            self.cursor = entries[-1].seq
