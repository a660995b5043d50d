"""The behaviours every MissionWeave SDK promises (docs/sdk-behaviour.md), each written once and run
against every SDK's driver (tests/conformance/drivers.py, SDKS) over a live mesh in both topologies.

Every driver reaches the mesh through a fault-injecting proxy (tests/conformance/fault_proxy.py), so a
scenario that needs a broken connection, a lost, repeated, reordered or tampered frame scripts it
there; the driver knows nothing of it. The driver acts as the Group's Worker ("worker-bot"); the test
is the owner and the Coordinator (tests/test_work_items.py Flow). Checks are made on what the SDK's
handler received (the driver's ``event`` lines, in the order written) and on the cursor it reports
as durable, against the Group's log as the mesh holds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from missionweave.kernel.signing import write_key
from missionweave.v1 import work_pb2 as wp
from tests.conformance.drivers import SDKS, Driver, require, running
from tests.conformance.fault_proxy import EventFault, FaultProxy, proxied
from tests.conftest import World, polled
from tests.test_agent_sdk import post_messages
from tests.test_missions import G
from tests.test_work_items import Flow, setup

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

AGENT = "worker-bot"
HISTORY = 24  # messages in the log before the driver subscribes (it catches up over several frames)
CREDITS = 4  # a small window: many EVENT frames, and ACKs that must grant credits back


@pytest.fixture(params=list(SDKS))
def sdk(request: pytest.FixtureRequest) -> str:
    require(request.param)  # a driver that cannot run fails or skips before a mesh is started
    return str(request.param)


@pytest.fixture
async def proxy(world: World) -> AsyncIterator[FaultProxy]:
    async with proxied(world.target) as p:
        yield p


class Scene:
    """One scenario's mesh, proxy and Group, and how to start the SDK's driver on them."""

    def __init__(self, w: World, proxy: FaultProxy, sdk: str, tmp_path: Path, flow: Flow) -> None:
        self.w, self.proxy, self.sdk, self.tmp_path, self.flow = w, proxy, sdk, tmp_path, flow
        self.key_file = tmp_path / f"{AGENT}.key"
        write_key(self.key_file, w.worker.key)  # the identity key, as `mwp keygen` writes it
        self.state = tmp_path / "driver-state"

    def driver(self, state: Path | None = None) -> AbstractAsyncContextManager[Driver]:
        env = {
            "MWP_TARGET": self.proxy.address,
            "MWP_AUDIENCE": self.w.target,  # what the HELLO and call proofs name: the mesh, not the proxy
            "MWP_AGENT_ID": AGENT,
            "MWP_KEY_FILE": str(self.key_file),
            "MWP_STATE_DIR": str(state or self.state),
        }
        return running(self.sdk, env, self.tmp_path / f"{self.sdk}-driver.stderr")

    async def post(self, count: int) -> None:
        state = await self.w.client.group_state(G)
        conv, head = state.mission.planning_conversation_id, state.head_sequence
        await post_messages(self.w, conv, range(head, head + count))

    async def log(self) -> list[tuple[int, str]]:
        """(sequence, event id) of the Group's log from the driver's visibility start on."""
        state = await self.w.client.group_state(G)
        start = next(m.visibility_start_sequence for m in state.memberships if m.member_id == AGENT)
        return [(e.sequence, e.event_id) async for e in self.w.client.read_events(G) if e.sequence >= start]

    async def head(self) -> int:
        return int((await self.w.client.group_state(G)).head_sequence)


@pytest.fixture
async def scene(sdk: str, world: World, proxy: FaultProxy, tmp_path: Path) -> Scene:
    return Scene(world, proxy, sdk, tmp_path, await setup(world))


def reached(group: str, sequence: int) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda notes: (
        any(n["type"] == "event" and n["group"] == group and n["sequence"] >= sequence for n in notes)
        or any(n["type"] == "subscription_failed" for n in notes)
    )


def contiguous(sequences: list[int], start: int) -> int:
    """The highest sequence up to which every one after ``start`` is among ``sequences``."""
    seen, top = set(sequences), start
    while top + 1 in seen:
        top += 1
    return top


class CursorWatch:
    """Asks the driver for its durable cursor every few ms while a scenario runs, and records each
    answer with what its handler had received contiguously by then: stdout keeps the driver's
    order, so every event handled before the cursor was read is already among the notes."""

    def __init__(self, driver: Driver, start: int) -> None:
        self.driver, self.start = driver, start
        self.samples: list[tuple[int, int]] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            answer = await self.driver.ok("cursor", group=G)
            seen = [s for s, _ in self.driver.events(G)]
            self.samples.append((answer["cursor"], contiguous(seen, self.start)))
            await asyncio.sleep(0.01)

    async def stop(self) -> list[tuple[int, int]]:
        """Every sample whose cursor was beyond what had been received contiguously (none, if kept)."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        assert self.samples, "no cursor was read"
        return [(c, p) for c, p in self.samples if c > p]


