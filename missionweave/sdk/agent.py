"""The Python agent SDK: one resilient gateway stream, in-order handlers, durable cursors (spec 16).

An agent author writes ``async`` handlers; the SDK speaks the frame protocol of
``GatewayService.Connect`` (documented at the top of ``protos/missionweave/v1/gateway_service.proto``)::

    import asyncio
    from missionweave.sdk.agent import Agent, post_message
    from missionweave.v1 import event_pb2

    async def main() -> None:
        async with Agent.connect("127.0.0.1:50051", "coord", "coord.key", cursor_dir=".cursors") as agent:

            async def on_event(event: event_pb2.Event) -> None:
                if event.type == "message.posted" and event.actor_id != agent.identity_id:
                    posted = event.message_posted
                    reply = post_message(posted.conversation_id, "ack", reply_to_message_id=posted.message_id)
                    await agent.execute(event.group_id, reply)

            await agent.subscribe("grp_...", on_event)
            await asyncio.Event().wait()  # run until cancelled (Ctrl-C)

    asyncio.run(main())

What the SDK guarantees (MW-16-01..07, MW-16-10):

* **Ordered, exactly once per process run.** Each Group's events reach ``await handler(event)`` in
  sequence order, one at a time; frames that arrive out of order are buffered, duplicates (by event id
  and by sequence) are dropped (MW-16-02..04). Events filtered out by the gateway (``EventFrame.skipped``)
  never reach the handler but advance the cursor.
* **Durable cursor that never crosses a gap.** Behind the handler, the cursor (the highest contiguous
  sequence processed, MW-16-06) is written to ``<cursor_dir>/<agent>/cursors.json`` atomically
  (temporary file, fsync, rename), every Group's in one write per round (at most one per
  ``cursor_interval`` seconds, D143); only a written cursor is reported or
  ACKed (MW-16-05). A restarted agent resumes from it: at least once across restarts, since a crash
  before the write repeats the events handled since the previous one (MW-16-14: make side effects
  idempotent with :meth:`Agent.idempotency_key`).
* **Reconnects.** When the stream breaks the agent reconnects with capped, jittered exponential backoff,
  re-sends HELLO and re-SUBSCRIBEs every Group from its durable cursor (MW-16-10); commands still waiting
  for their RESULT are re-sent with the same command id (the Authority answers a retry idempotently).
* **Flow control.** ACKs carry the cursor and grant fresh credits in batches (when half of the window has
  been processed, or when the subscription is idle), so at most ``credits`` events are ever in flight.

Events are verified against the Authority key (``GetAuthorityKey``) before anything reads them.
Over TLS, pass ``tls=ClientTLS(ca_file=...)`` (and ``cert_file``/``key_file`` for mTLS) or
``tls=ClientTLS.from_env()`` to :meth:`Agent.connect` (docs/tls.md).
Logging goes to the ``missionweave.sdk.agent`` logger. See ``docs/sdk.md`` and ``examples/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import blake3
import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import DecodeError, Message
from nacl.signing import SigningKey

from missionweave import __version__
from missionweave.clock import SystemClock, to_timestamp
from missionweave.eventlog import event_digest, link_of
from missionweave.rpc.channels import ClientTLS, open_channel
from missionweave.sdk.client import SessionSigner, open_session_envelope
from missionweave.sdk.client import membership_epoch as active_membership_epoch
from missionweave.sdk.credentials import CallProofs
from missionweave.sdk.cursors import CURSOR_INTERVAL_S, CursorStore
from missionweave.sdk.errors import AgentError
from missionweave.sdk.files import file_name, private_dir, read_json, write_json_atomic
from missionweave.sdk.idempotency import attempt_key
from missionweave.signing import (
    EVENT_TYPE,
    HELLO_PROOF_TYPE,
    SNAPSHOT_REFERENCE_TYPE,
    SNAPSHOT_TYPE,
    read_key,
    session_key_id,
    sign_envelope,
    verify_signature,
)
from missionweave.v1 import (
    authority_service_pb2,
    authority_service_pb2_grpc,
    command_pb2,
    common_pb2,
    conversation_pb2,
    event_pb2,
    membership_service_pb2,
    membership_service_pb2_grpc,
    work_pb2,
)
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc

__all__ = [
    "Agent",
    "AgentClosed",
    "AgentError",
    "AuthorityVerifier",
    "Backoff",
    "ClientTLS",
    "CommandBody",
    "CommandRejected",
    "CreditWindow",
    "CursorStore",
    "Fetched",
    "GatewayError",
    "GroupSequencer",
    "Handler",
    "NotVerified",
    "SessionFile",
    "SessionReplaced",
    "Slot",
    "SnapshotHandler",
    "Subscription",
    "SubscriptionFailed",
    "accept_offer",
    "attempt_key",
    "checkpoint",
    "fail",
    "post_message",
    "renew_lease",
    "start_work",
    "submit",
]

log = logging.getLogger("missionweave.sdk.agent")

CLIENT_VERSION = f"missionweave-py/{__version__}"
MAX_CREDITS = 65_536
# ACKs of all subscriptions queued within this window go out as one ACK frame: under a busy Group an
# agent would otherwise write one frame per event per subscription, on its stream and the gateway's.
ACK_COALESCE_S = 0.002
E = pb.GatewayErrorCode
R = common_pb2.RejectionReason
_clock = SystemClock()

# ============================================================================ errors


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:  # a value newer than this client's protos
        return str(value)


class AgentClosed(AgentError):
    """The agent was closed while the operation was waiting."""


class NotVerified(AgentError):
    """An event, snapshot reference or snapshot whose Authority signature or digest does not check out."""


class CommandRejected(AgentError):
    """The Authority refused a command (RESULT with a Rejection); nothing was written.

    ``rejection`` is the ``missionweave.v1.Rejection``; ``reason_name`` its reason without the prefix,
    e.g. ``"MEMBERSHIP_EPOCH_STALE"``.
    """

    def __init__(self, command_id: str, rejection: common_pb2.Rejection) -> None:
        self.command_id = command_id
        self.rejection = rejection
        self.reason = rejection.reason
        self.reason_name = _enum_name(R, rejection.reason, "REJECTION_REASON_")
        super().__init__(f"{self.reason_name}: {rejection.message}")


class GatewayError(AgentError):
    """An ERROR frame from the gateway; ``code`` is its ``GatewayErrorCode``."""

    def __init__(self, frame: pb.ErrorFrame) -> None:
        self.frame = frame
        self.code = frame.code
        self.fatal = frame.fatal
        super().__init__(f"{_enum_name(E, frame.code, 'GATEWAY_ERROR_CODE_')}: {frame.rejection.message}")


class SubscriptionFailed(AgentError):
    """A subscription stopped for good (no Membership, history unavailable, unverifiable events, ...)."""


class _Stop(Exception):
    """Internal: the subscription is stopping while a handler is being retried."""


# ============================================================================ typed command builders


class CommandBody(NamedTuple):
    """A command kind (the field name in ``Command.body``) with its body, for :meth:`Agent.execute`."""

    kind: str
    body: Message


def _duration(seconds: float | None) -> duration_pb2.Duration | None:
    if seconds is None:
        return None
    out = duration_pb2.Duration()
    out.FromNanoseconds(int(seconds * 1e9))
    return out


def post_message(
    conversation_id: str,
    text: str,
    *,
    mentions: Iterable[str] = (),
    reply_to_message_id: str = "",
    topic: str = "",
    data_json: str = "",
    message_id: str = "",
) -> CommandBody:
    """``message.post`` (MW-9-13): a Message in a Conversation, never an assignment.

    >>> cmd = post_message("conv_1", "@coord ready?", mentions=["coord"])
    >>> cmd.kind, list(cmd.body.content.mentions)
    ('message_post', ['coord'])
    """
    content = conversation_pb2.MessageContent(text=text, data_json=data_json, mentions=list(mentions))
    return CommandBody(
        "message_post",
        conversation_pb2.MessagePost(
            conversation_id=conversation_id,
            message_id=message_id,
            content=content,
            reply_to_message_id=reply_to_message_id,
            topic=topic,
        ),
    )


def accept_offer(
    work_item_id: str,
    offer_id: str,
    contract_revision: int,
    *,
    schedule: work_pb2.ScheduleDisclosure | None = None,
) -> CommandBody:
    """``work.accept_offer``: accept an offer made to you at the current contract revision.

    >>> accept_offer("wi-1", "offer-1", 1).body.contract_revision
    1
    """
    return CommandBody(
        "work_accept_offer",
        work_pb2.WorkAcceptOffer(
            work_item_id=work_item_id,
            offer_id=offer_id,
            contract_revision=contract_revision,
            schedule=schedule,
        ),
    )


def start_work(
    work_item_id: str,
    ownership_epoch: int,
    *,
    lease_id: str = "",
    lease_seconds: float | None = None,
    resume_from_checkpoint_id: str = "",
    requested_scope: work_pb2.ExecutionPermissions | None = None,
) -> CommandBody:
    """``work.start``: take the execution lease (empty ``lease_id``: derived from the command id).

    >>> start_work("wi-1", 1, lease_id="lease-a", lease_seconds=90).body.requested_duration.seconds
    90
    """
    return CommandBody(
        "work_start",
        work_pb2.WorkStart(
            work_item_id=work_item_id,
            ownership_epoch=ownership_epoch,
            lease_id=lease_id,
            requested_duration=_duration(lease_seconds),
            resume_from_checkpoint_id=resume_from_checkpoint_id,
            requested_scope=requested_scope,
        ),
    )


def renew_lease(
    work_item_id: str,
    lease_id: str,
    ownership_epoch: int,
    *,
    lease_seconds: float | None = None,
    usage_delta: common_pb2.ResourceVector | None = None,
) -> CommandBody:
    """``work.renew_lease``: extend the current execution lease before it expires.

    >>> renew_lease("wi-1", "lease-a", 1).kind
    'work_renew_lease'
    """
    return CommandBody(
        "work_renew_lease",
        work_pb2.WorkRenewLease(
            work_item_id=work_item_id,
            lease_id=lease_id,
            ownership_epoch=ownership_epoch,
            requested_duration=_duration(lease_seconds),
            usage_delta=usage_delta,
        ),
    )


def checkpoint(
    work_item_id: str,
    lease_id: str,
    ownership_epoch: int,
    checkpoint_id: str,
    *,
    progress: work_pb2.ProgressReport | None = None,
    state: common_pb2.ArtifactRef | None = None,
    completed_operation_ids: Iterable[str] = (),
    preemption_request_id: str = "",
    usage_delta: common_pb2.ResourceVector | None = None,
) -> CommandBody:
    """``work.checkpoint``: record durable progress (releases the execution lease, keeps ownership).

    ``completed_operation_ids`` names the logical operations whose external side effects are done, so a
    later owner does not repeat them (MW-16-13).

    >>> checkpoint("wi-1", "lease-a", 1, "ck-1", completed_operation_ids=["send-mail"]).body.checkpoint.checkpoint_id
    'ck-1'
    """
    taken = work_pb2.Checkpoint(
        checkpoint_id=checkpoint_id,
        state=state,
        progress=progress,
        completed_operation_ids=list(completed_operation_ids),
        taken_at=to_timestamp(_clock.now()),
    )
    return CommandBody(
        "work_checkpoint",
        work_pb2.WorkCheckpoint(
            work_item_id=work_item_id,
            lease_id=lease_id,
            ownership_epoch=ownership_epoch,
            checkpoint=taken,
            preemption_request_id=preemption_request_id,
            usage_delta=usage_delta,
        ),
    )


def submit(
    work_item_id: str,
    lease_id: str,
    ownership_epoch: int,
    contract_revision: int,
    evidence: Iterable[work_pb2.Evidence],
    *,
    artifacts: Iterable[common_pb2.ArtifactRef] = (),
    summary: str = "",
    usage_delta: common_pb2.ResourceVector | None = None,
) -> CommandBody:
    """``work.submit``: hand in the result with Evidence per required acceptance criterion (MW-13.2-02).

    >>> submit("wi-1", "lease-a", 1, 1, [work_pb2.Evidence(criterion_id="balances")], summary="done").kind
    'work_submit'
    """
    return CommandBody(
        "work_submit",
        work_pb2.WorkSubmit(
            work_item_id=work_item_id,
            lease_id=lease_id,
            ownership_epoch=ownership_epoch,
            contract_revision=contract_revision,
            artifacts=list(artifacts),
            evidence=list(evidence),
            summary=summary,
            usage_delta=usage_delta,
        ),
    )


def fail(
    work_item_id: str,
    lease_id: str,
    ownership_epoch: int,
    kind: work_pb2.WorkFailureKind.ValueType,
    reason: str,
    evidence: Iterable[work_pb2.Evidence],
    *,
    usage_delta: common_pb2.ResourceVector | None = None,
) -> CommandBody:
    """``work.fail`` as the Worker: classify the failure and attach failure Evidence.

    >>> fail("wi-1", "lease-a", 1, work_pb2.WORK_FAILURE_KIND_TRANSIENT, "API down", []).body.reason
    'API down'
    """
    return CommandBody(
        "work_fail",
        work_pb2.WorkFail(
            work_item_id=work_item_id,
            lease_id=lease_id,
            ownership_epoch=ownership_epoch,
            kind=kind,
            reason=reason,
            evidence=list(evidence),
            usage_delta=usage_delta,
        ),
    )


# ============================================================================ ordering, credits, backoff (pure)

T = TypeVar("T")


@dataclass(frozen=True)
class Slot(Generic[T]):
    """One step of a Group's log: an event (``first == last``) or a skipped range (``item is None``)."""

    first: int
    last: int
    item: T | None = None
    event_id: str = ""


