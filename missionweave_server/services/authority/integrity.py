"""The Authority's check of what it reads from its store (docs/integrity.md, issue 13 item 5).

Every batch of stored events the Authority loads (to fold a Group), replays (a command's answer),
rewrites (an erasure) or serves (ReadEvents, FetchEvents, FollowGroup from the database) passes
through ``LogIntegrity.check``: the rules of ``missionweave.kernel.eventlog``, with the Ed25519 checks sent
in one batch to the signature workers (``SignatureVerifier.verify_many``).

Envelopes that verified are remembered by their BLAKE3 digest (``VerifiedEnvelopes``), so a log
read again (a Group folded again, a follower catching up from the database) costs a hash and a
lookup per event instead of a parse and a signature check; the chain rules run either way.

A Group that fails is refused from then on with DATA_CORRUPTED (every read, state and command),
logged once at error level with its id and sequence, counted, and shown in health
(``on_corrupted``): until an operator restores its log and restarts the Authority.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import blake3

from missionweave.kernel import codec
from missionweave.kernel.errors import R, Rejected
from missionweave.kernel.eventlog import (
    Chain,
    Checked,
    Corruption,
    inspect,
    verified_checkpoint,
    verified_snapshot,
)
from missionweave.v1 import authority_service_pb2, common_pb2, event_pb2
from missionweave_server.services.authority.group_commit import StoredEvent
from missionweave_server.verification.verifier import SignatureVerifier

log = logging.getLogger("missionweave.authority.integrity")

VERIFIED_CACHE = 65_536


class Counters:
    """Process-wide integrity counters (logged; a metrics endpoint can read them)."""

    corrupted_groups = 0
    events_verified = 0  # signature checks of stored events
    events_cached = 0  # stored events recognised as already verified
    events_chained = 0  # stored events covered by a signed chain checkpoint (no signature check)


@dataclass(frozen=True)
class _Known:
    checked: Checked
    event_id: str
    type: str


class VerifiedEnvelopes:
    """Envelopes already verified, by BLAKE3-128 of their stored bytes (bounded, LRU)."""

    def __init__(self, size: int = VERIFIED_CACHE) -> None:
        self.size = size
        self._known: OrderedDict[bytes, _Known] = OrderedDict()

    @staticmethod
    def key(stored: bytes) -> bytes:
        return blake3.blake3(stored).digest(length=16)

    def get(self, key: bytes) -> _Known | None:
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
        return known

    def put(self, key: bytes, known: _Known) -> None:
        self._known[key] = known
        if len(self._known) > self.size:
            self._known.popitem(last=False)

    def forget(self, stored: bytes) -> None:
        self._known.pop(self.key(stored), None)


class LogIntegrity:
    def __init__(
        self,
        keys: Mapping[str, bytes],
        verifier: SignatureVerifier,
        on_corrupted: Callable[[str], None] | None = None,
        cache_size: int = VERIFIED_CACHE,
    ) -> None:
        self.keys = dict(keys)
        self.verifier = verifier
        self.on_corrupted = on_corrupted
        self.verified = VerifiedEnvelopes(cache_size)
        # Groups refused for good (until restart): the first failure found in each.
        self.corrupted: dict[str, Corruption] = {}

    def refuse_if_corrupted(self, group_id: str) -> None:
        found = self.corrupted.get(group_id)
        if found is not None:
            raise _refusal(found)

    def mark(self, corruption: Corruption) -> Rejected:
        """Record a Group as corrupted (once: logged, counted, health told) and the rejection to raise."""
        group_id = corruption.group_id
        if group_id not in self.corrupted:
            self.corrupted[group_id] = corruption
            Counters.corrupted_groups += 1
            log.error(
                "a Group's stored log failed verification: the Group is refused (DATA_CORRUPTED) until its log is restored",
                extra={"group_id": group_id, "sequence": corruption.sequence, "detail": corruption.detail},
            )
            if self.on_corrupted is not None:
                self.on_corrupted(group_id)
        return _refusal(self.corrupted[group_id])

    async def check(
        self, group_id: str, rows: Sequence[StoredEvent], chain: Chain, *, events: bool = False
    ) -> list[event_pb2.Event]:
        """Checks ``rows`` (the next ones of ``chain``, in order); with ``events``, returns them parsed.
        Raises DATA_CORRUPTED (and marks the Group) at the first row that fails."""
        self.refuse_if_corrupted(group_id)
        parsed: list[event_pb2.Event | None] = []
        checked: list[Checked] = []
        fresh: list[tuple[int, bytes, _Known]] = []
        signatures: list[tuple[bytes, bytes, bytes]] = []
        failure: Corruption | None = None
        verified, keys, trusts = self.verified, self.keys, chain.trusts
        # A fold parses every event anyway, and under a signed checkpoint the hash chain covers it:
        # there the cache of verified envelopes would save nothing but costs a hash per event.
        covered = chain.checkpoint[0] if events and chain.checkpoint is not None else 0
        for row in rows:
            key = b"" if row.sequence <= covered else verified.key(row.envelope)
            known = verified.get(key) if key else None
            if (
                known is not None
                and known.checked.group_id == group_id
                and known.checked.sequence == row.sequence
                and known.event_id == row.event_id
                and known.type == row.type
            ):
                checked.append(known.checked)
                parsed.append(None)
                continue
            try:
                one, signature, event = inspect(
                    group_id, row.sequence, row.event_id, row.type, row.envelope, keys
                )
            except Corruption as corruption:
                failure = corruption
                break
            if not trusts(one):  # else the hash chain up to the signed checkpoint covers it
                fresh.append(
                    (len(checked), key or verified.key(row.envelope), _Known(one, row.event_id, row.type))
                )
                signatures.append((signature.message, signature.signature, signature.public_key))
            checked.append(one)
            parsed.append(event)
        if signatures:
            verdicts = await self.verifier.verify_many(signatures)
            Counters.events_verified += len(signatures)
            chain.signatures_checked += len(signatures)
            for (index, _, _), ok in zip(fresh, verdicts, strict=True):
                if not ok:
                    failure = Corruption(
                        group_id, checked[index].sequence, "the Authority's signature does not verify"
                    )
                    del checked[index:]
                    break
        cached = parsed.count(None)
        Counters.events_cached += cached
        try:
            advance = chain.advance
            for one in checked:
                advance(one)
        except Corruption as corruption:
            failure = corruption
        if failure is not None:
            raise self.mark(failure) from None
        Counters.events_chained += len(checked) - len(fresh) - cached
        for _, key, known in fresh:
            self.verified.put(key, known)
        if not events:
            return []
        return [
            e if e is not None else codec.decode_event(row.envelope)
            for e, row in zip(parsed, rows, strict=True)
        ]

    def checkpoint(self, group_id: str, stored: tuple[int, bytes] | None) -> tuple[int, bytes] | None:
        """A stored chain checkpoint, verified (a forged or edited one marks the Group)."""
        if stored is None:
            return None
        try:
            return verified_checkpoint(group_id, stored[0], stored[1], self.keys)
        except Corruption as corruption:
            raise self.mark(corruption) from None

    def snapshot(
        self, group_id: str, sequence: int | None, digest: str, stored: bytes
    ) -> tuple[common_pb2.SignedEnvelope, authority_service_pb2.GroupSnapshot]:
        """A stored snapshot, verified (MW-16-12): else the Group is marked and refused."""
        self.refuse_if_corrupted(group_id)
        try:
            return verified_snapshot(group_id, sequence, digest, stored, self.keys)
        except Corruption as corruption:
            raise self.mark(corruption) from None


def _refusal(corruption: Corruption) -> Rejected:
    return Rejected(
        R.REJECTION_REASON_DATA_CORRUPTED,
        f"group {corruption.group_id}'s stored log failed verification at sequence {corruption.sequence} "
        f"({corruption.detail}); it is not served or extended until an operator restores it",
        group_id=corruption.group_id,
        sequence=corruption.sequence,
    )
