"""Descriptor-driven extremes for tests/test_fuzz_extremes.py (issue 40 part 5).

Given a valid message (a request, or a signed payload inside one), ``leaf_paths`` finds every
numeric, enum, ``google.protobuf.Duration`` and ``google.protobuf.Timestamp`` field reachable in it
(recursively, through the oneof branch the message has chosen and through the first element of
repeated fields), ``extremes`` gives each field's values at and past its limits, and ``mutated``
returns a copy of the message with one field set to one of them. ``invoke`` calls one RPC with a
deadline and ``problem`` says why its answer is not a structured one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message

from missionweave.kernel.errors import Rejected
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import common_pb2
from missionweave_server.edge.status import status_code

F = FieldDescriptor
DURATION = "google.protobuf.Duration"
TIMESTAMP = "google.protobuf.Timestamp"
REJECTION = "missionweave.v1.Rejection"

# google.protobuf.Duration: seconds within +-315,576,000,000 (10,000 years), nanos within
# +-999,999,999 with the sign of seconds. google.protobuf.Timestamp: 0001-01-01T00:00:00Z to
# 9999-12-31T23:59:59.999999999Z, nanos 0..999,999,999.
DURATION_MAX_S = 315_576_000_000
TIMESTAMP_MIN_S = -62_135_596_800
TIMESTAMP_MAX_S = 253_402_300_799
NANOS_MAX = 999_999_999
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1

SIGNED32 = {F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32}
SIGNED64 = {F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64}
UNSIGNED32 = {F.TYPE_UINT32, F.TYPE_FIXED32}
UNSIGNED64 = {F.TYPE_UINT64, F.TYPE_FIXED64}
FLOATS = {F.TYPE_FLOAT, F.TYPE_DOUBLE}
NUMERIC = SIGNED32 | SIGNED64 | UNSIGNED32 | UNSIGNED64 | FLOATS | {F.TYPE_ENUM}

# Fields that count, page or point into something: they also get a value past any real end.
PAST_THE_END = {
    "offset",
    "length",
    "size_bytes",
    "after_sequence",
    "first",
    "last",
    "cursor",
    "limit",
    "page_size",
    "batch_size",
    "max_depth",
    "visibility_start_sequence",
    "ended_at_sequence",
    "group_revision",
    "mission_revision",
    "contract_revision",
    "revision",
    "credits",
    "initial_credits",
}


@dataclass(frozen=True)
class Path:
    """Fields from the message down to one leaf."""

    fields: tuple[FieldDescriptor, ...]

    @property
    def name(self) -> str:
        return ".".join(f.name for f in self.fields)

    @property
    def leaf(self) -> FieldDescriptor:
        return self.fields[-1]


def _well_known(field: FieldDescriptor) -> str | None:
    if field.message_type is not None and field.message_type.full_name in (DURATION, TIMESTAMP):
        return str(field.message_type.full_name)
    return None


def leaf_paths(message: Message, max_depth: int = 8) -> list[Path]:
    """Every numeric, enum, Duration and Timestamp field reachable in ``message``: through the oneof
    member it has set (every member when none is), into repeated fields' first element."""
    return list(_walk(message.DESCRIPTOR, message, (), (message.DESCRIPTOR.full_name,), max_depth))


def _walk(
    descriptor: Descriptor,
    message: Message | None,
    prefix: tuple[FieldDescriptor, ...],
    stack: tuple[str, ...],
    depth: int,
) -> Iterator[Path]:
    for f in descriptor.fields:
        oneof = f.containing_oneof
        if oneof is not None and message is not None:
            chosen = message.WhichOneof(oneof.name)
            if chosen is not None and chosen != f.name:
                continue
        if f.message_type is None:
            if f.type in NUMERIC:
                yield Path((*prefix, f))
            continue
        if f.message_type.GetOptions().map_entry:
            continue
        if _well_known(f):
            yield Path((*prefix, f))
            continue
        if depth <= 0 or f.message_type.full_name in stack:
            continue
        child: Message | None = None
        if message is not None:
            value = getattr(message, f.name)
            if f.is_repeated:
                child = value[0] if len(value) else None
            elif message.HasField(f.name):
                child = value
        yield from _walk(f.message_type, child, (*prefix, f), (*stack, f.message_type.full_name), depth - 1)


Value = Any  # a scalar, or (seconds, nanos) for a Duration or Timestamp, or None: unset


