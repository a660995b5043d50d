"""The server's malloc thresholds (missionweave_server/mesh/allocator.py, D148)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from missionweave_server.config import Settings
from missionweave_server.mesh.allocator import GLIBC_VARIABLES, MMAP_THRESHOLD_BYTES

ROOT = Path(__file__).resolve().parent.parent
BUFFER = 1_500_000  # one chunk's size class: under the fixed threshold, far above glibc's 128 KiB start

# A fresh interpreter: allocate one buffer, report glibc's peak of mmapped bytes (malloc_stats).
_PROBE = f"""
import ctypes, sys
from missionweave_server.mesh.allocator import tune_allocator
tuned = tune_allocator() if sys.argv[1] == "tune" else False
buffer = bytearray({BUFFER}); del buffer
print("tuned", tuned, flush=True)
ctypes.CDLL(None).malloc_stats()
"""


def _probe(mode: str, **extra_env: str) -> tuple[bool, int]:
    env = {k: v for k, v in os.environ.items() if k not in GLIBC_VARIABLES} | extra_env
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    peak = re.search(r"max mmap bytes\s*=\s*(\d+)", done.stderr)
    assert peak is not None, done.stderr
    return "tuned True" in done.stdout, int(peak.group(1))


glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc's mallopt",
)


@glibc_only
def test_a_chunk_sized_buffer_comes_from_the_heap_once_tuned() -> None:
    assert BUFFER < MMAP_THRESHOLD_BYTES
    untuned, plain_peak = _probe("plain")
    tuned, tuned_peak = _probe("tune")
    assert not untuned and tuned
    # Without the fixed threshold the buffer is a mapping of its own (faulted in anew each time).
    assert plain_peak - tuned_peak >= BUFFER - 4096, (plain_peak, tuned_peak)


@glibc_only
def test_glibc_variables_set_by_the_operator_win() -> None:
    tuned, peak = _probe("tune", MALLOC_MMAP_THRESHOLD_="131072")
    assert not tuned
    assert peak >= BUFFER  # the operator's threshold holds


def test_malloc_tuning_is_on_unless_switched_off() -> None:
    assert Settings().malloc_tuning
    assert Settings.from_env({}).malloc_tuning
    assert not Settings.from_env({"MWP_MALLOC_TUNING": "0"}).malloc_tuning
    assert Settings.from_env({"MWP_MALLOC_TUNING": "true"}).malloc_tuning
    with pytest.raises(ValueError, match="MWP_MALLOC_TUNING"):
        Settings.from_env({"MWP_MALLOC_TUNING": "maybe"})


@glibc_only
@pytest.mark.parametrize("switch", ["1", "0"])
def test_mwp_serve_fixes_the_thresholds_first_unless_switched_off(tmp_path: Path, switch: str) -> None:
    """The wiring: `mwp serve` tunes its process before it starts anything (here it then fails to
    listen on a taken port and exits 1), and MWP_MALLOC_TUNING=0 keeps glibc's defaults."""
    import socket

    env = {k: v for k, v in os.environ.items() if k not in GLIBC_VARIABLES}
    env |= {
        "PYTHONPATH": str(ROOT),
        "MWP_LOG_LEVEL": "debug",
        "MWP_LOG_FORMAT": "json",
        "MWP_MALLOC_TUNING": switch,
    }
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "missionweave.cli",
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--data-dir",
                str(tmp_path),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done.stderr
    assert ("malloc thresholds fixed" in done.stderr) == (switch == "1"), done.stderr[-2000:]
