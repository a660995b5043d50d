"""Shard failover benchmark: how long a Group refuses commands when its Authority shard fails.

    .venv/bin/python bench/shard_failover.py                       # local PostgreSQL (~1 min)
    .venv/bin/python bench/shard_failover.py --database-url postgresql+asyncpg://u:pw@host/db

A split mesh of --shards Authority shards on PostgreSQL (`mwp serve --topology split`, the launcher
restarting a process that dies, as Kubernetes restarts a pod), --groups Groups, an ownership lease of
--lease seconds. Three faults, each on the shard that owns the most Groups at that moment:

1. kill: SIGKILL; the launcher starts the shard again.
2. term: SIGTERM (a rolling upgrade): the shard hands its Groups over before it exits (D288), and the
   launcher starts it again.
3. pause: SIGSTOP for twice the lease (a hung or partitioned shard), then SIGCONT.

Then the shard count changes under load (every Group gets a command every 100 ms, each sent until
acknowledged): a shard is added beside the running ones (the environment of authority-0 with a new
instance id and address, as an operator adds an ordinal), and removed again with SIGTERM. Printed:
the seconds until the Groups its placement gives it are on it (and back on the others), and the
command latency of the Groups that moved against the Groups that did not, in the same run.

At the fault, one signed command per Group of the failed shard is sent through the front door and
sent again (same command id) every 100 ms until acknowledged. Per Group: the seconds from the fault to
the acknowledgement (the refusal window); the anchor is the ownership lease, the bound the design
gives for a shard that stays down. Every refusal on the way must be PEER_UNAVAILABLE with
retry_after_ms and no shard address (D261). The Groups per shard are printed before the fault, after
the windows, and once every Group is back on the shard its placement prefers (D262; the seconds that
took from the last acknowledgement, or "not all back" after SPREAD_WAIT_S).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench.authority import LocalPostgres  # noqa: E402
from missionweave.kernel.clock import SystemClock  # noqa: E402
from missionweave.kernel.rejections import rejection_from_rpc_error  # noqa: E402
from missionweave.kernel.signing import read_key  # noqa: E402
from missionweave.sdk.client import MeshClient, SessionSigner  # noqa: E402
from missionweave.v1 import common_pb2  # noqa: E402
from missionweave_server.edge.shards import rendezvous  # noqa: E402
from tests import builders  # noqa: E402
from tests.conftest import register, reset_database  # noqa: E402
from tests.shard_mesh import owners, start_shard  # noqa: E402
from tests.split_mesh import free_port, launch_split, wait_serving  # noqa: E402

SPREAD_WAIT_S = 60.0


class Launcher:
    """`mwp serve --topology split` with its stderr kept: the pid each shard runs as now."""

    def __init__(
        self, process: asyncio.subprocess.Process, pids: dict[str, int], addresses: dict[str, str]
    ) -> None:
        self.process, self.pids, self.addresses = process, pids, addresses
        self._drain = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stderr is not None
        while line := (await self.process.stderr.readline()).decode():
            if found := re.search(r"starting (\S+) +pid (\d+)", line):
                self.pids[found[1]] = int(found[2])

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.process.wait(), 60)
        self._drain.cancel()


async def start(db_url: str, data: Path, shards: int, lease: float) -> tuple[Launcher, str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MWP_")},
        "MWP_VERIFY_WORKERS": "0",
        "MWP_OWNERSHIP_LEASE_S": str(lease),
    }
    process, target = await launch_split(data, db_url, shards, env)
    addresses: dict[str, str] = {}
    pids = await wait_serving(process, addresses=addresses)
    return Launcher(process, pids, addresses), target


async def send_until_acknowledged(
    client: MeshClient, envelope: common_pb2.SignedEnvelope, t0: float, refusals: Counter[str]
) -> float:
    """Seconds from ``t0`` to the acknowledgement; each refusal counted by reason (a NOT_OWNER, a
    refusal without a retry hint or one naming a loopback address is counted as a leak)."""
    while True:
        try:
            await asyncio.wait_for(client.execute(envelope), 10)
            return time.monotonic() - t0
        except TimeoutError:
            refusals["no answer in 10 s"] += 1
        except grpc.aio.AioRpcError as err:
            rejection = rejection_from_rpc_error(err)
            if rejection is None:
                refusals[f"{err.code().name} without a Rejection"] += 1
            else:
                reason = common_pb2.RejectionReason.Name(rejection.reason).removeprefix("REJECTION_REASON_")
                leak = "127.0.0.1" in (err.details() or "") or "owner_address" in rejection.metadata
                hinted = "retry_after_ms" in rejection.metadata
                refusals[
                    reason + (" LEAKING AN ADDRESS" if leak else "") + ("" if hinted else " NO HINT")
                ] += 1
        await asyncio.sleep(0.1)


def message_post(
    owner: SessionSigner, conversations: dict[str, str], group: str, text: str
) -> common_pb2.SignedEnvelope:
    """A message from the Groups' owner in ``group``'s planning Conversation."""
    body = builders.message(conversations[group], text)
    return owner.sign(owner.command(group, "message_post", body, membership_epoch=1))


def spread(placed: dict[str, str], shards: int) -> str:
    count = Counter(placed.values())
    return " ".join(f"{name}={count.get(name, 0)}" for name in (f"authority-{i}" for i in range(shards)))


async def run(db_url: str, shards: int, groups: int, lease: float) -> None:
    await reset_database(db_url)
    with tempfile.TemporaryDirectory(prefix="mwp-bench-failover-") as work:
        data = Path(work) / "data"
        launcher, target = await start(db_url, data, shards, lease)
        client = MeshClient(target)
        try:
            admin = read_key(data / "keys" / "admin.key")
            owner = await register(client, admin, "alice", common_pb2.IDENTITY_KIND_HUMAN)
            await register(client, admin, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
            names = [f"grp_failover_{i}" for i in range(groups)]
            conversations: dict[str, str] = {}
            for group in names:
                body = builders.mission_create("alice", "coord-bot", SystemClock().now())
                await client.execute(owner.sign(owner.command(group, "mission_create", body)))
                conversations[group] = (await client.group_state(group)).mission.planning_conversation_id
            print(f"{shards} shards on PostgreSQL, {groups} Groups, ownership lease {lease:g} s")
            for fault in ("kill", "term", "pause"):
                await one_fault(fault, client, owner, conversations, launcher, db_url, shards, lease)
            await one_change(client, owner, conversations, launcher, db_url, shards)
        finally:
            await client.channel.close()
            await launcher.stop()


async def one_fault(
    fault: str,
    client: MeshClient,
    owner: SessionSigner,
    conversations: dict[str, str],
    launcher: Launcher,
    db_url: str,
    shards: int,
    lease: float,
) -> None:
    placed = await owners(db_url)
    victim = max(set(placed.values()), key=list(placed.values()).count)
    hit = [g for g, o in placed.items() if o == victim]
    post = functools.partial(message_post, owner, conversations)
    refusals: Counter[str] = Counter()
    pid = launcher.pids[victim]
    t0 = time.monotonic()
    if fault in ("kill", "term"):
        os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGTERM)
    else:  # resumed after twice the lease, whether or not its Groups were taken over by then
        os.kill(pid, signal.SIGSTOP)
        asyncio.get_running_loop().call_later(2 * lease, os.kill, pid, signal.SIGCONT)
    windows = await asyncio.gather(
        *(send_until_acknowledged(client, post(g, f"{fault} probe"), t0, refusals) for g in hit)
    )
    await asyncio.sleep(max(0.0, 2 * lease - (time.monotonic() - t0)))  # the paused shard is back
    after = await owners(db_url)
    # Back where they were (each on the shard its placement prefers), once the failed shard is up.
    spread_s = await settled(db_url, placed, time.monotonic())
    later = await owners(db_url)
    for group in conversations:  # and every Group takes a command where it is
        await send_until_acknowledged(client, post(group, "after"), time.monotonic(), Counter())
    median, worst = statistics.median(windows), max(windows)
    print(f"\n{fault}: {victim} owned {len(hit)} Groups")
    print(f"  refusal window per Group: median {median:.2f} s, max {worst:.2f} s "
          f"(anchor: the lease, {lease:g} s; ratio {median / lease:.2f} / {worst / lease:.2f})")  # fmt: skip
    print(f"  refusals seen: {dict(refusals) or 'none'}")
    back = f"all back in {spread_s:.1f} s" if later == placed else f"not all back after {SPREAD_WAIT_S:g} s"
    print(f"  Groups per shard: before {spread(placed, shards)}; after the windows {spread(after, shards)}; "
          f"then {spread(later, shards)} ({back}, measured from the last acknowledgement)")  # fmt: skip


class Timed:
    """Every Group gets one command after another; each command's latency (sent until acknowledged)."""

    def __init__(self, client: MeshClient, post: Callable[[str, str], common_pb2.SignedEnvelope]) -> None:
        self.latencies: dict[str, list[float]] = {}
        self.phase = "before"
        self.refusals: dict[str, Counter[str]] = {}  # by phase
        self._stop = asyncio.Event()
        self._client, self._post = client, post
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, groups: list[str]) -> None:
        self._tasks = [asyncio.create_task(self._one(g)) for g in groups]

    async def _one(self, group: str) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            t0 = time.monotonic()
            refused = self.refusals.setdefault(self.phase, Counter())
            await send_until_acknowledged(self._client, self._post(group, f"load {n}"), t0, refused)
            self.latencies.setdefault(group, []).append(time.monotonic() - t0)
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def latency_ms(self, groups: list[str]) -> str:
        values = [v for g in groups for v in self.latencies.get(g, [])]
        return f"median {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"


