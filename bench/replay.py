"""Replay benchmark: rebuilding a Group's state from storage against the raw read of the same rows,
start-up time and resident memory with many Groups, memory per owned Group and per open subscription
(issue 18 item 4).

    PYTHONPATH=. .venv/bin/python bench/replay.py            # 10k, 100k, 1M events; 1,000, 3,000, 10,000 Groups x 100
    PYTHONPATH=. .venv/bin/python bench/replay.py --sizes 10000,100000 --groups 300,1000 --subscriptions 100,200   # quicker

The mesh runs in this process (``missionweave_server.mesh.server.start``, SQLite in a temp data dir). The
logs are **built directly**, not through commands: the first events come from the pure core (the
Mission's creation), then every further event is a ``message.posted`` made from one the core decided,
with its own sequence, id and message id, chained (each names the digest of the one before it) and
signed with the Authority's key exactly as the Authority signs its events, then written in appends
of ``--append`` events through the store's own batch path (``EventStore.append``, the group
commit and the SQLite writer process). Through commands, 1M events would take ~10 minutes here.

Per size, in one run and on the same rows, each after a read that warms the page cache:

* **raw row read** (the anchor): ``EventStore.read_history`` pages of 1,024 rows, bytes untouched;
* **first load**: ``Authority.fold`` as after a start with no checkpoint: every event's signature
  (the signature worker, in batches), sequence and chain checked, decoded and folded
  (docs/integrity.md); it leaves a signed chain checkpoint at the head (D76);
* **checkpointed load**: the verified-envelope cache emptied (a new process), ``fold`` again: the
  hash chain up to the checkpoint, signatures only above it.

Then one store grown to each of the ``--groups`` sizes in turn (Groups of ``--group-events`` events),
each size measured by a **fresh process** (this script with ``--measure``): the mesh's start-up time
over that store and its resident memory (RSS, /proc/self/status) started, with every Group owned
(loaded into the Authority's cache as by its first command), and with the size's count of
``--subscriptions`` followed ``ReadEvents`` streams (operator reader, caught up, waiting); the
streams' client side lives in that process too, so the figure per subscription is an upper bound of
the server's. A table over the sizes shows how each figure grows with the work.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from missionweave.kernel.clock import to_timestamp  # noqa: E402
from missionweave.kernel.errors import Rejected  # noqa: E402
from missionweave.kernel.eventlog import event_digest  # noqa: E402
from missionweave.kernel.signing import EVENT_TYPE, sign_envelope  # noqa: E402
from missionweave.v1 import command_pb2, common_pb2, event_pb2  # noqa: E402
from missionweave_server.config import Settings  # noqa: E402
from missionweave_server.mesh.server import start  # noqa: E402
from missionweave_server.services.authority import decider  # noqa: E402
from missionweave_server.services.authority.state import IdentityInfo  # noqa: E402
from missionweave_server.services.authority.store import AppendRequest, StoredEvent  # noqa: E402

NOW = datetime.now(UTC)
IDS = {
    "alice": IdentityInfo("alice", common_pb2.IDENTITY_KIND_HUMAN, session_epoch=1),
    "coord": IdentityInfo("coord", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
}


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def opening_events(group_id: str) -> tuple[list[event_pb2.Event], event_pb2.Event]:
    """The Mission's creation as the core decides it, and a message.posted template after it."""
    from tests import builders

    def command(kind: str, body: Any, n: int, epoch: int = 0) -> command_pb2.Command:
        c = command_pb2.Command(
            command_id=f"c{n}", group_id=group_id, actor_id="alice", session_epoch=1, membership_epoch=epoch,
            issued_at=to_timestamp(NOW),
        )  # fmt: skip
        getattr(c, kind).CopyFrom(body)
        return c

    ctx = decider.DecisionContext(NOW, IDS)
    created = decider.decide(
        None, command("mission_create", builders.mission_create("alice", "coord", NOW), 0), ctx
    )
    assert not isinstance(created, Rejected), created
    state = decider.fold(list(created))
    assert state is not None and state.mission is not None
    post = decider.decide(
        state,
        command("message_post", builders.message(state.mission.planning_conversation_id, "m"), 1, 1),
        ctx,
    )
    assert not isinstance(post, Rejected) and len(post) == 1, post
    return list(created), post[0]


