"""SDKs benchmark: the TypeScript SDK beside its anchor, the Python SDK, in one run.

    .venv/bin/python bench/sdks.py            # default run (~30 s)
    .venv/bin/python bench/sdks.py --quick    # smoke run

Both SDKs are driven the way the conformance suite drives them (docs/sdk-behaviour.md "The driver
protocol"; tests/conformance/drivers.py): each driver is its own process, one agent of its SDK as
"worker-bot", pointed straight at an in-process mesh (SQLite, local blobs, no per-Group ingress
limit), no fault proxy.

1. Catch-up: a Group of --events message posts (appended beforehand in batches of 256). A driver on a
   fresh state directory subscribes from 0 with --credits credits; timed from the subscribe request to
   its durable cursor (the `cursor` op) at the head, every event having reached its handler (verified
   by the SDK against the Authority key, in order, once, ACKed). Events/s, --rounds rounds of each
   SDK, alternating, a new driver each round.
2. A WorkItem through the Worker runtime: the driver's `work` op in `submit` mode (one text Artifact,
   one passing Evidence per criterion, submit); offer -> `work_finished` `submitted`, one WorkItem at
   a time, --work-items each (authorized before the clock starts). Milliseconds per WorkItem.

Medians (min-max); the ratio is TypeScript / Python (for events/s below 1 means slower, for ms above
1 means slower). Each driver's peak RSS (VmHWM) is read from /proc before it is closed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from missionweave.kernel.errors import Rejected  # noqa: E402
from missionweave.kernel.signing import write_key  # noqa: E402
from missionweave.v1 import common_pb2, membership_pb2  # noqa: E402
from tests import builders  # noqa: E402
from tests.conformance.drivers import SDKS, Driver, require, running  # noqa: E402
from tests.conftest import World  # noqa: E402
from tests.in_process_world import world_at  # noqa: E402
from tests.test_missions import G, create  # noqa: E402
from tests.test_work_items import Flow, setup  # noqa: E402

AGENT = "worker-bot"
CATCHUP = "grp_sdk_catchup"  # its own Group: only message posts, nothing of the WorkItems
SMALL_BUDGET = common_pb2.ResourceVector(currency="EUR", financial_micros=1_000, tokens=10, tool_calls=1)
NAMES = {"python": "Python", "typescript": "TypeScript"}


def spread(values: list[float], unit: str, digits: int = 1) -> str:
    return f"{statistics.median(values):,.{digits}f} {unit} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


class Drivers:
    """Starts one SDK's driver as worker-bot on a fresh state directory, straight at the mesh."""

    def __init__(self, w: World, tmp: Path) -> None:
        self.w, self.tmp = w, tmp
        self.key_file = tmp / f"{AGENT}.key"
        write_key(self.key_file, w.worker.key)
        self.started = 0
        self.peak_kib: dict[str, list[int]] = {sdk: [] for sdk in SDKS}

    def start(self, sdk: str) -> Any:
        self.started += 1
        env = {
            "MWP_TARGET": self.w.target,
            "MWP_AGENT_ID": AGENT,
            "MWP_KEY_FILE": str(self.key_file),
            "MWP_STATE_DIR": str(self.tmp / f"state-{self.started}-{sdk}"),
        }
        return running(sdk, env, self.tmp / f"{sdk}-driver.stderr")

    def record_peak(self, driver: Driver) -> None:
        """The driver process's peak resident set (VmHWM), while it still runs."""
        try:
            status = Path(f"/proc/{driver.process.pid}/status").read_text()
        except OSError:
            return
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                self.peak_kib[driver.sdk].append(int(line.split()[1]))


def at(group: str, sequence: int) -> Callable[[list[dict[str, Any]]], bool]:
    """Holds once an event at or past ``sequence`` (or a failure) is among the notes; each note is
    looked at once, so waiting on thousands of lines stays linear."""
    seen = 0

    def holds(notes: list[dict[str, Any]]) -> bool:
        nonlocal seen
        for note in notes[seen:]:
            if note["type"] == "subscription_failed":
                return True
            if note["type"] == "event" and note["group"] == group and note["sequence"] >= sequence:
                return True
        seen = len(notes)
        return False

    return holds


async def fill(w: World, events: int) -> list[tuple[int, str]]:
    """The catch-up Group: worker-bot a member, then ``events`` message posts; its log from the
    worker's visibility start, as (sequence, event id)."""
    await create(w, CATCHUP, lease_seconds=3600)
    grant = membership_pb2.MembershipGrant(member_id=AGENT, role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, CATCHUP, "membership_grant", grant, membership_epoch=1)
    conversation = (await w.client.group_state(CATCHUP)).mission.planning_conversation_id
    for first in range(0, events, 256):
        batch = [
            w.signed(
                w.owner, CATCHUP, "message_post", builders.message(conversation, f"m{i}"), membership_epoch=1
            )
            for i in range(first, min(first + 256, events))
        ]
        outcomes = await w.client.execute_batch(batch)
        refused = [o for o in outcomes if isinstance(o, Rejected)]
        assert not refused, refused[:3]
    state = await w.client.group_state(CATCHUP)
    start_at = next(m.visibility_start_sequence for m in state.memberships if m.member_id == AGENT)
    log = [(e.sequence, e.event_id) async for e in w.client.read_events(CATCHUP) if e.sequence >= start_at]
    assert log[-1][0] == state.head_sequence
    return log


