"""Progress of a long offline command on stderr (``mwp verify``, ``mwp backup``, ``mwp restore``),
and byte counts for people."""

from __future__ import annotations

import sys
import time


class StatusLine:
    """At most one line every ``every`` seconds on stderr, each prefixed with the command's name."""

    def __init__(self, command: str, every: float = 2.0) -> None:
        self.command = command
        self.every = every
        self._last = time.monotonic()

    def due(self) -> bool:
        """Whether a line may be printed now (and, if so, the clock restarts)."""
        now = time.monotonic()
        if now - self._last < self.every:
            return False
        self._last = now
        return True

    def show(self, text: str) -> None:
        print(f"{self.command}: {text}", file=sys.stderr, flush=True)


def size_text(n: int) -> str:
    """``n`` bytes for people: 512 B, 1.5 KiB, 3.2 GiB."""
    if n < 1024:
        return f"{n:,} B"
    value = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"
