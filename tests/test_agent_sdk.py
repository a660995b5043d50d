"""The Python agent SDK (missionweave.sdk.agent, spec 16): every event once and in order across a dropped
stream and a restart, a durable cursor file that never crosses a gap, skipped ranges, ACK batching with
credits, commands over the stream, typed builders and snapshot restore with verification.

The ordering, credit and cursor components are driven directly with hand-made frames (a fake host
stands in for the agent); the rest runs against the in-process mesh of tests/conftest.py.
"""

from __future__ import annotations

import asyncio
import doctest
import importlib.util
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import pytest
from nacl.signing import SigningKey
from sqlalchemy import select

import missionweave.sdk.agent as sdk
import missionweave.sdk.backoff as backoff_module
import missionweave.sdk.cursors as cursors_module
import missionweave.sdk.event_verification as verification_module
import missionweave.sdk.sequencing as sequencing_module
import missionweave.sdk.stream_commands as commands_module
from missionweave.kernel.signing import EVENT_TYPE, SNAPSHOT_REFERENCE_TYPE, SNAPSHOT_TYPE, sign_envelope
from missionweave.sdk.agent import (
    Agent,
    AuthorityVerifier,
    Backoff,
    CommandRejected,
    CreditWindow,
    CursorStore,
    GroupSequencer,
    NotVerified,
    Subscription,
    SubscriptionFailed,
)
from missionweave.sdk.client import decode_events
from missionweave.sdk.event_verification import VERIFIED_EVENT_PAYLOADS, VerifiedPayloads
from missionweave.sdk.idempotency import attempt_key
from missionweave.v1 import (
    authority_service_pb2,
    common_pb2,
    conversation_pb2,
    event_pb2,
    membership_pb2,
    membership_service_pb2,
)
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.gateway.schema import cursors
from tests import builders
from tests import test_work_items as work
from tests.conftest import World, polled
from tests.test_missions import G, create

AUTHORITY = SigningKey.generate()
AUTHORITY_ID = "authority:test"
FAST = Backoff(initial=0.02, cap=0.1)


# ------------------------------------------------------------------ helpers


def signed_event(sequence: int, group_id: str = G) -> common_pb2.SignedEnvelope:
    event = event_pb2.Event(
        event_id=f"evt_{sequence:04d}", group_id=group_id, sequence=sequence, type="message.posted"
    )
    return sign_envelope(event.SerializeToString(), EVENT_TYPE, AUTHORITY, AUTHORITY_ID)


def event_frame(
    sid: str, first: int, last: int, *, skipped: tuple[int, ...] = (), events: tuple[int, ...] | None = None
) -> pb.ServerFrame:
    """An EVENT frame covering [first, last]: every sequence delivered unless listed in ``skipped``
    (``events`` overrides which are delivered, to build a frame that is missing some)."""
    delivered = events if events is not None else tuple(s for s in range(first, last + 1) if s not in skipped)
    frame = pb.EventFrame(
        subscription_id=sid,
        group_id=G,
        first_sequence=first,
        last_sequence=last,
        events=[signed_event(s) for s in delivered],
        skipped=[pb.SequenceRange(first=s, last=s) for s in skipped],
    )
    return pb.ServerFrame(event=frame)


class FakeHost:
    """Stands in for the Agent: records what the subscription sends, serves a prepared snapshot."""

    def __init__(self) -> None:
        self.sent: list[pb.ClientFrame] = []
        self.verifier = AuthorityVerifier(AUTHORITY_ID, bytes(AUTHORITY.verify_key))
        self.snapshot = pb.GetSnapshotResponse()

    def _verifier_now(self) -> AuthorityVerifier:
        return self.verifier

    async def _send_frame(self, frame: pb.ClientFrame, route: Subscription | None = None) -> bool:
        self.sent.append(frame)
        return True

    def _queue_ack(self, ack: pb.CursorAck) -> None:
        self.sent.append(pb.ClientFrame(ack=pb.AckFrame(cursors=[ack])))

    async def _fetch_snapshot(self, group_id: str, digest: common_pb2.Digest) -> pb.GetSnapshotResponse:
        return self.snapshot

    def acks(self) -> list[tuple[int, int]]:
        return [(c.cursor, c.credits) for f in self.sent if f.HasField("ack") for c in f.ack.cursors]

    def subscribes(self) -> list[pb.SubscribeFrame]:
        return [f.subscribe for f in self.sent if f.HasField("subscribe")]


async def reach(sub: Subscription, sequence: int) -> None:
    async with asyncio.timeout(5):
        await sub.reached(sequence)


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition did not come true")


def stored(path: Path, group_id: str = G) -> int:
    return int(json.loads(path.read_text())["cursors"][group_id])


async def offline_subscription(
    tmp_path: Path, seen: list[int], **kw: Any
) -> tuple[FakeHost, Subscription, CursorStore]:
    host = FakeHost()
    cursor_file = CursorStore(tmp_path, "bot", interval=0)

    async def handler(event: event_pb2.Event) -> None:
        seen.append(event.sequence)

    subscription = Subscription(host, 1, G, handler, cursor_file, **kw)
    await subscription.open()
    return host, subscription, cursor_file


async def gateway_cursor(w: World, agent_id: str) -> int:
    async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
        query = select(cursors.c.cursor).where(cursors.c.agent_id == agent_id, cursors.c.group_id == G)
        return int((await conn.execute(query)).scalar_one())


async def post_messages(w: World, conversation_id: str, texts: range) -> None:
    for i in texts:
        await w.run(
            w.owner, G, "message_post", builders.message(conversation_id, f"m{i}"), membership_epoch=1
        )


def connect(w: World, identity: str, key: SigningKey, state: Path) -> Any:
    return Agent.connect(w.target, identity, key, cursor_dir=state, backoff=FAST, grace=2.0)


# ------------------------------------------------------------------ the pure components


def test_docstring_examples_run() -> None:
    # The examples live with the code they show: the agent, and the modules it re-exports from.
    for module in (sdk, sequencing_module, backoff_module, commands_module):
        failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert failed == 0 and attempted > 0, module.__name__


@pytest.mark.req("MW-16-02", "MW-16-03", "MW-16-04", "MW-16-05")
def test_sequencer_buffers_out_of_order_drops_duplicates_and_stops_at_gaps() -> None:
    seq = GroupSequencer[str](cursor=2)
    assert not seq.add_event(2, "evt_2", "old")  # at or below the cursor: already processed
    assert seq.add_event(5, "evt_5", "e5") and seq.add_event(3, "evt_3", "e3")
    assert not seq.add_event(3, "evt_3", "e3") and not seq.add_event(6, "evt_5", "e5 again")  # by id too
    released = []
    while (slot := seq.next_ready()) is not None:
        released.append(slot.item)
        seq.done(slot)
    assert released == ["e3"] and seq.cursor == 3 and seq.has_gap  # 4 is missing: 5 waits
    seq.add_skipped(4, 4)
    slot = seq.next_ready()
    assert slot is not None and slot.item is None and (slot.first, slot.last) == (4, 4)
    seq.done(slot)
    slot = seq.next_ready()
    assert slot is not None and slot.item == "e5"
    seq.done(slot)
    assert seq.cursor == 5 and not seq.buffered
    assert not seq.add_event(9, "evt_5", "replayed under another sequence")  # remembered by id
    with pytest.raises(ValueError):
        seq.done(sdk.Slot(8, 8, "x"))  # never across a gap