class GroupSequencer(Generic[T]):
    """In-order, deduplicated release of one Group's events; the cursor never crosses a gap.

    Pure (no I/O): feed it what arrives, take :meth:`next_ready` slots, and call :meth:`done` once a slot
    has been processed. ``cursor`` is the highest contiguous sequence processed (MW-16-06).

    >>> seq = GroupSequencer[str]()
    >>> seq.add_event(2, "evt_b", "b"), seq.add_event(1, "evt_a", "a"), seq.add_event(1, "evt_a", "a")
    (True, True, False)
    >>> while (slot := seq.next_ready()) is not None:
    ...     seq.done(slot)
    >>> seq.cursor
    2
    """

    def __init__(self, cursor: int = 0, *, remember: int = 65_536) -> None:
        self._cursor = cursor
        self._slots: dict[int, Slot[T]] = {}
        self._firsts: list[int] = []  # heap over the keys of _slots
        self._buffered_ids: set[str] = set()
        self._done_ids: OrderedDict[str, None] = OrderedDict()  # bounded memory of processed event ids
        self._remember = remember

    @property
    def cursor(self) -> int:
        return self._cursor

    @property
    def buffered(self) -> int:
        """Slots held back, waiting for their turn."""
        return len(self._slots)

    @property
    def has_gap(self) -> bool:
        """Something is buffered but the next sequence is missing."""
        return bool(self._slots) and self.next_ready() is None

    def add_event(self, sequence: int, event_id: str, item: T) -> bool:
        """Buffers an event; False for a duplicate (same event id or sequence, or at or below the cursor)."""
        known = event_id in self._buffered_ids or event_id in self._done_ids
        if sequence <= self._cursor or sequence in self._slots or known:
            return False
        self._put(Slot(sequence, sequence, item, event_id))
        self._buffered_ids.add(event_id)
        return True

    def add_skipped(self, first: int, last: int) -> bool:
        """Buffers a range the gateway did not deliver (attention filter, OP-26): it advances the cursor too."""
        first = max(first, self._cursor + 1)
        if first > last or first in self._slots:
            return False
        self._put(Slot(first, last))
        return True

    def next_ready(self) -> Slot[T] | None:
        """The slot that continues the cursor, or None (nothing buffered, or a gap)."""
        self._prune()
        if not self._firsts:
            return None
        slot = self._slots[self._firsts[0]]
        if slot.first > self._cursor + 1:
            return None
        return slot if slot.first == self._cursor + 1 else replace(slot, first=self._cursor + 1)

    def done(self, slot: Slot[T]) -> None:
        """Marks ``slot`` (from :meth:`next_ready`) processed: the cursor moves to its last sequence."""
        if slot.first > self._cursor + 1:
            raise ValueError(f"slot {slot.first}..{slot.last} does not continue cursor {self._cursor}")
        self._cursor = max(self._cursor, slot.last)
        if slot.event_id:
            self._done_ids[slot.event_id] = None
            if len(self._done_ids) > self._remember:
                self._done_ids.popitem(last=False)
        self._prune()

    def jump(self, sequence: int) -> None:
        """Raises the cursor to a position the server declared (visibility start, restored snapshot)."""
        self._cursor = max(self._cursor, sequence)

    def clear(self) -> None:
        """Forgets everything buffered (before a resubscription replays it from the cursor)."""
        self._slots.clear()
        self._firsts.clear()
        self._buffered_ids.clear()

    def _put(self, slot: Slot[T]) -> None:
        self._slots[slot.first] = slot
        heapq.heappush(self._firsts, slot.first)

    def _prune(self) -> None:
        """Drops buffered slots the cursor has already passed."""
        while self._firsts and self._slots[self._firsts[0]].last <= self._cursor:
            slot = self._slots.pop(heapq.heappop(self._firsts))
            self._buffered_ids.discard(slot.event_id)


