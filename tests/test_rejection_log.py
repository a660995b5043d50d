"""Rejections at a service's edge are counted, each one, and logged: one line per refusal, but a
flood of OVERLOADED refusals (a caller held to its rate) is logged once per RPC and Group per
interval, each line carrying how many were not logged since the last."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from missionweave.kernel.errors import R, Rejected
from missionweave_server.edge import status
from missionweave_server.edge.status import log_rejection, overload_log


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Clock]:
    fake = _Clock()
    monkeypatch.setattr(overload_log, "_now", fake)
    overload_log.reset()
    yield fake
    overload_log.reset()


def _refused(reason: int, group: str, command: str) -> Rejected:
    rejected = Rejected(reason, "no")  # type: ignore[arg-type]
    rejected.log_context = {"group_id": group, "command_id": command}
    return rejected


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "request rejected"]


def test_a_flood_of_overloaded_refusals_is_logged_once_per_group_per_interval(
    clock: _Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="missionweave_server.edge")
    for n in range(500):
        log_rejection(
            "Authority", "ExecuteCommandStream", _refused(R.REJECTION_REASON_OVERLOADED, "grp_noisy", f"c{n}")
        )
    log_rejection(
        "Authority", "ExecuteCommandStream", _refused(R.REJECTION_REASON_OVERLOADED, "grp_other", "d0")
    )
    first = _lines(caplog)
    assert [(r.group_id, r.command_id, r.suppressed) for r in first] == [
        ("grp_noisy", "c0", 0),
        ("grp_other", "d0", 0),
    ]  # type: ignore[attr-defined]

    clock.now += status.OVERLOAD_LOG_INTERVAL_S
    caplog.clear()
    log_rejection(
        "Authority", "ExecuteCommandStream", _refused(R.REJECTION_REASON_OVERLOADED, "grp_noisy", "c500")
    )
    (line,) = _lines(caplog)
    assert (line.command_id, line.suppressed, line.reason) == ("c500", 499, "OVERLOADED")  # type: ignore[attr-defined]


def test_other_refusals_are_logged_one_line_each(clock: _Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="missionweave_server.edge")
    for n in range(20):
        log_rejection(
            "Authority", "ExecuteCommand", _refused(R.REJECTION_REASON_NOT_A_MEMBER, "grp_a", f"c{n}")
        )
    assert [r.command_id for r in _lines(caplog)] == [f"c{n}" for n in range(20)]  # type: ignore[attr-defined]