class Filler:
    """Writes one Group's log of ``events`` events through ``store.append``, signed and chained."""

    def __init__(self, authority: Any, append_size: int) -> None:
        self.authority, self.append_size = authority, append_size

    async def fill(self, group_id: str, events: int) -> None:
        authority = self.authority
        opening, template = opening_events(group_id)
        link = b""
        pending: list[event_pb2.Event] = []
        head = 0
        n = 0

        def made() -> Any:
            nonlocal n
            yield from opening
            for seq in range(len(opening) + 1, events + 1):
                e = event_pb2.Event()
                e.CopyFrom(template)
                e.sequence = seq
                e.event_id = f"evt_{group_id}_{seq}"
                e.message_posted.message_id = f"msg_{seq}"
                yield e

        for event in made():
            pending.append(event)
            if len(pending) == self.append_size or event.sequence == events:
                stored = []
                for e in pending:
                    e.writer_epoch = 1
                    if e.sequence > 1:
                        e.previous_digest = link
                    payload = e.SerializeToString(deterministic=True)
                    link = event_digest(payload)
                    envelope = sign_envelope(payload, EVENT_TYPE, authority.signing_key, authority.key_id)
                    stored.append(
                        StoredEvent(
                            e.sequence,
                            e.event_id,
                            e.type,
                            int(e.recorded_at.ToMicroseconds()),
                            envelope.SerializeToString(),
                        )
                    )
                n += 1
                await authority.store.append(
                    AppendRequest(
                        group_id=group_id, writer_epoch=1, expected_head=head, command_id=f"bulk-{n}",
                        fingerprint=b"bulk", events=stored, creates_group=head == 0,
                    )
                )  # fmt: skip
                head = pending[-1].sequence
                pending = []


async def raw_read(store: Any, group_id: str) -> int:
    rows, after = 0, 0
    while batch := await store.read_history(group_id, after, 1024):
        rows += len(batch)
        after = batch[-1].sequence
    return rows


async def sizes_table(settings: Settings, sizes: list[int], append_size: int) -> list[dict[str, float]]:
    mesh = await start(settings)
    authority = mesh.authority
    assert authority is not None
    out = []
    try:
        filler = Filler(authority, append_size)
        for size in sizes:
            gid = f"grp_replay_{size}"
            t0 = time.perf_counter()
            await filler.fill(gid, size)
            fill_s = time.perf_counter() - t0
            print(
                f"  built {size:,} events in {fill_s:.1f}s ({size / fill_s:,.0f}/s: core template, chain, sign, bulk append)",
                flush=True,
            )
            await raw_read(authority.store, gid)  # the page cache warm for both
            t0 = time.perf_counter()
            rows = await raw_read(authority.store, gid)
            raw_s = time.perf_counter() - t0
            assert rows == size, (rows, size)
            authority.integrity.verified._known.clear()
            gc.collect()
            t0 = time.perf_counter()
            state = await authority.fold(gid)
            first_s = time.perf_counter() - t0
            assert state is not None and state.head_sequence == size
            del state
            authority.integrity.verified._known.clear()  # as in a new process
            gc.collect()
            t0 = time.perf_counter()
            state = await authority.fold(gid)
            ckpt_s = time.perf_counter() - t0
            assert state is not None and state.head_sequence == size
            del state
            gc.collect()
            row = {
                "size": size,
                "raw": size / raw_s,
                "first": size / first_s,
                "ckpt": size / ckpt_s,
                "fill": fill_s,
            }
            print(
                f"  {size:>9,} events: raw rows {row['raw']:,.0f}/s; first load {row['first']:,.0f} ev/s "
                f"({row['first'] / row['raw']:.0%} of raw, {first_s:.2f}s); checkpointed {row['ckpt']:,.0f} ev/s "
                f"({row['ckpt'] / row['raw']:.0%} of raw, {ckpt_s:.2f}s)",
                flush=True,
            )
            out.append(row)
    finally:
        await mesh.stop(grace=0.5)
    return out


async def fill_groups(settings: Settings, ids: list[str], group_events: int, append_size: int) -> float:
    """Add the Groups ``ids`` (``group_events`` each) to the store; seconds taken."""
    mesh = await start(settings)
    authority = mesh.authority
    assert authority is not None
    try:
        filler = Filler(authority, min(append_size, group_events))
        t0 = time.perf_counter()
        for i in range(0, len(ids), 64):
            await asyncio.gather(*(filler.fill(g, group_events) for g in ids[i : i + 64]))
        return time.perf_counter() - t0
    finally:
        await mesh.stop(grace=0.5)


def full_collection(r: dict[str, float]) -> None:
    """A full collection before reading RSS, timed: on a heap of a GiB it holds the event loop
    for seconds (the directory stream of the process goes stale meanwhile)."""
    t0 = time.perf_counter()
    gc.collect()
    r["gc_explicit_max_s"] = max(r.get("gc_explicit_max_s", 0.0), time.perf_counter() - t0)


class LoopStalls:
    """The longest the event loop went without running a task that asked to wake every TICK_S
    (its lateness: what every other task of the process waited too)."""

    TICK_S = 0.05

    def __init__(self) -> None:
        self.longest = 0.0

    async def _watch(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.TICK_S)
            self.longest = max(self.longest, time.perf_counter() - asked - self.TICK_S)

    def __enter__(self) -> LoopStalls:
        self._task = asyncio.create_task(self._watch())
        return self

    def __exit__(self, *exc: object) -> None:
        self._task.cancel()