class CreditWindow:
    """Credit accounting of one subscription attempt (MW-8-17), mirroring the gateway's window.

    The gateway spends one credit per sequence an EVENT frame covers. A frame's credits are granted back
    once the cursor has passed its last sequence, in ACKs sent when half of the window is free again (or
    when the subscription is idle). The acknowledged cursor never exceeds what this attempt delivered.

    >>> window = CreditWindow(credits=8, after=0)
    >>> window.received(1, 4)
    >>> window.processed(cursor=4)
    >>> window.due(cursor=4, idle=False), window.take(cursor=4)
    (True, (4, 4))
    """

    def __init__(self, credits: int, after: int) -> None:
        self.credits = credits
        self.delivered = after  # highest sequence the gateway covered on this attempt
        self.acked = after
        self._frames: list[tuple[int, int]] = []  # (last sequence, sequences covered), not yet processed
        self._released = 0

    def received(self, first: int, last: int) -> None:
        self.delivered = max(self.delivered, last)
        self._frames.append((last, last - first + 1))

    def start_at(self, sequence: int) -> None:
        """The gateway raised the start (visibility, MW-8-07): everything up to ``sequence`` is delivered."""
        self.delivered = max(self.delivered, sequence)

    def processed(self, cursor: int) -> None:
        pending = []
        for last, size in self._frames:
            if last <= cursor:
                self._released += size
            else:
                pending.append((last, size))
        self._frames = pending

    def due(self, cursor: int, *, idle: bool) -> bool:
        if self._released >= max(1, self.credits // 2):
            return True
        return idle and (self._released > 0 or min(cursor, self.delivered) > self.acked)

    def take(self, cursor: int) -> tuple[int, int]:
        """The (cursor, credits) to put in the next ACK; resets the released credits."""
        self.acked = max(self.acked, min(cursor, self.delivered))
        credits, self._released = self._released, 0
        return self.acked, credits


_JITTER = random.Random()  # shared: a handler call makes a Backoff, and seeding one costs ~100 us


class Backoff:
    """Capped exponential backoff with jitter: the n-th delay lies in [d/2, d], d = min(cap, initial * 2**n).

    >>> backoff = Backoff(initial=1.0, cap=4.0)
    >>> [0.5 <= backoff.next() <= 1, 1 <= backoff.next() <= 2, 2 <= backoff.next() <= 4, 2 <= backoff.next() <= 4]
    [True, True, True, True]
    """

    def __init__(
        self, initial: float = 0.2, cap: float = 30.0, factor: float = 2.0, rng: random.Random | None = None
    ) -> None:
        self.initial, self.cap, self.factor = initial, cap, factor
        self._rng = rng
        self._attempt = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.initial * self.factor**self._attempt)
        self._attempt = min(self._attempt + 1, 64)
        return ceiling / 2 + (self._rng or _JITTER).uniform(0, ceiling / 2)

    def reset(self) -> None:
        self._attempt = 0


# ============================================================================ durable files


class SessionFile:
    """The agent's session (epoch and session key seed, mode 0600), reused until the gateway refuses it."""

    def __init__(self, path: Path, identity_id: str) -> None:
        self.path = path
        self.identity_id = identity_id

    def load(self) -> SessionSigner | None:
        data = read_json(self.path)
        if data is None or data.get("identity_id") != self.identity_id:
            return None
        try:
            return SessionSigner(
                self.identity_id, int(data["session_epoch"]), SigningKey(bytes.fromhex(data["key"]))
            )
        except (KeyError, ValueError, TypeError) as err:
            raise AgentError(f"{self.path} is not a saved session ({err})") from err

    def save(self, signer: SessionSigner) -> None:
        data = {
            "identity_id": signer.identity_id,
            "session_epoch": signer.session_epoch,
            "key": signer.key.encode().hex(),
        }
        write_json_atomic(self.path, data)


# ============================================================================ verification


@dataclass(frozen=True)
class Linked:
    """A verified event waiting for its turn, with its chain value (eventlog.link_of)."""

    event: event_pb2.Event
    link: bytes


class VerifiedPayloads:
    """Event envelopes whose Authority signature this process has checked, by (public key, BLAKE3 of
    the payload, signature): bounded, least recently used first out. Agents of one process that
    follow the same Group each receive every event; the first to check an event's signature spares
    the others theirs (a payload that hashes to a remembered digest, under the same signature, is
    the one that was checked; any other signature bytes are checked as usual)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._known: OrderedDict[tuple[bytes, bytes, bytes], None] = OrderedDict()

    def __contains__(self, key: tuple[bytes, bytes, bytes]) -> bool:
        if key in self._known:
            self._known.move_to_end(key)
            return True
        return False

    def add(self, key: tuple[bytes, bytes, bytes]) -> None:
        self._known[key] = None
        if len(self._known) > self.size:
            self._known.popitem(last=False)

    def clear(self) -> None:
        self._known.clear()


# Shared by every AuthorityVerifier of the process (keyed by the public key, so never across
# Authorities).
VERIFIED_EVENT_PAYLOADS = VerifiedPayloads()


class AuthorityVerifier:
    """Checks the Authority's signature (and payload type) before anything parses a payload."""

    def __init__(self, key_id: str, public_key: bytes, earlier: dict[str, bytes] | None = None) -> None:
        self.key_id = key_id
        self.public_key = public_key
        # Keys the Authority signed with before a rotation (GetAuthorityKey ``keys``): old history
        # verifies with the key it names.
        self.keys = {**(earlier or {}), key_id: public_key}

    def _payload(self, envelope: common_pb2.SignedEnvelope, payload_type: str) -> bytes:
        if envelope.payload_type != payload_type:
            raise NotVerified(f"payload type {envelope.payload_type!r} is not {payload_type!r}")
        index = next((i for i, s in enumerate(envelope.signatures) if s.key_id in self.keys), None)
        if index is None or not verify_signature(envelope, self.keys[envelope.signatures[index].key_id], index):
            raise NotVerified(f"no valid signature by the Authority key {self.key_id}")
        return envelope.payload

    def event(self, envelope: common_pb2.SignedEnvelope) -> event_pb2.Event:
        return _parse(event_pb2.Event, self._payload(envelope, EVENT_TYPE))

    def events(self, envelopes: Sequence[common_pb2.SignedEnvelope]) -> list[Linked]:
        """A frame's events, each verified before it is parsed, with as few Ed25519 checks as the
        event chain allows (docs/integrity.md): newest first, an event whose payload hashes to the
        ``previous_digest`` of a verified event is the payload the Authority signed before it, so
        its own signature adds nothing. A frame of contiguous events costs one signature check; an
        event the chain does not vouch for (the newest, one after a skipped range, an erased copy,
        one of another history) has its own signature checked, unless this process checked that
        same signature over that same payload already (``VERIFIED_EVENT_PAYLOADS``). Returned in
        frame order."""
        linked: list[Linked] = []
        vouched = b""  # the previous_digest of the last event verified, walking backwards
        for envelope in reversed(envelopes):
            payload = envelope.payload
            digest = event_digest(payload)
            is_event = envelope.payload_type == EVENT_TYPE
            if not (is_event and vouched and digest == vouched):
                signed = self._signed_by_us(envelope, digest)
                if not is_event or signed is None or signed not in VERIFIED_EVENT_PAYLOADS:
                    payload = self._payload(envelope, EVENT_TYPE)
                    if signed is not None:
                        VERIFIED_EVENT_PAYLOADS.add(signed)
            event = _parse(event_pb2.Event, payload)
            linked.append(Linked(event, link_of(payload, event, digest)))
            vouched = event.previous_digest
        linked.reverse()
        return linked

    def _signed_by_us(self, envelope: common_pb2.SignedEnvelope, digest: bytes) -> tuple[bytes, bytes, bytes] | None:
        """(public key, digest, signature) of the first signature by a key of this Authority, the
        one ``_payload`` checks (None: there is none)."""
        return next(
            ((self.keys[s.key_id], digest, s.sig) for s in envelope.signatures if s.key_id in self.keys), None
        )

    def snapshot_reference(self, envelope: common_pb2.SignedEnvelope) -> pb.SnapshotReference:
        return _parse(pb.SnapshotReference, self._payload(envelope, SNAPSHOT_REFERENCE_TYPE))

    def answering(
        self, envelope: common_pb2.SignedEnvelope, asked: pb.SnapshotReference, viewer_id: str
    ) -> pb.SnapshotReference:
        """The signed reference a GetSnapshot answer comes with: ``asked`` itself, or the Authority's
        reference to ``viewer_id``'s view of that same snapshot (restricted content left out)."""
        got = self.snapshot_reference(envelope)
        if (got.group_id, got.sequence) != (asked.group_id, asked.sequence):
            raise NotVerified("the snapshot answer names another Group or sequence than was asked")
        if got.digest.hex == asked.digest.hex and not got.HasField("view_of"):
            return got
        if got.view_of.hex != asked.digest.hex or got.viewer_id != viewer_id:
            raise NotVerified(f"the snapshot answer is not {viewer_id}'s view of {asked.digest.hex}")
        return got

    def snapshot(
        self, envelope: common_pb2.SignedEnvelope, reference: pb.SnapshotReference
    ) -> authority_service_pb2.GroupSnapshot:
        """MW-16-12: the snapshot's signature, its BLAKE3 digest and size against the signed reference."""
        payload = self._payload(envelope, SNAPSHOT_TYPE)
        digest = reference.digest
        if blake3.blake3(payload).hexdigest() != digest.hex or (
            digest.size_bytes and digest.size_bytes != len(payload)
        ):
            raise NotVerified(f"the snapshot does not match the digest {digest.hex} it is referenced by")
        snapshot = _parse(authority_service_pb2.GroupSnapshot, payload)
        if (snapshot.group_id, snapshot.sequence) != (reference.group_id, reference.sequence):
            raise NotVerified("the snapshot names another Group or sequence than its reference")
        return snapshot


M = TypeVar("M", bound=Message)


def _parse(cls: type[M], payload: bytes) -> M:
    try:
        return cls.FromString(payload)
    except DecodeError as err:
        raise NotVerified(f"the signed payload is not a {cls.__name__}") from err


# ============================================================================ subscriptions

Handler = Callable[[event_pb2.Event], Awaitable[None]]
SnapshotHandler = Callable[[authority_service_pb2.GroupSnapshot], Awaitable[None]]

