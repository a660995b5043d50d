"""Start-up and logs that tell the truth (issue 45): every port `mwp serve` was asked to serve either
serves or ends the start-up in one line naming it, with nothing left running (one process and the
split topology), also when it is taken between its check and its bind; text logs keep the records'
fields; an idle Worker's empty long polls are not logged at info level."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from google.protobuf import duration_pb2
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.kernel import logs
from missionweave.v1 import scheduling_service_pb2 as sp
from missionweave_server.config import Settings
from missionweave_server.edge.channels import ListenError
from missionweave_server.mesh import ports, server
from missionweave_server.mesh.database import open_database
from tests.conftest import World
from tests.port_race import first_check_passes
from tests.serve_process import (
    children_running,
    logged,
    read_until,
    refuses,
    serve,
    serve_env,
    stop,
    wait_group_gone,
)
from tests.split_mesh import free_port
from tests.test_missions import G
from tests.test_scheduling_service import Schedulers
from tests.test_work_items import setup

NEXT_SLOT = "/missionweave.v1.SchedulingService/NextSlot"


@contextmanager
def taken_port() -> Iterator[int]:
    """A port on which another server listens, for as long as the block runs."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield int(other.getsockname()[1])


async def ended(
    *args: str, env: dict[str, str], module: str = "missionweave.cli", within_s: float = 60
) -> tuple[int, list[str], int]:
    """`mwp serve *args` run to its end: its exit code, its stderr lines and its pid. One still
    running after ``within_s`` is killed (its session) and fails the test."""
    process = await serve(*args, env=env, module=module)
    try:
        async with asyncio.timeout(within_s):
            _, err = await process.communicate()
    except TimeoutError:
        os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        raise AssertionError(f"mwp serve {' '.join(args)} still ran after {within_s} s") from None
    return await process.wait(), err.decode().splitlines(), process.pid


async def test_serve_with_its_metrics_port_taken_ends_in_one_line_naming_it(tmp_path: Path) -> None:
    listen = free_port()
    with taken_port() as metrics:
        code, lines, pid = await ended(
            "--listen", f"127.0.0.1:{listen}", "--metrics-listen", f"127.0.0.1:{metrics}",
            "--data-dir", str(tmp_path / "data"), env=serve_env(),
        )  # fmt: skip
    assert code == 1
    assert lines == [
        f"mwp serve: port 127.0.0.1:{metrics} (metrics) is in use: another server listens there; "
        "give it another address (--metrics-listen or MWP_METRICS_LISTEN, '' for none)"
    ]
    wait_group_gone(pid)  # nothing of it left running (its session), its gRPC port never served
    assert refuses(listen)
    assert not list((tmp_path / "data").glob("*.db*"))  # refused before the database was opened


@pytest.mark.parametrize(
    ("flag", "role", "moved_by"),
    [
        ("--listen", "gRPC", "--listen or MWP_LISTEN"),
        ("--health-listen", "health", "--health-listen or MWP_HEALTH_LISTEN, '' for none"),
        ("--console-listen", "console", "--console-listen, or --no-console for none"),
    ],
)
async def test_serve_whose_port_is_taken_after_its_check_stops_and_ends_in_one_line_naming_it(
    tmp_path: Path, flag: str, role: str, moved_by: str
) -> None:
    # The database and the Authority have started when the bind fails (the console's: after the
    # gRPC server started too); the process used to hang there, its children with it.
    data = str(tmp_path / "data")
    listen = free_port()
    with taken_port() as taken:
        asked = {"--listen": f"127.0.0.1:{listen}", flag: f"127.0.0.1:{taken}"}
        code, lines, pid = await ended(
            *(word for pair in asked.items() for word in pair), "--data-dir", data,
            env=serve_env(), module="tests.port_race", within_s=20,
        )  # fmt: skip
    assert code == 1, lines
    assert lines[-1] == (
        f"mwp serve: port 127.0.0.1:{taken} ({role}) is in use: another server listens there; "
        f"give it another address ({moved_by})"
    )
    assert [line for line in lines if line.startswith("mwp serve:")] == lines[-1:]
    wait_group_gone(pid)  # the store's writer process and the stderr relay with it
    assert refuses(listen)
    # Nothing holds the data directory (its lock, the store): the next start on it serves.
    again = await serve("--listen", f"127.0.0.1:{listen}", "--data-dir", data, env=serve_env())
    try:
        await read_until(again, logged("mesh listening"))
    finally:
        await stop(again)


async def test_start_whose_grpc_port_is_taken_after_its_check_stops_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "check_port_free", first_check_passes())
    disposed: list[AsyncEngine] = []
    engines: list[AsyncEngine] = []

    async def watched(settings: Settings, shared_nonces: bool) -> AsyncEngine:
        engine = await open_database(settings, shared_nonces)
        event.listen(engine.sync_engine, "engine_disposed", lambda _: disposed.append(engine))
        engines.append(engine)
        return engine

    monkeypatch.setattr(server, "open_database", watched)
    tasks, children = asyncio.all_tasks(), children_running(os.getpid())
    with taken_port() as taken:
        settings = Settings(listen=f"127.0.0.1:{taken}", data_dir=tmp_path / "data", verify_workers=0)
        with pytest.raises(ListenError, match=rf"^port 127\.0\.0\.1:{taken} \(gRPC\) is in use"):
            async with asyncio.timeout(20):
                await server.start(settings)
    left = [t for t in asyncio.all_tasks() - tasks if not t.done()]  # the store's writer, the fence...
    for task in left:  # cancelled now: the loop's close would wait forever for one spawning a process
        task.cancel()
    if left:
        await asyncio.wait(left, timeout=5)
    assert left == []
    assert engines and disposed == engines
    assert set(children_running(os.getpid())) <= set(children)  # the store's writer process has exited