def test_a_skipped_range_straddling_the_cursor_is_clipped() -> None:
    seq = GroupSequencer[str](cursor=3)
    seq.add_skipped(1, 6)
    slot = seq.next_ready()
    assert slot is not None and (slot.first, slot.last) == (4, 6)


@pytest.mark.req("MW-8-17", "MW-16-07")
def test_credit_window_grants_back_a_frame_once_processed_in_half_window_batches() -> None:
    window = CreditWindow(credits=8, after=10)
    window.received(11, 13)
    window.received(14, 15)
    window.processed(cursor=12)
    assert not window.due(12, idle=False)  # frame 11..13 not yet through
    assert window.due(12, idle=True)  # idle: report the cursor anyway
    window.processed(cursor=15)
    assert window.due(15, idle=False)
    assert window.take(cursor=15) == (15, 5)
    assert window.take(cursor=99) == (15, 0)  # never beyond what this attempt delivered
    assert not window.due(15, idle=True)


def test_backoff_grows_exponentially_with_jitter_up_to_the_cap() -> None:
    backoff = Backoff(initial=0.1, cap=1.0)
    delays = [backoff.next() for _ in range(8)]
    assert 0.05 <= delays[0] <= 0.1 and 0.1 <= delays[1] <= 0.2 and all(0.5 <= d <= 1.0 for d in delays[4:])
    assert len({round(d, 6) for d in delays[4:]}) > 1  # jittered
    backoff.reset()
    assert backoff.next() <= 0.1


@pytest.mark.req("MW-16-06")
async def test_the_cursor_file_is_written_atomically_and_only_forwards(tmp_path: Path) -> None:
    store = CursorStore(tmp_path, "bot", interval=0)
    assert store.load(G) == 0
    await store.save(G, 7)
    assert stored(store.path) == 7 and CursorStore(tmp_path, "bot").load(G) == 7
    assert os.listdir(tmp_path) == [store.path.name]  # no temporary file left
    with pytest.raises(ValueError):
        await store.save(G, 6)
    with pytest.raises(sdk.AgentError):
        CursorStore(tmp_path, "another-bot")  # the file names its owner
    with pytest.raises(ValueError):
        store.load("../escape")
    (tmp_path / "cursors.json").write_text(json.dumps({"agent_id": "bot", "cursors": {"../escape": 1}}))
    with pytest.raises(sdk.AgentError):
        CursorStore(tmp_path, "bot")  # nor does a file name a path out of the directory


@pytest.mark.req("MW-16-06")
async def test_a_cursor_asked_for_without_waiting_is_written_in_the_next_round(tmp_path: Path) -> None:
    """``CursorStore.ask``, what a subscription saving behind its handler uses: asks made before a
    round starts share its future; the future resolves only once the file holds the cursor; a cursor
    the file holds already needs no round; a cursor never moves backwards."""
    store = CursorStore(tmp_path, "bot", interval=0.05)
    first = store.ask(G, 2)
    assert first is not None and store.ask(G, 5) is first and store.ask("grp_other", 1) is first
    assert not first.done() and store.saved(G) == 0 and not store.path.exists()
    await first
    assert store.saved(G) == 5 and stored(store.path) == 5 and stored(store.path, "grp_other") == 1
    assert store.ask(G, 5) is None  # the file holds it
    with pytest.raises(ValueError):
        store.ask(G, 4)
    later = store.ask(G, 9)
    assert later is not None and later is not first
    await later
    assert stored(store.path) == 9


