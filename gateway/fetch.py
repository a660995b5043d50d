"""FETCH: events on demand, outside subscriptions (MW-8-08, MW-8-09, MW-8-13, MW-13.3-03).

What an agent may fetch is what its Membership permits: events at or after its visibility start,
plus, for a late joiner, the events a Context Package cites for it; restricted Conversations stay
with their participants (MW-9-05) in every case.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import DecodeError

from missionweave.signing import verify_signature
from missionweave.v1 import artifact_service_pb2, common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from services.authority.context_package import CONTEXT_PACKAGE_TYPE

MAX_FETCH = 1_024


E = pb.GatewayErrorCode


class FetchRefused(Exception):
    """The request itself is wrong (not a matter of what the agent may see)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


_INVALID = E.GATEWAY_ERROR_CODE_CONTEXT_PACKAGE_INVALID


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


def cited_for(
    envelope: common_pb2.SignedEnvelope, authority_key: bytes, group_id: str, agent_id: str
) -> set[int]:
    """The sequences a Context Package signed by this Authority cites for ``agent_id`` in ``group_id``."""
    if envelope.payload_type != CONTEXT_PACKAGE_TYPE or not verify_signature(envelope, authority_key):
        raise FetchRefused(_INVALID, "the Context Package is not signed by this Authority")
    try:
        package = artifact_service_pb2.ContextPackage.FromString(envelope.payload)
    except DecodeError:
        raise FetchRefused(_INVALID, "the Context Package does not parse") from None
    if package.group_id != group_id:
        raise FetchRefused(_INVALID, f"the Context Package is of Group {package.group_id}, not {group_id}")
    if agent_id not in package.recipient_ids:
        return set()  # a package made for someone else grants this agent nothing
    return {
        seq
        for r in package.source_event_ranges
        if r.group_id in ("", group_id)
        for seq in range(r.first_sequence, r.last_sequence + 1)
    }


def as_ranges(sequences: Iterable[int]) -> list[pb.SequenceRange]:
    """Sorted sequences as maximal inclusive ranges."""
    out: list[pb.SequenceRange] = []
    for seq in sorted(sequences):
        if out and out[-1].last + 1 == seq:
            out[-1].last = seq
        else:
            out.append(pb.SequenceRange(first=seq, last=seq))
    return out