async def caught_up(scene: Scene, driver: Driver, seconds: float = 30.0) -> int:
    head = await scene.head()
    await driver.until(reached(G, head), seconds)
    assert not [n for n in driver.notes if n["type"] == "subscription_failed"], driver.notes[-5:]
    return head


async def durable(driver: Driver, cursor: int, seconds: float = 10.0) -> None:
    """Waits until the driver's durable cursor is ``cursor``: it is written behind the handler."""
    async with asyncio.timeout(seconds):
        while (await driver.ok("cursor", group=G))["cursor"] != cursor:  # noqa: ASYNC110 (nothing to wait on)
            await asyncio.sleep(0.02)


# ------------------------------------------------------------------ delivery


@pytest.mark.req("MW-16-01", "MW-16-03", "MW-16-04", "MW-16-06", "MW-16-07")
async def test_delivery_order_each_event_once_in_sequence_order(scene: Scene) -> None:
    """SDK-ORDER: the handler gets the Group's events in sequence order, each once, in history and
    in live appends, frames that arrive out of order included (the proxy holds live EVENT frames
    back behind the next ones); the durable cursor reaches the head."""
    await scene.post(HISTORY)
    start = await scene.head()
    async with scene.driver() as driver:
        # A window of several frames: a frame held back behind the next needs credits for both.
        await driver.ok("subscribe", group=G, credits=16)
        await driver.until(reached(G, start))
        held = [scene.proxy.fault("reorder", sequence=start + n) for n in (2, 6)]
        await scene.post(10)  # one EVENT frame per append to a subscriber that keeps up
        head = await caught_up(scene, driver)
        assert driver.events(G) == await scene.log()
        await durable(driver, head)
    assert all(f.fired for f in held), held


