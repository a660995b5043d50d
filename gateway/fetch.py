"""FETCH: events on demand, outside subscriptions (MW-8-08, MW-8-09, MW-8-13, MW-13.3-03).

The gateway checks the frame itself (its ranges and their size); what the agent may fetch is
decided by the Group Authority (GroupLogService.FetchEvents): events at or after its visibility
start, plus, for a late joiner, the events a Context Package cites for it; restricted Conversations
stay with their participants (MW-9-05) in every case.
"""

from __future__ import annotations

from collections.abc import Iterable

from missionweave.v1 import gateway_service_pb2 as pb

MAX_FETCH = 1_024


E = pb.GatewayErrorCode


class FetchRefused(Exception):
    """The request itself is wrong (not a matter of what the agent may see)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def requested(ranges: Iterable[pb.SequenceRange]) -> list[int]:
    """The distinct sequences asked for, in order; refuses empty, inverted or oversized requests."""
    ranges = list(ranges)
    if not ranges:
        raise FetchRefused(E.GATEWAY_ERROR_CODE_MALFORMED_FRAME, "name at least one sequence range")
    total = 0
    for r in ranges:
        if r.first < 1 or r.last < r.first:
            raise FetchRefused(E.GATEWAY_ERROR_CODE_MALFORMED_FRAME, f"range {r.first}..{r.last} is not 1 <= first <= last")
        total += r.last - r.first + 1
        if total > MAX_FETCH:
            raise FetchRefused(E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED, f"at most {MAX_FETCH} sequences per FETCH")
    return sorted({seq for r in ranges for seq in range(r.first, r.last + 1)})
