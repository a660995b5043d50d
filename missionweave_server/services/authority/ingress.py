"""Admission at ingress: the signed envelope's own bounds, and a token bucket per Group (MW-8-16,
ARCHITECTURE principle 8).

``check_envelope`` runs first, before a signature is checked or the payload parsed: a signed
command is at most ``MAX_COMMAND_BYTES`` as a whole envelope (payload, type and signatures), and
carries at most ``MAX_SIGNATURES`` signatures.

A Group that floods commands is refused with OVERLOADED (and how long to wait) once its burst is
spent, before its commands reach the shared group-commit queue; other Groups keep their own
allowance. Buckets are kept for recently active Groups only: an idle Group's bucket is full again,
which is exactly what a fresh bucket is, so forgetting it loses nothing.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from missionweave.kernel.errors import R, Rejected
from missionweave.kernel.signing import check_signature_count
from missionweave.v1 import common_pb2

# A signed command, the whole envelope, is at most this many bytes.
MAX_COMMAND_BYTES = 256 * 1024


def check_envelope(envelope: common_pb2.SignedEnvelope) -> None:
    """The bounds of a signed command's envelope: at most MAX_SIGNATURES signatures (MALFORMED,
    metadata ``field=signatures``, ``limit``), at most MAX_COMMAND_BYTES in all (TOO_LARGE, ``limit``)."""
    check_signature_count(envelope)
    size = envelope.ByteSize()
    if size > MAX_COMMAND_BYTES:
        raise Rejected(
            R.REJECTION_REASON_TOO_LARGE,
            f"the signed command is {size} bytes; the limit is {MAX_COMMAND_BYTES} (the whole envelope)",
            limit=MAX_COMMAND_BYTES,
        )


@dataclass
class _Bucket:
    tokens: float
    updated: float


class GroupIngressLimiter:
    """``rate`` commands per second per Group, up to ``burst`` at once. ``rate <= 0`` disables it."""

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        now: Callable[[], float] = time.monotonic,
        max_groups: int = 100_000,
    ) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._now = now
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._max_groups = max_groups

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def admit(self, group_id: str) -> float:
        """Take one token: 0.0 when admitted, else the seconds until one will be available."""
        if not self.enabled:
            return 0.0
        now = self._now()
        bucket = self._buckets.get(group_id)
        if bucket is None:
            bucket = self._buckets[group_id] = _Bucket(self.burst, now)
            while len(self._buckets) > self._max_groups:
                self._buckets.popitem(last=False)
        else:
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            self._buckets.move_to_end(group_id)
        if bucket.tokens >= 1.0 - 1e-9:  # refills are sums of float products
            bucket.tokens = max(bucket.tokens - 1.0, 0.0)
            return 0.0
        return max(1.0 - bucket.tokens, 0.0) / self.rate