# ERROR codes after which a subscription cannot continue; those in _RESUBSCRIBES are retried from the
# cursor with backoff (the gateway stopped instead of skipping, MW-16-05, or lost its Group Authority);
# the others (ACK problems) are logged.
_FAILS_SUBSCRIPTION = frozenset(
    {
        E.GATEWAY_ERROR_CODE_NOT_A_MEMBER,
        E.GATEWAY_ERROR_CODE_SUBSCRIPTION_EXISTS,
        E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED,
        E.GATEWAY_ERROR_CODE_MALFORMED_FRAME,
    }
)


# EVENT frames a subscription that fell behind verifies and handles as one batch (_queued_events).
MAX_FRAMES_PER_BATCH = 64

_RESUBSCRIBES = frozenset({E.GATEWAY_ERROR_CODE_HISTORY_UNAVAILABLE, E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE})


class _Host(Protocol):
    """What a Subscription needs from its Agent (a fake in unit tests)."""

    def _verifier_now(self) -> AuthorityVerifier: ...

    async def _send_frame(self, frame: pb.ClientFrame, route: Subscription | None = None) -> bool: ...

    def _queue_ack(self, ack: pb.CursorAck) -> None: ...

    async def _fetch_snapshot(self, group_id: str, digest: common_pb2.Digest) -> pb.GetSnapshotResponse: ...


