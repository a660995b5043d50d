"""The simulated server processes: Authority instances, the membership registry, the gateway and
the artifact store. Each is a model of its real shell around the REAL pure core; the module each
rule mirrors is named where it is applied. A crashed process answers nothing and forgets its memory.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2
from missionweave_server.services.authority import decider, kinds
from missionweave_server.services.authority.idempotency import fingerprint
from missionweave_server.services.authority.rules.children import AUTHORITY_ACTOR
from missionweave_server.services.authority.rules.common import DecisionContext, HeldArtifact, HeldManifest
from missionweave_server.services.authority.state import GroupState, IdentityInfo
from missionweave_server.services.authority.visibility import conversation_of, may_see
from simulation.clock import SimClock
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
from simulation.store import GroupRow, NotOwner, Store

R = common_pb2.RejectionReason
Send = Callable[[str, str, Message], None]  # (src, dst, message)


@dataclass
class Process:
    name: str
    up: bool = True
    paused_until_ms: int = 0  # a stop-the-world pause: alive, but handles nothing meanwhile
    restart_at_ms: int = 0

    def running(self, now_ms: int) -> bool:
        return self.up and self.paused_until_ms <= now_ms

    def handle(self, message: Message, send: Send) -> None:
        """Handle one message (a process handles one at a time, in delivery order)."""


@dataclass
class Bugs:
    """Planted bugs, each off in a real run: the tests turn one on to show an invariant catches it."""

    ack_before_sync: bool = False  # Authority: answer ok once appended, before the append is synced
    skip_session_fence: bool = False  # Authority: accept commands from a fenced (older) session
    assume_held: bool = False  # Authority: tell the core every named Artifact is held (no store lookup)
    ignore_visibility: bool = False  # gateway: deliver every event's content to every member
    omit_hidden: bool = False  # gateway: leave hidden events out instead of sending skip markers
    trust_batches: bool = False  # reader: accept a batch without checking it continues the cursor
    ignore_provisional: bool = False  # gateway: a provisional member sees what a full one does


class Registry(Process):
    """The membership service's identity registry (missionweave_server/services/membership/registry.py): opening a session
    raises the identity's session epoch and fences every older one (MW-11.3-09). Its rows are
    written synchronously: a crash or power loss keeps them."""

    def __init__(self, name: str, identities: dict[str, int]) -> None:
        super().__init__(name)
        self.kinds = identities  # identity -> IdentityKind
        self.sessions = dict.fromkeys(sorted(identities), 1)

    def identities(self) -> dict[str, IdentityInfo]:
        return {i: IdentityInfo(i, kind, session_epoch=self.sessions[i]) for i, kind in self.kinds.items()}

    def handle(self, message: Message, send: Send) -> None:
        if isinstance(message, OpenSession):
            self.sessions[message.client] += 1
            send(self.name, message.client, SessionOpened(message.request_id, self.sessions[message.client]))


@dataclass(frozen=True)
class Blob:
    digest: str
    uploader: str
    work_item_id: str
    mission_id: str


class ArtifactStore(Process):
    """The artifact store: a blob exists once its upload arrived (a lost upload leaves nothing)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.blobs: dict[str, Blob] = {}

    def handle(self, message: Message, send: Send) -> None:
        if isinstance(message, Upload):
            self.blobs.setdefault(
                message.digest, Blob(message.digest, message.client, message.work_item_id, message.mission_id)
            )
            send(self.name, message.client, Uploaded(message.request_id, message.digest))

    def held(
        self, state: GroupState | None, command: command_pb2.Command, everything: bool
    ) -> dict[str, HeldArtifact]:
        """What the shell puts in ``DecisionContext.held`` (D161): each named blob the store holds,
        with the manifest its uploader signed for this Mission and WorkItem."""
        named = kinds.named_artifacts(command)
        if not named or state is None or state.mission is None:
            return {}
        held: dict[str, HeldArtifact] = {}
        for digest in named:
            blob = self.blobs.get(digest)
            if everything and blob is None:  # the planted bug: as if every blob were uploaded
                blob = Blob(digest, command.actor_id, _work_item_of(command), state.mission.mission_id)
            if blob is not None:  # held; the manifest counts only if this actor signed it
                signed = blob.uploader == command.actor_id
                manifests = (HeldManifest("f" * 64, blob.work_item_id, blob.mission_id),) if signed else ()
                held[digest] = HeldArtifact(0, manifests)
        return held