def extremes(field: FieldDescriptor, now_s: int = 1_700_000_000) -> list[tuple[str, Value]]:
    """(name, value) for one leaf: 0, -1, the type's limits, enum values past the last defined and
    negative, Durations and Timestamps at and past their limits, and past-the-end counts."""
    kind = _well_known(field)
    if kind == DURATION:
        return [
            ("zero", (0, 0)),
            ("-1ns", (0, -1)),
            ("max", (DURATION_MAX_S, NANOS_MAX)),
            ("min", (-DURATION_MAX_S, -NANOS_MAX)),
            ("past max", (DURATION_MAX_S + 1, 0)),
            ("past min", (-DURATION_MAX_S - 1, 0)),
            ("nanos 1e9", (0, NANOS_MAX + 1)),
            ("nanos -1e9", (0, -NANOS_MAX - 1)),
            ("mixed signs", (1, -1)),
            ("int64 max", (INT64[1], 0)),
            ("int64 min", (INT64[0], 0)),
        ]
    if kind == TIMESTAMP:
        return [
            ("epoch", (0, 0)),
            ("-1s", (-1, 0)),
            ("max", (TIMESTAMP_MAX_S, NANOS_MAX)),
            ("min", (TIMESTAMP_MIN_S, 0)),
            ("past max", (TIMESTAMP_MAX_S + 1, 0)),
            ("past min", (TIMESTAMP_MIN_S - 1, 0)),
            ("duration max", (DURATION_MAX_S, 0)),
            ("duration min", (-DURATION_MAX_S, 0)),
            ("nanos 1e9", (now_s, NANOS_MAX + 1)),
            ("nanos -1", (now_s, -1)),
            ("int64 max", (INT64[1], 0)),
            ("int64 min", (INT64[0], 0)),
        ]
    t = field.type
    out: list[tuple[str, Value]]
    if t == F.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        out = [
            ("zero", 0),
            ("past last", max(numbers) + 1),
            ("-1", -1),
            ("int32 max", INT32[1]),
            ("int32 min", INT32[0]),
        ]
    elif t in SIGNED32:
        out = [("zero", 0), ("-1", -1), ("max", INT32[1]), ("min", INT32[0])]
    elif t in SIGNED64:
        out = [("zero", 0), ("-1", -1), ("max", INT64[1]), ("min", INT64[0]), ("int32 max + 1", INT32[1] + 1)]
    elif t in UNSIGNED32:
        out = [("zero", 0), ("max", UINT32_MAX), ("int32 max + 1", INT32[1] + 1)]
    elif t in UNSIGNED64:
        out = [("zero", 0), ("max", UINT64_MAX), ("int64 max", INT64[1]), ("int64 max + 1", INT64[1] + 1)]
    elif t in FLOATS:
        out = [
            ("zero", 0.0),
            ("-1", -1.0),
            ("inf", math.inf),
            ("-inf", -math.inf),
            ("nan", math.nan),
            ("max", 3.4028234663852886e38 if t == F.TYPE_FLOAT else 1.7976931348623157e308),
        ]
    else:
        return []
    if field.name in PAST_THE_END and t != F.TYPE_ENUM:
        out.append(("past the end", 1_000_001))
    return out


def sampled(cases: list[tuple[str, Value]], key: str, keep: int) -> list[tuple[str, Value]]:
    """At most ``keep`` of ``cases``, chosen by a hash of ``key`` and each name (deterministic)."""
    if len(cases) <= keep:
        return cases
    ranked = sorted(cases, key=lambda c: hashlib.blake2b(f"{key}/{c[0]}".encode(), digest_size=8).digest())
    return ranked[:keep]


def mutated(message: Message, path: Path, value: Value) -> Message:
    """A copy of ``message`` with the field at ``path`` set to ``value`` (creating what lies on the way)."""
    out = type(message)()
    out.CopyFrom(message)
    target: Message = out
    for f in path.fields[:-1]:
        container = getattr(target, f.name)
        if f.is_repeated:
            target = container[0] if len(container) else container.add()
        else:
            target = container
    leaf = path.leaf
    if (
        value is None
    ):  # "unset": the field cleared (a Duration or Timestamp documented as meaning something unset)
        target.ClearField(leaf.name)
        return out
    if _well_known(leaf):
        seconds, nanos = value
        holder = getattr(target, leaf.name)
        if leaf.is_repeated:
            holder = holder[0] if len(holder) else holder.add()
        holder.SetInParent()
        holder.seconds, holder.nanos = seconds, nanos
        return out
    if leaf.is_repeated:
        values = getattr(target, leaf.name)
        if len(values):
            values[0] = value
        else:
            values.append(value)
    else:
        setattr(target, leaf.name, value)
    return out


