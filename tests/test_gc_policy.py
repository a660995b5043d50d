"""The collector policy of long-running processes (missionweave/kernel/gc_policy.py, D48, D155)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from missionweave.kernel import gc_policy
from missionweave_server.config import Settings
from missionweave_server.mesh.server import start


@pytest.fixture
def default_thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def test_the_policy_collects_young_objects_every_10000_allocations_and_old_ones_rarely(
    default_thresholds: None,
) -> None:
    gc_policy.for_long_running_process()
    assert gc.get_threshold() == gc_policy.THRESHOLDS
    young, middle, old = gc_policy.THRESHOLDS
    # A full pass waits for at least young * middle * old net allocations (the default: 70,000).
    assert young * middle * old >= 1000 * 700 * 10 * 10


async def test_the_mesh_applies_the_policy_at_start(default_thresholds: None, tmp_path: Path) -> None:
    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
        services=("membership",),
    )
    mesh = await start(settings)
    try:
        assert gc.get_threshold() == gc_policy.THRESHOLDS
    finally:
        await mesh.stop(grace=0)
