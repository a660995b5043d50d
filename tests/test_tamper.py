"""Tamper-evident storage (issue 13 item 5, docs/integrity.md): every event the Authority loads,
replays or serves is checked (signature, place, chain); a Group that fails is refused with
DATA_CORRUPTED through the public API while other Groups go on, health shows it, and ``mwp verify``
finds every kind of tampering offline. SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY
from sqlalchemy import delete, select, update

from missionweave.cli import main as mwp
from missionweave.kernel import codec
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import EVENT_TYPE, sign_envelope
from missionweave.sdk.client import decode_events
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import common_pb2, mission_pb2
from missionweave_server.services.authority.schema import commands, events, events_archive, groups
from tests import builders
from tests.conftest import World
from tests.test_missions import create

R = common_pb2.RejectionReason
G = "grp_tampered"
OTHER = "grp_bystander"
INTEGRITY = "missionweave.authority.integrity"
KINDS = ["edit_owner", "delete_row", "swap_envelopes", "reorder_seq", "foreign_event", "fork"]


# ------------------------------------------------------------------ helpers


async def posted(w: World, group: str, text: str) -> Any:
    conv = (await w.client.group_state(group)).mission.planning_conversation_id
    result = await w.run(w.owner, group, "message_post", builders.message(conv, text), membership_epoch=1)
    return decode_events(result.events)[-1]


async def post(w: World, group: str, text: str) -> int:
    return int((await posted(w, group, text)).sequence)


async def rows(w: World, group: str) -> dict[int, dict[str, Any]]:
    async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
        found = (await conn.execute(select(events).where(events.c.group_id == group))).mappings().all()
    return {int(r["seq"]): dict(r) for r in found}


async def write(w: World, *statements: Any) -> None:
    async with w.mesh.engine.begin() as conn:  # type: ignore[attr-defined]
        for statement in statements:
            await conn.execute(statement)


def at(group: str, seq: int) -> Any:
    return (events.c.group_id == group) & (events.c.seq == seq)


def forget(w: World) -> None:
    """As after a restart: nothing of the Groups in memory (the store is read again)."""
    authority = w.mesh.authority  # type: ignore[attr-defined]
    authority._cache.clear()
    authority.tails._tails.clear()


async def rejection_of(call: Any) -> common_pb2.Rejection:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.DATA_LOSS, info.value
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None
    return rejection


async def read_all(w: World, group: str) -> list[common_pb2.SignedEnvelope]:
    return [
        e
        async for r in w.client.authority.ReadEvents(apb.ReadEventsRequest(group_id=group))
        for e in r.events
    ]


async def health(w: World, name: str) -> str:
    stub = health_pb2_grpc.HealthStub(w.client.channel)
    answer = await stub.Check(health_pb2.HealthCheckRequest(service=name))
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


async def verify_cli(w: World, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """``mwp verify --json`` on the test's store (in a thread: it runs an event loop of its own)."""
    capsys.readouterr()
    code = await asyncio.to_thread(
        mwp,
        [
            "verify",
            "--database-url",
            w.settings.db_url,
            "--authority-key",
            str(w.settings.authority_key_path),
            "--json",
        ],
    )
    return code, json.loads(capsys.readouterr().out)


async def tamper(w: World, kind: str) -> int:
    """Tampers with G's stored log; returns the sequence at which the damage is found."""
    stored = await rows(w, G)
    if kind == "edit_owner":
        # Rewrite mission.created so that the Worker owns the Mission (keeps the old signature).
        signed = codec.envelope(stored[1]["envelope"])
        event = codec.event_of(signed)
        event.mission_created.definition.owner_id = "worker-bot"
        signed.payload = event.SerializeToString(deterministic=True)
        await write(w, update(events).where(at(G, 1)).values(envelope=signed.SerializeToString()))
        return 1
    if kind == "delete_row":
        await write(w, delete(events).where(at(G, 5)))
        return 6
    if kind == "swap_envelopes":
        await write(
            w,
            update(events).where(at(G, 4)).values(envelope=stored[5]["envelope"]),
            update(events).where(at(G, 5)).values(envelope=stored[4]["envelope"]),
        )
        return 4
    if kind == "reorder_seq":
        await write(
            w,
            update(events).where(at(G, 4)).values(seq=1004),
            update(events).where(at(G, 5)).values(seq=4),
            update(events).where(at(G, 1004)).values(seq=5),
        )
        return 4
    if kind == "foreign_event":
        other = (await rows(w, OTHER))[4]
        await write(w, update(events).where(at(G, 4)).values(envelope=other["envelope"]))
        return 4
    raise AssertionError(kind)


