"""The SQLite group-commit writer process (missionweave_server/services/authority/writer_process.py, D53).

Its death must never lose or duplicate an append: a batch whose outcome is unknown is reported as
OVERLOADED, the Authority re-reads the log and replays a command that did land or decides it again,
and the next batch gets a new writer process.
"""

from __future__ import annotations

import asyncio
import io
import os
import pickle
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from missionweave.kernel.clock import ManualClock
from missionweave.kernel.errors import Rejected
from missionweave.kernel.signing import EVENT_TYPE, signed_envelope, verify_signature
from missionweave.v1 import authority_service_pb2, common_pb2
from missionweave_server.services.authority.group_commit import BatchWriter
from missionweave_server.services.authority.store import EventStore
from missionweave_server.services.authority.writer_process import (
    EventSigner,
    WriterLost,
    WriterProcess,
    decode_batch,
    decode_outcomes,
    encode_batch,
    encode_outcomes,
)
from tests import builders
from tests.conftest import World
from tests.test_grpc_authority import create_mission
from tests.test_store import engine, request  # noqa: F401 (the engine fixture)

R = common_pb2.RejectionReason


def sqlite_writer(store: EventStore) -> WriterProcess:
    writer = store._sqlite_writer
    if writer is None:
        pytest.skip("PostgreSQL commits through SQLAlchemy in the server's process: no writer process")
    return writer


async def kill(writer: WriterProcess) -> None:
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGKILL)
    assert writer._process is not None
    await writer._process.wait()


def test_frames_round_trip_every_field_of_an_append_and_its_outcome() -> None:
    async def go() -> None:
        req = request("g1", 3, 7, 2, "cmd")
        req.rewrites = [(2, b"erased")]
        req.payloads = [b"p1", b"p2"]
        records, now, _ = decode_batch(encode_batch([req], 1234))
        assert now == 1234 and records[0].payloads == [b"p1", b"p2"]
        (got,) = records
        assert (
            got.group_id,
            got.writer_epoch,
            got.expected_head,
            got.command_id,
            got.fingerprint,
            got.creates_group,
        ) == ("g1", 3, 7, "cmd", b"fp-cmd", False)
        assert got.events == req.events and got.rewrites == [(2, b"erased")]
        outcomes, sigs = decode_outcomes(
            encode_outcomes(
                [None, Rejected(R.REJECTION_REASON_WRITER_FENCED, "fenced", current_writer_epoch=4)],
                [[b"s"], []],
            )
        )
        assert outcomes[0] is None and isinstance(outcomes[1], Rejected) and sigs == [[b"s"], []]
        assert (outcomes[1].reason, outcomes[1].message, outcomes[1].metadata) == (
            R.REJECTION_REASON_WRITER_FENCED,
            "fenced",
            {"current_writer_epoch": "4"},
        )

    asyncio.run(go())


def test_the_writer_signs_handed_over_payloads_into_the_envelopes_it_stores() -> None:
    """D56: the stored envelope is the payload signed by the Authority's key (DSSE PAE), and the
    signature it answers rebuilds exactly those bytes."""
    key = SigningKey(b"\x05" * 32)

    async def go() -> None:
        req = request("g1", 1, 0, 2, "cmd")
        req.payloads = [b"event-one", b"event-two"]
        records, _, _ = decode_batch(encode_batch([req], 0))
        (sigs,) = EventSigner(key.encode(), "authority:test").seal(records)
        for event, payload, sig in zip(records[0].events, req.payloads, sigs, strict=True):
            envelope = common_pb2.SignedEnvelope.FromString(event.envelope)
            assert envelope.payload == payload and envelope.payload_type == EVENT_TYPE
            assert envelope.signatures[0].key_id == "authority:test"
            assert verify_signature(envelope, bytes(key.verify_key))
            assert (
                signed_envelope(payload, EVENT_TYPE, "authority:test", sig).SerializeToString()
                == event.envelope
            )
        # An append without payloads keeps the envelopes it came with.
        plain = request("g2", 1, 0, 1, "c")
        records, _, _ = decode_batch(encode_batch([plain], 0))
        assert EventSigner(key.encode(), "k").seal(records) == [[]] and records[0].events == plain.events

    asyncio.run(go())


async def test_results_carry_the_envelopes_the_log_stores(world: World) -> None:
    """Whoever signs (writer process or event loop), the answer and the log hold the same bytes."""
    conv = await create_mission(world, "grp_wp0")
    head = (await world.client.group_state("grp_wp0")).head_sequence
    post = world.owner.sign(
        world.owner.command(
            "grp_wp0", "message_post", builders.message(conv, "same bytes"), membership_epoch=1
        )
    )
    result = await world.client.execute(post)
    call = world.client.authority.ReadEvents(
        authority_service_pb2.ReadEventsRequest(group_id="grp_wp0", after_sequence=head)
    )
    stored = [env async for batch in call for env in batch.events]
    assert [e.SerializeToString() for e in result.events] == [e.SerializeToString() for e in stored]
    key = await world.client.authority.GetAuthorityKey(authority_service_pb2.GetAuthorityKeyRequest())
    assert all(verify_signature(e, key.public_key) for e in stored)


