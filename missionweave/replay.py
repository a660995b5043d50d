"""Proofs of freshness: a signed proof carries an issue time and a nonce, and each (signer, nonce) is
accepted once while its issue time is inside the replay window. Used by every proof a server checks
(HELLO proofs on gateway streams, call proofs on RPCs), so one replay rule holds everywhere."""

from __future__ import annotations

import heapq
from datetime import datetime, timedelta

from missionweave.clock import Clock

REPLAY_WINDOW = timedelta(seconds=30)  # a proof's issue time is within this of the server's clock
NONCE_MIN, NONCE_MAX = 16, 64  # bytes


class NonceCache:
    """Remembers (signer, nonce) pairs until their proof's issue time leaves the window; a pair seen
    again inside it is a replay. Bounded: when ``max_entries`` live pairs are held, new proofs are
    refused (``accept`` returns False with ``full`` set) rather than forgetting pairs still inside
    their window, which would let them be replayed."""

    def __init__(self, clock: Clock, window: timedelta = REPLAY_WINDOW, max_entries: int = 1_000_000) -> None:
        self._clock = clock
        self._window = window
        self._max = max_entries
        self._seen: set[tuple[str, bytes]] = set()
        self._expiry: list[tuple[datetime, str, bytes]] = []  # min-heap by forget time
        self.full = False

    def fresh(self, issued_at: datetime) -> bool:
        """Whether an issue time lies within the window of the clock, either side."""
        return abs(issued_at - self._clock.now()) <= self._window

    def accept(self, signer: str, nonce: bytes, issued_at: datetime) -> bool:
        """True once for a fresh proof's (signer, nonce); False for a stale proof, a nonce of the
        wrong size, a replay, or a full cache."""
        self.full = False
        if not NONCE_MIN <= len(nonce) <= NONCE_MAX or not self.fresh(issued_at):
            return False
        self._forget_expired()
        key = (signer, bytes(nonce))
        if key in self._seen:
            return False
        if len(self._seen) >= self._max:
            self.full = True
            return False
        self._seen.add(key)
        # A proof stays replayable until its issue time is a window in the past.
        heapq.heappush(self._expiry, (issued_at + self._window, signer, key[1]))
        return True

    def __len__(self) -> int:
        return len(self._seen)

    def _forget_expired(self) -> None:
        now = self._clock.now()
        while self._expiry and self._expiry[0][0] < now:
            _, signer, nonce = heapq.heappop(self._expiry)
            self._seen.discard((signer, nonce))
