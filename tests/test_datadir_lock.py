"""A data dir already held by a running mesh is refused at start, except to parts of the same mesh
(issue 12: two Authorities on one data dir both accepted writes and their views split)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from missionweave_server.mesh.datadir_lock import DataDirHeld, hold


def test_a_second_holder_is_refused_and_parts_of_the_same_mesh_are_let_in(tmp_path: Path) -> None:
    first = hold(tmp_path, "mesh-a")
    with pytest.raises(DataDirHeld, match=f"in use by process {os.getpid()} \\(mesh mesh-a\\)"):
        hold(tmp_path, "mesh-b")
    with pytest.raises(DataDirHeld):
        hold(tmp_path, "")  # no mesh id: never a part of anyone's mesh
    part = hold(tmp_path, "mesh-a")
    part.release()
    first.release()
    hold(tmp_path, "mesh-b").release()  # free again once the holder let go


def test_mwp_serve_on_a_held_data_dir_exits_with_a_clear_message(tmp_path: Path) -> None:
    lock = hold(tmp_path, "someone-else")
    try:
        env = {**os.environ, "MWP_LOG_FORMAT": "text"}
        env.pop("MWP_MESH_ID", None)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "missionweave.cli",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    finally:
        lock.release()
    assert done.returncode == 1, done.stderr
    assert "is in use by process" in done.stderr and "someone-else" in done.stderr
