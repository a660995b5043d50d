"""The one replay rule for signed proofs (HELLO proofs, call proofs): a nonce once per window."""

from __future__ import annotations

import os
from datetime import timedelta

from missionweave.kernel.clock import ManualClock
from missionweave_server.storage.replay import NonceCache


def test_a_nonce_is_accepted_once_inside_its_window() -> None:
    clock = ManualClock()
    cache = NonceCache(clock)
    nonce = os.urandom(16)
    assert cache.accept("alice#session-1", nonce, clock.now())
    assert not cache.accept("alice#session-1", nonce, clock.now())  # the replay
    assert cache.accept("bob#session-1", nonce, clock.now())  # another signer's nonce is its own


def test_stale_future_and_badly_sized_proofs_are_refused() -> None:
    clock = ManualClock()
    cache = NonceCache(clock)
    assert not cache.accept("a", os.urandom(16), clock.now() - timedelta(seconds=31))
    assert not cache.accept("a", os.urandom(16), clock.now() + timedelta(seconds=31))
    assert not cache.accept("a", os.urandom(15), clock.now())
    assert not cache.accept("a", os.urandom(65), clock.now())
    assert len(cache) == 0


def test_pairs_are_forgotten_once_their_proof_is_stale_and_the_cache_is_bounded() -> None:
    clock = ManualClock()
    cache = NonceCache(clock, max_entries=2)
    first = os.urandom(16)
    assert cache.accept("a", first, clock.now())
    assert cache.accept("a", os.urandom(16), clock.now())
    assert not cache.accept("a", os.urandom(16), clock.now()) and cache.full  # full: refuse, never forget live pairs
    clock.advance(seconds=31)
    assert cache.accept("a", os.urandom(16), clock.now()) and not cache.full
    assert len(cache) == 1
    # The forgotten nonce's own proof is now stale, so forgetting it lets no replay through.
    assert not cache.accept("a", first, clock.now() - timedelta(seconds=31))