async def fork(w: World) -> int:
    """A validly signed event of a discarded branch put back in the log: only the chain shows it."""
    head = await post(w, G, "branch A")
    discarded = (await rows(w, G))[head]
    await write(
        w,
        delete(events).where(at(G, head)),
        delete(commands).where((commands.c.group_id == G) & (commands.c.first_seq == head)),
        update(groups).where(groups.c.group_id == G).values(head_seq=head - 1),
    )
    forget(w)
    assert await post(w, G, "branch B") == head  # the log goes on from head - 1: a fork
    await post(w, G, "after B")
    await write(
        w,
        update(events)
        .where(at(G, head))
        .values(**{k: discarded[k] for k in ("event_id", "type", "envelope")}),
    )
    return head + 1


# ------------------------------------------------------------------ the public API


async def checkpoint(w: World, group: str) -> int | None:
    """Loads ``group`` afresh so that the Authority leaves a signed chain checkpoint at its head."""
    authority = w.mesh.authority  # type: ignore[attr-defined]
    authority.checkpoint_every, every = 1, authority.checkpoint_every
    try:
        forget(w)
        authority.integrity.verified._known.clear()
        await w.client.group_state(group)
    finally:
        authority.checkpoint_every = every
    found = await authority.store.chain_checkpoint(group)
    return None if found is None else int(found[0])