class Subscription:
    """One Group's subscription: orders, deduplicates, calls the handler, persists and ACKs the cursor.

    Created by :meth:`Agent.subscribe`. Frames are processed by a worker task of their own, so a handler
    may ``await agent.execute(...)`` freely. A handler that raises is logged and retried with backoff: the
    cursor never moves past an event that was not processed (catch what you want to skip).
    """

    def __init__(
        self,
        host: _Host,
        number: int,
        group_id: str,
        handler: Handler,
        cursors: CursorStore,
        *,
        credits: int = 256,
        attention: pb.AttentionFilter | None = None,
        on_snapshot: SnapshotHandler | None = None,
        gap_timeout: float = 10.0,
    ) -> None:
        self.group_id = group_id
        self.subscription_id = ""
        self._host = host
        self._number = number
        self._handler = handler
        self._cursors = cursors
        self._credits = credits
        self._attention = attention
        self._on_snapshot = on_snapshot
        self._gap_timeout = gap_timeout
        # What the cursor file holds; the sequencer's cursor is what the handler has processed, which
        # the file follows behind (_persist_soon).
        self._durable = cursors.load(group_id)
        self._sequencer: GroupSequencer[Linked] = GroupSequencer(self._durable)
        self._saving: asyncio.Future[None] | None = None  # the cursor round asked for, not yet written
        self._asked = 0  # the highest cursor asked of the cursor store (written or not)
        # The chain value of the last event processed (or the restored snapshot's), with its
        # sequence and whether it was linked itself. Unknown after a start or a gap.
        self._link: tuple[int, bytes, bool] | None = None
        self._window = CreditWindow(credits, self.cursor)
        self._announced = 0  # the highest sequence the gateway reported delivering on this attempt (FLOW)
        self._attempt = 0
        self._queue: asyncio.Queue[pb.ServerFrame | None] = asyncio.Queue()
        self._held: pb.ServerFrame | None = None  # taken from the queue, to be handled next (_queued_events)
        self._waiters: list[asyncio.Future[None]] = []  # reached() calls, woken when the cursor moves
        self._failure: AgentError | None = None
        self._retry = Backoff(initial=0.5, cap=30.0)  # resubscribing after HISTORY_UNAVAILABLE
        self._stopping = False
        self._worker = asyncio.create_task(self._work(), name=f"missionweave-subscription-{group_id}")

    @property
    def cursor(self) -> int:
        """The highest contiguous sequence processed and persisted (MW-16-06)."""
        return self._durable

    @property
    def failure(self) -> AgentError | None:
        """Why the subscription stopped, if it did."""
        return self._failure

    async def reached(self, sequence: int) -> None:
        """Waits until the cursor is at least ``sequence``; raises the failure if the subscription stops.

        Bound the wait with ``async with asyncio.timeout(seconds):``.
        """
        while self.cursor < sequence and self._failure is None:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        if self._failure is not None and self.cursor < sequence:
            raise self._failure

    # ------------------------------------------------------------------ driven by the agent

    async def open(self, *, resync: bool = False) -> None:
        """SUBSCRIBEs from the durable cursor with a fresh window: on every new stream and after a resync
        (``resync``: first UNSUBSCRIBE the current attempt on this stream)."""
        if self._failure is not None or self._stopping:
            return
        if resync and self.subscription_id:
            previous = pb.UnsubscribeFrame(subscription_id=self.subscription_id)
            await self._host._send_frame(pb.ClientFrame(unsubscribe=previous))
        self._attempt += 1
        self.subscription_id = f"s{self._number}.{self._attempt}"
        self._sequencer.clear()  # whatever was buffered is replayed after the cursor (MW-16-10)
        self._window = CreditWindow(self._credits, self.cursor)
        self._announced = 0
        log.info("%s: subscribing after sequence %d (%s)", self.group_id, self.cursor, self.subscription_id)
        frame = pb.SubscribeFrame(
            subscription_id=self.subscription_id,
            group_id=self.group_id,
            after_sequence=self.cursor,
            filter=self._attention,
            initial_credits=self._credits,
        )
        await self._host._send_frame(pb.ClientFrame(subscribe=frame), route=self)

    def deliver(self, frame: pb.ServerFrame) -> None:
        """Hands a frame of this subscription to the worker, in arrival order."""
        self._queue.put_nowait(frame)

    async def stop(self, grace: float) -> None:
        """Lets the current handler finish (up to ``grace`` seconds), then reports the final cursor."""
        self._stopping = True
        self._queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._worker), grace)
        except TimeoutError:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        if self._failure is None:
            await self._flush()
            self._ack(idle=True)

    # ------------------------------------------------------------------ the worker

    async def _work(self) -> None:
        while not self._stopping:
            frame = await self._next_frame()
            if frame is None:
                continue
            try:
                await self._handle(frame)
            except _Stop:
                return
            except AgentError as failure:
                await self._fail(failure)
                return
            except Exception as err:  # a bug must not leave a silently dead subscription
                log.exception("%s: subscription worker failed", self.group_id)
                await self._fail(SubscriptionFailed(f"{self.group_id}: {err!r}"))
                return

    async def _next_frame(self) -> pb.ServerFrame | None:
        # A gap: events buffered behind a missing sequence, or sequences the gateway reported delivering
        # (FLOW) that never arrived on this attempt, with nothing buffered behind them (e.g. the last
        # frame of a window). What this attempt received counts, not what was processed: a frame lost
        # after a resubscribe may repeat only events already handled (their cursor not yet written),
        # and its credits come back only if it is asked for again.
        if self._held is not None:
            frame, self._held = self._held, None
            return frame
        if not self._sequencer.has_gap and self._window.delivered >= self._announced:
            return await self._queue.get()
        try:
            return await asyncio.wait_for(self._queue.get(), self._gap_timeout)
        except TimeoutError:
            log.warning(
                "%s: the gap after sequence %d did not fill within %g s; resubscribing from the cursor",
                self.group_id,
                self.cursor,
                self._gap_timeout,
            )
            await self.open(resync=True)
            return None

    async def _handle(self, frame: pb.ServerFrame) -> None:
        kind = frame.WhichOneof("frame")
        if kind is None or getattr(frame, kind).subscription_id != self.subscription_id:
            return  # an earlier attempt's frame: the current attempt replays it from the cursor
        if kind == "event":
            await self._on_events(self._queued_events(frame.event))
        elif kind == "flow":
            await self._on_flow(frame.flow)
        elif kind == "cursor_too_old":
            await self._restore(frame.cursor_too_old)
        elif kind == "error":
            await self._on_error(frame.error)

    def _queued_events(self, frame: pb.EventFrame) -> list[pb.EventFrame]:
        """``frame`` and the EVENT frames of this attempt queued right behind it: a subscription
        that falls behind verifies what it is behind on as one chain, with one signature check
        (AuthorityVerifier.events), instead of one per frame. The first other frame is held back
        for the next turn, so frames are still handled in arrival order."""
        frames = [frame]
        while len(frames) < MAX_FRAMES_PER_BATCH and self._held is None and not self._queue.empty():
            queued = self._queue.get_nowait()
            if queued is None:  # stop() woke the worker, which sees _stopping after this turn
                break
            if queued.WhichOneof("frame") == "event" and queued.event.subscription_id == frame.subscription_id:
                frames.append(queued.event)
            else:
                self._held = queued
        return frames

    def _idle(self) -> bool:
        return self._held is None and self._queue.empty()

    async def _on_events(self, frames: list[pb.EventFrame]) -> None:
        self._retry.reset()
        for frame in frames:
            self._window.received(frame.first_sequence, frame.last_sequence)
        for linked in self._host._verifier_now().events([envelope for frame in frames for envelope in frame.events]):
            event = linked.event
            if event.group_id != self.group_id:
                raise NotVerified(f"{self.group_id}: the gateway delivered an event of {event.group_id}")
            if not self._sequencer.add_event(event.sequence, event.event_id, linked):
                log.debug(
                    "%s: duplicate event %s (#%d) dropped", self.group_id, event.event_id, event.sequence
                )
        for frame in frames:
            for skipped in frame.skipped:
                self._sequencer.add_skipped(skipped.first, skipped.last)
        await self._drain()

    async def _drain(self) -> None:
        while not self._stopping and (slot := self._sequencer.next_ready()) is not None:
            if slot.item is not None:
                self._follows_the_chain(slot.item.event)
                await self._call_handler(slot.item.event)
                event = slot.item.event
                self._link = (event.sequence, slot.item.link, bool(event.previous_digest))
            else:
                self._link = None  # what was skipped is not seen here: the chain resumes unchecked
            self._sequencer.done(slot)
        self._persist_soon()
        if self._idle():
            self._ack(idle=True)

    def _follows_the_chain(self, event: event_pb2.Event) -> None:
        """The event continues the log this subscription has seen (event.proto: previous_digest), so
        a gateway cannot splice in another history, even one signed by the same Authority."""
        if self._link is None or event.sequence != self._link[0] + 1:
            return
        sequence, link, linked = self._link
        # An unlinked event (written before the chain existed) may follow only an unlinked one.
        if bytes(event.previous_digest) != link if event.previous_digest else linked:
            raise NotVerified(f"{self.group_id}: event #{event.sequence} does not follow the one at #{sequence}")

    async def _call_handler(self, event: event_pb2.Event) -> None:
        backoff = Backoff(initial=0.5, cap=30.0)
        while True:
            try:
                await self._handler(event)
                return
            except Exception:
                delay = backoff.next()
                log.exception(
                    "%s: handler failed on %s (#%d); retrying in %.1f s",
                    self.group_id,
                    event.event_id,
                    event.sequence,
                    delay,
                )
            await asyncio.sleep(delay)
            if self._stopping:
                raise _Stop

    def _persist_soon(self) -> None:
        """Writes the processed cursor to the agent's cursor file behind the handler: the handler
        goes on with the next events meanwhile, and the agent's ``CursorStore`` writes whatever its
        Groups asked for since its last round in one round (D143), so one write covers every batch
        handled meanwhile. The round's end is a callback here, not a task per batch: with a thousand
        subscriptions in one process, that task and its awaits cost about a fifth of the agent's CPU
        per event (bench/README.md, the SDK's cursor bookkeeping). Only a written cursor is reported
        (``cursor``, ACKs, credits granted back), so the file and the ACKs never hold a sequence
        that was not processed, nor one past a gap (MW-16-05); a crash before the write hands the
        processed events to the handler again after the restart (at least once, MW-16-14)."""
        target = self._sequencer.cursor
        if target <= max(self._durable, self._asked) or self._failure is not None:
            return
        round_ = self._cursors.ask(self.group_id, target)
        if round_ is None:  # the file holds it already
            self._now_durable(target)
            return
        self._asked = target
        if round_ is not self._saving:
            self._saving = round_
            round_.add_done_callback(self._round_written)

    def _round_written(self, round_: asyncio.Future[None]) -> None:
        """The cursor round this subscription asked for has ended: what the file now holds is
        durable and acknowledged, or the write failed and the subscription stops."""
        if self._saving is round_:
            self._saving = None
        error = AgentError(f"{self._cursors.path}: the write was cancelled") if round_.cancelled() else round_.exception()
        if error is not None:
            self._cursor_write_failed(error)
            return
        self._now_durable(self._cursors.saved(self.group_id))
        self._ack(idle=self._idle() and self._sequencer.cursor == self._durable)

    def _now_durable(self, target: int) -> None:
        if target > self._durable:
            self._durable = target
            self._window.processed(target)
            self._wake()

    def _cursor_write_failed(self, error: BaseException) -> None:
        """The worker may be idle waiting for frames: stop it from here."""
        if self._failure is not None:
            return
        log.error("%s: writing the cursor file failed", self.group_id, exc_info=error)
        self._failure = SubscriptionFailed(f"{self.group_id}: writing the cursor file failed: {error!r}")
        self._stopping = True
        self._queue.put_nowait(None)
        self._wake()

    async def _flush(self) -> None:
        """Writes the processed cursor now, after the round in progress (if any)."""
        target = self._sequencer.cursor
        if self._failure is not None or target <= self._durable:
            return
        try:
            await self._cursors.save(self.group_id, target)
        except Exception as err:
            self._cursor_write_failed(err)
            raise
        self._now_durable(target)

    async def _jump(self, sequence: int) -> None:
        """Moves the cursor to a position the gateway declared (visibility start, restored snapshot)."""
        self._sequencer.jump(sequence)
        await self._flush()

    def _wake(self) -> None:
        """Wakes the reached() calls to look at the cursor (and the failure) again."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _ack(self, *, idle: bool) -> None:
        # Frames that only repeat what the file already holds (a redelivery after a resubscribe
        # whose save landed before them) release their credits here: no later save will.
        self._window.processed(self.cursor)
        if not self.subscription_id or not self._window.due(self.cursor, idle=idle):
            return
        cursor, credits = self._window.take(self.cursor)
        self._host._queue_ack(
            pb.CursorAck(subscription_id=self.subscription_id, group_id=self.group_id, cursor=cursor, credits=credits)
        )

    async def _on_flow(self, flow: pb.FlowFrame) -> None:
        self._announced = max(self._announced, flow.delivered_sequence)
        if flow.reason == pb.FLOW_REASON_SUBSCRIBED and flow.effective_after_sequence > self.cursor:
            # MW-8-07: nothing before the member's visibility start is ours to see; start after it.
            log.info("%s: visibility starts after sequence %d", self.group_id, flow.effective_after_sequence)
            self._window.start_at(flow.effective_after_sequence)
            await self._jump(flow.effective_after_sequence)
            self._ack(idle=False)
        else:
            log.debug("%s: flow %s", self.group_id, pb.FlowReason.Name(flow.reason))
        if self._idle():
            # The drain after the last EVENT skipped its idle ACK because this FLOW was queued behind
            # it; without this ACK a spent credit window would never be granted again.
            self._ack(idle=True)

    async def _restore(self, frame: pb.CursorTooOldFrame) -> None:
        """MW-16-11/12: verify the signed reference and the snapshot, restore, resume from its sequence."""
        verifier = self._host._verifier_now()
        reference = verifier.snapshot_reference(frame.signed_reference)
        if reference.group_id != self.group_id:
            raise NotVerified(f"{self.group_id}: the snapshot reference names {reference.group_id}")
        if self._on_snapshot is None:
            raise SubscriptionFailed(
                f"{self.group_id}: cursor {frame.requested_after_sequence} is older than the online log "
                f"(CURSOR_TOO_OLD); pass on_snapshot= to restore from the snapshot at {reference.sequence}"
            )
        try:
            response = await self._host._fetch_snapshot(self.group_id, reference.digest)
        except grpc.aio.AioRpcError as err:
            await self._resubscribe_later(f"fetching the snapshot failed ({_describe(err)})")
            return
        answered = verifier.answering(response.signed_reference, reference, self._cursors.agent_id)
        snapshot = verifier.snapshot(response.snapshot, answered)
        await self._on_snapshot(snapshot)
        anchor = bytes(snapshot.last_event_digest)  # empty on snapshots older than the chain
        self._link = (snapshot.sequence, anchor, True) if anchor else None
        log.info("%s: restored the snapshot at sequence %d", self.group_id, reference.sequence)
        await self._jump(reference.sequence)
        await self.open()

    async def _on_error(self, error: pb.ErrorFrame) -> None:
        failure = GatewayError(error)
        if error.code in _FAILS_SUBSCRIPTION:
            raise SubscriptionFailed(f"{self.group_id}: {failure}")
        if error.code in _RESUBSCRIBES:
            await self._resubscribe_later(str(failure))
        else:
            log.warning("%s: gateway error %s", self.group_id, failure)

    async def _resubscribe_later(self, why: str) -> None:
        """The gateway cannot serve the subscription right now: subscribe again from the cursor, later."""
        delay = self._retry.next()
        log.error("%s: %s; subscribing again after %d in %.1f s", self.group_id, why, self.cursor, delay)
        await asyncio.sleep(delay)
        await self.open()

    async def _fail(self, failure: AgentError) -> None:
        with contextlib.suppress(Exception):  # what was processed before the failure stays processed
            await self._flush()
        log.error("%s: subscription stopped at sequence %d: %s", self.group_id, self.cursor, failure)
        self._failure = failure
        self._wake()


# ============================================================================ the agent


@dataclass(frozen=True)
class Fetched:
    """The answer to :meth:`Agent.fetch`."""

    events: list[event_pb2.Event]  # verified, in sequence order
    withheld: list[tuple[int, int]]  # inclusive ranges the Membership does not permit (or beyond the head)


class _PendingCommands:
    """COMMAND frames waiting for their RESULT, by command id (re-sent after a reconnect)."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[pb.CommandFrame, asyncio.Future[command_pb2.CommandResult]]] = {}

    def add(self, frame: pb.CommandFrame) -> asyncio.Future[command_pb2.CommandResult]:
        if frame.command_id in self._pending:
            raise ValueError(f"command {frame.command_id} is already waiting for its result")
        future: asyncio.Future[command_pb2.CommandResult] = asyncio.get_running_loop().create_future()
        self._pending[frame.command_id] = (frame, future)
        return future

    def frames(self) -> list[pb.CommandFrame]:
        return [frame for frame, _ in self._pending.values()]

    def resolve(self, result: pb.ResultFrame) -> None:
        if result.HasField("rejection"):
            self.fail(result.command_id, CommandRejected(result.command_id, result.rejection))
            return
        entry = self._pending.get(result.command_id)
        if entry is not None and not entry[1].done():
            entry[1].set_result(result.result)

    def fail(self, command_id: str, error: AgentError) -> None:
        entry = self._pending.get(command_id)
        if entry is not None and not entry[1].done():
            entry[1].set_exception(error)

    def fail_all(self, error: AgentError) -> None:
        for command_id in list(self._pending):
            self.fail(command_id, error)

    def forget(self, command_id: str) -> None:
        self._pending.pop(command_id, None)