def _work_item_of(command: command_pb2.Command) -> str:
    body = getattr(command, command.WhichOneof("body") or "", None)
    return str(getattr(body, "work_item_id", ""))


@dataclass
class Waiter:
    client: str
    request_id: int


@dataclass
class Pending:
    """A decided command on its way to the store (missionweave_server/services/authority/owned.py ``Pending``)."""

    command: command_pb2.Command
    events: list[event_pb2.Event]
    waiters: list[Waiter]
    seq: int = 0  # set once appended
    last_seq: int = 0


@dataclass
class Owned:
    """What an instance holds of a Group it owns (missionweave_server/services/authority/owned.py ``OwnedGroup``)."""

    writer_epoch: int
    state: GroupState | None  # includes decided appends not yet in the store
    lease_expires_ms: int
    pending: list[Pending] = field(default_factory=list)
    fenced: dict[str, int] = field(default_factory=dict)  # agent -> the session revoked for here


# Called with (instance, state decided on, command) for every command a decision accepted.
AcceptHook = Callable[[str, GroupState | None, command_pb2.Command], None]


class Authority(Process):
    """One Authority instance (a shard): missionweave_server/services/authority/authority.py's command path, modeled.

    Per command: the session fence (authentication.py), ownership (store.acquire), idempotency
    (idempotency.py: a used command id is answered, never decided again), then the REAL
    ``decider.decide`` and ``evolve``; the append goes to the group-commit queue and is answered
    only once the store synced it (group_commit.py, owned.py)."""

    def __init__(
        self,
        name: str,
        clock: SimClock,
        store: Store,
        registry: Registry,
        artifacts: ArtifactStore,
        stats: Stats,
        bugs: Bugs,
        on_accept: AcceptHook,
    ) -> None:
        super().__init__(name)
        self.clock, self.store, self.registry, self.artifacts = clock, store, registry, artifacts
        self.stats, self.bugs, self.on_accept = stats, bugs, on_accept
        self.owned: dict[str, Owned] = {}
        self.unsynced: list[tuple[str, Pending]] = []  # appended, waiting for the sync to answer

    def crash(self) -> None:
        self.up = False
        self.owned, self.unsynced = {}, []

    def _reply(self, send: Send, waiter: Waiter, reply: CommandReply) -> None:
        send(
            self.name,
            waiter.client,
            dataclasses.replace(reply, request_id=waiter.request_id, shard=self.name),
        )

    def handle(self, message: Message, send: Send) -> None:
        if not isinstance(message, CommandRequest):
            return
        command, waiter = message.command, Waiter(message.client, message.request_id)
        cid = command.command_id
        try:
            self._fence_session(command)
            owned = self._own(command.group_id)
        except Rejected as refused:
            self._reply(send, waiter, CommandReply(0, cid, ok=False, reason=R.Name(refused.reason)))
            return
        except NotOwner as other:
            self._reply(
                send, waiter, CommandReply(0, cid, ok=False, reason="NOT_OWNER", owner_hint=other.owner)
            )
            return
        # Idempotency (idempotency.py ``replay``): in flight, then recorded.
        print_ = fingerprint(command)
        for pending in owned.pending + [p for g, p in self.unsynced if g == command.group_id]:
            if pending.command.command_id == cid:
                if fingerprint(pending.command) != print_:
                    self._reply(
                        send,
                        waiter,
                        CommandReply(0, cid, ok=False, reason="REJECTION_REASON_COMMAND_ID_REUSED"),
                    )
                else:
                    pending.waiters.append(waiter)
                return
        row = self.store.row(command.group_id)
        record = row.records.get(cid) if row is not None else None
        if record is not None:
            if record.fingerprint != print_:
                self._reply(
                    send, waiter, CommandReply(0, cid, ok=False, reason="REJECTION_REASON_COMMAND_ID_REUSED")
                )
            elif row is not None and record.last_seq > row.synced:  # appended, not yet durable: wait
                self.unsynced.append(
                    (command.group_id, Pending(command, [], [waiter], record.first_seq, record.last_seq))
                )
            else:
                self.stats.note("replayed")
                self._reply(send, waiter, CommandReply(0, cid, ok=True, seq=record.first_seq, replayed=True))
            return
        ctx = DecisionContext(
            self.clock.now(),
            self.registry.identities(),
            held=self.artifacts.held(owned.state, command, self.bugs.assume_held),
        )
        decision = decider.decide(owned.state, command, ctx)
        if isinstance(decision, Rejected):
            self.stats.note(f"refused.{command.WhichOneof('body')}.{R.Name(decision.reason)}")
            self._reply(send, waiter, CommandReply(0, cid, ok=False, reason=R.Name(decision.reason)))
            return
        self.stats.note(f"accepted.{command.WhichOneof('body')}")
        self.on_accept(self.name, owned.state, command)
        for event in decision:
            owned.state = decider.evolve(owned.state, event)
        owned.pending.append(Pending(command, decision, [waiter]))

    def _fence_session(self, command: command_pb2.Command) -> None:
        """authentication.py: a command signed in an older session than the identity's is refused."""
        current = self.registry.sessions.get(command.actor_id)
        if current is None:
            raise Rejected(R.REJECTION_REASON_UNKNOWN_IDENTITY, command.actor_id)
        if command.session_epoch != current and not self.bugs.skip_session_fence:
            raise Rejected(R.REJECTION_REASON_SESSION_EPOCH_STALE, f"fenced by session {current}")

    def _own(self, group_id: str) -> Owned:
        """Ownership (store.acquire): a held Group is renewed under its writer epoch; a Group not held
        here, or whose renewal failed, is taken afresh (a new writer epoch) and loaded from the store."""
        now = self.clock.ms
        owned = self.owned.get(group_id)
        if owned is not None:
            if owned.lease_expires_ms > now:
                return owned  # this instance believes its lease holds: the append's fence decides
            if self.store.renew(group_id, self.name, owned.writer_epoch, now):
                owned.lease_expires_ms = now + self.store.ttl
                return owned
            self._drop(group_id, owned)
        previous = self.store.row(group_id)
        took_over = previous is not None and previous.owner not in ("", self.name)
        row = self.store.acquire(group_id, self.name, now)
        if took_over:
            self.stats.note("takeover")
        owned = Owned(row.writer_epoch, copy.deepcopy(row.state), now + self.store.ttl)
        self.owned[group_id] = owned
        return owned

    def _drop(self, group_id: str, owned: Owned) -> None:
        """Fenced: what was decided here and not appended is lost (its clients hear nothing)."""
        del self.owned[group_id]
        self.stats.note("fenced")

    def fence_sessions(self) -> None:
        """missionweave_server/services/authority/session_fence.py: once an agent opened a newer session, each Group
        where an older session of it still runs a lease appends the revocations (the REAL
        ``decide_session_replaced``), under an id derived from the new session: appended once."""
        now = self.clock.now()
        for group_id in sorted(self.owned):
            owned = self.owned[group_id]
            row = self.store.row(group_id)
            for agent in sorted(self.registry.sessions):
                epoch = self.registry.sessions[agent]
                if epoch == 1 or owned.fenced.get(agent) == epoch:
                    continue  # no session replaced, or this one handled since the Group was loaded
                owned.fenced[agent] = epoch
                events = decider.decide_session_replaced(owned.state, agent, epoch, now)
                if not events:
                    continue
                command = decider.session_replaced_command(group_id, agent, epoch)
                queued = any(p.command.command_id == command.command_id for p in owned.pending)
                if queued or (row is not None and command.command_id in row.records):
                    continue
                for event in events:
                    owned.state = decider.evolve(owned.state, event)
                owned.pending.append(Pending(command, events, []))
                self.stats.note("session_fence.revoked")

    def group_commit(self, send: Send) -> None:
        """The group-commit writer: each owned Group's queued appends in one fenced append."""
        for group_id in sorted(self.owned):
            owned = self.owned[group_id]
            if not owned.pending:
                continue
            batch, owned.pending = owned.pending, []
            expected = batch[0].events[0].sequence - 1
            if not self.store.append(
                group_id, owned.writer_epoch, expected, [(p.command, p.events) for p in batch]
            ):
                for pending in batch:  # definitely not appended: NOT_OWNER, as the real append answers
                    for waiter in pending.waiters:
                        self._reply(
                            send,
                            waiter,
                            CommandReply(0, pending.command.command_id, ok=False, reason="NOT_OWNER"),
                        )
                self._drop(group_id, owned)
                continue
            self.store.renew(group_id, self.name, owned.writer_epoch, self.clock.ms)
            row = self.store.rows[group_id]
            for pending in batch:
                record = row.records[pending.command.command_id]
                pending.seq, pending.last_seq = record.first_seq, record.last_seq
                self.unsynced.append((group_id, pending))
        if self.bugs.ack_before_sync:
            self.answer_synced(send, everything=True)

    def answer_synced(self, send: Send, everything: bool = False) -> None:
        """Answer the appends the store has synced: an ok is only ever sent for what is durable."""
        waiting: list[tuple[str, Pending]] = []
        for group_id, pending in self.unsynced:
            row = self.store.rows[group_id]
            if everything or pending.last_seq <= row.synced:
                for waiter in pending.waiters:
                    self._reply(
                        send, waiter, CommandReply(0, pending.command.command_id, ok=True, seq=pending.seq)
                    )
            else:
                waiting.append((group_id, pending))
        self.unsynced = waiting


