"""Execution idempotency keys for external side effects (MW-11.4-09, OP-19).

A Worker that calls an external system (payment API, deployment, e-mail) passes this key, so a retry
of the same logical operation under the same ownership epoch is recognised by the receiver and not
performed twice, while a reassignment (a higher ownership epoch) gets a fresh key space: the new
owner re-decides from the latest checkpoint.
"""

from __future__ import annotations

import blake3

from missionweave.kernel import ids

KEY_PREFIX = "mwk1"


def attempt_key(mission_id: str, work_item_id: str, ownership_epoch: int, operation_id: str) -> str:
    """``mwk1_<32 hex>``: deterministic in (Mission, WorkItem, ownership epoch, logical operation).

    Each part is length-prefixed before hashing, so no two distinct tuples share a key by
    concatenation (``("a", "bc")`` vs ``("ab", "c")``). Stable across languages: BLAKE3 over
    ``len(utf8(part)) as 4-byte big-endian || utf8(part)`` for the four parts in order, the epoch
    written in decimal, first 16 bytes as lowercase hex.
    """
    if ownership_epoch < 1:
        raise ValueError("ownership_epoch starts at 1")
    for name, value in (
        ("mission_id", mission_id),
        ("work_item_id", work_item_id),
        ("operation_id", operation_id),
    ):
        if not ids.is_valid(value):
            raise ValueError(f"{name} must be 1..128 of [A-Za-z0-9._:-]")
    h = blake3.blake3()
    for part in (mission_id, work_item_id, str(ownership_epoch), operation_id):
        encoded = part.encode("utf-8")
        h.update(len(encoded).to_bytes(4, "big"))
        h.update(encoded)
    return f"{KEY_PREFIX}_{h.digest(16).hex()}"