async def one_change(
    client: MeshClient,
    owner: SessionSigner,
    conversations: dict[str, str],
    launcher: Launcher,
    db_url: str,
    shards: int,
) -> None:
    post = functools.partial(message_post, owner, conversations)
    groups = list(conversations)
    by_address = {
        address: name for name, address in launcher.addresses.items() if name.startswith("authority-")
    }
    name, address = f"authority-{shards}", f"127.0.0.1:{free_port()}"
    grown = {**by_address, address: name}
    on_more = {g: grown[rendezvous(g, list(grown))[0]] for g in groups}
    moving = [g for g in groups if on_more[g] == name]
    staying = [g for g in groups if g not in moving]
    before = await owners(db_url)
    load = Timed(client, post)
    load.start(groups)
    await asyncio.sleep(2)
    t0 = time.monotonic()
    load.phase = "while added"
    added = await start_shard(launcher.pids["authority-0"], name, address)
    moved_s = await settled(db_url, on_more, t0)
    await asyncio.sleep(2)
    t1 = time.monotonic()
    load.phase = "while removed"
    added.send_signal(signal.SIGTERM)
    await added.wait()
    back_s = await settled(db_url, before, t1)
    await asyncio.sleep(1)
    await load.stop()
    refused = {phase: dict(c) for phase, c in load.refusals.items() if c}
    print(f"\nadd and remove: {name} joined {shards} shards under load ({len(groups)} Groups, one command "
          f"per Group every 100 ms); its placement gives it {len(moving)}")  # fmt: skip
    print(f"  on it {moved_s:.1f} s after its start; back on the others {back_s:.1f} s after its SIGTERM")
    print(f"  command latency, Groups that moved: {load.latency_ms(moving)}; anchor, Groups that stayed: "
          f"{load.latency_ms(staying)}; refusals seen: {refused or 'none'}")  # fmt: skip


async def settled(db_url: str, expected: dict[str, str], t0: float) -> float:
    """Seconds from ``t0`` until the Groups' owners are ``expected`` (or SPREAD_WAIT_S)."""
    while True:
        if await owners(db_url) == expected or time.monotonic() - t0 >= SPREAD_WAIT_S:
            return time.monotonic() - t0
        await asyncio.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=os.environ.get("MWP_BENCH_POSTGRES_URL", ""))
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--groups", type=int, default=12)
    parser.add_argument("--lease", type=float, default=5.0, help="MWP_OWNERSHIP_LEASE_S (default 5)")
    args = parser.parse_args()
    local: LocalPostgres | None = None
    url = args.database_url
    if not url:
        local = LocalPostgres()
        if not local.start():
            print(f"SKIPPED: no PostgreSQL ({local.reason})")
            return
        url = local.new_database()
    try:
        asyncio.run(run(url, args.shards, args.groups, args.lease))
    finally:
        if local is not None:
            local.drop()


if __name__ == "__main__":
    main()
