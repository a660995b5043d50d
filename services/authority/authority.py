"""The Group Authority shell: verify, deduplicate, decide, sign, append, fold.

Everything with I/O lives here; the rules live in ``decider.py``. Commands for one Group are
serialised by a per-Group lock; commands for different Groups proceed concurrently and meet in the
store's group commit.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import blake3
import grpc
from google.protobuf.message import DecodeError
from nacl.signing import SigningKey
from opentelemetry.trace import Status, StatusCode

from missionweave import codec, ids, metrics, tracing
from missionweave.clock import Clock, timestamp_micros, to_micros, to_timestamp
from missionweave.errors import Rejected
from missionweave.eventlog import CHECKPOINT_TYPE, Chain, Corruption, checkpoint_payload, event_digest
from missionweave.extensions import BOUNDED_OFFLINE_EXECUTION
from missionweave.internal.v1 import publications_pb2
from missionweave.manifest import manifest_digest
from missionweave.rpc.access_log import note_caller
from missionweave.rpc.identities import DirectoryIdentity, IdentityDirectoryClient
from missionweave.rpc.status import peer_unavailable
from missionweave.signing import (
    COMMAND_TYPE,
    EVENT_TYPE,
    GROUP_SUMMARY_TYPE,
    SNAPSHOT_TYPE,
    authority_key_id,
    parse_session_key_id,
    sign_envelope,
    signed_envelope,
)
from missionweave.signing import verify_signature as verify_envelope
from missionweave.v1 import (
    agent_card_pb2,
    artifact_service_pb2,
    authority_service_pb2,
    command_pb2,
    common_pb2,
    event_pb2,
)
from missionweave.verifier import SignatureVerifier
from services.authority import decider, kinds
from services.authority.aggregates import named_work_item
from services.authority.context_package import CONTEXT_PACKAGE_TYPE, build_context_package
from services.authority.ingress import GroupIngressLimiter, check_envelope
from services.authority.integrity import LogIntegrity
from services.authority.keys import KeyHistory, KeyRecord
from services.authority.progress import mission_progress
from services.authority.rules import children
from services.authority.rules.common import (
    TERMINAL_MISSION_STATES,
    CardInfo,
    HeldArtifact,
    HeldManifest,
    OrganizationPolicy,
    StoredArtifact,
)
from services.authority.rules.conversations import erased, erasure_targets
from services.authority.rules.missions import check_transfer
from services.authority.state import GroupState, IdentityInfo
from services.authority.store import AppendRequest, CommandRecord, EventStore, StoredEvent
from services.authority.tail import LogTails
from services.authority.truncation import check_replayed, refuse_if_shortened
from services.authority.views import group_state_proto

R = common_pb2.RejectionReason
log = logging.getLogger("missionweave.authority")

REPLAY_WINDOW = timedelta(minutes=5)
_REPLAY_WINDOW_US = int(REPLAY_WINDOW.total_seconds() * 1_000_000)
# Critical extensions the rules implement (OP-22): any other critical binding is refused.
SUPPORTED_EXTENSIONS: frozenset[str] = frozenset({BOUNDED_OFFLINE_EXECUTION})
if TYPE_CHECKING:  # the typed aio stub exists in the generated .pyi only
    from missionweave.internal.v1.publications_pb2_grpc import PublicationServiceAsyncStub

# A decision of the Authority's own (a linked effect or a compensation) on the Group's state.
Effect = Callable[[GroupState | None, datetime], "decider.Decision"]


class Refused(Exception):
    """The target Group's rules refused a linked effect (not a transient failure of the store)."""

    def __init__(self, rejection: Rejected) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


