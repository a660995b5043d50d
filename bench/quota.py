"""Quota benchmark: an upload's quota reservation as the identity's holdings grow (D151), with a raw
SQLite anchor in the same run.

    PYTHONPATH=. .venv/bin/python bench/quota.py                       # 100, 10k, 100k, 300k blobs held (~1 min)
    PYTHONPATH=. .venv/bin/python bench/quota.py --held 100,1000000 --reps 50

Every upload by an identity with a quota reserves its size first (``ArtifactIndex.reserve``: one
transaction that takes the database's write lock, checks what the identity holds plus what it is
uploading and inserts the reservation) and ends it when the blob is recorded. Per size, the
identity's ``holders`` rows are inserted directly (plain ``sqlite3``, 4 KiB blobs), its
``holdings`` row set to their sum as the index keeps it, and then ``--reps`` reserve + release pairs
are timed through the index as the artifact service calls it. The anchor, on the same file and in
the same run: a plain ``sqlite3`` transaction (BEGIN IMMEDIATE, one primary-key lookup, one insert,
COMMIT at the store's synchronous level), the least a reservation can cost. Reported per size: the
reservation's p50 / p99, the anchor's p50, their ratio, and the growth from the smallest size.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from missionweave_server.services.artifacts.index import ArtifactIndex  # noqa: E402
from missionweave_server.services.artifacts.schema import create_schema, holders, holdings  # noqa: E402
from missionweave_server.storage.db import make_engine, sqlite_url  # noqa: E402

BLOB = 4096
IDENTITY = "agent-quota"


def grow(db: str, have: int, want: int) -> None:
    conn = sqlite3.connect(db)
    rows = ((f"{i:064x}", IDENTITY, BLOB, 1) for i in range(have, want))
    conn.executemany(
        f"INSERT INTO {holders.name} (digest, identity_id, size_bytes, stored_us) VALUES (?,?,?,?)", rows
    )
    conn.execute(
        f"INSERT INTO {holdings.name} (identity_id, held_bytes) VALUES (?, ?) "
        "ON CONFLICT (identity_id) DO UPDATE SET held_bytes = excluded.held_bytes",
        (IDENTITY, want * BLOB),
    )
    conn.commit()
    conn.close()


def anchor(db: str, reps: int) -> list[float]:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS anchor_rows (id TEXT PRIMARY KEY, n INTEGER)")
    out = []
    for k in range(reps):
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(f"SELECT held_bytes FROM {holdings.name} WHERE identity_id = ?", (IDENTITY,)).fetchone()
        conn.execute("INSERT INTO anchor_rows VALUES (?, ?)", (f"r{time.monotonic_ns()}-{k}", BLOB))
        conn.execute("COMMIT")
        out.append(time.perf_counter() - t0)
    conn.close()
    return out


async def reserve_release(index: ArtifactIndex, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        reservation, _ = await index.reserve(IDENTITY, BLOB, 10**15, 1, 10**12)
        out.append(time.perf_counter() - t0)
        assert reservation
        await index.release(reservation)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--held", default="100,10000,100000,300000", help="blobs the identity holds, per size")
    p.add_argument("--reps", type=int, default=200, help="reservations timed per size (default 200)")
    args = p.parse_args()
    sizes = [int(x) for x in args.held.split(",")]
    with tempfile.TemporaryDirectory(prefix="mwp-quota-") as tmp:
        engine = make_engine(sqlite_url(Path(tmp)))
        await create_schema(engine)
        index = ArtifactIndex(engine)
        db = str(Path(tmp) / "missionweave.db")
        have, rows = 0, []
        try:
            for size in sizes:
                t0 = time.perf_counter()
                grow(db, have, size)
                have = size
                print(f"  {size:,} blobs held ({time.perf_counter() - t0:.1f}s to insert them)", flush=True)
                await reserve_release(index, 10)  # warm: statement cache, page cache
                ours = await reserve_release(index, args.reps)
                raw = anchor(db, args.reps)
                rows.append((size, pct(ours, 0.5), pct(ours, 0.99), statistics.median(raw) * 1e3))
        finally:
            await index.close()
            await engine.dispose()
    print(
        "\nan upload's quota reservation (ms; anchor: plain sqlite3 BEGIN IMMEDIATE + lookup + insert + COMMIT, same file, same run)"
    )
    print(
        f"{'blobs held':>11} {'reserve p50':>12} {'p99':>8} {'anchor p50':>11} {'ours/anchor':>12} {'growth (p50)':>13}"
    )
    for size, p50, p99, raw in rows:
        print(
            f"{size:>11,} {p50:>12.2f} {p99:>8.2f} {raw:>11.2f} {p50 / raw:>11.1f}x {p50 / rows[0][1]:>12.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