class _Link:
    """One ``GatewayService.Connect`` call; writes are serialised."""

    def __init__(self, call: grpc.aio.StreamStreamCall[pb.ConnectRequest, pb.ConnectResponse]) -> None:
        self.call = call
        self._writing = asyncio.Lock()
        self._unread: Sequence[pb.ServerFrame] = ()  # what came in WELCOME's response after it

    async def send(self, frame: pb.ClientFrame) -> None:
        async with self._writing:
            await self.call.write(pb.ConnectRequest(frame=frame))

    async def read(self) -> Sequence[pb.ServerFrame] | None:
        """The next response's frames (several under load: HELLO.accepts_frame_batches), None at the end."""
        if self._unread:
            unread, self._unread = self._unread, ()
            return unread
        response = await self.call.read()
        if response is grpc.aio.EOF:
            return None
        assert isinstance(response, pb.ConnectResponse)
        return (response.frame, *response.more_frames)

    async def read_first(self) -> pb.ServerFrame | None:
        """The next frame alone (WELCOME); any frames batched behind it come with the next ``read``."""
        frames = await self.read()
        if not frames:
            return None
        self._unread = frames[1:]
        return frames[0]

    async def finish(self) -> None:
        async with self._writing:
            await self.call.done_writing()

    def cancel(self) -> None:
        self.call.cancel()


_TRANSIENT_STATUS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)
_TRANSIENT_GATEWAY = frozenset(
    {E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE, E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED}
)
# HELLO refusals after which a *saved* session is replaced by a new one.
_RENEW_SESSION = frozenset({E.GATEWAY_ERROR_CODE_SESSION_STALE, E.GATEWAY_ERROR_CODE_HELLO_INVALID})
_STALE_MEMBERSHIP = frozenset({R.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE, R.REJECTION_REASON_NOT_A_MEMBER})


class _StreamEnded(AgentError):
    """The gateway closed the stream before answering HELLO."""


class SessionReplaced(AgentError):
    """This agent's session was replaced by a newer session of its identity (another process running
    as it): the agent stops instead of opening a session of its own, which would fence that one in
    turn (MW-11.3-09)."""


def _transient(err: BaseException) -> bool:
    if isinstance(err, grpc.aio.AioRpcError):
        return err.code() in _TRANSIENT_STATUS
    if isinstance(err, GatewayError):
        return err.code in _TRANSIENT_GATEWAY
    return isinstance(err, _StreamEnded | OSError)


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _describe(err: BaseException) -> str:
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {err.details()}"
    return str(err) or type(err).__name__


