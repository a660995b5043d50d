"""FETCH: events on demand, outside subscriptions (MW-8-08, MW-8-09, MW-8-13, MW-13.3-03).

The gateway checks the frame itself (its ranges and their size, ``requested``); what the agent may
fetch is decided by the Group Authority (GroupLogService.FetchEvents): events at or after its
visibility start, plus, for a late joiner, the events a Context Package cites for it; restricted
Conversations stay with their participants (MW-9-05) in every case. ``Fetches`` is the stream's
side: it answers a FETCH frame (in its own task, ``connection.py``) with FETCHED or an ERROR.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from missionweave.internal.v1 import group_log_pb2 as glpb
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.services.gateway import authority_calls
from missionweave_server.services.gateway.authority_calls import refusal, unavailable_only
from missionweave_server.services.gateway.stream import Stream

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
            raise FetchRefused(
                E.GATEWAY_ERROR_CODE_MALFORMED_FRAME, f"range {r.first}..{r.last} is not 1 <= first <= last"
            )
        total += r.last - r.first + 1
        if total > MAX_FETCH:
            raise FetchRefused(
                E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED, f"at most {MAX_FETCH} sequences per FETCH"
            )
    return sorted({seq for r in ranges for seq in range(r.first, r.last + 1)})


class Fetches(Stream):
    """A stream's FETCH frames."""

    async def fetch(self, frame: pb.FetchFrame) -> None:
        """MW-8-13 / MW-8-09: the requested events this agent's Membership lets it see (decided by
        the Authority, GroupLogService.FetchEvents)."""
        try:
            requested(frame.ranges)  # the frame itself first: its own error codes
        except FetchRefused as refused:
            await self.error(refused.code, str(refused), request_id=frame.request_id)
            return
        request = glpb.FetchEventsRequest(
            group_id=frame.group_id, member_id=self.agent_id, ranges=frame.ranges
        )
        if frame.HasField("context_package"):
            request.context_package.CopyFrom(frame.context_package)
        try:
            answer = await self.gateway.group_log.FetchEvents(request, timeout=authority_calls.PEER_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            answered = refusal(err)
            await self.error(
                answered.code,
                answered.rejection.message,
                request_id=frame.request_id,
                rejection=unavailable_only(answered),
            )
            return
        await self.send(
            fetched=pb.FetchedFrame(
                request_id=frame.request_id,
                group_id=frame.group_id,
                events=answer.events,
                withheld=answer.withheld,
            )
        )
