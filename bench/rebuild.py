"""Rebuild benchmark: how long the Authority takes to load Groups from its store, with and without
the verification of what it reads (issue 13 item 5, docs/integrity.md).

    PYTHONPATH=. .venv/bin/python bench/rebuild.py                    # 20 Groups x 500 events, SQLite
    PYTHONPATH=. .venv/bin/python bench/rebuild.py --groups 50 --events 1000 --database-url postgresql://...

It fills a store through the public API (``ExecuteCommandBatch``), restarts the mesh, and times the
fold of every Group (what the first command after a start or a take-over pays) three ways: without
any check (the fold as it was before: decode and evolve), verified cold (every signature checked,
in batches, by the signature worker, ``MWP_VERIFY_WORKERS``, default 1) and verified warm (the
same process folding again: envelopes already verified are recognised by their digest) and
verified after a checkpoint (the cache emptied, as in a new process: the cold pass left a signed
chain checkpoint at each head, so only the hash chain is checked up to it). An untimed unverified
pass first warms the database's page cache.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from nacl.signing import SigningKey

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from missionweave.kernel import codec  # noqa: E402
from missionweave.kernel.clock import SystemClock  # noqa: E402
from missionweave.kernel.signing import read_key  # noqa: E402
from missionweave.sdk.client import MeshClient  # noqa: E402
from missionweave.v1 import common_pb2, conversation_pb2, mission_pb2  # noqa: E402
from missionweave_server.config import Settings  # noqa: E402
from missionweave_server.mesh.server import start  # noqa: E402


def mission(owner: str, coordinator: str) -> mission_pb2.MissionCreate:
    from tests import builders

    return builders.mission_create(owner, coordinator, SystemClock().now())


async def fill(settings: Settings, groups: int, events: int) -> list[str]:
    mesh = await start(settings)
    client = MeshClient(f"127.0.0.1:{mesh.port}")
    try:
        admin_key = read_key(settings.admin_key_path)
        await client.open_session("admin", admin_key)
        key = SigningKey.generate()
        await client.register_identity(
            "admin", admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN, bytes(key.verify_key)
        )
        await client.register_identity(
            "admin",
            admin_key,
            "coord",
            common_pb2.IDENTITY_KIND_AGENT,
            bytes(SigningKey.generate().verify_key),
        )
        alice = await client.open_session("alice", key)
        ids = [f"grp_rebuild_{i:04d}" for i in range(groups)]
        for group in ids:
            await client.execute(
                alice.sign(alice.command(group, "mission_create", mission("alice", "coord")))
            )
        convs = {g: (await client.group_state(g)).mission.planning_conversation_id for g in ids}
        per_group = events - 5
        for start_at in range(0, per_group, 16):
            batch = [
                alice.sign(
                    alice.command(
                        g,
                        "message_post",
                        conversation_pb2.MessagePost(
                            conversation_id=convs[g],
                            content=conversation_pb2.MessageContent(text=f"m{start_at + j}"),
                        ),
                        membership_epoch=1,
                    )
                )
                for g in ids
                for j in range(min(16, per_group - start_at))
            ]
            for i in range(0, len(batch), 256):
                await client.execute_batch(batch[i : i + 256])
        return ids
    finally:
        await client.channel.close()
        await mesh.stop(grace=0.5)


async def timed(settings: Settings, ids: list[str]) -> dict[str, float]:
    mesh = await start(settings)
    authority = mesh.authority
    assert authority is not None
    out: dict[str, float] = {}
    try:
        from missionweave_server.services.authority import decider

        async def forget(group_id: str) -> None:
            authority.integrity.verified._known.clear()

        async def plain(group_id: str) -> None:  # the fold as it was: decode and evolve, no checks
            state = None
            after = 0
            while batch := await authority.store.read_history(group_id, after, 1024):
                for stored in batch:
                    state = decider.evolve(state, codec.decode_event(stored.envelope))
                after = batch[-1].sequence

        async def checkpointed(group_id: str) -> None:  # a new process: nothing cached, the checkpoint stored
            await authority.fold(group_id)

        passes = (
            ("(database warm-up)", plain),
            ("unverified", plain),
            ("verified, cold", authority.fold),
            ("verified, warm", authority.fold),
            ("(forget the cache)", forget),
            ("verified, checkpointed", checkpointed),
        )
        for label, fold in passes:
            t0 = time.perf_counter()
            for group_id in ids:
                await fold(group_id)
            out[label] = time.perf_counter() - t0
    finally:
        await mesh.stop(grace=0.5)
    return out


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=20)
    p.add_argument("--events", type=int, default=500, help="events per Group (at least 6)")
    p.add_argument("--database-url", default="")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mwp-rebuild-"))
    try:
        settings = Settings.from_env()  # MWP_VERIFY_WORKERS and the other tuning variables apply
        settings.listen, settings.data_dir, settings.grace_seconds = "127.0.0.1:0", work, 0.5
        settings.database_url = args.database_url
        t0 = time.perf_counter()
        ids = await fill(settings, args.groups, args.events)
        total = args.groups * args.events
        print(f"filled {args.groups} Groups x {args.events} events in {time.perf_counter() - t0:.1f}s")
        for label, seconds in (await timed(settings, ids)).items():
            if label.startswith("("):
                continue
            print(
                f"  fold {label:22s} {seconds * 1000:8.0f} ms  {seconds / total * 1e6:6.1f} us/event  {total / seconds:9,.0f} events/s"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