@pytest.mark.req("MW-16-04", "MW-16-05", "MW-16-06")
async def test_no_gap_crossed_a_lost_frame_is_recovered_and_no_cursor_passes_it(scene: Scene) -> None:
    """SDK-GAP: the proxy drops an EVENT frame of the history (often the last of its credit window:
    only a FLOW frame tells it was sent) and one of the live appends, which the next appends
    follow. The handler never sees a later sequence before a missing one, the durable cursor never
    passes a missing sequence, and the SDK gets the lost events again (from its cursor)."""
    await scene.post(HISTORY)
    start, history = (await scene.log())[0][0] - 1, await scene.head()
    lost = [scene.proxy.fault("drop", sequence=HISTORY // 2)]
    async with scene.driver() as driver:
        await driver.ok("subscribe", group=G, credits=16)
        watch = CursorWatch(driver, start)
        await driver.until(reached(G, history))
        lost.append(scene.proxy.fault("drop", sequence=history + 3))
        await scene.post(10)  # one EVENT frame per append: frames after the lost one, in its window
        await caught_up(scene, driver)
        crossed = await watch.stop()
        assert driver.events(G) == await scene.log()  # in order, once: nothing after a hole came early
    assert crossed == []
    assert all(f.fired for f in lost), lost


@pytest.mark.req("MW-16-01", "MW-16-02", "MW-16-10")
async def test_dedup_by_event_id_repeated_frames_and_reconnect_replays_reach_the_handler_once(
    scene: Scene,
) -> None:
    """SDK-DEDUP: the proxy sends EVENT frames twice, and breaks the stream twice mid-delivery so
    the SDK resubscribes from its durable cursor and the gateway replays what it had sent since;
    every event reaches the handler once."""
    await scene.post(HISTORY)
    twice = [scene.proxy.fault("duplicate", sequence=s) for s in (3, HISTORY // 2, HISTORY + 6)]
    async with scene.driver() as driver:
        await driver.ok("subscribe", group=G, credits=CREDITS)
        await driver.until(reached(G, HISTORY // 3))
        scene.proxy.break_streams()
        scene.proxy.break_after(frames=5)
        await scene.post(12)
        await caught_up(scene, driver)
        assert driver.events(G) == await scene.log()
    assert all(f.fired for f in twice), twice
    assert scene.proxy.connects >= 3  # the first stream and at least two reconnects


@pytest.mark.req("MW-16-05", "MW-16-06", "MW-16-10", "MW-16-14")
async def test_cursor_durability_across_a_kill_resumes_after_the_durable_cursor(scene: Scene) -> None:
    """SDK-DURABLE: the driver is SIGKILLed in the middle of the stream and started again on the same
    state directory. Its durable cursor is one it had reached (never beyond what its handler got),
    it resumes right after it, and what it gets again is at most the window the SDK may have
    handled beyond it (at-least-once across a restart: at most one credit window, MW-16-14)."""
    await scene.post(HISTORY * 2)
    log = await scene.log()
    start = log[0][0] - 1
    async with scene.driver() as first:
        await first.ok("subscribe", group=G, credits=CREDITS)
        await first.until(reached(G, start + HISTORY))
        first.kill()
        await first.process.wait()
        before = first.events(G)
    assert before == log[: len(before)] and len(before) < len(log)  # killed mid-stream
    await scene.post(6)  # while it is down
    async with scene.driver() as second:
        durable = (await second.ok("cursor", group=G))["cursor"]
        assert start <= durable <= before[-1][0]  # a cursor it reached, never beyond
        await second.ok("subscribe", group=G, credits=CREDITS)
        await caught_up(scene, second)
        after = second.events(G)
    log = await scene.log()
    assert after == [e for e in log if e[0] > durable]  # right after the durable cursor, in order, once
    again = [e for e in after if e in before]
    assert len(again) <= CREDITS, f"{len(again)} events handled twice across the restart"


@pytest.mark.req("MW-16-12")
@pytest.mark.parametrize("tamper", ["tamper_payload", "tamper_signature"])
async def test_tampered_event_refused_and_nothing_of_its_batch_delivered(
    scene: Scene, tamper: EventFault
) -> None:
    """SDK-VERIFY (OP-03): the proxy flips one byte of an event's payload, or of its Authority
    signature; the subscription stops NOT_VERIFIED and the handler gets no event of that frame nor
    any after it (the cursor stays before it)."""
    await scene.post(HISTORY)
    fault = scene.proxy.fault(tamper, sequence=HISTORY // 2)
    async with scene.driver() as driver:
        await driver.ok("subscribe", group=G, credits=CREDITS)
        await driver.until(lambda notes: any(n["type"] == "subscription_failed" for n in notes))
        [failed] = [n for n in driver.notes if n["type"] == "subscription_failed"]
        assert failed == {"type": "subscription_failed", "group": G, "error": "NOT_VERIFIED"}
        assert fault.fired is not None
        first, _ = fault.fired
        seen = [s for s, _ in driver.events(G)]
        assert seen and max(seen) < first, (seen, fault.fired)
        assert (await driver.ok("cursor", group=G))["cursor"] < first


# ------------------------------------------------------------------ commands and work


@pytest.mark.req("MW-16-10", "MW-16-14")
async def test_retry_idempotent_same_command_id_and_a_result_lost_with_its_stream(scene: Scene) -> None:
    """SDK-RETRY: the same command id twice gives the same sequence, the second ``replayed``; a
    command whose RESULT is lost with its stream (the proxy breaks it there) is re-sent by the SDK
    after the reconnect and appended exactly once."""
    conv = (await scene.w.client.group_state(G)).mission.planning_conversation_id

    def post(text: str) -> dict[str, Any]:
        return {
            "group": G,
            "kind": "message_post",
            "body": {"conversationId": conv, "content": {"text": text}},
        }

    async with scene.driver() as driver:
        first = await driver.ok("execute", **post("once"), command_id="cmd_conformance_once")
        again = await driver.ok("execute", **post("once"), command_id="cmd_conformance_once")
        assert (first["replayed"], again["replayed"]) == (False, True)
        assert again["sequence"] == first["sequence"]
        scene.proxy.break_on_result()
        lost = await driver.ok("execute", **post("answer lost"))
        assert scene.proxy.connects >= 2  # the answer came on a new stream
    texts = [(e.sequence, e.message_posted.content.text) async for e in scene.w.client.read_events(G)]
    assert [s for s, t in texts if t == "once"] == [first["sequence"]]
    assert [s for s, t in texts if t == "answer lost"] == [lost["sequence"]]


@pytest.mark.req("MW-11.3-04", "MW-11.3-05", "MW-11.3-09")
async def test_stale_lease_refused_after_the_work_restarted_under_a_new_lease(scene: Scene) -> None:
    """SDK-STALE: the driver accepts, starts under lease A, checkpoints (the work goes back to the
    queue) and starts again under lease B; a renewal or a submission still naming lease A is refused
    LEASE_STALE, although the ownership epoch is unchanged (docs/errors.md "WorkItems"). Then the
    agent starts anew without its state (a new session, which revokes lease B, MW-11.3-09) and starts
    under lease C: lease B, from the old session, is refused LEASE_STALE too."""
    flow = scene.flow
    await flow.authorize("wi-1")
    offer = await flow.offer("wi-1", AGENT)

    def body(**fields: Any) -> dict[str, Any]:
        return {"workItemId": "wi-1", **fields}

    async with scene.driver() as driver:

        async def run(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
            return await driver.request("execute", group=G, kind=kind, body=fields)

        accepted = await run("work_accept_offer", body(offerId=offer, contractRevision=1))
        assert accepted["ok"], accepted
        epoch = (await scene.w.client.work_item(G, "wi-1")).ownership_epoch
        assert (await run("work_start", body(ownershipEpoch=epoch, leaseId="lease-a")))["ok"]
        checkpoint = body(leaseId="lease-a", ownershipEpoch=epoch, checkpoint={"checkpointId": "ck-1"})
        assert (await run("work_checkpoint", checkpoint))["ok"]
        assert (await run("work_start", body(ownershipEpoch=epoch, leaseId="lease-b")))["ok"]
        renew = await run("work_renew_lease", body(leaseId="lease-a", ownershipEpoch=epoch))
        submit = Flow.submit_body("wi-1", epoch, "lease-a")
        late = await run("work_submit", json_format.MessageToDict(submit))
        assert (await run("work_renew_lease", body(leaseId="lease-b", ownershipEpoch=epoch)))["ok"]

    async def queued() -> bool:
        return (await scene.w.client.work_item(G, "wi-1")).state == wp.WORK_ITEM_STATE_QUEUED

    async with scene.driver(state=scene.tmp_path / "new-state") as restarted:
        await polled(queued, limit_s=10)  # the new session revoked lease B
        new = await restarted.request(
            "execute", group=G, kind="work_start", body=body(ownershipEpoch=epoch, leaseId="lease-c")
        )
        assert new["ok"], new
        old = await restarted.request(
            "execute", group=G, kind="work_renew_lease", body=body(leaseId="lease-b", ownershipEpoch=epoch)
        )
    for refused in (renew, late, old):
        assert refused["ok"] is False and refused["reason"] == "LEASE_STALE", refused
    item = await scene.w.client.work_item(G, "wi-1")
    assert item.lease.lease_id == "lease-c" and item.state == wp.WORK_ITEM_STATE_ACTIVE


@pytest.mark.req("MW-11.3-11", "MW-11.3-12")
async def test_preemption_honoured_checkpoint_answers_the_request_then_resume_and_submit(
    scene: Scene,
) -> None:
    """SDK-PREEMPT: the driver's Worker runtime runs the WorkItem; the Coordinator asks for preemption;
    the handler stops at a safe point, the runtime records a checkpoint answering the request and
    releases the slot; the WorkItem is placed again, resumed from that checkpoint, and submitted
    with the driver's Artifact."""
    flow = scene.flow
    async with scene.driver() as driver:
        await driver.ok("work", groups=[G], mode="pause_on_preemption", content="the conformance report")
        await flow.authorize("wi-1")
        await flow.coord("work_offer", flow.offer_body("wi-1", AGENT))
        await driver.until(lambda notes: any(n["type"] == "work_started" for n in notes))
        started = next(n for n in driver.notes if n["type"] == "work_started")
        ask = wp.WorkRequestPreemption(
            work_item_id="wi-1",
            preemption_request_id="pre-1",
            lease_id=started["lease_id"],
            reason=wp.PREEMPTION_REASON_PRIORITY,
            coordinator_epoch=1,
            ownership_epoch=started["ownership_epoch"],
        )
        await flow.coord("work_request_preemption", ask)
        await driver.until(
            lambda notes: any(n["type"] == "work_finished" and n["outcome"] == "submitted" for n in notes)
        )
    starts = [n for n in driver.notes if n["type"] == "work_started"]
    finished = [n for n in driver.notes if n["type"] == "work_finished"]
    log = [e async for e in scene.w.client.read_events(G)]
    [paused] = [e.work_checkpointed for e in log if e.WhichOneof("payload") == "work_checkpointed"]
    assert paused.preemption_request_id == "pre-1" and paused.HasField("ownership")  # slot released
    assert [s["resume_from_checkpoint_id"] for s in starts] == ["", paused.checkpoint.checkpoint_id]
    assert starts[0]["lease_id"] != starts[1]["lease_id"]
    assert [f["outcome"] for f in finished] == ["paused", "submitted"]
    [submitted] = [e.work_submitted for e in log if e.WhichOneof("payload") == "work_submitted"]
    assert [a.digest.hex for a in submitted.artifacts] == finished[-1]["artifacts"]
    assert not [e for e in log if e.WhichOneof("payload") == "lease_revoked"]  # never interrupted
