"""Truncation (issue 40 part 2, docs/integrity.md "Truncation"): a Group whose last events were deleted
and whose head was lowered to match is refused DATA_CORRUPTED when it is loaded (commands, reads,
state), shown in health and found by ``mwp verify``, before and after the server has run; a sequence
re-used by a release that did not check is found by ``mwp verify`` and never answered as a replay.
SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, select, update

from missionweave.v1 import common_pb2
from missionweave_server.services.authority import truncation
from missionweave_server.services.authority.schema import commands, events, groups
from missionweave_server.services.authority.store import RecordedSequences
from tests.conftest import World
from tests.test_missions import create
from tests.test_tamper import (
    INTEGRITY,
    OTHER,
    G,
    at,
    forget,
    health,
    post,
    read_all,
    rejection_of,
    verify_cli,
    write,
)

R = common_pb2.RejectionReason


async def truncate(w: World, group: str, last: int) -> None:
    """What the measurement did: delete the last event row and lower ``groups.head_seq`` by one
    (the command record of the deleted event stays)."""
    await write(
        w,
        delete(events).where(at(group, last)),
        update(groups).where(groups.c.group_id == group).values(head_seq=last - 1),
    )
    forget(w)


async def head_of(w: World, group: str) -> int:
    async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
        return int(
            (await conn.execute(select(groups.c.head_seq).where(groups.c.group_id == group))).scalar_one()
        )


@pytest.mark.req("MW-7.4-01", "MW-16-05")
async def test_a_log_shortened_with_its_head_is_refused_and_reported(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    w = world
    for group in (G, OTHER):
        await create(w, group)
        await post(w, group, "first")
    last = await post(w, G, "acknowledged")
    await truncate(w, G, last)

    # The next command is not given the acknowledged command's sequence: the Group is refused.
    rejection = await rejection_of(post(w, G, "would take the acknowledged sequence"))
    assert rejection.reason == R.REJECTION_REASON_DATA_CORRUPTED
    assert rejection.metadata["group_id"] == G and rejection.metadata["sequence"] == str(last), (
        rejection.message
    )
    assert "past the Group's head" in rejection.message
    assert (await rejection_of(read_all(w, G))).reason == R.REJECTION_REASON_DATA_CORRUPTED
    assert (await rejection_of(w.client.group_state(G))).reason == R.REJECTION_REASON_DATA_CORRUPTED
    assert await head_of(w, G) == last - 1  # never extended
    assert await health(w, INTEGRITY) == "NOT_SERVING"
    assert await health(w, f"{INTEGRITY}/{G}") == "NOT_SERVING"
    assert await health(w, "missionweave.v1.AuthorityService") == "SERVING"
    # Other Groups are served as before.
    assert await post(w, OTHER, "still here") > 0

    # mwp verify, after the server has run on the store.
    code, report = await verify_cli(w, capsys)
    assert code == 1 and report["corrupted_groups"] == [G], report
    assert report["findings"][0]["sequence"] == last
    assert "past the Group's head" in report["findings"][0]["detail"]


@pytest.mark.req("MW-7.4-01", "MW-16-05")
async def test_a_shortened_log_is_refused_on_a_read_before_any_command(world: World) -> None:
    """A read (GetGroupState of a Group not held: the fold path) refuses it too, not only a command."""
    w = world
    await create(w, G)
    last = await post(w, G, "acknowledged")
    await truncate(w, G, last)
    rejection = await rejection_of(w.client.group_state(G))
    assert rejection.reason == R.REJECTION_REASON_DATA_CORRUPTED and rejection.metadata["sequence"] == str(
        last
    )


@pytest.mark.req("MW-7.4-01")
async def test_a_reused_sequence_is_found_offline_and_never_replayed(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a store an earlier release served after the truncation: with the load check off (the
    rule broken once), the next command takes the acknowledged command's sequence and the head is
    back where it was, so nothing names a sequence past it any more. ``mwp verify`` still finds the
    re-used sequence (the acknowledged command's record names an event another command caused), and
    re-sending the acknowledged command is refused instead of being answered with the other's event."""
    w = world
    await create(w, G)
    conv = (await w.client.group_state(G)).mission.planning_conversation_id
    from tests import builders

    acknowledged = w.signed(
        w.owner, G, "message_post", builders.message(conv, "acknowledged"), membership_epoch=1
    )
    last = (await w.client.execute(acknowledged)).group_revision
    await truncate(w, G, last)

    async def unchecked(*_: object) -> None:
        return None

    monkeypatch.setattr(truncation, "refuse_if_shortened", unchecked)
    monkeypatch.setattr("missionweave_server.services.authority.loading.refuse_if_shortened", unchecked)
    assert await post(w, G, "another command") == last  # the acknowledged sequence, given again
    monkeypatch.undo()
    assert await head_of(w, G) == last
    async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
        naming = (
            await conn.execute(
                select(commands.c.command_id).where(
                    (commands.c.group_id == G) & (commands.c.last_seq == last)
                )
            )
        ).all()
    assert len(naming) == 2  # both command records name it

    code, report = await verify_cli(w, capsys)
    assert code == 1 and report["corrupted_groups"] == [G], report
    assert report["findings"][0]["sequence"] == last and "re-used" in report["findings"][0]["detail"], report

    forget(w)
    rejection = await rejection_of(w.client.execute(acknowledged))
    assert rejection.reason == R.REJECTION_REASON_DATA_CORRUPTED and rejection.metadata["sequence"] == str(
        last
    )


def test_each_record_past_the_head_is_a_shortened_log() -> None:
    assert truncation.past_head("g", RecordedSequences(5, 5, 5, 5, 5)) is None
    assert truncation.past_head("g", RecordedSequences(5, None, None, None, None)) is None
    for i in range(4):
        values: list[int | None] = [3, 3, 3, 3]
        values[i] = 6
        found = truncation.past_head("g", RecordedSequences(5, *values))
        assert found is not None and found.sequence == 6, i


@pytest.mark.req("MW-7.4-01")
async def test_an_intact_store_still_verifies_and_loads(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """No false alarm: snapshots, compaction and a chain checkpoint at the head are within it."""
    w = world
    await create(w, G)
    for i in range(3):
        await post(w, G, f"m{i}")
    authority = w.mesh.authority  # type: ignore[attr-defined]
    await authority.take_snapshot(G, compact=True)
    forget(w)
    assert await post(w, G, "after the snapshot") > 0
    code, report = await verify_cli(w, capsys)
    assert code == 0 and report["clean"], report
