"""``mwp worker queue`` and ``mwp worker run``: the CLI as a subprocess against a live mesh (the
``bench`` of tests/test_cli_mission.py, or the ``world`` of tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.signing import generate_key, write_key
from missionweave.v1 import membership_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.conftest import World, polled
from tests.test_cli_member import mission_group
from tests.test_cli_mission import ROOT, Bench, execute
from tests.test_cli_mission import bench as bench  # the fixture
from tests.test_missions import G
from tests.test_work_items import Flow, setup


@pytest.mark.req("MW-11.1-01", "MW-11.1-03")
async def test_a_worker_lists_its_own_queue_and_nobody_elses(bench: Bench) -> None:
    group = await mission_group(bench)
    grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await execute(bench, "alice", group, "membership_grant", grant)
    body = wp.WorkAuthorize(
        work_item_id="wi-1", title="t", contract=builders.contract(bench.clock.now()), coordinator_epoch=1
    )
    await execute(bench, "coord-bot", group, "work_authorize", body)
    offer = wp.WorkOffer(
        work_item_id="wi-1",
        offer_id="off-1",
        candidate_ids=["worker-bot"],
        coordinator_epoch=1,
        expires_at=to_timestamp(bench.clock.now() + timedelta(minutes=5)),
        selection_criteria=[builders.selection("worker-bot")],
    )
    await execute(bench, "coord-bot", group, "work_offer", offer)
    await execute(
        bench,
        "worker-bot",
        group,
        "work_accept_offer",
        wp.WorkAcceptOffer(work_item_id="wi-1", offer_id="off-1", contract_revision=1),
    )
    shown = (await bench.mwp("worker", "queue", "--group", group, *bench.as_("worker-bot"))).stdout
    assert f"worker-bot's queue of {group}" in shown and "wi-1" in shown and "queued" in shown
    document = (
        await bench.mwp("worker", "queue", "--group", group, "--json", *bench.as_("worker-bot"))
    ).json()
    assert [e["work_item_id"] for e in document["entries"]] == ["wi-1"]
    # The Coordinator's own queue holds none of the Worker's work.
    theirs = (await bench.mwp("worker", "queue", "--group", group, *bench.as_("coord-bot"))).stdout
    assert "wi-1" not in theirs and "(empty)" in theirs
    # Not a member: refused, exit 1.
    await bench.mwp("worker", "queue", "--group", "grp_never", *bench.as_("worker-bot"), expect=1)


# ------------------------------------------------------------------ mwp worker run

HANDLER = '''
"""A handler written for the test: it stores its worksheet through the slot, with one Evidence per
acceptance criterion."""
from missionweave.sdk.worker import Slot, WorkResult
from missionweave.v1 import work_pb2 as wp


async def handle(slot: Slot) -> WorkResult:
    await slot.put(f"{slot.work_item_id}: {slot.contract.goal}".encode(), media_type="text/plain")
    evidence = [
        wp.Evidence(
            evidence_id=f"ev-{c.criterion_id}", criterion_id=c.criterion_id, method=wp.EVIDENCE_METHOD_TEST,
            result=wp.EVIDENCE_RESULT_PASS, summary="checked",
        )
        for c in slot.contract.acceptance_criteria
    ]
    return WorkResult(evidence=evidence, summary="from the config's handler")


def not_async(slot):
    return None
'''


def write_config(path: Path, **entries: object) -> Path:
    """A TOML file of ``entries`` (strings, numbers and lists of strings are all the config holds)."""

    def value(v: object) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)  # a JSON string or number is a TOML one too

    path.write_text("".join(f"{k} = {value(v)}\n" for k, v in entries.items()))
    return path


async def start_mwp(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        *args,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "MWP_LOG_FORMAT": "json"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def mwp(*args: str) -> tuple[int, str, str]:
    proc = await start_mwp(*args)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.req("MW-10.3-07", "MW-11.1-05")
async def test_mwp_worker_run_serves_a_group_with_the_configured_handler_until_sigint(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))  # the user's state location
    flow: Flow = await setup(w)
    key = tmp_path / "worker.key"
    write_key(key, w.worker.key)
    (tmp_path / "handlers").mkdir()
    (tmp_path / "handlers" / "sheet.py").write_text(HANDLER)
    config = write_config(
        tmp_path / "worker.toml",
        target=w.target,
        identity="worker-bot",
        key="worker.key",
        groups=[G],
        handler="handlers/sheet.py:handle",
    )
    proc = await start_mwp("worker", "run", "--config", str(config), "--json")
    try:
        assert proc.stdout is not None
        started = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
        assert (
            started["event"] == "started" and started["groups"] == [G] and started["identity"] == "worker-bot"
        )
        await flow.authorize("wi-1")
        await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))
        async with asyncio.timeout(60):
            async for event in w.client.read_events(G, follow=True):
                if (
                    event.WhichOneof("payload") == "work_submitted"
                    and event.work_submitted.work_item_id == "wi-1"
                ):
                    break
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    stopped = json.loads(out.decode().splitlines()[-1])
    assert stopped == {"event": "stopped", "submitted": [{"group_id": G, "work_item_id": "wi-1"}]}
    lines = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    logged = {
        (e.get("command"), e.get("outcome"))
        for e in lines
        if e.get("work_item") == "wi-1" and e.get("group") == G
    }
    # Each command the runtime sent, named with its Group and WorkItem: the offer answered, the
    # start and the submission; and the submission observed on the runtime's progress.
    assert {
        ("work_accept_offer", "accepted"),
        ("work_start", "accepted"),
        ("work_submit", "accepted"),
    } <= logged
    assert ("work_submit", None) in logged
    # The deliverable stored through the slot counts among what was handed in.
    assert any(e.get("msg") == "wi-1 done: 1 artifact(s), 1 evidence" for e in lines)
    assert "Traceback" not in err.decode()
    log = [e async for e in w.client.read_events(G)]
    [submitted] = [e.work_submitted for e in log if e.WhichOneof("payload") == "work_submitted"]
    assert submitted.summary == "from the config's handler" and [
        e.criterion_id for e in submitted.evidence
    ] == ["balances"]
    # The Worker signed with the session mwp saved next to its key: no other session was opened.
    saved = json.loads((tmp_path / "worker.key.session.json").read_text())
    assert saved == {"identity": "worker-bot", "session_epoch": started["session_epoch"]}
    # The agent's state (its session's private key among it) is in the user's state location, for
    # its owner only, and the deliverable it handed in is stored with its manifest.
    state = tmp_path / "xdg-state" / "missionweave" / "workers" / "worker-bot"
    assert (state / "session.json").stat().st_mode & 0o777 == 0o600
    assert state.stat().st_mode & 0o777 == 0o700
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".worker")]
    assert (await w.client.download(submitted.artifacts[0].digest)).startswith(b"wi-1: ")


async def test_mwp_worker_run_human_start_line_and_sigterm(world: World, tmp_path: Path) -> None:
    w = world
    await setup(w)
    key = tmp_path / "worker.key"
    write_key(key, w.worker.key)
    (tmp_path / "sheet.py").write_text(HANDLER)
    config = write_config(
        tmp_path / "w.toml", identity="worker-bot", key="worker.key", groups=[G], handler="sheet.py:handle"
    )
    proc = await start_mwp("--target", w.target, "worker", "run", "--config", str(config))
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    assert f"worker-bot serves 1 Group(s) ({G}) with sheet.py:handle at {w.target}" in line
    proc.send_signal(signal.SIGTERM)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "stopped after 0 submission(s)" in out.decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_mwp_worker_run_bad_configs_exit_2_with_a_clear_message_and_an_unreachable_mesh_exits_3(
    tmp_path: Path,
) -> None:
    key = tmp_path / "worker.key"
    write_key(key, generate_key())
    (tmp_path / "sheet.py").write_text(HANDLER)
    (tmp_path / "broken.py").write_text("import missionweave.no_such_module\n")
    good = {
        "identity": "worker-bot",
        "key": "worker.key",
        "groups": ["grp_a"],
        "handler": "sheet.py:handle",
        "target": f"127.0.0.1:{free_port()}",
        "connect_timeout": 2,
    }
    unreadable = tmp_path / "open.key"
    write_key(unreadable, generate_key())
    unreadable.chmod(0o644)
    (tmp_path / "not-toml.toml").write_text("groups = [\n")
    cases = {
        "missing groups": (
            write_config(tmp_path / "a.toml", **{k: v for k, v in good.items() if k != "groups"}),
            "missing key groups",
        ),
        "no identity": (
            write_config(tmp_path / "b.toml", **{k: v for k, v in good.items() if k != "identity"}),
            "missing key identity",
        ),
        "unknown key": (write_config(tmp_path / "c.toml", **good, group="grp_a"), "unknown key(s) group"),
        "empty groups": (
            write_config(tmp_path / "d.toml", **{**good, "groups": []}),
            "groups must be a non-empty list",
        ),
        "no such function": (
            write_config(tmp_path / "e.toml", **{**good, "handler": "sheet.py:nope"}),
            "has no 'nope'",
        ),
        "not async": (
            write_config(tmp_path / "f.toml", **{**good, "handler": "sheet.py:not_async"}),
            "is not an async function",
        ),
        "no such file": (
            write_config(tmp_path / "g.toml", **{**good, "handler": "gone.py:handle"}),
            "does not exist",
        ),
        "no such module": (
            write_config(tmp_path / "h.toml", **{**good, "handler": "no_such_pkg.mod:handle"}),
            "not found",
        ),
        "handler fails to import": (
            write_config(tmp_path / "i.toml", **{**good, "handler": "broken.py:handle"}),
            "importing broken.py failed",
        ),
        "not MODULE:FUNCTION": (
            write_config(tmp_path / "j.toml", **{**good, "handler": "sheet.py"}),
            "is not MODULE:FUNCTION",
        ),
        "missing key file": (
            write_config(tmp_path / "k.toml", **{**good, "key": "gone.key"}),
            "gone.key does not exist",
        ),
        "key readable by others": (
            write_config(tmp_path / "l.toml", **{**good, "key": "open.key"}),
            "must not be readable by others",
        ),
        "not TOML": (tmp_path / "not-toml.toml", "is not valid TOML"),
        "no config file": (tmp_path / "absent.toml", "cannot read the config file"),
    }
    runs = await asyncio.gather(*(mwp("worker", "run", "--config", str(path)) for path, _ in cases.values()))
    for (name, (_, expected)), (code, _out, err) in zip(cases.items(), runs, strict=True):
        assert code == 2 and expected in err and err.startswith("mwp: ") and "Traceback" not in err, (
            name,
            code,
            err,
        )
    code, _, err = await mwp("worker", "run", "--config", str(write_config(tmp_path / "ok.toml", **good)))
    assert code == 3 and "cannot reach" in err and "Traceback" not in err, err


async def test_mwp_worker_run_in_a_group_it_is_not_a_member_of_is_refused_exit_1(
    world: World, tmp_path: Path
) -> None:
    w = world
    await setup(w)
    await w.run(
        w.owner, "grp_other", "mission_create", builders.mission_create("alice", "coord-bot", w.clock.now())
    )
    key = tmp_path / "worker.key"
    write_key(key, w.worker.key)
    (tmp_path / "sheet.py").write_text(HANDLER)
    config = write_config(
        tmp_path / "w.toml",
        target=w.target,
        identity="worker-bot",
        key="worker.key",
        groups=[G, "grp_other"],
        handler="sheet.py:handle",
    )
    code, out, err = await mwp("worker", "run", "--config", str(config))
    assert code == 1 and "mwp: refused: NOT_A_MEMBER" in err and "Traceback" not in err, err
    assert "serves" not in out  # it never started serving


GATED_HANDLER = '''
"""Works until the file named by the WorkItem's goal exists, then hands in its worksheet."""
import asyncio
from pathlib import Path