# ------------------------------------------------------------ calling and judging


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str = ""
    rejection: common_pb2.Rejection | None = None
    responses: list[Message] = field(default_factory=list)

    def inband(self) -> list[common_pb2.Rejection]:
        """Rejections carried inside the answers (batch results, stream answers, ERROR frames)."""
        found: list[common_pb2.Rejection] = []
        for response in self.responses:
            _rejections(response, found)
        return found

    @property
    def accepted(self) -> bool:
        return self.code == grpc.StatusCode.OK and not self.inband()


def _rejections(message: Message, out: list[common_pb2.Rejection]) -> None:
    for f, value in message.ListFields():
        if f.message_type is None:
            continue
        items = list(value) if f.is_repeated else [value]
        if f.message_type.GetOptions().map_entry:
            continue
        for item in items:
            if f.message_type.full_name == REJECTION:
                out.append(item)
            else:
                _rejections(item, out)


def message_class(descriptor: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(descriptor)  # type: ignore[no-any-return]


async def invoke(
    channel: grpc.aio.Channel,
    method: MethodDescriptor,
    requests: list[Message],
    *,
    deadline_s: float,
    metadata: tuple[tuple[str, Any], ...] | None = None,
) -> Outcome:
    """One call with a deadline; a server stream is read until it ends (or the deadline)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    out_type = message_class(method.output_type)
    responses: list[Message] = []
    serialize = type(requests[0]).SerializeToString

    async def stream() -> AsyncIterator[Message]:
        for request in requests:
            yield request

    try:
        if method.client_streaming and method.server_streaming:
            call = channel.stream_stream(
                path, request_serializer=serialize, response_deserializer=out_type.FromString
            )
            async for answer in call(stream(), timeout=deadline_s, metadata=metadata):
                responses.append(answer)
        elif method.client_streaming:
            upload = channel.stream_unary(
                path, request_serializer=serialize, response_deserializer=out_type.FromString
            )
            responses.append(await upload(stream(), timeout=deadline_s, metadata=metadata))
        elif method.server_streaming:
            call = channel.unary_stream(
                path, request_serializer=serialize, response_deserializer=out_type.FromString
            )
            async for answer in call(requests[0], timeout=deadline_s, metadata=metadata):
                responses.append(answer)
        else:
            unary = channel.unary_unary(
                path, request_serializer=serialize, response_deserializer=out_type.FromString
            )
            responses.append(await unary(requests[0], timeout=deadline_s, metadata=metadata))
    except grpc.aio.AioRpcError as err:
        return Outcome(err.code(), err.details() or "", rejection_from_rpc_error(err), responses)
    return Outcome(grpc.StatusCode.OK, "", None, responses)


_GRPC_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


def documented_code(rejection: common_pb2.Rejection) -> grpc.StatusCode:
    """The gRPC status common.proto documents for a Rejection (its reason's; NOT_FOUND for an
    unknown identity a request names)."""
    rejected = Rejected(rejection.reason, rejection.message, **dict(rejection.metadata))
    return _GRPC_BY_VALUE[status_code(rejected)]


def problem(outcome: Outcome, *, may_time_out: bool = False) -> str | None:
    """Why ``outcome`` is not a structured answer, or None."""
    if outcome.code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
        return f"{outcome.code.name}: {outcome.details[:300]}"
    if outcome.code == grpc.StatusCode.DEADLINE_EXCEEDED and not may_time_out:
        return "no answer before the deadline"
    for inner in outcome.inband():
        if inner.reason == common_pb2.REJECTION_REASON_UNSPECIFIED:
            return f"an in-band rejection without a reason: {inner}"
    if outcome.code in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED):
        return None
    if outcome.rejection is None:
        return f"{outcome.code.name} without a Rejection: {outcome.details[:300]}"
    expected = documented_code(outcome.rejection)
    if expected != outcome.code:
        name = common_pb2.RejectionReason.Name(outcome.rejection.reason)
        return f"{outcome.code.name}, but {name} is documented as {expected.name}: {outcome.rejection.message[:200]}"
    return None