@pytest.mark.req("MW-16-06")
async def test_the_cursors_of_many_groups_go_out_in_one_write_per_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D143: every Group's cursor in one file, the saves asked for meanwhile written together, at
    most one write per interval; each save returns only once its cursor is on disk."""
    writes: list[dict[str, int]] = []
    write = cursors_module.write_json_atomic

    def counted(path: Path, data: dict[str, Any]) -> None:
        writes.append(dict(data["cursors"]))
        write(path, data)

    monkeypatch.setattr(cursors_module, "write_json_atomic", counted)
    store = CursorStore(tmp_path, "bot", interval=0.2)
    groups = [f"grp_{i}" for i in range(20)]
    started = time.monotonic()
    await asyncio.gather(*(store.save(g, 3) for g in groups))
    assert writes == [dict.fromkeys(groups, 3)]  # twenty saves, one write
    assert all(stored(store.path, g) == 3 for g in groups)
    await asyncio.gather(store.save(groups[0], 5), store.save(groups[1], 4))
    assert time.monotonic() - started >= 0.2  # the second round waited for the interval
    assert writes[1] == {**dict.fromkeys(groups, 3), groups[0]: 5, groups[1]: 4}  # the others kept
    assert CursorStore(tmp_path, "bot").load(groups[0]) == 5


async def test_a_failed_cursor_write_fails_every_save_of_its_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(path: Path, data: dict[str, Any]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cursors_module, "write_json_atomic", broken)
    store = CursorStore(tmp_path, "bot", interval=0)
    results = await asyncio.gather(store.save("grp_a", 1), store.save("grp_b", 2), return_exceptions=True)
    assert [type(r) for r in results] == [OSError, OSError]
    assert store.load("grp_a") == 0 and not store.path.exists()  # nothing is reported as durable


@pytest.mark.req("MW-16-06")
async def test_a_cursor_written_by_an_earlier_sdk_is_resumed_from(tmp_path: Path) -> None:
    """Cursors an SDK before D143 wrote, one file per Group, are read; the next round carries them
    and removes the old file."""
    old = {"agent_id": "bot", "group_id": G, "cursor": 41}
    (tmp_path / f"{G}.cursor.json").write_text(json.dumps(old))
    store = CursorStore(tmp_path, "bot", interval=0)
    assert store.load(G) == 41 and store.load("grp_other") == 0
    await store.save("grp_other", 2)
    assert stored(store.path) == 41 and stored(store.path, "grp_other") == 2
    assert not (tmp_path / f"{G}.cursor.json").exists()  # carried over, then removed
    with pytest.raises(ValueError):
        await store.save(G, 40)
    (tmp_path / "grp_elses.cursor.json").write_text(json.dumps({**old, "group_id": "grp_x"}))
    with pytest.raises(sdk.AgentError):
        store.load("grp_elses")  # an old file that names another Group is not taken


# ------------------------------------------------------------------ a subscription fed by hand


@pytest.mark.req("MW-16-03", "MW-16-04", "MW-16-05", "MW-16-06", "MW-16-07")
async def test_the_cursor_file_never_advances_across_a_gap(tmp_path: Path) -> None:
    seen: list[int] = []
    host, sub, cursor_file = await offline_subscription(tmp_path, seen, credits=8)
    sid = sub.subscription_id
    sub.deliver(event_frame(sid, 1, 2))
    sub.deliver(event_frame(sid, 4, 6))  # 3 is missing
    await reach(sub, 2)
    await until(lambda: sub._sequencer.buffered == 3)
    assert seen == [1, 2] and stored(cursor_file.path) == 2 and sub.cursor == 2
    assert all(cursor <= 2 for cursor, _ in host.acks())  # nor does the ACK
    sub.deliver(event_frame(sid, 1, 2))  # a replayed duplicate changes nothing
    sub.deliver(event_frame(sid, 3, 3))
    await reach(sub, 6)
    assert seen == [1, 2, 3, 4, 5, 6] and stored(cursor_file.path) == 6
    await sub.stop(grace=1)
    assert host.acks()[-1][0] == 6
    assert sum(credits for _, credits in host.acks()) == 2 + 3 + 1 + 2  # every frame's credits, once
    assert not sub.failure


@pytest.mark.req("MW-8-17", "MW-16-07")
async def test_a_flow_queued_behind_the_last_event_still_gets_its_ack(tmp_path: Path) -> None:
    """A FLOW arrives while the last EVENT is being handled: once it is handled the subscription is
    idle and must ACK (the drain's own idle ACK is skipped while a frame waits). Without that ACK a
    spent window is never granted back and the subscription stalls."""
    host, gate, seen = FakeHost(), asyncio.Event(), []

    async def handler(event: event_pb2.Event) -> None:
        seen.append(event.sequence)
        if event.sequence == 3:
            await gate.wait()

    sub = Subscription(host, 1, G, handler, CursorStore(tmp_path, "bot", interval=0), credits=8)
    await sub.open()
    sid = sub.subscription_id
    sub.deliver(event_frame(sid, 1, 3))  # 3 of 8 credits: below the half-window ACK threshold
    await until(lambda: seen == [1, 2, 3])
    granted = pb.FlowFrame(
        subscription_id=sid,
        group_id=G,
        reason=pb.FLOW_REASON_CREDIT_GRANTED,
        state=pb.FLOW_STATE_OPEN,
        delivered_sequence=3,
    )
    sub.deliver(pb.ServerFrame(flow=granted))
    gate.set()
    await until(lambda: bool(host.acks()) and host.acks()[-1][0] == 3)
    assert sum(credits for _, credits in host.acks()) == 3
    await sub.stop(grace=1)


@pytest.mark.req("MW-16-05", "MW-16-06")
async def test_skipped_sequences_advance_the_cursor_without_reaching_the_handler(tmp_path: Path) -> None:
    seen: list[int] = []
    host, sub, cursor_file = await offline_subscription(tmp_path, seen)
    sub.deliver(event_frame(sub.subscription_id, 1, 5, skipped=(2, 3, 5)))
    await reach(sub, 5)
    await sub.stop(grace=1)
    assert seen == [1, 4] and stored(cursor_file.path) == 5 and host.acks()[-1] == (5, 5)


async def test_a_gap_that_does_not_fill_resubscribes_from_the_cursor(tmp_path: Path) -> None:
    seen: list[int] = []
    host, sub, _ = await offline_subscription(tmp_path, seen, gap_timeout=0.05)
    first = sub.subscription_id
    sub.deliver(event_frame(first, 1, 1))
    sub.deliver(event_frame(first, 3, 3))
    await until(lambda: len(host.subscribes()) == 2)
    assert host.subscribes()[-1].after_sequence == 1
    assert any(f.unsubscribe.subscription_id == first for f in host.sent if f.HasField("unsubscribe"))
    sub.deliver(event_frame(first, 2, 3))  # the old attempt's frames are ignored ...
    sub.deliver(event_frame(sub.subscription_id, 2, 3))  # ... the new one's are processed
    await reach(sub, 3)
    await sub.stop(grace=1)
    assert seen == [1, 2, 3]


def error_frame(sid: str, code: pb.GatewayErrorCode.ValueType) -> pb.ServerFrame:
    return pb.ServerFrame(error=pb.ErrorFrame(subscription_id=sid, code=code))


async def test_history_unavailable_is_retried_from_the_cursor_and_no_membership_fails(tmp_path: Path) -> None:
    seen: list[int] = []
    host, sub, _ = await offline_subscription(tmp_path, seen)
    sub._retry = Backoff(initial=0.01, cap=0.02)
    sub.deliver(event_frame(sub.subscription_id, 1, 3))
    # Processed and persisted first: a resubscription starts from the persisted cursor, so one sent
    # while the cursor write is still in flight (a loaded machine) would rightly start earlier.
    await reach(sub, 3)
    sub.deliver(error_frame(sub.subscription_id, pb.GATEWAY_ERROR_CODE_HISTORY_UNAVAILABLE))
    await until(lambda: len(host.subscribes()) == 2)
    assert host.subscribes()[-1].after_sequence == 3 and not sub.failure  # stopped, never skipped
    sub.deliver(error_frame(sub.subscription_id, pb.GATEWAY_ERROR_CODE_NOT_A_MEMBER))
    with pytest.raises(SubscriptionFailed, match="NOT_A_MEMBER"):
        await reach(sub, 4)
    await sub.open()  # a failed subscription is not resubscribed on the next stream
    assert len(host.subscribes()) == 2 and seen == [1, 2, 3]
    await sub.stop(grace=1)


async def test_events_that_do_not_verify_stop_the_subscription(tmp_path: Path) -> None:
    seen: list[int] = []
    _, sub, cursor_file = await offline_subscription(tmp_path, seen)
    frame = event_frame(sub.subscription_id, 1, 2)
    frame.event.events[1].payload += b"\x00"
    sub.deliver(frame)
    with pytest.raises(NotVerified):
        await reach(sub, 2)
    assert seen == [] and not cursor_file.path.exists()  # the whole frame is refused before any handler
    await sub.stop(grace=1)


def snapshot_at(sequence: int) -> tuple[common_pb2.SignedEnvelope, common_pb2.SignedEnvelope]:
    """A signed GroupSnapshot and the signed SnapshotReference naming it."""
    payload = authority_service_pb2.GroupSnapshot(group_id=G, sequence=sequence).SerializeToString()
    digest = common_pb2.Digest(
        algorithm="blake3", hex=blake3.blake3(payload).hexdigest(), size_bytes=len(payload)
    )
    reference = pb.SnapshotReference(group_id=G, sequence=sequence, digest=digest).SerializeToString()
    return (
        sign_envelope(payload, SNAPSHOT_TYPE, AUTHORITY, AUTHORITY_ID),
        sign_envelope(reference, SNAPSHOT_REFERENCE_TYPE, AUTHORITY, AUTHORITY_ID),
    )


def too_old(sid: str, reference: common_pb2.SignedEnvelope) -> pb.ServerFrame:
    return pb.ServerFrame(
        cursor_too_old=pb.CursorTooOldFrame(subscription_id=sid, group_id=G, signed_reference=reference)
    )


@pytest.mark.req("MW-16-11", "MW-16-12")
async def test_cursor_too_old_restores_a_verified_snapshot_and_resumes_from_its_sequence(
    tmp_path: Path,
) -> None:
    restored: list[int] = []

    async def on_snapshot(snapshot: authority_service_pb2.GroupSnapshot) -> None:
        restored.append(snapshot.sequence)

    seen: list[int] = []
    host, sub, cursor_file = await offline_subscription(tmp_path, seen, on_snapshot=on_snapshot)
    snapshot, reference = snapshot_at(40)
    host.snapshot = pb.GetSnapshotResponse(snapshot=snapshot, signed_reference=reference)
    sub.deliver(too_old(sub.subscription_id, reference))
    await reach(sub, 40)
    assert restored == [40] and stored(cursor_file.path) == 40
    assert host.subscribes()[-1].after_sequence == 40  # resumes from the snapshot sequence
    sub.deliver(event_frame(sub.subscription_id, 41, 41))
    await reach(sub, 41)
    await sub.stop(grace=1)
    assert seen == [41]


@pytest.mark.req("MW-16-12")
async def test_a_tampered_snapshot_is_refused_and_nothing_is_restored(tmp_path: Path) -> None:
    restored: list[int] = []

    async def on_snapshot(snapshot: authority_service_pb2.GroupSnapshot) -> None:
        restored.append(snapshot.sequence)

    host, sub, cursor_file = await offline_subscription(tmp_path, [], on_snapshot=on_snapshot)
    snapshot, reference = snapshot_at(40)
    forged, _ = snapshot_at(41)  # validly signed, but not the snapshot the reference names
    host.snapshot = pb.GetSnapshotResponse(snapshot=forged, signed_reference=reference)
    sub.deliver(too_old(sub.subscription_id, reference))
    with pytest.raises(NotVerified):
        await reach(sub, 40)
    assert restored == [] and not cursor_file.path.exists()
    verifier = host.verifier
    ref = verifier.snapshot_reference(reference)
    snapshot.payload += b"\x01"
    with pytest.raises(NotVerified):
        verifier.snapshot(snapshot, ref)  # bad signature
    with pytest.raises(NotVerified):
        AuthorityVerifier("authority:other", bytes(AUTHORITY.verify_key)).snapshot_reference(reference)
    await sub.stop(grace=1)


def chained(
    sid: str, first: int, last: int, previous: bytes, *, splice_at: int = 0
) -> tuple[pb.ServerFrame, bytes]:
    """An EVENT frame of events [first, last] each naming its predecessor's digest, the first naming
    ``previous``; at ``splice_at`` one that names some other history. Returns the last one's digest."""
    envelopes = []
    for sequence in range(first, last + 1):
        named = blake3.blake3(b"another history").digest() if sequence == splice_at else previous
        event = event_pb2.Event(
            event_id=f"evt_{sequence:04d}",
            group_id=G,
            sequence=sequence,
            type="message.posted",
            previous_digest=named,
        )
        payload = event.SerializeToString()
        envelopes.append(sign_envelope(payload, EVENT_TYPE, AUTHORITY, AUTHORITY_ID))
        previous = blake3.blake3(payload).digest()
    frame = pb.EventFrame(
        subscription_id=sid, group_id=G, first_sequence=first, last_sequence=last, events=envelopes
    )
    return pb.ServerFrame(event=frame), previous


async def test_events_that_do_not_continue_the_chain_seen_so_far_are_refused(tmp_path: Path) -> None:
    """Each event names its predecessor's digest (event.proto); an event signed by the Authority but
    spliced in from another history fails the subscription before its handler runs."""
    seen: list[int] = []
    _, sub, cursor_file = await offline_subscription(tmp_path, seen)
    frame, link = chained(sub.subscription_id, 1, 3, b"")
    sub.deliver(frame)
    await reach(sub, 3)
    spliced, _ = chained(sub.subscription_id, 4, 6, link, splice_at=5)
    sub.deliver(spliced)
    with pytest.raises(NotVerified, match="#5 does not follow"):
        await reach(sub, 6)
    assert seen == [1, 2, 3, 4] and stored(cursor_file.path) == 4
    await sub.stop(grace=1)


@pytest.fixture(autouse=True)
def no_remembered_signatures() -> None:
    """Each test counts its own signature checks: nothing verified by an earlier test is remembered."""
    VERIFIED_EVENT_PAYLOADS.clear()


def counting_signature_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    checks: list[int] = []
    real = verification_module.verify_signature

    def counted(envelope: common_pb2.SignedEnvelope, public_key: bytes, index: int = 0) -> bool:
        checks.append(event_pb2.Event.FromString(envelope.payload).sequence)
        return real(envelope, public_key, index)

    monkeypatch.setattr(verification_module, "verify_signature", counted)
    return checks


async def test_a_chained_frame_costs_one_signature_check_yet_a_tampered_event_inside_it_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest event's signature vouches for its predecessors through previous_digest
    (AuthorityVerifier.events); an event edited inside the frame no longer hashes to the digest its
    successor names, so its own signature is checked, fails, and the whole frame is refused."""
    checks = counting_signature_checks(monkeypatch)
    seen: list[int] = []
    _, sub, cursor_file = await offline_subscription(tmp_path, seen)
    frame, link = chained(sub.subscription_id, 1, 5, b"")
    sub.deliver(frame)
    await reach(sub, 5)
    assert seen == [1, 2, 3, 4, 5] and checks == [5]
    tampered, _ = chained(sub.subscription_id, 6, 9, link)
    edited = event_pb2.Event.FromString(tampered.event.events[1].payload)
    edited.type = "message.edited"  # event 7 altered in transit, its signature left as it was
    tampered.event.events[1].payload = edited.SerializeToString()
    sub.deliver(tampered)
    with pytest.raises(NotVerified):
        await reach(sub, 9)
    assert seen == [1, 2, 3, 4, 5] and stored(cursor_file.path) == 5  # nothing of the frame was handled
    assert checks == [5, 9, 7]
    await sub.stop(grace=1)


async def test_frames_queued_behind_a_busy_handler_are_verified_as_one_chain_and_kept_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscription that fell behind checks one signature for the EVENT frames queued behind it;
    a FLOW among them is handled in its place, and a tampered event in a later frame is refused."""
    checks = counting_signature_checks(monkeypatch)
    host, gate, seen = FakeHost(), asyncio.Event(), []

    async def handler(event: event_pb2.Event) -> None:
        seen.append(event.sequence)
        if event.sequence == 1:
            await gate.wait()

    sub = Subscription(host, 1, G, handler, CursorStore(tmp_path, "bot", interval=0), credits=64)
    await sub.open()
    sid = sub.subscription_id
    frame, link = chained(sid, 1, 1, b"")
    sub.deliver(frame)
    await until(lambda: seen == [1])
    for first in (2, 4, 6):  # queued while the handler is busy with 1
        frame, link = chained(sid, first, first + 1, link)
        sub.deliver(frame)
    announced = pb.FlowFrame(
        subscription_id=sid, group_id=G, reason=pb.FLOW_REASON_CREDIT_GRANTED, delivered_sequence=9
    )
    sub.deliver(pb.ServerFrame(flow=announced))
    frame, _ = chained(sid, 8, 9, link)
    edited = event_pb2.Event.FromString(frame.event.events[0].payload)
    edited.type = "message.edited"
    frame.event.events[0].payload = edited.SerializeToString()
    sub.deliver(frame)
    gate.set()
    with pytest.raises(NotVerified):
        await reach(sub, 9)
    assert seen == list(range(1, 8)) and sub.cursor == 7
    assert checks == [1, 7, 9, 8]  # 2..7 in one chain; 8 (edited) checked on its own, and refused
    assert sub._announced == 9  # the FLOW was handled between the two batches
    await sub.stop(grace=1)


def test_events_the_chain_does_not_vouch_for_are_checked_by_their_own_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unlinked events (from before the chain) and an event after a hole in the frame each cost a
    signature check; a forged signature on one of them is refused."""
    checks = counting_signature_checks(monkeypatch)
    verifier = AuthorityVerifier(AUTHORITY_ID, bytes(AUTHORITY.verify_key))
    assert [item.event.sequence for item in verifier.events([signed_event(s) for s in (1, 2, 3)])] == [
        1,
        2,
        3,
    ]
    assert checks == [3, 2, 1]
    frame, _ = chained("s", 1, 4, b"")
    envelopes = list(frame.event.events)
    del envelopes[2]  # 3 missing (skipped): 4 vouches for nothing delivered, 2 vouches for 1
    checks.clear()
    assert [item.event.sequence for item in verifier.events(envelopes)] == [1, 2, 4]
    assert checks == [4, 2]
    forged = common_pb2.SignedEnvelope()
    forged.CopyFrom(envelopes[1])
    forged.signatures[0].sig = bytes(64)
    with pytest.raises(NotVerified):
        verifier.events([envelopes[0], forged, envelopes[2]])


def test_agents_of_one_process_check_an_events_signature_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two agents of one process receive the same frame: the second is spared the signature check
    the first made (VERIFIED_EVENT_PAYLOADS). The same payload under other signature bytes or
    another payload type, an edited payload, or a verifier that trusts another key for that key id,
    is checked as usual."""
    checks = counting_signature_checks(monkeypatch)
    first, second = (AuthorityVerifier(AUTHORITY_ID, bytes(AUTHORITY.verify_key)) for _ in range(2))
    frame, _ = chained("s", 1, 3, b"")
    envelopes = list(frame.event.events)
    assert [item.event.sequence for item in first.events(envelopes)] == [1, 2, 3]
    assert checks == [3]
    assert [item.event.sequence for item in second.events(envelopes)] == [1, 2, 3]
    assert checks == [3]  # remembered: no second check
    forged = common_pb2.SignedEnvelope()
    forged.CopyFrom(envelopes[2])
    forged.signatures[0].sig = bytes(64)
    with pytest.raises(NotVerified):
        second.events([*envelopes[:2], forged])
    assert checks == [3, 3]
    edited = event_pb2.Event.FromString(envelopes[2].payload)
    edited.type = "message.edited"
    altered = common_pb2.SignedEnvelope()
    altered.CopyFrom(envelopes[2])
    altered.payload = edited.SerializeToString()
    with pytest.raises(NotVerified):
        second.events([altered])
    retyped = common_pb2.SignedEnvelope()
    retyped.CopyFrom(envelopes[2])
    retyped.payload_type = SNAPSHOT_TYPE  # the remembered payload and signature under another type
    with pytest.raises(NotVerified):
        second.events([retyped])
    impostor = AuthorityVerifier(AUTHORITY_ID, bytes(SigningKey.generate().verify_key))
    with pytest.raises(NotVerified):
        impostor.events(envelopes)


def test_remembered_signatures_are_bounded_oldest_first_out() -> None:
    remembered = VerifiedPayloads(size=2)
    a, b, c = ((b"k", bytes([n]) * 32, b"s") for n in range(3))
    remembered.add(a)
    remembered.add(b)
    assert a in remembered  # used: now the most recent
    remembered.add(c)
    assert a in remembered and c in remembered and b not in remembered


class HeldCursorStore(CursorStore):
    """A cursor file whose writes wait for ``release``, then happen, or fail with ``crash``: the
    process dies between the handler and the write."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, "bot", interval=0)
        self.release, self.writing = threading.Event(), threading.Event()
        self.crash = False
        self.writes: list[int] = []

    def _write(self, cursors: dict[str, int]) -> None:
        self.writing.set()
        self.release.wait(10)
        if self.crash:
            raise OSError("the process died before the cursor write")
        self.writes.append(cursors[G])
        super()._write(cursors)


async def held_subscription(
    tmp_path: Path, **kw: Any
) -> tuple[FakeHost, list[int], HeldCursorStore, Subscription]:
    """A subscription fed by hand whose cursor writes wait for ``HeldCursorStore.release``."""
    host, seen = FakeHost(), []
    held = HeldCursorStore(tmp_path)

    async def handler(event: event_pb2.Event) -> None:
        seen.append(event.sequence)

    sub = Subscription(host, 1, G, handler, held, **kw)
    await sub.open()
    return host, seen, held, sub


@pytest.mark.req("MW-16-01", "MW-16-05")
async def test_the_cursor_file_is_written_behind_the_handler_once_per_batch(tmp_path: Path) -> None:
    """The handler goes on during a cursor write; the next write covers everything handled
    meanwhile, and neither the cursor nor an ACK reports what the file does not hold yet."""
    host, seen, held, sub = await held_subscription(tmp_path, credits=256)
    sub.deliver(event_frame(sub.subscription_id, 1, 1))
    await until(held.writing.is_set)  # the write of cursor 1 is under way ...
    for sequence in range(2, 11):
        sub.deliver(event_frame(sub.subscription_id, sequence, sequence))
    await until(lambda: seen == list(range(1, 11)))  # ... and the handler goes on meanwhile
    assert sub.cursor == 0 and not held.path.exists() and all(cursor == 0 for cursor, _ in host.acks())
    held.release.set()
    await reach(sub, 10)
    await until(lambda: bool(host.acks()) and host.acks()[-1][0] == 10)
    assert held.writes == [1, 10] and stored(held.path) == 10  # the first write held, then one for 2..10
    assert sum(credits for _, credits in host.acks()) == 10
    await sub.stop(grace=1)


@pytest.mark.req("MW-16-10")
async def test_a_redelivery_the_cursor_file_already_covers_gives_its_credits_back(tmp_path: Path) -> None:
    """A resubscribe while a cursor write is under way: the write lands before the replayed frame,
    which then repeats only what the file holds. Its credits must still come back in an ACK, or
    the gateway waits for them for ever (a stall seen once writes became rounds, D143)."""
    host, seen, held, sub = await held_subscription(tmp_path, credits=4)
    sub.deliver(event_frame(sub.subscription_id, 1, 4))
    await until(lambda: seen == [1, 2, 3, 4] and held.writing.is_set())
    await sub.open(resync=True)  # a new attempt from the durable cursor, 0, while 4 is being written
    held.release.set()
    await reach(sub, 4)
    sub.deliver(event_frame(sub.subscription_id, 1, 4))  # the replay: every event a duplicate
    await until(lambda: (4, 4) in host.acks())  # the replayed window's four credits, back
    assert seen == [1, 2, 3, 4] and held.writes == [4]
    await sub.stop(grace=1)


@pytest.mark.req("MW-16-05", "MW-16-10")
async def test_a_lost_frame_of_events_already_handled_is_asked_for_again(tmp_path: Path) -> None:
    """After a resubscribe from a cursor still being written, the gateway's frame repeats events the
    handler already processed; if it is lost, the FLOW that reports it delivered must still make the
    subscription ask again (gap timeout), or the gateway waits for credits that never come."""
    host, seen, held, sub = await held_subscription(tmp_path, credits=2, gap_timeout=0.1)
    sub.deliver(event_frame(sub.subscription_id, 1, 2))
    await until(lambda: seen == [1, 2] and held.writing.is_set())
    await sub.open(resync=True)  # from cursor 0, while 2 is being written
    held.release.set()
    await reach(sub, 2)
    # The replayed frame (1..2) is lost; only the FLOW saying it went out arrives.
    exhausted = pb.FlowFrame(
        subscription_id=sub.subscription_id, reason=pb.FLOW_REASON_CREDIT_EXHAUSTED, delivered_sequence=2
    )
    sub.deliver(pb.ServerFrame(flow=exhausted))
    await until(lambda: len(host.subscribes()) == 3, seconds=2)  # asked again, from the cursor
    assert host.subscribes()[-1].after_sequence == 2 and seen == [1, 2]
    await sub.stop(grace=1)


@pytest.mark.req("MW-16-01", "MW-16-05", "MW-16-10")
async def test_a_crash_before_the_batched_cursor_write_redelivers_and_never_skips(tmp_path: Path) -> None:
    """Events handled but not yet in the cursor file come to the handler again after a restart."""
    seen: list[int] = []
    first = FakeHost()
    held = HeldCursorStore(tmp_path)

    async def handler(event: event_pb2.Event) -> None:
        seen.append(event.sequence)

    sub = Subscription(first, 1, G, handler, held)
    await sub.open()
    sub.deliver(event_frame(sub.subscription_id, 1, 3))
    await until(lambda: seen == [1, 2, 3])
    held.crash = True
    held.release.set()
    with pytest.raises(SubscriptionFailed, match="cursor file"):
        await reach(sub, 3)
    assert not held.path.exists() and all(cursor == 0 for cursor, _ in first.acks())
    await sub.stop(grace=1)

    host, restarted, cursor_file = await offline_subscription(tmp_path, seen)  # the restart
    assert host.subscribes()[-1].after_sequence == 0
    restarted.deliver(event_frame(restarted.subscription_id, 1, 4))
    await reach(restarted, 4)
    await restarted.stop(grace=1)
    assert seen == [1, 2, 3, 1, 2, 3, 4] and stored(cursor_file.path) == 4


async def test_the_first_event_after_a_restored_snapshot_must_name_its_last_event_digest(
    tmp_path: Path,
) -> None:
    async def on_snapshot(snapshot: authority_service_pb2.GroupSnapshot) -> None:
        return None

    seen: list[int] = []
    host, sub, _ = await offline_subscription(tmp_path, seen, on_snapshot=on_snapshot)
    anchor = blake3.blake3(b"the event at 40").digest()
    payload = authority_service_pb2.GroupSnapshot(
        group_id=G, sequence=40, last_event_digest=anchor
    ).SerializeToString()
    digest = common_pb2.Digest(
        algorithm="blake3", hex=blake3.blake3(payload).hexdigest(), size_bytes=len(payload)
    )
    reference = sign_envelope(
        pb.SnapshotReference(group_id=G, sequence=40, digest=digest).SerializeToString(),
        SNAPSHOT_REFERENCE_TYPE,
        AUTHORITY,
        AUTHORITY_ID,
    )
    host.snapshot = pb.GetSnapshotResponse(
        snapshot=sign_envelope(payload, SNAPSHOT_TYPE, AUTHORITY, AUTHORITY_ID), signed_reference=reference
    )
    sub.deliver(too_old(sub.subscription_id, reference))
    await reach(sub, 40)
    sub.deliver(chained(sub.subscription_id, 41, 41, blake3.blake3(b"not the event at 40").digest())[0])
    with pytest.raises(NotVerified, match="#41 does not follow"):
        await reach(sub, 41)
    assert seen == []
    await sub.stop(grace=1)


def view_of(
    reference: common_pb2.SignedEnvelope, sequence: int, viewer: str
) -> tuple[common_pb2.SignedEnvelope, common_pb2.SignedEnvelope]:
    """A member's view of the snapshot ``reference`` names, and the Authority's reference to it."""
    asked = pb.SnapshotReference.FromString(reference.payload)
    payload = authority_service_pb2.GroupSnapshot(
        group_id=G, sequence=sequence, archival=True
    ).SerializeToString()
    digest = common_pb2.Digest(
        algorithm="blake3", hex=blake3.blake3(payload).hexdigest(), size_bytes=len(payload)
    )
    view = pb.SnapshotReference(
        group_id=G, sequence=sequence, digest=digest, view_of=asked.digest, viewer_id=viewer
    )
    return (
        sign_envelope(payload, SNAPSHOT_TYPE, AUTHORITY, AUTHORITY_ID),
        sign_envelope(view.SerializeToString(), SNAPSHOT_REFERENCE_TYPE, AUTHORITY, AUTHORITY_ID),
    )


@pytest.mark.req("MW-16-12", "MW-9-05")
async def test_a_members_view_of_the_snapshot_is_restored_and_a_view_for_another_is_refused(
    tmp_path: Path,
) -> None:
    """GetSnapshot may answer with the caller's view (restricted content left out, signed anew):
    restored when the Authority's reference says it is this agent's view of the snapshot asked for."""
    restored: list[authority_service_pb2.GroupSnapshot] = []

    async def on_snapshot(snapshot: authority_service_pb2.GroupSnapshot) -> None:
        restored.append(snapshot)

    host, sub, _ = await offline_subscription(tmp_path, [], on_snapshot=on_snapshot)
    _, reference = snapshot_at(40)
    view, view_reference = view_of(reference, 40, "bot")
    verifier = host.verifier
    asked = verifier.snapshot_reference(reference)
    for wrong in (
        view_of(reference, 40, "someone-else")[1],
        view_of(snapshot_at(39)[1], 40, "bot")[1],
        view_of(reference, 41, "bot")[1],
    ):
        with pytest.raises(NotVerified):
            verifier.answering(wrong, asked, "bot")
    host.snapshot = pb.GetSnapshotResponse(snapshot=view, signed_reference=view_reference)
    sub.deliver(too_old(sub.subscription_id, reference))
    await reach(sub, 40)
    assert [s.archival for s in restored] == [True]  # the view, not the snapshot asked for
    await sub.stop(grace=1)


async def test_cursor_too_old_without_a_restore_handler_fails_the_subscription(tmp_path: Path) -> None:
    _, sub, _ = await offline_subscription(tmp_path, [])
    sub.deliver(too_old(sub.subscription_id, snapshot_at(40)[1]))
    with pytest.raises(SubscriptionFailed, match="on_snapshot"):
        await reach(sub, 40)
    await sub.stop(grace=1)


class _RecordingLink:
    def __init__(self) -> None:
        self.frames: list[pb.ClientFrame] = []

    async def send(self, frame: pb.ClientFrame) -> None:
        self.frames.append(frame)


@pytest.mark.req("MW-16-07")
async def test_acks_of_all_subscriptions_are_coalesced_into_one_frame(tmp_path: Path) -> None:
    """An ACK frame reports one or more cursors: ACKs queued within ACK_COALESCE_S leave as one frame,
    per subscription the highest cursor and the sum of the credits; a stream that ends in between
    drops them (the next attempt subscribes from the cursor file)."""
    agent = Agent("127.0.0.1:1", "coord-bot", SigningKey.generate(), cursor_dir=tmp_path)
    link = _RecordingLink()
    agent._link = link  # type: ignore[assignment]

    def ack(sid: str, cursor: int, credits: int) -> pb.CursorAck:
        return pb.CursorAck(subscription_id=sid, group_id=G, cursor=cursor, credits=credits)

    for cursor_ack in (ack("s1", 3, 3), ack("s2", 5, 1), ack("s1", 4, 1)):
        agent._queue_ack(cursor_ack)
    assert link.frames == []  # held for the coalescing window
    await asyncio.sleep(sdk.ACK_COALESCE_S * 10)
    assert len(link.frames) == 1
    sent = {c.subscription_id: (c.cursor, c.credits) for c in link.frames[0].ack.cursors}
    assert sent == {"s1": (4, 4), "s2": (5, 1)}
    # The stream ends and another one starts before the window closes: the old ACKs are dropped.
    agent._queue_ack(ack("s1", 6, 2))
    agent._link = _RecordingLink()  # type: ignore[assignment]
    await asyncio.sleep(sdk.ACK_COALESCE_S * 10)
    assert len(link.frames) == 1 and agent._link.frames == []  # type: ignore[attr-defined]


# ------------------------------------------------------------------ against the mesh


@pytest.mark.req("MW-16-01", "MW-16-02", "MW-16-03", "MW-16-05", "MW-16-06", "MW-16-07", "MW-16-10")
async def test_every_event_once_and_in_order_across_a_dropped_stream_and_a_restart(
    world: World, tmp_path: Path
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    state = tmp_path / "agent-state"
    await post_messages(w, conv, range(60))
    seen: list[int] = []
    async with connect(w, "coord-bot", w.coordinator.key, state) as agent:

        async def handler(event: event_pb2.Event) -> None:
            seen.append(event.sequence)
            if len(seen) in (25, 70):
                agent.reconnect()  # kill the stream mid-way, twice, with frames in flight
            await asyncio.sleep(0)

        sub = await agent.subscribe(G, handler, credits=8)
        await post_messages(w, conv, range(60, 120))  # live appends while it catches up
        head = (await w.client.group_state(G)).head_sequence
        await reach(sub, head)
        epoch = agent.session.session_epoch
    assert seen == list(range(1, head + 1))  # nothing lost, nothing twice, in order
    cursor_path = state / "coord-bot" / "cursors.json"
    assert stored(cursor_path) == head

    # The final ACK reached the gateway: stored when the gateway sees the stream end, which it may
    # do after the agent's close has returned.
    async def final_ack_stored() -> bool:
        return await gateway_cursor(w, "coord-bot") == head

    await polled(final_ack_stored)

    await post_messages(w, conv, range(120, 130))  # while the agent is away
    again: list[int] = []

    async def record(event: event_pb2.Event) -> None:
        again.append(event.sequence)

    async with connect(w, "coord-bot", w.coordinator.key, state) as agent:
        assert agent.session.session_epoch == epoch  # the saved session is reused
        sub = await agent.subscribe(G, record, credits=8)
        new_head = (await w.client.group_state(G)).head_sequence
        await reach(sub, new_head)
    assert again == list(range(head + 1, new_head + 1))  # resumed from the cursor file
    assert stored(cursor_path) == new_head


@pytest.mark.req("MW-16-05", "MW-16-06", "MW-9-05")
async def test_restricted_messages_are_skipped_yet_the_cursor_reaches_the_head(
    world: World, tmp_path: Path
) -> None:
    w = world
    await create(w)
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    secret = conversation_pb2.ConversationOpen(
        conversation_id="conv_secret", kind=conversation_pb2.CONVERSATION_KIND_RESTRICTED, title="s"
    )
    await w.run(w.coordinator, G, "conversation_open", secret, membership_epoch=2)
    await w.run(w.owner, G, "message_post", builders.message("conv_secret", "hunter2"), membership_epoch=1)
    head = (await w.client.group_state(G)).head_sequence
    seen: list[event_pb2.Event] = []

    async def handler(event: event_pb2.Event) -> None:
        seen.append(event)

    async with connect(w, "worker-bot", w.worker.key, tmp_path) as agent:
        sub = await agent.subscribe(G, handler)
        await reach(sub, head)
    assert stored(tmp_path / "worker-bot" / "cursors.json") == head
    assert seen and seen[-1].sequence < head - 1  # the last two events were skipped, not delivered
    assert not any(e.message_posted.content.text == "hunter2" for e in seen)


@pytest.mark.req("MW-16-13", "MW-16-14")
async def test_commands_over_the_stream_are_idempotent_and_refusals_are_typed(
    world: World, tmp_path: Path
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    async with connect(w, "coord-bot", w.coordinator.key, tmp_path) as agent:
        once = sdk.post_message(conv, "once", mentions=["alice"])
        first = await agent.execute(G, once, command_id="cmd_once")
        again = await agent.execute(G, once, command_id="cmd_once")
        assert not first.replayed and again.replayed and again.group_revision == first.group_revision
        with pytest.raises(CommandRejected) as reused:
            await agent.execute(G, sdk.post_message(conv, "other"), command_id="cmd_once")
        assert reused.value.reason_name == "COMMAND_ID_REUSED" and reused.value.command_id == "cmd_once"
        with pytest.raises(CommandRejected) as stale:
            await agent.execute(G, "message_post", builders.message(conv, "x"), membership_epoch=7)
        assert stale.value.rejection.reason == common_pb2.REJECTION_REASON_MEMBERSHIP_EPOCH_STALE
        agent.reconnect()
        late = await agent.execute(G, sdk.post_message(conv, "sent while the stream was down"))
        assert late.group_revision > first.group_revision
    texts = [e.message_posted.content.text async for e in w.client.read_events(G)]
    assert texts.count("once") == 1 and texts.count("sent while the stream was down") == 1
    key = agent.idempotency_key("mis_1", "wi-1", 2, "send-invoice")
    assert (
        key
        == attempt_key("mis_1", "wi-1", 2, "send-invoice")
        == Agent.idempotency_key("mis_1", "wi-1", 2, "send-invoice")
    )


async def test_typed_builders_drive_a_work_item_over_the_stream(world: World, tmp_path: Path) -> None:
    w = world
    flow = await work.setup(w)
    for item in ("wi-1", "wi-2"):
        await flow.authorize(item)
    offers = [await flow.offer(item, "worker-bot") for item in ("wi-1", "wi-2")]
    async with connect(w, "worker-bot", w.worker.key, tmp_path) as agent:
        accepted = await agent.execute(G, sdk.accept_offer("wi-1", offers[0], 1))
        epoch = decode_events(accepted.events)[0].work_offer_accepted.ownership.ownership_epoch
        await agent.execute(G, sdk.start_work("wi-1", epoch, lease_id="lease-a", lease_seconds=30))
        await agent.execute(G, sdk.renew_lease("wi-1", "lease-a", epoch, lease_seconds=30))
        done = [agent.idempotency_key(G, "wi-1", epoch, "fetch-ledger")]
        await agent.execute(G, sdk.checkpoint("wi-1", "lease-a", epoch, "ck-1", completed_operation_ids=done))
        await agent.execute(
            G, sdk.start_work("wi-1", epoch, lease_id="lease-b", resume_from_checkpoint_id="ck-1")
        )
        evidence = [builders.evidence()]
        body = sdk.submit(
            "wi-1",
            "lease-b",
            epoch,
            1,
            evidence,
            artifacts=[await w.deliverable(w.worker, G, "wi-1")],
            summary="done",
        )
        submitted = await agent.execute(G, body)
        accepted = await agent.execute(G, sdk.accept_offer("wi-2", offers[1], 1))
        epoch2 = decode_events(accepted.events)[0].work_offer_accepted.ownership.ownership_epoch
        await agent.execute(G, sdk.start_work("wi-2", epoch2, lease_id="lease-c"))
        failure = sdk.fail(
            "wi-2",
            "lease-c",
            epoch2,
            wp.WORK_FAILURE_KIND_PERMANENT,
            "source gone",
            [builders.evidence("ev-fail")],
        )
        failed = await agent.execute(G, failure)
    assert decode_events(submitted.events)[0].type == "work.submitted"
    assert decode_events(failed.events)[0].type == "work.failed"
    assert await flow.item_state("wi-1") == wp.WORK_ITEM_STATE_SUBMITTED
    assert await flow.item_state("wi-2") == wp.WORK_ITEM_STATE_FAILED


def load_example(name: str) -> Any:
    path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"examples_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_echo_example_answers_mentions_once(world: World, tmp_path: Path) -> None:
    w = world
    echo = load_example("echo_agent")
    conv = (await create(w)).mission.planning_conversation_id
    mention = builders.message(conv, "@coord-bot are you there?")
    await w.run(w.owner, G, "message_post", mention, membership_epoch=1)
    await w.run(
        w.owner, G, "message_post", builders.message(conv, "@coord-bots is someone else"), membership_epoch=1
    )
    structured = builders.message(conv, "ping", mentions=["coord-bot"])
    await w.run(w.owner, G, "message_post", structured, membership_epoch=1)
    async with connect(w, "coord-bot", w.coordinator.key, tmp_path) as agent:
        head = (await w.client.group_state(G)).head_sequence
        sub = await echo.start(agent, G)
        await reach(sub, head + 2)  # the two replies are appended and seen (and ignored) too
    events = [e async for e in w.client.read_events(G)]
    replies = [
        e.message_posted.content.text
        for e in events
        if e.actor_id == "coord-bot" and e.type == "message.posted"
    ]
    assert replies == ["echo: @coord-bot are you there?", "echo: ping"]


@pytest.mark.req("MW-8-09", "MW-8-13", "MW-13.3-03")
async def test_a_late_joiner_fetches_cited_history_through_the_sdk(world: World, tmp_path: Path) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    await post_messages(w, conv, range(3))
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    head = (await w.client.group_state(G)).head_sequence
    package = (
        await w.client.authority.GetContextPackage(
            authority_service_pb2.GetContextPackageRequest(group_id=G, recipient_ids=["worker-bot"])
        )
    ).package
    async with connect(w, "worker-bot", w.worker.key, tmp_path) as agent:
        plain = await agent.fetch(G, 1, head + 2)
        assert [e.sequence for e in plain.events] == [head] and plain.withheld == [
            (1, head - 1),
            (head + 1, head + 2),
        ]
        cited = await agent.fetch(G, 1, head, context_package=package)
        assert [e.sequence for e in cited.events] == list(range(1, head + 1)) and cited.withheld == []
        assert cited.events[-2].message_posted.content.text == "m2"  # the last message before the grant
        with pytest.raises(sdk.GatewayError):
            await agent.fetch(G, 1, 5_000)


@pytest.mark.req("MW-11.3-09")
async def test_an_agent_whose_session_another_process_replaced_stops_instead_of_fencing_it_back(
    world: World, tmp_path: Path
) -> None:
    """Two processes running as one identity must not fence each other in turn: the one whose
    session was replaced while it ran stops with SessionReplaced (it opened none of its own)."""
    w = world
    await create(w)
    async with connect(w, "coord-bot", w.coordinator.key, tmp_path / "first") as agent:
        sub = await agent.subscribe(G, _ignore, credits=8)
        await sub.reached(1)
        other = await w.client.open_session("coord-bot", w.coordinator.key)  # the other process
        async with asyncio.timeout(20):
            with pytest.raises(sdk.SessionReplaced, match="replaced by a newer one"):
                await sub.reached(10**9)
    state = await w.client.membership.GetIdentity(
        membership_service_pb2.GetIdentityRequest(identity_id="coord-bot")
    )
    assert state.identity.session_epoch == other.session_epoch  # the other process's session is still current


async def _ignore(event: event_pb2.Event) -> None:
    return None
