"""Per-Group pipelining: later commands are decided while earlier appends wait for the group commit,
but nobody sees an answer or a state before it is durable, and a duplicate waits for its original."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from missionweave.sdk.client import decode_events
from missionweave_server.services.authority.store import AppendRequest, EventStore
from tests import builders
from tests.conftest import World
from tests.test_grpc_authority import create_mission


def gate_store(store: EventStore) -> tuple[asyncio.Event, list[list[AppendRequest]]]:
    """Hold every group commit until the returned event is set; record the batches."""
    gate = asyncio.Event()
    held: list[list[AppendRequest]] = []
    original: Callable[[list[AppendRequest]], Any] = store._commit_batch

    async def gated(batch: list[AppendRequest]) -> None:
        held.append(batch)
        await gate.wait()
        await original(batch)

    store._commit_batch = gated  # type: ignore[method-assign]
    return gate, held


async def test_pipelined_commands_of_one_group_are_durable_before_anyone_sees_them(world: World) -> None:
    conv = await create_mission(world, "grp_pipe")
    authority = world.mesh.authority  # type: ignore[attr-defined]
    store = world.mesh.store  # type: ignore[attr-defined]
    head_before = (await authority.state("grp_pipe")).head_sequence
    gate, _held = gate_store(store)
    try:
        await _pipeline_five(world, conv, gate, authority, head_before)
    finally:
        gate.set()


async def _pipeline_five(
    world: World, conv: str, gate: asyncio.Event, authority: Any, head_before: int
) -> None:
    posts = [
        world.owner.sign(
            world.owner.command(
                "grp_pipe", "message_post", builders.message(conv, f"m{i}"), membership_epoch=1
            )
        )
        for i in range(5)
    ]
    calls = [asyncio.ensure_future(world.client.execute(p)) for p in posts]
    duplicate = asyncio.ensure_future(world.client.execute(posts[0]))
    await asyncio.sleep(0.3)
    # All five were decided (each on its predecessor's state) but none is durable yet: no answers,
    # and readers still see the durable head.
    assert not any(c.done() for c in calls) and not duplicate.done()
    assert (await authority.state("grp_pipe")).head_sequence == head_before
    assert (await world.client.group_state("grp_pipe")).head_sequence == head_before

    gate.set()
    results = await asyncio.gather(*calls)
    revisions = sorted(r.group_revision for r in results)
    assert revisions == list(range(head_before + 1, head_before + 6))
    again = await duplicate
    assert again.replayed and again.group_revision == results[0].group_revision
    assert [e.event_id for e in decode_events(again.events)] == [
        e.event_id for e in decode_events(results[0].events)
    ]
    stored = [e async for e in world.client.read_events("grp_pipe", after=head_before)]
    assert [e.sequence for e in stored] == revisions  # no gap, no duplicate sequence
    assert (await authority.state("grp_pipe")).head_sequence == head_before + 5


async def test_a_failed_append_fails_its_pipelined_successors_which_are_decided_again(world: World) -> None:
    """If an append is refused, the appends decided on top of it are fenced too; they are decided
    again on the durable log and land (nothing is lost, nothing is written twice)."""
    conv = await create_mission(world, "grp_pipe2")
    authority = world.mesh.authority  # type: ignore[attr-defined]
    store = world.mesh.store  # type: ignore[attr-defined]
    head_before = (await authority.state("grp_pipe2")).head_sequence
    gate, held = gate_store(store)
    try:
        first = world.owner.sign(
            world.owner.command("grp_pipe2", "message_post", builders.message(conv, "a"), membership_epoch=1)
        )
        second = world.owner.sign(
            world.owner.command("grp_pipe2", "message_post", builders.message(conv, "b"), membership_epoch=1)
        )
        c1 = asyncio.ensure_future(world.client.execute(first))
        await asyncio.sleep(0.2)
        c2 = asyncio.ensure_future(world.client.execute(second))
        await asyncio.sleep(0.2)
        # The first append is held in its batch and the second was decided on top of it. Sabotage the
        # first: it now claims a head the Group never had, so the store refuses it.
        assert len(held) == 1 and [r.command_id for r in held[0]] == [first_id(first)]
        held[0][0].expected_head += 100
    finally:
        gate.set()
    r1, r2 = await asyncio.gather(c1, c2)
    assert sorted([r1.group_revision, r2.group_revision]) == [head_before + 1, head_before + 2]
    stored = [e async for e in world.client.read_events("grp_pipe2", after=head_before)]
    assert [e.sequence for e in stored] == [head_before + 1, head_before + 2]
    assert len(held) >= 3  # the refused batch, then both commands again


def first_id(envelope: Any) -> str:
    from missionweave.v1 import command_pb2

    cmd = command_pb2.Command()
    cmd.ParseFromString(envelope.payload)
    return cmd.command_id