def _metrics_range_with_one_taken(children: int) -> tuple[int, socket.socket]:
    """A first metrics port whose successors are free for ``children`` processes but for the second
    (authority-0's), on which a server listens: the socket holding it."""
    for _ in range(50):
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        taken = int(holder.getsockname()[1])
        first = taken - 1
        try:
            for port in (first, *range(taken + 1, first + children)):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            holder.close()
            continue
        holder.listen()
        return first, holder
    raise AssertionError("no run of free ports found")


async def test_split_topology_with_a_child_metrics_port_taken_starts_no_child(tmp_path: Path) -> None:
    listen = free_port()
    first, holder = _metrics_range_with_one_taken(children=5)
    with holder:
        code, lines, pid = await ended(
            "--topology", "split", "--listen", f"127.0.0.1:{listen}", "--metrics-listen",
            f"127.0.0.1:{first}", "--data-dir", str(tmp_path / "data"), env=serve_env(),
        )  # fmt: skip
    assert code == 1
    assert lines == [
        f"mwp serve: port 127.0.0.1:{first + 1} (metrics of authority-0) is in use: another server listens "
        "there; give it another address (--metrics-listen or MWP_METRICS_LISTEN: the children serve on "
        "the ports from it on, '' for none)"
    ]  # checked before any child started: no "starting ..." line
    wait_group_gone(pid)
    assert refuses(listen)


async def test_split_topology_whose_child_fails_to_start_ends_naming_it(tmp_path: Path) -> None:
    listen = free_port()
    code, lines, pid = await ended(
        "--topology", "split", "--listen", f"127.0.0.1:{listen}", "--data-dir", str(tmp_path / "data"),
        "--database-url", "postgresql://nobody:secret@127.0.0.1:1/none",
        env=serve_env(MWP_METRICS_LISTEN="", MWP_LOG_FORMAT="text"),
    )  # fmt: skip
    assert code == 1, lines
    assert lines[-1] == (
        "mwp serve: authority-0 exited with code 1 during start-up (its own line above says why): the "
        "split topology is stopped"
    )
    assert any(line.startswith("mwp serve: cannot open the database") for line in lines)  # the child's
    assert not any("starting membership" in line for line in lines)  # no further child was started
    wait_group_gone(pid)  # the launcher and every child of it
    assert refuses(listen)


async def test_text_logs_carry_the_fields_of_the_json_logs(tmp_path: Path) -> None:
    listen = free_port()
    process = await serve(
        "--listen", f"127.0.0.1:{listen}", "--data-dir", str(tmp_path / "data"),
        env=serve_env(MWP_LOG_FORMAT="text"),
    )  # fmt: skip
    try:
        lines = await read_until(process, lambda line: "mesh listening" in line)
    finally:
        await stop(process)
    listening = lines[-1]
    assert re.search(r" INFO missionweave_server\.mesh\.server: mesh listening ", listening), listening
    assert f" listen=127.0.0.1:{listen} port={listen} services=" in listening
    assert " tls=off" in listening


def test_a_text_line_and_a_json_line_hold_the_same_fields() -> None:
    record = logging.LogRecord("missionweave.access", logging.INFO, __file__, 1, "rpc", (), None)
    fields = {"method": "/m/M", "caller": "", "code": "OK", "duration_ms": 1.5, "note": 'a "b"=c\nd'}
    record.__dict__.update(fields)
    as_json = json.loads(logs.JsonFormatter().format(record))
    text = logs.TextFormatter().format(record)
    assert "\n" not in text  # one record, one line, whatever its values hold
    pairs = re.findall(r' (\w+)=("(?:[^"\\]|\\.)*"|\S*)', text.split(": rpc", 1)[1])
    from_text = {key: json.loads(value) if value.startswith('"') else value for key, value in pairs}
    assert from_text == {key: str(value) for key, value in fields.items()}
    assert {k: v for k, v in as_json.items() if k not in ("ts", "level", "logger", "msg")} == fields


async def test_an_idle_workers_empty_long_poll_is_not_logged_at_info(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="missionweave.access")
    scheds = Schedulers(world)
    try:
        flow = await setup(world)
        scheduler = scheds["worker"]
        await scheduler.GetQueue(sp.GetQueueRequest(group_id=G))
        # What `mwp worker run` repeats while nothing is eligible: a long poll answered empty.
        await scheduler.NextSlot(sp.NextSlotRequest(wait=duration_pb2.Duration(nanos=50_000_000)))
        await scheduler.NextSlot(sp.NextSlotRequest(preemptions_only=True))
        idle = [r.levelno for r in caplog.records if getattr(r, "method", "") == NEXT_SLOT]
        await flow.authorize("wi-1")
        await flow.accept(world.worker, "wi-1", await flow.offer("wi-1", "worker-bot"))
        placed = await scheduler.NextSlot(sp.NextSlotRequest())
    finally:
        await scheds.close()
    assert placed.assignment.work_item_id == "wi-1"
    assert idle == [logging.DEBUG, logging.DEBUG]
    calls = [(r.method, r.levelno) for r in caplog.records if r.name == "missionweave.access"]
    assert (NEXT_SLOT, logging.INFO) in calls  # the poll that placed work is a real call
    assert any("ExecuteCommand" in method and level == logging.INFO for method, level in calls)  # commands