class CollectorPasses:
    """The cyclic collector's full (oldest-generation) passes while inside, and the longest."""

    def __init__(self) -> None:
        self.full, self.full_longest, self._began = 0, 0.0, 0.0

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.full += 1
            self.full_longest = max(self.full_longest, time.perf_counter() - self._began)

    def __enter__(self) -> CollectorPasses:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)


# The followed streams of one size must all have caught up by then.
SUBSCRIBE_TIMEOUT_S = 120


def group_ids(groups: int) -> list[str]:
    return [f"grp_many_{i:05d}" for i in range(groups)]


async def measure_groups(
    settings: Settings, groups: int, group_events: int, subscriptions: int
) -> dict[str, float]:
    """In a fresh process (``--measure``): the mesh's start-up over the store and its RSS started,
    with the first ``groups`` Groups owned, and with ``subscriptions`` followed ReadEvents streams."""
    import grpc

    from missionweave.kernel.rejections import rejection_from_rpc_error
    from missionweave.kernel.signing import read_key
    from missionweave.sdk.client import MeshClient

    r: dict[str, float] = {"rss_before_start": rss_mib()}
    t0 = time.perf_counter()
    mesh = await start(settings)
    r["start_s"] = time.perf_counter() - t0
    authority = mesh.authority
    assert authority is not None
    ids = group_ids(groups)
    try:
        full_collection(r)
        r["rss_started"] = rss_mib()
        authority.loader.cache_size = max(authority.loader.cache_size, groups)  # every Group stays owned
        t0 = time.perf_counter()
        with LoopStalls() as stalls, CollectorPasses() as passes:
            for i in range(0, groups, 64):  # what a first command does: acquire, fold verified, cache
                await asyncio.gather(*(authority._load(g) for g in ids[i : i + 64]))
        r["own_s"] = time.perf_counter() - t0
        r["stall_max_s"], r["gc_full_passes"], r["gc_full_max_s"] = (
            stalls.longest,
            passes.full,
            passes.full_longest,
        )
        full_collection(r)
        r["rss_owned"] = rss_mib()
        r["per_group_kib"] = (r["rss_owned"] - r["rss_started"]) * 1024 / groups
        client = MeshClient(f"127.0.0.1:{mesh.port}")
        admin = await client.open_session("admin", read_key(settings.admin_key_path))
        client.read_as(admin)
        streams = []
        retries: list[str] = []

        async def follow(g: str, caught_up: asyncio.Event) -> None:
            while True:  # as an agent does: a retryable refusal is tried again after its delay
                try:
                    async for event in client.read_events(g, group_events - 1, follow=True):
                        if event.sequence >= group_events:
                            caught_up.set()
                    return
                except grpc.aio.AioRpcError as err:
                    rejection = rejection_from_rpc_error(err)
                    if rejection is None or not rejection.retry_after_ms:
                        raise
                    retries.append(common_pb2.RejectionReason.Name(rejection.reason))
                    await asyncio.sleep(rejection.retry_after_ms / 1000)

        full_collection(r)
        before = rss_mib()
        flags = []
        for g in ids[:subscriptions]:
            flag = asyncio.Event()
            flags.append(flag)
            streams.append(asyncio.create_task(follow(g, flag)))
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flags)), timeout=SUBSCRIBE_TIMEOUT_S)
        except TimeoutError:
            r["caught_up"] = sum(1 for f in flags if f.is_set())
            failed = [t.exception() for t in streams if t.done() and not t.cancelled() and t.exception()]
            print(
                f"only {r['caught_up']} of {subscriptions} streams caught up in {SUBSCRIBE_TIMEOUT_S}s; "
                f"{len(failed)} ended with an error (first: {failed[0] if failed else None})",
                file=sys.stderr,
                flush=True,
            )
            raise
        r["subscribe_s"] = time.perf_counter() - t0
        r["retries"] = len(retries)
        if retries:
            print(
                f"{len(retries)} ReadEvents retried after a retryable refusal ({sorted(set(retries))})",
                file=sys.stderr,
                flush=True,
            )
        full_collection(r)
        r["rss_subscribed"] = rss_mib()
        r["per_subscription_kib"] = (r["rss_subscribed"] - before) * 1024 / max(1, subscriptions)
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        await client.channel.close()
    finally:
        await mesh.stop(grace=0.5)
    return r


