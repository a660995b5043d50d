"""Loading: the Groups this instance owns, and how one is loaded, folded and snapshotted.

A Group is loaded by taking its ownership (the store's writer epoch), then folding its whole stored log
with every event verified on the way (integrity.py: signature, sequence, chain, erasures), after
truncation.py has checked that nothing names a sequence past the Group's head. A load that checked
many signatures leaves a signed chain checkpoint, so the next load checks signatures only after it.
Loaded Groups are cached (most recently used last, ``cache_size`` of them); a Group that fails
verification is dropped from the cache (``drop``). Signed snapshots of the durable state are made
here too (``take_snapshot``).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable

import blake3

from missionweave.kernel.clock import Clock, to_micros, to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.kernel.eventlog import CHECKPOINT_TYPE, Chain, Corruption, checkpoint_payload
from missionweave.kernel.signing import SNAPSHOT_TYPE
from missionweave.v1 import authority_service_pb2, common_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.integrity import LogIntegrity
from missionweave_server.services.authority.owned import OwnedGroup
from missionweave_server.services.authority.progress import mission_progress
from missionweave_server.services.authority.rules.common import TERMINAL_MISSION_STATES
from missionweave_server.services.authority.state import GroupState
from missionweave_server.services.authority.store import EventStore
from missionweave_server.services.authority.tail import LogTails
from missionweave_server.services.authority.truncation import refuse_if_shortened
from missionweave_server.services.authority.views import group_state_proto

R = common_pb2.RejectionReason

# Signs a payload of the given type with the Authority's current key.
Sign = Callable[[bytes, str], common_pb2.SignedEnvelope]

CHECKPOINT_EVERY = 256


class GroupLoader:
    """The cache of owned Groups and the verified load path that fills it."""

    def __init__(
        self,
        store: EventStore,
        integrity: LogIntegrity,
        clock: Clock,
        tails: LogTails,
        sign: Sign,
        cache_size: int,
    ) -> None:
        self.store = store
        self.integrity = integrity
        self.clock = clock
        self.tails = tails
        self.sign = sign
        self.cache: OrderedDict[str, OwnedGroup] = OrderedDict()
        self.cache_size = cache_size
        # A load that checked this many signatures leaves a signed chain checkpoint at the head it
        # verified, so the next load of the Group checks signatures only after it.
        self.checkpoint_every = CHECKPOINT_EVERY
        # Half the ownership lease, counted from before the store renewed it: a safe bound on how long
        # no other instance can take a Group over (it may only once the lease has expired).
        self.lease_margin_us = int(store.ownership_ttl.total_seconds() * 1_000_000) // 2

    def get(self, group_id: str) -> OwnedGroup | None:
        """The Group's cached view when this instance holds one (not counted as a use)."""
        return self.cache.get(group_id)

    async def load(self, group_id: str) -> OwnedGroup:
        cached = self.cache.get(group_id)
        if cached is not None:
            self.cache.move_to_end(group_id)
            return cached
        taken_us = to_micros(self.clock.now())
        acquired = await self.store.acquire(group_id)
        if acquired is None:
            # The Group does not exist yet: a creating command takes writer epoch 1. Not cached, so a
            # rejected creation leaves nothing behind.
            return OwnedGroup(1, None, {})
        writer_epoch, head = acquired
        state, link = await self.fold_verified(group_id, head, exact=True)
        # Two copies: ``evolve`` mutates, and the speculative one runs ahead of the durable one.
        owned = OwnedGroup(writer_epoch, state, await self.store.commands_of(group_id), copy.deepcopy(state))
        owned.chain_head = owned.durable_link = link
        owned.sole_writer_until_us = taken_us + self.lease_margin_us
        self.remember(group_id, owned)
        return owned

    async def state(self, group_id: str) -> GroupState | None:
        self.integrity.refuse_if_corrupted(group_id)
        cached = self.cache.get(group_id)
        if cached is not None:
            return cached.durable_state  # never the speculative state of appends still in flight
        return await self.fold(group_id)

    async def fold(self, group_id: str) -> GroupState | None:
        """Rebuild a Group's state from its stored log, verified (also used by the replay-equivalence test)."""
        self.integrity.refuse_if_corrupted(group_id)
        return (await self.fold_verified(group_id, await self.store.head(group_id)))[0]

    async def fold_verified(
        self, group_id: str, head: int | None, *, exact: bool = False
    ) -> tuple[GroupState | None, bytes]:
        """The state folded from the whole stored log (both tiers) and the event digest at its head,
        every event verified on the way (signature, sequence, chain, erasures: docs/integrity.md).
        ``head`` is the Group row's head, read before: the log must reach it (exactly, for a Group this
        instance has just taken, which nobody else can extend), so a truncated log is caught too."""
        await refuse_if_shortened(
            self.store, self.integrity, group_id
        )  # records past the head (truncation.py)
        state: GroupState | None = None
        chain = Chain(
            group_id,
            checkpoint=self.integrity.checkpoint(group_id, await self.store.chain_checkpoint(group_id)),
        )
        while True:
            batch = await self.store.read_history(group_id, chain.last, 1024)
            if not batch:
                break
            for event in await self.integrity.check(group_id, batch, chain, events=True):
                state = decider.evolve(state, event)
        if head is not None and (chain.last < head or (exact and chain.last != head)):
            raise self.integrity.mark(
                Corruption(
                    group_id, chain.last + 1, f"the log ends at {chain.last} but the Group's head is {head}"
                )
            )
        if chain.checkpoint is not None and chain.last < chain.checkpoint[0]:
            raise self.integrity.mark(
                Corruption(
                    group_id,
                    chain.last + 1,
                    f"the log ends at {chain.last}, before its signed chain checkpoint",
                )
            )
        assert chain.previous is not None
        if chain.signatures_checked >= self.checkpoint_every and chain.last > 0:
            # What this load verified one signature at a time, the next one checks by the hash chain.
            payload = checkpoint_payload(group_id, chain.last, chain.previous)
            envelope = self.sign(payload, CHECKPOINT_TYPE)
            await self.store.save_chain_checkpoint(group_id, chain.last, envelope.SerializeToString())
        return state, chain.previous

    async def take_snapshot(
        self, group_id: str, *, compact: bool = False, archival: bool = False
    ) -> tuple[common_pb2.SignedEnvelope, str, int] | None:
        """A signed snapshot of the durable state (MW-16-11, MW-7.4-02); optionally compact before it."""
        self.integrity.refuse_if_corrupted(group_id)
        owned = self.cache.get(group_id)
        if owned is not None:
            state, link = owned.durable_state, owned.durable_link
        else:
            state, link = await self.fold_verified(group_id, await self.store.head(group_id))
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
        envelope = self.sign(payload, SNAPSHOT_TYPE)
        digest = blake3.blake3(payload).hexdigest()
        if compact:
            # Compacted events must not be served as online any more. Appends completing from here on
            # start a fresh tail above the snapshot's sequence, so one drop before the move suffices.
            self.tails.drop(group_id)
        await self.store.save_snapshot(
            group_id,
            state.head_sequence,
            digest,
            envelope.SerializeToString(),
            archival,
            to_micros(now),
            compact=compact,
        )
        return envelope, digest, state.head_sequence

    def remember(self, group_id: str, owned: OwnedGroup) -> None:
        self.cache[group_id] = owned
        self.cache.move_to_end(group_id)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)

    def forget(self, group_id: str, owned: OwnedGroup) -> None:
        """Never trust this view of the Group again (a failed or unknown append): reload it when next needed."""
        self.tails.drop(group_id)
        if self.cache.get(group_id) is owned:
            del self.cache[group_id]

    def drop(self, group_id: str) -> None:
        """Forget everything held of the Group (it failed verification)."""
        self.cache.pop(group_id, None)
        self.tails.drop(group_id)