STORE_RACE_RETRIES = 2
CHECKPOINT_EVERY = 256
# A peer service's answer is awaited this long before the command is refused PEER_UNAVAILABLE.
PEER_TIMEOUT_S = 5.0
# The most digests one PublicationService.FindArtifacts call takes (publications.proto).
MAX_FIND_ARTIFACTS = 64


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
        self._cache: OrderedDict[str, _OwnedGroup] = OrderedDict()
        self._cache_size = cache_size
        self._locks: dict[str, _LockEntry] = {}
        self._appended: dict[str, asyncio.Event] = {}
        self.in_flight = 0
        # The artifact store, asked whether a blob to publish is stored with a signed manifest.
        self.publications = publications
        self.ingress = ingress or GroupIngressLimiter(0, 0)
        self.verifier = verifier or SignatureVerifier()  # no workers: checks inline
        # What is read from the store is verified before it is folded, replayed or served.
        self.integrity = LogIntegrity(self.key_history.keys, self.verifier, self._corrupted)
        # A load that checked this many signatures leaves a signed chain checkpoint at the head it
        # verified, so the next load of the Group checks signatures only after it.
        self.checkpoint_every = CHECKPOINT_EVERY
        self.tails = LogTails()
        # Half the ownership lease, counted from before the store renewed it: a safe bound on how long
        # no other instance can take a Group over (it may only once the lease has expired).
        self._lease_margin_us = int(store.ownership_ttl.total_seconds() * 1_000_000) // 2
        # Where the store's writer can sign events beside the commit (D56), the loop only serialises
        # them; otherwise (PostgreSQL) it signs them itself.
        self._writer_signs = store.sign_events_with(signing_key, self.key_id)
        # Called when an append wrote cross-Group outbox rows (the relay delivers them).
        self.on_links: Callable[[], None] | None = None

    # ------------------------------------------------------------ commands

    async def execute(self, envelope: common_pb2.SignedEnvelope) -> command_pb2.CommandResult:
        self.in_flight += 1
        command: command_pb2.Command | None = None
        try:
            command = await self._authenticate(envelope)
            note_caller(command.actor_id)
            result = await self._execute_verified(command, envelope)
        except Rejected as rejected:
            # Its one log line (at the gRPC edge, missionweave/rpc/status.py) names the command; a
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

    async def _authenticate(self, envelope: common_pb2.SignedEnvelope) -> command_pb2.Command:
        """Signature first: nothing in the payload is trusted before it verifies (principle 5)."""
        check_envelope(envelope)  # size (the whole envelope) and the number of signatures
        if envelope.payload_type != COMMAND_TYPE:
            raise Rejected(R.REJECTION_REASON_MALFORMED, f"payload_type must be {COMMAND_TYPE}")
        if not envelope.signatures:
            raise Rejected(R.REJECTION_REASON_SIGNATURE_MISSING, "the command envelope carries no signature")
        parsed_key = parse_session_key_id(envelope.signatures[0].key_id)
        if parsed_key is None:
            raise Rejected(
                R.REJECTION_REASON_SIGNATURE_INVALID, "key_id must name a session key: '<identity>#session-<epoch>'"
            )
        identity_id, epoch = parsed_key
        identity = await self.identities.get(identity_id)
        if identity is None:
            raise Rejected(R.REJECTION_REASON_UNKNOWN_IDENTITY, f"{identity_id!r} is not a registered identity")
        session_key = await self.identities.session_key(identity_id, epoch)
        if session_key is None:
            raise Rejected(
                R.REJECTION_REASON_SESSION_NOT_OPEN, f"{identity_id} has no session with epoch {epoch}; open one"
            )
        if not await self.verifier.verify_envelope(envelope, session_key):
            metrics.SIGNATURE_FAILURES.inc()
            raise Rejected(R.REJECTION_REASON_SIGNATURE_INVALID, "the signature does not verify with the session key")
        if epoch > identity.session_epoch:  # a verified session newer than the cached directory names
            identity = await self.identities.get(identity_id, at_least_epoch=epoch) or identity
        if epoch != identity.session_epoch:
            raise Rejected(
                R.REJECTION_REASON_SESSION_EPOCH_STALE,
                f"session epoch {epoch} was fenced by session {identity.session_epoch}",
                current_epoch=identity.session_epoch,
            )
        command = command_pb2.Command()
        try:
            command.ParseFromString(envelope.payload)
        except DecodeError:
            raise Rejected(R.REJECTION_REASON_MALFORMED, "payload is not a valid missionweave.v1.Command") from None
        if command.actor_id != identity_id or command.session_epoch != epoch:
            raise Rejected(
                R.REJECTION_REASON_SIGNATURE_INVALID,
                "actor_id and session_epoch must match the signing session key",
                field="actor_id",
            )
        for name in ("command_id", "group_id"):
            if not ids.is_valid(getattr(command, name)):
                raise Rejected(R.REJECTION_REASON_MALFORMED, f"{name} must be 1..128 of [A-Za-z0-9._:-]", field=name)
        if command.correlation_id and not ids.is_valid(command.correlation_id):
            raise Rejected(R.REJECTION_REASON_MALFORMED, "correlation_id is not a valid id", field="correlation_id")
        if not command.HasField("issued_at"):
            raise Rejected(R.REJECTION_REASON_MALFORMED, "issued_at is required", field="issued_at")
        skew_us = abs(timestamp_micros(command.issued_at) - to_micros(self.clock.now()))
        if skew_us > _REPLAY_WINDOW_US:
            raise Rejected(
                R.REJECTION_REASON_CLOCK_SKEW,
                f"issued_at is {skew_us / 1e6:.0f}s from the Authority clock (window {REPLAY_WINDOW})",
            )
        for binding in command.extensions:
            if binding.critical and binding.urn not in SUPPORTED_EXTENSIONS:
                raise Rejected(
                    R.REJECTION_REASON_UNSUPPORTED_CRITICAL_EXTENSION,
                    f"critical extension {binding.urn} is not supported",
                    urn=binding.urn,
                )
        return command

    async def apply_link(self, source_group_id: str, source_seq: int, target_group_id: str) -> None:
        """Deliver one cross-Group outbox row (MW-10.4-05): the target Group applies the source event
        (once: its command id derives from the event), or refuses it and the source Group is
        compensated; then the row is dropped. A transient failure (the target owned by another
        instance, a store race) raises Rejected and leaves the row for a later try."""
        (stored,) = await self.read_range(source_group_id, source_seq, source_seq)  # verified
        source = codec.decode_event(stored.envelope)
        source_state = await self.state(source_group_id)
        assert source_state is not None
        command = children.linked_command(target_group_id, source)
        try:
            await self._execute_verified(
                command, None, lambda state, now: decider.decide_linked(state, source, source_state, now)
            )
        except Refused as refused:
            refusal = refused.rejection
            log.warning(
                "a Group refused a linked event; compensating",
                extra={
                    "group_id": target_group_id,
                    "source_group_id": source_group_id,
                    "source_event_id": source.event_id,
                    "reason": R.Name(refusal.reason),
                    "detail": refusal.message,
                },
            )
            compensation = command_pb2.Command()
            compensation.CopyFrom(command)
            compensation.group_id = source_group_id
            compensation.command_id = ids.derived_id("xgc", source_group_id, str(source_seq))
            await self._execute_verified(
                compensation,
                None,
                lambda state, now: decider.decide_compensation(state, source, refusal, now) if state else [],
            )
        await self.store.drop_link(source_group_id, source_seq, target_group_id)

    async def revoke_replaced_session(self, group_id: str, agent_id: str, session_epoch: int) -> bool:
        """MW-11.3-09: revoke the leases ``agent_id``'s sessions before ``session_epoch`` hold in
        ``group_id`` (the WorkItems return to ``queued``); whether any were revoked. Raises Rejected
        (NOT_OWNER and the like) when this instance cannot write the Group now."""
        command = decider.session_replaced_command(group_id, agent_id, session_epoch)
        result = await self._execute_verified(
            command, None, lambda state, now: decider.decide_session_replaced(state, agent_id, session_epoch, now)
        )
        if not result.replayed and result.group_revision == 0:
            # Nothing was running under an older session: the index row outlived its lease.
            await self.store.drop_running_leases(group_id, agent_id, session_epoch)
            return False
        return True

    def _admit(self, command: command_pb2.Command) -> None:
        """Per-Group token bucket (MW-8-16): replays of accepted commands never count against it. An
        identity without an active Membership in a Group whose state is loaded here draws on an
        allowance of its own there (D158): an outsider's commands, refused or not, never spend the
        members' allowance."""
        group_id = command.group_id
        owned = self._cache.get(group_id)
        state = owned.state if owned is not None else None
        member = state.members.get(command.actor_id) if state is not None else None
        outsider = state is not None and (member is None or not member.active)
        wait_s = self.ingress.admit(f"{group_id}\n{command.actor_id}" if outsider else group_id)
        if wait_s > 0:
            metrics.INGRESS_REFUSALS.inc()
            over = f"{command.actor_id}'s commands to Group {group_id} are" if outsider else f"Group {group_id} is"
            raise Rejected(
                R.REJECTION_REASON_OVERLOADED,
                f"{over} over the command rate ({self.ingress.rate:g}/s); retry later",
                retry_after_ms=max(1, round(wait_s * 1000)),
            )

    async def _execute_verified(
        self, command: command_pb2.Command, envelope: common_pb2.SignedEnvelope | None, effect: Effect | None = None
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
        fingerprint_ = _fingerprint(command)
        for attempt in range(STORE_RACE_RETRIES + 1):
            # Looked up before the Group's lock: they depend on the command only, and awaiting them
            # (an Agent Card read, an artifact's publication) under it capped a Group's rate at one
            # such round trip per command.
            lookups = await self._lookups(command) if effect is None else None
            async with self._lock(group_id):
                replay = await self._replay(command, fingerprint_)
                if replay is not None:
                    return replay
                if attempt == 0 and effect is None:  # retries after a store race were admitted already
                    self._admit(command)
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
                self._forget(group_id, owned)
                if attempt == STORE_RACE_RETRIES:
                    raise rejected from None
                continue
            except BaseException:
                self._forget(group_id, owned)  # unknown outcome: never trust the cached view again
                raise
            finally:
                owned.pending.pop(command.command_id, None)
            result = pending.finish()
            request = pending.request
            owned.commands[command.command_id] = CommandRecord(
                fingerprint_, request.expected_head + 1, request.expected_head + len(request.events)
            )
            if request.expected_head == owned.durable_head:
                owned.settle(pending.events)  # readers' copy advances by the same events, in append order
                owned.durable_link = pending.link
                owned.sole_writer_until_us = max(owned.sole_writer_until_us, pending.decided_us + self._lease_margin_us)
                if request.rewrites:
                    self.tails.drop(group_id)  # an erasure replaced envelopes the tail may hold
                else:
                    self.tails.appended(group_id, request.expected_head, request.events)
            else:  # completions out of order (should not happen): rebuild from the log when next needed
                self._forget(group_id, owned)
            self._wake(group_id)
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
        lookups: _Lookups | None = None,
    ) -> _Pending | None:
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
        lookups: _Lookups | None = None,
    ) -> _Pending | None:
        group_id = command.group_id
        owned = await self._load(group_id)
        if kinds.erases(command) and owned.pending:
            # An erasure rewrites earlier events: every one of them must be durable first.
            await asyncio.wait([p.request.done for p in owned.pending.values()])
            owned = await self._load(group_id)
        writer_epoch, state = owned.writer_epoch, owned.state
        now = self.clock.now()
        if effect is None:
            decision = decider.decide(state, command, await self._context(command, envelope, now, lookups))
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
        # The chain (docs/integrity.md): each event names the digest of the one before it, which
        # this instance knows for the Group's head without reading the store again.
        link = owned.chain_head
        leases_before = _running_leases(state, decision)
        payloads = []
        for event in decision:
            event.writer_epoch = writer_epoch
            if event.sequence > 1:
                event.previous_digest = link
            payload = event.SerializeToString(deterministic=True)
            link = event_digest(payload)
            payloads.append(payload)
        if self._writer_signs:
            envelopes = None  # the store's writer signs them (D56)
            stored = [_stored(event, b"") for event in decision]
        else:
            envelopes = [sign_envelope(p, EVENT_TYPE, self.signing_key, self.key_id) for p in payloads]
            stored = [_stored(event, env.SerializeToString()) for event, env in zip(decision, envelopes, strict=True)]
        request = AppendRequest(
            group_id=group_id,
            writer_epoch=writer_epoch,
            expected_head=state.head_sequence if state else 0,
            command_id=command.command_id,
            fingerprint=fingerprint_,
            events=stored,
            creates_group=state is None,
            rewrites=await self._erasures(group_id, decision),
            payloads=payloads if self._writer_signs else [],
            links=links,
            traceparent=tracing.current_traceparent(),
        )
        for event in decision:
            state = decider.evolve(state, event)
        assert state is not None
        request.leases = _lease_changes(leases_before, _running_leases(state, decision))
        result = command_pb2.CommandResult(command_id=command.command_id, group_id=group_id, group_revision=state.head_sequence)
        if envelopes is not None:
            result.events.extend(envelopes)
        pending = _Pending(
            owned, request, decision, result, fingerprint_, to_micros(now), self.key_id, envelopes is None, link
        )
        # The next command of this Group decides on this state (speculative until durable).
        owned.state = state
        owned.chain_head = link
        owned.pending[command.command_id] = pending
        self._remember(group_id, owned)
        self.store.enqueue(request)
        return pending

    async def _lookups(self, command: command_pb2.Command) -> _Lookups:
        """What the decision of ``command`` consults outside the Authority: the identities it names,
        the artifact it publishes, the Agent Cards in force of the agents it names. A refusal
        (a peer unavailable) is kept, and raised where the decision needs them: a replay of the
        command is still answered."""
        try:
            identities = {
                i: _identity_info(d) for i, d in (await self.identities.get_many(kinds.referenced_identities(command))).items()
            }
            artifacts = await self._published_artifacts(command)
            cards = {
                agent: card_info(published)
                for agent, published in (await self.identities.agent_cards(kinds.card_holders(command))).items()
            }
            held = await self._held_artifacts(command)
        except Rejected as refused:
            return _Lookups({}, {}, {}, refused=refused)
        return _Lookups(identities, artifacts, cards, held)

    async def _context(
        self,
        command: command_pb2.Command,
        envelope: common_pb2.SignedEnvelope | None,
        now: datetime,
        lookups: _Lookups | None = None,
    ) -> decider.DecisionContext:
        """What the decision of a signed command consults besides the Group's state."""
        if lookups is None:
            lookups = await self._lookups(command)
        if lookups.refused is not None:
            raise lookups.refused
        linked = {}
        for linked_id in kinds.linked_groups(command):
            linked_state = await self.state(linked_id)  # durable state of the other Group
            if linked_state is not None:
                linked[linked_id] = linked_state
        return decider.DecisionContext(
            now, lookups.identities, linked, envelope, lookups.artifacts, self.policy, lookups.cards, lookups.held
        )

    async def _published_artifacts(self, command: command_pb2.Command) -> dict[str, StoredArtifact]:
        """For work.publish_artifact: the blob must be stored with a manifest its publisher signed
        for this Group and WorkItem (verified by the ArtifactService at upload, MW-13.1-03)."""
        body = kinds.published_artifact(command)
        if body is None:
            return {}
        digest = body.artifact.digest
        if digest.algorithm != "blake3" or not ids.is_valid(digest.hex):
            return {}
        if self.publications is None:
            raise peer_unavailable("artifacts", "no artifact store is configured")
        request = publications_pb2.FindPublicationRequest(
            content_digest_hex=digest.hex,
            group_id=command.group_id,
            work_item_id=body.work_item_id,
            publisher_id=command.actor_id,
            manifest_digest_hex=manifest_digest(body.manifest) if body.HasField("manifest") else "",
        )
        try:
            found = await self.publications.FindPublication(request, timeout=PEER_TIMEOUT_S)
        except grpc.RpcError as err:
            raise peer_unavailable("artifacts", err) from None
        if not found.found:
            return {}
        return {
            digest.hex: StoredArtifact(
                digest.hex, found.size_bytes, found.manifest_digest_hex, command.actor_id, tuple(found.source_digests_hex)
            )
        }

    async def _held_artifacts(self, command: command_pb2.Command) -> dict[str, HeldArtifact]:
        """D161: what the artifact store holds of the blobs the command names as deliverables or
        Evidence, with the manifests its actor signed for this Group. Never accepted unchecked: a
        store that is not configured or does not answer refuses the command PEER_UNAVAILABLE."""
        digests = kinds.named_artifacts(command)
        if not digests:
            return {}
        if self.publications is None:
            raise peer_unavailable("artifacts", "no artifact store is configured")
        held: dict[str, HeldArtifact] = {}
        for start in range(0, len(digests), MAX_FIND_ARTIFACTS):
            request = publications_pb2.FindArtifactsRequest(
                group_id=command.group_id,
                content_digests_hex=digests[start : start + MAX_FIND_ARTIFACTS],
                producer_id=command.actor_id,
            )
            try:
                found = await self.publications.FindArtifacts(request, timeout=PEER_TIMEOUT_S)
            except grpc.RpcError as err:
                raise peer_unavailable("artifacts", err) from None
            for answer in found.artifacts:
                if answer.stored:
                    held[answer.content_digest_hex] = HeldArtifact(
                        answer.size_bytes,
                        tuple(
                            HeldManifest(m.manifest_digest_hex, m.work_item_id, m.mission_id, tuple(m.source_digests_hex))
                            for m in answer.manifests
                        ),
                    )
        return held

    async def _replay(self, command: command_pb2.Command, fingerprint_: bytes) -> command_pb2.CommandResult | None:
        owned = self._cache.get(command.group_id)
        if owned is not None:
            in_flight = owned.pending.get(command.command_id)
            if in_flight is not None:  # the same command id is still on its way to the store
                _check_same_body(command, in_flight.fingerprint, fingerprint_)
                try:
                    await asyncio.shield(in_flight.request.done)
                except Rejected:
                    return None  # the original failed: this one is decided afresh
                replayed = command_pb2.CommandResult()
                replayed.CopyFrom(in_flight.finish())
                replayed.replayed = True
                return replayed
            # While this instance owns the Group under its writer epoch, the command ids it loaded and
            # appended are complete: a foreign append would have fenced us and emptied the cache.
            record = owned.commands.get(command.command_id)
        else:
            record = await self.store.find_command(command.group_id, command.command_id)
        if record is None:
            return None
        _check_same_body(command, record.fingerprint, fingerprint_)
        stored = await self.read_range(command.group_id, record.first_seq, record.last_seq)
        check_replayed(self.integrity, command.group_id, command.command_id, stored)  # never another command's events
        return command_pb2.CommandResult(
            command_id=command.command_id,
            group_id=command.group_id,
            events=[codec.envelope(s.envelope) for s in stored],
            group_revision=record.last_seq,
            replayed=True,
        )

    async def _erasures(self, group_id: str, decision: list[event_pb2.Event]) -> list[tuple[int, bytes]]:
        """MW-7.4-04/05: each event a tombstone lists, re-signed with its content cleared and a
        marker naming the tombstone (the core's ``erased``)."""
        rewrites: list[tuple[int, bytes]] = []
        for tombstone, sequence in erasure_targets(decision):
            # Verified first: re-signing a tampered event would launder it.
            (stored,) = await self.read_range(group_id, sequence, sequence)
            event = erased(codec.decode_event(stored.envelope), tombstone, stored.envelope)
            envelope = sign_envelope(event.SerializeToString(deterministic=True), EVENT_TYPE, self.signing_key, self.key_id)
            rewrites.append((sequence, envelope.SerializeToString()))
            self.integrity.verified.forget(stored.envelope)  # the original may never be served again
        return rewrites

    # ------------------------------------------------------------ state

    async def _load(self, group_id: str) -> _OwnedGroup:
        cached = self._cache.get(group_id)
        if cached is not None:
            self._cache.move_to_end(group_id)
            return cached
        taken_us = to_micros(self.clock.now())
        acquired = await self.store.acquire(group_id)
        if acquired is None:
            # The Group does not exist yet: a creating command takes writer epoch 1. Not cached, so a
            # rejected creation leaves nothing behind.
            return _OwnedGroup(1, None, {})
        writer_epoch, head = acquired
        state, link = await self._fold_verified(group_id, head, exact=True)
        # Two copies: ``evolve`` mutates, and the speculative one runs ahead of the durable one.
        owned = _OwnedGroup(writer_epoch, state, await self.store.commands_of(group_id), copy.deepcopy(state))
        owned.chain_head = owned.durable_link = link
        owned.sole_writer_until_us = taken_us + self._lease_margin_us
        self._remember(group_id, owned)
        return owned

    async def fold(self, group_id: str) -> GroupState | None:
        """Rebuild a Group's state from its stored log, verified (also used by the replay-equivalence test)."""
        self.integrity.refuse_if_corrupted(group_id)
        return (await self._fold_verified(group_id, await self.store.head(group_id)))[0]

    async def _fold_verified(self, group_id: str, head: int | None, *, exact: bool = False) -> tuple[GroupState | None, bytes]:
        """The state folded from the whole stored log (both tiers) and the event digest at its head,
        every event verified on the way (signature, sequence, chain, erasures: docs/integrity.md).
        ``head`` is the Group row's head, read before: the log must reach it (exactly, for a Group this
        instance has just taken, which nobody else can extend), so a truncated log is caught too."""
        await refuse_if_shortened(self.store, self.integrity, group_id)  # records past the head (truncation.py)
        state: GroupState | None = None
        chain = Chain(group_id, checkpoint=self.integrity.checkpoint(group_id, await self.store.chain_checkpoint(group_id)))
        while True:
            batch = await self.store.read_history(group_id, chain.last, 1024)
            if not batch:
                break
            for event in await self.integrity.check(group_id, batch, chain, events=True):
                state = decider.evolve(state, event)
        if head is not None and (chain.last < head or (exact and chain.last != head)):
            raise self.integrity.mark(
                Corruption(group_id, chain.last + 1, f"the log ends at {chain.last} but the Group's head is {head}")
            )
        if chain.checkpoint is not None and chain.last < chain.checkpoint[0]:
            raise self.integrity.mark(
                Corruption(group_id, chain.last + 1, f"the log ends at {chain.last}, before its signed chain checkpoint")
            )
        assert chain.previous is not None
        if chain.signatures_checked >= self.checkpoint_every and chain.last > 0:
            # What this load verified one signature at a time, the next one checks by the hash chain.
            payload = checkpoint_payload(group_id, chain.last, chain.previous)
            envelope = sign_envelope(payload, CHECKPOINT_TYPE, self.signing_key, self.key_id)
            await self.store.save_chain_checkpoint(group_id, chain.last, envelope.SerializeToString())
        return state, chain.previous

    async def read_history(self, group_id: str, after: int = 0, limit: int = 1024) -> list[StoredEvent]:
        """Events after ``after`` from both tiers, verified (ReadEvents, FetchEvents, replays)."""
        self.integrity.refuse_if_corrupted(group_id)
        batch = await self.store.read_history(group_id, after, limit)
        await self.integrity.check(group_id, batch, Chain(group_id, after, self._link_at(group_id, after)))
        return batch

    async def read_range(self, group_id: str, first: int, last: int) -> list[StoredEvent]:
        """Events ``first..last`` from whichever tier holds them, verified."""
        batch = await self.read_history(group_id, first - 1, last - first + 1)
        if len(batch) != last - first + 1:
            raise self.integrity.mark(Corruption(group_id, first + len(batch), f"events {first}..{last} are not all stored"))
        return batch

    def _link_at(self, group_id: str, sequence: int) -> bytes | None:
        """The event digest at ``sequence`` when this instance knows it (the durable head)."""
        owned = self._cache.get(group_id)
        if owned is not None and sequence == owned.durable_head:
            return owned.durable_link
        return None

    def _corrupted(self, group_id: str) -> None:
        """A Group failed verification: forget everything held of it; tell health."""
        metrics.LOG_VERIFICATION_FAILURES.inc()
        self._cache.pop(group_id, None)
        self.tails.drop(group_id)
        if self._on_corrupted is not None:
            self._on_corrupted(group_id)

    async def signed_summary(self, group_id: str, viewer: str | None = None) -> common_pb2.SignedEnvelope | None:
        """The Group's durable state signed by this Authority (MW-7.2-07 hand-over summary): all of
        it, or what member ``viewer`` may see of it."""
        state = await self.state(group_id)
        if state is None:
            return None
        payload = group_state_proto(state, viewer).SerializeToString(deterministic=True)
        return sign_envelope(payload, GROUP_SUMMARY_TYPE, self.signing_key, self.key_id)

    async def context_package(
        self,
        group_id: str,
        *,
        work_item_ids: list[str],
        purpose: int,
        recipient_ids: list[str],
        previous: common_pb2.SignedEnvelope | None,
        target_group_id: str = "",
        transfer_authorization_event_id: str = "",
    ) -> common_pb2.SignedEnvelope | None:
        """A signed Context Package of the Group's durable state (MW-13.3-01/02/04/05/07)."""
        state = await self.state(group_id)
        if state is None:
            return None
        if target_group_id == group_id:
            target_group_id = ""
        if target_group_id or transfer_authorization_event_id:
            check_transfer(state, target_group_id, transfer_authorization_event_id, work_item_ids)
        prior, prior_payload = None, b""
        if previous is not None and previous.payload:
            if previous.payload_type != CONTEXT_PACKAGE_TYPE or not verify_envelope(previous, self.public_key):
                raise Rejected(R.REJECTION_REASON_SIGNATURE_INVALID, "previous_version is not a package signed by this Authority")
            prior, prior_payload = artifact_service_pb2.ContextPackage.FromString(previous.payload), previous.payload
            if prior.group_id != group_id:
                raise Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, "previous_version belongs to another Group", field="previous_version")
        package = build_context_package(
            state,
            work_item_ids=work_item_ids,
            purpose=purpose,
            recipient_ids=recipient_ids,
            generator_id=self.key_id,
            now=self.clock.now(),
            previous=prior,
            previous_payload=prior_payload,
        )
        package.target_group_id = target_group_id
        package.transfer_authorization_event_id = transfer_authorization_event_id if target_group_id else ""
        return sign_envelope(package.SerializeToString(deterministic=True), CONTEXT_PACKAGE_TYPE, self.signing_key, self.key_id)

    async def take_snapshot(
        self, group_id: str, *, compact: bool = False, archival: bool = False
    ) -> tuple[common_pb2.SignedEnvelope, str, int] | None:
        """A signed snapshot of the durable state (MW-16-11, MW-7.4-02); optionally compact before it."""
        self.integrity.refuse_if_corrupted(group_id)
        owned = self._cache.get(group_id)
        if owned is not None:
            state, link = owned.durable_state, owned.durable_link
        else:
            state, link = await self._fold_verified(group_id, await self.store.head(group_id))
        if state is None or state.mission is None:
            return None
        if archival and state.mission.state not in TERMINAL_MISSION_STATES:
            raise Rejected(
                R.REJECTION_REASON_PRECONDITION_FAILED,
                "an archival snapshot is taken of a finished Mission; this one is still live (MW-7.4-01)",
            )
        now = self.clock.now()
        snapshot = authority_service_pb2.GroupSnapshot(
            group_id=group_id,
            sequence=state.head_sequence,
            state=group_state_proto(state),
            progress=mission_progress(state, now),
            created_at=to_timestamp(now),
            archival=archival,
            last_event_digest=link,
        )
        payload = snapshot.SerializeToString(deterministic=True)
        envelope = sign_envelope(payload, SNAPSHOT_TYPE, self.signing_key, self.key_id)
        digest = blake3.blake3(payload).hexdigest()
        if compact:
            # Compacted events must not be served as online any more. Appends completing from here on
            # start a fresh tail above the snapshot's sequence, so one drop before the move suffices.
            self.tails.drop(group_id)
        await self.store.save_snapshot(
            group_id, state.head_sequence, digest, envelope.SerializeToString(), archival, to_micros(now), compact=compact
        )
        return envelope, digest, state.head_sequence

    async def state(self, group_id: str) -> GroupState | None:
        self.integrity.refuse_if_corrupted(group_id)
        cached = self._cache.get(group_id)
        if cached is not None:
            return cached.durable_state  # never the speculative state of appends still in flight
        return await self.fold(group_id)

    def _remember(self, group_id: str, owned: _OwnedGroup) -> None:
        self._cache[group_id] = owned
        self._cache.move_to_end(group_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _forget(self, group_id: str, owned: _OwnedGroup) -> None:
        self.tails.drop(group_id)
        if self._cache.get(group_id) is owned:
            del self._cache[group_id]

    async def read_online(self, group_id: str, after: int, limit: int) -> list[StoredEvent]:
        """The online log after ``after``: the just-appended tail from memory, else the database.

        A follower that has caught up with a Group this instance writes is told so from memory too,
        while this instance's ownership lease certainly holds (nobody else can have appended):
        otherwise every caught-up subscriber cost a query per delivery.
        """
        self.integrity.refuse_if_corrupted(group_id)
        owned = self._cache.get(group_id)
        if owned is not None:
            cached = self.tails.read(group_id, after, limit)
            if cached is not None:
                return cached  # the envelopes this instance made durable itself
            if after >= owned.durable_head and to_micros(self.clock.now()) < owned.sole_writer_until_us:
                return []
        batch = await self.store.read(group_id, after, limit)
        if batch and batch[0].sequence == after + 1:  # else compacted: the caller answers CURSOR_TOO_OLD
            await self.integrity.check(group_id, batch, Chain(group_id, after, self._link_at(group_id, after)))
        return batch

    def _lock(self, group_id: str) -> _GroupLock:
        return _GroupLock(self._locks, group_id)

    # ------------------------------------------------------------ followers

    def _wake(self, group_id: str) -> None:
        waiter = self._appended.pop(group_id, None)
        if waiter is not None:
            waiter.set()

    def wake_all(self) -> None:
        """Wake every follower waiting for an append (at shutdown, so that they re-check and end)."""
        waiters, self._appended = self._appended, {}
        for waiter in waiters.values():
            waiter.set()

    async def wait_for_append(self, group_id: str, timeout: float) -> bool:  # noqa: ASYNC109 (a bounded wake-up hint)
        """Resolves when the Group gets new events (in this process): True, or after ``timeout``: False."""
        waiter = self._appended.setdefault(group_id, asyncio.Event())
        try:
            # asyncio.timeout, not wait_for: every caught-up subscriber waits here after each delivery,
            # and wait_for wraps the wait in a task of its own.
            async with asyncio.timeout(timeout):
                await waiter.wait()
        except TimeoutError:
            return False
        return True


# Durable events a Group's readers' copy applies at once: the command path only queues them (a
# second fold per event on the loop's hot path), the next reader or this bound applies them.
SETTLE_BATCH = 64


@dataclass
class _OwnedGroup:
    """A Group this instance owns: its writer epoch, folded state and accepted command ids.

    ``state`` includes appends still in the group-commit queue (what the next command decides on);
    ``durable_state``, a separate object, only what the store has acknowledged (what readers see).
    """

    writer_epoch: int
    state: GroupState | None
    commands: dict[str, CommandRecord]
    _durable: GroupState | None = None
    pending: dict[str, _Pending] = field(default_factory=dict)
    # Acknowledged events not yet folded into ``_durable`` (at most SETTLE_BATCH).
    _unsettled: list[event_pb2.Event] = field(default_factory=list)
    durable_head: int = field(init=False)
    # Until then (µs since the epoch) this instance is certainly the Group's only writer.
    sole_writer_until_us: int = 0
    # Event digests (docs/integrity.md) at the head of ``state`` (what the next append names) and
    # at ``durable_head``.
    chain_head: bytes = b""
    durable_link: bytes = b""

    def __post_init__(self) -> None:
        self.durable_head = self._durable.head_sequence if self._durable else 0

    def settle(self, events: list[event_pb2.Event]) -> None:
        """The store acknowledged ``events`` (the next ones after ``durable_head``)."""
        self._unsettled.extend(events)
        self.durable_head = events[-1].sequence
        if len(self._unsettled) >= SETTLE_BATCH:
            self._apply_unsettled()

    @property
    def durable_state(self) -> GroupState | None:
        if self._unsettled:
            self._apply_unsettled()
        return self._durable

    def _apply_unsettled(self) -> None:
        state = self._durable
        for event in self._unsettled:
            state = decider.evolve(state, event)
        self._durable, self._unsettled = state, []


@dataclass
class _Lookups:
    """What ``Authority._lookups`` found for one command (``refused``: why it could not)."""

    identities: dict[str, IdentityInfo]
    artifacts: dict[str, StoredArtifact]
    cards: dict[str, CardInfo]
    held: dict[str, HeldArtifact] = field(default_factory=dict)
    refused: Rejected | None = None


@dataclass
class _Pending:
    """A decided command whose append is queued: what to answer once the store confirms it."""

    owned: _OwnedGroup
    request: AppendRequest
    events: list[event_pb2.Event]
    result: command_pb2.CommandResult
    fingerprint: bytes
    decided_us: int  # before the append's commit, so before the ownership lease it renews
    key_id: str
    unsigned: bool  # the store's writer signs the events: envelopes come with its answer
    link: bytes  # the event digest of its last event

    def finish(self) -> command_pb2.CommandResult:
        """The answer, once the append is durable: where the writer signed the events, their
        envelopes are rebuilt from its signatures, byte for byte the ones it stored."""
        if self.unsigned:
            request = self.request
            envelopes = [
                signed_envelope(p, EVENT_TYPE, self.key_id, sig)
                for p, sig in zip(request.payloads, request.signatures, strict=True)
            ]
            request.events = [
                dataclasses.replace(e, envelope=env.SerializeToString()) for e, env in zip(request.events, envelopes, strict=True)
            ]
            self.result.events.extend(envelopes)
            self.unsigned = False
        return self.result


class _LockEntry:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0  # holders plus waiters


class _GroupLock:
    """A per-Group asyncio lock that is forgotten once nobody holds or awaits it (bounded memory)."""

    def __init__(self, locks: dict[str, _LockEntry], key: str) -> None:
        self.locks = locks
        self.key = key

    async def __aenter__(self) -> None:
        entry = self.locks.get(self.key)
        if entry is None:
            entry = self.locks[self.key] = _LockEntry()
        entry.users += 1
        try:
            await entry.lock.acquire()
        except BaseException:
            self._leave(entry)
            raise
        self.entry = entry

    async def __aexit__(self, *exc: object) -> None:
        self.entry.lock.release()
        self._leave(self.entry)

    def _leave(self, entry: _LockEntry) -> None:
        entry.users -= 1
        if entry.users == 0:
            self.locks.pop(self.key, None)


def _running_leases(state: GroupState | None, events: list[event_pb2.Event]) -> dict[str, tuple[str, int]]:
    """(agent, session epoch) of the running lease of each WorkItem the events name."""
    running: dict[str, tuple[str, int]] = {}
    if state is None:
        return running
    for event in events:
        work_item_id = named_work_item(event)
        item = state.work_items.get(work_item_id) if work_item_id else None
        if item is not None and item.lease is not None:
            running[work_item_id] = (item.lease.agent_id, item.lease.session_epoch)
        elif work_item_id:
            running[work_item_id] = ("", 0)
    return running


def _lease_changes(before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]) -> list[tuple[str, str, int]]:
    """The live-lease index rows an append changes: (WorkItem, agent, session epoch), agent "" = none."""
    return [(work_item_id, *now) for work_item_id, now in after.items() if before.get(work_item_id, ("", 0)) != now]


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
    return {f"mwp.{key}": value for key, value in _log_fields(command, command.WhichOneof("body") or "unknown").items()}