async def catch_up_once(drivers: Drivers, sdk: str, log: list[tuple[int, str]], credits: int) -> float:
    """Seconds from the subscribe request to the durable cursor at the head; checks what was handled."""
    head = log[-1][0]
    async with drivers.start(sdk) as driver:
        began = time.perf_counter()
        await driver.ok("subscribe", group=CATCHUP, credits=credits)
        await driver.until(at(CATCHUP, head), 300)
        async with asyncio.timeout(60):
            while (await driver.ok("cursor", group=CATCHUP))["cursor"] != head:  # noqa: ASYNC110
                await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - began
        failed = [n for n in driver.notes if n["type"] == "subscription_failed"]
        assert not failed, failed
        assert driver.events(CATCHUP) == log, f"{sdk}: not every event once, in order"
        drivers.record_peak(driver)
    return elapsed


async def catch_up(drivers: Drivers, w: World, events: int, credits: int, rounds: int) -> dict[str, float]:
    log = await fill(w, events)
    rates: dict[str, list[float]] = {sdk: [] for sdk in SDKS}
    for r in range(rounds):
        order = list(SDKS) if r % 2 == 0 else list(reversed(SDKS))  # neither always goes first
        for sdk in order:
            rates[sdk].append(len(log) / await catch_up_once(drivers, sdk, log, credits))
    print(f"1. catch-up: {len(log):,} events from 0, {credits} credits, {rounds} rounds each (fresh state)")
    for sdk in SDKS:
        print(f"   {NAMES.get(sdk, sdk) + ':':<12} {spread(rates[sdk], 'events/s', 0)}")
    medians = {sdk: statistics.median(v) for sdk, v in rates.items()}
    return medians


async def work_items(drivers: Drivers, w: World, flow: Flow, count: int) -> dict[str, float]:
    timings: dict[str, list[float]] = {sdk: [] for sdk in SDKS}
    for sdk in SDKS:
        prefix = sdk[:2]
        for i in range(count):  # a small budget each, so that all fit in the Mission's
            await flow.authorize(f"{prefix}-{i}", goal=f"complete item {i}", budget=SMALL_BUDGET)
        async with drivers.start(sdk) as driver:
            await driver.ok("work", groups=[G], mode="submit", content="the bench's report")
            for i in range(count):
                item = f"{prefix}-{i}"

                def done(notes: list[dict[str, Any]], item: str = item) -> bool:
                    return any(n["type"] == "work_finished" and n["work_item_id"] == item for n in notes[-8:])

                began = time.perf_counter()
                await flow.coord("work_offer", flow.offer_body(item, AGENT, seconds=600))
                await driver.until(done, 60)
                timings[sdk].append((time.perf_counter() - began) * 1000)
            finished = [n for n in driver.notes if n["type"] == "work_finished"]
            assert [n["outcome"] for n in finished] == ["submitted"] * count, finished[-3:]
            drivers.record_peak(driver)
    print(f"2. a WorkItem through the Worker runtime, offer -> submitted, {count} one at a time")
    for sdk in SDKS:
        first = timings[sdk][0]  # the driver's first WorkItem: its first upload, code paths not yet warm
        print(f"   {NAMES.get(sdk, sdk) + ':':<12} {spread(timings[sdk], 'ms')}, the first {first:.1f} ms")
    return {sdk: statistics.median(v) for sdk, v in timings.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--credits", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work-items", type=int, default=20)
    args = parser.parse_args()
    events, rounds, count = (500, 1, 3) if args.quick else (args.events, args.rounds, args.work_items)
    try:
        for sdk in SDKS:
            require(sdk)  # a driver that is not built fails here (`make sdk-ts`)
    except pytest.skip.Exception as skipped:  # MWP_SKIP_NODE=1 outside CI, as the tests
        print(f"bench/sdks.py skipped: {skipped}")
        return
    except pytest.fail.Exception as missing:
        raise SystemExit(f"bench/sdks.py: {missing}") from None
    with tempfile.TemporaryDirectory(prefix="mwp-bench-sdks-") as scratch:
        tmp = Path(scratch)
        w = await world_at(tmp, group_rate=0.0)  # the history is appended as fast as the mesh takes it
        drivers = Drivers(w, tmp)
        try:
            flow = await setup(w)
            rates = await catch_up(drivers, w, events, args.credits, rounds)
            per_item = await work_items(drivers, w, flow, count)
        finally:
            await w.client.channel.close()
            await w.mesh.stop(grace=1)  # type: ignore[attr-defined]
    peaks = {sdk: f"{max(v) / 1024:.0f} MiB" if v else "n/a" for sdk, v in drivers.peak_kib.items()}
    print(
        "   peak RSS of a driver process (VmHWM, the largest over its runs): "
        + ", ".join(f"{NAMES.get(sdk, sdk)} {peak}" for sdk, peak in peaks.items())
    )
    print(
        f"summary: TypeScript / Python: catch-up {rates['typescript'] / rates['python']:.2f}x the events/s, "
        f"a WorkItem {per_item['typescript'] / per_item['python']:.2f}x the ms"
    )


if __name__ == "__main__":
    asyncio.run(main())