@pytest.mark.req("MW-7.4-01", "MW-7.4-05", "MW-16-05")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("checkpointed", [False, True], ids=["full", "checkpointed"])
async def test_a_tampered_group_is_refused_data_corrupted_while_others_are_served(
    world: World, kind: str, checkpointed: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 13 item 5: edited, deleted, swapped, reordered, foreign and forked rows are each found,
    also below a signed chain checkpoint (where only the hash chain is checked, not each signature);
    the Group is refused (ReadEvents, GetGroupState, ExecuteCommand), never served or extended; the
    bystander Group still works; health and ``mwp verify`` name it."""
    w = world
    for group in (G, OTHER):
        await create(w, group)
        for i in range(4):
            await post(w, group, f"{group} message {i}")
    assert await health(w, INTEGRITY) == "SERVING"
    code, clean = await verify_cli(w, capsys)
    head_before = (await w.client.group_state(G)).head_sequence
    assert code == 0 and clean["clean"] and clean["events"] == 2 * head_before, clean
    if checkpointed:
        assert await checkpoint(w, G) == head_before

    sequence = await fork(w) if kind == "fork" else await tamper(w, kind)
    forget(w)
    refused_logs = REGISTRY.get_sample_value("mwp_log_verification_failures_total") or 0.0

    # Served and rebuilt logs are checked: refused whichever call comes first.
    rejection = await rejection_of(read_all(w, G))
    # Counted once, when found (the operator's alert), however often the Group is refused after.
    assert (REGISTRY.get_sample_value("mwp_log_verification_failures_total") or 0.0) - refused_logs == 1
    assert rejection.reason == R.REJECTION_REASON_DATA_CORRUPTED
    assert rejection.metadata["group_id"] == G and rejection.metadata["sequence"] == str(sequence), (
        rejection.message
    )
    assert (await rejection_of(w.client.group_state(G))).reason == R.REJECTION_REASON_DATA_CORRUPTED
    # Never extended: not even the rewritten "owner" may cancel, and the real owner may not post.
    impostor = w.run(
        w.worker, G, "mission_cancel", mission_pb2.MissionCancel(reason="mine now"), membership_epoch=1
    )
    assert (await rejection_of(impostor)).reason == R.REJECTION_REASON_DATA_CORRUPTED
    assert (await rejection_of(post(w, G, "more"))).reason == R.REJECTION_REASON_DATA_CORRUPTED
    async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
        head = (await conn.execute(select(groups.c.head_seq).where(groups.c.group_id == G))).scalar_one()
    assert head <= head_before + (2 if kind == "fork" else 0)  # nothing appended after the damage

    # The other Group is untouched by it.
    assert await post(w, OTHER, "still here") == head_before + 1
    assert len(await read_all(w, OTHER)) == head_before + 1
    # Health: the integrity entry and the Group's own entry; the Authority itself still serves.
    assert await health(w, INTEGRITY) == "NOT_SERVING"
    assert await health(w, f"{INTEGRITY}/{G}") == "NOT_SERVING"
    assert await health(w, "missionweave.v1.AuthorityService") == "SERVING"

    code, report = await verify_cli(w, capsys)
    assert code == 1 and report["corrupted_groups"] == [G], report
    assert report["findings"][0]["sequence"] == sequence


@pytest.mark.req("MW-7.4-01")
async def test_without_the_chain_check_a_fork_would_be_served(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork is caught by the chain alone (signature, sequence and ids are all valid): with the
    chain rule off, the tampered log would be served. The rule broken once, as a guard on the tests."""
    from missionweave.kernel import eventlog

    w = world
    await create(w, G)
    await post(w, G, "one")
    await fork(w)
    forget(w)
    original = eventlog.Chain.advance

    def without_chain(self: eventlog.Chain, checked: eventlog.Checked) -> None:
        self.previous = None  # forget the predecessor's digest: no link is compared
        original(self, checked)

    monkeypatch.setattr(eventlog.Chain, "advance", without_chain)
    served = await read_all(w, G)  # served: the discarded branch's event among them
    assert any(b"branch A" in e.payload for e in served)
    monkeypatch.undo()
    forget(w)
    w.mesh.authority.integrity.verified._known.clear()  # type: ignore[attr-defined]
    assert (await rejection_of(read_all(w, G))).reason == R.REJECTION_REASON_DATA_CORRUPTED


@pytest.mark.req("MW-7.4-01", "MW-16-05")
async def test_a_truncated_log_is_refused_when_the_group_is_loaded(world: World) -> None:
    """A deleted last row leaves no gap to see in the log: the Group row's head shows it."""
    w = world
    await create(w, G)
    last = await post(w, G, "the last word")
    await write(w, delete(events).where(at(G, last)))
    forget(w)
    rejection = await rejection_of(post(w, G, "more"))
    assert rejection.metadata["sequence"] == str(last)


@pytest.mark.req("MW-7.4-04", "MW-7.4-05", "MW-16-12")
async def test_erased_and_compacted_logs_verify_and_restored_content_is_caught(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Erasure re-signs events with their content cleared; the chain runs over the original event
    digests the markers keep, across the online/archive boundary and the snapshot. Putting the
    erased original back is found."""
    from tests.test_erasure import erase

    w = world
    await create(w, G)
    secret = await posted(w, G, "the secret")
    secret_seq = int(secret.sequence)
    original = (await rows(w, G))[secret_seq]
    await post(w, G, "before the snapshot")
    taken = await w.client.authority.TakeSnapshot(apb.TakeSnapshotRequest(group_id=G, compact=True))
    snapshot = apb.GroupSnapshot.FromString(taken.snapshot.payload)
    assert len(snapshot.last_event_digest) == 32
    await post(w, G, "after the snapshot")
    await w.run(w.owner, G, "message_amend", erase(secret.message_posted.message_id), membership_epoch=1)
    await post(w, G, "after the erasure")
    forget(w)
    log = await read_all(w, G)
    erased = codec.event_of(log[secret_seq - 1])
    assert erased.HasField("redaction") and len(erased.redaction.original_event_digest) == 32
    assert codec.event_of(log[secret_seq]).previous_digest == erased.redaction.original_event_digest
    assert codec.event_of(log[taken.sequence]).previous_digest == snapshot.last_event_digest
    assert (await w.client.group_state(G)).head_sequence == len(log)
    code, report = await verify_cli(w, capsys)
    assert code == 0 and report["snapshots"] == 1, report

    # The original, kept by someone, put back in the archive tier in place of the erased copy.
    async with w.mesh.engine.begin() as conn:  # type: ignore[attr-defined]
        await conn.execute(
            update(events_archive)
            .where((events_archive.c.group_id == G) & (events_archive.c.seq == secret_seq))
            .values(envelope=original["envelope"])
        )
    forget(w)
    w.mesh.authority.integrity.verified._known.clear()  # type: ignore[attr-defined]
    rejection = await rejection_of(w.client.group_state(G))
    assert rejection.metadata["sequence"] == str(secret_seq)
    code, report = await verify_cli(w, capsys)
    assert code == 1 and report["findings"][0]["sequence"] == secret_seq


@pytest.mark.req("MW-16-12")
async def test_a_tampered_snapshot_is_found_offline(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    from missionweave_server.services.authority.schema import snapshots

    w = world
    await create(w, G)
    await post(w, G, "one")
    await w.client.authority.TakeSnapshot(apb.TakeSnapshotRequest(group_id=G))
    async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
        envelope = (await conn.execute(select(snapshots.c.envelope))).scalar_one()
    signed = common_pb2.SignedEnvelope.FromString(envelope)
    signed.payload = signed.payload.replace(b"alice", b"mallo")
    async with w.mesh.engine.begin() as conn:  # type: ignore[attr-defined]
        await conn.execute(update(snapshots).values(envelope=signed.SerializeToString()))
    code, report = await verify_cli(w, capsys)
    assert code == 1 and "snapshot" in report["findings"][0]["detail"], report


@pytest.mark.req("MW-7.4-01")
async def test_a_log_from_before_the_chain_verifies_by_signature_and_sequence(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """D64: events without a chain link (stores of earlier releases) verify up to the first linked
    event; new appends link onto them; an unlinked event after linked ones is refused."""
    from missionweave.kernel.signing import read_key

    w = world
    key = read_key(w.settings.authority_key_path)
    key_id = w.mesh.authority.key_id  # type: ignore[attr-defined]
    await create(w, G)
    await post(w, G, "old one")
    await post(w, G, "old two")

    def unlinked(stored: bytes) -> bytes:
        event = codec.decode_event(stored)
        event.ClearField("previous_digest")
        return sign_envelope(
            event.SerializeToString(deterministic=True), EVENT_TYPE, key, key_id
        ).SerializeToString()

    stored = await rows(w, G)
    await write(
        w,
        *(update(events).where(at(G, s)).values(envelope=unlinked(r["envelope"])) for s, r in stored.items()),
    )
    forget(w)
    assert len(await read_all(w, G)) == len(stored)
    new = await post(w, G, "new one")
    assert len(codec.event_of((await read_all(w, G))[new - 1]).previous_digest) == 32
    code, report = await verify_cli(w, capsys)
    assert code == 0 and report["unlinked_events"] == len(stored) - 1, report

    # An unlinked event after a linked one is not from an earlier release.
    after = await post(w, G, "new two")
    await write(
        w, update(events).where(at(G, after)).values(envelope=unlinked((await rows(w, G))[after]["envelope"]))
    )
    forget(w)
    w.mesh.authority.integrity.verified._known.clear()  # type: ignore[attr-defined]
    rejection = await rejection_of(read_all(w, G))
    assert rejection.metadata["sequence"] == str(after)


@pytest.mark.req("MW-7.4-01")
async def test_a_chain_checkpoint_spares_the_next_load_its_signature_checks(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/integrity.md "Chain checkpoints": a load that checked enough signatures signs the head it
    verified; the next load checks the hash chain up to it and signatures only after it. An event
    edited below it is still found (by the chain), and so is an edited checkpoint."""
    from missionweave_server.services.authority.integrity import Counters

    w = world
    await create(w, G)
    for i in range(6):
        await post(w, G, f"message {i}")
    head = await checkpoint(w, G)
    assert head == (await w.client.group_state(G)).head_sequence
    await post(w, G, "after the checkpoint")
    forget(w)
    w.mesh.authority.integrity.verified._known.clear()  # type: ignore[attr-defined]
    before = Counters.events_verified
    await w.client.group_state(G)
    assert Counters.events_verified - before == 2  # sequence 1 and the event after the checkpoint

    # An edited message below the checkpoint: its signature is not checked, the chain finds it.
    stored = (await rows(w, G))[head - 1]
    signed = codec.envelope(stored["envelope"])
    signed.payload = signed.payload.replace(b"message 4", b"message X")
    await write(w, update(events).where(at(G, head - 1)).values(envelope=signed.SerializeToString()))
    forget(w)
    rejection = await rejection_of(w.client.group_state(G))
    assert rejection.metadata["sequence"] == str(head)  # the first event whose link fails
    code, report = await verify_cli(w, capsys)
    assert code == 1 and report["findings"][0]["sequence"] == head - 1  # offline, every signature


@pytest.mark.req("MW-7.4-01")
async def test_an_edited_chain_checkpoint_is_refused(world: World) -> None:
    from missionweave_server.services.authority.schema import chain_checkpoints

    w = world
    await create(w, G)
    await post(w, G, "one")
    sequence = await checkpoint(w, G)
    assert sequence is not None
    found = await w.mesh.authority.store.chain_checkpoint(G)  # type: ignore[attr-defined]
    signed = common_pb2.SignedEnvelope.FromString(found[1])
    signed.payload = signed.payload[:-1] + bytes([signed.payload[-1] ^ 1])
    await write(w, update(chain_checkpoints).values(envelope=signed.SerializeToString()))
    forget(w)
    assert (await rejection_of(w.client.group_state(G))).reason == R.REJECTION_REASON_DATA_CORRUPTED
