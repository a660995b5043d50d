"""The Group Authority's command path: verify, deduplicate, admit, decide, sign, append, fold.

``GroupAuthority`` composes the checks a command passes, each in the module named by its concern:
authentication.py (who may issue it), idempotency.py (a used command id is answered, not decided),
admission.py (ingress limits), locking.py (per-Group locks), lookups.py (what the decision consults
outside the Authority), appends.py (the chained, signed rows of an append), loading.py (the owned
Groups: load, fold, verification, snapshots), owned.py (what is held of an owned Group) and reads.py
(verified event reads and signed state views); effects.py holds the Authority's own commands. The
rules live in ``decider.py``. Commands for one Group are serialised by a per-Group lock; commands for
different Groups proceed concurrently and meet in the store's group commit.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from nacl.signing import SigningKey
from opentelemetry.trace import Status, StatusCode

from missionweave.kernel.clock import Clock, to_micros
from missionweave.kernel.errors import Rejected
from missionweave.kernel.signing import authority_key_id, sign_envelope
from missionweave.v1 import command_pb2, common_pb2
from missionweave_server.edge.access_log import note_caller
from missionweave_server.edge.identities import IdentityDirectoryClient
from missionweave_server.observability import metrics, tracing
from missionweave_server.services.authority import appends, decider, effects, kinds
from missionweave_server.services.authority.admission import admit
from missionweave_server.services.authority.authentication import authenticate
from missionweave_server.services.authority.effects import Effect, Refused
from missionweave_server.services.authority.idempotency import fingerprint, replay
from missionweave_server.services.authority.ingress import GroupIngressLimiter
from missionweave_server.services.authority.integrity import LogIntegrity
from missionweave_server.services.authority.keys import KeyHistory, KeyRecord
from missionweave_server.services.authority.loading import GroupLoader
from missionweave_server.services.authority.locking import GroupLocks
from missionweave_server.services.authority.lookups import Lookups, decision_context, look_up
from missionweave_server.services.authority.owned import OwnedGroup, Pending
from missionweave_server.services.authority.ownership_seal import OwnershipSeal
from missionweave_server.services.authority.reads import AppendWaiters, EventReads, StateViews
from missionweave_server.services.authority.rules import children
from missionweave_server.services.authority.rules.common import OrganizationPolicy
from missionweave_server.services.authority.state import GroupState
from missionweave_server.services.authority.store import AppendRequest, EventStore, StoredEvent
from missionweave_server.services.authority.tail import LogTails
from missionweave_server.verification.verifier import SignatureVerifier

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.authority")

if TYPE_CHECKING:  # the typed aio stub exists in the generated .pyi only
    from missionweave.internal.v1.publications_pb2_grpc import PublicationServiceAsyncStub

STORE_RACE_RETRIES = 2


class GroupAuthority:
    def __init__(
        self,
        store: EventStore,
        identities: IdentityDirectoryClient,
        clock: Clock,
        signing_key: SigningKey,
        *,
        cache_size: int = 10_000,
        ingress: GroupIngressLimiter | None = None,
        verifier: SignatureVerifier | None = None,
        publications: PublicationServiceAsyncStub | None = None,
        key_history: KeyHistory | None = None,
        on_corrupted: Callable[[str], None] | None = None,
        policy: OrganizationPolicy | None = None,
    ) -> None:
        self.store = store
        self.policy = policy or OrganizationPolicy()
        # Who signs commands, and their sessions: Membership's directory, cached in process.
        self.identities = identities
        self.clock = clock
        self.signing_key = signing_key
        self.public_key = bytes(signing_key.verify_key)
        self.key_id = authority_key_id(self.public_key)
        # Every key this store's Authority signed with (keys.ensure_key checked it is ours at start);
        # old events verify with the key they name.
        self.key_history = key_history or KeyHistory((KeyRecord(0, self.key_id, self.public_key, 0, b""),))
        self._on_corrupted = on_corrupted
        self._locks = GroupLocks()
        self._appended = AppendWaiters()
        self.in_flight = 0
        # The artifact store, asked whether a blob to publish is stored with a signed manifest.
        self.publications = publications
        self.ingress = ingress or GroupIngressLimiter(0, 0)
        self.verifier = verifier or SignatureVerifier()  # no workers: checks inline
        # What is read from the store is verified before it is folded, replayed or served.
        self.integrity = LogIntegrity(self.key_history.keys, self.verifier, self._corrupted)
        self.tails = LogTails()
        # The Groups this instance owns (loading.py), and the read side over them (reads.py).
        self.loader = GroupLoader(store, self.integrity, clock, self.tails, self._sign, cache_size)
        self._cache: OrderedDict[str, OwnedGroup] = self.loader.cache  # the same dict (tests clear it)
        self.reads = EventReads(store, self.integrity, self.loader, self.tails, clock)
        self.views = StateViews(self.loader, clock, self._sign, self.public_key, self.key_id)
        # A signed Context Package of a Group's durable state (reads.py, MW-13.3-01/02/04/05/07).
        self.context_package = self.views.context_package
        # Where the store's writer can sign events beside the commit (D56), the loop only serialises
        # them; otherwise (PostgreSQL) it signs them itself.
        self._writer_signs = store.sign_events_with(signing_key, self.key_id)
        # Ownership rows are sealed by this key, and checked against every key of the history (D171).
        store.seal_ownership_with(OwnershipSeal(signing_key, self.key_history.keys.values()))
        # Called when an append wrote cross-Group outbox rows (the relay delivers them).
        self.on_links: Callable[[], None] | None = None

    @property
    def checkpoint_every(self) -> int:
        """Signatures a load checks before it leaves a signed chain checkpoint (loading.py)."""
        return self.loader.checkpoint_every

    @checkpoint_every.setter
    def checkpoint_every(self, every: int) -> None:
        self.loader.checkpoint_every = every

    def _sign(self, payload: bytes, payload_type: str) -> common_pb2.SignedEnvelope:
        return sign_envelope(payload, payload_type, self.signing_key, self.key_id)

    # ------------------------------------------------------------ commands

    async def execute(self, envelope: common_pb2.SignedEnvelope) -> command_pb2.CommandResult:
        self.in_flight += 1
        command: command_pb2.Command | None = None
        try:
            command = await authenticate(envelope, self.identities, self.verifier, self.clock)
            note_caller(command.actor_id)
            result = await self._execute_verified(command, envelope)
        except Rejected as rejected:
            # Its one log line (at the gRPC edge, missionweave_server/edge/status.py) names the command; a
            # command that did not authenticate names none of it (nothing unverified is logged).
            kind = (command.WhichOneof("body") or "unknown") if command is not None else "unknown"
            metrics.COMMANDS.labels(kind, "rejected").inc()
            if command is not None:
                rejected.log_context = _log_fields(command, kind)
            raise
        finally:
            self.in_flight -= 1
        kind = command.WhichOneof("body") or "unknown"
        metrics.COMMANDS.labels(kind, "replayed" if result.replayed else "accepted").inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "command replayed" if result.replayed else "command accepted",
                extra={**_log_fields(command, kind), "group_revision": result.group_revision},
            )
        return result

    async def apply_link(self, source_group_id: str, source_seq: int, target_group_id: str) -> None:
        """Deliver one cross-Group outbox row (effects.py ``apply_link``)."""
        await effects.apply_link(
            self._execute_verified,
            self.reads,
            self.loader,
            self.store,
            source_group_id,
            source_seq,
            target_group_id,
        )

    async def revoke_replaced_session(self, group_id: str, agent_id: str, session_epoch: int) -> bool:
        """Revoke the leases of ``agent_id``'s replaced sessions (effects.py ``revoke_replaced_session``)."""
        return await effects.revoke_replaced_session(
            self._execute_verified, self.store, group_id, agent_id, session_epoch
        )

    async def _execute_verified(
        self,
        command: command_pb2.Command,
        envelope: common_pb2.SignedEnvelope | None,
        effect: Effect | None = None,
    ) -> command_pb2.CommandResult:
        """Decide under the Group's lock, then wait for durability outside it.

        Commands to one Group are pipelined: the next one is decided on the state the previous one
        will produce while the previous append is still in the group-commit queue. Appends of one
        Group reach the store in decision order and each is fenced on the head its predecessor
        leaves, so if one fails every later one fails too, the cached view is dropped and they are
        decided again on the durable log. Nobody sees an answer (or a state) before it is durable.
        """
        group_id = command.group_id
        self.integrity.refuse_if_corrupted(group_id)  # never extended
        fingerprint_ = fingerprint(command)
        for attempt in range(STORE_RACE_RETRIES + 1):
            # Looked up before the Group's lock: they depend on the command only, and awaiting them
            # (an Agent Card read, an artifact's publication) under it capped a Group's rate at one
            # such round trip per command.
            lookups = await look_up(command, self.identities, self.publications) if effect is None else None
            async with self._locks.hold(group_id):
                replayed = await replay(
                    command, fingerprint_, self.loader.get(group_id), self.store, self.reads
                )
                if replayed is not None:
                    return replayed
                if attempt == 0 and effect is None:  # retries after a store race were admitted already
                    held = self.loader.get(group_id)
                    admit(self.ingress, command, held.state if held is not None else None)
                pending = await self._decide_and_enqueue(command, envelope, fingerprint_, effect, lookups)
            if pending is None:  # a linked effect with nothing (left) to do
                return command_pb2.CommandResult(command_id=command.command_id, group_id=group_id)
            owned = pending.owned
            try:
                # Shielded: a caller that goes away (a deadline, a cancelled RPC) must not cancel the
                # append's future under the store, which resolves every future of its batch.
                await asyncio.shield(pending.request.done)
            except Rejected as rejected:
                # The store saw another writer (a second instance, a takeover) or a predecessor of
                # this append failed: our view was stale. Decide again on fresh state; after a few
                # tries the loser of a real race gets the rejection.
                self.loader.forget(group_id, owned)
                if attempt == STORE_RACE_RETRIES:
                    raise rejected from None
                continue
            except BaseException:
                self.loader.forget(group_id, owned)  # unknown outcome: never trust the cached view again
                raise
            finally:
                owned.pending.pop(command.command_id, None)
            result = pending.finish()
            request = pending.request
            if owned.acknowledge(command.command_id, pending, self.loader.lease_margin_us):
                if request.rewrites:
                    self.tails.drop(group_id)  # an erasure replaced envelopes the tail may hold
                else:
                    self.tails.appended(group_id, request.expected_head, request.events)
            else:  # completions out of order (should not happen): rebuild from the log when next needed
                self.loader.forget(group_id, owned)
            self._appended.wake(group_id)
            if request.links and self.on_links is not None:
                self.on_links()  # the cross-Group outbox has work (delivered by the relay)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    async def _decide_and_enqueue(
        self,
        command: command_pb2.Command,
        envelope: common_pb2.SignedEnvelope | None,
        fingerprint_: bytes,
        effect: Effect | None = None,
        lookups: Lookups | None = None,
    ) -> Pending | None:
        """The decision, in a span of its own: the group commit that makes it durable links to it."""
        if not tracing.active():  # no span to record: skip making a no-op one and its attributes
            return await self._decide(command, envelope, fingerprint_, effect, lookups)
        with tracing.tracer().start_as_current_span(
            "authority.decide",
            attributes=_span_attributes(command),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                return await self._decide(command, envelope, fingerprint_, effect, lookups)
            except Rejected as rejected:
                span.set_status(Status(StatusCode.ERROR, R.Name(rejected.reason)))
                raise

    async def _decide(
        self,
        command: command_pb2.Command,
        envelope: common_pb2.SignedEnvelope | None,
        fingerprint_: bytes,
        effect: Effect | None,
        lookups: Lookups | None = None,
    ) -> Pending | None:
        group_id = command.group_id
        owned = await self._load(group_id)
        if kinds.erases(command) and owned.pending:
            # An erasure rewrites earlier events: every one of them must be durable first.
            await asyncio.wait([p.request.done for p in owned.pending.values()])
            owned = await self._load(group_id)
        writer_epoch, state = owned.writer_epoch, owned.state
        now = self.clock.now()
        if effect is None:
            if lookups is None:
                lookups = await look_up(command, self.identities, self.publications)
            context = await decision_context(command, envelope, now, lookups, self.state, self.policy)
            decision = decider.decide(state, command, context)
        else:
            decision = effect(state, now)
            if isinstance(decision, Rejected):
                raise Refused(decision)
            if not decision:
                return None
        if isinstance(decision, Rejected):
            raise decision
        # Events another Group must apply go to the cross-Group outbox in the same transaction.
        links = children.cross_group_effects(state or GroupState(group_id), decision)
        # The chain (docs/integrity.md): each event names the digest of the one before it.
        leases_before = appends.running_leases(state, decision)
        payloads, link = appends.chain(decision, writer_epoch, owned.chain_head)
        envelopes, stored = appends.rows(decision, payloads, None if self._writer_signs else self._sign)
        request = AppendRequest(
            group_id=group_id,
            writer_epoch=writer_epoch,
            expected_head=state.head_sequence if state else 0,
            command_id=command.command_id,
            fingerprint=fingerprint_,
            events=stored,
            creates_group=state is None,
            owner_seal=self.store.owner_seal(group_id, writer_epoch) if state is None else b"",
            rewrites=await appends.erasures(group_id, decision, self.reads, self.integrity, self._sign),
            payloads=payloads if self._writer_signs else [],
            links=links,
            traceparent=tracing.current_traceparent(),
        )
        for event in decision:
            state = decider.evolve(state, event)
        assert state is not None
        request.leases = appends.lease_changes(leases_before, appends.running_leases(state, decision))
        result = command_pb2.CommandResult(
            command_id=command.command_id, group_id=group_id, group_revision=state.head_sequence
        )
        if envelopes is not None:
            result.events.extend(envelopes)
        pending = Pending(
            owned,
            request,
            decision,
            result,
            fingerprint_,
            to_micros(now),
            self.key_id,
            envelopes is None,
            link,
        )
        # The next command of this Group decides on this state (speculative until durable).
        owned.state = state
        owned.chain_head = link
        owned.pending[command.command_id] = pending
        self.loader.remember(group_id, owned)
        self.store.enqueue(request)
        return pending

    async def hand_over(self, group_id: str, to_instance: str) -> bool:
        """Give the Group to another instance (rebalance.py): under the Group's lock, so no command
        is being decided, once every append already decided is durable, then forgetting this
        instance's view of it. Its next command here finds the new owner (NOT_OWNER naming it)."""
        async with self._locks.hold(group_id):
            owned = self.loader.get(group_id)
            if owned is not None and owned.pending:
                await asyncio.wait([p.request.done for p in owned.pending.values()])
            self.loader.drop(group_id)
            return await self.store.hand_over(group_id, to_instance)

    # ------------------------------------------------------------ state and reads (loading.py, reads.py)

    async def _load(self, group_id: str) -> OwnedGroup:
        return await self.loader.load(group_id)

    async def fold(self, group_id: str) -> GroupState | None:
        """Rebuild a Group's state from its stored log, verified (also used by the replay-equivalence test)."""
        return await self.loader.fold(group_id)

    async def state(self, group_id: str) -> GroupState | None:
        """The Group's durable state (never the speculative state of appends still in flight)."""
        return await self.loader.state(group_id)

    async def take_snapshot(
        self, group_id: str, *, compact: bool = False, archival: bool = False
    ) -> tuple[common_pb2.SignedEnvelope, str, int] | None:
        return await self.loader.take_snapshot(group_id, compact=compact, archival=archival)

    async def read_history(self, group_id: str, after: int = 0, limit: int = 1024) -> list[StoredEvent]:
        return await self.reads.history(group_id, after, limit)

    async def read_range(self, group_id: str, first: int, last: int) -> list[StoredEvent]:
        return await self.reads.range(group_id, first, last)

    async def read_online(self, group_id: str, after: int, limit: int) -> list[StoredEvent]:
        return await self.reads.online(group_id, after, limit)

    async def signed_summary(
        self, group_id: str, viewer: str | None = None
    ) -> common_pb2.SignedEnvelope | None:
        return await self.views.signed_summary(group_id, viewer)

    def _corrupted(self, group_id: str) -> None:
        """A Group failed verification: forget everything held of it; tell health."""
        metrics.LOG_VERIFICATION_FAILURES.inc()
        self.loader.drop(group_id)
        if self._on_corrupted is not None:
            self._on_corrupted(group_id)

    # ------------------------------------------------------------ followers (reads.py)

    def wake_all(self) -> None:
        """Wake every follower waiting for an append (at shutdown, so that they re-check and end)."""
        self._appended.wake_all()

    async def wait_for_append(self, group_id: str, timeout: float) -> bool:  # noqa: ASYNC109 (a bounded wake-up hint)
        """Resolves when the Group gets new events (in this process): True, or after ``timeout``: False."""
        return await self._appended.wait(group_id, timeout)


def _log_fields(command: command_pb2.Command, kind: str) -> dict[str, str]:
    """The fields every log line about a command carries (docs/operations.md "Metrics and logs")."""
    return {
        "group_id": command.group_id,
        "command_id": command.command_id,
        "command_kind": kind,
        "actor_id": command.actor_id,
    }


def _span_attributes(command: command_pb2.Command) -> dict[str, str]:
    """The decision span's attributes: the command's log fields, under the project's prefix."""
    return {
        f"mwp.{key}": value
        for key, value in _log_fields(command, command.WhichOneof("body") or "unknown").items()
    }
