"""How a server process's C allocator treats buffers of a MiB or so (D148).

A 1 MiB gRPC message, a blob chunk read from disk, a Download frame: each is a fresh buffer about a
MiB long, allocated and freed within one call. glibc hands out such a buffer from a mapping of its
own and unmaps it on free (or trims the freed top of its heap back to the kernel), so the next one
is new memory again: a page fault for every 4 KiB page it touches. On this machine kind (a
Firecracker VM) those faults cost about a third of a 1 MiB Download's server CPU
(bench/README.md, artifacts). Thresholds above the largest chunk keep the pages in the process for
the next buffer. They are fixed values rather than glibc's sliding ones, which moved with what the
process had freed last, so the cost of a Download depended on what ran before it.

What it may cost: up to ``TRIM_THRESHOLD_BYTES`` of freed memory kept at the top of each malloc
arena (glibc makes at most 8 per core), and buffers of up to ``MMAP_THRESHOLD_BYTES`` served from
the heap, where fragmentation can hold them longer than a mapping would.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger("missionweave_server.mesh.allocator")

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# Above one blob chunk (CHUNK_BYTES, 1 MiB) with its framing; a message near the 4 MiB limit is
# rare enough to keep its own mapping.
MMAP_THRESHOLD_BYTES = 2 << 20
TRIM_THRESHOLD_BYTES = 8 << 20

# glibc's own settings: an operator who set either chose for this process, and is left alone.
GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def tune_allocator() -> bool:
    """Fixes glibc's mmap and trim thresholds for this process (the server's; ``mwp serve`` calls it
    first thing). Whether it did: not off Linux, not on a C library without ``mallopt`` (musl's
    ignores it), and not when glibc's own variables are set."""
    if not sys.platform.startswith("linux") or any(name in os.environ for name in GLIBC_VARIABLES):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if done:
        log.debug(
            "malloc thresholds fixed",
            extra={"mmap_threshold": MMAP_THRESHOLD_BYTES, "trim_threshold": TRIM_THRESHOLD_BYTES},
        )
    return done