class Agent:
    """An agent's connection to the gateway: subscriptions with durable cursors, commands, reconnects.

    Open it with :meth:`connect`, preferably as an async context manager (closing stops the handlers
    gracefully, reports the final cursors and closes the channel)::

        async with Agent.connect("127.0.0.1:50051", "worker-1", "worker-1.key", cursor_dir="state") as agent:
            sub = await agent.subscribe("grp_...", handle, credits=128)
            result = await agent.execute("grp_...", post_message("conv_...", "on it"))

    ``key`` is the identity's Ed25519 key (a ``SigningKey`` or a key file written by ``mwp keygen``). It
    is used only to open a session: the agent keeps the session (epoch and its own session key) in
    ``<cursor_dir>/<agent>/session.json`` and reuses it until the gateway refuses it. Opening a session
    fences the identity's older sessions (MW-11.3-09), so do not run two processes as one identity.
    """

    def __init__(
        self,
        target: str,
        identity_id: str,
        key: SigningKey | str | os.PathLike[str],
        *,
        cursor_dir: str | os.PathLike[str],
        credentials: grpc.ChannelCredentials | None = None,
        tls: ClientTLS | None = None,
        backoff: Backoff | None = None,
        connect_timeout: float = 30.0,
        audience: str | None = None,
        command_timeout: float = 30.0,
        grace: float = 5.0,
        cursor_interval: float = CURSOR_INTERVAL_S,
    ) -> None:
        self.target = target
        self.identity_id = identity_id
        self.directory = private_dir(Path(cursor_dir) / file_name(identity_id))
        self._key = key if isinstance(key, SigningKey) else read_key(Path(key))
        self._session_file = SessionFile(self.directory / "session.json", identity_id)
        self._cursors = CursorStore(self.directory, identity_id, interval=cursor_interval)
        self._credentials = credentials
        self._tls = tls
        self._backoff = backoff or Backoff()
        self._connect_timeout = connect_timeout
        # What the HELLO proof names: the gateway's configured audience (MWP_AUDIENCE); by
        # default the target, which is what a gateway reached directly answers to.
        self.audience = target if audience is None else audience
        self._command_timeout = command_timeout
        self._grace = grace
        self._channel: grpc.aio.Channel | None = None
        self._link: _Link | None = None
        self._session: SessionSigner | None = None
        self._proofs = CallProofs(self.audience)  # reads (GetGroupState, ...) prove the current session to that mesh
        self._verifier: AuthorityVerifier | None = None
        self._subscriptions: dict[str, Subscription] = {}  # by Group
        self._routes: dict[str, Subscription] = {}  # by subscription id, on the current stream
        # ACKs waiting for the next coalesced frame, by subscription id, and the stream they are for.
        self._acks: dict[str, pb.CursorAck] = {}
        self._acks_link: _Link | None = None
        self._ack_flush: asyncio.Task[None] | None = None
        self._commands = _PendingCommands()
        self._fetches: dict[str, tuple[pb.FetchFrame, asyncio.Future[pb.FetchedFrame]]] = {}
        self._epochs: dict[str, int] = {}
        self._numbers = itertools.count(1)
        self._opening = asyncio.Lock()  # subscriptions open exactly once per stream
        self._connected = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._first: asyncio.Future[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()

    @classmethod
    def connect(
        cls,
        target: str,
        identity_id: str,
        key: SigningKey | str | os.PathLike[str],
        *,
        cursor_dir: str | os.PathLike[str],
        **options: Any,
    ) -> _Connecting:
        """Connects (HELLO/WELCOME) and returns the agent; use with ``await`` or ``async with``.

        ``options`` are the keyword arguments of :class:`Agent` (``tls``, ``credentials``, ``backoff``,
        ``connect_timeout``, ``command_timeout``, ``grace``, ``audience``, ``cursor_interval``: the least
        time in seconds between two writes of the cursor file, D143). Raises :class:`AgentError` (or the gRPC
        error) if the first connection fails for a reason retrying cannot fix, or does not succeed
        within ``connect_timeout`` seconds.
        """
        return _Connecting(cls(target, identity_id, key, cursor_dir=cursor_dir, **options))

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Opens the channel and waits for the first WELCOME; :meth:`connect` calls it for you."""
        if self._runner is not None:
            raise AgentError("the agent was already started")
        self._channel = open_channel(
            self.target, self._tls, credentials=self._credentials, interceptors=self._proofs.unary_request_interceptors
        )
        self._first = asyncio.get_running_loop().create_future()
        self._runner = asyncio.create_task(self._run(), name=f"missionweave-agent-{self.identity_id}")
        try:
            await asyncio.wait_for(asyncio.shield(self._first), self._connect_timeout)
        except TimeoutError:
            await self.close()
            raise AgentError(
                f"could not connect to {self.target} within {self._connect_timeout:.0f} s"
            ) from None
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stops the handlers (each may finish within ``grace`` s), sends the final ACKs, closes the stream."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            for subscription in list(self._subscriptions.values()):
                await subscription.stop(self._grace)
            self._commands.fail_all(AgentClosed("the agent was closed"))
            await self._hang_up()
            if self._runner is not None:
                self._runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._runner
            if self._channel is not None:
                await self._channel.close()
        finally:
            self._closed.set()
            log.info("%s: closed", self.identity_id)

    async def __aenter__(self) -> Agent:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _hang_up(self) -> None:
        """Half-closes the stream and lets the gateway finish (it processes the final ACKs first)."""
        if self._ack_flush is not None:
            self._ack_flush.cancel()
            self._ack_flush = None
        link = self._link
        if link is None or self._runner is None:
            return
        await self._flush_acks()  # the final ACKs go before the half-close
        try:
            await link.finish()
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            return
        except asyncio.CancelledError:
            if _being_cancelled():
                raise
            return  # the stream was already dropped
        await asyncio.wait({self._runner}, timeout=self._grace)

    @property
    def connected(self) -> bool:
        return self._link is not None

    async def wait_connected(self) -> None:
        """Waits until a stream is up (after WELCOME and resubscribing)."""
        await self._connected.wait()

    @property
    def session(self) -> SessionSigner:
        """The current session (signs commands)."""
        if self._session is None:
            raise AgentError("the agent has no session yet; connect first")
        return self._session

    def reconnect(self) -> None:
        """Drops the current stream, as a network failure would: the agent reconnects with backoff,
        re-sends HELLO and resubscribes every Group from its durable cursor (MW-16-10)."""
        if self._link is not None:
            log.info("%s: dropping the stream on request", self.identity_id)
            self._link.cancel()

    # ------------------------------------------------------------------ subscriptions

    async def subscribe(
        self,
        group_id: str,
        handler: Handler,
        *,
        credits: int = 256,
        attention: pb.AttentionFilter | None = None,
        on_snapshot: SnapshotHandler | None = None,
        gap_timeout: float = 10.0,
    ) -> Subscription:
        """Delivers the Group's events to ``await handler(event)``, in order, once each, from the cursor.

        ``credits`` is the window of events in flight (1..65,536); ``attention`` an optional attention
        filter (unset: everything the Membership permits). ``on_snapshot`` restores a verified
        ``GroupSnapshot`` when the cursor is older than the online log (CURSOR_TOO_OLD, MW-16-11/12);
        without it such a subscription fails. A gap that does not fill within ``gap_timeout`` seconds
        makes the subscription resubscribe from its cursor.

        >>> async def handler(event):  # doctest: +SKIP
        ...     print(event.sequence, event.type)
        >>> subscription = await agent.subscribe("grp_...", handler)  # doctest: +SKIP
        >>> await subscription.reached(42)  # doctest: +SKIP
        """
        if not 1 <= credits <= MAX_CREDITS:
            raise ValueError(f"credits must be 1..{MAX_CREDITS}")
        if group_id in self._subscriptions:
            raise ValueError(f"{self.identity_id} is already subscribed to {group_id}")
        if self._runner is None or self._closing:
            raise AgentError("subscribe after connecting and before closing")
        async with self._opening:
            subscription = Subscription(
                self,
                next(self._numbers),
                group_id,
                handler,
                self._cursors,
                credits=credits,
                attention=attention,
                on_snapshot=on_snapshot,
                gap_timeout=gap_timeout,
            )
            self._subscriptions[group_id] = subscription
            if self._link is not None:
                await subscription.open()
        return subscription

    async def unsubscribe(self, group_id: str) -> None:
        """Stops the Group's subscription (the current handler may finish) and sends UNSUBSCRIBE."""
        subscription = self._subscriptions.pop(group_id, None)
        if subscription is not None:
            await subscription.stop(self._grace)
            frame = pb.UnsubscribeFrame(subscription_id=subscription.subscription_id)
            await self._send_frame(pb.ClientFrame(unsubscribe=frame))

    # ------------------------------------------------------------------ commands

    async def execute(
        self,
        group_id: str,
        command: str | CommandBody,
        body: Message | None = None,
        *,
        membership_epoch: int | None = None,
        command_id: str | None = None,
        correlation_id: str = "",
        expected_revision: common_pb2.ExpectedRevision | None = None,
    ) -> command_pb2.CommandResult:
        """Signs a command, sends it as a COMMAND frame and returns the RESULT's ``CommandResult``.

        Pass a builder's :class:`CommandBody` (``execute(g, post_message(...))``) or a kind and a body
        (``execute(g, "message_post", MessagePost(...))``). The Membership epoch is read from the Group
        state unless given. A given ``command_id`` makes retries idempotent: the Authority answers a
        repeat with the stored result (``replayed``). Waits at most ``command_timeout`` seconds (an
        :class:`Agent` option) for the RESULT. Raises :class:`CommandRejected` carrying the
        Rejection on refusal, :class:`GatewayError` if the gateway refuses the frame.

        >>> result = await agent.execute(group_id, post_message(conversation_id, "done"))  # doctest: +SKIP
        """
        if isinstance(command, CommandBody):
            kind, message = command
        elif body is not None:
            kind, message = command, body
        else:
            raise TypeError("execute(group_id, CommandBody) or execute(group_id, kind, body)")
        signer = self.session
        epoch = membership_epoch if membership_epoch is not None else await self.membership_epoch(group_id)
        cmd = signer.command(
            group_id,
            kind,
            message,
            membership_epoch=epoch,
            command_id=command_id,
            correlation_id=correlation_id,
            expected_revision=expected_revision,
        )
        return await self._send_command(signer, cmd)

    async def resubmit(self, command: command_pb2.Command) -> command_pb2.CommandResult:
        """Sends a command built earlier (a buffered offline one, MW-11.5-09): its body and extensions
        byte-for-byte as they were, rebased on the current session (``issued_at``, session epoch,
        Membership epoch read afresh) and signed anew. It keeps its command id, so a retry after a
        lost RESULT is answered from the Authority's record."""
        signer = self.session
        cmd = command_pb2.Command()
        cmd.CopyFrom(command)
        cmd.issued_at.CopyFrom(to_timestamp(_clock.now()))
        cmd.session_epoch = signer.session_epoch
        cmd.membership_epoch = await self.membership_epoch(cmd.group_id, refresh=True)
        return await self._send_command(signer, cmd)

    async def _send_command(self, signer: SessionSigner, cmd: command_pb2.Command) -> command_pb2.CommandResult:
        frame = pb.CommandFrame(command_id=cmd.command_id, command=signer.sign(cmd))
        future = self._commands.add(frame)
        try:
            await self._send_frame(pb.ClientFrame(command=frame))  # when disconnected: sent on reconnect
            return await asyncio.wait_for(future, self._command_timeout)
        except CommandRejected as rejected:
            if rejected.reason in _STALE_MEMBERSHIP:
                self._epochs.pop(cmd.group_id, None)
            raise
        except TimeoutError:
            raise AgentError(
                f"no RESULT for {cmd.command_id}; it may still be applied: retry with command_id={cmd.command_id!r}"
            ) from None
        finally:
            self._commands.forget(cmd.command_id)

    async def fetch(
        self,
        group_id: str,
        first: int,
        last: int,
        *,
        context_package: common_pb2.SignedEnvelope | None = None,
    ) -> Fetched:
        """Events ``first..last`` of a Group on demand (at most 1,024), verified, in sequence order.

        Gets history an attention filter skipped (MW-8-13); a late joiner passes a Context Package
        the Authority signed for it to get the events it cites from before its visibility start
        (MW-8-09). Sequences the Membership does not permit come back in ``withheld``. Raises
        :class:`GatewayError` when the gateway refuses the request (not a member, too large, a
        package that does not verify), :class:`NotVerified` if an event's signature is wrong.

        >>> fetched = await agent.fetch(group_id, 1, 50, context_package=package)  # doctest: +SKIP
        """
        request_id = f"f{next(self._numbers)}"
        frame = pb.FetchFrame(request_id=request_id, group_id=group_id, ranges=[pb.SequenceRange(first=first, last=last)])
        if context_package is not None:
            frame.context_package.CopyFrom(context_package)
        future: asyncio.Future[pb.FetchedFrame] = asyncio.get_running_loop().create_future()
        self._fetches[request_id] = (frame, future)
        try:
            await self._send_frame(pb.ClientFrame(fetch=frame))  # when disconnected: sent on reconnect
            answer = await asyncio.wait_for(future, self._command_timeout)
        except TimeoutError:
            raise AgentError(f"no answer to FETCH {first}..{last} of {group_id}") from None
        finally:
            self._fetches.pop(request_id, None)
        verifier = self._verifier_now()
        return Fetched(
            events=[verifier.event(envelope) for envelope in answer.events],
            withheld=[(r.first, r.last) for r in answer.withheld],
        )

    async def membership_epoch(self, group_id: str, *, refresh: bool = False) -> int:
        """This agent's active Membership epoch in the Group (cached; refreshed after a stale rejection)."""
        if refresh or group_id not in self._epochs:
            stub = authority_service_pb2_grpc.AuthorityServiceStub(self._require_channel())
            response = await stub.GetGroupState(authority_service_pb2.GetGroupStateRequest(group_id=group_id))
            epoch = active_membership_epoch(response.state, self.identity_id)
            if epoch == 0:
                raise AgentError(f"{self.identity_id} holds no active Membership in {group_id}")
            self._epochs[group_id] = epoch
        return self._epochs[group_id]

    @staticmethod
    def idempotency_key(mission_id: str, work_item_id: str, ownership_epoch: int, operation_id: str) -> str:
        """The stable key for an external side effect (MW-16-13): pass it to the external system.

        The same logical operation under the same ownership epoch always gets the same key, so a retry
        is recognised; a reassignment (a higher epoch) gets fresh keys.

        >>> Agent.idempotency_key("grp_1", "wi-1", 1, "send-invoice")  # doctest: +ELLIPSIS
        'mwk1_...'
        """
        return attempt_key(mission_id, work_item_id, ownership_epoch, operation_id)

    # ------------------------------------------------------------------ the connection loop

    async def _run(self) -> None:
        assert self._first is not None
        while not self._closing:
            try:
                link = await self._open_link()
            except SessionReplaced as replaced:
                log.error("%s: %s", self.identity_id, replaced)
                for subscription in list(self._subscriptions.values()):
                    await subscription._fail(replaced)
                self._commands.fail_all(replaced)
                return
            except Exception as err:
                if not self._first.done() and not _transient(err):
                    self._first.set_exception(err)
                    return
                await self._pause(f"connecting to {self.target} failed ({_describe(err)})")
                continue
            self._backoff.reset()
            await self._serve(link)
            if not self._closing:
                await self._pause(f"the stream to {self.target} broke")

    async def _pause(self, why: str) -> None:
        delay = self._backoff.next()
        log.warning("%s: %s; reconnecting in %.2f s", self.identity_id, why, delay)
        await asyncio.sleep(delay)

    async def _open_link(self) -> _Link:
        channel = self._require_channel()
        key = await authority_service_pb2_grpc.AuthorityServiceStub(channel).GetAuthorityKey(
            authority_service_pb2.GetAuthorityKeyRequest()
        )
        self._verifier = AuthorityVerifier(key.key_id, key.public_key, {k.key_id: k.public_key for k in key.keys})
        signer = self._session or await asyncio.to_thread(self._session_file.load)
        if signer is None:
            signer = await self._new_session()
            link = await self._hello(signer)
        else:
            try:
                link = await self._hello(signer)
            except GatewayError as err:
                if err.code not in _RENEW_SESSION or err.frame.rejection.metadata.get("field") == "audience":
                    raise  # a proof for another gateway: a new session would be refused the same way
                if self._session is not None and err.code == E.GATEWAY_ERROR_CODE_SESSION_STALE:
                    # The session this process was running under was replaced meanwhile: by another
                    # process of this identity. Taking it back would fence that one, and so on.
                    raise SessionReplaced(
                        f"session {signer.session_epoch} of {self.identity_id} was replaced by a newer one "
                        "(another process runs as this identity); stopping"
                    ) from err
                log.warning(
                    "%s: session %d refused (%s); opening a new one",
                    self.identity_id,
                    signer.session_epoch,
                    err,
                )
                signer = await self._new_session()
                link = await self._hello(signer)
        self._session = self._proofs.signer = signer
        return link

    async def _new_session(self) -> SessionSigner:
        session_key = SigningKey.generate()
        stub = membership_service_pb2_grpc.MembershipServiceStub(self._require_channel())
        envelope = open_session_envelope(self.identity_id, self._key, bytes(session_key.verify_key))
        response = await stub.OpenSession(membership_service_pb2.OpenSessionRequest(command=envelope))
        signer = SessionSigner(self.identity_id, response.session.session_epoch, session_key)
        await asyncio.to_thread(self._session_file.save, signer)
        self._epochs.clear()
        log.info("%s: opened session %d", self.identity_id, signer.session_epoch)
        return signer

    def _session_proof(self, signer: SessionSigner) -> common_pb2.SignedEnvelope:
        """A fresh HelloProof: what HELLO and GetSnapshot use to prove the session."""
        proof = pb.HelloProof(
            agent_id=signer.identity_id,
            session_epoch=signer.session_epoch,
            issued_at=to_timestamp(_clock.now()),
            nonce=os.urandom(16),
            audience=self.audience,
        )
        return sign_envelope(
            proof.SerializeToString(),
            HELLO_PROOF_TYPE,
            signer.key,
            session_key_id(signer.identity_id, signer.session_epoch),
        )

    async def _hello(self, signer: SessionSigner) -> _Link:
        envelope = self._session_proof(signer)
        hello = pb.HelloFrame(
            agent_id=signer.identity_id,
            session_epoch=signer.session_epoch,
            proof=envelope,
            client_version=CLIENT_VERSION,
            accepts_frame_batches=True,
        )
        link = _Link(pb_grpc.GatewayServiceStub(self._require_channel()).Connect())
        try:
            await link.send(pb.ClientFrame(hello=hello))
            frame = await link.read_first()
        except BaseException:
            link.cancel()
            raise
        if frame is not None and frame.HasField("welcome"):
            log.info(
                "%s: connected to %s (session %d, connection %s)",
                self.identity_id,
                self.target,
                signer.session_epoch,
                frame.welcome.connection_id,
            )
            return link
        link.cancel()
        if frame is not None and frame.HasField("error"):
            raise GatewayError(frame.error)
        raise _StreamEnded("the gateway closed the stream before WELCOME")

    async def _serve(self, link: _Link) -> None:
        """Resubscribes, re-sends pending commands, then reads until the stream ends."""
        try:
            async with self._opening:
                self._link = link
                self._routes.clear()
                for subscription in list(self._subscriptions.values()):
                    await subscription.open()
                for command in self._commands.frames():
                    await self._send_frame(pb.ClientFrame(command=command))
                for fetch, _ in list(self._fetches.values()):  # a FETCH only reads: safe to repeat
                    await self._send_frame(pb.ClientFrame(fetch=fetch))
            self._connected.set()
            if self._first is not None and not self._first.done():
                self._first.set_result(None)
            while (frames := await link.read()) is not None:
                for frame in frames:
                    self._dispatch(frame)
            log.log(
                logging.INFO if self._closing else logging.WARNING,
                "%s: the gateway ended the stream",
                self.identity_id,
            )
        except grpc.aio.AioRpcError as err:
            log.warning("%s: stream failed: %s", self.identity_id, _describe(err))
        except asyncio.CancelledError:
            if _being_cancelled():
                raise
            log.info("%s: stream cancelled", self.identity_id)
        finally:
            self._link = None
            self._connected.clear()
            link.cancel()

    def _dispatch(self, frame: pb.ServerFrame) -> None:
        kind = frame.WhichOneof("frame")
        if kind == "result":
            self._commands.resolve(frame.result)
        elif kind == "error" and frame.error.command_id:
            self._commands.fail(frame.error.command_id, GatewayError(frame.error))
        elif kind == "fetched" or (kind == "error" and frame.error.request_id):
            request_id = frame.fetched.request_id if kind == "fetched" else frame.error.request_id
            entry = self._fetches.get(request_id)
            if entry is not None and not entry[1].done():
                if kind == "fetched":
                    entry[1].set_result(frame.fetched)
                else:
                    entry[1].set_exception(GatewayError(frame.error))
        elif kind in ("event", "flow", "cursor_too_old", "error"):
            subscription = self._routes.get(getattr(frame, kind).subscription_id)
            if subscription is not None:
                subscription.deliver(frame)
            elif kind == "error":
                level = logging.ERROR if frame.error.fatal else logging.WARNING
                log.log(level, "%s: gateway error %s", self.identity_id, GatewayError(frame.error))
        else:
            log.debug("%s: unexpected %s frame", self.identity_id, kind)

    # ------------------------------------------------------------------ what subscriptions use (_Host)

    def _verifier_now(self) -> AuthorityVerifier:
        if self._verifier is None:
            raise AgentError("no Authority key yet")
        return self._verifier

    async def _send_frame(self, frame: pb.ClientFrame, route: Subscription | None = None) -> bool:
        """Writes a frame on the current stream; False when there is none (it is re-sent after
        reconnecting). ACKs go through ``_queue_ack``."""
        link = self._link
        if link is None:
            return False
        if route is not None:
            self._routes[frame.subscribe.subscription_id] = route
        return await self._write(link, frame)

    def _queue_ack(self, ack: pb.CursorAck) -> None:
        """A subscription's ACK (the subscription hands it over), queued and coalesced
        (``ACK_COALESCE_S``): per subscription the highest cursor and the sum of the credits, all
        subscriptions in one frame. Dropped when there is no stream, and a stream that ends drops its
        queued ACKs: the next attempt subscribes again from the cursor file."""
        link = self._link
        if link is None:
            return
        if self._acks_link is not link:
            self._acks, self._acks_link = {}, link
        queued = self._acks.get(ack.subscription_id)
        if queued is None:
            self._acks[ack.subscription_id] = ack
        else:
            queued.cursor = max(queued.cursor, ack.cursor)
            queued.credits += ack.credits
        if self._ack_flush is None:
            self._ack_flush = asyncio.create_task(self._flush_acks_soon())

    async def _flush_acks_soon(self) -> None:
        await asyncio.sleep(ACK_COALESCE_S)
        self._ack_flush = None
        await self._flush_acks()

    async def _flush_acks(self) -> None:
        acks, link = self._acks, self._acks_link
        self._acks, self._acks_link = {}, None
        if acks and link is not None and link is self._link:
            await self._write(link, pb.ClientFrame(ack=pb.AckFrame(cursors=list(acks.values()))))

    async def _write(self, link: _Link, frame: pb.ClientFrame) -> bool:
        try:
            await link.send(frame)
            return True
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as err:
            log.debug("%s: write failed: %r", self.identity_id, err)
            return False
        except asyncio.CancelledError:
            if _being_cancelled():
                raise
            return False  # the call was cancelled under us (a dropped stream), not this task

    async def _fetch_snapshot(self, group_id: str, digest: common_pb2.Digest) -> pb.GetSnapshotResponse:
        stub = pb_grpc.GatewayServiceStub(self._require_channel())
        request = pb.GetSnapshotRequest(group_id=group_id, digest=digest, proof=self._session_proof(self.session))
        return await stub.GetSnapshot(request)

    @property
    def channel(self) -> grpc.aio.Channel:
        """The agent's channel to the mesh: unary calls on it carry the session's call proofs."""
        return self._require_channel()

    def _require_channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            raise AgentError("the agent is not started")
        return self._channel


class _Connecting:
    """What :meth:`Agent.connect` returns: ``await`` it, or use it as ``async with``."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def __await__(self) -> Generator[Any, None, Agent]:
        return self._agent.__aenter__().__await__()

    async def __aenter__(self) -> Agent:
        return await self._agent.__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._agent.close()