async def test_a_writer_dying_with_a_batch_fails_it_as_overloaded_and_nothing_is_written(engine: Any) -> None:  # noqa: F811
    store = EventStore(engine, ManualClock())
    writer = sqlite_writer(store)
    await store.append(request("g1", 1, 0, 1, "c0", create=True))
    first_pid = writer.pid
    assert first_pid is not None
    os.kill(first_pid, signal.SIGSTOP)  # it stops reading: the next frame waits in the pipe
    pending = asyncio.ensure_future(store.append(request("g1", 1, 1, 1, "c1")))
    await asyncio.sleep(0.2)
    assert not pending.done()
    await kill(writer)
    with pytest.raises(Rejected) as info:
        await pending
    assert info.value.reason == R.REJECTION_REASON_OVERLOADED and "retry_after_ms" in info.value.metadata
    assert await store.head("g1") == 1 and await store.find_command("g1", "c1") is None  # nothing written
    await store.append(request("g1", 1, 1, 1, "c1"))  # retried: a new writer process takes it
    assert writer.pid != first_pid
    assert [e.sequence for e in await store.read("g1")] == [1, 2]
    await store.close()


async def test_a_writer_found_dead_between_batches_is_replaced_before_the_next_one(engine: Any) -> None:  # noqa: F811
    store = EventStore(engine, ManualClock())
    writer = sqlite_writer(store)
    await store.append(request("g1", 1, 0, 1, "c0", create=True))
    first_pid = writer.pid
    await kill(writer)
    await store.append(request("g1", 1, 1, 1, "c1"))
    assert writer.pid != first_pid and await store.head("g1") == 2
    await store.close()


async def test_writer_lost_after_commit_the_command_is_answered_once_from_the_log(world: World) -> None:
    """The worst case: the batch landed but its answer was lost with the process. The Authority
    re-reads the log and answers from it; nothing is appended twice."""
    store = world.mesh.store  # type: ignore[attr-defined]
    writer = sqlite_writer(store)
    conv = await create_mission(world, "grp_wp1")
    head = (await world.client.group_state("grp_wp1")).head_sequence
    original = writer.commit
    lost: list[int] = []

    async def commit_then_lose(batch: Any, now_us: int) -> Any:
        outcomes = await original(batch, now_us)
        if not lost:
            lost.append(len(batch))
            raise WriterLost("simulated: the answer did not come back")
        return outcomes

    writer.commit = commit_then_lose  # type: ignore[method-assign]
    post = world.owner.sign(
        world.owner.command("grp_wp1", "message_post", builders.message(conv, "once"), membership_epoch=1)
    )
    result = await world.client.execute(post)
    assert lost == [1]
    assert result.group_revision == head + 1 and len(result.events) == 1
    stored = [e async for e in world.client.read_events("grp_wp1", after=head)]
    assert [e.sequence for e in stored] == [head + 1]
    replay = await world.client.execute(post)  # and a client retry is still answered, not appended
    assert replay.replayed and (await world.client.group_state("grp_wp1")).head_sequence == head + 1


async def test_commands_keep_landing_after_the_writer_process_is_killed(world: World) -> None:
    store = world.mesh.store  # type: ignore[attr-defined]
    writer = sqlite_writer(store)
    conv = await create_mission(world, "grp_wp2")
    head = (await world.client.group_state("grp_wp2")).head_sequence
    await kill(writer)
    for i in range(3):
        post = world.owner.sign(
            world.owner.command(
                "grp_wp2", "message_post", builders.message(conv, f"m{i}"), membership_epoch=1
            )
        )
        result = await world.client.execute(post)
        assert result.group_revision == head + 1 + i and not result.replayed
    authority = world.mesh.authority  # type: ignore[attr-defined]
    assert (await authority.fold("grp_wp2")).head_sequence == head + 3


def test_a_batch_the_database_refuses_is_answered_overloaded_and_the_writer_goes_on(tmp_path: Path) -> None:
    """A commit that fails inside SQLite (say the file stayed locked past busy_timeout) is rolled
    back and refused as a whole; the process keeps serving the next batch."""
    from missionweave_server.services.authority.writer_process import serve
    from missionweave_server.verification.pipe_frames import frame, read_frame

    class FlakyWriter(BatchWriter):
        calls = 0

        def write(self, ops: Any, batch: Any, now: int) -> list[Rejected | None]:
            self.calls += 1
            if self.calls == 1:
                raise sqlite3.OperationalError("database is locked")
            return [None] * len(batch)

    async def frames() -> bytes:
        batch = encode_batch(
            [request("g1", 1, 0, 1, "a", create=True), request("g2", 1, 0, 1, "b", create=True)], 0
        )
        first = pickle.dumps((None, ""))
        return b"".join(frame(f) for f in (first, batch, batch))

    source, sink = io.BytesIO(asyncio.run(frames())), io.BytesIO()
    conn = sqlite3.connect(tmp_path / "unused.db")
    serve(source, sink, conn, FlakyWriter("local", 1))
    sink.seek(0)
    answers = []
    while (answer := read_frame(sink)) is not None:
        answers.append(decode_outcomes(answer)[0])
    refused, accepted = answers
    assert all(
        isinstance(o, Rejected) and o.reason == R.REJECTION_REASON_OVERLOADED and "locked" in o.message
        for o in refused
    )
    assert accepted == [None, None]
