"""Capped exponential backoff with jitter, the SDK's one retry schedule: the agent's reconnects, a
subscription's resubscriptions after the gateway could not serve it, and a failing handler's retries
all wait by it. One shared random source keeps a ``Backoff`` cheap to make (a handler call makes one).
"""

from __future__ import annotations

import random

__all__ = ["Backoff"]

_JITTER = random.Random()  # shared: a handler call makes a Backoff, and seeding one costs ~100 us


class Backoff:
    """Capped exponential backoff with jitter: the n-th delay lies in [d/2, d], d = min(cap, initial * 2**n).

    >>> backoff = Backoff(initial=1.0, cap=4.0)
    >>> [0.5 <= backoff.next() <= 1, 1 <= backoff.next() <= 2, 2 <= backoff.next() <= 4, 2 <= backoff.next() <= 4]
    [True, True, True, True]
    """

    def __init__(
        self, initial: float = 0.2, cap: float = 30.0, factor: float = 2.0, rng: random.Random | None = None
    ) -> None:
        self.initial, self.cap, self.factor = initial, cap, factor
        self._rng = rng
        self._attempt = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.initial * self.factor**self._attempt)
        self._attempt = min(self._attempt + 1, 64)
        return ceiling / 2 + (self._rng or _JITTER).uniform(0, ceiling / 2)

    def reset(self) -> None:
        self._attempt = 0
