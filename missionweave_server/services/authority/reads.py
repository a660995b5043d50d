"""Reads: a Group's events and views of its durable state, always verified, never speculative.

Events come from whichever tier holds them and are verified before they are served (integrity.py),
chained from the digest this instance knows at its durable head; a follower of a Group this instance
writes is served the just-appended tail from memory (tail.py). ``AppendWaiters`` wakes the followers
when a Group gets new events. The signed views (hand-over summary, Context Package) are made of the
durable state only, never of appends still in the group-commit queue.
"""

from __future__ import annotations

import asyncio

from missionweave.kernel.clock import Clock, to_micros
from missionweave.kernel.errors import Rejected
from missionweave.kernel.eventlog import Chain, Corruption
from missionweave.kernel.signing import GROUP_SUMMARY_TYPE
from missionweave.kernel.signing import verify_signature as verify_envelope
from missionweave.v1 import artifact_service_pb2, common_pb2
from missionweave_server.services.authority.context_package import CONTEXT_PACKAGE_TYPE, build_context_package
from missionweave_server.services.authority.integrity import LogIntegrity
from missionweave_server.services.authority.loading import GroupLoader, Sign
from missionweave_server.services.authority.rules.missions.context_transfer import check_transfer
from missionweave_server.services.authority.store import EventStore, StoredEvent
from missionweave_server.services.authority.tail import LogTails
from missionweave_server.services.authority.views import group_state_proto

R = common_pb2.RejectionReason


class EventReads:
    """Verified reads of a Group's stored log (ReadEvents, FetchEvents, FollowGroup, replays)."""

    def __init__(
        self, store: EventStore, integrity: LogIntegrity, loader: GroupLoader, tails: LogTails, clock: Clock
    ) -> None:
        self.store = store
        self.integrity = integrity
        self.loader = loader
        self.tails = tails
        self.clock = clock

    async def history(self, group_id: str, after: int = 0, limit: int = 1024) -> list[StoredEvent]:
        """Events after ``after`` from both tiers, verified (ReadEvents, FetchEvents, replays)."""
        self.integrity.refuse_if_corrupted(group_id)
        batch = await self.store.read_history(group_id, after, limit)
        await self.integrity.check(group_id, batch, Chain(group_id, after, self.link_at(group_id, after)))
        return batch

    async def range(self, group_id: str, first: int, last: int) -> list[StoredEvent]:
        """Events ``first..last`` from whichever tier holds them, verified."""
        batch = await self.history(group_id, first - 1, last - first + 1)
        if len(batch) != last - first + 1:
            raise self.integrity.mark(
                Corruption(group_id, first + len(batch), f"events {first}..{last} are not all stored")
            )
        return batch

    async def online(self, group_id: str, after: int, limit: int) -> list[StoredEvent]:
        """The online log after ``after``: the just-appended tail from memory, else the database.

        A follower that has caught up with a Group this instance writes is told so from memory too,
        while this instance's ownership lease certainly holds (nobody else can have appended):
        otherwise every caught-up subscriber cost a query per delivery.
        """
        self.integrity.refuse_if_corrupted(group_id)
        owned = self.loader.get(group_id)
        if owned is not None:
            cached = self.tails.read(group_id, after, limit)
            if cached is not None:
                return cached  # the envelopes this instance made durable itself
            if after >= owned.durable_head and to_micros(self.clock.now()) < owned.sole_writer_until_us:
                return []
        batch = await self.store.read(group_id, after, limit)
        if batch and batch[0].sequence == after + 1:  # else compacted: the caller answers CURSOR_TOO_OLD
            await self.integrity.check(group_id, batch, Chain(group_id, after, self.link_at(group_id, after)))
        return batch

    def link_at(self, group_id: str, sequence: int) -> bytes | None:
        """The event digest at ``sequence`` when this instance knows it (the durable head)."""
        owned = self.loader.get(group_id)
        if owned is not None and sequence == owned.durable_head:
            return owned.durable_link
        return None


class AppendWaiters:
    """Followers waiting for a Group's next append in this process (a wake-up hint, not a read)."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Event] = {}

    def wake(self, group_id: str) -> None:
        waiter = self._waiting.pop(group_id, None)
        if waiter is not None:
            waiter.set()

    def wake_all(self) -> None:
        """Wake every follower waiting for an append (at shutdown, so that they re-check and end)."""
        waiters, self._waiting = self._waiting, {}
        for waiter in waiters.values():
            waiter.set()

    async def wait(self, group_id: str, timeout: float) -> bool:  # noqa: ASYNC109 (a bounded wake-up hint)
        """Resolves when the Group gets new events (in this process): True, or after ``timeout``: False."""
        waiter = self._waiting.setdefault(group_id, asyncio.Event())
        try:
            # asyncio.timeout, not wait_for: every caught-up subscriber waits here after each delivery,
            # and wait_for wraps the wait in a task of its own.
            async with asyncio.timeout(timeout):
                await waiter.wait()
        except TimeoutError:
            return False
        return True


class StateViews:
    """Signed views of a Group's durable state: the hand-over summary and Context Packages."""

    def __init__(self, loader: GroupLoader, clock: Clock, sign: Sign, public_key: bytes, key_id: str) -> None:
        self.loader = loader
        self.clock = clock
        self.sign = sign
        self.public_key = public_key
        self.key_id = key_id

    async def signed_summary(
        self, group_id: str, viewer: str | None = None
    ) -> common_pb2.SignedEnvelope | None:
        """The Group's durable state signed by this Authority (MW-7.2-07 hand-over summary): all of
        it, or what member ``viewer`` may see of it."""
        state = await self.loader.state(group_id)
        if state is None:
            return None
        payload = group_state_proto(state, viewer).SerializeToString(deterministic=True)
        return self.sign(payload, GROUP_SUMMARY_TYPE)

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
        state = await self.loader.state(group_id)
        if state is None:
            return None
        if target_group_id == group_id:
            target_group_id = ""
        if target_group_id or transfer_authorization_event_id:
            check_transfer(state, target_group_id, transfer_authorization_event_id, work_item_ids)
        prior, prior_payload = None, b""
        if previous is not None and previous.payload:
            if previous.payload_type != CONTEXT_PACKAGE_TYPE or not verify_envelope(
                previous, self.public_key
            ):
                raise Rejected(
                    R.REJECTION_REASON_SIGNATURE_INVALID,
                    "previous_version is not a package signed by this Authority",
                )
            prior, prior_payload = (
                artifact_service_pb2.ContextPackage.FromString(previous.payload),
                previous.payload,
            )
            if prior.group_id != group_id:
                raise Rejected(
                    R.REJECTION_REASON_INVALID_ARGUMENT,
                    "previous_version belongs to another Group",
                    field="previous_version",
                )
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
        return self.sign(package.SerializeToString(deterministic=True), CONTEXT_PACKAGE_TYPE)