async def many_groups(
    settings: Settings, sizes: list[int], subscriptions: list[int], group_events: int, append_size: int
) -> list[dict[str, float]]:
    """One store grown to each size in turn, each size measured by a fresh process."""
    out: list[dict[str, float]] = []
    built = 0
    for groups, subs in zip(sizes, subscriptions, strict=True):
        fill_s = await fill_groups(settings, group_ids(groups)[built:], group_events, append_size)
        print(f"  built Groups {built:,}..{groups:,} x {group_events} events in {fill_s:.1f}s", flush=True)
        built = groups
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--measure",
            f"{groups},{group_events},{subs}",
            str(settings.data_dir),
            stdout=asyncio.subprocess.PIPE,
        )
        stdout, _ = await child.communicate()
        if child.returncode:
            raise RuntimeError(f"the measuring process failed ({child.returncode})")
        r = json.loads(stdout.decode().strip().splitlines()[-1])
        r.update(groups=groups, subscriptions=subs)
        print(
            f"  {groups:,} Groups: start-up {r['start_s']:.2f}s; RSS {r['rss_started']:.0f} MiB started, "
            f"{r['rss_owned']:.0f} MiB with all owned ({r['own_s']:.1f}s to own them, longest loop stall "
            f"{r['stall_max_s']:.2f}s, {r['gc_full_passes']:.0f} full collector passes, longest {r['gc_full_max_s']:.2f}s) = "
            f"{r['per_group_kib']:.1f} KiB per owned Group (this bench's own full collections before reading RSS: up to "
            f"{r['gc_explicit_max_s']:.2f}s); {subs:,} followed streams caught up in {r['subscribe_s']:.1f}s "
            f"({r['retries']:.0f} retried): {r['rss_subscribed']:.0f} MiB = {r['per_subscription_kib']:.1f} KiB per subscription",
            flush=True,
        )
        out.append(r)
    return out


def settings_for(data_dir: Path) -> Settings:
    settings = Settings.from_env()  # MWP_VERIFY_WORKERS and the other tuning variables apply
    settings.listen, settings.data_dir, settings.grace_seconds = "127.0.0.1:0", data_dir, 0.5
    return settings


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


async def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--measure":  # the fresh process of many_groups
        groups, group_events, subscriptions = int_list(sys.argv[2])
        print(
            json.dumps(
                await measure_groups(settings_for(Path(sys.argv[3])), groups, group_events, subscriptions)
            )
        )
        return 0
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", default="10000,100000,1000000", help="events per Group for the load table")
    p.add_argument("--append", type=int, default=1000, help="events per bulk append (default 1000)")
    p.add_argument(
        "--groups", default="1000,3000,10000", help="Groups for start-up and memory, one store grown to each"
    )
    p.add_argument(
        "--group-events", type=int, default=100, help="events of each of those Groups (default 100)"
    )
    p.add_argument(
        "--subscriptions", default="100,300,1000", help="followed ReadEvents streams at each of those sizes"
    )
    args = p.parse_args()
    sizes, groups, subscriptions = int_list(args.sizes), int_list(args.groups), int_list(args.subscriptions)
    if len(subscriptions) != len(groups) or any(s > g for s, g in zip(subscriptions, groups, strict=True)):
        p.error("--subscriptions needs one count per --groups size, each at most that size")
    work = Path(tempfile.mkdtemp(prefix="mwp-replay-"))
    try:
        print(
            f"replay bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, SQLite store in {work}"
        )
        table = await sizes_table(settings_for(work / "sizes"), sizes, args.append) if sizes else []
        many = await many_groups(
            settings_for(work / "many"), groups, subscriptions, args.group_events, args.append
        )
        if table:
            print()
            print("| events | raw row read (anchor) | first load | ratio | checkpointed load | ratio |")
            print("|---|---|---|---|---|---|")
        for row in table:
            print(
                f"| {row['size']:,} | {row['raw']:,.0f} rows/s | {row['first']:,.0f} ev/s | {row['first'] / row['raw']:.0%} "
                f"| {row['ckpt']:,.0f} ev/s | {row['ckpt'] / row['raw']:.0%} |"
            )
        print()
        print(
            f"| Groups x {args.group_events} events | start-up | RSS started | RSS all owned | to own them all "
            "| longest loop stall | full collector passes (longest) | per owned Group | followed subscriptions | caught up in "
            "| per subscription |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in many:
            print(
                f"| {r['groups']:,} | {r['start_s']:.2f} s | {r['rss_started']:.0f} MiB | {r['rss_owned']:.0f} MiB "
                f"| {r['own_s']:.1f} s | {r['stall_max_s']:.2f} s | {r['gc_full_passes']:.0f} ({r['gc_full_max_s']:.2f} s) "
                f"| {r['per_group_kib']:.1f} KiB | {r['subscriptions']:,} | {r['subscribe_s']:.1f} s "
                f"| {r['per_subscription_kib']:.1f} KiB |"
            )
        print(f"load average now {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
