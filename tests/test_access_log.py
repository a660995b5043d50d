"""The access log (missionweave_server/edge/access_log.py): one line per RPC, rate limited so a flood cannot
fill the disk, with the count of the lines it did not write; gRPC's own logging routed into the
structured log."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from missionweave.kernel import logs
from missionweave.v1 import scheduling_service_pb2 as spb
from missionweave_server.config import Settings
from missionweave_server.edge.access_log import IDLE_ANSWERS, AccessLog, TokenBucket, _Call, _code_of
from missionweave_server.mesh.server import start
from missionweave_server.observability import metrics


class _Context:
    def __init__(self, code: grpc.StatusCode | None = None) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode | None:
        return self._code


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "missionweave.access"]


def test_the_rate_limit_suppresses_a_flood_and_says_how_many(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="missionweave.access")
    clock = [100.0]
    access = AccessLog(rate=1)
    access.bucket = TokenBucket(1, 2, now=lambda: clock[0])
    suppressed_before = metrics.ACCESS_LOG_SUPPRESSED._value.get()
    for _ in range(50):  # a flood within one instant: the burst (2) is written, the rest counted
        access.finished("/svc/M", _Call(), _Context(), 0.0, None)
    assert len(_lines(caplog)) == 2
    assert metrics.ACCESS_LOG_SUPPRESSED._value.get() - suppressed_before == 48
    clock[0] += 1.0  # a token later: the next line says how many were not written
    access.finished("/svc/M", _Call(), _Context(grpc.StatusCode.NOT_FOUND), 0.0, None)
    last = _lines(caplog)[-1]
    assert (last.suppressed, last.code, last.method) == (48, "NOT_FOUND", "/svc/M")
    assert not hasattr(_lines(caplog)[0], "suppressed")


def test_a_failed_handler_is_logged_with_its_code() -> None:
    assert _code_of(_Context(), None) == "OK"
    assert _code_of(_Context(), RuntimeError("boom")) == "UNKNOWN"
    assert _code_of(_Context(), GeneratorExit()) == "CANCELLED"
    assert _code_of(_Context(grpc.StatusCode.PERMISSION_DENIED), Exception()) == "PERMISSION_DENIED"


async def test_a_flood_of_rpcs_against_a_mesh_writes_a_bounded_access_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="missionweave.access")
    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
        services=("membership",),
        access_log_rate=1,
    )
    mesh = await start(settings)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{mesh.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(40):
                await health.Check(health_pb2.HealthCheckRequest(service=""))
    finally:
        await mesh.stop(grace=0)
    lines = [r for r in _lines(caplog) if getattr(r, "method", "") == "/grpc.health.v1.Health/Check"]
    assert 1 <= len(lines) < 10, len(lines)  # a burst of 2 and a token a second, not 40
    first = lines[0]
    assert (first.code, first.caller) == ("OK", "")
    assert first.duration_ms >= 0


def test_grpc_python_logging_reaches_the_structured_log(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("info", "json")
        logging.getLogger("grpc._cython.cygrpc").error("from grpc")
        entry = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert (entry["logger"], entry["level"], entry["msg"]) == (
            "grpc._cython.cygrpc",
            "error",
            "from grpc",
        )
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_grpc_core_verbosity_defaults_to_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    logs.quiet_grpc_core()
    assert os.environ["GRPC_VERBOSITY"] == "ERROR"
    monkeypatch.setenv("GRPC_VERBOSITY", "DEBUG")
    logs.quiet_grpc_core()
    assert os.environ["GRPC_VERBOSITY"] == "DEBUG"  # an operator's choice is kept


def test_an_idle_next_slot_is_recognised_as_a_message_and_as_the_bytes_the_front_door_relays() -> None:
    """The front door (split topology) relays NextSlot's answer as bytes: the access log reads them,
    where it once failed the call itself (AttributeError on bytes, answered UNKNOWN)."""
    idle = IDLE_ANSWERS["/missionweave.v1.SchedulingService/NextSlot"]
    empty = spb.NextSlotResponse()
    placed = spb.NextSlotResponse()
    placed.assignment.work_item_id = "wi_1"
    assert idle(empty) and idle(empty.SerializeToString())
    assert not idle(placed) and not idle(placed.SerializeToString())