from missionweave.sdk.worker import Slot, WorkResult
from missionweave.v1 import work_pb2 as wp


async def handle(slot: Slot) -> WorkResult:
    while not Path(slot.contract.goal).exists():
        await asyncio.sleep(0.05)
    await slot.put(f"{slot.work_item_id}: through".encode(), media_type="text/plain")
    evidence = [
        wp.Evidence(
            evidence_id=f"ev-{c.criterion_id}", criterion_id=c.criterion_id, method=wp.EVIDENCE_METHOD_TEST,
            result=wp.EVIDENCE_RESULT_PASS, summary="checked",
        )
        for c in slot.contract.acceptance_criteria
    ]
    return WorkResult(evidence=evidence, summary="after a restart")
'''


@pytest.mark.req("MW-11.3-09")
async def test_mwp_worker_run_killed_mid_work_resumes_it_at_once_on_restart(
    world: World, tmp_path: Path
) -> None:
    """kill -9 while the handler works, under a lease of 10 minutes: the restarted Worker's new
    session fences the dead one's lease at once (SESSION_REPLACED, ownership kept), so the work is
    placed again and submitted now, not when the lease lapses; the key's saved session is the new one."""
    w = world
    flow: Flow = await setup(w)
    write_key(tmp_path / "worker.key", w.worker.key)
    (tmp_path / "gated.py").write_text(GATED_HANDLER)
    gate = tmp_path / "open"
    config = write_config(
        tmp_path / "worker.toml",
        target=w.target,
        identity="worker-bot",
        key="worker.key",
        groups=[G],
        handler="gated.py:handle",
        state_dir="state",
    )

    async def events(kind: str) -> list[Any]:
        return [
            getattr(e, kind)
            for e in [e async for e in w.client.read_events(G)]
            if e.WhichOneof("payload") == kind
        ]

    proc = await start_mwp("worker", "run", "--config", str(config), "--json")
    try:
        assert proc.stdout is not None
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
        contract = builders.contract(w.clock.now(), goal=str(gate))
        contract.time_policy.execution_lease_duration.FromSeconds(600)
        body = wp.WorkAuthorize(work_item_id="wi-1", title="gated", contract=contract, coordinator_epoch=1)
        await flow.coord("work_authorize", body)
        await flow.coord("work_offer", flow.offer_body("wi-1", "worker-bot"))

        async def started() -> bool:
            return bool(await events("work_started"))

        await polled(started, 60)
    finally:
        proc.kill()
        await proc.wait()
    proc = await start_mwp("worker", "run", "--config", str(config), "--json")
    try:
        second = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))  # type: ignore[union-attr]
        assert second["session_epoch"] > first["session_epoch"]
        gate.touch()

        async def submitted() -> bool:
            return bool(await events("work_submitted"))

        await polled(submitted, 45)  # far inside the 10-minute lease the dead process held
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert [r.cause for r in await events("lease_revoked")] == [wp.LEASE_REVOCATION_CAUSE_SESSION_REPLACED]
    assert len(await events("work_started")) == 2
    saved = json.loads((tmp_path / "worker.key.session.json").read_text())
    assert saved == {"identity": "worker-bot", "session_epoch": second["session_epoch"]}
