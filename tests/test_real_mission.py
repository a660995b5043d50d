"""Issue 38: a whole real Mission through the public API, as people do it, in both topologies.

The owner creates the Mission with a budget (`mwp mission create`); the Coordinator applies the
diamond plan of examples/plan.toml (`mwp plan apply`); two Workers run under `mwp worker run` with
examples/ledger_handlers.py, which reads its inputs through its slot and writes real CSV and
Markdown files; `reconcile` fails transiently once and is retried; the Coordinator reviews each
result (`mwp work accept-result`) and submits the Mission with the report; the owner reads
`mwp mission review` and approves from it. Then every approved Artifact is fetched by its content
hash and verified (`mwp artifact verify`), and its provenance is walked back to the first inputs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from missionweave.kernel.signing import write_key
from missionweave.v1 import common_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from tests import default_signals
from tests.conftest import World

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)
ROOT = Path(__file__).resolve().parent.parent
WS = wp.WorkItemState
PLAN = ROOT / "examples" / "plan.toml"


@dataclass
class People:
    w: World
    tmp: Path
    keys: dict[str, Path]

    def env(self) -> dict[str, str]:
        # Reads are proven as the MissionOwner unless a command names its own --as/--key; agents'
        # state goes to a private location of the test, never the working tree.
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "MWP_AS": "alice",
            "MWP_KEY": str(self.keys["alice"]),
            "MWP_TARGET": self.w.target,
            "XDG_STATE_HOME": str(self.tmp / "state"),
            "MWP_LOG_FORMAT": "json",
        }

    def as_(self, identity: str) -> list[str]:
        return ["--as", identity, "--key", str(self.keys[identity])]

    async def mwp(self, *args: str, expect: int = 0) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "missionweave.cli",
            *args,
            cwd=self.tmp,
            env=self.env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 90)
        assert proc.returncode == expect, (
            f"mwp {' '.join(args)} exited {proc.returncode}:\n{err.decode()}{out.decode()}"
        )
        return out.decode()

    async def json(self, *args: str) -> Any:
        return json.loads(await self.mwp(*args, "--json"))

    async def worker(self, identity: str, group: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            default_signals.PATH,  # a child of a background job would ignore SIGINT: it stops on it
            "-m",
            "missionweave.cli",
            "worker",
            "run",
            "--config",
            str(ROOT / "examples" / "ledger_worker.toml"),
            "--group",
            group,
            *self.as_(identity),
            "--json",
            cwd=self.tmp,
            env=self.env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

    async def until(self, group: str, work_item_id: str, *states: int) -> wp.WorkItem:
        async with asyncio.timeout(90):
            while True:
                item = await self.w.client.work_item(group, work_item_id)
                if item.state in states:
                    return item
                await asyncio.sleep(0.2)


async def cast(w: World, tmp: Path) -> People:
    """Key files for the owner and the Coordinator of the world, and two Workers registered now."""
    from missionweave.kernel.signing import read_key

    keys = {"alice": tmp / "alice.key", "coord-bot": tmp / "coord.key"}
    write_key(keys["alice"], w.owner.key)
    write_key(keys["coord-bot"], w.coordinator.key)
    admin_key = read_key(w.settings.admin_key_path)
    for worker in ("worker-1", "worker-2"):
        key = SigningKey.generate()
        keys[worker] = tmp / f"{worker}.key"
        write_key(keys[worker], key)
        await w.client.register_identity(
            "admin", admin_key, worker, common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
        )
    return People(w, tmp, keys)


@pytest.mark.req("MW-13.1-03", "MW-13.1-04", "MW-13.1-05", "MW-13.2-02", "MW-7.3-04", "MW-11.4-08")
async def test_a_whole_mission_from_the_cli_with_real_artifacts_and_their_provenance(
    world: World, tmp_path: Path
) -> None:
    p = await cast(world, tmp_path)
    owner, coord = p.as_("alice"), p.as_("coord-bot")
    group = (
        (
            await p.mwp(
                "mission",
                "create",
                *owner,
                "--title",
                "Q3 figures",
                "--objective",
                "Consolidate and report the Q3 figures",
                "--done",
                "the Q3 report is approved",
                "--coordinator",
                "coord-bot",
                "--tokens",
                "100000",
                "--tool-calls",
                "500",
                "--budget",
                "10",
            )
        )
        .strip()
        .splitlines()[-1]
    )
    await p.mwp("coordinator", "renew", "--group", group, *coord)
    for worker in ("worker-1", "worker-2"):
        await p.mwp("member", "grant", "--group", group, worker, "--role", "worker", *owner)
    await p.mwp("plan", "apply", str(PLAN), "--group", group, *coord, "--yes")
    assert (
        "nothing to change"
        in (await p.mwp("plan", "apply", str(PLAN), "--group", group, *coord, "--yes")).lower()
    )

    workers = [await p.worker(name, group) for name in ("worker-1", "worker-2")]
    try:
        for proc in workers:
            assert proc.stdout is not None
            started = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
            assert started["event"] == "started"
        # The Coordinator offers each WorkItem once its dependencies are verified, and reviews it.
        for wid, to in (
            ("extract-eu", "worker-1"),
            ("extract-us", "worker-2"),
            ("reconcile", "worker-1"),
            ("report", "worker-2"),
        ):
            await p.mwp("work", "offer", "--group", group, wid, "--to", to, *coord)
            await p.until(group, wid, WS.WORK_ITEM_STATE_SUBMITTED)
            await p.mwp("work", "accept-result", "--group", group, wid, *coord)
            await p.until(group, wid, WS.WORK_ITEM_STATE_VERIFIED)
    finally:
        for proc in workers:
            if proc.returncode is None:
                proc.send_signal(signal.SIGINT)
        logs = [await asyncio.wait_for(proc.communicate(), 60) for proc in workers]
    assert all(proc.returncode == 0 for proc in workers), [err.decode()[-2000:] for _, err in logs]

    # reconcile failed transiently once and was retried under its contract (MW-11.4-08).
    events = [e async for e in world.client.read_events(group)]
    revoked = [e.lease_revoked for e in events if e.WhichOneof("payload") == "lease_revoked"]
    assert [(r.work_item_id, r.cause) for r in revoked] == [("reconcile", wp.LEASE_REVOCATION_CAUSE_FAILED)]
    assert (await world.client.work_item(group, "reconcile")).attempts == 2

    report = await p.json("work", "show", "--group", group, "report")
    [delivered] = report["artifacts"]
    digest = f"blake3:{delivered['digest']['hex']}:{delivered['digest']['size_bytes']}"
    await p.mwp(
        "mission",
        "submit",
        "--group",
        group,
        "--summary",
        "Q3 report from the consolidated figures",
        "--artifact",
        digest,
        *coord,
    )

    # The owner sees what they approve, and approves from there.
    review = await p.json("mission", "review", "--group", group)
    text = json.dumps(review)
    assert delivered["digest"]["hex"] in text and "figures-match" in text and "Q3 report" in text
    await p.mwp("mission", "review", "--group", group, "--approve", "--comment", "ship it", *owner)
    assert (await world.client.group_state(group)).mission.state == mission_pb2.MISSION_STATE_APPROVED

    # Every approved Artifact exists: fetched by its content hash and verified, its provenance
    # walks back through reconcile to both extractions.
    await p.mwp("artifact", "verify", digest)
    fetched = tmp_path / "q3-report.md"
    await p.mwp("artifact", "get", digest, "-o", str(fetched))
    assert fetched.read_text().startswith("# Q3 report") and "acme-us" in fetched.read_text()
    provenance = await p.json("artifact", "provenance", digest, "--direction", "ancestors")
    ancestors = {n["digest"]["hex"] for n in provenance["nodes"] if n.get("is_ancestor")}
    firsts = [
        a["digest"]["hex"]
        for wid in ("extract-eu", "extract-us", "reconcile")
        for a in (await p.json("work", "show", "--group", group, wid))["artifacts"]
    ]
    assert len(firsts) == 3 and set(firsts) <= ancestors
