"""The gateway's shared Group feed: the cost of one subscription's take as the window fills, with a
plain list slice as the anchor in the same run (missionweave_server/services/gateway/fanout.py, D152).

    PYTHONPATH=. .venv/bin/python bench/feed_window.py          # windows of 16, 256, 4,096 entries (~10 s)

A ``GroupFeed`` is fed batches through a stand-in FollowGroup call until its window holds the size's
entries (the default ``FEED_ENTRIES`` is 4,096: a busy Group's window is full), then
``take(delivered, 8)`` is timed for a subscription one frame behind the head, as a caught-up
subscriber asks after every frame. The anchor is slicing 8 items off the end of a list of the same
length. Reported per size: us per take, the anchor, their ratio, and the growth from the smallest.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import timeit
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from missionweave.internal.v1 import group_log_pb2 as glpb  # noqa: E402
from missionweave_server.services.gateway import fanout  # noqa: E402


class _Call:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[glpb.FollowGroupResponse] = asyncio.Queue()

    async def read(self) -> Any:
        got = await self.queue.get()
        self.queue.task_done()
        return got

    def cancel(self) -> None:
        pass


async def feed_of(entries: int) -> fanout.GroupFeed:
    call = _Call()

    async def opener(after: int) -> _Call:
        return call

    feed = fanout.GroupFeed("grp_bench", 0, opener, lambda _: None)
    for first in range(1, entries + 1, 256):
        batch = glpb.LogBatch()
        for sequence in range(first, min(first + 256, entries + 1)):
            entry = batch.entries.add(sequence=sequence)
            entry.envelope.payload = b"x" * 200
            entry.audience.full_members = True
        batch.head_sequence = batch.entries[-1].sequence
        await call.queue.put(glpb.FollowGroupResponse(batch=batch))
        await call.queue.join()
    return feed


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16,256,4096", help="window sizes in entries")
    p.add_argument("--number", type=int, default=100_000, help="takes timed per size")
    args = p.parse_args()
    rows = []
    for size in (int(x) for x in args.sizes.split(",")):
        feed = await feed_of(size)
        assert feed.oldest_after() == 0 and feed.position == size
        behind = size - 8
        take = partial(feed.take, behind, 8)
        ours = min(timeit.repeat(take, number=args.number, repeat=3)) / args.number
        plain = list(range(size))
        anchor = (
            min(timeit.repeat(partial(plain.__getitem__, slice(-8, None)), number=args.number, repeat=3))
            / args.number
        )
        rows.append((size, ours * 1e6, anchor * 1e6))
        feed.task.cancel()
    print("one subscription's take of 8 entries one frame behind the head (us; anchor: a list slice of 8)")
    print(f"{'window':>7} {'take':>8} {'anchor':>8} {'take/anchor':>12} {'growth':>8}")
    for size, ours_us, anchor_us in rows:
        print(
            f"{size:>7,} {ours_us:>8.3f} {anchor_us:>8.3f} {ours_us / anchor_us:>11.1f}x {ours_us / rows[0][1]:>7.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