class Gateway(Process):
    """The gateway relaying one member's view of a Group log (missionweave_server/services/authority/group_log.py
    FollowGroup/FetchEvents, modeled as a pull): durable events only, after the cursor and never
    before the member's visibility start, each either delivered (the REAL ``may_see`` on the current
    state, MW-9-05) or reported as a skipped sequence so that the reader's cursor stays contiguous."""

    BATCH = 8

    def __init__(self, name: str, store: Store, bugs: Bugs) -> None:
        super().__init__(name)
        self.store, self.bugs = store, bugs

    def handle(self, message: Message, send: Send) -> None:
        if not isinstance(message, Fetch):
            return
        row: GroupRow | None = self.store.row(message.group_id)
        state = row.synced_state if row is not None else None
        member = state.members.get(message.member_id) if state is not None else None
        if row is None or state is None or member is None or not member.active:
            ended = state is not None and member is not None  # never a member yet: nothing, not ended
            send(
                self.name,
                message.client,
                Batch(message.request_id, message.group_id, message.after, (), 0, ended),
            )
            return
        after = max(message.after, member.visibility_start_sequence - 1)
        entries: list[Entry] = []
        for seq in range(after + 1, min(row.synced, after + self.BATCH) + 1):
            event = row.events[seq - 1]
            visible = self.bugs.ignore_visibility or may_see(
                state, message.member_id, event, cited=self.bugs.ignore_provisional
            )
            if not visible and self.bugs.omit_hidden:
                continue
            payload = event.WhichOneof("payload") or ""
            # The history names client commands only: the Authority's own appends carry none.
            cid = "" if event.actor_id == AUTHORITY_ACTOR else event.causing_command_id
            entries.append(
                Entry(
                    seq,
                    cid,
                    visible,
                    payload if visible else "",
                    conversation_of(state, event) if visible else "",
                    row.synced,
                )
            )
        send(
            self.name,
            message.client,
            Batch(message.request_id, message.group_id, after, tuple(entries), row.synced),
        )
