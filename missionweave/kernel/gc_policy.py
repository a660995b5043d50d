"""The cyclic garbage collector's policy for MissionWeave's long-running processes (D48, D155).

CPython's default thresholds (700, 10, 10) run a full collection every 70,000 net allocations
(when the long-lived objects also grew by a quarter), and a full pass holds the event loop for as
long as it takes to scan every tracked object: 50-70 ms in a process of 200 SDK subscriptions, more
in an Authority holding many Groups' folded state. Those pauses land in the tail latency of every
call and every delivery in flight. A process that keeps a large, long-lived object graph and
latency targets (``mwp serve``, ``mwp worker run``, an agent host with many subscriptions) collects
young objects every 10,000 allocations and older ones far more rarely.

The trade-off: garbage in reference cycles that survives two young collections waits for a rare
full pass. The mesh breaks the cycles it makes in bulk (a closed gateway stream's, missionweave_server/services/gateway/stream.py)
so that they are freed by reference count instead.
"""

from __future__ import annotations

import gc

THRESHOLDS = (10_000, 50, 1_000)


def for_long_running_process() -> None:
    """Apply ``THRESHOLDS`` to this process (call it once, at start-up, from the program's entry point:
    it is process-wide, which is why the SDK never applies it on its own)."""
    gc.set_threshold(*THRESHOLDS)