def _fingerprint(command: command_pb2.Command) -> bytes:
    """What makes two commands with one id "the same": everything but the issue time."""
    issued_at = command.issued_at.SerializeToString()
    command.ClearField("issued_at")
    try:
        return blake3.blake3(command.SerializeToString(deterministic=True)).digest()
    finally:
        command.issued_at.ParseFromString(issued_at)


def _check_same_body(command: command_pb2.Command, recorded: bytes, fingerprint_: bytes) -> None:
    if recorded != fingerprint_:
        raise Rejected(
            R.REJECTION_REASON_COMMAND_ID_REUSED,
            f"command id {command.command_id} was already used in this Group with a different body",
        )


def _identity_info(identity: DirectoryIdentity) -> IdentityInfo:
    return IdentityInfo(identity.identity_id, identity.kind, identity.org_admin, identity.session_epoch)


def _stored(event: event_pb2.Event, envelope: bytes) -> StoredEvent:
    return StoredEvent(
        sequence=event.sequence,
        event_id=event.event_id,
        type=event.type,
        recorded_us=timestamp_micros(event.recorded_at),
        envelope=envelope,
    )


def card_info(published: agent_card_pb2.PublishedAgentCard) -> CardInfo:
    card = published.card
    return CardInfo(card.card_version, {c.capability_id: c.version for c in card.capabilities}, card.max_concurrency)
